"""DETSPEC multi-layer EAGLE (MTP) worker: every draft proposal is seeded.

Multi-layer EAGLE drafts one token per MTP layer. sglang 0.5.23 samples those
proposals at four sites (rows 4-7 below, numbered after the single-layer rows
1-3 of :mod:`.single_layer`): ``sample_draft_proposal`` in
``MultiLayerEagleDraftWorker._draft_extend_for_prefill`` and twice in
``_draft_extend_for_decode`` (``speculative/multi_layer_eagle_worker_v2.py``),
and ``fast_sample`` in ``MultiLayerEagleDraftExtendCudaGraphRunner._sample_draft_proposal``
(``speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py``, the
single-CG runner's in-graph sampler); this module routes all four
through :func:`sglang_detspec.integration.sampling.proposal.seeded_draft_proposal` with
sglang 0.5.23's keys, on every sglang from 0.5.17 to 0.5.23:

====  ==========================================  =====================  ===========
row   site                                        key position           draft_step
====  ==========================================  =====================  ===========
4     ``_draft_extend_for_prefill`` (eager)       ``batch.seq_lens`` (L)  MTP layer
5     ``_draft_extend_for_decode``, per-step      ``seq_lens + N``        MTP layer
      CUDA graphs (worker re-samples per replay)
6     ``_draft_extend_for_decode``, eager         ``seq_lens + N``        MTP layer
7     single-CG draft-extend runner (in-graph)    ``buffers.seq_lens``    MTP layer
                                                  (= ``seq_lens + N``)
====  ==========================================  =====================  ===========

(N = ``speculative_num_draft_tokens``; ``batch.seq_lens`` is the pre-verify
committed length.)  Under the coupled scheme (``DETSPEC_*_INVARIANT``) MTP layer
k's proposal is instead keyed at the position of the verify row it is raced
against, ``base + k``: base = ``batch.seq_lens`` (L) at row 4 and the verify's
``new_seq_lens`` (L + accepted + bonus) at rows 5-7, which row 7 reads from the
graph's ``seq_lens - N + num_accept_tokens`` buffers.  On top of upstream
0.5.23 every site also proposes the first argmax for greedy rows
(``top_k <= 1``), which upstream only does at the single-layer decode sites.

How the sites are reached (no upstream body copied, no upstream module mutated)
-----------------------------------------------------------------------------
The sampling calls sit inside long upstream methods that differ between 0.5.17
and 0.5.23.  As in :mod:`sglang_detspec.integration.workers.single_layer`, the DETSPEC
overrides run the *unchanged upstream code objects* with a private globals dict
in which only a few names point at DETSPEC versions:

* ``MultiLayerEagleDraftWorker._draft_extend_for_prefill`` /
  ``_draft_extend_for_decode`` (rows 4-6): ``sample_draft_proposal`` -> a
  stand-in that reads the key of the current site from a ``ContextVar`` the
  override sets around the body (0.5.17 passes no seed/position/step at all;
  0.5.23 passes the same keys, and its ``draft_step`` is cross-checked).
* ``MultiLayerEagleDraftWorker._capture_cuda_graphs`` (row 7):
  ``OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner`` ->
  :class:`DetspecOneGraphDraftExtendRunner`.  That runner owns per-request
  seed and top-k buffers (0.5.17 has no seed buffer; 0.5.23's is not used so
  one code path serves both), refreshes them in ``prepare()`` (before every
  replay), and its per-step runners override ``_sample_draft_proposal`` (the
  in-graph sampler upstream selects when ``buffers.draft_probs`` exists; same
  name in 0.5.17 and 0.5.23).
* ``MultiLayerEagleWorkerV2.__init__``: ``MultiLayerEagleDraftWorker`` ->
  :class:`DetspecMultiLayerEagleDraftWorker`.

The upstream modules are never mutated, so a builtin EAGLE worker in the same
process keeps upstream behaviour.  The rebound methods and their names are
declared in one table (``_upstream``, an :class:`~.upstream_code.ReboundMethods`),
built when the worker is constructed (in the scheduler process, after every
plugin patch is applied).

q numerics (graph vs eager fallback).  Upstream's single-CG runner computes
q = softmax(logits / T) with ``wide_row_softmax_triton`` (block-parallel
reduction; ``MultiLayerEagleDraftExtendCudaGraphRunner._sample_draft_proposal``
in 0.5.17 and 0.5.23), while its eager and per-step decode paths use
``spec_utils.sample_draft_proposal``: ``torch.softmax(logits / T)`` (0.5.17
directly; 0.5.23 through ``sglang.kernels.ops.sampling.softmax``, which takes a
CUDA kernel only for fp32 rows 128256-262144 wide); the two round differently
(on CPU under the Triton interpreter only ~0.5% of entries of a 9000-wide row
are bit-equal), so
a request whose batch falls back to eager (batch larger than the largest
captured graph) could draw a different token for the same key.  Every
DETSPEC *decode* site therefore computes q with :func:`decode_draft_softmax`
(the same wide-row kernel the graph uses, bit-identical to upstream's default
single-CG path).  The prefill site is eager-only in every configuration, so it
keeps upstream's sampling softmax and stays bit-identical to 0.5.23 there.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Optional

import torch

from sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner import (
    MultiLayerEagleDraftExtendCudaGraphRunner,
    OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner,
)
from sglang.srt.speculative.multi_layer_eagle_utils import wide_row_softmax_triton
from sglang.srt.speculative.multi_layer_eagle_worker_v2 import (
    MultiLayerEagleDraftWorker,
    MultiLayerEagleWorkerV2,
)

from sglang_detspec.integration.sampling import proposal as _proposal
from sglang_detspec.integration.sampling import scheme as _scheme
from sglang_detspec.integration.upstream_code import ReboundMethods, Site
from sglang_detspec.integration.workers.draft_keys import GraphKeyBuffers, require_seed
from sglang_detspec.integration.workers.spec_worker_base import DetspecSpecWorker

__all__ = [
    "DetspecMultiLayerEagleDraftWorker",
    "DetspecMultiLayerEagleWorkerV2",
    "DetspecOneGraphDraftExtendRunner",
    "DetspecSingleCGStepRunner",
    "decode_draft_softmax",
    "prefill_draft_softmax",
]

# The name under which multi_layer_eagle_worker_v2 refers to the single-CG
# runner class in _capture_cuda_graphs (identical in 0.5.17 and 0.5.23).
_SINGLE_CG_RUNNER_NAME = "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner"



# --------------------------------------------------------------------------
# q = softmax(logits / T)
# --------------------------------------------------------------------------


def decode_draft_softmax(
    logits: torch.Tensor,
    temperatures: Optional[torch.Tensor],
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """q = softmax(logits / T) exactly as the single-CG runner computes it.

    Every DETSPEC multi-layer decode site (eager, per-step graphs, single graph)
    calls this one function so the key -> token map cannot depend on which path
    a batch took.  ``out`` may be a strided row view (the graph writes
    ``draft_probs[:bs, step]``, row stride ``S*V``); its last dimension must be
    contiguous.  Allocates only ``out`` (when not given) and the kernel's
    ``[B, V/4096]`` partials, so it is CUDA-graph capturable.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    bs, vocab = logits.shape
    # The kernel addresses logits row r at r * V and reads fp32; .to/.contiguous
    # are no-ops for the graph's fp32 logits buffer and exact for bf16 logits.
    logits = logits.to(torch.float32).contiguous()
    if temperatures is not None:
        if temperatures.numel() != bs:
            raise ValueError(
                f"temperatures need one value per logits row: logits "
                f"{tuple(logits.shape)}, temperatures {tuple(temperatures.shape)}"
            )
        # The kernel reads temperature r at offset r.
        temperatures = temperatures.reshape(bs, 1).to(torch.float32).contiguous()
    if out is None:
        out = torch.empty((bs, vocab), dtype=torch.float32, device=logits.device)
    elif out.shape != (bs, vocab) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(
            "out must be a float32 [B, V] view with contiguous rows, got "
            f"shape {tuple(out.shape)} dtype {out.dtype} strides {out.stride()}"
        )
    if bs == 0:
        return out
    return wide_row_softmax_triton(logits, temperatures, out)


