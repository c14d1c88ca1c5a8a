"""Fused seeded draft sampler: SGLang 0.5.23's seeded ``fast_sample`` stream in one Triton pass.

What it computes (bit-for-bit): for every row the FIRST index of the maximum of the float64 scores
``p_t / -log((h_t + 0.5) / 2**32)``, ``h_t`` the MurmurHash3 of the salted draft key (layout and
reasons in :mod:`sglang_detspec.keys`), then ``(probs.gather(1, idx), idx)``.  Upstream materialises
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
  * Every element the float32 error bound cannot exclude (``s32 >= m32 * (1 - 2**-11)``) is re-scored
    exactly in float64 with upstream's operation order, one scalar at a time in increasing index
    order (strict ``>`` keeps the first index of an exact tie).  Typically exactly one candidate.
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
Stage 2, grid ``(B,)``: reduces the per-chunk ``(float64 score, index)`` pairs to the row's first-index
maximum, rescans in float64 the flagged chunks and those low chunks whose upper bound reaches the best
resolved score (never, unless the whole row is below ~2**-77 or holds NaN/inf/negative entries), and
writes ``idx`` and ``probs[row, idx]``.

Why the float32 filter is exact (the bound)
-------------------------------------------
Write ``s`` for the true real-number score ``p / E`` (``E = -ln u``), ``s64`` for upstream's float64 value
and ``s32`` for the kernel's float32 value, the latter two rescaled by the same constant ``ln 2``.
Claim: for every element with ``2**-120 <= p`` (and ``s32`` finite), ``|s32 - s| <= d*s`` with
``d = 2**-16``, and ``|s64 - s| <= e*s`` with ``e = 2**-50``.
  * ``x = h`` if ``h < 2**31`` else ``~h = 2**32 - 1 - h``; ``v = x * 2**-32 + 2**-33`` in float32 (two
    roundings: relative error <= 2**-23), so ``v`` is ``u`` (lower half) or ``w = 1 - u`` (upper half),
    both in (0, 0.5] -- the upper half is never formed as ``1 - u``, which is where float32 would lose
    all of ``u``'s information (``u`` rounds to 1.0 for the last 2**8 hash values).
  * Lower half: ``E2 = -log2(v)``; ``|log2 v| >= 1``, so the argument error contributes <= 2**-23/ln2
    and ``lg2.approx`` (absolute error about 2**-22) at most 2**-22 relative.
  * Upper half, ``w < 2**-6``: ``E2 = (w + w^2/2 + w^3/3 + w^4/4)/ln 2``; the truncated tail is
    ``<= w^4/5/(1-w) < 2**-26`` relative, Horner's rounding a few ulp, the argument error
    ``<= 2**-23 * w/((1-w)(-ln(1-w))) <= 1.01 * 2**-23``.
  * Upper half, ``2**-6 <= w <= 1/2``: ``E2 = -log2(1 - w)``; ``1 - w`` carries an absolute error
    <= 2**-24, amplified by ``1/(u |ln u|) <= 1/(0.5 * 0.0157)``: <= 2**-17; ``lg2.approx``'s absolute
    error over ``|log2 u| >= 0.0227``: <= 2**-16.5 in the worst case, far less in practice.
  * ``s32 = p * rcp.approx(E2)`` (<= 1 ulp each; ``E2`` in [2**-33.6, 33] and ``p >= 2**-120`` keep
    every value normal).
  Sum: about 2**-16 in the worst case of the documented instruction errors.  ``scripts/gpu_kernel_checks.py``
  evaluates the compiled ``E2`` for ALL 2**32 hash values against float64 and reports the measured
  maximum (2**-17.8 on an H200), and the full ``s32`` on 2**26 random ``(p, h)`` pairs.  The float64 side:
  the uniform is exact, ``log`` (libdevice) <= 1 ulp, reciprocal and product correctly rounded.
Let ``j*`` be the element holding ``m32`` and ``i*`` the true first-index float64 maximum of the chunk.
``j*`` is a candidate and is re-scored, and ``s64(i*) >= s64(j*)``.  Hence ``s32(i*) >= s(i*)(1-d)
>= s64(i*)(1-d)/(1+e) >= s64(j*)(1-d)/(1+e) >= m32 (1-d)(1-e)/((1+e)(1+d)) > m32 (1 - 2**-11)`` (the
threshold; its own float32 rounding, 2**-24, is inside the margin), so ``i*`` is a candidate.
Elements with ``p < 2**-120`` have ``s <= 2**-120 * 2**33 = 2**-87`` and cannot reach ``s(j*)`` when
``m32 >= 2**-80``; chunks below that are "low" (above).  ``scripts/gpu_kernel_checks.py`` also
compares 10**6+ rows and constructed near-ties with upstream's float64 torch code.

Opt-in code paths (``VARIANT``; all off by default)
---------------------------------------------------
They return the same tokens (CPU tests compare each with the reference) and exist to be timed against
the default in one GPU process: ``scripts/bench_kernel_variants.py`` (parity on ~50k rows + near-ties,
CUDA-graph timings, exhaustive E2 error).  Switch the default only on such a measurement.  H200,
CUDA-graph replay, V=163840, B=128 (2026-12-02): default 46.0 us, ``e2=1, hash=1`` 44.5 us; two earlier
paths lost and were removed (a packed candidate sum: 57.4 us; stage 2 folded into stage 1 behind an
atomic per-row arrival counter: no gain, worse with register caps).  A stripped stage 1 on the same
inputs located the time: reading ``probs`` 20.5 us (the copy-bandwidth floor), + hash 20.9, + float32
race 32.7, + candidate pass 38.6, + one serial float64 score per program 41.0.
  * ``hash=1``: the finalizer's length word folded into the first xor-shift ((h ^ 16) >> 16 == h >> 16).
  * ``e2=1``: a cheaper float32 ``E2`` with candidate margin ``2**-10`` instead of ``2**-11``:
    ``u = float(h) * 2**-32 + 2**-33`` for every hash (no half split), ``E2 = -lg2(u)``, except for the
    last 2**23 hashes (``w = 1 - u < 2**-9``), where ``E2 = (w + w^2/2)/ln 2`` and ``w`` is formed
    exactly from the float bit pattern of ``2**23 + ~h`` (one FFMA, no second conversion).  Bound:
      - ``h < 2**31`` (``u <= 1/2``): ``u`` carries two roundings (<= 2**-23 relative) and
        ``|log2 u| >= 1``: <= 2**-22.5 + lg2.approx's 2**-22;
      - ``2**31 <= h < 2**32 - 2**23``: ``float(h)`` is off by <= 2**7 and the FFMA rounds in [1/2, 1):
        ``|du| <= 2**-24``, i.e. ``|d log2 u| <= 2**-24 / (u ln 2) <= 2**-22.5``, plus lg2.approx's
        absolute 2**-22 (sum 2**-21.2), over ``E2 >= 2**-9 / ln 2 = 2**-8.47``: <= 2**-12.75 relative;
      - the series: ``w`` has one rounding (2**-24), the dropped tail is ``<= w^2/3 < 2**-19.5``.
    With ``rcp.approx`` and the product, ``d <= 2**-12.7``; ``(1-d)(1-e)/((1+e)(1+d)) > 1 - 2**-11.6``
    stays above the ``1 - 2**-10`` threshold (the argument of the section above, margin changed).
    Measured on CPU with IEEE log2 in place of lg2.approx: max 2**-16.0 (at ``h = 2**32 - 2**23``).
  * ``defer=1``: a chunk whose float32 filter leaves exactly one candidate (nearly all of them) reports
    that index unscored (``_UNSCORED - idx``); stage 2 computes the float64 scores of a row's deferred
    candidates together, one lane per chunk, with the same operations.  Stage-1 programs then end
    without the serial float64 ``log`` (about 3 us of the B=128 time in the stripped measurement above).
    Exactness is unchanged: a lone candidate is the chunk's exact maximum by the bound above.
Static SASS (sm_90, ``cuobjdump``, BLOCK=4096, 4 warps; NOT a timing): default 152 registers; e2+hash
128 registers and ~4 fewer instructions per element (the E2 sequence is 10 instead of ~15).

CUDA graphs: capturable.  All inputs are read from device memory at replay time (update seeds,
positions and ``greedy`` in place between replays); ``draft_step`` and the shapes are baked into
the capture.  No host synchronisation; the only allocations are the two outputs and the
``[B, cdiv(V, BLOCK)]`` float64 + int32 partials (60 KiB at B=128, V=163840, BLOCK=4096).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..reference import validate_draft_sample_inputs

__all__ = ["seeded_draft_sample", "launch_config", "INTERPRETED"]

#: True when Triton runs kernels in its NumPy interpreter (``TRITON_INTERPRET=1`` set before import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

_INT_MAX = tl.constexpr(2147483647)
# Chunk partial index codes (stage 1 -> stage 2): >= 0 resolved (index, exact score); -1 low chunk (score = an
# exact upper bound, rescanned only if it can win); -2 rescan exactly; <= _UNSCORED: the lone candidate
# _UNSCORED - idx, whose exact score stage 2 computes; _NO_CHUNK pads the stage-2 vector past NC.
_UNSCORED = tl.constexpr(-3)
_NO_CHUNK = tl.constexpr(-2147483647)
# Below this chunk maximum (in the rescaled float32 score), float32 underflow / flush-to-zero could hide
# a subnormal-probability winner; such chunks are resolved lazily in stage 2.
_LOW_SCORE = tl.constexpr(2.0**-80)
# Relative candidate margin: the float32 error bound is d = 2**-16 (measured 2**-17.8): 2**-11 leaves >= 16x.
_CAND_REL = tl.constexpr(1.0 - 2.0**-11)
# The same for the cheaper float32 approximation (E2V=1, bound d = 2**-12.7): 2**-10 leaves >= 3x.
_CAND_REL_V2 = tl.constexpr(1.0 - 2.0**-10)


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
def _fmix32_v2(h):
    # _fmix32 with the length word folded into the first xor-shift: (h ^ 16) >> 16 == h >> 16, so
    # h ^ 16 ^ (h >> 16) is the same value in one three-input logic op instead of two dependent ones.
    h = h ^ (h >> 16) ^ 16
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _col_hash(h_row, col, HASHV: tl.constexpr):
    """Murmur hash of one token: the row prefix mixed with the column word, finalized."""
    if HASHV:
        h = _fmix32_v2(_mix32(h_row, col))
    else:
        h = _fmix32(_mix32(h_row, col))
    return h


@triton.jit
def _row_prefix(seed_ptr, pos_ptr, row):
    """Murmur state after the three row-constant words (salted seed lo, hi; position)."""
    seed = tl.load(seed_ptr + row).to(tl.int64)
    # seed + keys.DRAFT_SEED_SALT (low half 0x545F0000, high half 0x44524146) with int64 wrap-around, done on 32-bit halves with an explicit carry so that no
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
def _neg_log2_u_f32(h, FAST: tl.constexpr):
    """float32 approximation of -log2((h + 0.5) / 2**32), relative error < 2**-16 (module docstring)."""
    upper = h >= 0x80000000
    x = tl.where(upper, h ^ 0xFFFFFFFF, h)  # < 2**31: u (lower half) or 1 - u (upper half), never rounded to 1
    v = x.to(tl.float32) * 2.3283064365386963e-10 + 1.1641532182693481e-10
    arg = tl.where(upper, 1.0 - v, v)
    if FAST:
        lg = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [arg], dtype=tl.float32, is_pure=True, pack=1)
    else:
        lg = tl.log2(arg)
    # -log2(1 - w) = (w + w^2/2 + w^3/3 + w^4/4 + ...)/ln 2 for w < 2**-6: tail < w^4/5 < 2**-26 relative.
    poly = v * (1.4426950408889634 + v * (0.7213475204444817 + v * (0.48089834696298783 + v * 0.36067376022224085)))
    return tl.where(upper & (v < 0.015625), poly, -lg)


@triton.jit
def _lg2_f32(x, FAST: tl.constexpr):
    if FAST:
        lg = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        lg = tl.log2(x)
    return lg


@triton.jit
def _neg_log2_u_f32_v2(h, FAST: tl.constexpr):
    """Cheaper float32 -log2((h + 0.5) / 2**32), relative error < 2**-12.7 (module docstring, ``e2=1``).

    No upper/lower split: u is formed directly from float(h) (its absolute error, <= 2**-24, is what
    the split avoided, and it only matters where -log u is small); only the last 2**23 hash values
    (w = 1 - u < 2**-9) take a two-term series in w, and w comes exactly from the bit pattern of the
    float 2**23 + ~h (no second int-to-float conversion).
    """
    u = h.to(tl.float32) * 2.3283064365386963e-10 + 1.1641532182693481e-10
    lg = _lg2_f32(u, FAST)
    kb = ((h ^ 0xFFFFFFFF) & 0x7FFFFF) | 0x4B000000  # float bits of 2**23 + ~h (exact when ~h < 2**23)
    # (2**23 + k) * 2**-32 + (2**-33 - 2**-9) = (k + 0.5) * 2**-32: the product is exact, one rounding
    w = kb.to(tl.float32, bitcast=True) * 2.3283064365386963e-10 + (1.1641532182693481e-10 - 0.001953125)
    poly = w * (1.4426950408889634 + w * 0.7213475204444817)
    return tl.where(h >= 0xFF800000, poly, -lg)


@triton.jit
def _recip_f32(x, FAST: tl.constexpr):
    if FAST:
        # rcp.approx: <= 1 ulp; x is a normal float in [2**-33.6, 33] here (no range fix-ups needed)
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        r = 1.0 / x
    return r


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _exact_score_of(p, h_row, col):
    """Upstream's float64 score ``(1 / -log((h + 0.5) / 2**32)) * p`` of the token(s) at key column(s)
    ``col`` (scalar or vector; every exact score in this file goes through here, so equal inputs give
    bit-equal scores whichever stage computes them)."""
    h = _fmix32(_mix32(h_row, col.to(tl.uint32)))
    u = (h.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # both steps exact in float64
    r = 1.0 / (-tl.log(u))
    return r * p.to(tl.float64)


@triton.jit
def _exact_score(row_ptr, j, h_row, col_base):
    """The exact score of one token (scalar ``j``)."""
    return _exact_score_of(tl.load(row_ptr + j), h_row, col_base + j)


@triton.jit
def _exact_chunk(row_ptr, h_row, col_base, lo, V, greedy, BLOCK: tl.constexpr):
    """Exact float64 first-index argmax over [lo, lo + BLOCK) with torch.argmax semantics (NaN wins).

    Returns (score, index); score is NaN when the chunk holds a NaN score (index = first NaN).
    Slow path (stage 2 only): chunks with NaN/inf/negative maxima and lazily resolved low chunks.
    """
    offs = lo + tl.arange(0, BLOCK)
    mask = offs < V
    p = tl.load(row_ptr + offs, mask=mask, other=0.0)
    s = tl.where(greedy, p.to(tl.float64), _exact_score_of(p, h_row, col_base + offs))
    isn = mask & (s != s)
    nan_i = tl.min(tl.where(isn, offs, _INT_MAX), 0)
    sm = tl.where(mask & (s == s), s, float("-inf"))
    m = tl.max(sm, 0)
    idx = tl.min(tl.where(mask & (sm == m), offs, _INT_MAX), 0)
    has_nan = nan_i < _INT_MAX
    score = tl.where(has_nan, float("nan"), m)
    return score, tl.where(has_nan, nan_i, idx)


@triton.jit
def _tile_scores(row_ptr, lo, V, h_row, col_base, greedy, MASKED: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
                 E2V: tl.constexpr, HASHV: tl.constexpr):
    offs = lo + tl.arange(0, BLOCK)
    if MASKED:
        mask = offs < V
        p = tl.load(row_ptr + offs, mask=mask, other=0.0)
    else:
        p = tl.load(row_ptr + offs)
    if greedy:
        s = p
    else:
        h = _col_hash(h_row, (col_base + offs).to(tl.uint32), HASHV)
        if E2V:
            s = p * _recip_f32(_neg_log2_u_f32_v2(h, FAST), FAST)
        else:
            s = p * _recip_f32(_neg_log2_u_f32(h, FAST), FAST)
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
    E2V: tl.constexpr,
    HASHV: tl.constexpr,
    DEFER: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = _row_prefix(seed_ptr, pos_ptr, row)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + row) != 0
    else:
        greedy = False
    lo = c * BLOCK
    offs = lo + tl.arange(0, BLOCK)
    valid = offs < V
    # Only the last chunk of a row is partial: the others skip the masks.
    if lo + BLOCK <= V:
        p, s = _tile_scores(row_ptr, lo, V, h_row, col_base, greedy, False, BLOCK, FAST, E2V, HASHV)
    else:
        p, s = _tile_scores(row_ptr, lo, V, h_row, col_base, greedy, True, BLOCK, FAST, E2V, HASHV)
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
    elif (m >= _LOW_SCORE) & (m < float("inf")):
        # Fast path.  Every element whose float64 score can reach the chunk's float64 maximum has
        # s >= thr (bound in the module docstring); re-score those exactly, lowest index first.
        if E2V:
            thr = m * _CAND_REL_V2
        else:
            thr = m * _CAND_REL
        cand = s >= thr
        n = tl.sum(cand.to(tl.int32), 0)
        j = tl.min(tl.where(cand, offs, _INT_MAX), 0)
        if DEFER:
            if n == 1:
                # The lone candidate is the chunk's exact maximum: stage 2 scores it (vectorised over the
                # row's chunks) instead of every program paying a serial float64 log at its tail.
                res_idx = _UNSCORED - j
            else:
                res_score, res_idx = _resolve_candidates(row_ptr, cand, n, j, offs, h_row, col_base)
        else:
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
    elif (m > 0) & (m < _LOW_SCORE):
        # Every p below ~2**-77: float32 underflow / flush-to-zero could hide a subnormal winner.
        # Exact upper bound of the chunk's float64 scores: p_max * max(1/E) < p_max * 2**34.
        pmax = tl.max(tl.where(valid, p, float("-inf")), 0)
        res_score = pmax.to(tl.float64) * 17179869184.0
        res_idx = -1
    else:
        # NaN, +inf (or an overflowing p) or only negative probabilities: exact rescan in stage 2.
        res_idx = -2
    out = row * NC + c
    tl.store(part_score_ptr + out, res_score)
    tl.store(part_idx_ptr + out, res_idx)


@triton.jit
def _tile_load(row_ptr, lo, V, MASKED: tl.constexpr, BLOCK: tl.constexpr):
    offs = lo + tl.arange(0, BLOCK)
    if MASKED:
        p = tl.load(row_ptr + offs, mask=offs < V, other=0.0)
    else:
        p = tl.load(row_ptr + offs)
    return p


@triton.jit
def _multi_chunk(row_ptr, lo, V, h_row, col_base, greedy, MASKED: tl.constexpr, TILES: tl.constexpr,
                 BLOCK: tl.constexpr, FAST: tl.constexpr):
    """One chunk of TILES * BLOCK columns, tile by tile with the next tile's load issued first.

    Same classification as the single-tile path, with the candidate threshold taken against the
    running float32 maximum (it only grows, so earlier exclusions stay valid) and tiles whose running
    maximum is below LOW skipped; a chunk is "fast" only if its maximum reaches 2*LOW, which keeps
    every skipped element below half of the chunk's best score.
    """
    m32 = tl.full([], float("-inf"), tl.float32)
    b64 = tl.full([], -1.0, tl.float64)
    bidx = tl.full([], _INT_MAX, tl.int32)
    zidx = tl.full([], _INT_MAX, tl.int32)
    pmx = tl.full([], float("-inf"), tl.float32)
    gnan = tl.full([], _INT_MAX, tl.int32)
    p_next = _tile_load(row_ptr, lo, V, MASKED, BLOCK)
    for t in tl.static_range(TILES):
        p = p_next
        if t + 1 < TILES:
            p_next = _tile_load(row_ptr, lo + (t + 1) * BLOCK, V, MASKED, BLOCK)
        offs = lo + t * BLOCK + tl.arange(0, BLOCK)
        valid = offs < V
        if greedy:
            s = p
        else:
            h = _fmix32(_mix32(h_row, (col_base + offs).to(tl.uint32)))
            s = p * _recip_f32(_neg_log2_u_f32(h, FAST), FAST)
        if MASKED:
            s = tl.where(valid, s, float("-inf"))
        if FAST:
            m_t = tl.reduce(s, 0, _max_nan)
        else:
            m_t = tl.where(tl.max((s != s).to(tl.int32), 0) > 0, float("nan"), tl.max(s, 0))
        if greedy:
            # exact float32 comparisons: first NaN, else first index of the maximum (tiles in order)
            if m_t != m_t:
                gnan = tl.minimum(gnan, tl.min(tl.where(s != s, offs, _INT_MAX), 0))
            elif (m_t > m32) | (bidx == _INT_MAX):
                m32 = m_t
                bidx = tl.min(tl.where(s == m_t, offs, _INT_MAX), 0)
        else:
            m_new = tl.maximum(m32, m_t, propagate_nan=tl.PropagateNan.ALL)
            thr = m_new * _CAND_REL
            if (m_t >= thr) & (m_new >= _LOW_SCORE) & (m_new < float("inf")):
                cand = s >= thr
                n = tl.sum(cand.to(tl.int32), 0)
                while n > 0:
                    j = tl.min(tl.where(cand, offs, _INT_MAX), 0)
                    cand = cand & (offs != j)
                    n -= 1
                    s64 = _exact_score(row_ptr, j, h_row, col_base)
                    if s64 > b64:  # tiles and candidates in increasing index order: first index wins
                        b64 = s64
                        bidx = j
            if m_t < 2 * _LOW_SCORE:
                pmx = tl.maximum(pmx, tl.max(tl.where(valid, p, float("-inf")), 0))
                if m_t == 0:
                    zidx = tl.minimum(zidx, tl.min(tl.where(valid & (p == 0.0), offs, _INT_MAX), 0))
            m32 = m_new
    res_score = tl.zeros([], dtype=tl.float64)
    res_idx = lo
    if greedy:
        res_score = tl.where(gnan < _INT_MAX, float("nan"), m32.to(tl.float64))
        res_idx = tl.where(gnan < _INT_MAX, gnan, bidx)
    elif (m32 >= 2 * _LOW_SCORE) & (m32 < float("inf")):
        res_score = b64
        res_idx = bidx
    elif m32 == 0:
        if pmx == 0:
            res_idx = zidx
        elif pmx > 0:
            res_score = pmx.to(tl.float64) * 17179869184.0
            res_idx = -1
        else:
            res_idx = -2
    elif (m32 > 0) & (m32 < 2 * _LOW_SCORE):
        res_score = pmx.to(tl.float64) * 17179869184.0
        res_idx = -1
    else:
        res_idx = -2
    return res_score, res_idx


@triton.jit
def _stage1_multi_kernel(
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
    TILES: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = _row_prefix(seed_ptr, pos_ptr, row)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + row) != 0
    else:
        greedy = False
    lo = c * (TILES * BLOCK)
    if lo + TILES * BLOCK <= V:
        res_score, res_idx = _multi_chunk(row_ptr, lo, V, h_row, col_base, greedy, False, TILES, BLOCK, FAST)
    else:
        res_score, res_idx = _multi_chunk(row_ptr, lo, V, h_row, col_base, greedy, True, TILES, BLOCK, FAST)
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
    TILES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row: score deferred candidates, reduce the chunk partials, rescan pending chunks,
    write idx and p."""
    row = tl.program_id(0)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = _row_prefix(seed_ptr, pos_ptr, row)
    cidx = tl.arange(0, NC_POW2)
    valid = cidx < NC
    sc = tl.load(part_score_ptr + row * NC + cidx, mask=valid, other=float("-inf"))
    ix = tl.load(part_idx_ptr + row * NC + cidx, mask=valid, other=_NO_CHUNK)
    # Deferred lone candidates: the same float64 operations as stage 1's scalar path, one lane per chunk.
    unscored = valid & (ix <= _UNSCORED)
    j = tl.where(unscored, _UNSCORED - ix, 0)
    p_j = tl.load(row_ptr + j, mask=unscored, other=0.0)
    sc = tl.where(unscored, _exact_score_of(p_j, h_row, col_base + j), sc)
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
            for t in range(TILES):  # a runtime loop: cold path, keep the code small
                s, i = _exact_chunk(row_ptr, h_row, col_base, c * (TILES * BLOCK) + t * BLOCK, V, greedy, BLOCK)
                if s != s:
                    nan_idx = tl.minimum(nan_idx, i)
                    n = 0  # chunks come in index order: no later chunk can hold an earlier NaN
                elif (s > m) | ((s == m) & (i < best_idx)):
                    m = s
                    best_idx = i
    idx = tl.where(nan_idx < _INT_MAX, nan_idx, best_idx)
    tl.store(out_idx_ptr + row, idx.to(tl.int64))
    tl.store(out_p_ptr + row, tl.load(row_ptr + idx))


