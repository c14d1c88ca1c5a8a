"""``SGLANG_DETSPEC_SPLIT_KV_VERIFY``: whether ``DETSPEC_EAGLE`` / ``DETSPEC_EAGLE3`` run the target's verify attention
in the plugin's split-KV verify kernel (:mod:`sglang_detspec.kernels.split_kv_verify_attention`, installed by
:mod:`..sampling.split_kv_verify`) or in SGLang's one-stage extend kernel.

* unset or empty (the default, :data:`AUTO`): the split-KV kernel wherever it can serve the model, SGLang's kernel
  where it cannot (multi-head latent attention, sliding windows, pages > 1, a quantised KV cache, a non-Triton
  backend...); the server log says which runs and why;
* ``1`` (:data:`ON`): the split-KV kernel, and a model it cannot serve is refused when the worker starts;
* ``0`` (:data:`OFF`): SGLang's kernel.

Both kernels are batch-invariant, so either gives one output per seed; their numbers differ, so one seed's tokens
differ between them. Refused when the plugin loads: any other value, and ``1`` together with
``SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1`` (two replacements of one kernel; unset, the decode order wins). The invariant
algorithms run their verify in the decode kernel's order, so they refuse ``1`` when their arguments resolve and leave
the default alone. Standard library only."""

from __future__ import annotations

from typing import Mapping, Optional

from sglang_detspec.integration.setup.decode_order_verify_switch import decode_order_verify_wanted
from sglang_detspec.integration.setup.env_switch import env_setting
from sglang_detspec.integration.setup.refusals import refuse

__all__ = ["AUTO", "OFF", "ON", "SPLIT_KV_VERIFY_ENV", "split_kv_verify_setting"]

SPLIT_KV_VERIFY_ENV = "SGLANG_DETSPEC_SPLIT_KV_VERIFY"

#: The kernel wherever it can serve the model (the variable unset).
AUTO = "auto"
#: The kernel, or a refusal (``1``).
ON = "on"
#: SGLang's one-stage extend kernel (``0``, or unset beside ``SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1``).
OFF = "off"


def split_kv_verify_setting(environ: Optional[Mapping[str, str]] = None) -> str:
    """:data:`ON` for ``1``, :data:`OFF` for ``0``, :data:`AUTO` when unset or empty (:data:`OFF` when the decode-order
    verify is asked for); raises the ``split_kv_verify`` refusal for any other value and
    ``split_kv_verify_with_decode_order`` for ``1`` beside the decode-order verify."""
    wanted = env_setting(SPLIT_KV_VERIFY_ENV, "split_kv_verify", environ)
    decode_order = decode_order_verify_wanted(environ)
    if wanted and decode_order:
        raise refuse("split_kv_verify_with_decode_order", None)
    if wanted is None:
        return OFF if decode_order else AUTO
    return ON if wanted else OFF
