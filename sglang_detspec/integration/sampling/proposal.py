"""The one entry point every DETSPEC draft-proposal site calls.

``seeded_draft_proposal`` draws the draft token X ~ q for each row from the
counter-based stream of sglang 0.5.23 (key = (seed + DRAFT salt, position,
draft_step * V + token)), fused into one Triton pass on CUDA tensors and the
pure-torch reference on CPU tensors. Rows whose request is greedy
(``top_k <= 1``) propose the first argmax of ``probs`` instead, exactly like
upstream ``sample_draft_proposal(top_ks=...)``, so a greedy request inside a
sampled batch keeps its acceptance rate.

Contract (the verify step relies on it): the returned ``topk_p`` is
``probs.gather(1, topk_index)`` for the *same* ``probs`` tensor the caller hands
to verify as ``draft_probs``; callers must not re-normalise ``probs`` after
this call.

Under the coupled scheme (``DETSPEC_*_INVARIANT``, :mod:`.scheme`) the same entry
point proposes ``argmax_t(log q_t + G(seed, position, t))`` instead: SGLang's
non-speculative Gumbel race on q, with the target's own (unsalted, token-id)
key, so the verify accepts the proposal exactly when the target's race picks
the same token (:func:`coupled_draft_proposal`). Every site passes the key
position ``base + draft_step`` (``base`` = the ``seq_lens`` of the verify these
drafts go to), which is the position the verify keys that draft's row with.

CUDA-graph caveat: all inputs must be device tensors that live in persistent
graph buffers when called under capture (``sampling_seed``, ``positions``,
``top_ks``); the function allocates only outputs (and, coupled, the race's
per-chunk partials; a half-precision q is first copied to float32) and never synchronises. The scheme is
read at call time, i.e. once at capture: it is fixed before any graph is built.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from sglang_detspec.integration import compat
from sglang_detspec.integration.sampling import scheme
from sglang_detspec.stream.hot_vocab import HotVocab

__all__ = ["coupled_draft_proposal", "draft_proposal_probs", "seeded_draft_proposal", "greedy_mask_from_top_ks"]


def draft_proposal_probs(next_token_logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Draft q = ``torch.softmax(logits / T)``, the same on every release and every batch size.

    That is what 0.5.17 - 0.5.21's ``sample_draft_proposal`` computes, and what 0.5.22+'s
    ``spec_utils.sampling_softmax`` computes everywhere except on SM 10.3 GPUs, where it switches to FlashInfer's
    softmax for batches of 1 - 64 rows (``cake_kernels.sampling.supports_softmax``): a batch-size dependence the
    seeded stream must not inherit. Verify receives this very q (the caller hands it on as ``draft_probs``).
    """
    return torch.softmax(next_token_logits / temperatures, dim=-1)


def greedy_mask_from_top_ks(
    top_ks: Optional[torch.Tensor], batch_size: int
) -> Optional[torch.Tensor]:
    """``top_ks <= 1`` as a bool ``[B]`` tensor (upstream's greedy-row rule)."""
    if top_ks is None:
        return None
    if top_ks.dim() == 2 and top_ks.shape[1] == 1:
        top_ks = top_ks.view(-1)
    if top_ks.dim() != 1 or top_ks.shape[0] < batch_size:
        raise ValueError(
            f"top_ks must be a [B] tensor with B >= {batch_size}, got shape "
            f"{tuple(top_ks.shape)}"
        )
    # Graph buffers may be larger than the live batch (max captured bs);
    # only the first B rows belong to this call.
    return top_ks[:batch_size] <= 1


