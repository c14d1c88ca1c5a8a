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

Each worker family declares its rebound methods in one :class:`ReboundMethods` table, ``(owner, method) -> names
the body must read``, built when the worker is constructed. A stand-in learns which call it serves (the key
positions of a draft site, the sampling parameters of a verify step) from a :class:`Site` that the overriding method
enters around the upstream body.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import dis
import functools
import types
from typing import Any, Callable, Dict, Generic, Iterable, Iterator, Mapping, Optional, Tuple, TypeVar

__all__ = ["ReboundMethods", "Site", "code_names", "imported_names", "reachable_names", "rebind"]

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


def reachable_names(func: Callable) -> set:
    """The names ``func``'s body can resolve to something :func:`rebind` replaces: globals of its module it reads,
    and names it imports with ``from M import name``."""
    return (code_names(func.__code__) & set(func.__globals__)) | imported_names(func.__code__)


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
    missing = [name for name in required if name not in read_globals | imported]
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


class ReboundMethods:
    """A worker family's declared table of rebound upstream methods: ``(owner, method) -> names its body must read``.

    ``rebound(owner, name)`` is ``vars(owner)[name]`` run by :func:`rebind` with each of its declared names resolving
    to ``stand_ins()[name]``; built once and cached. ``stand_ins`` is called at the first build, so it may name
    classes defined after the table. :meth:`build_all` runs when the worker is constructed (in the scheduler process,
    after every plugin patch): an upstream body that no longer reads a declared name fails the launch, instead of
    silently keeping upstream's unseeded sampler.
    """

    def __init__(self, required: Mapping[Tuple[Any, str], Tuple[str, ...]], stand_ins: Callable[[], Mapping[str, Any]]):
        self.required = dict(required)
        self._stand_ins = stand_ins
        self._built: Dict[Tuple[Any, str], Callable] = {}

    def __call__(self, owner: Any, name: str) -> Callable:
        key = (owner, name)
        if key not in self._built:
            wanted = self.required[key]
            stand_ins = self._stand_ins()
            self._built[key] = rebind(
                vars(owner)[name], {n: (lambda _original, value=stand_ins[n]: value) for n in wanted}, required=wanted
            )
        return self._built[key]

    def build_all(self) -> None:
        for owner, name in self.required:
            self(owner, name)

    def cache_clear(self) -> None:
        """Forget the built bodies, so the next call snapshots the upstream module globals again (tests patch them)."""
        self._built.clear()


SiteT = TypeVar("SiteT")


class Site(Generic[SiteT]):
    """What the stand-ins of a rebound body learn about the call they serve, set by the overriding method around it.

    A context variable is per thread and per re-entrant call, so concurrent or nested calls never see each other's
    site. Under CUDA-graph capture this is plain Python that runs once; the tensors a site hands on must then be
    persistent graph buffers.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._active: contextvars.ContextVar[Optional[SiteT]] = contextvars.ContextVar(
            f"sglang_detspec_{kind.replace(' ', '_')}_site", default=None
        )

    @contextlib.contextmanager
    def entered(self, site: SiteT) -> Iterator[SiteT]:
        token = self._active.set(site)
        try:
            yield site
        finally:
            self._active.reset(token)

    def require(self, stand_in: str) -> SiteT:
        """The active site; outside one, the rebound bodies have a caller that sglang-detspec does not know."""
        site = self._active.get()
        if site is None:
            # Only the rebound DETSPEC bodies reach the stand-ins, and they always enter a site: reaching here means
            # upstream grew a new caller that no site maps to a key.
            raise RuntimeError(
                f"DETSPEC {stand_in} was called outside a known {self.kind} site; the installed SGLang reaches it "
                "from a caller sglang-detspec does not key yet (sglang-detspec needs updating for this SGLang version)"
            )
        return site
