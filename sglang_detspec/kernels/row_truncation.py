"""Deterministic, row-local top-k / top-p / min-p truncation of probabilities (one Triton program per row).

What it computes (bit for bit the same as :func:`sglang_detspec.stream.reference.truncate_probs_reference`, whose
comment block states the rules once): each row that needs truncation (``top_k < V or top_p < 1 or
min_p > 0``) keeps a prefix of its elements in the order "value descending, lower index first", cut by
``rank < top_k``, by the exact int64 fixed-point prefix mass ``E_i <= int64(top_p * 2**60)`` and by
``p_i >= float32(p_max * min_p)``; the kept values are copied (``renormalize=False``) or divided by the
float32 of their exact fixed-point sum (``renormalize=True``, IEEE ``div_rn``); every other row is copied
bit for bit.  A row's result depends on that row and its three parameters only: no batch-wide switch,
no floating-point atomics, no reduction whose order could change a bit (every sum is an integer sum).

Algorithm (no sort)
-------------------
Non-negative float32 values order like their int32 bit patterns ``b`` (``-0.0`` is masked to ``+0.0``).
The three rules are all monotone in the rank, so the kept set is ``{b > v}`` plus the first ``n`` (in index
order) of the ties ``{b == v}``, for one value ``v`` (the last kept element's) and one count ``n``.
  1. One pass: the maximum ``b`` and its first index (the min-p threshold's bit pattern ``thr_b`` follows).
  2. Bisection for ``v``: the smallest present bit pattern whose first element is kept, i.e. with
     ``#{b > v} < top_k``, ``sum(q over b > v) <= T`` and ``v >= thr_b``.  The bracket ``[lo, hi]`` starts
     at ``[min(thr_b, max b), max b]``; one step is one pass that computes, for the midpoint ``t``, the
     count and the int64 mass above ``t`` (exact in any order), the number of elements in the bracket and
     the nearest present values below and above ``t``, to which the bracket snaps (the search ends on a
     present value; a row with few distinct values ends in few steps).  At most 31 steps; ``top_k <= 1``
     rows skip it (``v`` = the maximum, its first index is known).
  3. Compaction: whenever the bracket holds at most a quarter of the elements the passes read, one pass
     copies the bit patterns inside the bracket into the output row (scratch until step 6; regions
     ``[0, V/2)`` and ``[V/2, V)`` alternate) and folds the count and mass of those above it into two
     scalars; later steps read only those.  Not done in place (``out`` is ``probs``): every step then
     reads the whole row.
  4. One pass over the last source: ``#{b == v}``, ``#{b > v}`` and ``sum(q over b > v)``, from which the
     number of kept ties ``n`` follows exactly (integer division by ``q_v``), and the kept mass ``S``.
  5. Only when some but not all ties are kept: a partial pass over the row in index order (tile counts,
     an in-tile cumsum) finds the index of the ``n``-th tie; it stops at that tile.
  6. One pass writes the output.
Cost per truncated row: passes 1 and 6 read the row (6 writes it too); each bisection step reads the
current source (the row, then ever smaller compacted sets); ``steps`` is about log2 of the number of
distinct values between ``thr_b`` and the maximum (up to 31, typically 5 to 20 for softmax rows).
``top_k = 1`` rows take 2 passes; untouched rows 1 copy (nothing in place).

CUDA graphs: capturable.  The parameters and ``probs`` are read from device memory at replay time
(update them in place between replays); the shapes, ``renormalize``, ``min_ps is None`` and whether
``out`` is ``probs`` are baked into the capture.  No host synchronisation; the only allocation is the
output (none with ``out=``), which also serves as the scratch of step 3.  Loops have data-dependent trip
counts but are bounded (31 bisection steps, ``cdiv(V, BLOCK)`` tiles per pass): no input can hang it.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..stream.truncation_contract import (
    TRUNCATION_FIXED_POINT_BITS,
    truncation_out_is_input,
    validate_truncation_inputs,
)
from .launch_checks import INTERPRETED, require_cuda_or_interpreter, require_launch, require_vocab_contiguous

__all__ = ["truncate_probs_triton", "INTERPRETED"]

_INT32_MAX = tl.constexpr(2147483647)
_ABS_BITS = tl.constexpr(0x7FFFFFFF)
_SCALE = tl.constexpr(2.0**TRUNCATION_FIXED_POINT_BITS)
_INV_SCALE = tl.constexpr(2.0**-TRUNCATION_FIXED_POINT_BITS)

# Default launch: columns per tile and warps per program (one program per row).
_GPU_BLOCK = 4096
_GPU_WARPS = 16


@triton.jit
def _load_bits(src, offs, n):
    """Sign-less int32 bit patterns of ``src[offs]`` (float32 bits or compacted patterns); -1 past ``n``."""
    raw = tl.load(src + offs, mask=offs < n, other=-1)
    return tl.where(offs < n, raw & _ABS_BITS, -1)


@triton.jit
def _mass(b):
    # q = int64(p * 2**60): float32 times a power of two is exact, the conversion truncates (floor for p >= 0)
    return (b.to(tl.float32, bitcast=True) * _SCALE).to(tl.int64)


@triton.jit
def _search_pass(src, n, lo, mid, BLOCK: tl.constexpr):
    """Over ``src[:n]``: #{b > mid}, sum(q over b > mid), #{b >= lo}, max{b <= mid} (-1), min{b > mid}."""
    cols = tl.arange(0, BLOCK)
    count_acc = tl.zeros([BLOCK], dtype=tl.int32)
    mass_acc = tl.zeros([BLOCK], dtype=tl.int64)
    from_lo_acc = tl.zeros([BLOCK], dtype=tl.int32)
    below_acc = tl.full([BLOCK], -1, tl.int32)
    above_acc = tl.full([BLOCK], _INT32_MAX, tl.int32)
    for start in range(0, n, BLOCK):
        b = _load_bits(src, start + cols, n)
        above = b > mid
        count_acc += above.to(tl.int32)
        mass_acc += _mass(tl.where(above, b, 0))  # select the int32 pattern, not the int64
        from_lo_acc += (b >= lo).to(tl.int32)
        below_acc = tl.maximum(below_acc, tl.where(above, -1, b))
        above_acc = tl.minimum(above_acc, tl.where(above, b, _INT32_MAX))
    return (
        tl.sum(count_acc, axis=0),
        tl.sum(mass_acc, axis=0),
        tl.sum(from_lo_acc, axis=0),
        tl.max(below_acc, axis=0),
        tl.min(above_acc, axis=0),
    )


