"""Fused seeded draft sampler: SGLang 0.5.23's seeded ``fast_sample`` stream in one Triton pass.

What it computes (bit-for-bit): for every row the FIRST index of the maximum of the float64 scores
``p_t / -log((h_t + 0.5) / 2**32)``, ``h_t`` the MurmurHash3 of the salted draft key (layout and
reasons in :mod:`sglang_detspec.stream.keys`), then ``(probs.gather(1, idx), idx)``.  Upstream materialises
``[B, V]`` uint32 hashes and ``[B, V]`` float64 scores (12 bytes per element, 241 MiB at B=128,
V=163840); this kernel reads ``probs`` once and allocates ``O(B * V / BLOCK)`` bytes.

Design
------
Stage 1, grid ``(B, cdiv(V, BLOCK))``: each program owns one BLOCK-column chunk of one row (one tile,
no loop: every element stays in registers for the epilogue).
  * The first three Murmur words (salted seed low/high, position) are row constants: their partial
    hash is computed once per program; per element only the column word and the finalizer are mixed.
  * A float32 race finds candidates: ``s32 = p * (1 / E2)`` with ``E2 ~ -log2(u)`` (a positive rescaling
    of every score leaves the argmax unchanged), then the chunk maximum ``m32`` (NaN-propagating).
  * Candidates are the elements the float32 error bound cannot exclude (``s32 >= m32 * (1 - 2**-10)``;
    the scores and the bound are :mod:`.draft_scoring`'s).
    A lone candidate (nearly every chunk) is the chunk's exact maximum: its index goes to stage 2
    unscored.  Two or more (near ties) are re-scored exactly in float64 with upstream's operation
    order, one scalar at a time in increasing index order (strict ``>`` keeps the first index of an
    exact tie).
  * Rare chunk kinds, each handled exactly:
      - all ``p`` equal to +-0.0 (or negative): score 0 at the first ``p == 0``, no float64 work --
        padded rows in CUDA graphs and top-k-truncated tails cost the same as ordinary chunks;
      - ``0 < m32 < 2**-80`` (every p below ~2**-77, where float32 underflow / flush-to-zero could hide
        a subnormal winner), or ``m32 == 0`` with a positive ``p``: not resolved here; the chunk
        reports an exact upper bound of its float64 scores (``p_max * 2**34``);
      - ``m32`` NaN, +inf or negative (a NaN, an infinite or overflowing ``p``, only negative ``p``):
        flagged for an exact float64 rescan with ``torch.argmax`` semantics (NaN is the maximum).
  * Greedy rows (``greedy[r]``): the score is ``p`` itself, compared exactly in float32 (first index of
    the maximum, or of the first NaN); never rescanned.
Stage 2, grid ``(B,)``: scores the row's unscored lone candidates in float64 (one lane per chunk, the
same operations as stage 1's scalar path), reduces the per-chunk ``(float64 score, index)`` pairs to the
row's first-index maximum, rescans in float64 the flagged chunks and those low chunks whose upper bound
reaches the best resolved score (never, unless the whole row is below ~2**-77 or holds NaN/inf/negative
entries), and writes ``idx`` and ``probs[row, idx]``.

Performance: where the time goes (a profile of stage 1), and the variants that were measured and lost, are in
``docs/kernels.md``.

CUDA graphs: capturable.  All inputs are read from device memory at replay time (update seeds,
positions and ``greedy`` in place between replays); ``draft_step`` and the shapes are baked into
the capture.  No host synchronisation; the only allocations are the two outputs and the
``[B, cdiv(V, BLOCK)]`` float64 + int32 partials (60 KiB at B=128, V=163840, BLOCK=4096).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..stream.draft_contract import check_kernel_inputs
from .draft_scoring import CAND_REL, LOW_SCORE, exact_score_of, race_score_f32
from .hashing import draft_row_prefix, fmix32, mix32
from .launch_checks import (
    INTERPRETED,
    interpreter_block,
    overridden_launch,
    require_cuda_or_interpreter,
    require_vocab_contiguous,
)

__all__ = ["seeded_draft_sample", "LaunchConfig", "LAUNCH_TABLE", "launch_options", "launch_plan", "INTERPRETED"]

_INT_MAX = tl.constexpr(2147483647)
# Chunk partial index codes (stage 1 -> stage 2): >= 0 resolved (index, exact score); -1 low chunk (score = an
# exact upper bound, rescanned only if it can win); -2 rescan exactly; <= _UNSCORED: the lone candidate
# _UNSCORED - idx, whose exact score stage 2 computes; _NO_CHUNK pads the stage-2 vector past NC.
_UNSCORED = tl.constexpr(-3)
_NO_CHUNK = tl.constexpr(-2147483647)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _exact_score(row_ptr, j, h_row, col_base):
    """The exact score of one token (scalar ``j``)."""
    return exact_score_of(tl.load(row_ptr + j), h_row, col_base + j)


@triton.jit
def _exact_chunk(row_ptr, h_row, col_base, lo, V, greedy, BLOCK: tl.constexpr):
    """Exact float64 first-index argmax over [lo, lo + BLOCK) with torch.argmax semantics (NaN wins).

    Returns (score, index); score is NaN when the chunk holds a NaN score (index = first NaN).
    Slow path (stage 2 only): chunks with NaN/inf/negative maxima and lazily resolved low chunks.
    """
    offs = lo + tl.arange(0, BLOCK)
    mask = offs < V
    p = tl.load(row_ptr + offs, mask=mask, other=0.0)
    s = tl.where(greedy, p.to(tl.float64), exact_score_of(p, h_row, col_base + offs))
    isn = mask & (s != s)
    nan_i = tl.min(tl.where(isn, offs, _INT_MAX), 0)
    sm = tl.where(mask & (s == s), s, float("-inf"))
    m = tl.max(sm, 0)
    idx = tl.min(tl.where(mask & (sm == m), offs, _INT_MAX), 0)
    has_nan = nan_i < _INT_MAX
    score = tl.where(has_nan, float("nan"), m)
    return score, tl.where(has_nan, nan_i, idx)


@triton.jit
def _tile_scores(row_ptr, lo, V, h_row, col_base, greedy, MASKED: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = lo + tl.arange(0, BLOCK)
    if MASKED:
        mask = offs < V
        p = tl.load(row_ptr + offs, mask=mask, other=0.0)
    else:
        p = tl.load(row_ptr + offs)
    if greedy:
        s = p
    else:
        h = fmix32(mix32(h_row, (col_base + offs).to(tl.uint32)))
        s = race_score_f32(p, h, FAST)
    if MASKED:
        s = tl.where(mask, s, float("-inf"))
    return p, s


@triton.jit
def _resolve_candidates(row_ptr, cand, n, j, offs, h_row, col_base):
    """Exact float64 first-index maximum over the ``n >= 1`` candidate elements (``j`` the first), in index order."""
    res_score = _exact_score(row_ptr, j, h_row, col_base)
    res_idx = j
    if n > 1:
        rest = cand & (offs != j)
        k = n - 1
        while k > 0:
            j2 = tl.min(tl.where(rest, offs, _INT_MAX), 0)
            rest = rest & (offs != j2)
            k -= 1
            s64 = _exact_score(row_ptr, j2, h_row, col_base)
            # candidates come in increasing index order: strict > keeps the first index of a tie
            if s64 > res_score:
                res_score = s64
                res_idx = j2
    return res_score, res_idx


@triton.jit
def _chunk_partial(row_ptr, h_row, col_base, greedy, lo, V, p, s, BLOCK: tl.constexpr, FAST: tl.constexpr):
    """Classify one chunk from its probabilities ``p`` and float32 scores ``s`` (``-inf`` past V) and return
    its stage-2 partial ``(float64 score, index code)`` (the codes are listed where ``_UNSCORED`` is defined)."""
    offs = lo + tl.arange(0, BLOCK)
    valid = offs < V
    # NaN-propagating maximum (a NaN probability makes m NaN)
    if FAST:
        m = tl.reduce(s, 0, _max_nan)  # one max.NaN per element
    else:
        # the interpreter runs custom combine functions element by element in Python: vectorise instead
        m = tl.where(tl.max((s != s).to(tl.int32), 0) > 0, float("nan"), tl.max(s, 0))

    res_score = tl.zeros([], dtype=tl.float64)
    res_idx = lo
    if greedy:
        # The score IS p (float32, exact comparisons): first index of the max, or of the first NaN.
        first_nan = tl.min(tl.where(s != s, offs, _INT_MAX), 0)
        first_max = tl.min(tl.where(s == m, offs, _INT_MAX), 0)
        res_score = m.to(tl.float64)
        res_idx = tl.where(m != m, first_nan, first_max)
    elif (m >= LOW_SCORE) & (m < float("inf")):
        # Fast path.  Every element whose float64 score can reach the chunk's float64 maximum has
        # s >= thr (the bound in draft_scoring's docstring).
        thr = m * CAND_REL
        cand = s >= thr
        n = tl.sum(cand.to(tl.int32), 0)
        j = tl.min(tl.where(cand, offs, _INT_MAX), 0)
        if n == 1:
            # The lone candidate is the chunk's exact maximum: stage 2 scores it (vectorised over the row's
            # chunks) instead of every program paying a serial float64 log at its tail.
            res_idx = _UNSCORED - j
        else:
            # Near ties (about 2**-10 of the chunks): re-score every candidate exactly, lowest index first.
            res_score, res_idx = _resolve_candidates(row_ptr, cand, n, j, offs, h_row, col_base)
    elif m == 0:
        pmax = tl.max(tl.where(valid, p, float("-inf")), 0)
        if pmax == 0:
            # Every p is +-0.0 or negative (padded rows, truncated tails): every best score is exactly
            # (+-)0 and the first p == 0 wins; no float64 work.
            res_score = tl.zeros([], dtype=tl.float64)
            res_idx = tl.min(tl.where(valid & (p == 0.0), offs, _INT_MAX), 0)
        elif pmax > 0:
            # positive probabilities whose float32 scores underflowed: exact upper bound, resolve lazily
            res_score = pmax.to(tl.float64) * 17179869184.0
            res_idx = -1
        else:
            res_idx = -2  # only negative probabilities (one underflowed to -0.0): exact rescan
    elif (m > 0) & (m < LOW_SCORE):
        # Every p below ~2**-77: float32 underflow / flush-to-zero could hide a subnormal winner.
        # Exact upper bound of the chunk's float64 scores: p_max * max(1/E) < p_max * 2**34.
        pmax = tl.max(tl.where(valid, p, float("-inf")), 0)
        res_score = pmax.to(tl.float64) * 17179869184.0
        res_idx = -1
    else:
        # NaN, +inf (or an overflowing p) or only negative probabilities: exact rescan in stage 2.
        res_idx = -2
    return res_score, res_idx


@triton.jit
def _stage1_kernel(
    probs_ptr,
    row_stride,
    seed_ptr,
    pos_ptr,
    greedy_ptr,
    part_score_ptr,
    part_idx_ptr,
    V,
    col_base,
    NC,
    HAS_GREEDY: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = draft_row_prefix(seed_ptr, pos_ptr, row)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + row) != 0
    else:
        greedy = False
    lo = c * BLOCK
    # Only the last chunk of a row is partial: the others skip the masks.
    if lo + BLOCK <= V:
        p, s = _tile_scores(row_ptr, lo, V, h_row, col_base, greedy, False, BLOCK, FAST)
    else:
        p, s = _tile_scores(row_ptr, lo, V, h_row, col_base, greedy, True, BLOCK, FAST)
    res_score, res_idx = _chunk_partial(row_ptr, h_row, col_base, greedy, lo, V, p, s, BLOCK, FAST)
    out = row * NC + c
    tl.store(part_score_ptr + out, res_score)
    tl.store(part_idx_ptr + out, res_idx)


@triton.jit
def _stage2_kernel(
    probs_ptr,
    row_stride,
    seed_ptr,
    pos_ptr,
    greedy_ptr,
    part_score_ptr,
    part_idx_ptr,
    out_p_ptr,
    out_idx_ptr,
    V,
    col_base,
    NC,
    HAS_GREEDY: tl.constexpr,
    NC_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row: score deferred candidates, reduce the chunk partials, rescan pending chunks,
    write idx and p."""
    row = tl.program_id(0)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = draft_row_prefix(seed_ptr, pos_ptr, row)
    cidx = tl.arange(0, NC_POW2)
    valid = cidx < NC
    sc = tl.load(part_score_ptr + row * NC + cidx, mask=valid, other=float("-inf"))
    ix = tl.load(part_idx_ptr + row * NC + cidx, mask=valid, other=_NO_CHUNK)
    # Deferred lone candidates: the same float64 operations as stage 1's scalar path, one lane per chunk.
    unscored = valid & (ix <= _UNSCORED)
    j = tl.where(unscored, _UNSCORED - ix, 0)
    p_j = tl.load(row_ptr + j, mask=unscored, other=0.0)
    sc = tl.where(unscored, exact_score_of(p_j, h_row, col_base + j), sc)
    ix = tl.where(unscored, j, ix)
    resolved = valid & (ix >= 0)
    nan_idx = tl.min(tl.where(resolved & (sc != sc), ix, _INT_MAX), 0)  # greedy rows report NaN chunks
    ok = resolved & (sc == sc)
    m = tl.max(tl.where(ok, sc, float("-inf")), 0)
    best_idx = tl.min(tl.where(ok & (sc == m), ix, _INT_MAX), 0)
    # Pending chunks, exact float64 rescan in chunk order: NaN/inf/negative maxima (-2), and low chunks
    # (-1) whose exact upper bound reaches the best resolved score -- the latter only happens when the
    # whole row is below ~2**-77 (garbage or underflowed input), never for a softmax output.
    pend = (valid & (ix == -2)) | (valid & (ix == -1) & (sc >= m))
    n = tl.sum(pend.to(tl.int32), 0)
    if n > 0:
        if HAS_GREEDY:
            greedy = tl.load(greedy_ptr + row) != 0
        else:
            greedy = False
        while n > 0:
            c = tl.min(tl.where(pend, cidx, _INT_MAX), 0)
            pend = pend & (cidx != c)
            n -= 1
            s, i = _exact_chunk(row_ptr, h_row, col_base, c * BLOCK, V, greedy, BLOCK)
            if s != s:
                nan_idx = tl.minimum(nan_idx, i)
                n = 0  # chunks come in index order: no later chunk can hold an earlier NaN
            elif (s > m) | ((s == m) & (i < best_idx)):
                m = s
                best_idx = i
    idx = tl.where(nan_idx < _INT_MAX, nan_idx, best_idx)
    tl.store(out_idx_ptr + row, idx.to(tl.int64))
    tl.store(out_p_ptr + row, tl.load(row_ptr + idx))