def prefill_draft_softmax(
    logits: torch.Tensor, temperatures: torch.Tensor
) -> torch.Tensor:
    """q for the prefill proposal: ``torch.softmax(logits / T)`` (``proposal.draft_proposal_probs``).

    The prefill site is eager in every configuration, so it keeps the softmax
    of upstream's ``sample_draft_proposal`` (bit-identical to 0.5.23 except on
    SM 10.3, where upstream's choice depends on the batch size).
    """
    return _proposal.draft_proposal_probs(logits, temperatures)


# --------------------------------------------------------------------------
# Worker-side sites (rows 4-6): the sample_draft_proposal stand-in
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _SiteKeys:
    """Keys of one DETSPEC ``_draft_extend_for_*`` call; one proposal per MTP step."""

    site: str
    sampling_seed: Optional[torch.Tensor]
    positions: torch.Tensor
    top_ks: Optional[torch.Tensor]
    softmax: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    num_steps: int
    #: Coupled scheme: MTP step ``k`` is keyed at ``positions + k``, the verify row it is raced against.
    coupled: bool = False
    calls: int = 0

    def step_positions(self, step: int) -> torch.Tensor:
        return self.positions + step if self.coupled else self.positions


_DRAFT_SITE: Site[_SiteKeys] = Site("draft")


