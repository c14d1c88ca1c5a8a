"""Chain rejection-sampling verify for a reduced-vocabulary ("hot token") draft, reading q through the hot map.

SGLang's ``chain_speculative_sampling_triton`` (``sglang/kernels/ops/speculative/reject_sampling.py``) reads the
draft's q at TARGET ids, so it needs q as a ``[B, S, V]`` target-vocabulary tensor; a reduced draft would have to
scatter its ``[B, S, Vd]`` q into one first (upstream's FIXME; 4 bytes x B x S x V, 230 MiB at B = 128, S = 3,
V = 152k).  This kernel is that kernel's non-block path (0.5.23's, which every DETSPEC verify runs; block
verification is refused) with each q read through ``target_to_draft`` (int32 ``[V]``, -1 off the hot set):
q(x) = ``draft_probs[b, r, target_to_draft[x]]`` for a proposal, and in the residual ``max(p - q, 0)`` over the
whole target vocabulary q is gathered at the hot ids and 0 elsewhere.  The arithmetic (float32, the same
``BLOCK_V`` tiles, the same guards) is upstream's, so on the scattered q it produces upstream's tokens bit for bit
(tested), and its rule is exact for a q supported on a subset (:mod:`sglang_detspec.stream.hot_chain_verify`, the
CPU twin, whose test enumerates the output distribution).

One program per request: verification loop over the chain, then a sum pass and a CDF pass over the target row.
CUDA graphs: capturable (no host sync; outputs written in place like upstream's).  Candidates must be target ids
in ``[0, V)`` (upstream's contract too: nothing is bounds-checked on the device).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..stream.hot_chain_verify import check_hot_chain_inputs
from .launch_checks import require_cuda_or_interpreter

__all__ = ["hot_chain_speculative_sampling"]

#: Upstream's CDF tile (``BLOCK_V=4096`` in ``chain_speculative_sampling_triton``): equal tiles, equal float32 sums.
BLOCK_V = 4096


@triton.jit
def _hot_q(dp_row_ptr, stride_dp_v, t2d_ptr, tokens, mask):
    """q at target ids ``tokens`` from one reduced draft row: 0 off the hot set and where ``mask`` is False."""
    d = tl.load(t2d_ptr + tokens, mask=mask, other=-1)
    hot = mask & (d >= 0)
    return tl.load(dp_row_ptr + tl.where(hot, d, 0).to(tl.int64) * stride_dp_v, mask=hot, other=0.0)


@triton.jit
def _residual(tp_row, stride_tp_v, dp_row, stride_dp_v, t2d_ptr, v, mask, all_accepted):
    """One tile of the final draw's distribution: p itself after an all-accepted chain, else ``max(p - q, 0)`` with
    q read through the hot map (the sum pass and the CDF pass must compute the same values)."""
    p_val = tl.load(tp_row + v * stride_tp_v, mask=mask, other=0.0)
    if all_accepted:
        val = p_val
    else:
        q_val = _hot_q(dp_row, stride_dp_v, t2d_ptr, v, mask)
        q_val = tl.where((q_val >= 0.0) & (q_val <= 1.0), q_val, 0.0)
        diff = p_val - q_val
        val = tl.where(diff > 0.0, diff, 0.0)
    return val


@triton.jit
def _hot_chain_kernel(
    Predicts, AcceptIndex, AcceptTokenNum, Candidates, RetriveIndex, Uniform, UniformFinal, TargetProbs, DraftProbs,
    TargetToDraft,
    stride_cand_b, stride_cand_s, stride_idx_b, stride_idx_s, stride_acc_b, stride_acc_s, stride_uni_b, stride_uni_s,
    stride_tp_b, stride_tp_s, stride_tp_v, stride_dp_b, stride_dp_s, stride_dp_v,
    NUM_SLOTS: tl.constexpr, VOCAB_SIZE: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cand_ptr = Candidates + pid * stride_cand_b
    idx_ptr = RetriveIndex + pid * stride_idx_b
    uni_ptr = Uniform + pid * stride_uni_b
    last_accepted = tl.load(idx_ptr)
    tl.store(AcceptIndex + pid * stride_acc_b, last_accepted)
    num_accept = 0
    cur_prob_row = 0
    step = 1
    continue_verifying = 1
    while (step < NUM_SLOTS) and (continue_verifying == 1):
        draft_token = tl.load(cand_ptr + step * stride_cand_s)
        p = tl.load(TargetProbs + pid * stride_tp_b + cur_prob_row * stride_tp_s + draft_token * stride_tp_v)
        d = tl.load(TargetToDraft + draft_token)  # a proposal off the hot set has q = 0
        q = tl.load(DraftProbs + pid * stride_dp_b + cur_prob_row * stride_dp_s
                    + tl.maximum(d, 0).to(tl.int64) * stride_dp_v)
        q = tl.where(d >= 0, q, 0.0)
        coin = tl.load(uni_ptr + (step - 1) * stride_uni_s)
        q_is_prob = (q > 0.0) & (q <= 1.0)
        if q_is_prob & (coin * q < p):
            num_accept += 1
            cur_prob_row = step
            tl.store(Predicts + last_accepted, draft_token)
            last_accepted = tl.load(idx_ptr + step * stride_idx_s)
            tl.store(AcceptIndex + pid * stride_acc_b + num_accept * stride_acc_s, last_accepted)
            step += 1
        else:
            continue_verifying = 0
    tl.store(AcceptTokenNum + pid, num_accept)

    all_accepted = num_accept == NUM_SLOTS - 1
    coin_final = tl.load(UniformFinal + pid)
    tp_row = TargetProbs + pid * stride_tp_b + cur_prob_row * stride_tp_s
    dp_row = DraftProbs + pid * stride_dp_b + cur_prob_row * stride_dp_s  # read only on a rejection (row < S)
    norm_sum = 0.0
    for v_start in range(0, VOCAB_SIZE, BLOCK):
        v = v_start + tl.arange(0, BLOCK)
        mask = v < VOCAB_SIZE
        val = _residual(tp_row, stride_tp_v, dp_row, stride_dp_v, TargetToDraft, v, mask, all_accepted)
        norm_sum += tl.sum(val)

    target_u = coin_final * norm_sum
    cum_sum = 0.0
    final_token = VOCAB_SIZE - 1
    found = 0
    for v_start in range(0, VOCAB_SIZE, BLOCK):
        if found == 0:
            v = v_start + tl.arange(0, BLOCK)
            mask = v < VOCAB_SIZE
            val = _residual(tp_row, stride_tp_v, dp_row, stride_dp_v, TargetToDraft, v, mask, all_accepted)
            total = cum_sum + tl.cumsum(val, axis=0)
            over = total > target_u
            if tl.max(over, axis=0):
                final_token = v_start + tl.argmax(over.to(tl.int32), axis=0)
                found = 1
            cum_sum += tl.sum(val)
    tl.store(Predicts + last_accepted, final_token)


def hot_chain_speculative_sampling(
    *,
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    target_to_draft: torch.Tensor,
) -> None:
    """``chain_speculative_sampling_triton``'s outputs (``predicts``, ``accept_index``, ``accept_token_num``,
    written in place, same meaning and keywords) for a reduced draft: ``draft_probs`` is the reduced q
    ``[B, S, Vd]`` and ``target_to_draft`` (int32 ``[V]``, ``HotVocab.target_to_draft``) maps target ids to its
    columns.  ``candidates`` hold TARGET ids.  No host synchronisation."""
    check_hot_chain_inputs(candidates, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
                           target_to_draft)
    require_cuda_or_interpreter(target_probs, "sglang_detspec.stream.hot_chain_verify.hot_chain_verify_reference")
    batch, num_slots = candidates.shape
    if batch == 0:
        return
    _hot_chain_kernel[(batch,)](
        predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, target_to_draft,
        candidates.stride(0), candidates.stride(1), retrive_index.stride(0), retrive_index.stride(1),
        accept_index.stride(0), accept_index.stride(1), uniform_samples.stride(0), uniform_samples.stride(1),
        target_probs.stride(0), target_probs.stride(1), target_probs.stride(2),
        draft_probs.stride(0), draft_probs.stride(1), draft_probs.stride(2),
        NUM_SLOTS=num_slots, VOCAB_SIZE=target_probs.shape[-1], BLOCK=BLOCK_V, num_warps=4,
    )
