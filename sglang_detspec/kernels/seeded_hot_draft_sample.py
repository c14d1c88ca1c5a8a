"""Fused seeded draft sampler for a reduced-vocabulary ("hot token") draft, keyed by TARGET id.

What it computes (bit-for-bit the CPU twin :func:`sglang_detspec.stream.hot_vocab.seeded_hot_draft_sample`): for
every row of a draft distribution ``probs`` ``[B, Vd]`` and a map ``hot_to_target`` ``[Vd]`` (int64 target ids),
the maximum of the float64 scores ``p_j / -log((h_j + 0.5) / 2**32)``, ``h_j`` the MurmurHash3 of the salted draft
key whose column word is ``draft_step * V + hot_to_target[j]`` (``V`` the TARGET vocabulary), ties and NaNs going
to the lowest target id; it returns q at the winner, its target id and its draft index.  A reduced draft thus
proposes the token the full-vocabulary draft of the scattered q would (:mod:`sglang_detspec.stream.hot_vocab`).

Design: :mod:`.seeded_draft_sample`'s two stages over the ``Vd`` draft columns, with the map read beside ``probs``
(no ``[B, V]`` scatter of q, no ``[B, Vd]`` float64 temporaries). Stage 1, grid ``(B, cdiv(Vd, BLOCK))``: the same
float32 race filter (:mod:`.draft_scoring`: same error bound, same candidate margin), then the candidates are
re-scored exactly in float64, lexicographically by ``(score, -target id)``. Rare chunks (maximum NaN, infinite,
negative, or below 2**-80 where float32 underflow could hide a winner) are re-scored exactly as a whole vector right
there, instead of lazily in stage 2: simpler, and no softmax output reaches that path. Chunks whose every ``p`` is
<= 0 with a zero take the first zero by target id (padded graph rows). Stage 2, grid ``(B,)``: the row's
first-target-id maximum over the chunk partials ``(float64 score, target id, draft index)``.

CUDA graphs: capturable.  ``sampling_seed``, ``positions``, ``greedy`` and ``hot_to_target`` are read from device
memory at replay; ``draft_step``, ``target_vocab_size`` and the shapes are baked into the capture.  No host
synchronisation; allocations are the three outputs and ``[B, cdiv(Vd, BLOCK)]`` float64 + 2 x int32 partials.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..stream.draft_contract import check_hot_draft_inputs
from ..stream.hot_vocab import HotDraftDraw
from .draft_scoring import CAND_REL, LOW_SCORE, exact_score_of, first_max_by_token, race_score_f32
from .hashing import draft_row_prefix, fmix32, mix32
from .launch_checks import INTERPRETED, require_cuda_or_interpreter, require_vocab_contiguous
from .seeded_draft_sample import LaunchConfig, launch_plan

__all__ = ["seeded_hot_draft_sample"]

_INT_MAX = tl.constexpr(2147483647)


@triton.jit
def _hot_stage1(
    probs_ptr, row_stride, map_ptr, seed_ptr, pos_ptr, greedy_ptr, part_score_ptr, part_tok_ptr, part_idx_ptr,
    VD, col_base, NC,
    HAS_GREEDY: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = draft_row_prefix(seed_ptr, pos_ptr, row)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + row) != 0
    else:
        greedy = False
    offs = c * BLOCK + tl.arange(0, BLOCK)
    valid = offs < VD
    p = tl.load(row_ptr + offs, mask=valid, other=0.0)
    tok = tl.load(map_ptr + offs, mask=valid, other=0).to(tl.int32)  # target ids < 2**31 (contract)
    col = (col_base + tok.to(tl.int64)) & 0xFFFFFFFF  # draft_step * V + id <= 2**32 - 1 (contract)
    if greedy:
        s = p
    else:
        s = race_score_f32(p, fmix32(mix32(h_row, col.to(tl.uint32))), FAST)
    s = tl.where(valid, s, float("-inf"))
    # NaN-propagating chunk maximum (vectorised: the interpreter runs custom combine functions per element)
    m = tl.where(tl.max((s != s).to(tl.int32), 0) > 0, float("nan"), tl.max(s, 0))

    if greedy:
        # The score IS p, compared exactly in float32.
        m32, res_tok = first_max_by_token(s, tok, valid)
        res_score = m32.to(tl.float64)
    elif (m >= LOW_SCORE) & (m < float("inf")):
        # Every element whose float64 score can reach the chunk's float64 maximum has s >= thr (the bound).
        cand = s >= m * CAND_REL
        n = tl.sum(cand.to(tl.int32), 0)
        j = tl.min(tl.where(cand, offs, _INT_MAX), 0)
        res_tok = tl.min(tl.where(offs == j, tok, _INT_MAX), 0)
        res_score = exact_score_of(tl.load(row_ptr + j), h_row, tl.load(map_ptr + j) + col_base)
        rest = cand & (offs != j)
        k = n - 1
        while k > 0:  # near ties (about 2**-10 of the chunks), in draft-index order
            j2 = tl.min(tl.where(rest, offs, _INT_MAX), 0)
            rest = rest & (offs != j2)
            k -= 1
            t2 = tl.load(map_ptr + j2).to(tl.int32)
            s64 = exact_score_of(tl.load(row_ptr + j2), h_row, t2.to(tl.int64) + col_base)
            if (s64 > res_score) | ((s64 == res_score) & (t2 < res_tok)):
                res_score = s64
                res_tok = t2
    else:
        pmax = tl.max(tl.where(valid, p, float("-inf")), 0)
        if (m == 0) & (pmax == 0):
            # every p is +-0.0 or negative: every best score is (+-)0, the first zero by target id wins
            res_score = tl.zeros([], dtype=tl.float64)
            res_tok = tl.min(tl.where(valid & (p == 0.0), tok, _INT_MAX), 0)
        else:
            # NaN / inf / negative maxima, or every p below ~2**-77: the exact float64 scores of the whole chunk
            s64 = exact_score_of(p, h_row, col)
            res_score, res_tok = first_max_by_token(s64, tok, valid)
    res_idx = tl.min(tl.where(valid & (tok == res_tok), offs, _INT_MAX), 0)
    out = row * NC + c
    tl.store(part_score_ptr + out, res_score)
    tl.store(part_tok_ptr + out, res_tok)
    tl.store(part_idx_ptr + out, res_idx)


@triton.jit
def _hot_stage2(
    probs_ptr, row_stride, part_score_ptr, part_tok_ptr, part_idx_ptr, out_p_ptr, out_tok_ptr, out_idx_ptr,
    NC, NC_POW2: tl.constexpr,
):
    row = tl.program_id(0)
    cidx = tl.arange(0, NC_POW2)
    valid = cidx < NC
    sc = tl.load(part_score_ptr + row * NC + cidx, mask=valid, other=float("-inf"))
    tok = tl.load(part_tok_ptr + row * NC + cidx, mask=valid, other=_INT_MAX)
    idx = tl.load(part_idx_ptr + row * NC + cidx, mask=valid, other=0)
    _, win_tok = first_max_by_token(sc, tok, valid)
    win_idx = tl.min(tl.where(valid & (tok == win_tok), idx, _INT_MAX), 0)
    tl.store(out_tok_ptr + row, win_tok.to(tl.int64))
    tl.store(out_idx_ptr + row, win_idx.to(tl.int64))
    tl.store(out_p_ptr + row, tl.load(probs_ptr + row.to(tl.int64) * row_stride + win_idx))


def seeded_hot_draft_sample(
    probs: torch.Tensor,
    sampling_seed: torch.Tensor,
    positions: torch.Tensor,
    draft_step: int,
    hot_to_target: torch.Tensor,
    target_vocab_size: int,
    *,
    greedy: Optional[torch.Tensor] = None,
    block_size: Optional[int] = None,
    config: Optional[LaunchConfig] = None,
) -> HotDraftDraw:
    """Seeded draw from a reduced draft, keyed by target id: ``HotDraftDraw(prob [B,1] float32, token [B,1] int64
    target id, draft_index [B,1] int64)``.

    Args:
        probs: ``[B, Vd]`` float32 draft distribution, last dimension contiguous (row views are read in place).
        sampling_seed / positions: ``[B]`` int64 seeds and int32/int64 key positions.
        draft_step: Python int, ``draft_step * V + V <= 2**32`` with ``V = target_vocab_size``.
        hot_to_target: int64 ``[Vd]`` target id of each draft column (``HotVocab.hot_to_target``: unique, in range;
            not re-checked here, which would synchronise).
        greedy: optional ``[B]`` bool; True rows return the lowest-target-id argmax of ``probs``.
        config / block_size: the launch (:func:`~.seeded_draft_sample.launch_plan` of ``[B, Vd]``).

    CUDA graphs: capturable; update seeds, positions and ``greedy`` in place between replays.
    """
    check_hot_draft_inputs(probs, sampling_seed, positions, draft_step, greedy, hot_to_target, target_vocab_size)
    require_vocab_contiguous("probs", probs, row_view="draft_probs[:bs, step]")
    require_cuda_or_interpreter(probs, "sglang_detspec.stream.hot_vocab.seeded_hot_draft_sample")
    B, VD = probs.shape
    dev = probs.device
    out_p = torch.empty((B, 1), dtype=torch.float32, device=dev)
    out_tok = torch.empty((B, 1), dtype=torch.int64, device=dev)
    out_idx = torch.empty((B, 1), dtype=torch.int64, device=dev)
    if B == 0:
        return HotDraftDraw(out_p, out_tok, out_idx)
    block, warps, opts = launch_plan(B, VD, config, block_size)
    nc = triton.cdiv(VD, block)
    part_score = torch.empty((B, nc), dtype=torch.float64, device=dev)
    part_tok = torch.empty((B, nc), dtype=torch.int32, device=dev)
    part_idx = torch.empty((B, nc), dtype=torch.int32, device=dev)
    seeds = sampling_seed.reshape(-1).contiguous()
    pos = positions.reshape(-1).contiguous()
    hot = hot_to_target.contiguous()
    g = greedy.reshape(-1).contiguous() if greedy is not None else seeds  # dummy pointer when absent
    fast = dev.type == "cuda" and not INTERPRETED
    _hot_stage1[(B, nc)](
        probs, probs.stride(0), hot, seeds, pos, g, part_score, part_tok, part_idx,
        VD, int(draft_step) * int(target_vocab_size), nc,
        HAS_GREEDY=greedy is not None, BLOCK=block, FAST=fast, num_warps=warps, **opts,
    )
    _hot_stage2[(B,)](
        probs, probs.stride(0), part_score, part_tok, part_idx, out_p, out_tok, out_idx,
        nc, NC_POW2=max(16, triton.next_power_of_2(nc)), num_warps=4,
    )
    return HotDraftDraw(out_p, out_tok, out_idx)