def _seeded_sample_draft_proposal(
    keys: _SiteKeys, next_token_logits: torch.Tensor, temperatures, kwargs
):
    step = keys.calls
    keys.calls += 1
    # 0.5.23 passes draft_step=step; 0.5.17 passes nothing and relies on call
    # order.  A mismatch means upstream reordered its loop: refuse rather than
    # silently key the wrong layer.
    upstream_step = kwargs.get("draft_step")
    if upstream_step is not None and int(upstream_step) != step:
        raise RuntimeError(
            f"DETSPEC multi-layer {keys.site}: proposal #{step} was made for "
            f"draft_step={upstream_step}; sglang changed its MTP loop order"
        )
    if step >= keys.num_steps:
        raise RuntimeError(
            f"DETSPEC multi-layer {keys.site}: more proposals than the "
            f"{keys.num_steps} MTP steps"
        )
    probs = keys.softmax(next_token_logits, temperatures)
    if probs.shape[0] == 0:
        # Idle round (DP attention rank without requests): nothing to key.
        empty = probs.new_empty((0, 1))
        return probs, empty, empty.to(torch.int64)
    seed = require_seed(keys.sampling_seed, f"multi-layer {keys.site}")
    topk_p, topk_index = _proposal.seeded_draft_proposal(
        probs, seed, keys.step_positions(step), step, top_ks=keys.top_ks
    )
    # The verify's accept test coin*q(X) < p(X) needs X drawn from exactly the
    # q it receives: hand back the probs tensor that was sampled.
    return probs, topk_p, topk_index


def _detspec_sample_draft_proposal(next_token_logits, temperatures, *args, **kwargs):
    """Stand-in for ``sample_draft_proposal`` inside the rebound upstream bodies.

    Accepts both signatures: 0.5.17 ``(logits, temperatures)`` and 0.5.23
    ``(logits, temperatures, top_ks=None, *, sampling_seed, positions,
    draft_step)``.  Returns ``(q, q(X), X)``.
    """
    keys = _DRAFT_SITE.require("multi-layer sample_draft_proposal")
    return _seeded_sample_draft_proposal(keys, next_token_logits, temperatures, kwargs)


@contextlib.contextmanager
def _active_site(keys: _SiteKeys):
    with _DRAFT_SITE.entered(keys):
        yield keys
    # Zero calls: non-RS path or the single-CG runner sampled in-graph.
    if keys.calls not in (0, keys.num_steps):
        raise RuntimeError(
            f"DETSPEC multi-layer {keys.site}: {keys.calls} proposals for "
            f"{keys.num_steps} MTP steps"
        )


def _site_keys(worker, batch, site: str, positions, softmax, *, coupled: bool) -> _SiteKeys:
    sampling_info = getattr(batch, "sampling_info", None)
    return _SiteKeys(
        site=site,
        sampling_seed=getattr(sampling_info, "sampling_seed", None),
        positions=positions,
        top_ks=getattr(sampling_info, "top_ks", None),
        softmax=softmax,
        num_steps=worker.speculative_num_steps,
        coupled=coupled,
    )


# --------------------------------------------------------------------------
# Running upstream method bodies with DETSPEC names
# --------------------------------------------------------------------------


