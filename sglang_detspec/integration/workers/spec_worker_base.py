"""What the single- and multi-layer DETSPEC spec workers do the same way, written once.

Both spec workers are SGLang's own (``EAGLEWorkerV2`` / ``MultiLayerEagleWorkerV2``) with three methods replaced:

* ``__init__``: refuses the verify paths that draw from the global RNG (:mod:`.worker_checks`), runs upstream's body
  with the DETSPEC draft worker in place of upstream's (the module's :class:`~..upstream_code.ReboundMethods` table
  resolves the draft worker's module-global name to ours), then finishes the worker: the token-id-keyed target
  sampler, the class checks and every rebound body built now, so a renamed upstream name fails the launch.
* ``init_attention_backends``: upstream's, then -- under the coupled scheme, or with
  ``SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1`` -- the target's verify attention in decode order
  (:mod:`..sampling.verify_attention`), else in the split-KV verify kernel where it can serve the model, unless
  ``SGLANG_DETSPEC_SPLIT_KV_VERIFY=0`` (:mod:`..sampling.split_kv_verify`); with
  ``SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1`` the draft's extend of each verified chain in the same kernel, under either
  scheme (the invariant mode's tokens do not depend on the draft's numbers). The scheduler builds the target's and
  the draft's backends first, then calls this, then captures every CUDA graph: the one moment those switches can be
  made.
* ``verify``: upstream's body with the row-local target truncation (:mod:`..sampling.verify`); a reduced-vocabulary
  draft's q is read through its hot map there (:func:`..sampling.verify.reduced_draft_vocab`). Its coins keep
  SGLang's values: under deterministic inference ``sampling_info.sampling_seed`` is always set, so every release's
  ``eagle_sample`` takes the seeded coins (identical in all) instead of ``torch.rand``, drawn in one launch by
  :mod:`sglang_detspec.kernels.seeded_verify_coins` unless ``SGLANG_DETSPEC_VERIFY_COINS_KERNEL=0``.
"""

from __future__ import annotations

import logging

from sglang_detspec.integration.sampling import scheme, split_kv_verify
from sglang_detspec.integration.sampling.verify import rebound_verify, reduced_draft_vocab
from sglang_detspec.integration.sampling.verify_attention import install_decode_order_verify
from sglang_detspec.integration.setup import split_kv_verify_switch
from sglang_detspec.integration.setup.decode_order_verify_switch import (
    DECODE_ORDER_VERIFY_ENV,
    decode_order_verify_wanted,
)
from sglang_detspec.integration.setup.split_kv_draft_extend_switch import (
    SPLIT_KV_DRAFT_EXTEND_ENV,
    split_kv_draft_extend_wanted,
)
from sglang_detspec.integration.upstream_code import ReboundMethods
from sglang_detspec.integration.workers.worker_checks import complete_spec_worker, refuse_global_rng_verify_paths

__all__ = ["DetspecSpecWorker"]

logger = logging.getLogger(__name__)

#: Who asks for the decode-order verify when the scheme is rejection sampling (named in its refusals).
DECODE_ORDER_VERIFY_REQUEST = (f"{DECODE_ORDER_VERIFY_ENV}=1", f"unset {DECODE_ORDER_VERIFY_ENV}")


class DetspecSpecWorker:
    """Put first among a DETSPEC spec worker's bases, before the upstream spec worker it runs
    (``class W(DetspecSpecWorker, EAGLEWorkerV2)``), and set the three class attributes:

    * ``UPSTREAM_WORKER``: the upstream spec-worker class whose ``__init__`` and ``verify`` bodies run;
    * ``DRAFT_WORKER``: the DETSPEC draft-worker class upstream's ``__init__`` must build;
    * ``REBOUND``: the worker module's table of rebound upstream methods (it holds ``UPSTREAM_WORKER.__init__``).
    """

    UPSTREAM_WORKER: type
    DRAFT_WORKER: type
    REBOUND: ReboundMethods

    def __init__(self, *args, **kwargs):
        refuse_global_rng_verify_paths()
        # Upstream's body; the draft worker it builds by module-global name is ours.
        self.REBOUND(self.UPSTREAM_WORKER, "__init__")(self, *args, **kwargs)
        complete_spec_worker(
            self,
            draft_worker_cls=self.DRAFT_WORKER,
            upstream_owner=self.UPSTREAM_WORKER,
            build_rebound=[self.REBOUND.build_all],
        )

    def init_attention_backends(self):
        super().init_attention_backends()
        if scheme.current() == scheme.COUPLED:
            install_decode_order_verify(self.target_worker.model_runner)
        elif decode_order_verify_wanted():
            install_decode_order_verify(self.target_worker.model_runner, request=DECODE_ORDER_VERIFY_REQUEST)
        else:
            setting = split_kv_verify_switch.split_kv_verify_setting()
            if setting == split_kv_verify_switch.OFF:
                logger.info("sglang-detspec: %s (SGLANG_DETSPEC_SPLIT_KV_VERIFY=0)", split_kv_verify.NOT_INSTALLED_LOG)
            else:
                split_kv_verify.install_split_kv_verify(self.target_worker.model_runner,
                                                        required=setting == split_kv_verify_switch.ON)
        # The draft's extend of each verified chain, under any scheme (the invariant mode's tokens never depend on it).
        if split_kv_draft_extend_wanted():
            split_kv_verify.install_split_kv_draft_extend(self.draft_worker)
        else:
            logger.info("sglang-detspec: %s (the default; %s=1 runs it in the split-KV verify kernel)",
                        split_kv_verify.DRAFT_NOT_INSTALLED_LOG, SPLIT_KV_DRAFT_EXTEND_ENV)

    def verify(self, *args, **kwargs):
        # A reduced-vocabulary draft's q is read through its hot map (None for the multi-layer worker, which has none).
        with reduced_draft_vocab(getattr(self.draft_worker, "detspec_hot_vocab", None)):
            return rebound_verify(self.UPSTREAM_WORKER)(self, *args, **kwargs)
