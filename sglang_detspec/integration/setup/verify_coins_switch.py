"""``SGLANG_DETSPEC_VERIFY_COINS_KERNEL``: whether a DETSPEC verify draws SGLang's seeded coins in one Triton launch
(``1`` / unset, the default) or in SGLang's own torch ops (``0``); the values are the same bit for bit
(:mod:`sglang_detspec.kernels.seeded_verify_coins`). Anything else is refused when the plugin loads. Standard library
only, so the plugin reads it in every SGLang process without importing torch or Triton."""

from __future__ import annotations

from typing import Mapping, Optional

from sglang_detspec.integration.setup.env_switch import env_switch

__all__ = ["VERIFY_COINS_KERNEL_ENV", "verify_coins_kernel_wanted"]

VERIFY_COINS_KERNEL_ENV = "SGLANG_DETSPEC_VERIFY_COINS_KERNEL"


def verify_coins_kernel_wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True for ``1`` or unset, False for ``0``; anything else raises the ``verify_coins_kernel`` refusal."""
    return env_switch(VERIFY_COINS_KERNEL_ENV, "verify_coins_kernel", environ, default=True)