# Which upstream names each rebound method must read (the same in 0.5.17 - 0.5.23); a method that stops reading
# one fails loudly when the worker is built.
_upstream = ReboundMethods(
    {
        (MultiLayerEagleDraftWorker, "_draft_extend_for_prefill"): ("sample_draft_proposal",),
        (MultiLayerEagleDraftWorker, "_draft_extend_for_decode"): ("sample_draft_proposal",),
        (MultiLayerEagleDraftWorker, "_capture_cuda_graphs"): (_SINGLE_CG_RUNNER_NAME,),
        (MultiLayerEagleWorkerV2, "__init__"): ("MultiLayerEagleDraftWorker",),
    },
    stand_ins=lambda: {
        "sample_draft_proposal": _detspec_sample_draft_proposal,
        _SINGLE_CG_RUNNER_NAME: DetspecOneGraphDraftExtendRunner,
        "MultiLayerEagleDraftWorker": DetspecMultiLayerEagleDraftWorker,
    },
)


# --------------------------------------------------------------------------
# Single-CG runner (row 7)
# --------------------------------------------------------------------------


class DetspecSingleCGStepRunner(MultiLayerEagleDraftExtendCudaGraphRunner):
    """One MTP step of the single-CG runner, sampling with the seeded proposal.

    Captured once per batch bucket ``bs``; at replay the buffers hold the
    values ``DetspecOneGraphDraftExtendRunner.prepare`` staged.
    """

    detspec_keys: Optional[GraphKeyBuffers] = None

    def _sample_draft_proposal(self, ret, bs: int):
        buffers = self.buffers
        keys = self.detspec_keys
        if keys is None:
            raise RuntimeError(
                "DETSPEC single-CG runner captured without its key buffers"
            )
        # q is written straight into this step's draft_probs slot (a strided
        # view, row stride S*V) and X is drawn from that very tensor, so the
        # clone the worker hands to verify is the distribution X came from.
        probs = decode_draft_softmax(
            self._select_step_logits(ret, bs),
            buffers.temperatures[:bs],
            out=buffers.draft_probs[:bs, self.step],
        )
        # Rows >= raw_bs are padding: the sampler is row-independent, so their
        # stale or filler keys cannot change a real row.
        ret.topk_p, ret.topk_index = _proposal.seeded_draft_proposal(
            probs,
            keys.sampling_seed[:bs],
            self._key_positions(bs),
            self.step,
            top_ks=keys.top_ks[:bs],
        )

    def _key_positions(self, bs: int) -> torch.Tensor:
        """Row 7's key positions, read from the graph's buffers at replay.

        Rejection: ``buffers.seq_lens`` (= L + N, 0.5.23's key).  Coupled: the
        next verify's row ``step``, ``L + accept_lens + step``; ``seq_lens``
        holds L + N and ``num_accept_tokens`` the accepted count with the bonus
        token (what ``_draft_extend_for_decode`` stashes for ``prepare()``).
        """
        buffers = self.buffers
        if _scheme.current() != _scheme.COUPLED:
            return buffers.seq_lens[:bs]
        accepted = buffers.num_accept_tokens[:bs].to(buffers.seq_lens.dtype)
        return buffers.seq_lens[:bs] - self.speculative_num_draft_tokens + accepted + self.step


class DetspecOneGraphDraftExtendRunner(
    OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner
):
    """Single-CG draft-extend runner with seeded in-graph proposals."""

    detspec_keys: Optional[GraphKeyBuffers] = None

    def _create_runner(self, step: int):
        return DetspecSingleCGStepRunner(self.eagle_worker, step)

    def _allocate_buffers(self):
        buffers = super()._allocate_buffers()
        # Allocated before capture (capture runs inside __init__).
        self.detspec_keys = GraphKeyBuffers.allocate(self.max_bs, self.device)
        for runner in self.runners:
            if runner is not None:
                runner.detspec_keys = self.detspec_keys
        return buffers

    def prepare(self, forward_batch, *args, **kwargs):
        in_graph_proposal = self.buffers.draft_probs is not None
        sampling_info = forward_batch.sampling_info
        if in_graph_proposal and forward_batch.batch_size > 0:
            # Refused before upstream stages the round.
            require_seed(getattr(sampling_info, "sampling_seed", None), "multi-layer single-CG draft-extend")
        super().prepare(forward_batch, *args, **kwargs)
        if in_graph_proposal:
            self.refresh_detspec_keys(sampling_info)

    def refresh_detspec_keys(self, sampling_info) -> None:
        """Stage this round's seeds and top-k into the graph's key buffers."""
        self.detspec_keys.stage(sampling_info, self.raw_bs, "multi-layer single-CG draft-extend")
        self.detspec_keys.fill_padding(self.raw_bs, self.bs)


