"""The plugin's on/off environment variables, read one way: ``1`` on; ``0`` off; empty or unset the switch's default
(or, for :func:`env_setting`, "unset", which the caller resolves); anything else refused.

Strict on purpose: ``true`` / ``on`` / `` 1`` are refused rather than guessed, because a typo read as "off" would give
a server (or a benchmark) of another configuration than the one its environment names. The refusal is the caller's
row of the one refusal table (:mod:`.refusals`), filled with the value found, so its message names the variable and
the accepted values. Standard library only.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from sglang_detspec.integration.setup.refusals import refuse

__all__ = ["env_setting", "env_switch"]

_OFF = "0"
_ON = "1"


def env_setting(variable: str, refusal_key: str, environ: Optional[Mapping[str, str]] = None) -> Optional[bool]:
    """True for ``1``, False for ``0``, None when ``variable`` is empty or unset (the caller's default decides); for
    anything else raises the refusal ``refusal_key`` (a ``DetspecConfigError``)."""
    value = (os.environ if environ is None else environ).get(variable, "")
    if value == "":
        return None
    if value not in (_OFF, _ON):
        raise refuse(refusal_key, None, value=value)
    return value == _ON


def env_switch(variable: str, refusal_key: str, environ: Optional[Mapping[str, str]] = None,
               default: bool = False) -> bool:
    """Whether the on/off variable ``variable`` of ``environ`` (default: the process environment) is on (``default``
    when it is empty or unset); for a value other than ``1``, ``0``, empty or unset, raises the refusal
    ``refusal_key`` (a ``DetspecConfigError``)."""
    setting = env_setting(variable, refusal_key, environ)
    return default if setting is None else setting
