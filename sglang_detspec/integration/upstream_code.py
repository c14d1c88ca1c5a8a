"""Running SGLang's own method bodies with a few module-global names replaced.

The draft-sampling calls sit in the middle of long upstream methods that differ between SGLang releases.
Instead of copying those bodies per release, or rebinding names in SGLang's modules (which would change
builtin EAGLE in the same process too), the DETSPEC workers run the *unchanged upstream code objects*
with a private copy of their globals in which only the sampling names (and the collaborator classes the
body constructs) point at DETSPEC versions. Used by :mod:`.single_layer` and :mod:`.multi_layer`.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, Dict

__all__ = ["code_names", "rebind_globals"]


def rebind_globals(func: Callable, overrides: Dict[str, Any]) -> Callable:
    """``func`` with the same code, defaults and closure but private globals.

    The closure is kept so zero-argument ``super()`` inside the body still
    resolves against the upstream class it was written in.
    """
    missing = [name for name in overrides if name not in func.__globals__]
    if missing:
        # A renamed global would silently keep calling the upstream sampler.
        raise RuntimeError(
            f"{func.__qualname__} no longer reads {missing} from its module; "
            "sglang-detspec needs updating for this SGLang version"
        )
    new_globals = dict(func.__globals__)
    new_globals.update(overrides)
    clone = types.FunctionType(
        func.__code__, new_globals, func.__name__, func.__defaults__, func.__closure__
    )
    clone.__kwdefaults__ = dict(func.__kwdefaults__ or {}) or None
    functools.update_wrapper(clone, func)
    return clone


def code_names(code: types.CodeType) -> set:
    """Every global/attribute name ``code`` reads, nested functions, lambdas and comprehensions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names
