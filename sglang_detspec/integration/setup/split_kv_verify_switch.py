"""``SGLANG_DETSPEC_SPLIT_KV_VERIFY``: whether ``DETSPEC_EAGLE`` / ``DETSPEC_EAGLE3`` run the target's verify attention
in the plugin's split-KV verify kernel (``1``; :mod:`sglang_detspec.kernels.split_kv_verify_attention`, installed by
:mod:`..sampling.split_kv_verify`) or in SGLang's one-stage extend kernel (``0`` / unset, the default). Both are
batch-invariant, so either gives one output per seed; their numbers differ, so one seed's tokens differ between the two
settings. Refused when the plugin loads: a value other than ``1``, ``0`` or unset, and ``1`` together with
``SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1`` (two replacements of one kernel). The invariant algorithms refuse it when
their worker starts (their verify must run in the decode kernel's order). Standard library only."""

from __future__ import annotations

from typing import Mapping, Optional

from sglang_detspec.integration.setup.decode_order_verify_switch import decode_order_verify_wanted
from sglang_detspec.integration.setup.env_switch import env_switch
from sglang_detspec.integration.setup.refusals import refuse

__all__ = ["SPLIT_KV_VERIFY_ENV", "split_kv_verify_wanted"]

SPLIT_KV_VERIFY_ENV = "SGLANG_DETSPEC_SPLIT_KV_VERIFY"


def split_kv_verify_wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True for ``1``, False for ``0`` or unset; raises the ``split_kv_verify`` refusal for any other value and
    ``split_kv_verify_with_decode_order`` when the decode-order verify is asked for too."""
    wanted = env_switch(SPLIT_KV_VERIFY_ENV, "split_kv_verify", environ, default=False)
    if wanted and decode_order_verify_wanted(environ):
        raise refuse("split_kv_verify_with_decode_order", None)
    return wanted
