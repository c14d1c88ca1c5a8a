"""Batch-invariant GEMM ``c = a @ b (+ bias)`` whose tile is chosen by M but whose reduction over K is not.

Why it is batch-invariant
-------------------------
Every output element ``c[m, n]`` is computed the same way whatever M is and whichever tile computes it: an
fp32 accumulator starts at zero, the K dimension is walked in ``BLOCK_K`` (= 64, fixed) slices in increasing
order and each slice is folded in with ``acc = tl.dot(a_slice, b_slice, acc)``; the bias (fp32) is added
after the loop, then the result is cast once.  Rows past M load as zeros (or, with ``GemmConfig.mask_rows``
False, recompute row 0; never stored either way) and K past its end is masked to zero, so no other row changes an
element's operations.  The tile (``BLOCK_M``,
``BLOCK_N``, warps, stages, the L2 swizzle ``GROUP_SIZE_M``) only decides which program computes an element,
so :data:`LAUNCH_TABLE` may pick it by M (small tiles and many programs for decode, large tiles for
prefill).  ``BLOCK_K`` is the one launch parameter that would change the reduction, so the table cannot carry
another value (checked when this module is imported).  That the MMA instructions of small and large tiles
(``mma.sync`` for 16- and 32-row tiles, ``wgmma`` from 64 rows on Hopper) round alike is measured, not assumed:
:func:`~sglang_detspec.kernels.row_invariance.find_row_variance` is the check (tests/gpu/test_batch_invariant_gemm.py
sweeps M = 1..8192 on the benchmark shapes; the server runs ``check_weight_rows`` on its own at start-up).  It is the computation of SGLang's deterministic ``matmul_persistent`` Triton path
(one 128x128x64 tile for every M), so rows equal that kernel's where the hardware rounds alike.

Launch: a non-persistent grid of ``cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)`` programs in grouped order (pids
that share columns of ``b`` run together).  ``a`` and ``b`` may have any strides (SGLang passes
``weight.t()`` views); int64 offsets are compiled in only for operands whose offsets can pass 2**31.

Split-K (off unless :data:`SPLIT_K_TABLE` names the weight shape): K is cut into ``splits`` ranges of whole
slices, fixed by K; each range's partial sum starts from zero and the partials are added, from zero, in range
order, then the bias.  That is another reduction than the unsplit one, the same for every M: at small M each
range runs in programs of its own (more programs for long-K, small-N weights) and a second launch adds the fp32
partials; at large M every program folds all ranges itself, with the same additions in the same order.

Under Triton's interpreter (CPU tests) each program adds its fp32 products one k at a time instead of ``tl.dot``
(:func:`_fold_k_columns_interpreted` says why) and torch rounds bfloat16 results: Triton 3.6's interpreter truncates
fp32 -> bfloat16.

CUDA graphs: capturable.  The launch (tile, split mode, int64 flags) is chosen on the host from the shapes and
strides, so it is baked into a capture; no host synchronisation; the allocations are the output and, for a split
run as separate programs, its fp32 workspace.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from .launch_checks import INTERPRETED, require_cuda_or_interpreter, require_launch

__all__ = [
    "BLOCK_K", "GemmConfig", "LAUNCH_TABLE", "SHAPE_LAUNCH_TABLE", "SPLIT_K_TABLE", "SPLIT_PROGRAMS_MAX_M", "LaunchPlan",
    "launch_config", "launch_plan", "split_plan", "matmul", "matmul_reference", "INTERPRETED",
]

#: The K slice every launch folds into the accumulator: the one constant batch invariance rests on.
BLOCK_K = 64
#: Programs to aim for when the device cannot be asked (CPU tensors under the interpreter).
INTERPRETER_SMS = 8
_DTYPES = (torch.bfloat16, torch.float16)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class GemmConfig:
    """One launch: a ``block_m x block_n`` output tile per program, ``num_warps`` warps, a ``num_stages``-deep
    software pipeline over K, ``group_size_m`` row tiles per L2 swizzle group.  ``block_k`` is part of the
    reduction, not of the tile: :func:`matmul` refuses anything but :data:`BLOCK_K`."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 4
    group_size_m: int = 8
    block_k: int = BLOCK_K
    #: Rows past M: True (the default) loads them as zeros; False recomputes row 0 in them (unmasked loads).  Either
    #: way no stored row changes (an MMA row depends on its own row of ``a`` only).  At M far below ``block_m`` the
    #: unmasked launch costs up to 2x (H100, ``bench_gemm.py --probe-small-m``, docs/results.md).
    mask_rows: bool = True

    def __post_init__(self):
        # the package's launch checks: tl.dot needs every tile dimension a power of two >= 16
        require_launch(self.block_m, self.num_warps, block_name="GemmConfig.block_m")
        require_launch(self.block_n, block_name="GemmConfig.block_n")
        require_launch(self.block_k, block_name="GemmConfig.block_k")
        if self.group_size_m < 1:
            raise ValueError(f"GemmConfig.group_size_m must be >= 1, got {self.group_size_m}")
        if self.num_stages < 1:
            raise ValueError(f"GemmConfig.num_stages must be >= 1, got {self.num_stages}")

    def programs(self, m: int, n: int) -> int:
        return triton.cdiv(m, self.block_m) * triton.cdiv(n, self.block_n)

    def short(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages} g{self.group_size_m}"
                + ("" if self.mask_rows else " unmasked"))