@triton.jit
def _compact(src, n, dst, lo, hi, BLOCK: tl.constexpr):
    """Copy the patterns of ``src[:n]`` in ``[lo, hi]`` to ``dst`` (index order); count and mass of those above."""
    cols = tl.arange(0, BLOCK)
    written = tl.zeros([], dtype=tl.int32)
    count_acc = tl.zeros([BLOCK], dtype=tl.int32)
    mass_acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, n, BLOCK):
        b = _load_bits(src, start + cols, n)
        above = b > hi
        count_acc += above.to(tl.int32)
        mass_acc += _mass(tl.where(above, b, 0))  # select the int32 pattern, not the int64
        inside = ((b >= lo) & ~above).to(tl.int32)
        tl.store(dst + written + tl.cumsum(inside, axis=0) - 1, b, mask=inside > 0)
        written += tl.sum(inside, axis=0)
    tl.debug_barrier()  # the next pass reads what other threads of this program wrote
    return written, tl.sum(count_acc, axis=0), tl.sum(mass_acc, axis=0)


@triton.jit
def _tie_stats(src, n, v, BLOCK: tl.constexpr):
    """Over ``src[:n]``: #{b == v}, #{b > v}, sum(q over b > v)."""
    cols = tl.arange(0, BLOCK)
    ties_acc = tl.zeros([BLOCK], dtype=tl.int32)
    count_acc = tl.zeros([BLOCK], dtype=tl.int32)
    mass_acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, n, BLOCK):
        b = _load_bits(src, start + cols, n)
        above = b > v
        ties_acc += (b == v).to(tl.int32)
        count_acc += above.to(tl.int32)
        mass_acc += _mass(tl.where(above, b, 0))  # select the int32 pattern, not the int64
    return tl.sum(ties_acc, axis=0), tl.sum(count_acc, axis=0), tl.sum(mass_acc, axis=0)


