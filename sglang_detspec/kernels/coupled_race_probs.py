"""Coupled race on probabilities: what the speculation-invariant verify and proposal run (issue 18).

Same answer, bit for bit, as :func:`~sglang_detspec.kernels.coupled_race.coupled_race` of ``torch.log(probs)``
(SGLang's non-speculative seeded race keyed by token id; definition in :mod:`sglang_detspec.stream.coupled_reference`),
with the log taken inside the kernel: no ``[R, V]`` temporary.  The float32 ratio screen and its exactness bound
are :mod:`.coupled_race`'s (module docstring there: ``r = (p * 2**64) / E32``, candidates ``r >= m * exp(-delta)``).

Layout: the two stages of ``seeded_draft_sample.py``, whose H200 tuning found what a program's tail costs
---------------------------------------------------------------------------------------------------------
Stage 1, grid ``(R, cdiv(V, BLOCK))``: float32 only, except near ties.
  * a chunk with one candidate (nearly every chunk) hands it to stage 2 unscored (:data:`LONE_CODE` code), instead of
    every program paying two serial float64 ``log`` at its tail;
  * near ties (several candidates, rare) are re-scored exactly here, in increasing index order;
  * chunks the screen cannot judge -- a NaN, negative or above-``2**16`` probability, or (0.5.17, no cap) a hash
    of ``2**32 - 1`` (Gumbel ``+inf``) -- and chunks whose positive probabilities all sit on hash 0 (every ratio
    0) are rescanned exactly in stage 2 (:data:`RESCAN_CODE`; rare), so the float64 chunk code stays out of stage 1's
    registers;
  * a chunk of zero probabilities only (every score ``-inf``) reports ``(-inf, first index)``, exactly;
  * only a row's last chunk masks its loads.
Stage 2, grid ``(R,)``: the exact scores of every lone candidate of the row at once, then the rescans in chunk
order, then the first NaN, else the first index of the maximum.
``KEYED`` (:mod:`.coupled_hot_race_probs`): the same stages over a reduced draft vocabulary, each column hashed
under the target id a map gives it (:func:`~.coupled_scoring.column_key`) and every exact tie, NaN ties included,
broken by that id; unkeyed, each column is its own key, increasing, so ties go to the first column and stage 2 stops
at the first NaN chunk.

CUDA graphs: capturable, as :mod:`.coupled_race` (seeds and positions read from device memory at replay; shapes,
``cap_unit_uniform``, ``uniform`` and the launch baked into the capture; no host synchronisation; the ``[R]``
output and ``[R, cdiv(V, BLOCK)]`` float64 + int32 partials are allocated per call, from the graph's pool under
capture).  Exact where the kernel's float32 ``log`` equals CUDA torch's ``torch.log``, which
``scripts/gpu_kernel_checks.py --only coupled`` measures over every non-negative float32 (equal on the H200).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..stream.coupled_reference import accept_and_emit, check_coupled_race_inputs, check_verify_inputs, resolve_uniform
from .coupled_scoring import (
    ABS_MARGIN,
    INT32_MAX,
    LN_TWO_P64,
    LONE_CODE,
    NEG_REL_MARGIN,
    P_SCREEN_MAX,
    RATIO_SLACK,
    RESCAN_CODE,
    TWO_P64,
    column_key,
    exact_chunk_argmax,
    exact_score,
    exponential_f32,
    rescore_candidates,
)
from .hashing import fmix32, mix32, race_row_prefix, recip_f32
from .launch_checks import (
    INTERPRETED,
    interpreter_block,
    overridden_launch,
    require_cuda_or_interpreter,
    require_vocab_contiguous,
)

__all__ = [
    "coupled_race_probs", "coupled_verify", "launch_probs_race", "race_launch", "ratio_f32", "resolve_fast_screen",
    "LAUNCH_TABLE",
]

#: (max R*V/163840, (stage-1 block, warps)): the first row whose bound is >= the launch's size wins.  Timed on an
#: H100 with ``scripts/bench/bench_verify_schemes.py --coupled-launches``: 16 columns per thread (2048 x 4) was the
#: fastest from 8 rows up, 2048 x 8 at 1 - 4 rows; no register spills at either width.  The timings and register
#: counts: ``docs/kernels.md``.
LAUNCH_TABLE: Tuple[Tuple[float, Tuple[int, int]], ...] = ((4.0, (2048, 8)), (float("inf"), (2048, 4)))
#: Chunks per row at most: stage 2 reads a row's partials as one vector (V = 163,840 is 160 chunks at 1024 columns).
MAX_CHUNKS = 4096


def race_launch(rows: int, vocab: int, block_size: Optional[int] = None,
                num_warps: Optional[int] = None) -> Tuple[int, int]:
    """``(columns, warps)`` per stage-1 program for ``rows`` rows of ``vocab`` tokens: :data:`LAUNCH_TABLE`'s, or
    ``block_size`` (a power of two >= 16) / ``num_warps`` where given; the interpreter, which runs few wide
    programs much faster, goes wider."""
    size = rows * vocab / 163840
    block, warps = next(launch for bound, launch in LAUNCH_TABLE if size <= bound)
    if INTERPRETED:
        block = interpreter_block(vocab)
    block, warps = overridden_launch(block, warps, block_size, num_warps)
    if triton.cdiv(vocab, block) > MAX_CHUNKS:  # stage 2 holds a row's chunks in one program
        raise ValueError(f"block_size {block} cuts a vocab of {vocab} into more than {MAX_CHUNKS} chunks; pass "
                         f"block_size >= {triton.next_power_of_2(triton.cdiv(vocab, MAX_CHUNKS))} (or leave it unset)")
    return block, warps


def resolve_fast_screen(fast_screen: Optional[bool]) -> bool:
    """Whether stage 1 screens with PTX's ``lg2.approx`` and ``rcp.approx`` (:func:`ratio_f32`): ``fast_screen``,
    or by default wherever PTX runs (not under the interpreter, whose NumPy cannot execute inline assembly)."""
    if fast_screen is None:
        return not INTERPRETED
    if fast_screen and INTERPRETED:
        raise ValueError("fast_screen=True needs a CUDA GPU: the Triton interpreter (TRITON_INTERPRET=1) cannot run "
                         "the screen's lg2.approx / rcp.approx; pass fast_screen=None or False")
    return bool(fast_screen)


@triton.jit
def ratio_f32(p, h, FAST: tl.constexpr):
    """The screen's float32 ratio ``(p * 2**64) / E32(h)`` (0 at ``h = 0``), within relative ``2**-12.8 + 2**-22`` of
    ``p * 2**64 / E`` (:mod:`.coupled_race`'s bound).  ``FAST``: ``rcp.approx`` (1 ulp) and a product (0.5 ulp)
    instead of ``div.full`` (2 ulp), inside the bound's 2 ulp for the division; ``E32`` lies in ``[2**-32, 22.2]``,
    so the reciprocal and the product of a probability ``<= 2**16`` are normal floats.  Public so that
    scripts/gpu_kernel_checks.py measures this very expression."""
    if FAST:
        r = (p * TWO_P64) * recip_f32(exponential_f32(h, True), True)
    else:
        r = (p * TWO_P64) / exponential_f32(h, False)
    return tl.where(h != 0, r, 0.0)


@triton.jit
def _chunk_partial(row_ptr, map_ptr, h_row, lo, V, CAP: tl.constexpr, RECIP: tl.constexpr, MASKED: tl.constexpr,
                   BLOCK: tl.constexpr, FAST: tl.constexpr, KEYED: tl.constexpr):
    """One chunk's stage-2 partial ``(float64 score, column or code)`` from the ratio screen; the screen's bound is
    per element, whatever the key (:func:`~.coupled_scoring.column_key`)."""
    offs = lo + tl.arange(0, BLOCK)
    if MASKED:
        valid = offs < V
        p = tl.load(row_ptr + offs, mask=valid, other=0.0)
        key = column_key(map_ptr, offs, valid, KEYED)
    else:
        p = tl.load(row_ptr + offs)
        key = column_key(map_ptr, offs, None, KEYED)
    h = fmix32(mix32(h_row, key.to(tl.uint32)))
    # not (0 <= p <= 2**16) is NaN, negative (log NaN), +inf or not a probability: the screen cannot judge it
    unjudged = ~((p >= 0.0) & (p <= P_SCREEN_MAX))
    if not CAP:
        if MASKED:
            unjudged = unjudged | (valid & (h == 0xFFFFFFFF))  # Gumbel +inf (NaN at p = 0)
        else:
            unjudged = unjudged | (h == 0xFFFFFFFF)
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
            res_score, res_idx = rescore_candidates(row_ptr, h_row, offs, cand, CAP, RECIP, True, map_ptr, KEYED)
    elif tl.max(p, 0) > 0.0:
        # positive probabilities whose ratios are all 0: each sits on hash 0, whose exact score is finite
        res_idx = RESCAN_CODE
    elif KEYED:
        # every probability is (+-)0: every score is exactly -inf, and the lowest key's column is the chunk's argmax
        if not MASKED:
            valid = offs < V
        k_min = tl.min(tl.where(valid, key, INT32_MAX), 0)
        res_idx = tl.min(tl.where(valid & (key == k_min), offs, INT32_MAX), 0)
    # else every probability is (+-)0 and each column is its own key: (-inf, lo) is the chunk's argmax
    return res_score, res_idx


@triton.jit
def _probs_stage1(
    probs_ptr, row_stride, map_ptr, seed_ptr, pos_ptr, part_score_ptr, part_idx_ptr, V, NC,
    CAP: tl.constexpr, RECIP: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr, KEYED: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = race_row_prefix(seed_ptr, pos_ptr, row)
    lo = c * BLOCK
    if lo + BLOCK <= V:  # only the last chunk of a row is partial: the others skip the masks
        res_score, res_idx = _chunk_partial(row_ptr, map_ptr, h_row, lo, V, CAP, RECIP, False, BLOCK, FAST, KEYED)
    else:
        res_score, res_idx = _chunk_partial(row_ptr, map_ptr, h_row, lo, V, CAP, RECIP, True, BLOCK, FAST, KEYED)
    tl.store(part_score_ptr + row * NC + c, res_score)
    tl.store(part_idx_ptr + row * NC + c, res_idx)


@triton.jit
def _probs_stage2(
    probs_ptr, row_stride, map_ptr, seed_ptr, pos_ptr, part_score_ptr, part_idx_ptr, out_ptr, V, NC,
    CAP: tl.constexpr, RECIP: tl.constexpr, NC_POW2: tl.constexpr, BLOCK: tl.constexpr, KEYED: tl.constexpr,
):
    """One program per row: exact scores of the lone candidates (all chunks at once), the lowest-key maximum of the
    judged chunks, then the rescans in chunk order; the lowest NaN key if any, else the maximum's key."""
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
    j = tl.where(lone, LONE_CODE - code, tl.where(ok, code, 0))  # the column each judged chunk names
    key = column_key(map_ptr, j, ok, KEYED)
    lp = tl.log(tl.load(row_ptr + j, mask=lone, other=1.0))  # the float32 log the exact score reads
    score = tl.where(lone, exact_score(lp, h_row, key, CAP, RECIP), score)
    # Judged chunks score no NaN (probabilities in [0, 2**16], no Gumbel +inf): their lowest-key maximum
    # ((-inf, INT32_MAX) when every chunk is rescanned).
    best = tl.max(tl.where(ok, score, float("-inf")), 0)
    best_key = tl.min(tl.where(ok & (score == best), key, INT32_MAX), 0)
    nan_key = tl.full([], INT32_MAX, tl.int32)
    n = tl.sum(rescan.to(tl.int32), 0)
    while n > 0:  # rare: chunks the screen could not judge, exactly, in chunk order
        c = tl.min(tl.where(rescan, cidx, INT32_MAX), 0)
        rescan = rescan & (cidx != c)
        n -= 1
        offs = c * BLOCK + tl.arange(0, BLOCK)
        s, k = exact_chunk_argmax(row_ptr, h_row, offs, offs < V, CAP, RECIP, True, map_ptr, KEYED)
        if s != s:
            if KEYED:
                nan_key = tl.minimum(nan_key, k)  # the lowest NaN key may sit in any rescanned chunk
            else:
                nan_key = k
                n = 0  # each column is its own key: the first NaN chunk holds the lowest NaN key
        elif (s > best) | ((s == best) & (k < best_key)):
            best = s
            best_key = k
    tl.store(out_ptr + row, tl.where(nan_key < INT32_MAX, nan_key, best_key).to(tl.int64))


def launch_probs_race(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                      hot_to_target: Optional[torch.Tensor], *, cap_unit_uniform: bool, uniform: Optional[str],
                      block_size: Optional[int], num_warps: Optional[int], fast: bool) -> torch.Tensor:
    """The two stages on validated inputs: the winning keys, int64 ``[R]`` -- columns, or (``hot_to_target``
    given) the target ids of :func:`~.coupled_hot_race_probs.coupled_hot_race_probs`.  The public functions
    validate first; this allocates the output and the ``[R, cdiv(V, BLOCK)]`` partials and launches."""
    R, V = probs.shape
    out = torch.empty(R, dtype=torch.int64, device=probs.device)
    if R == 0:
        return out
    block, warps = race_launch(R, V, block_size, num_warps)
    nc = triton.cdiv(V, block)
    part_score = torch.empty((R, nc), dtype=torch.float64, device=probs.device)
    part_idx = torch.empty((R, nc), dtype=torch.int32, device=probs.device)
    cap = bool(cap_unit_uniform)
    recip = resolve_uniform(uniform, probs.device) == "reciprocal"
    keyed = hot_to_target is not None
    seeds, positions = seeds.contiguous(), positions.contiguous()  # views only for 1-D contiguous inputs
    _probs_stage1[(R, nc)](
        probs, probs.stride(0), hot_to_target, seeds, positions, part_score, part_idx, V, nc,
        CAP=cap, RECIP=recip, BLOCK=block, FAST=fast, KEYED=keyed, num_warps=warps,
    )
    _probs_stage2[(R,)](
        probs, probs.stride(0), hot_to_target, seeds, positions, part_score, part_idx, out, V, nc,
        CAP=cap, RECIP=recip, NC_POW2=max(16, triton.next_power_of_2(nc)), BLOCK=block, KEYED=keyed, num_warps=4,
    )
    return out


def coupled_race_probs(
    probs: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    cap_unit_uniform: bool = True,
    uniform: Optional[str] = None,
    block_size: Optional[int] = None,
    num_warps: Optional[int] = None,
    fast_screen: Optional[bool] = None,
) -> torch.Tensor:
    """:func:`~sglang_detspec.kernels.coupled_race.coupled_race` of ``torch.log(probs)``, the log taken in the
    kernel: int64 tokens ``[R]``.  What the invariant verify and proposal run.

    Args:
        probs: ``[R, V]`` float32, contiguous in the vocab dimension (a strided row view is read in place).
        seeds, positions, cap_unit_uniform, uniform: as :func:`~sglang_detspec.kernels.coupled_race.coupled_race`.
        block_size, num_warps: columns and warps per stage-1 program (default :func:`race_launch`'s).
        fast_screen: the screen's ``log u`` by ``lg2.approx`` (:func:`~.coupled_scoring.exponential_f32`) and its
            division by ``rcp.approx`` (:func:`ratio_f32`); the same tokens either way, since the screen's bound
            allows both.  Default: on CUDA, off under the
            interpreter, which cannot run PTX (``True`` there raises ``ValueError``).

    Exact where the kernel's float32 ``log`` is CUDA torch's (module docstring).  Under the Triton interpreter (CPU
    tests) the kernel's ``log`` is numpy's, which differs from CPU torch's in the last bit for a few percent of
    inputs: the CPU twin is then :func:`~sglang_detspec.stream.coupled_reference.coupled_race_reference` of
    ``numpy.log(probs)``.  Degenerate rows as there: all zero gives token 0, a NaN or negative probability the first
    such index, ``+inf`` the first ``+inf``.  CUDA-graph caveats: module docstring.
    """
    check_coupled_race_inputs(probs, seeds, positions, uniform, float32_only=True)
    require_vocab_contiguous("probs", probs)
    require_cuda_or_interpreter(probs, "sglang_detspec.stream.coupled_reference.coupled_race_reference")
    return launch_probs_race(probs, seeds, positions, None, cap_unit_uniform=cap_unit_uniform, uniform=uniform,
                             block_size=block_size, num_warps=num_warps, fast=resolve_fast_screen(fast_screen))


def coupled_verify(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    **race_options,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The coupled verify on the kernel: ``(accepted_len int64 [B], emitted int64 [B, S+1])``.

    Same contract as :func:`sglang_detspec.stream.coupled_reference.coupled_verify_reference` (``target_probs``
    ``[B, S+1, V]`` float32, ``draft_tokens`` ``[B, S]``, ``seeds`` ``[B]``, ``positions`` ``[B, S+1]``);
    ``race_options`` go to :func:`coupled_race_probs`.  Emitted entries past ``accepted_len + 1`` are -1.
    """
    check_verify_inputs(target_probs, draft_tokens, seeds, positions)
    B, S1, V = target_probs.shape
    # log(target_probs), the torch op SGLang's sampling_from_probs_torch runs, is taken inside the kernel
    target = coupled_race_probs(
        target_probs.reshape(B * S1, V), seeds.repeat_interleave(S1), positions.reshape(-1), **race_options
    )
    return accept_and_emit(target.view(B, S1), draft_tokens)