C = GemmConfig
#: ``(max M, candidates)``: the first bucket whose bound is >= M; in it, the first candidate that launches at
#: least one program per SM, else the candidate that launches the most (the earlier one on a tie).  Small M:
#: narrow tiles, so that long-K small-N weights (down projections) still spread over every SM; M >= 256:
#: the large tiles that keep compute-bound GEMMs near cuBLAS.  Up to 512 rows (a verify of 128 requests x 4
#: tokens) 128x128 comes before 128x256: on the H200 it ran the mid-size gate_up at M = 512 in 48 us against
#: 128x256's 65 (``bench_gemm.py --tune``, docs/results.md); narrower weights, which 128x128 leaves with fewer
#: programs than SMs, keep the 64x128 launch they had before.  Every entry has ``block_k == BLOCK_K``.
LAUNCH_TABLE: Tuple[Tuple[float, Tuple[GemmConfig, ...]], ...] = (
    (16, (C(16, 64, 4, 5), C(16, 32, 4, 5), C(16, 16, 4, 6))),
    (32, (C(32, 64, 4, 5), C(32, 32, 4, 5), C(16, 32, 4, 5))),
    (64, (C(64, 64, 4, 4), C(64, 32, 4, 4), C(32, 32, 4, 5))),
    (128, (C(64, 128, 4, 4), C(64, 64, 4, 4), C(64, 32, 4, 4))),
    (256, (C(128, 128, 8, 3), C(64, 128, 4, 4), C(64, 64, 4, 4))),
    (512, (C(128, 128, 8, 3), C(64, 128, 4, 4))),
    (float("inf"), (C(128, 256, 8, 3), C(128, 128, 8, 3), C(64, 128, 4, 4))),
)
#: Exact overrides per weight shape ``(K, N) -> ((max M, GemmConfig), ...)`` (the first bound >= M wins; an M past
#: the last bound falls back to :data:`LAUNCH_TABLE`), as printed by ``scripts/bench/bench_gemm.py --tune``.
SHAPE_LAUNCH_TABLE: Dict[Tuple[int, int], Tuple[Tuple[float, GemmConfig], ...]] = {}
del C
#: Split-K per weight shape ``(K, N) -> splits``.  A split changes the reduction (each split's partial sum starts
#: from zero; the partials are added in split order), so it belongs to the weight, never to M.  It gives long-K,
#: small-N weights more programs at small M; above :data:`SPLIT_PROGRAMS_MAX_M` rows every program folds all splits
#: itself (same additions, same bits, no workspace).  Entries: the mid-size pair's down projection and EAGLE fc,
#: which a 4-way split brings to cuBLAS's time at M = 1 - 16 on an H100 (``bench_gemm.py --split-k 4``,
#: docs/results.md); tests/gpu/test_batch_invariant_gemm.py checks their rows for every M.
SPLIT_K_TABLE: Dict[Tuple[int, int], int] = {(5632, 2048): 4, (4096, 2048): 4}
#: Up to this many rows a split runs as programs of its own, their fp32 partials added by a second launch (a
#: workspace of splits x M x N fp32).  Folded into one program per tile, the mid-size down and EAGLE fc ran 1.96 -
#: 2.13x cuBLAS's time at M = 128 - 256 on the H200, their few programs each walking all of K, against 0.91 - 0.95x
#: at M = 64 as programs of their own.  Above 256 rows the folded tiles are large enough to fill the SMs.
SPLIT_PROGRAMS_MAX_M = 256
_FOLD_MAX_TILE = 128 * 128  # folding keeps two accumulators: larger tiles spill registers


