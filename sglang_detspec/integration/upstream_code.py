"""Running SGLang's own function bodies with a few names replaced.

The sampling calls DETSPEC changes sit in the middle of long upstream functions that differ between SGLang
releases. Instead of copying those bodies per release, or rebinding names in SGLang's modules (which would change
builtin EAGLE in the same process too), the DETSPEC workers run the *unchanged upstream code objects* with a
private copy of their globals in which only a few names point at DETSPEC versions. Used by :mod:`.single_layer`,
:mod:`.multi_layer`, :mod:`.verify` and :mod:`.target_sampler`.

A name can reach an upstream body in two ways, and :func:`rebind` replaces it in both:

* as a module global (``fast_sample(...)`` where the module imported ``fast_sample`` at the top);
* through an import inside the body (``from sgl_kernel import top_k_renorm_prob``, which SGLang 0.5.17 - 0.5.22
  do inside ``eagle_sample``). For those the clone gets private builtins whose ``__import__`` hands the body a
  view of the imported module in which the replaced attributes resolve to the DETSPEC versions. Only
  ``from M import name [as alias]`` statements executed by the clone see it; the module itself is untouched.
"""

from __future__ import annotations

import builtins
import dis
import functools
import types
from typing import Any, Callable, Dict, Iterable, Mapping

__all__ = ["code_names", "imported_names", "rebind", "rebind_globals"]

#: A replacement is built from the original object the name would have resolved to, so a stand-in can wrap it
#: (e.g. run a truncation, then the upstream kernel).
Replacement = Callable[[Any], Any]


def code_names(code: types.CodeType) -> set:
    """Every global/attribute name ``code`` reads, nested functions, lambdas and comprehensions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def imported_names(code: types.CodeType) -> set:
    """The attribute names ``code`` imports with ``from M import name`` (nested code included)."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "IMPORT_FROM"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= imported_names(const)
    return names


class _ModuleView:
    """A module as one ``from M import ...`` inside a rebound body sees it: some attributes replaced."""

    def __init__(self, module: Any, replaced: Dict[str, Any]):
        self.__dict__["_module"] = module
        self.__dict__["_replaced"] = replaced

    def __getattr__(self, name: str) -> Any:
        replaced = self.__dict__["_replaced"]
        if name in replaced:
            return replaced[name]
        return getattr(self.__dict__["_module"], name)


def _importing_builtins(replacements: Mapping[str, Replacement]) -> dict:
    real_import = builtins.__import__

    def detspec_import(name, globals=None, locals=None, fromlist=(), level=0):
        module = real_import(name, globals, locals, fromlist, level)
        wanted = [attr for attr in (fromlist or ()) if attr in replacements]
        if not wanted:
            return module
        return _ModuleView(module, {attr: replacements[attr](getattr(module, attr)) for attr in wanted})

    private = dict(vars(builtins))
    private["__import__"] = detspec_import
    return private


def rebind(func: Callable, replacements: Mapping[str, Replacement], *, required: Iterable[str] = ()) -> Callable:
    """``func`` with the same code, defaults and closure, in which each name of ``replacements`` resolves to
    ``replacements[name](original)``, whether the body reads it as a module global or imports it.

    ``required``: names the body must read (as a global its module defines, or through an import); a missing one
    raises at once -- a renamed upstream name would otherwise silently keep calling the upstream function. The
    closure is kept so zero-argument ``super()`` inside the body still resolves against its upstream class.
    """
    code = func.__code__
    read_globals = code_names(code) & set(func.__globals__)
    imported = imported_names(code)
    missing = [name for name in required if name not in read_globals and name not in imported]
    if missing:
        raise RuntimeError(
            f"{func.__module__}.{func.__qualname__} no longer reads {missing}; "
            "sglang-detspec needs updating for this SGLang version"
        )
    new_globals = dict(func.__globals__)
    for name, make in replacements.items():
        if name in read_globals:
            new_globals[name] = make(func.__globals__[name])
    if imported & set(replacements):
        new_globals["__builtins__"] = _importing_builtins(replacements)
    clone = types.FunctionType(code, new_globals, func.__name__, func.__defaults__, func.__closure__)
    clone.__kwdefaults__ = dict(func.__kwdefaults__ or {}) or None
    functools.update_wrapper(clone, func)
    return clone


def rebind_globals(func: Callable, overrides: Dict[str, Any]) -> Callable:
    """``func`` with the module globals in ``overrides`` replaced by fixed objects (each one must be a global of
    ``func``'s module)."""
    missing = [name for name in overrides if name not in func.__globals__]
    if missing:
        # A renamed global would silently keep calling the upstream sampler.
        raise RuntimeError(
            f"{func.__qualname__} no longer reads {missing} from its module; "
            "sglang-detspec needs updating for this SGLang version"
        )
    return rebind(func, {name: (lambda _original, value=value: value) for name, value in overrides.items()})
