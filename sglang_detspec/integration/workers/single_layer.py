"""DETSPEC single-layer EAGLE / NEXTN / EAGLE3 workers and draft CUDA-graph runner.

Every draft proposal these workers make under rejection sampling goes through
:func:`sglang_detspec.integration.sampling.proposal.seeded_draft_proposal` with the key
sglang 0.5.23's seeded path uses (``speculative/eagle_worker_v2.py``:
``EagleDraftWorker._draft_extend_for_prefill`` calls ``fast_sample(...,
positions=batch.seq_lens)``, ``draft_forward`` calls ``sample_draft_proposal(...,
positions=forward_batch.positions + 1, draft_step=i + 1)`` and
``_draft_extend_for_decode`` calls ``sample_draft_proposal(...,
positions=batch_result.new_seq_lens)``; rows 1-3, continued by rows 4-7 of
:mod:`.multi_layer`):

=====================  ==========================================  ============
site                   key position                                draft_step
=====================  ==========================================  ============
prefill draft-extend   ``batch.seq_lens`` (prompt length L)         0
draft-decode step i    ``forward_batch.positions + 1`` at the call  ``i + 1``
decode draft-extend    ``batch_result.new_seq_lens`` (L + accepted) 0
=====================  ==========================================  ============

How the sampling call is reached (the integration choice)
----------------------------------------------------------
The three sampling calls sit in the middle of long upstream methods
(``EagleDraftWorker.draft_forward``, ``_draft_extend_for_prefill``,
``_draft_extend_for_decode``; 150-200 lines each, and different in 0.5.17 and
0.5.23). They call the *module-global* names ``fast_sample`` /
``sample_draft_proposal`` of ``eagle_worker_v2``. Instead of copying those
bodies per version, or rebinding the module globals (which would also change
builtin EAGLE in the same process and races with anything else reading them),
this module runs the *unchanged upstream code objects* with a private globals
dict in which only those two names (and, for construction, the draft-worker and
draft-graph-runner class names) point at DETSPEC versions. The upstream module
is never mutated, so builtin EAGLE is unaffected.

The DETSPEC ``fast_sample`` / ``sample_draft_proposal`` stand-ins learn *which*
site is calling (and, on 0.5.17, whose call sites pass no seed / position /
step, the key) from the draft :class:`~.upstream_code.Site` that the overriding
method enters around the upstream body. Under CUDA-graph capture all of this is
plain Python that runs once; the tensors the stand-ins read (seed, position and
top-k rows) are the runner's persistent buffers, so a replay reads the
refreshed values.

The rebound methods and the names each must read are declared in one table
(``_upstream``); the private globals are snapshotted when the worker is built
(after every plugin and ``HookRegistry`` patch of the scheduler process has
been applied), and only ever shadow the names of that table.

What is overridden (same on 0.5.17 and 0.5.23 unless stated)
------------------------------------------------------------
* ``EAGLEWorkerV2.__init__``: upstream body, ``EagleDraftWorker`` ->
  :class:`DetspecEagleDraftWorker`; refuses ``SGLANG_SIMULATE_ACC_LEN`` first.
* ``EagleDraftWorker.draft_forward`` / ``_draft_extend_for_prefill`` /
  ``_draft_extend_for_decode``: upstream bodies inside a site context,
  ``fast_sample`` / ``sample_draft_proposal`` -> DETSPEC stand-ins. 0.5.23
  passes seed / position / step itself (used as given); 0.5.17 passes none
  (taken from the site). A missing seed always raises (never the global RNG).
* ``EagleDraftWorker.alloc_memory_pool``: upstream body, whose draft/target vocabulary check under rejection
  sampling reads ``get_spec`` -> :func:`.reduced_vocab.spec_without_vocab_check`; then DETSPEC's own gate builds
  the reduced-vocabulary draft's :class:`~sglang_detspec.stream.hot_vocab.HotVocab` (``detspec_hot_vocab``, None
  for a full-vocabulary draft), which every draft site below hands to ``seeded_draft_proposal(hot_vocab=)`` and
  the verify reads q through (:mod:`.reduced_vocab`).
* ``EagleDraftWorker._capture_cuda_graphs``: upstream body,
  ``EAGLEDraftCudaGraphRunner`` -> :class:`DetspecEAGLEDraftCudaGraphRunner`.
* ``EAGLEDraftCudaGraphRunner.capture_one_shape`` / ``execute``: on releases
  whose runner has no seed buffer (0.5.17 - 0.5.22), the runner owns
  :class:`~.draft_keys.GraphKeyBuffers`; ``capture_one_shape`` runs upstream's
  body with ``SamplingBatchInfo`` -> a builder that points the captured batch's
  seed / top-k at views of them (as 0.5.23's runner does in-tree), and
  ``execute`` stages the live rows in (``refresh_detspec_keys``). Upstream
  unchanged on 0.5.23, whose runner already owns both.
* ``EAGLEWorkerV2.verify``: upstream body with the row-local target truncation
  of :mod:`sglang_detspec.integration.sampling.verify`. Its coins need no change: under
  deterministic inference every batch carries ``sampling_seed``, and every
  release's ``_verify_coins`` then uses the (identical) ``_seeded_verify_coins``
  instead of ``torch.rand``; the rejection kernel itself draws nothing.
* The target model runner's sampler (first token after prefill) is the
  token-id-keyed one of :mod:`sglang_detspec.integration.sampling.target_sampler`.
* Not overridden: the draft-extend graph runner; it returns logits only, and
  the worker-side sampling above covers it.

Every rebound body and name is checked when the worker is built
(:mod:`sglang_detspec.integration.workers.worker_checks`).

Deliberate difference from 0.5.23: the prefill draft-extend proposes the
argmax for greedy rows (upstream draws them), so greedy requests in sampled
batches keep their acceptance rate; their committed tokens are unchanged
(verify renormalises a greedy row's target to one-hot).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.speculative import spec_utils as _spec_utils
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import (
    EAGLEDraftCudaGraphRunner,
)
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from sglang_detspec.integration import compat as _compat
from sglang_detspec.integration.sampling import proposal as _proposal
from sglang_detspec.integration.upstream_code import ReboundMethods, Site
from sglang_detspec.integration.workers.draft_keys import GraphKeyBuffers, require_seed
from sglang_detspec.integration.workers.reduced_vocab import (
    build_hot_vocab,
    fit_graph_draft_probs,
    spec_without_vocab_check,
)
from sglang_detspec.integration.workers.spec_worker_base import DetspecSpecWorker
from sglang_detspec.stream.hot_vocab import HotVocab

__all__ = [
    "DetspecEAGLEWorkerV2",
    "DetspecEagleDraftWorker",
    "DetspecEAGLEDraftCudaGraphRunner",
    "DraftSite",
]

def _deterministic_inference_enabled() -> bool:
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().deterministic.enable_deterministic_inference)


def _rejection_sampling_enabled() -> bool:
    from sglang.srt.runtime_context import get_spec

    return bool(get_spec().speculative_use_rejection_sampling)


# ---------------------------------------------------------------------------
# Which site is sampling right now
# ---------------------------------------------------------------------------

PREFILL_EXTEND = "prefill_draft_extend"
DRAFT_DECODE = "draft_decode"
DECODE_EXTEND = "decode_draft_extend"


@dataclasses.dataclass
class DraftSite:
    """The sampling context an overriding method publishes for the stand-ins.

    ``sampling_info`` supplies per-row seeds and top_ks; ``positions`` returns
    the key positions *at call time* (draft-decode reads the live, in-place
    advanced ``forward_batch.positions``); ``next_draft_step`` numbers the calls of
    one draft-decode loop; ``hot_vocab`` is the draft worker's reduced-vocabulary map
    (None: the draft scores the target's vocabulary).
    """

    kind: str
    sampling_info: Any
    positions: Callable[[], torch.Tensor]
    calls: int = 0
    hot_vocab: Optional[HotVocab] = None

    def next_draft_step(self) -> int:
        self.calls += 1
        # Draft-extend proposals are step 0; the i-th draft-decode call is i + 1.
        return self.calls if self.kind == DRAFT_DECODE else 0


_DRAFT_SITE: Site[DraftSite] = Site("draft")
# The key rows one captured batch size reads, while upstream's capture_one_shape builds that batch.
_GRAPH_CAPTURE_SITE: Site[GraphKeyBuffers] = Site("draft graph capture")


def _site_seed(site: DraftSite, explicit: Optional[torch.Tensor]) -> torch.Tensor:
    """The seed 0.5.23 passes, else the site batch's own (0.5.17 passes none); raises when neither exists."""
    if explicit is not None:
        return explicit
    return require_seed(getattr(site.sampling_info, "sampling_seed", None), site.kind)


# ---------------------------------------------------------------------------
# Stand-ins for the module-global sampling names of eagle_worker_v2
# ---------------------------------------------------------------------------


def _detspec_fast_sample(
    probs: torch.Tensor,
    num_samples: int = 1,
    *,
    sampling_seed: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
    draft_step: Optional[int] = None,
):
    """Stand-in for ``fast_sample`` in the prefill draft-extend body.

    0.5.23 passes ``sampling_seed=batch.sampling_info.sampling_seed,
    positions=batch.seq_lens``; 0.5.17 passes neither, so both come from the
    site. Unlike upstream, greedy rows propose the argmax here too.
    """
    if probs.shape[0] == 0:
        # Idle / empty batches (DP attention) may carry no seed; nothing is drawn.
        return _spec_utils.fast_sample(probs, num_samples)
    site = _DRAFT_SITE.require("fast_sample")
    seed = _site_seed(site, sampling_seed)
    if num_samples != 1:
        raise RuntimeError(
            f"DETSPEC {site.kind}: SGLang asked fast_sample for {num_samples} drafts per row; DETSPEC proposes one "
            "seeded draft per row (--speculative-eagle-topk 1). sglang-detspec needs updating for this SGLang version"
        )
    step = site.next_draft_step() if draft_step is None else int(draft_step)
    pos = positions if positions is not None else site.positions()
    return _proposal.seeded_draft_proposal(
        probs, seed, pos, step, top_ks=getattr(site.sampling_info, "top_ks", None), hot_vocab=site.hot_vocab
    )


def _detspec_sample_draft_proposal(
    next_token_logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: Optional[torch.Tensor] = None,
    *,
    sampling_seed: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
    draft_step: Optional[int] = None,
):
    """Stand-in for ``sample_draft_proposal`` (draft-decode and decode draft-extend).

    Returns ``(q, q(X), X)`` where q is the tensor X was drawn from: the verify
    step's accept test ``coin * q(X) < p(X)`` is only unbiased for that q.
    """
    site = _DRAFT_SITE.require("sample_draft_proposal")
    if next_token_logits.shape[0] == 0:
        # Idle / empty batches (DP attention) may carry no seed; nothing is drawn, so upstream's call is exact
        # (0.5.17's sample_draft_proposal takes no top_ks; its callers pass none).
        extra = (top_ks,) if top_ks is not None else ()
        return _spec_utils.sample_draft_proposal(
            next_token_logits, temperatures, *extra
        )
    seed = _site_seed(site, sampling_seed)
    # Count every call (0.5.17 passes no step), but trust an explicit step.
    counted = site.next_draft_step()
    step = counted if draft_step is None else int(draft_step)
    pos = positions if positions is not None else site.positions()
    if top_ks is None:
        top_ks = getattr(site.sampling_info, "top_ks", None)
    probs = _proposal.draft_proposal_probs(next_token_logits, temperatures)
    topk_p, topk_index = _proposal.seeded_draft_proposal(
        probs, seed, pos, step, top_ks=top_ks, hot_vocab=site.hot_vocab
    )
    return probs, topk_p, topk_index


# ---------------------------------------------------------------------------
# Running upstream method bodies with DETSPEC names
# ---------------------------------------------------------------------------


def _captured_sampling_info(*args, **kwargs):
    """Stand-in for ``SamplingBatchInfo`` in a seedless release's ``capture_one_shape`` (0.5.17 - 0.5.22).

    That body builds the captured batch's ``SamplingBatchInfo`` inline, without a seed and with a throwaway top_ks
    (0.5.17's all ``-1`` would read as "every row greedy"). Point both at the runner's persistent key rows for this
    shape, so the graph reads the rows ``refresh_detspec_keys`` stages before each replay.
    """
    keys = _GRAPH_CAPTURE_SITE.require("SamplingBatchInfo")
    info = SamplingBatchInfo(*args, **kwargs)
    info.sampling_seed = keys.sampling_seed
    info.top_ks = keys.top_ks
    return info


# Which upstream names each rebound method must read (the same in 0.5.17 - 0.5.23); a method that stops reading
# one fails loudly when the worker is built, instead of silently keeping upstream's unseeded sampler.
_upstream = ReboundMethods(
    {
        (EagleDraftWorker, "draft_forward"): ("sample_draft_proposal",),
        (EagleDraftWorker, "_draft_extend_for_prefill"): ("fast_sample",),
        (EagleDraftWorker, "_draft_extend_for_decode"): ("sample_draft_proposal",),
        (EagleDraftWorker, "_capture_cuda_graphs"): ("EAGLEDraftCudaGraphRunner",),
        (EagleDraftWorker, "alloc_memory_pool"): ("get_spec",),
        (EAGLEDraftCudaGraphRunner, "capture_one_shape"): ("SamplingBatchInfo",),
        (EAGLEWorkerV2, "__init__"): ("EagleDraftWorker",),
    },
    stand_ins=lambda: {
        "fast_sample": _detspec_fast_sample,
        "sample_draft_proposal": _detspec_sample_draft_proposal,
        "SamplingBatchInfo": _captured_sampling_info,
        "EagleDraftWorker": DetspecEagleDraftWorker,
        "EAGLEDraftCudaGraphRunner": DetspecEAGLEDraftCudaGraphRunner,
        "get_spec": spec_without_vocab_check,
    },
)


# ---------------------------------------------------------------------------
# Draft worker
# ---------------------------------------------------------------------------


class DetspecEagleDraftWorker(EagleDraftWorker):
    """``EagleDraftWorker`` whose every proposal is keyed like sglang 0.5.23.

    Overrides only wrap the upstream bodies (run with DETSPEC sampling names)
    in the site context that supplies the key (and the reduced-vocabulary map).
    """

    #: The reduced-vocabulary draft's map, built by :meth:`alloc_memory_pool` (None: a full-vocabulary draft).
    detspec_hot_vocab: Optional[HotVocab] = None

    def alloc_memory_pool(self, *args, **kwargs):
        # Upstream's body loads the hot-token map; its vocabulary check gives way to DETSPEC's gate below.
        result = _upstream(EagleDraftWorker, "alloc_memory_pool")(self, *args, **kwargs)
        self.detspec_hot_vocab = build_hot_vocab(self)
        return result

    def draft_forward(self, forward_batch):
        site = DraftSite(
            DRAFT_DECODE,
            forward_batch.sampling_info,
            # Read at call time: upstream advances positions in place after
            # each step, and 0.5.23 keys step i at (positions + 1).
            positions=lambda: forward_batch.positions + 1,
            hot_vocab=self.detspec_hot_vocab,
        )
        with _DRAFT_SITE.entered(site):
            return _upstream(EagleDraftWorker, "draft_forward")(self, forward_batch)

    def _draft_extend_for_prefill(self, batch, *args, **kwargs):
        site = DraftSite(
            PREFILL_EXTEND,
            batch.sampling_info,
            positions=lambda: batch.seq_lens,
            hot_vocab=self.detspec_hot_vocab,
        )
        with _DRAFT_SITE.entered(site):
            return _upstream(EagleDraftWorker, "_draft_extend_for_prefill")(
                self, batch, *args, **kwargs
            )

    def _draft_extend_for_decode(self, batch, batch_result, *args, **kwargs):
        site = DraftSite(
            DECODE_EXTEND,
            batch.sampling_info,
            positions=lambda: batch_result.new_seq_lens,
            hot_vocab=self.detspec_hot_vocab,
        )
        with _DRAFT_SITE.entered(site):
            return _upstream(EagleDraftWorker, "_draft_extend_for_decode")(
                self, batch, batch_result, *args, **kwargs
            )

    def _capture_cuda_graphs(self):
        # Same body; only the draft-decode runner class name resolves to ours.
        return _upstream(EagleDraftWorker, "_capture_cuda_graphs")(self)


# ---------------------------------------------------------------------------
# Draft-decode CUDA-graph runner
# ---------------------------------------------------------------------------


class DetspecEAGLEDraftCudaGraphRunner(EAGLEDraftCudaGraphRunner):
    """Draft-decode graph runner with persistent seed / top-k rows where upstream has no seed buffer.

    When deterministic inference and rejection sampling are on and the
    upstream runner does not already own them (0.5.23 does), it allocates
    :class:`~.draft_keys.GraphKeyBuffers` of ``max_bs`` rows, every captured
    shape's ``SamplingBatchInfo`` reads views of them, and ``execute`` stages the
    live batch's rows in before each replay. Padded rows keep whatever they last
    held; the proposal is row-independent, so they cannot change a real row's
    result, and their outputs are cut off by ``_postprocess_output_to_raw_bs``.
    """

    detspec_keys: Optional[GraphKeyBuffers] = None

    def _detspec_needs_own_buffers(self) -> bool:
        return (
            not _compat.draft_graph_runner_owns_sampling_buffers()
            and _deterministic_inference_enabled()
            and _rejection_sampling_enabled()
        )

    def capture_one_shape(self, size, forward, *args, **kwargs):
        # Allocated at the first captured shape: capture runs inside the base
        # __init__, after max_bs and the device are known.
        fit_graph_draft_probs(self.buffers, getattr(self.eagle_worker, "detspec_hot_vocab", None))
        if self.detspec_keys is None and self._detspec_needs_own_buffers():
            self.detspec_keys = GraphKeyBuffers.allocate(self.max_bs, self.model_runner.device)
        if self.detspec_keys is None:
            return super().capture_one_shape(size, forward, *args, **kwargs)
        with _GRAPH_CAPTURE_SITE.entered(self.detspec_keys.rows(size)):
            return _upstream(EAGLEDraftCudaGraphRunner, "capture_one_shape")(self, size, forward, *args, **kwargs)

    def execute(self, forward_batch, *args, **kwargs):
        if self.detspec_keys is not None:
            self.refresh_detspec_keys(forward_batch.sampling_info, forward_batch.batch_size)
        return super().execute(forward_batch, *args, **kwargs)

    def refresh_detspec_keys(self, sampling_info, raw_bs: int) -> None:
        """Stage this replay's seeds and top-k into the rows the captured graphs read."""
        self.detspec_keys.stage(sampling_info, raw_bs, "draft-decode graph replay")


# ---------------------------------------------------------------------------
# Top-level spec worker
# ---------------------------------------------------------------------------


class DetspecEAGLEWorkerV2(DetspecSpecWorker, EAGLEWorkerV2):
    """``EAGLEWorkerV2`` that builds a :class:`DetspecEagleDraftWorker` and verifies row-locally.

    ``verify`` is upstream's body whose target truncation is the project's row-local one
    (:mod:`sglang_detspec.integration.sampling.verify`); the target model runner samples with the token-id-keyed
    sampler (:mod:`sglang_detspec.integration.sampling.target_sampler`). Overlap and graphs are upstream. What it
    shares with the multi-layer worker (construction, attention backends, verify) is :class:`DetspecSpecWorker`.
    """

    UPSTREAM_WORKER = EAGLEWorkerV2
    DRAFT_WORKER = DetspecEagleDraftWorker
    REBOUND = _upstream