def _check_tables() -> None:
    entries = [c for _, cands in LAUNCH_TABLE for c in cands]
    entries += [c for rows in SHAPE_LAUNCH_TABLE.values() for _, c in rows]
    for config in entries:
        if config.block_k != BLOCK_K:
            raise RuntimeError(f"launch table entry {config} has block_k {config.block_k}: every entry must fold "
                               f"K in slices of BLOCK_K = {BLOCK_K}, or rows stop being batch-invariant")
    for shape, splits in SPLIT_K_TABLE.items():
        if not isinstance(splits, int) or splits < 1:
            raise RuntimeError(f"SPLIT_K_TABLE[{shape}] must be an int >= 1 (1: no split), got {splits!r}")


_check_tables()


@functools.lru_cache(maxsize=None)
def _device_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _device_sms(device.index if device.index is not None else torch.cuda.current_device())


class LaunchPlan(NamedTuple):
    """Everything :func:`matmul` decides on the host: the tile, the K split (``splits`` partials of
    ``k_per_split`` columns, fixed by K) and whether each program folds every split itself."""

    config: GemmConfig
    splits: int
    k_per_split: int
    fold_splits: bool


def split_plan(k: int, split_k: int) -> Tuple[int, int]:
    """``(splits, k_per_split)`` for ``split_k`` requested splits of K (whole BLOCK_K slices each; no empty one)."""
    if split_k <= 1 or k <= BLOCK_K:
        return 1, k
    per = triton.cdiv(triton.cdiv(k, BLOCK_K), split_k) * BLOCK_K
    return triton.cdiv(k, per), per


def launch_config(m: int, k: int, n: int, num_sms: int, splits: int = 1) -> GemmConfig:
    """The tile :func:`matmul` uses for an ``[m, k] @ [k, n]`` product split in ``splits`` on ``num_sms`` SMs."""
    for bound, config in SHAPE_LAUNCH_TABLE.get((k, n), ()):
        if m <= bound:
            return config
    candidates = next(cands for bound, cands in LAUNCH_TABLE if m <= bound)
    per_tile = 1
    if splits > 1 and m <= SPLIT_PROGRAMS_MAX_M:
        per_tile = splits
    elif splits > 1:
        candidates = tuple(c for c in candidates if c.block_m * c.block_n <= _FOLD_MAX_TILE)
    for config in candidates:
        if config.programs(m, n) * per_tile >= num_sms:
            return config
    return max(candidates, key=lambda c: (c.programs(m, n), -candidates.index(c)))


def launch_plan(m: int, k: int, n: int, num_sms: int, split_k: Optional[int] = None) -> LaunchPlan:
    """The whole launch of an ``[m, k] @ [k, n]`` product (``split_k`` None: :data:`SPLIT_K_TABLE`'s)."""
    splits, per = split_plan(k, SPLIT_K_TABLE.get((k, n), 1) if split_k is None else split_k)
    return LaunchPlan(launch_config(m, k, n, num_sms, splits), splits, per, splits > 1 and m > SPLIT_PROGRAMS_MAX_M)


@triton.jit
def _fold_k_columns_interpreted(acc, a_rows, b_cols, row_ok, k_lo, k_hi, stride_ak, stride_bk,
                                BLOCK_K: tl.constexpr, MASK_ROWS: tl.constexpr):
    """The interpreter's :func:`_fold_k_slices`: per BLOCK_K slice, its fp32 products summed from zero one k at a
    time, in increasing k, then added to ``acc``.

    Triton's interpreter runs ``tl.dot`` as numpy's matmul, which multiplies bfloat16 bit patterns as integers and
    whose BLAS rounds an element by the operands' shapes (seen on AVX-512 CPUs), so a CPU test of the kernel's
    invariance needs a sum whose order depends on the slices alone, never on the tile or M.  ``a_rows`` / ``b_cols``
    address column / row 0 of the tile's rows / columns."""
    for k_start in range(k_lo, k_hi, BLOCK_K):
        part = tl.zeros_like(acc)
        for k in range(k_start, tl.minimum(k_start + BLOCK_K, k_hi)):
            if MASK_ROWS:
                a = tl.load(a_rows + k * stride_ak, mask=row_ok, other=0.0)
            else:
                a = tl.load(a_rows + k * stride_ak)
            b = tl.load(b_cols + k * stride_bk)
            part += a.to(tl.float32)[:, None] * b.to(tl.float32)[None, :]
        acc += part
    return acc


