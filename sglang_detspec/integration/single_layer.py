"""DETSPEC single-layer EAGLE / NEXTN / EAGLE3 workers and draft CUDA-graph runner.

Every draft proposal these workers make under rejection sampling goes through
:func:`sglang_detspec.integration.proposal.seeded_draft_proposal` with the key
sglang 0.5.23's seeded path uses (BRIEF section 1.2 rows 1-3):

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
step, the key) from a :class:`contextvars.ContextVar` that the overriding
method sets around the upstream body. A context variable is per thread and per
re-entrant call, so concurrent or nested use cannot see another call's site.
Under CUDA-graph capture all of this is plain Python that runs once; the
tensors the stand-ins read (seed, position and top-k buffers) are the runner's
persistent buffers, so a replay reads the refreshed values.

The private globals are snapshotted when the worker is built (after every plugin
and ``HookRegistry`` patch of the scheduler process has been applied), and
only ever shadow the few names above.

What is overridden (same on 0.5.17 and 0.5.23 unless stated)
------------------------------------------------------------
* ``EAGLEWorkerV2.__init__``: upstream body, ``EagleDraftWorker`` ->
  :class:`DetspecEagleDraftWorker`; refuses ``SGLANG_SIMULATE_ACC_LEN`` first.
* ``EagleDraftWorker.draft_forward`` / ``_draft_extend_for_prefill`` /
  ``_draft_extend_for_decode``: upstream bodies inside a site context,
  ``fast_sample`` / ``sample_draft_proposal`` -> DETSPEC stand-ins. 0.5.23
  passes seed / position / step itself (used as given); 0.5.17 passes none
  (taken from the site). ``draft_forward`` also points a 0.5.17 capture's
  ``SamplingBatchInfo`` at the runner's seed / top-k buffers.
* ``EagleDraftWorker._capture_cuda_graphs``: upstream body,
  ``EAGLEDraftCudaGraphRunner`` -> :class:`DetspecEAGLEDraftCudaGraphRunner`.
* ``EAGLEDraftCudaGraphRunner.capture_one_shape`` / ``execute``: allocate,
  capture and refresh seed / top-k buffers; a no-op on 0.5.23, whose runner
  already owns them.
* ``EAGLEWorkerV2.verify``: upstream body with the row-local target truncation
  of :mod:`sglang_detspec.integration.verify`. Its coins need no change: under
  deterministic inference every batch carries ``sampling_seed``, and every
  release's ``_verify_coins`` then uses the (identical) ``_seeded_verify_coins``
  instead of ``torch.rand``; the rejection kernel itself draws nothing.
* The target model runner's sampler (first token after prefill) is the
  token-id-keyed one of :mod:`sglang_detspec.integration.target_sampler`.
* Not overridden: the draft-extend graph runner; it returns logits only, and
  the worker-side sampling above covers it.

Every rebound body and name is checked when the worker is built
(:mod:`sglang_detspec.integration.worker_checks`).

Deliberate difference from 0.5.23: the prefill draft-extend proposes the
argmax for greedy rows (upstream draws them), so greedy requests in sampled
batches keep their acceptance rate; their committed tokens are unchanged
(verify renormalises a greedy row's target to one-hot).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, Dict, Optional

import torch

from sglang.srt.speculative import spec_utils as _spec_utils
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import (
    EAGLEDraftCudaGraphRunner,
)
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, EagleDraftWorker

from sglang_detspec.integration import compat as _compat
from sglang_detspec.integration import proposal as _proposal
from sglang_detspec.integration.upstream_code import rebind
from sglang_detspec.integration.verify import rebound_verify
from sglang_detspec.integration.worker_checks import complete_spec_worker, refuse_global_rng_verify_paths

__all__ = [
    "DetspecEAGLEWorkerV2",
    "DetspecEagleDraftWorker",
    "DetspecEAGLEDraftCudaGraphRunner",
    "DraftSite",
    "current_draft_site",
]

# Version differences live in compat.py (see its "Single-layer draft sampling" section).
draft_proposal_probs = _compat.draft_proposal_probs


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
    one draft-decode loop.
    """

    kind: str
    sampling_info: Any
    positions: Callable[[], torch.Tensor]
    calls: int = 0

    def next_draft_step(self) -> int:
        self.calls += 1
        # Draft-extend proposals are step 0; the i-th draft-decode call is i + 1.
        return self.calls if self.kind == DRAFT_DECODE else 0