def seeded_draft_proposal(
    probs: torch.Tensor,
    sampling_seed: torch.Tensor,
    positions: torch.Tensor,
    draft_step: int,
    top_ks: Optional[torch.Tensor] = None,
    *,
    hot_vocab: Optional[HotVocab] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Seeded draft proposal: ``(topk_p [B,1] float32, topk_index [B,1] int64)``.

    Args:
        probs: ``[B, V]`` draft distribution q (may be a strided row view).
        sampling_seed: ``[B]`` int64 per-request seeds.
        positions: ``[B]`` int32/int64 key positions (truncated to uint32).
        draft_step: index of the proposal in the draft chain (0 for a
            draft-extend proposal, ``i + 1`` for draft-decode step ``i``).
        top_ks: optional ``[B]`` per-request top-k; rows with ``top_k <= 1``
            propose ``argmax(probs)`` (first index) instead of a random draw.
        hot_vocab: a reduced-vocabulary draft's map: ``probs`` is then ``[B, Vd]`` over its hot tokens, the
            draw is keyed by TARGET id (:mod:`sglang_detspec.stream.hot_vocab`; greedy rows take the
            lowest-target-id argmax), and ``topk_index`` is the DRAFT index, which SGLang's draft loop maps
            through its own ``hot_token_id``.
    """
    # No checks of its own: the draw chosen below validates every row it reads, once (stream/draft_contract.py).
    # The draws are imported lazily: the kernel modules define Triton kernels, which must be imported after
    # TRITON_INTERPRET is decided (tests set it on CPU).
    greedy = greedy_mask_from_top_ks(top_ks, probs.shape[0])
    if scheme.current() == scheme.COUPLED:
        return coupled_draft_proposal(probs, sampling_seed, positions, greedy=greedy, hot_vocab=hot_vocab)
    if hot_vocab is not None:
        # X is raced under its target id; the proposal is (q(X), draft index of X).
        if probs.is_cuda:
            from sglang_detspec.kernels.seeded_hot_draft_sample import seeded_hot_draft_sample
        else:
            from sglang_detspec.stream.hot_vocab import seeded_hot_draft_sample
        draw = seeded_hot_draft_sample(
            probs.float(), sampling_seed, positions, int(draft_step), hot_vocab.hot_to_target,
            hot_vocab.target_vocab_size, greedy=greedy,
        )
        return probs.gather(1, draw.draft_index), draw.draft_index
    if probs.is_cuda:
        from sglang_detspec.kernels import seeded_draft_sample
    else:
        from sglang_detspec.stream.reference import seeded_draft_sample
    # The samplers take float32. Up-casting a half-precision q is exact, so the race (float64 scores either way)
    # picks the same token upstream would; q(X) is then gathered from the q verify will see.
    half = probs.dtype in (torch.float16, torch.bfloat16)
    topk_p, topk_index = seeded_draft_sample(
        probs.float() if half else probs, sampling_seed, positions, int(draft_step), greedy=greedy
    )
    return (probs.gather(1, topk_index), topk_index) if half else (topk_p, topk_index)


def coupled_draft_proposal(
    probs: torch.Tensor,
    sampling_seed: torch.Tensor,
    positions: torch.Tensor,
    *,
    greedy: Optional[torch.Tensor] = None,
    hot_vocab: Optional[HotVocab] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The coupled proposal ``(q(Y) [B,1] float32-or-q's-dtype, Y [B,1] int64)``, ``Y = argmax(log q + G)``.

    ``G`` is SGLang's non-speculative seeded noise for ``(sampling_seed, positions, token id)`` -- the noise the
    verify's target race uses at the row this proposal is checked against -- with the installed release's clamp
    of ``log(u)`` (:func:`~sglang_detspec.integration.compat.seeded_race_caps_unit_uniform`) and torch's own
    division on this device. Greedy rows (``greedy[b]``) propose the first argmax of ``probs``, which is what the
    target's race picks for a ``top_k = 1`` row. Which token the draft proposes changes only how many tokens are
    accepted, never which tokens are emitted.

    With ``hot_vocab`` (a reduced draft, ``probs`` ``[B, Vd]``) each hot token races with its TARGET id's noise and
    the returned index is its draft index (SGLang maps it through ``hot_token_id``): on CUDA the Triton race of
    :mod:`sglang_detspec.kernels.coupled_hot_race_probs`, on CPU its twin ``coupled_hot_race_reference``; greedy rows
    take the lowest-target-id argmax.
    """
    q32 = probs.float()  # exact for half-precision q (a no-op for float32); the race reads float32 log q
    cap = compat.seeded_race_caps_unit_uniform()
    # The race validates the seeds and positions (one int64 seed and one key position per row) itself.
    if hot_vocab is not None:
        return _coupled_hot_proposal(probs, q32, sampling_seed, positions, greedy, hot_vocab, cap)
    if probs.is_cuda:
        from sglang_detspec.kernels.coupled_race_probs import coupled_race_probs

        tokens = coupled_race_probs(q32, sampling_seed, positions, cap_unit_uniform=cap)  # log q taken in the kernel
    else:
        from sglang_detspec.stream.coupled_reference import coupled_race_reference

        tokens = coupled_race_reference(torch.log(q32), sampling_seed, positions, cap_unit_uniform=cap)
    if greedy is not None:
        tokens = torch.where(greedy, probs.argmax(dim=1), tokens)
    index = tokens.view(-1, 1)
    return probs.gather(1, index), index


def _coupled_hot_proposal(probs, q32, seeds, pos, greedy, hot_vocab, cap):
    """The coupled proposal of a reduced draft: ``(q(Y), draft index of Y)``, Y the target id that wins the race."""
    hot = hot_vocab.hot_to_target
    if probs.is_cuda:
        from sglang_detspec.kernels.coupled_hot_race_probs import coupled_hot_race_probs

        tokens = coupled_hot_race_probs(q32, seeds, pos, hot, cap_unit_uniform=cap)  # log q taken in the kernel
    else:
        from sglang_detspec.stream.coupled_reference import coupled_hot_race_reference

        tokens = coupled_hot_race_reference(torch.log(q32), seeds, pos, hot, cap_unit_uniform=cap)
    index = hot_vocab.target_to_draft[tokens].to(torch.int64)  # gather [B], then widen: no [V] copy
    if greedy is not None:
        index = torch.where(greedy, _lowest_target_argmax(probs, hot_vocab), index)
    index = index.view(-1, 1)
    return probs.gather(1, index), index


def _lowest_target_argmax(probs, hot_vocab):
    """Draft index of each row's argmax ordered by TARGET id (the lowest target id among NaNs, else among the maxima):
    ``probs[:, argsort(hot_to_target)].argmax(dim=1)`` mapped back, without a sort (elementwise ops and reductions
    only, so it runs under CUDA-graph capture as the rest of the proposal does)."""
    hot = hot_vocab.hot_to_target.view(1, -1)
    nan = probs.isnan()
    top = torch.where(nan.any(dim=1, keepdim=True), nan, probs == probs.max(dim=1, keepdim=True).values)
    tokens = torch.where(top, hot, hot_vocab.target_vocab_size).min(dim=1).values
    return hot_vocab.target_to_draft[tokens].to(torch.int64)