@triton.jit
def _fold_k_slices(acc, a_ptrs, b_ptrs, offs_k, row_ok, k_lo, k_hi, K, stride_ak, stride_bk,
                   BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, MASK_ROWS: tl.constexpr):
    """``acc + a[:, k_lo:k_hi] @ b[k_lo:k_hi, :]``, one BLOCK_K slice at a time in increasing k: the per-element
    reduction.  ``a_ptrs`` / ``b_ptrs`` address column / row ``k_lo``; ``k_lo`` is a multiple of BLOCK_K; with
    ``MASK_ROWS`` the rows of ``a`` where ``row_ok`` is false load as zeros."""
    for k_start in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:  # K is whole slices (a property of the weight, not of M): no K mask to compute
            if MASK_ROWS:
                a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            else:
                a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_start
            a_mask = offs_k[None, :] < k_left
            if MASK_ROWS:
                a_mask = a_mask & row_ok[:, None]
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _fold_k(acc, a_ptrs, b_ptrs, a_rows, b_cols, offs_k, row_ok, k_lo, k_hi, K, stride_ak, stride_bk,
            BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, MASK_ROWS: tl.constexpr, INTERPRETED_FOLD: tl.constexpr):
    """``acc + a[:, k_lo:k_hi] @ b[k_lo:k_hi, :]`` for the tile whose column-0 / row-0 pointers are given."""
    if INTERPRETED_FOLD:
        acc = _fold_k_columns_interpreted(acc, a_rows, b_cols, row_ok, k_lo, k_hi, stride_ak, stride_bk, BLOCK_K,
                                          MASK_ROWS)
    else:
        acc = _fold_k_slices(acc, a_ptrs + k_lo * stride_ak, b_ptrs + k_lo * stride_bk, offs_k, row_ok, k_lo, k_hi,
                             K, stride_ak, stride_bk, BLOCK_K, EVEN_K, MASK_ROWS)
    return acc