@triton.jit
def _tie_cut(row, V, v, n_keep, BLOCK: tl.constexpr):
    """1 + the index of the ``n_keep``-th (in index order) element with pattern ``v``; stops at its tile."""
    cols = tl.arange(0, BLOCK)
    cut = tl.zeros([], dtype=tl.int32) + V
    remaining = n_keep.to(tl.int32)
    start = tl.zeros([], dtype=tl.int32)
    while (remaining > 0) & (start < V):
        offs = start + cols
        is_tie = (_load_bits(row, offs, V) == v).to(tl.int32)
        in_tile = tl.sum(is_tie, axis=0)
        last = tl.min(tl.where((is_tie > 0) & (tl.cumsum(is_tie, axis=0) == remaining), offs, _INT32_MAX), axis=0)
        found = in_tile >= remaining
        cut = tl.where(found, last + 1, cut)
        remaining = tl.where(found, 0, remaining - in_tile)
        start += BLOCK
    return cut


@triton.jit
def _row_truncation_kernel(
    bits_ptr,  # probs viewed as int32
    out_ptr,  # float32 output
    scratch_ptr,  # the output viewed as int32 (compaction scratch until the output pass)
    top_ks_ptr,
    top_ps_ptr,
    min_ps_ptr,
    V,
    probs_row_stride,
    out_row_stride,
    top_ks_stride,
    top_ps_stride,
    min_ps_stride,
    HAS_MIN_P: tl.constexpr,
    IN_PLACE: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row_id = tl.program_id(0).to(tl.int64)
    row = bits_ptr + row_id * probs_row_stride
    dst = out_ptr + row_id * out_row_stride
    scratch = scratch_ptr + row_id * out_row_stride
    cols = tl.arange(0, BLOCK)
    top_k = tl.load(top_ks_ptr + row_id * top_ks_stride).to(tl.int64)
    top_p = tl.load(top_ps_ptr + row_id * top_ps_stride)
    if HAS_MIN_P:
        min_p = tl.load(min_ps_ptr + row_id * min_ps_stride)
    else:
        min_p = tl.zeros([], dtype=tl.float32)
    needs_truncation = (top_k < V) | (top_p < 1.0) | (min_p > 0.0)

    if needs_truncation:
        # -- 1: the maximum pattern and its first index (per lane: strictly greater replaces, so each lane
        #       keeps its earliest maximum; tiles run in index order) ----------------------------------------
        max_acc = tl.full([BLOCK], -1, tl.int32)
        first_acc = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, V, BLOCK):
            b = _load_bits(row, start + cols, V)
            first_acc = tl.where(b > max_acc, start + cols, first_acc)
            max_acc = tl.maximum(max_acc, b)
        max_b = tl.max(max_acc, axis=0)
        first_max = tl.min(tl.where(max_acc == max_b, first_acc, _INT32_MAX), axis=0)
        threshold = max_b.to(tl.float32, bitcast=True) * min_p  # float32(p_max * min_p)
        # p >= threshold  <=>  b >= thr_b for p >= 0; a NaN threshold keeps nothing (its bits exceed every p)
        thr_b = tl.where(threshold <= 0.0, 0, threshold.to(tl.int32, bitcast=True))
        mass_cap = (top_p * _SCALE).to(tl.int64)  # T

        # -- 2 + 3: bisection for v with compaction ---------------------------------------------------------
        # Invariants: hi is a present pattern whose first element is kept (the maximum: rank 0 always is);
        # no pattern below lo has a kept first element; in_bracket = #{lo <= b <= hi}; src[:n_src] holds
        # every element in [lo, hi], and base_count / base_mass count the elements above src's range.
        hi = max_b
        lo = tl.minimum(thr_b, max_b)
        if top_k <= 1:
            lo = hi
        src = row
        n_src = tl.zeros([], dtype=tl.int32) + V
        in_bracket = n_src
        count_above_hi = tl.zeros([], dtype=tl.int32)
        base_count = tl.zeros([], dtype=tl.int32)
        base_mass = tl.zeros([], dtype=tl.int64)
        region = tl.zeros([], dtype=tl.int32)
        while lo < hi:
            if not IN_PLACE:
                if (in_bracket <= n_src // 4) & (n_src > BLOCK):
                    target = scratch + region * (V // 2)
                    n_src, count_up, mass_up = _compact(src, n_src, target, lo, hi, BLOCK)
                    base_count += count_up
                    base_mass += mass_up
                    src = target
                    region = 1 - region
            mid = lo + ((hi - lo) >> 1)  # lo <= mid < hi
            count, mass, from_lo, below, above_min = _search_pass(src, n_src, lo, mid, BLOCK)
            count += base_count
            mass += base_mass
            # Every t in [below, mid] has the same count and mass above it as mid, so mid's answer holds for
            # the present value below; every t in [mid, above_min) fails when mid fails.
            first_kept = (count.to(tl.int64) < top_k) & (mass <= mass_cap)
            snap_up = below < lo  # first_kept, but no present value in [lo, mid]: v is the next one up
            keep_lo = first_kept & ~snap_up
            in_bracket = tl.where(keep_lo, from_lo - (count - base_count), count - count_above_hi)
            count_above_hi = tl.where(keep_lo, count, count_above_hi)
            hi = tl.where(first_kept, tl.where(snap_up, above_min, below), hi)
            lo = tl.where(keep_lo, lo, above_min)
        v = hi
        if not IN_PLACE:
            tl.debug_barrier()  # the output pass overwrites the scratch the last passes read

        # -- 4: ties at v: how many are kept ------------------------------------------------------------------
        v_mass = _mass(v)
        n_ties = tl.zeros([], dtype=tl.int64) + V  # top_k <= 1 keeps one tie, whatever their number
        n_above = tl.zeros([], dtype=tl.int64)
        mass_above = tl.zeros([], dtype=tl.int64)
        if top_k > 1:
            ties, above_count, above_mass = _tie_stats(src, n_src, v, BLOCK)
            if not IN_PLACE:
                tl.debug_barrier()
            n_ties = ties.to(tl.int64)
            n_above = (above_count + base_count).to(tl.int64)
            mass_above = above_mass + base_mass
        # tie m (0-based, index order) has rank n_above + m and prefix mass mass_above + m * v_mass
        room = mass_cap - mass_above
        by_top_p = tl.where(room >= 0, room // tl.maximum(v_mass, 1) + 1, 0)
        by_top_p = tl.where(v_mass > 0, by_top_p, n_ties)
        by_min_p = tl.where(v >= thr_b, n_ties, 0)
        n_keep = tl.minimum(tl.minimum(n_ties, top_k - n_above), tl.minimum(by_top_p, by_min_p))
        n_keep = tl.maximum(n_keep, 1)  # only binds for out-of-contract parameters (rank 0 is kept)
        kept_mass = mass_above + n_keep * v_mass  # S, exact

        # -- 5: ties at an index below cut are kept ------------------------------------------------------------
        cut = tl.zeros([], dtype=tl.int32) + V
        if top_k <= 1:
            cut = first_max + 1
        elif n_keep < n_ties:
            cut = _tie_cut(row, V, v, n_keep, BLOCK)

        # -- 6: output --------------------------------------------------------------------------------------
        divisor = tl.where(kept_mass > 0, kept_mass.to(tl.float32) * _INV_SCALE, 1.0)
        for start in range(0, V, BLOCK):
            offs = start + cols
            in_row = offs < V
            raw = tl.load(row + offs, mask=in_row, other=0)
            b = raw & _ABS_BITS
            p = raw.to(tl.float32, bitcast=True)
            kept = (b > v) | ((b == v) & (offs < cut))
            if RENORMALIZE:
                p = tl.div_rn(p, divisor)  # IEEE round-to-nearest on the GPU and in the interpreter
            tl.store(dst + offs, tl.where(kept, p, 0.0), mask=in_row)
    else:
        if not IN_PLACE:
            for start in range(0, V, BLOCK):
                offs = start + cols
                in_row = offs < V
                tl.store(dst + offs, tl.load(row + offs, mask=in_row).to(tl.float32, bitcast=True), mask=in_row)


def _validate(probs, top_ks, top_ps, min_ps, renormalize, out) -> None:
    validate_truncation_inputs(probs, top_ks, top_ps, min_ps, renormalize, out)
    require_vocab_contiguous("probs", probs)
    require_vocab_contiguous("out", out)
    require_cuda_or_interpreter(
        probs,
        "sglang_detspec.stream.reference.truncate_probs_reference "
        "(or sglang_detspec.integration.sampling.truncation.truncate_probs)",
    )


def truncate_probs_triton(
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: Optional[torch.Tensor],
    *,
    renormalize: bool,
    out: Optional[torch.Tensor] = None,
    block: Optional[int] = None,
    num_warps: Optional[int] = None,
) -> torch.Tensor:
    """Row-local top-k / top-p / min-p truncation; bit-identical to ``truncate_probs_reference``.

    Args:
        probs: ``[N, V]`` float32, finite, >= 0, last dimension contiguous (row-strided views are fine).
        top_ks: ``[N]`` int32 or int64, >= 1 (``1 << 30``: no top-k).
        top_ps: ``[N]`` float32 in (0, 1].
        min_ps: ``[N]`` float32 in [0, 1], or None (no min-p).
        renormalize: divide the kept values by their exact fixed-point sum (see the module docstring).
        out: optional ``[N, V]`` float32 output, last dimension contiguous; ``out=probs`` truncates in place.
        block / num_warps: launch overrides (``block``: columns per tile, a power of two >= 16); the
            interpreter runs much faster with one tile per row.

    Returns ``out`` (a new tensor when ``out`` is None).  Never synchronises with the host.
    """
    _validate(probs, top_ks, top_ps, min_ps, renormalize, out)
    in_place = out is not None and truncation_out_is_input(probs, out)
    if out is None:
        out = torch.empty_like(probs, memory_format=torch.contiguous_format)
    rows, vocab = probs.shape
    if rows == 0:
        return out
    if INTERPRETED:
        # the interpreter pays per operation, not per element: one wide tile per row
        tile, warps = min(8192, max(16, triton.next_power_of_2(vocab))), 4
    else:
        tile, warps = _GPU_BLOCK, _GPU_WARPS
    tile = tile if block is None else int(block)
    warps = warps if num_warps is None else int(num_warps)
    require_launch(tile, warps, block_name="block")
    _row_truncation_kernel[(rows,)](
        probs.view(torch.int32),
        out,
        out.view(torch.int32),
        top_ks,
        top_ps,
        top_ps if min_ps is None else min_ps,  # never read without min_ps
        vocab,
        probs.stride(0),
        out.stride(0),
        top_ks.stride(0),
        top_ps.stride(0),
        top_ps.stride(0) if min_ps is None else min_ps.stride(0),
        HAS_MIN_P=min_ps is not None,
        IN_PLACE=in_place,
        RENORMALIZE=renormalize,
        BLOCK=tile,
        num_warps=warps,
    )
    return out