# --------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------


class DetspecMultiLayerEagleDraftWorker(MultiLayerEagleDraftWorker):
    """Multi-layer draft worker whose every proposal is seeded (rows 4-7)."""

    def _capture_cuda_graphs(self):
        # Same body; only the single-CG runner class name resolves to ours.
        _upstream(MultiLayerEagleDraftWorker, "_capture_cuda_graphs")(self)
        runner = self.cuda_graph_runner_for_draft_extend
        if (
            runner is not None
            and getattr(runner, "rotates_in_graph", False)
            and self.use_rejection_sampling
            and self.topk == 1
            and not isinstance(runner, DetspecOneGraphDraftExtendRunner)
        ):
            raise RuntimeError(
                f"DETSPEC multi-layer: draft-extend runner {type(runner).__name__} "
                "samples in-graph without the seeded proposal"
            )

    def _draft_extend_for_prefill(self, batch, *args, **kwargs):
        # Row 4: key position = L (batch.seq_lens, what 0.5.23 passes as
        # forward_batch.seq_lens), draft_step = MTP layer.  Coupled: L + layer,
        # since the first verify's seq_lens is L (the prefill's new_seq_lens).
        keys = _site_keys(self, batch, "prefill", batch.seq_lens, prefill_draft_softmax,
                          coupled=_scheme.current() == _scheme.COUPLED)
        with _active_site(keys):
            return _upstream(MultiLayerEagleDraftWorker, "_draft_extend_for_prefill")(
                self, batch, *args, **kwargs
            )

    def _draft_extend_for_decode(self, batch, batch_result, *args, **kwargs):
        # Rows 5-6: key position = L + N, the post-write length that
        # prepare_for_draft_extend puts on forward_batch.seq_lens (and that the
        # single-CG runner stages into buffers.seq_lens).  Computed from the
        # batch before the upstream body runs: that mutation stays on the
        # forward batch.
        coupled = _scheme.current() == _scheme.COUPLED
        if coupled:
            # Coupled: MTP layer k's proposal is raced against row k of the
            # next verify, keyed at that verify's seq_lens + k; its seq_lens is
            # this verify's new_seq_lens (L + accepted + bonus, on the device).
            positions = _coupled_decode_base(batch_result)
        else:
            positions = batch.seq_lens + self.speculative_num_draft_tokens
        keys = _site_keys(self, batch, "decode", positions, decode_draft_softmax, coupled=coupled)
        with _active_site(keys):
            return _upstream(MultiLayerEagleDraftWorker, "_draft_extend_for_decode")(
                self, batch, batch_result, *args, **kwargs
            )


def _coupled_decode_base(batch_result) -> torch.Tensor:
    new_seq_lens = getattr(batch_result, "new_seq_lens", None)
    if new_seq_lens is None:
        raise RuntimeError(
            "DETSPEC multi-layer decode draft-extend: the verify result has no new_seq_lens, which the coupled "
            "proposal of DETSPEC_*_INVARIANT keys every MTP layer with (sglang-detspec needs updating for this "
            "SGLang version)"
        )
    return new_seq_lens


class DetspecMultiLayerEagleWorkerV2(DetspecSpecWorker, MultiLayerEagleWorkerV2):
    """``MultiLayerEagleWorkerV2`` whose draft worker samples seeded proposals and whose verify is row-local.

    Accepts each sglang version's constructor arguments unchanged (0.5.17 adds ``ps``). What it shares with the
    single-layer worker (construction, attention backends, verify) is :class:`DetspecSpecWorker`.
    """

    UPSTREAM_WORKER = MultiLayerEagleWorkerV2
    DRAFT_WORKER = DetspecMultiLayerEagleDraftWorker
    REBOUND = _upstream