@triton.jit(do_not_specialize=["M"])  # one compiled kernel per launch for every M (the row count is not a constant)
def _batch_invariant_matmul_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, ws_ptr,
    M, N, K, K_PER_SPLIT,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    SPLIT_K: tl.constexpr, FOLD_SPLITS: tl.constexpr,
    A_LARGE: tl.constexpr, B_LARGE: tl.constexpr, C_LARGE: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, MASK_ROWS: tl.constexpr, INTERPRETED_FOLD: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_SIZE_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if A_LARGE:
        offs_am = offs_am.to(tl.int64)
    if B_LARGE:
        offs_bn = offs_bn.to(tl.int64)
    if A_LARGE or B_LARGE:
        offs_k = offs_k.to(tl.int64)
    row_ok = offs_am < M
    if not MASK_ROWS:
        offs_am = tl.where(row_ok, offs_am, 0)  # rows past M recompute row 0; never stored
    offs_bn = tl.where(offs_bn < N, offs_bn, 0)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    a_rows = a_ptr + offs_am * stride_am  # the interpreter's fold only (dead code in a compiled launch)
    b_cols = b_ptr + offs_bn * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SPLIT_K == 1:
        acc = _fold_k(acc, a_ptrs, b_ptrs, a_rows, b_cols, offs_k, row_ok, 0, K, K, stride_ak, stride_bk, BLOCK_K,
                      EVEN_K, MASK_ROWS, INTERPRETED_FOLD)
    elif FOLD_SPLITS:  # every split in this program: each partial from zero, added to the total in split order
        for split in range(0, SPLIT_K):  # a loop, not unrolled: one pipelined K loop in the code, not SPLIT_K
            k_lo = split * K_PER_SPLIT
            if A_LARGE or B_LARGE:
                k_lo = k_lo.to(tl.int64)
            part = _fold_k(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), a_ptrs, b_ptrs, a_rows, b_cols, offs_k,
                           row_ok, k_lo, tl.minimum(k_lo + K_PER_SPLIT, K), K, stride_ak, stride_bk, BLOCK_K, EVEN_K,
                           MASK_ROWS, INTERPRETED_FOLD)
            acc += part
    else:  # one split per program (axis 1): its partial goes to the workspace, _split_k_combine_kernel adds them
        k_lo = tl.program_id(1) * K_PER_SPLIT
        if A_LARGE or B_LARGE:
            k_lo = k_lo.to(tl.int64)
        acc = _fold_k(acc, a_ptrs, b_ptrs, a_rows, b_cols, offs_k, row_ok, k_lo, tl.minimum(k_lo + K_PER_SPLIT, K), K,
                      stride_ak, stride_bk, BLOCK_K, EVEN_K, MASK_ROWS, INTERPRETED_FOLD)

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if C_LARGE:
        offs_cm = offs_cm.to(tl.int64)
        offs_cn = offs_cn.to(tl.int64)
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    if SPLIT_K > 1 and not FOLD_SPLITS:
        ws_ptrs = ws_ptr + (tl.program_id(1).to(tl.int64) * M + offs_cm[:, None]) * N + offs_cn[None, :]
        tl.store(ws_ptrs, acc, mask=c_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)[None, :]
        c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _split_k_combine_kernel(ws_ptr, bias_ptr, c_ptr, M, N, stride_cm, stride_cn,
                            SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """``c = sum of the split partials, from zero, in split order (+ bias)``: the same fp32 additions as the
    kernel's ``FOLD_SPLITS`` path, so both give the same bits."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        total += tl.load(ws_ptr + split * M * N + offs, mask=mask, other=0.0)
    cols = offs % N
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + (offs // N) * stride_cm + cols * stride_cn, total.to(c_ptr.dtype.element_ty), mask=mask)


def _max_offset(t: torch.Tensor, padded_cols: int) -> int:
    """The largest element offset the kernel forms for ``t`` ``[rows, K]``, K padded to ``padded_cols``."""
    return max(t.shape[0] - 1, 0) * abs(t.stride(0)) + max(padded_cols - 1, 0) * abs(t.stride(1))


def _int64_flags(a: torch.Tensor, b: torch.Tensor, config: GemmConfig) -> Tuple[bool, bool, bool]:
    """``(A_LARGE, B_LARGE, C_LARGE)``: which operands need int64 offsets (any that can reach 2**31 elements)."""
    M, K = a.shape
    N = b.shape[1]
    padded_k = triton.cdiv(max(K, 1), config.block_k) * config.block_k
    padded_m = triton.cdiv(M, config.block_m) * config.block_m
    # masked rows past M still form their (unread) addresses: count them in a's largest offset
    rows_formed = padded_m if config.mask_rows else M
    a_offset = max(rows_formed - 1, 0) * abs(a.stride(0)) + max(padded_k - 1, 0) * abs(a.stride(1))
    return (a_offset >= 2**31, _max_offset(b.t(), padded_k) >= 2**31, padded_m * N >= 2**31)


def _validate(a, b, bias, out_dtype) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise ValueError("matmul takes torch tensors a [M, K] and b [K, N]")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul needs 2-D a [M, K] and b [K, N], got shapes {tuple(a.shape)} and {tuple(b.shape)} "
                         "(flatten leading dimensions with a.reshape(-1, K))")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a's columns ({a.shape[1]}) must equal b's rows ({b.shape[0]}): shapes {tuple(a.shape)} "
                         f"@ {tuple(b.shape)} (for a weight [N, K] pass weight.t())")
    if a.dtype not in _DTYPES or b.dtype != a.dtype:
        raise ValueError(f"matmul supports bfloat16 or float16 a and b of one dtype, got {a.dtype} and {b.dtype} "
                         "(float32 GEMMs: use SGLang's matmul_persistent, which folds K in slices of 32)")
    if b.device != a.device:
        raise ValueError(f"a and b must be on one device, got {a.device} and {b.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != b.shape[1]:
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"bias must be a 1-D tensor of N = {b.shape[1]} elements, got {shape} "
                             "(a broadcast [M, N] bias: add it after the product)")
        if bias.dtype not in _OUT_DTYPES or bias.device != a.device:
            raise ValueError(f"bias must be bfloat16, float16 or float32 on {a.device}, got {bias.dtype} on "
                             f"{bias.device}")
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be None (a's dtype), torch.bfloat16, torch.float16 or torch.float32, "
                         f"got {out_dtype}")
    require_cuda_or_interpreter(a, "sglang_detspec.kernels.batch_invariant_gemm.matmul_reference")


def _launch(a, b, bias, out_dtype, plan: LaunchPlan) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    config = plan.config
    out_dtype = out_dtype or a.dtype
    # The interpreter (Triton 3.6) truncates fp32 -> bfloat16 casts: there the kernel stores fp32, torch rounds.
    store_dtype = torch.float32 if INTERPRETED and out_dtype == torch.bfloat16 else out_dtype
    c = torch.empty((M, N), dtype=store_dtype, device=a.device)
    if M == 0 or N == 0:
        return c.to(out_dtype)
    split_programs = plan.splits > 1 and not plan.fold_splits
    ws = torch.empty((plan.splits, M, N), dtype=torch.float32, device=a.device) if split_programs else c
    a_large, b_large, c_large = _int64_flags(a, b, config)
    grid = (config.programs(M, N), plan.splits) if split_programs else (config.programs(M, N),)
    _batch_invariant_matmul_kernel[grid](
        a, b, c, bias if bias is not None else c, ws,  # bias_ptr is never read without HAS_BIAS, ws without a split
        M, N, K, plan.k_per_split,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_SIZE_M=config.group_size_m,
        SPLIT_K=plan.splits, FOLD_SPLITS=plan.fold_splits,
        A_LARGE=a_large, B_LARGE=b_large, C_LARGE=c_large,
        HAS_BIAS=bias is not None,
        EVEN_K=K % config.block_k == 0,
        MASK_ROWS=config.mask_rows,
        INTERPRETED_FOLD=INTERPRETED,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if split_programs:
        _split_k_combine_kernel[(triton.cdiv(M * N, 1024),)](
            ws, bias if bias is not None else ws, c, M, N, c.stride(0), c.stride(1),
            SPLIT_K=plan.splits, HAS_BIAS=bias is not None, BLOCK=1024, num_warps=4,
        )
    return c.to(out_dtype)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           out_dtype: Optional[torch.dtype] = None, config: Optional[GemmConfig] = None,
           split_k: Optional[int] = None) -> torch.Tensor:
    """``a @ b (+ bias)``, every row bit-identical whatever the number of rows (module docstring).

    Args:
        a: ``[M, K]`` bfloat16 or float16, any strides.
        b: ``[K, N]`` of a's dtype, any strides (``weight.t()`` of an ``[N, K]`` weight is the usual operand).
        bias: optional ``[N]`` (bfloat16, float16 or float32), added in fp32 after the K loop.
        out_dtype: the output dtype (default a's); ``torch.float32`` stores the fp32 accumulator directly
            (``aten::mm.dtype``; SGLang's deterministic mode instead rounds to a's dtype first, then casts).
        config: force one tile (benchmarks, tests); default :func:`launch_config`.  ``block_k`` must be
            :data:`BLOCK_K`.
        split_k: force a K split (1: none); default :data:`SPLIT_K_TABLE`'s for ``(K, N)``.  Rows are invariant
            across M only among calls with the same split: keep it a property of the weight.

    Returns a new contiguous ``[M, N]`` tensor.  Never synchronises with the host.  A split run as separate
    programs (M <= :data:`SPLIT_PROGRAMS_MAX_M`) also allocates an fp32 ``[splits, M, N]`` workspace.
    """
    _validate(a, b, bias, out_dtype)
    if split_k is not None and (not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"split_k must be None (the table's) or an int >= 1, got {split_k!r}")
    if config is not None and config.block_k != BLOCK_K:
        raise ValueError(f"config.block_k must be BLOCK_K = {BLOCK_K}, got {config.block_k}: another K slice "
                         "changes the reduction, and rows would differ from every other launch's")
    plan = launch_plan(a.shape[0], a.shape[1], b.shape[1], _num_sms(a.device), split_k)
    if config is not None:
        plan = plan._replace(config=config)
    return _launch(a, b, bias, out_dtype, plan)


def matmul_reference(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                     out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Pure torch: the fp32 product (plus the fp32 bias) rounded once to ``out_dtype`` (default a's dtype).
    Equal to :func:`matmul` up to the order of the fp32 sums (not bit for bit); any device."""
    out = a.float() @ b.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype or a.dtype)