_ACTIVE_SITE: contextvars.ContextVar[Optional[DraftSite]] = contextvars.ContextVar(
    "detspec_active_draft_site", default=None
)


def current_draft_site() -> Optional[DraftSite]:
    return _ACTIVE_SITE.get()


@contextlib.contextmanager
def _draft_site(site: DraftSite):
    token = _ACTIVE_SITE.set(site)
    try:
        yield site
    finally:
        _ACTIVE_SITE.reset(token)


def _require_site(name: str) -> DraftSite:
    site = _ACTIVE_SITE.get()
    if site is None:
        # The stand-ins are only reachable from the rebound DETSPEC method
        # bodies, which always set a site; reaching here means upstream grew a
        # new caller we have not mapped to a key.
        raise RuntimeError(
            f"DETSPEC {name} was called outside a known draft site; the installed "
            "SGLang has a draft sampling call sglang-detspec does not key yet"
        )
    return site


def _seed_or_fallback(site: DraftSite, explicit: Optional[torch.Tensor]):
    seed = explicit if explicit is not None else getattr(
        site.sampling_info, "sampling_seed", None
    )
    if seed is None and _deterministic_inference_enabled():
        # Never fall back to the global RNG under deterministic mode: that is
        # exactly the batch-shape dependence DETSPEC exists to remove.
        raise RuntimeError(
            f"DETSPEC {site.kind}: no per-request sampling_seed reached the draft "
            "proposal under --enable-deterministic-inference (a draft CUDA-graph "
            "runner without DETSPEC seed buffers, e.g. one built by adaptive "
            "speculative decoding?)"
        )
    return seed


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
    site = _require_site("fast_sample")
    seed = _seed_or_fallback(site, sampling_seed)
    if seed is None or num_samples != 1:
        return _spec_utils.fast_sample(probs, num_samples)
    step = site.next_draft_step() if draft_step is None else int(draft_step)
    pos = positions if positions is not None else site.positions()
    return _proposal.seeded_draft_proposal(
        probs, seed, pos, step, top_ks=getattr(site.sampling_info, "top_ks", None)
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
    site = _require_site("sample_draft_proposal")
    # Idle / empty batches (DP attention) may carry no seed; nothing is drawn.
    seed = (
        _seed_or_fallback(site, sampling_seed)
        if next_token_logits.shape[0] > 0
        else None
    )
    if seed is None:
        # Not deterministic mode: behave exactly like the upstream worker
        # (0.5.17's sample_draft_proposal takes no top_ks; its callers pass none).
        extra = (top_ks,) if top_ks is not None else ()
        return _spec_utils.sample_draft_proposal(
            next_token_logits, temperatures, *extra
        )
    # Count every call (0.5.17 passes no step), but trust an explicit step.
    counted = site.next_draft_step()
    step = counted if draft_step is None else int(draft_step)
    pos = positions if positions is not None else site.positions()
    if top_ks is None:
        top_ks = getattr(site.sampling_info, "top_ks", None)
    probs = draft_proposal_probs(next_token_logits, temperatures)
    topk_p, topk_index = _proposal.seeded_draft_proposal(
        probs, seed, pos, step, top_ks=top_ks
    )
    return probs, topk_p, topk_index


# ---------------------------------------------------------------------------
# Running upstream method bodies with DETSPEC names
# ---------------------------------------------------------------------------


# Which upstream names each rebound method must read (the same in 0.5.17 - 0.5.23); a method that stops reading
# one fails loudly when the worker is built, instead of silently keeping upstream's unseeded sampler.
_REBOUND_NAMES = {
    (EagleDraftWorker, "draft_forward"): ("sample_draft_proposal",),
    (EagleDraftWorker, "_draft_extend_for_prefill"): ("fast_sample",),
    (EagleDraftWorker, "_draft_extend_for_decode"): ("sample_draft_proposal",),
    (EagleDraftWorker, "_capture_cuda_graphs"): ("EAGLEDraftCudaGraphRunner",),
    (EAGLEWorkerV2, "__init__"): ("EagleDraftWorker",),
}


def _replacements() -> Dict[str, Any]:
    return {
        "fast_sample": _detspec_fast_sample,
        "sample_draft_proposal": _detspec_sample_draft_proposal,
        "EagleDraftWorker": DetspecEagleDraftWorker,
        "EAGLEDraftCudaGraphRunner": DetspecEAGLEDraftCudaGraphRunner,
    }


@functools.lru_cache(maxsize=None)
def _upstream(owner: type, name: str) -> Callable:
    """Upstream ``owner.name`` running with the DETSPEC stand-in names.

    Built at worker construction (in the scheduler process, after all plugin patches are applied) and cached
    per (class, method).
    """
    wanted = _REBOUND_NAMES[(owner, name)]
    replacements = _replacements()
    return rebind(
        vars(owner)[name],
        {n: (lambda _original, value=replacements[n]: value) for n in wanted},
        required=wanted,
    )


# ---------------------------------------------------------------------------
# Draft worker
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _GraphSamplingBuffers:
    """Persistent per-row graph inputs a 0.5.17 capture needs (slices of max_bs)."""

    sampling_seed: torch.Tensor
    top_ks: torch.Tensor


class DetspecEagleDraftWorker(EagleDraftWorker):
    """``EagleDraftWorker`` whose every proposal is keyed like sglang 0.5.23.

    Overrides only wrap the upstream bodies (run with DETSPEC sampling names)
    in the site context that supplies the key.
    """

    # Set by DetspecEAGLEDraftCudaGraphRunner while it captures one shape on an
    # SGLang whose runner has no seed / top-k buffers (0.5.17).
    _detspec_graph_sampling: Optional[_GraphSamplingBuffers] = None

    def draft_forward(self, forward_batch):
        graph_sampling = self._detspec_graph_sampling
        if graph_sampling is not None and forward_batch.sampling_info is not None:
            # The captured SamplingBatchInfo is built inline by 0.5.17's
            # capture_one_shape without a seed and with a throwaway all-(-1)
            # top_ks (which would read as "every row greedy"). Point it at the
            # runner's persistent buffers so the graph reads refreshed rows.
            forward_batch.sampling_info.sampling_seed = graph_sampling.sampling_seed
            forward_batch.sampling_info.top_ks = graph_sampling.top_ks
        site = DraftSite(
            DRAFT_DECODE,
            forward_batch.sampling_info,
            # Read at call time: upstream advances positions in place after
            # each step, and 0.5.23 keys step i at (positions + 1).
            positions=lambda: forward_batch.positions + 1,
        )
        with _draft_site(site):
            return _upstream(EagleDraftWorker, "draft_forward")(self, forward_batch)

    def _draft_extend_for_prefill(self, batch, *args, **kwargs):
        site = DraftSite(
            PREFILL_EXTEND,
            batch.sampling_info,
            positions=lambda: batch.seq_lens,
        )
        with _draft_site(site):
            return _upstream(EagleDraftWorker, "_draft_extend_for_prefill")(
                self, batch, *args, **kwargs
            )

    def _draft_extend_for_decode(self, batch, batch_result, *args, **kwargs):
        site = DraftSite(
            DECODE_EXTEND,
            batch.sampling_info,
            positions=lambda: batch_result.new_seq_lens,
        )
        with _draft_site(site):
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
    """Draft-decode graph runner with persistent seed / top-k rows on 0.5.17.

    When deterministic inference and rejection sampling are on and the
    upstream runner does not already own them (0.5.23 does), it allocates
    ``sampling_seed [max_bs] int64`` and ``top_ks [max_bs] int32``, has every
    captured shape read slices of them, and copies the live batch's rows in
    before each replay. Padded rows keep whatever they last held; the proposal
    is row-independent, so they cannot change a real row's result, and their
    outputs are cut off by ``_postprocess_output_to_raw_bs``.
    """

    _detspec_seed_buf: Optional[torch.Tensor] = None
    _detspec_top_ks_buf: Optional[torch.Tensor] = None

    def _detspec_needs_own_buffers(self) -> bool:
        return (
            not _compat.draft_graph_runner_owns_sampling_buffers()
            and _deterministic_inference_enabled()
            and _rejection_sampling_enabled()
        )

    def _detspec_ensure_buffers(self) -> None:
        # Allocated at the first captured shape: capture runs inside the base
        # __init__, after max_bs and the device are known.
        if self._detspec_seed_buf is None and self._detspec_needs_own_buffers():
            device = self.model_runner.device
            self._detspec_seed_buf = torch.zeros(
                (self.max_bs,), dtype=torch.int64, device=device
            )
            # TOP_K_ALL, not -1: -1 would read as top_k <= 1 (greedy) for rows
            # that never had a real value copied in.
            self._detspec_top_ks_buf = torch.full(
                (self.max_bs,), _compat.top_k_all(), dtype=torch.int32, device=device
            )

    def capture_one_shape(self, size, forward, *args, **kwargs):
        self._detspec_ensure_buffers()
        worker = self.eagle_worker
        previous = getattr(worker, "_detspec_graph_sampling", None)
        if self._detspec_seed_buf is not None:
            worker._detspec_graph_sampling = _GraphSamplingBuffers(
                sampling_seed=self._detspec_seed_buf[:size],
                top_ks=self._detspec_top_ks_buf[:size],
            )
        try:
            return super().capture_one_shape(size, forward, *args, **kwargs)
        finally:
            worker._detspec_graph_sampling = previous

    def execute(self, forward_batch, *args, **kwargs):
        if self._detspec_seed_buf is not None:
            self._detspec_refresh_sampling_rows(forward_batch)
        return super().execute(forward_batch, *args, **kwargs)

    def _detspec_refresh_sampling_rows(self, forward_batch) -> None:
        sampling_info = forward_batch.sampling_info
        raw_bs = forward_batch.batch_size
        if sampling_info is None or sampling_info.sampling_seed is None:
            raise RuntimeError(
                "DETSPEC draft graph captured with per-request seeds but the "
                "batch carries none (is --enable-deterministic-inference on?)"
            )
        self._detspec_seed_buf[:raw_bs].copy_(sampling_info.sampling_seed[:raw_bs])
        self._detspec_top_ks_buf[:raw_bs].copy_(sampling_info.top_ks[:raw_bs])


# ---------------------------------------------------------------------------
# Top-level spec worker
# ---------------------------------------------------------------------------


class DetspecEAGLEWorkerV2(EAGLEWorkerV2):
    """``EAGLEWorkerV2`` that builds a :class:`DetspecEagleDraftWorker` and verifies row-locally.

    ``verify`` is upstream's body whose target truncation is the project's row-local one
    (:mod:`sglang_detspec.integration.verify`); the target model runner samples with the token-id-keyed
    sampler (:mod:`sglang_detspec.integration.target_sampler`). Overlap and graphs are upstream. Verify coins
    need no change: under deterministic inference ``sampling_info.sampling_seed`` is always set, so every
    release's ``eagle_sample`` takes ``_seeded_verify_coins`` (identical in all) instead of ``torch.rand``.
    """

    def __init__(self, *args, **kwargs):
        refuse_global_rng_verify_paths()
        _upstream(EAGLEWorkerV2, "__init__")(self, *args, **kwargs)
        complete_spec_worker(
            self,
            draft_worker_cls=DetspecEagleDraftWorker,
            upstream_owner=EAGLEWorkerV2,
            build_rebound=[functools.partial(_upstream, owner, name) for owner, name in _REBOUND_NAMES],
        )

    def verify(self, *args, **kwargs):
        return rebound_verify(EAGLEWorkerV2)(self, *args, **kwargs)
