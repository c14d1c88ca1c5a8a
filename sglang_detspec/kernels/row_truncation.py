"""Deterministic, row-local top-k / top-p / min-p truncation of probabilities (one Triton program per row).

What it computes (bit for bit the same as :func:`sglang_detspec.reference.truncate_probs_reference`, whose
comment block states the rules once): each row that needs truncation (``top_k < V or top_p < 1 or
min_p > 0``) keeps a prefix of its elements in the order "value descending, lower index first", cut by
``rank < top_k``, by the exact int64 fixed-point prefix mass ``E_i <= int64(top_p * 2**60)`` and by
``p_i >= float32(p_max * min_p)``; the kept values are copied (``renormalize=False``) or divided by the
float32 of their exact fixed-point sum (``renormalize=True``, IEEE ``div_rn``); every other row is copied
bit for bit.  A row's result depends on that row and its three parameters only: no batch-wide switch,
no floating-point atomics, no reduction whose order could change a bit.

Algorithm (no sort, integer arithmetic only)
---------------------------------------------
Non-negative float32 values order like their int32 bit patterns ``b`` (``-0.0`` is masked to ``+0.0``).
Because the three rules are all monotone in the rank, the kept set is ``{b > v} + the first n ties of
{b == v}`` for one value ``v`` (the last kept element's) and one count ``n``.
  1. One pass: ``max b`` (the row maximum, hence the min-p threshold's bit pattern ``thr_b``).
  2. Bisection for ``v``: the smallest present bit pattern whose first (lowest-index) element is kept,
     i.e. with ``#{b > v} < top_k``, ``sum(q over b > v) <= T`` and ``v >= thr_b``.  The bracket starts at
     ``[min(thr_b, max b), max b]``; each step is one pass computing, for the midpoint ``t``, the count and
     the int64 mass above ``t`` (both exact in any order) and the nearest present values below and above
     ``t``, to which the bracket snaps (so the search ends on a present value, and a row with few distinct
     values ends in few steps).  At most 31 steps; ``top_k <= 1`` rows skip it (``v = max b``).
  3. One pass: ``#{b == v}``, ``#{b > v}`` and ``sum(q over b > v)``, from which the number of kept ties
     ``n`` follows exactly (integer division by ``q_v``), and the kept mass ``S`` needs no further pass.
  4. Only when some but not all ties are kept: a partial pass in index order (tile counts, an in-tile
     cumsum) finds the index of the ``n``-th tie; it stops at that tile.
  5. One pass writes the output.
Cost per truncated row: ``3 + steps`` full passes (read-only except the last) plus the partial tie pass;
``steps`` is about log2 of the number of distinct values between ``thr_b`` and the maximum (up to 31);
``top_k = 1`` rows take 2 passes + a partial one; untouched rows 1 copy (nothing in place).  Every pass
re-reads the row (from L2 when it fits); the kernel is bound by those re-reads, not by its arithmetic.

CUDA graphs: capturable.  The parameters and ``probs`` are read from device memory at replay time
(update them in place between replays); the shapes, ``renormalize``, ``min_ps is None`` and whether
``out`` is ``probs`` are baked into the capture.  No host synchronisation; the only allocation is the
output (none with ``out=``).  Loops have data-dependent trip counts but are bounded (31 bisection steps,
``cdiv(V, BLOCK)`` tiles per pass), so no input can hang the kernel.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from ..reference import TRUNCATION_FIXED_POINT_BITS, truncation_out_is_input, validate_truncation_inputs

__all__ = ["truncate_probs_triton", "INTERPRETED"]

#: True when Triton runs kernels in its NumPy interpreter (``TRITON_INTERPRET=1`` set before import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

_INT32_MAX = tl.constexpr(2147483647)
_ABS_BITS = tl.constexpr(0x7FFFFFFF)
_SCALE = tl.constexpr(2.0**TRUNCATION_FIXED_POINT_BITS)
_INV_SCALE = tl.constexpr(2.0**-TRUNCATION_FIXED_POINT_BITS)

# Default launch: columns per tile and warps per program (one program per row).
_GPU_BLOCK = 2048
_GPU_WARPS = 8


@triton.jit
def _load_tile(src, offs, in_row):
    """(p, b): the tile's float32 values and their sign-less int32 bit patterns, b = -1 past the row end."""
    p = tl.load(src + offs, mask=in_row, other=0.0)
    b = p.to(tl.int32, bitcast=True) & _ABS_BITS
    return p, tl.where(in_row, b, -1)