@dataclass(frozen=True)
class LaunchConfig:
    """One compiled launch of the sampler: ``block_size`` columns per stage-1 program (a power of two >= 16),
    ``num_warps`` per program, and a ptxas register cap ``maxnreg`` (0: none; more resident programs per SM)."""

    block_size: int
    num_warps: int
    maxnreg: int = 0


#: (max B*V/163840, LaunchConfig): the first row whose bound is >= the launch's size wins.  Tuned on an H200
#: (CUDA-graph replay, V=163840, B in 1..256): enough programs to fill the GPU at small batch, long chunks
#: (fewer per-program tails) at large batch.
LAUNCH_TABLE: Tuple[Tuple[float, LaunchConfig], ...] = (
    (2.83, LaunchConfig(1024, 4)),
    (16.0, LaunchConfig(2048, 4)),
    (float("inf"), LaunchConfig(4096, 4)),
)


def launch_options(batch: int, vocab: int) -> LaunchConfig:
    """The tuned launch for a ``[batch, vocab]`` draw (what :func:`seeded_draft_sample` uses by default)."""
    size = batch * vocab / 163840
    for bound, config in LAUNCH_TABLE:
        if size <= bound:
            return config
    return LAUNCH_TABLE[-1][1]


def launch_plan(
    batch: int,
    vocab: int,
    config: Optional[LaunchConfig] = None,
    block_size: Optional[int] = None,
    num_warps: Optional[int] = None,
) -> Tuple[int, int, dict]:
    """``(block_size, num_warps, options)`` of one draft draw over ``[batch, vocab]`` (this kernel's and the
    reduced-vocabulary kernel's): ``config``, default :func:`launch_options` -- widened under the interpreter, which
    executes each program in NumPy, so fewer, wider programs are much faster -- then the ``block_size`` /
    ``num_warps`` overrides; refused where Triton cannot build it.  ``options`` holds the register cap (ptxas
    ``maxnreg``: more resident programs per SM; not an interpreter option)."""
    chosen = config if config is not None else launch_options(batch, vocab)
    block, warps = int(chosen.block_size), int(chosen.num_warps)
    options = {"maxnreg": int(chosen.maxnreg)} if chosen.maxnreg and not INTERPRETED else {}
    if INTERPRETED and config is None:
        block = interpreter_block(vocab)
    block, warps = overridden_launch(block, warps, block_size, num_warps)
    return block, warps, options


