"""Coupled race of a reduced-vocabulary ("hot token") draft, on probabilities, keyed by TARGET id (issue 33).

What: for a draft distribution ``probs`` ``[R, Vd]`` over a draft's hot tokens and ``hot_to_target`` int64 ``[Vd]``
(the target id of each draft column), the target id ``argmax_j(log q_j + G(seed, position, hot_to_target[j]))`` of
every row: SGLang's non-speculative seeded race with each hot token raced under its TARGET id's noise, the first NaN
or the first maximum by TARGET id.  Bit for bit
:func:`~sglang_detspec.stream.coupled_reference.coupled_hot_race_reference` of ``torch.log(probs)``, which is the
full race on the scattered q wherever that race's winner is finite.  Why: the speculation-invariant proposal of an
EAGLE3 (``d2t``) or ``--speculative-token-map`` draft must race the noise the target's verify races for the same
token id, or its proposals are rejected for nothing.

Design: :mod:`.coupled_race_probs`'s two stages and its float32 ratio screen (same bound, same margin: the bound
is per element, whatever the key), over the ``Vd`` draft columns, with each column's hash key read from the map
beside ``probs`` (no ``[R, V]`` scatter).  The map is not sorted in general (SGLang's ``hot_token_id``), so every
tie is broken by target id, as :mod:`.seeded_hot_draft_sample` does:
  * stage 1 re-scores a chunk's near-tie candidates by ``(score, -target id)``; a chunk of zero probabilities only
    reports its lowest target id; lone candidates and chunks the screen cannot judge go to stage 2 as there;
  * stage 2 takes the lowest target id among the row's equal maxima, and rescans EVERY unjudged chunk (the lowest
    NaN target id may sit in a later chunk than the first NaN), keeping the lowest NaN target id.

CUDA graphs: capturable.  ``seeds``, ``positions`` and ``hot_to_target`` are read from device memory at replay
(``hot_to_target`` must be contiguous, so that no copy of it is baked into the capture); shapes,
``cap_unit_uniform``, ``uniform`` and the launch are fixed at capture.  No host synchronisation; the ``[R]`` output
and ``[R, cdiv(Vd, BLOCK)]`` float64 + int32 partials are allocated per call (from the graph's pool under capture).
Exact where the kernel's float32 ``log`` is CUDA torch's (:mod:`.coupled_race_probs`' docstring).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..stream.coupled_reference import check_coupled_race_inputs, check_hot_to_target, resolve_uniform
from .coupled_race_probs import race_launch, ratio_f32, resolve_fast_screen
from .coupled_scoring import (
    ABS_MARGIN,
    INT32_MAX,
    LN_TWO_P64,
    LONE_CODE,
    NEG_REL_MARGIN,
    P_SCREEN_MAX,
    RATIO_SLACK,
    RESCAN_CODE,
    exact_score,
)
from .draft_scoring import first_max_by_token
from .hashing import fmix32, mix32, race_row_prefix
from .launch_checks import require_cuda_or_interpreter, require_vocab_contiguous

__all__ = ["coupled_hot_race_probs"]


@triton.jit
def _rescore_by_target(row_ptr, map_ptr, h_row, offs, cand, CAP: tl.constexpr, RECIP: tl.constexpr):
    """Exact float64 maximum over the screen's candidates (two or more, all with finite scores), ties to the lowest
    target id: ``(score, draft index)``."""
    n = tl.sum(cand.to(tl.int32), 0)
    j = tl.min(tl.where(cand, offs, INT32_MAX), 0)
    res_tok = tl.load(map_ptr + j).to(tl.int32)
    res_score = exact_score(tl.log(tl.load(row_ptr + j)), h_row, res_tok, CAP, RECIP)
    res_idx = j
    rest = cand & (offs != j)
    k = n - 1
    while k > 0:  # near ties, in draft-index order
        j2 = tl.min(tl.where(rest, offs, INT32_MAX), 0)
        rest = rest & (offs != j2)
        k -= 1
        t2 = tl.load(map_ptr + j2).to(tl.int32)
        s64 = exact_score(tl.log(tl.load(row_ptr + j2)), h_row, t2, CAP, RECIP)
        if (s64 > res_score) | ((s64 == res_score) & (t2 < res_tok)):
            res_score = s64
            res_tok = t2
            res_idx = j2
    return res_score, res_idx


@triton.jit
def _hot_chunk_partial(row_ptr, map_ptr, h_row, lo, VD, CAP: tl.constexpr, RECIP: tl.constexpr,
                       MASKED: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    """One chunk's stage-2 partial ``(float64 score, draft index or code)`` from the ratio screen, keyed by target
    id (:func:`~.coupled_race_probs._chunk_partial` with the map's keys and target-id ties)."""
    offs = lo + tl.arange(0, BLOCK)
    valid = offs < VD
    if MASKED:
        p = tl.load(row_ptr + offs, mask=valid, other=0.0)
        tok = tl.load(map_ptr + offs, mask=valid, other=0).to(tl.int32)  # target ids < 2**31 (HotVocab)
    else:
        p = tl.load(row_ptr + offs)
        tok = tl.load(map_ptr + offs).to(tl.int32)
    h = fmix32(mix32(h_row, tok.to(tl.uint32)))
    # not (0 <= p <= 2**16) is NaN, negative (log NaN), +inf or not a probability: the screen cannot judge it
    unjudged = ~((p >= 0.0) & (p <= P_SCREEN_MAX))
    if not CAP:
        unjudged = unjudged | (valid & (h == 0xFFFFFFFF))  # Gumbel +inf (NaN at p = 0)
    # masked lanes read p = 0: ratio 0, like a zero probability; h = 0 (g = -709.78) gets ratio 0, settled below
    r = ratio_f32(p, h, FAST)
    m = tl.max(r, 0)
    res_score = tl.full([], float("-inf"), tl.float64)
    res_idx = lo
    if tl.sum(unjudged.to(tl.int32), 0) > 0:
        res_idx = RESCAN_CODE
    elif m > 0.0:
        s_m = tl.log(m) - LN_TWO_P64  # the screen's log-space maximum, for the relative margin
        neg_delta = (tl.abs(s_m) + 1.0) * NEG_REL_MARGIN - ABS_MARGIN - RATIO_SLACK
        cand = r >= m * tl.exp(neg_delta)
        if tl.sum(cand.to(tl.int32), 0) == 1:
            res_idx = LONE_CODE - tl.min(tl.where(cand, offs, INT32_MAX), 0)
        else:
            res_score, res_idx = _rescore_by_target(row_ptr, map_ptr, h_row, offs, cand, CAP, RECIP)
    elif tl.max(p, 0) > 0.0:
        # positive probabilities whose ratios are all 0: each sits on hash 0, whose exact score is finite
        res_idx = RESCAN_CODE
    else:
        # every probability is (+-)0: every score is exactly -inf, and the lowest target id is the chunk's argmax
        t_min = tl.min(tl.where(valid, tok, INT32_MAX), 0)
        res_idx = tl.min(tl.where(valid & (tok == t_min), offs, INT32_MAX), 0)
    return res_score, res_idx


@triton.jit
def _hot_stage1(
    probs_ptr, row_stride, map_ptr, seed_ptr, pos_ptr, part_score_ptr, part_idx_ptr, VD, NC,
    CAP: tl.constexpr, RECIP: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = race_row_prefix(seed_ptr, pos_ptr, row)
    lo = c * BLOCK
    if lo + BLOCK <= VD:  # only the last chunk of a row is partial: the others skip the masks
        res_score, res_idx = _hot_chunk_partial(row_ptr, map_ptr, h_row, lo, VD, CAP, RECIP, False, BLOCK, FAST)
    else:
        res_score, res_idx = _hot_chunk_partial(row_ptr, map_ptr, h_row, lo, VD, CAP, RECIP, True, BLOCK, FAST)
    tl.store(part_score_ptr + row * NC + c, res_score)
    tl.store(part_idx_ptr + row * NC + c, res_idx)


@triton.jit
def _hot_stage2(
    probs_ptr, row_stride, map_ptr, seed_ptr, pos_ptr, part_score_ptr, part_idx_ptr, out_ptr, VD, NC,
    CAP: tl.constexpr, RECIP: tl.constexpr, NC_POW2: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per row: exact scores of the lone candidates (all chunks at once), the lowest-target-id maximum of
    the judged chunks, then every rescanned chunk; the lowest NaN target id if any, else the maximum's."""
    row = tl.program_id(0)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = race_row_prefix(seed_ptr, pos_ptr, row)
    cidx = tl.arange(0, NC_POW2)
    live = cidx < NC
    score = tl.load(part_score_ptr + row * NC + cidx, mask=live, other=float("-inf"))
    code = tl.load(part_idx_ptr + row * NC + cidx, mask=live, other=0)
    lone = live & (code <= LONE_CODE)
    rescan = live & (code == RESCAN_CODE)
    ok = live & ~rescan
    j = tl.where(lone, LONE_CODE - code, tl.where(ok, code, 0))  # the draft index each judged chunk names
    tok = tl.load(map_ptr + j, mask=ok, other=0).to(tl.int32)
    lp = tl.log(tl.load(row_ptr + j, mask=lone, other=1.0))  # the float32 log the exact score reads
    score = tl.where(lone, exact_score(lp, h_row, tok, CAP, RECIP), score)
    # Judged chunks score no NaN (probabilities in [0, 2**16], no Gumbel +inf): their lowest-target-id maximum
    # ((-inf, INT32_MAX) when every chunk is rescanned).
    best, best_tok = first_max_by_token(score, tok, ok)
    nan_tok = tl.full([], INT32_MAX, tl.int32)
    n = tl.sum(rescan.to(tl.int32), 0)
    while n > 0:  # rare: chunks the screen could not judge, exactly, all of them (NaN ties go by target id too)
        c = tl.min(tl.where(rescan, cidx, INT32_MAX), 0)
        rescan = rescan & (cidx != c)
        n -= 1
        offs = c * BLOCK + tl.arange(0, BLOCK)
        valid = offs < VD
        t = tl.load(map_ptr + offs, mask=valid, other=0).to(tl.int32)
        s = exact_score(tl.log(tl.load(row_ptr + offs, mask=valid, other=0.0)), h_row, t, CAP, RECIP)
        cs, ct = first_max_by_token(s, t, valid)
        if cs != cs:
            nan_tok = tl.minimum(nan_tok, ct)
        elif (cs > best) | ((cs == best) & (ct < best_tok)):
            best = cs
            best_tok = ct
    tl.store(out_ptr + row, tl.where(nan_tok < INT32_MAX, nan_tok, best_tok).to(tl.int64))


def coupled_hot_race_probs(
    probs: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    hot_to_target: torch.Tensor,
    *,
    cap_unit_uniform: bool = True,
    uniform: Optional[str] = None,
    block_size: Optional[int] = None,
    num_warps: Optional[int] = None,
    fast_screen: Optional[bool] = None,
) -> torch.Tensor:
    """The coupled race of a reduced draft, keyed by target id, the log taken in the kernel: the winning TARGET ids,
    int64 ``[R]`` (map them to draft indices with ``HotVocab.target_to_draft``).

    Args:
        probs: ``[R, Vd]`` float32 draft distribution over the hot tokens, contiguous in its last dimension (a
            strided row view such as ``draft_probs[:bs, step]`` is read in place).
        seeds, positions: ``[R]`` int64 request seeds and int32/int64 key positions.
        hot_to_target: contiguous int64 ``[Vd]`` target id of each draft column (``HotVocab.hot_to_target``: unique
            ids below ``2**31``; not re-checked here, which would synchronise).  Need not be sorted.
        cap_unit_uniform, uniform: the release's clamp of ``log(u)`` and the float64 form of ``u``, as
            :func:`~sglang_detspec.kernels.coupled_race_probs.coupled_race_probs`.
        block_size, num_warps, fast_screen: the stage-1 launch and screen form, as there
            (:func:`~.coupled_race_probs.race_launch` of ``[R, Vd]`` by default).

    Degenerate rows as the reference: all zero gives the lowest target id, a NaN or negative probability (and, with
    ``cap_unit_uniform=False``, a zero probability on hash ``2**32 - 1``) the lowest such target id, ``+inf`` the
    lowest target id at ``+inf``.  Under the interpreter (CPU tests) the kernel's ``log`` is numpy's: the CPU twin is
    then the reference of ``numpy.log(probs)``.  CUDA-graph caveats: module docstring.
    """
    check_coupled_race_inputs(probs, seeds, positions, uniform, float32_only=True)
    check_hot_to_target(hot_to_target, probs.shape[1], probs.device)
    if not hot_to_target.is_contiguous():
        raise ValueError("hot_to_target must be contiguous (HotVocab.hot_to_target is); call .contiguous() once, "
                         "outside any CUDA-graph capture, so that replays read the map itself and not a copy")
    require_vocab_contiguous("probs", probs, row_view="draft_probs[:bs, step]")
    require_cuda_or_interpreter(probs, "sglang_detspec.stream.coupled_reference.coupled_hot_race_reference")
    fast = resolve_fast_screen(fast_screen)
    R, VD = probs.shape
    out = torch.empty(R, dtype=torch.int64, device=probs.device)
    if R == 0:
        return out
    block, warps = race_launch(R, VD, block_size, num_warps)
    nc = triton.cdiv(VD, block)
    part_score = torch.empty((R, nc), dtype=torch.float64, device=probs.device)
    part_idx = torch.empty((R, nc), dtype=torch.int32, device=probs.device)
    cap = bool(cap_unit_uniform)
    recip = resolve_uniform(uniform, probs.device) == "reciprocal"
    seeds, positions = seeds.contiguous(), positions.contiguous()  # views only for 1-D contiguous inputs
    _hot_stage1[(R, nc)](
        probs, probs.stride(0), hot_to_target, seeds, positions, part_score, part_idx, VD, nc,
        CAP=cap, RECIP=recip, BLOCK=block, FAST=fast, num_warps=warps,
    )
    _hot_stage2[(R,)](
        probs, probs.stride(0), hot_to_target, seeds, positions, part_score, part_idx, out, VD, nc,
        CAP=cap, RECIP=recip, NC_POW2=max(16, triton.next_power_of_2(nc)), BLOCK=block, num_warps=4,
    )
    return out