@triton.jit
def _fixed_point(p):
    # float32 * 2**60 is exact; the int64 conversion truncates toward zero (floor for p >= 0)
    return (p * _SCALE).to(tl.int64)


@triton.jit
def _row_truncation_kernel(
    probs_ptr,
    out_ptr,
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
    row = tl.program_id(0).to(tl.int64)
    src = probs_ptr + row * probs_row_stride
    dst = out_ptr + row * out_row_stride
    cols = tl.arange(0, BLOCK)
    top_k = tl.load(top_ks_ptr + row * top_ks_stride).to(tl.int64)
    top_p = tl.load(top_ps_ptr + row * top_ps_stride)
    if HAS_MIN_P:
        min_p = tl.load(min_ps_ptr + row * min_ps_stride)
    else:
        min_p = tl.zeros([], dtype=tl.float32)
    needs_truncation = (top_k < V) | (top_p < 1.0) | (min_p > 0.0)

    if needs_truncation:
        # -- pass 1: the row maximum (as a bit pattern) ---------------------------------------------------
        max_acc = tl.full([BLOCK], -1, tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + cols
            _, b = _load_tile(src, offs, offs < V)
            max_acc = tl.maximum(max_acc, b)
        max_b = tl.max(max_acc, axis=0)
        threshold = max_b.to(tl.float32, bitcast=True) * min_p  # float32(p_max * min_p)
        # p >= threshold  <=>  b >= thr_b for p >= 0; a NaN threshold keeps nothing (its bits exceed every p)
        thr_b = tl.where(threshold <= 0.0, 0, threshold.to(tl.int32, bitcast=True))
        mass_cap = (top_p * _SCALE).to(tl.int64)  # T

        # -- bisection: v = the smallest present b whose first element is kept -----------------------------
        # Invariant: hi is a present value whose first element is kept (the maximum: rank 0 always is), and
        # no value below lo has a kept first element.
        hi = max_b
        lo = tl.minimum(thr_b, max_b)
        if top_k <= 1:
            lo = hi
        while lo < hi:
            mid = lo + ((hi - lo) >> 1)  # lo <= mid < hi
            count_acc = tl.zeros([BLOCK], dtype=tl.int32)
            mass_acc = tl.zeros([BLOCK], dtype=tl.int64)
            below_acc = tl.full([BLOCK], -1, tl.int32)
            above_acc = tl.full([BLOCK], _INT32_MAX, tl.int32)
            for start in range(0, V, BLOCK):
                offs = start + cols
                p, b = _load_tile(src, offs, offs < V)
                above = b > mid
                count_acc += above.to(tl.int32)
                mass_acc += tl.where(above, _fixed_point(p), 0)
                below_acc = tl.maximum(below_acc, tl.where(above, -1, b))
                above_acc = tl.minimum(above_acc, tl.where(above, b, _INT32_MAX))
            count = tl.sum(count_acc, axis=0)
            mass = tl.sum(mass_acc, axis=0)
            below = tl.max(below_acc, axis=0)  # largest present b <= mid (-1: none)
            above_min = tl.min(above_acc, axis=0)  # smallest present b > mid (exists: hi > mid)
            # Every t in [below, mid] has the same count and mass above it as mid, so the answer of mid
            # holds there; likewise every t in [mid, above_min) fails when mid fails.
            first_kept = (count.to(tl.int64) < top_k) & (mass <= mass_cap)
            # first_kept with no present value in [lo, mid]: the answer is the next present value up
            snap_up = below < lo
            new_hi = tl.where(first_kept, tl.where(snap_up, above_min, below), hi)
            lo = tl.where(first_kept & ~snap_up, lo, above_min)
            hi = new_hi
        v = hi

        # -- ties at v: how many are kept -----------------------------------------------------------------
        v_mass = _fixed_point(v.to(tl.float32, bitcast=True))
        n_ties = tl.zeros([], dtype=tl.int64) + V  # top_k <= 1 keeps one tie, whatever their number
        n_above = tl.zeros([], dtype=tl.int64)
        mass_above = tl.zeros([], dtype=tl.int64)
        if top_k > 1:
            ties_acc = tl.zeros([BLOCK], dtype=tl.int32)
            above_count_acc = tl.zeros([BLOCK], dtype=tl.int32)
            above_mass_acc = tl.zeros([BLOCK], dtype=tl.int64)
            for start in range(0, V, BLOCK):
                offs = start + cols
                p, b = _load_tile(src, offs, offs < V)
                above = b > v
                ties_acc += (b == v).to(tl.int32)
                above_count_acc += above.to(tl.int32)
                above_mass_acc += tl.where(above, _fixed_point(p), 0)
            n_ties = tl.sum(ties_acc, axis=0).to(tl.int64)
            n_above = tl.sum(above_count_acc, axis=0).to(tl.int64)
            mass_above = tl.sum(above_mass_acc, axis=0)
        # tie m (0-based, index order) has rank n_above + m and prefix mass mass_above + m * v_mass
        room = mass_cap - mass_above
        by_top_p = tl.where(room >= 0, room // tl.maximum(v_mass, 1) + 1, 0)
        by_top_p = tl.where(v_mass > 0, by_top_p, n_ties)
        by_min_p = tl.where(v >= thr_b, n_ties, 0)
        n_keep = tl.minimum(tl.minimum(n_ties, top_k - n_above), tl.minimum(by_top_p, by_min_p))
        n_keep = tl.maximum(n_keep, 1)  # only binds for out-of-contract parameters (rank 0 is kept)
        kept_mass = mass_above + n_keep * v_mass  # S, exact

        # -- partial pass: index of the n_keep-th tie (ties at index < cut are kept) ----------------------
        cut = tl.zeros([], dtype=tl.int32) + V
        if n_keep < n_ties:
            remaining = n_keep.to(tl.int32)
            start = tl.zeros([], dtype=tl.int32)
            while (remaining > 0) & (start < V):
                offs = start + cols
                _, b = _load_tile(src, offs, offs < V)
                is_tie = (b == v).to(tl.int32)
                in_tile = tl.sum(is_tie, axis=0)
                rank_in_tile = tl.cumsum(is_tie, axis=0)
                last = tl.min(tl.where((is_tie > 0) & (rank_in_tile == remaining), offs, _INT32_MAX), axis=0)
                found = in_tile >= remaining
                cut = tl.where(found, last + 1, cut)
                remaining = tl.where(found, 0, remaining - in_tile)
                start += BLOCK

        # -- output pass ----------------------------------------------------------------------------------
        divisor = tl.where(kept_mass > 0, kept_mass.to(tl.float32) * _INV_SCALE, 1.0)
        for start in range(0, V, BLOCK):
            offs = start + cols
            in_row = offs < V
            p, b = _load_tile(src, offs, in_row)
            kept = (b > v) | ((b == v) & (offs < cut))
            if RENORMALIZE:
                p = tl.div_rn(p, divisor)  # IEEE round-to-nearest on the GPU and in the interpreter
            tl.store(dst + offs, tl.where(kept, p, 0.0), mask=in_row)
    else:
        if not IN_PLACE:
            for start in range(0, V, BLOCK):
                offs = start + cols
                in_row = offs < V
                tl.store(dst + offs, tl.load(src + offs, mask=in_row), mask=in_row)


def _validate(probs, top_ks, top_ps, min_ps, renormalize, out) -> None:
    validate_truncation_inputs(probs, top_ks, top_ps, min_ps, renormalize, out)
    for name, t in (("probs", probs), ("out", out)):
        if t is not None and t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(
                f"{name} must be contiguous in its last (vocab) dimension, got strides {tuple(t.stride())}; "
                "row views such as probs[::2] are fine, a transposed tensor is not (use .contiguous())"
            )
    if probs.device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the Triton kernel needs CUDA tensors (got {probs.device}); on CPU use "
            "sglang_detspec.reference.truncate_probs_reference (or sglang_detspec.integration.truncation."
            "truncate_probs), or set TRITON_INTERPRET=1 before importing sglang_detspec.kernels"
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
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"block must be a power of two >= 16, got {tile}")
    _row_truncation_kernel[(rows,)](
        probs,
        out,
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
