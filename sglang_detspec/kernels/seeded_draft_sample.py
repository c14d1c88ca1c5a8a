"""Fused seeded draft sampler: SGLang 0.5.23's seeded ``fast_sample`` stream in one Triton pass.

What it computes (bit-for-bit): for every row the FIRST index of the maximum of the float64 scores
``p_t / -log((h_t + 0.5) / 2**32)``, ``h_t`` the MurmurHash3 of the salted draft key (layout and
reasons in :mod:`sglang_detspec.keys`), then ``(probs.gather(1, idx), idx)``.  Upstream materialises
``[B, V]`` uint32 hashes and ``[B, V]`` float64 scores (12 bytes per element, 241 MiB at B=128,
V=163840); this kernel reads ``probs`` once and allocates ``O(B * V / CHUNK)`` bytes.

Design
------
Stage 1, grid ``(B, cdiv(V, CHUNK))``: each program owns one chunk of one row.
  * The first three Murmur words (salted seed low/high, position) are row constants: their partial
    hash is computed once per program; per element only the column word and the finalizer are mixed.
  * A float32 race finds candidates: ``s32 = p / E2`` with ``E2 ~ -log2(u)`` (any positive scale of the
    score gives the same argmax).  Each lane keeps its best score, its index and its second-best score;
    the chunk also keeps the max of the raw float32 bit patterns of ``p`` (classifies the chunk below).
  * Every candidate the float32 error bound cannot exclude (lane best ``>= m32 * (1 - 2**-12)``) is
    re-scored exactly in float64 with upstream's operation order, one scalar at a time in increasing
    index order (strict ``>`` keeps the first index of an exact tie).  Typically one candidate.
  * Rare chunk kinds, each handled exactly:
      - any ``p`` that is NaN, +-inf, negative, -0.0 or >= 2**90 ("bad"): the chunk is rescanned
        element-wise in float64 with ``torch.argmax`` semantics (NaN is the maximum, first index wins);
      - a lane whose SECOND-best score reaches the threshold (two near-tied candidates in one lane):
        float64 rescan of the chunk;
      - all ``p == +0.0`` (padded rows in CUDA graphs, truncated tails): score 0 at the chunk's first
        index, without any float64 work;
      - ``m32 < 2**-80`` ("low": every p below about 2**-77, where float32 underflow/FTZ could hide a
        subnormal winner): not resolved here; the chunk reports an exact upper bound of its scores.
Stage 2, grid ``(B,)``: reduces the per-chunk ``(float64 score, index)`` pairs to the row's first-index
maximum (a NaN chunk wins), rescans in float64 only those "low" chunks whose upper bound reaches the
best resolved score (never, unless the entire row is below ~2**-77), and writes ``idx`` and
``probs[row, idx]``.

Why the float32 filter is exact (the bound)
-------------------------------------------
Write ``s`` for the true real-number score ``p / E`` (``E = -ln u``), ``s64`` for upstream's float64 value
and ``s32`` for the kernel's float32 value, both rescaled by the same constant ``1/ln 2``.  Claim: for
every element with ``p >= 2**-120`` (and not "bad"), ``|s32 - s| <= d*s`` with ``d = 2**-16``, and
``|s64 - s| <= e*s`` with ``e = 2**-50``.
  * ``x = h`` if ``h < 2**31`` else ``~h = 2**32 - 1 - h``; ``v = (x + 0.5) * 2**-32`` in float32 (two
    roundings: relative error <= 2**-23), so ``v`` is ``u`` (lower half) or ``w = 1 - u`` (upper half),
    both in (0, 0.5] -- the upper half is never formed as ``1 - u``, which is where float32 would lose
    all of ``u``'s information (``u`` rounds to 1.0 for the last 2**8 hash values).
  * Lower half: ``E2 = -log2(v)``; ``|log2 v| >= 1``, so the argument error contributes <= 2**-23/ln2 and
    ``lg2.approx.f32`` (absolute error ~2**-22) at most 2**-22 relative.
  * Upper half, ``w < 1/16``: ``E2 = (w + w^2/2 + ... + w^6/6)/ln 2``; the truncated tail is
    ``<= w^6/7/(1-w) < 2**-26.7`` relative, Horner's rounding a few ulp, the argument error
    ``<= 2**-23 * w/((1-w)(-ln(1-w))) <= 1.04 * 2**-23``.
  * Upper half, ``1/16 <= w <= 1/2``: ``E2 = -log2(1 - w)``; ``1 - w`` in [0.5, 0.9375] carries an
    absolute error <= 1.5 * 2**-24, amplified by ``1/(u * |ln u|) <= 1/(0.5 * 0.0645)``: <= 2**-18.5;
    ``lg2.approx``'s absolute error over ``|log2 u| >= 0.093``: <= 2**-18.6.
  * ``s32 = p / E2`` (``div.full.f32``, <= 2 ulp = 2**-22; ``p >= 2**-120`` keeps every quotient normal).
  Sum: well under 2**-17; ``d = 2**-16`` leaves a margin.  ``scripts/gpu_kernel_checks.py`` evaluates
  the compiled ``E2`` for ALL 2**32 hash values against float64 and reports the measured maximum.
  Float64 side: the uniform is exact, ``log`` (libdevice) <= 1 ulp, reciprocal and product rounded:
  ``e = 2**-50`` is generous.
Let ``j*`` be the chunk's float32 maximum (``m32``) and ``i*`` the true first-index float64 maximum.
``j*`` is a candidate and is re-scored, so the result's float64 score is ``>= s64(j*)``, and
``s64(i*) >= s64(j*)``.  Then ``s32(i*) >= s(i*)(1-d) >= s64(i*)(1-d)/(1+e) >= s64(j*)(1-d)/(1+e)
>= s32(j*)(1-d)(1-e)/((1+e)(1+d)) > m32 * (1 - 2**-12)`` (the threshold; float32 rounding of the
threshold product is ~2**-24, inside the margin).  So ``i*``'s score reaches the threshold: either
it is its lane's best (a candidate) or its lane's second-best reaches the threshold (rescan).
Elements with ``p < 2**-120`` have ``s <= 2**-120 * 2**33.6 < 2**-86`` and cannot beat ``s(j*)`` when
``m32 >= 2**-80``; chunks below that are "low" (above).  ``scripts/gpu_kernel_checks.py`` also
verifies 10**6+ rows and constructed near-ties against upstream's float64 torch code.

CUDA graphs: capturable.  All inputs are read from device memory at replay time (update seeds,
positions and ``greedy`` in place between replays); ``draft_step`` and the shapes are baked into
the capture.  No host synchronisation; the only allocations are the two outputs and the
``[B, cdiv(V, CHUNK)]`` float64 + int32 partials (about 50 KiB at B=128, V=163840).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .. import keys

__all__ = ["seeded_draft_sample", "launch_config", "INTERPRETED"]

#: True when Triton runs kernels in its NumPy interpreter (``TRITON_INTERPRET=1`` set before import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

_INT_MAX = tl.constexpr(2147483647)
# float32 bit patterns: p >= 2**90, +-inf, NaN, anything negative (sign bit) and -0.0 compare >= this
# as uint32.  Such chunks are rescanned exactly (rare; never produced by a softmax).
_BAD_BITS = tl.constexpr(0x6C800000)
# Below this chunk maximum (in the rescaled float32 score), float32 underflow / flush-to-zero could hide
# a subnormal-probability winner; such chunks are resolved lazily in stage 2.
_LOW_SCORE = tl.constexpr(2.0**-80)
# Relative candidate margin: the float32 error bound is d = 2**-16, so 2**-12 leaves a 16x margin.
_CAND_REL = tl.constexpr(1.0 - 2.0**-12)


@triton.jit
def _mix32(h, k):
    # MurmurHash3 x86_32 block mix on uint32 tensors (wrapping multiplies, logical shifts).
    k = k * 0xCC9E2D51
    k = (k << 15) | (k >> 17)
    k = k * 0x1B873593
    h = h ^ k
    h = (h << 13) | (h >> 19)
    return h * 5 + 0xE6546B64


@triton.jit
def _fmix32(h):
    h = h ^ 16  # key length in bytes (four words)
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _row_prefix(seed_ptr, pos_ptr, row):
    """Murmur state after the three row-constant words (salted seed lo, hi; position)."""
    seed = tl.load(seed_ptr + row).to(tl.int64)
    # seed + SALT with int64 wrap-around, done on 32-bit halves with an explicit carry so that no
    # intermediate overflows (the interpreter's NumPy scalars would warn; the arithmetic is the same).
    lo = (seed & 0xFFFFFFFF) + 0x545F0000
    hi = ((seed >> 32) & 0xFFFFFFFF) + 0x44524146 + (lo >> 32)
    pos = tl.load(pos_ptr + row).to(tl.int64) & 0xFFFFFFFF  # int32 or int64; two's complement low word
    h = tl.zeros([], dtype=tl.uint32)
    h = _mix32(h, (lo & 0xFFFFFFFF).to(tl.uint32))
    h = _mix32(h, (hi & 0xFFFFFFFF).to(tl.uint32))
    h = _mix32(h, pos.to(tl.uint32))
    return h


@triton.jit
def _neg_log2_u_f32(h, FAST_LOG: tl.constexpr):
    """float32 approximation of -log2((h + 0.5) / 2**32), relative error < 2**-17 (module docstring)."""
    upper = h >= 0x80000000
    x = tl.where(upper, h ^ 0xFFFFFFFF, h)  # < 2**31: u (lower half) or 1 - u (upper half), never rounded to 1
    v = (x.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    arg = tl.where(upper, 1.0 - v, v)
    if FAST_LOG:
        lg = tl.inline_asm_elementwise(
            "lg2.approx.f32 $0, $1;", "=r,r", [arg], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        lg = tl.log2(arg)
    # -log2(1 - w) for w < 1/16: the series up to w^6/6 (tail < 2**-26.7 relative).
    poly = v * (
        1.4426950408889634
        + v * (0.7213475204444817 + v * (0.48089834696298783 + v * (0.36067376022224085 + v * (0.2885390081777927 + v * 0.2404491734814939))))
    )
    return tl.where(upper & (v < 0.0625), poly, -lg)


@triton.jit
def _exact_score_scalar(row_ptr, j, h_row, col_base, greedy):
    """Upstream's float64 score for one token (scalar): (1 / -log((h + 0.5) / 2**32)) * p."""
    p = tl.load(row_ptr + j).to(tl.float64)
    h = _fmix32(_mix32(h_row, (col_base + j).to(tl.uint32)))
    u = (h.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # both steps exact in float64
    r = 1.0 / (-tl.log(u))
    s = r * p
    return tl.where(greedy, p, s)


@triton.jit
def _exact_chunk(row_ptr, h_row, col_base, lo, V, greedy, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Exact float64 first-index argmax over [lo, lo + CHUNK) with torch.argmax semantics (NaN wins).

    Returns (score, index); score is NaN when the chunk holds a NaN score (index = first NaN).
    Slow path: bad or near-tied chunks and lazily resolved low chunks only.
    """
    bs = tl.full([BLOCK], float("-inf"), tl.float64)
    bi = tl.full([BLOCK], _INT_MAX, tl.int32)
    ni = tl.full([BLOCK], _INT_MAX, tl.int32)
    for t in range(0, CHUNK, BLOCK):
        offs = lo + t + tl.arange(0, BLOCK)
        mask = offs < V
        p = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float64)
        h = _fmix32(_mix32(h_row, (col_base + offs).to(tl.uint32)))
        u = (h.to(tl.float64) + 0.5) * 2.3283064365386963e-10
        r = 1.0 / (-tl.log(u))
        s = tl.where(greedy, p, r * p)
        isn = mask & (s != s)
        ni = tl.minimum(ni, tl.where(isn, offs, _INT_MAX))
        # ``bi == INT_MAX`` admits the lane's first valid element even if its score is -inf.
        upd = mask & ((s > bs) | ((s == bs) & (bi == _INT_MAX)))
        bs = tl.where(upd, s, bs)
        bi = tl.where(upd, offs, bi)
    nan_i = tl.min(ni, 0)
    m = tl.max(bs, 0)
    idx = tl.min(tl.where(bs == m, bi, _INT_MAX), 0)
    has_nan = nan_i < _INT_MAX
    score = tl.where(has_nan, float("nan"), m)
    return score, tl.where(has_nan, nan_i, idx)


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
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = _row_prefix(seed_ptr, pos_ptr, row)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + row) != 0
    else:
        greedy = False
    lo = c * CHUNK
    col0 = col_base + lo

    best = tl.full([BLOCK], -1.0, tl.float32)
    second = tl.full([BLOCK], -1.0, tl.float32)
    bidx = tl.zeros([BLOCK], dtype=tl.int32)
    pbits = tl.zeros([BLOCK], dtype=tl.uint32)
    for t in range(0, CHUNK, BLOCK):
        lane = tl.arange(0, BLOCK)
        offs = lo + t + lane
        mask = offs < V
        p = tl.load(row_ptr + offs, mask=mask, other=0.0)
        pbits = tl.maximum(pbits, p.to(tl.uint32, bitcast=True))
        if greedy:
            s = p
        else:
            h = _fmix32(_mix32(h_row, (col0 + t + lane).to(tl.uint32)))
            s = p / _neg_log2_u_f32(h, FAST_LOG)
        # second-best per lane (with multiplicity): catches two near-tied candidates in one lane.
        second = tl.maximum(second, tl.minimum(s, best))
        gt = s > best  # strict: a lane keeps its first index on float32 ties
        best = tl.where(gt, s, best)
        bidx = tl.where(gt, offs, bidx)

    m = tl.max(best, 0)
    pm = tl.max(pbits, 0)
    sec = tl.max(second, 0)
    thr = m * _CAND_REL
    is_bad = pm >= _BAD_BITS
    is_zero = pm == 0
    is_low = m < _LOW_SCORE
    rescan = is_bad | ((not is_zero) and (not is_low) and (sec >= thr))

    res_score = tl.zeros([], dtype=tl.float64)
    res_idx = lo
    if rescan:
        res_score, res_idx = _exact_chunk(row_ptr, h_row, col_base, lo, V, greedy, CHUNK, BLOCK)
    elif is_zero:
        # Every p is +0.0: every score is exactly 0, the first index wins; no float64 work (padded rows).
        res_score = tl.zeros([], dtype=tl.float64)
        res_idx = lo
    elif is_low:
        # Upper bound of every float64 score in the chunk: p_max * max(1/E) < p_max * 2**34 (greedy: p_max).
        pmax = pm.to(tl.float32, bitcast=True).to(tl.float64)
        res_score = tl.where(greedy, pmax, pmax * 17179869184.0)
        res_idx = -1
    else:
        cand = best >= thr
        n = tl.sum(cand.to(tl.int32), 0)
        res_score = tl.full([], -1.0, tl.float64)
        while n > 0:
            j = tl.min(tl.where(cand, bidx, _INT_MAX), 0)
            cand = cand & (bidx != j)
            n -= 1
            s64 = _exact_score_scalar(row_ptr, j, h_row, col_base, greedy)
            # candidates come in increasing index order: strict > keeps the first index of a tie
            if s64 > res_score:
                res_score = s64
                res_idx = j
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
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    cidx = tl.arange(0, NC_POW2)
    valid = cidx < NC
    sc = tl.load(part_score_ptr + row * NC + cidx, mask=valid, other=float("-inf"))
    ix = tl.load(part_idx_ptr + row * NC + cidx, mask=valid, other=-2)
    resolved = valid & (ix >= 0)
    isn = resolved & (sc != sc)
    nan_idx = tl.min(tl.where(isn, ix, _INT_MAX), 0)
    ok = resolved & (sc == sc)
    m = tl.max(tl.where(ok, sc, float("-inf")), 0)
    best_idx = tl.min(tl.where(ok & (sc == m), ix, _INT_MAX), 0)
    # Low chunks whose exact upper bound reaches the best resolved score must be rescanned.  This only
    # happens when the whole row is below ~2**-77 (garbage or underflowed input), never for a softmax.
    pend = valid & (ix < 0) & (sc >= m)
    n = tl.sum(pend.to(tl.int32), 0)
    if n > 0:
        h_row = _row_prefix(seed_ptr, pos_ptr, row)
        if HAS_GREEDY:
            greedy = tl.load(greedy_ptr + row) != 0
        else:
            greedy = False
        while n > 0:
            c = tl.min(tl.where(pend, cidx, _INT_MAX), 0)
            pend = pend & (cidx != c)
            n -= 1
            s, i = _exact_chunk(row_ptr, h_row, col_base, c * CHUNK, V, greedy, CHUNK, BLOCK)
            if (s > m) | ((s == m) & (i < best_idx)):
                m = s
                best_idx = i
    idx = tl.where(nan_idx < _INT_MAX, nan_idx, best_idx)
    tl.store(out_idx_ptr + row, idx.to(tl.int64))
    tl.store(out_p_ptr + row, tl.load(row_ptr + idx))


def launch_config(batch: int, vocab: int) -> Tuple[int, int, int]:
    """(CHUNK, BLOCK, num_warps) for a compiled launch: enough programs to fill the GPU at small batch,
    long chunks (fewer partials, amortised chunk epilogues) at large batch."""
    if batch * vocab <= 4 * 163840:
        return 2048, 1024, 4
    if batch * vocab <= 32 * 163840:
        return 4096, 1024, 4
    return 8192, 1024, 4


def _validate(probs, sampling_seed, positions, draft_step, greedy) -> None:
    if not isinstance(probs, torch.Tensor) or probs.dim() != 2:
        raise ValueError(f"probs must be a 2-D [batch, vocab] tensor, got {getattr(probs, 'shape', type(probs))}")
    if probs.dtype != torch.float32:
        raise ValueError(
            f"probs must be float32 (what upstream's sampling softmax produces), got {probs.dtype}; "
            "cast with probs.float() before sampling"
        )
    if probs.shape[1] > 1 and probs.stride(1) != 1:
        raise ValueError(
            f"probs must be contiguous in its last (vocab) dimension, got strides {tuple(probs.stride())}; "
            "row views such as draft_probs[:bs, step] are fine, a transposed tensor is not (use .contiguous())"
        )
    if not isinstance(sampling_seed, torch.Tensor) or sampling_seed.dtype != torch.int64:
        raise ValueError(
            f"sampling_seed must be an int64 tensor (SamplingBatchInfo.sampling_seed), got "
            f"{getattr(sampling_seed, 'dtype', type(sampling_seed))}"
        )
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"positions must be an int32 or int64 tensor, got {getattr(positions, 'dtype', type(positions))}"
        )
    if sampling_seed.shape != positions.shape:
        raise ValueError(
            f"sampling_seed and positions must have matching shapes, got {tuple(sampling_seed.shape)} and "
            f"{tuple(positions.shape)}"
        )
    if sampling_seed.numel() != probs.shape[0]:
        raise ValueError(
            f"sampling_seed must have one value per probability row, got {sampling_seed.numel()} seeds for "
            f"{probs.shape[0]} rows (slice graph buffers to the live batch: seeds[:bs])"
        )
    if greedy is not None:
        if not isinstance(greedy, torch.Tensor) or greedy.dtype != torch.bool or greedy.numel() != probs.shape[0]:
            raise ValueError(
                f"greedy must be a bool tensor with one entry per row (e.g. top_ks[:bs] <= 1), got "
                f"{getattr(greedy, 'dtype', type(greedy))} with {getattr(greedy, 'numel', lambda: '?')()} "
                f"entries for {probs.shape[0]} rows"
            )
    if isinstance(draft_step, torch.Tensor) or int(draft_step) != draft_step:
        raise ValueError(f"draft_step must be a Python int (it is baked into CUDA graphs), got {draft_step!r}")
    keys.check_draft_step(int(draft_step), probs.shape[1])
    dev = probs.device
    for name, t in (("sampling_seed", sampling_seed), ("positions", positions), ("greedy", greedy)):
        if t is not None and t.device != dev:
            raise ValueError(f"{name} is on {t.device} but probs is on {dev}; all inputs must share a device")
    if dev.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the Triton kernel needs CUDA tensors (got {dev}); on CPU use "
            "sglang_detspec.reference.seeded_draft_sample, or set TRITON_INTERPRET=1 before importing "
            "sglang_detspec.kernels"
        )


def seeded_draft_sample(
    probs: torch.Tensor,
    sampling_seed: torch.Tensor,
    positions: torch.Tensor,
    draft_step: int = 0,
    *,
    greedy: Optional[torch.Tensor] = None,
    block_size: Optional[int] = None,
    chunk_size: Optional[int] = None,
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
        block_size / chunk_size: launch overrides (powers of two, ``chunk_size`` a multiple of
            ``block_size``); the interpreter runs much faster with large blocks.

    Degenerate rows (same answer as upstream's ``torch.argmax``, so toggling the plugin never changes a
    token): an all-zero row returns token 0; a row containing NaN returns its first NaN index; +inf
    probabilities win (first +inf); negative entries are compared as their (negative) scores.

    CUDA graphs: capturable; update ``sampling_seed``, ``positions`` and ``greedy`` in place between
    replays.  ``draft_step`` and the shapes are fixed at capture.  Never synchronises with the host.
    """
    _validate(probs, sampling_seed, positions, draft_step, greedy)
    B, V = probs.shape
    out_p = torch.empty((B, 1), dtype=torch.float32, device=probs.device)
    out_idx = torch.empty((B, 1), dtype=torch.int64, device=probs.device)
    if B == 0:
        return out_p, out_idx
    chunk, block, num_warps = launch_config(B, V)
    if INTERPRETED:
        # the interpreter executes each program in NumPy: fewer, wider programs are much faster
        block = max(1024, min(8192, triton.next_power_of_2(V)))
        chunk = block
    if block_size is not None:
        block = int(block_size)
        chunk = max(chunk, block) if chunk_size is None else chunk
    if chunk_size is not None:
        chunk = int(chunk_size)
    if block & (block - 1) or chunk & (chunk - 1) or chunk % block or block < 16:
        raise ValueError(f"block_size ({block}) and chunk_size ({chunk}) must be powers of two >= 16, chunk >= block")
    nc = triton.cdiv(V, chunk)
    part_score = torch.empty((B, nc), dtype=torch.float64, device=probs.device)
    part_idx = torch.empty((B, nc), dtype=torch.int32, device=probs.device)
    seeds = sampling_seed.reshape(-1)
    pos = positions.reshape(-1)
    if seeds.stride(0) != 1 or pos.stride(0) != 1:
        seeds, pos = seeds.contiguous(), pos.contiguous()
    g = greedy.reshape(-1).contiguous() if greedy is not None else seeds  # dummy pointer when absent
    col_base = int(draft_step) * V
    fast_log = probs.device.type == "cuda" and not INTERPRETED
    _stage1_kernel[(B, nc)](
        probs, probs.stride(0), seeds, pos, g, part_score, part_idx, V, col_base, nc,
        HAS_GREEDY=greedy is not None, CHUNK=chunk, BLOCK=block, FAST_LOG=fast_log, num_warps=num_warps,
    )
    _stage2_kernel[(B,)](
        probs, probs.stride(0), seeds, pos, g, part_score, part_idx, out_p, out_idx, V, col_base, nc,
        HAS_GREEDY=greedy is not None, NC_POW2=max(16, triton.next_power_of_2(nc)), CHUNK=chunk,
        BLOCK=block, num_warps=4,
    )
    return out_p, out_idx