def seeded_draft_sample(
    probs: torch.Tensor,
    sampling_seed: torch.Tensor,
    positions: torch.Tensor,
    draft_step: int = 0,
    *,
    greedy: Optional[torch.Tensor] = None,
    block_size: Optional[int] = None,
    num_warps: Optional[int] = None,
    config: Optional[LaunchConfig] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Seeded draft draw, bit-identical to SGLang 0.5.23 ``fast_sample(probs, 1, sampling_seed=,
    positions=, draft_step=)``; returns ``(probs.gather(1, idx) [B, 1] float32, idx [B, 1] int64)``.

    Args:
        probs: ``[B, V]`` float32, last dimension contiguous; a strided row view (``draft_probs[:bs, step]``,
            row stride ``S * V``) is read in place.
        sampling_seed: ``[B]`` int64 request seeds.
        positions: ``[B]`` int32 or int64 key positions (truncated to their low 32 bits).
        draft_step: non-negative Python int with ``draft_step * V + V <= 2**32``.
        greedy: optional ``[B]`` bool; True rows return the first argmax of ``probs`` (upstream's
            ``top_ks <= 1`` override) instead of a random draw.
        config: the launch (benchmarks compare launches this way); default :func:`launch_options`, except
            that the interpreter, which runs much faster with large blocks, picks wider ones.
        block_size / num_warps: overrides of the chosen launch's ``block_size`` / ``num_warps``.

    Degenerate rows (same answer as upstream's ``torch.argmax``, so toggling the plugin never changes a
    token): an all-zero row returns token 0; a row containing NaN returns its first NaN index; +inf
    probabilities win (first +inf); negative entries are compared as their (negative) scores.

    CUDA graphs: capturable; update ``sampling_seed``, ``positions`` and ``greedy`` in place between
    replays.  ``draft_step`` and the shapes are fixed at capture.  Never synchronises with the host.
    """
    check_kernel_inputs(probs, sampling_seed, positions, draft_step, greedy)
    require_vocab_contiguous("probs", probs, row_view="draft_probs[:bs, step]")
    require_cuda_or_interpreter(probs, "sglang_detspec.stream.reference.seeded_draft_sample")
    B, V = probs.shape
    out_p = torch.empty((B, 1), dtype=torch.float32, device=probs.device)
    out_idx = torch.empty((B, 1), dtype=torch.int64, device=probs.device)
    if B == 0:
        return out_p, out_idx
    block, warps, opts = launch_plan(B, V, config, block_size, num_warps)
    nc = triton.cdiv(V, block)
    part_score = torch.empty((B, nc), dtype=torch.float64, device=probs.device)
    part_idx = torch.empty((B, nc), dtype=torch.int32, device=probs.device)
    seeds = sampling_seed.reshape(-1)
    pos = positions.reshape(-1)
    if seeds.stride(0) != 1 or pos.stride(0) != 1:
        seeds, pos = seeds.contiguous(), pos.contiguous()
    g = greedy.reshape(-1).contiguous() if greedy is not None else seeds  # dummy pointer when absent
    col_base = int(draft_step) * V
    fast = probs.device.type == "cuda" and not INTERPRETED
    _stage1_kernel[(B, nc)](
        probs, probs.stride(0), seeds, pos, g, part_score, part_idx, V, col_base, nc,
        HAS_GREEDY=greedy is not None, BLOCK=block, FAST=fast, num_warps=warps, **opts,
    )
    _stage2_kernel[(B,)](
        probs, probs.stride(0), seeds, pos, g, part_score, part_idx, out_p, out_idx, V, col_base, nc,
        HAS_GREEDY=greedy is not None, NC_POW2=max(16, triton.next_power_of_2(nc)), BLOCK=block, num_warps=4,
    )
    return out_p, out_idx