# (max B*V/163840, (BLOCK, num_warps, TILES, maxnreg or 0)): first row whose bound is >= the launch's size wins.
# Tuned on an H200 (CUDA-graph replay, V=163840, B in 1..256): one 4-warp tile per program was best at
# every batch size (multi-tile programs were 5-15% slower).
_LAUNCH_TABLE = [
    (2.83, (1024, 4, 1, 0)),
    (16.0, (2048, 4, 1, 0)),
    (float("inf"), (4096, 4, 1, 0)),
]


def _launch_entry(batch: int, vocab: int) -> Tuple[int, int, int, int]:
    size = batch * vocab / 163840
    for bound, cfg in _LAUNCH_TABLE:
        if size <= bound:
            return cfg
    return _LAUNCH_TABLE[-1][1]


def launch_config(batch: int, vocab: int) -> Tuple[int, int, int]:
    """(BLOCK, num_warps, TILES) for a compiled launch (one program per TILES*BLOCK columns of one
    row): enough programs to fill the GPU at small batch, longer chunks at large batch.  Tuned on an
    H200 with CUDA-graph replays (scripts/bench_sampler.py)."""
    return _launch_entry(batch, vocab)[:3]


def _validate(probs, sampling_seed, positions, draft_step, greedy) -> None:
    validate_draft_sample_inputs(probs, sampling_seed, positions, draft_step, greedy)
    # The kernel addresses a row as base + row * stride(0) + column: only the vocab dimension must be dense.
    if probs.shape[1] > 1 and probs.stride(1) != 1:
        raise ValueError(
            f"probs must be contiguous in its last (vocab) dimension, got strides {tuple(probs.stride())}; "
            "row views such as draft_probs[:bs, step] are fine, a transposed tensor is not (use .contiguous())"
        )
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
    num_warps: Optional[int] = None,
    tiles: Optional[int] = None,
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
        block_size / num_warps / tiles: launch overrides (``block_size``: columns per tile, a power of
            two >= 16; ``tiles``: tiles per program, 1, 2 or 4; defaults from :func:`launch_config`); the
            interpreter runs much faster with large blocks.

    Degenerate rows (same answer as upstream's ``torch.argmax``, so toggling the plugin never changes a
    token): an all-zero row returns token 0; a row containing NaN returns its first NaN index; +inf
    probabilities win (first +inf); negative entries are compared as their (negative) scores.

    CUDA graphs: capturable; update ``sampling_seed``, ``positions`` and ``greedy`` in place between
    replays.  ``draft_step`` and the shapes are fixed at capture.  Never synchronises with the host.
    """
    _validate(probs, sampling_seed, positions, draft_step, greedy)
    return _launch(probs, sampling_seed, positions, int(draft_step), greedy, block_size, num_warps, tiles, VARIANT)


#: Code-path selection of the single-tile stage 1 (all variants compute the same tokens; they differ in
#: speed only): ``e2`` 0/1: float32 -log2(u) approximation (bound 2**-16 / 2**-12.7, candidate margin
#: 2**-11 / 2**-10); ``hash`` 0/1: finalizer with the length word folded into the first xor-shift;
#: ``defer`` 0/1: a chunk's lone candidate scored in float64 by stage 1 / by stage 2 (module docstring).
VARIANT = dict(e2=0, hash=0, defer=0)


def _launch(probs, sampling_seed, positions, draft_step, greedy, block_size=None, num_warps=None, tiles=None,
            variant=None, maxnreg=None):
    """Launch on validated inputs (benchmarks and tests call it to compare code paths)."""
    var = dict(VARIANT, **(variant or {}))
    B, V = probs.shape
    out_p = torch.empty((B, 1), dtype=torch.float32, device=probs.device)
    out_idx = torch.empty((B, 1), dtype=torch.int64, device=probs.device)
    if B == 0:
        return out_p, out_idx
    block, warps, ntiles, nreg = _launch_entry(B, V)
    if maxnreg is not None:
        nreg = int(maxnreg)
    # register cap (ptxas maxnreg): more resident programs per SM; not an interpreter option
    opts = {"maxnreg": nreg} if nreg and not INTERPRETED else {}
    if INTERPRETED:
        # the interpreter executes each program in NumPy: fewer, wider programs are much faster
        block = max(1024, min(8192, triton.next_power_of_2(V)))
    if block_size is not None:
        block = int(block_size)
    if num_warps is not None:
        warps = int(num_warps)
    if tiles is not None:
        ntiles = int(tiles)
    if block < 16 or block & (block - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block}")
    if ntiles not in (1, 2, 4):
        raise ValueError(f"tiles must be 1, 2 or 4, got {ntiles}")
    nc = triton.cdiv(V, block * ntiles)
    part_score = torch.empty((B, nc), dtype=torch.float64, device=probs.device)
    part_idx = torch.empty((B, nc), dtype=torch.int32, device=probs.device)
    seeds = sampling_seed.reshape(-1)
    pos = positions.reshape(-1)
    if seeds.stride(0) != 1 or pos.stride(0) != 1:
        seeds, pos = seeds.contiguous(), pos.contiguous()
    g = greedy.reshape(-1).contiguous() if greedy is not None else seeds  # dummy pointer when absent
    col_base = int(draft_step) * V
    fast = probs.device.type == "cuda" and not INTERPRETED
    nc_pow2 = max(16, triton.next_power_of_2(nc))
    if ntiles == 1:
        _stage1_kernel[(B, nc)](
            probs, probs.stride(0), seeds, pos, g, part_score, part_idx, V, col_base, nc,
            HAS_GREEDY=greedy is not None, BLOCK=block, FAST=fast, E2V=int(var["e2"]), HASHV=int(var["hash"]),
            DEFER=int(var["defer"]), num_warps=warps, **opts,
        )
    else:
        _stage1_multi_kernel[(B, nc)](
            probs, probs.stride(0), seeds, pos, g, part_score, part_idx, V, col_base, nc,
            HAS_GREEDY=greedy is not None, TILES=ntiles, BLOCK=block, FAST=fast, num_warps=warps,
        )
    _stage2_kernel[(B,)](
        probs, probs.stride(0), seeds, pos, g, part_score, part_idx, out_p, out_idx, V, col_base, nc,
        HAS_GREEDY=greedy is not None, NC_POW2=nc_pow2, TILES=ntiles, BLOCK=block, num_warps=4,
    )
    return out_p, out_idx
