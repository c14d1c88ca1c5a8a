"""``SGLANG_DETSPEC_DECODE_ORDER_VERIFY``: whether ``DETSPEC_EAGLE`` / ``DETSPEC_EAGLE3`` run the target's verify
attention in the decode kernel's order (``1``) or through SGLang's one-stage extend kernel (``0`` / unset, the
default); the invariant algorithms always use the decode order (:mod:`..sampling.verify_attention`). Both orders are
batch-invariant, so either gives one output per seed; their numbers differ, so the tokens of one seed differ between
the two settings. Anything else is refused when the plugin loads. Standard library only."""

from __future__ import annotations

from typing import Mapping, Optional

from sglang_detspec.integration.setup.env_switch import env_switch

__all__ = ["DECODE_ORDER_VERIFY_ENV", "decode_order_verify_wanted"]

DECODE_ORDER_VERIFY_ENV = "SGLANG_DETSPEC_DECODE_ORDER_VERIFY"


def decode_order_verify_wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True for ``1``, False for ``0`` or unset; anything else raises the ``decode_order_verify`` refusal."""
    return env_switch(DECODE_ORDER_VERIFY_ENV, "decode_order_verify", environ, default=False)
