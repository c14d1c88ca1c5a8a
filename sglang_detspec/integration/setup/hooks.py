"""The plugin's hooks on SGLang functions (``HookRegistry``): registered once per process, and checked in place.

SGLang's plugin loader applies registered hooks by wrapping the target function; registering the same hook twice
would wrap it twice. :func:`register_once` guards that; :func:`hook_active` answers whether the function at a dotted
path currently runs a given hook (walking the wrapper chain), which the plugin's self-check and its status use.
"""

from __future__ import annotations

import pkgutil
from typing import Callable

__all__ = ["hook_active", "register_once"]


def register_once(target: str, hook: Callable, kind: str) -> str:
    """Register ``hook`` on dotted path ``target`` as ``HookType[kind]`` (BEFORE / AFTER / AROUND) unless it already
    is; return ``target``."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    registered = HookRegistry._hooks.get(target, [])  # noqa: SLF001 - no public query; avoid double wrapping
    if not any(h is hook for _, h, _ in registered):
        HookRegistry.register(target, hook, getattr(HookType, kind))
    return target


def hook_active(target: str, hook: Callable) -> bool:
    """Whether the function at dotted path ``target`` currently runs ``hook`` (a ``HookRegistry`` wrapper chain)."""
    try:
        fn = pkgutil.resolve_name(target)
    except Exception:  # noqa: BLE001 - an unresolvable target has no hook
        return False
    for _ in range(64):
        if fn is None:
            return False
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
    return False
