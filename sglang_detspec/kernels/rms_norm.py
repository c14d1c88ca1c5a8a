"""Fused residual add + RMSNorm, one Triton program per row: batch-invariant by construction.

What it computes: SGLang's ``RMSNorm.forward_native(x, residual)`` (0.5.17 - 0.5.23), the path SGLang's
deterministic mode falls back to whenever a residual is passed (``forward_cuda``: ``residual is not None`` under
``is_batch_invariant_mode_enabled()``).  For a row ``x``, ``residual`` (and optionally ``post_residual_addition``)::

    s   = float32(x) + float32(residual) [+ float32(post)]      # the new residual: s in x's dtype (fp32 if fp32_residual)
    var = sum(s * s) / H                                       # float32, one fixed order per H
    n   = s * rsqrt(var + eps)
    out = dtype(n * float32(weight))                           # cast_x_before_out_mul: dtype(weight * dtype(n))

Both results are new tensors (``forward_native`` returns new tensors too; SGLang's callers use the returned
pair).  A row's result depends on that row, the weight and ``eps`` only: the sum of squares is folded in one
order fixed by H (per lane over ``BLOCK``-column chunks, then one ``tl.sum``), whatever the number of rows.

Differences from ``forward_native`` (float rounding only): the sum of squares is reduced in another order
than SGLang's batch-invariant ``mean`` kernel (1024-column chunks), and ``rsqrt`` is the GPU's approximate
one in both, so a variance may differ in its last fp32 bits -- rarely visible after the cast to bfloat16.

CUDA graphs: capturable.  The launch is chosen from the shapes on the host; no host synchronisation; the only
allocations are the two outputs.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .launch_checks import INTERPRETED, require_cuda_or_interpreter

__all__ = ["fused_add_rms_norm", "fused_add_rms_norm_reference", "INTERPRETED"]

_DTYPES = (torch.bfloat16, torch.float16)
_RESIDUAL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Widest chunk a program keeps in registers; wider rows loop over chunks (two passes over the row).
MAX_BLOCK = 8192


@triton.jit
def _row_sum(x_row, r_row, p_row, cols, mask, HAS_POST: tl.constexpr):
    s = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) + tl.load(
        r_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_POST:
        s = s + tl.load(p_row + cols, mask=mask, other=0.0).to(tl.float32)
    return s


@triton.jit
def _fused_add_rms_norm_kernel(
    x_ptr, r_ptr, p_ptr, w_ptr, out_ptr, res_out_ptr,
    H, eps,
    x_stride, r_stride, p_stride, out_stride, res_out_stride,
    BLOCK: tl.constexpr, SINGLE_CHUNK: tl.constexpr, HAS_POST: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    r_row = r_ptr + row * r_stride
    p_row = p_ptr + row * p_stride
    out_row = out_ptr + row * out_stride
    res_row = res_out_ptr + row * res_out_stride
    cols = tl.arange(0, BLOCK)

    if SINGLE_CHUNK:
        mask = cols < H
        s = _row_sum(x_row, r_row, p_row, cols, mask, HAS_POST)
        tl.store(res_row + cols, s.to(res_out_ptr.dtype.element_ty), mask=mask)
        acc = s * s
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, H, BLOCK):
            mask = start + cols < H
            s = _row_sum(x_row + start, r_row + start, p_row + start, cols, mask, HAS_POST)
            tl.store(res_row + start + cols, s.to(res_out_ptr.dtype.element_ty), mask=mask)
            acc += s * s
    variance = tl.div_rn(tl.sum(acc, axis=0), tl.zeros([], dtype=tl.float32) + H)
    rstd = tl.rsqrt(variance + eps)

    if SINGLE_CHUNK:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        n = s * rstd
        if CAST_BEFORE_WEIGHT:
            n = n.to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_row + cols, (n * w).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        for start in range(0, H, BLOCK):
            mask = start + cols < H
            s = _row_sum(x_row + start, r_row + start, p_row + start, cols, mask, HAS_POST)
            w = tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            n = s * rstd
            if CAST_BEFORE_WEIGHT:
                n = n.to(out_ptr.dtype.element_ty).to(tl.float32)
            tl.store(out_row + start + cols, (n * w).to(out_ptr.dtype.element_ty), mask=mask)


def _validate(x, residual, weight, eps, post, cast_x_before_out_mul) -> None:
    if not all(isinstance(t, torch.Tensor) for t in (x, residual, weight)):
        raise ValueError("fused_add_rms_norm takes torch tensors x, residual and weight")
    if x.dim() < 1 or x.dtype not in _DTYPES:
        raise ValueError(f"x must be a bfloat16 or float16 tensor [..., H], got {x.dtype} of shape {tuple(x.shape)}")
    hidden = x.shape[-1]
    for name, t in (("residual", residual), ("post_residual_addition", post)):
        if t is None:
            continue
        if t.shape != x.shape:
            raise ValueError(f"{name} must have x's shape {tuple(x.shape)}, got {tuple(t.shape)}")
        if t.dtype not in _RESIDUAL_DTYPES:
            raise ValueError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    if weight.dim() != 1 or weight.shape[0] != hidden or weight.dtype not in _RESIDUAL_DTYPES:
        raise ValueError(f"weight must be a 1-D float tensor of H = {hidden} elements, got {weight.dtype} of shape "
                         f"{tuple(weight.shape)}")
    if cast_x_before_out_mul and weight.dtype != x.dtype:
        raise ValueError(f"cast_x_before_out_mul needs weight in x's dtype ({x.dtype}), got {weight.dtype}: SGLang's "
                         "weight * x.to(dtype) would then promote to the weight's dtype")
    for t in (residual, weight, post):
        if t is not None and t.device != x.device:
            raise ValueError(f"x, residual, weight (and post_residual_addition) must be on one device, got {x.device} "
                             f"and {t.device}")
    if not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    require_cuda_or_interpreter(x, "sglang_detspec.kernels.rms_norm.fused_add_rms_norm_reference")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[rows, H]`` with a unit column stride (a view when possible, else a copy)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.shape[1] <= 1 or t2.stride(1) == 1 else t2.contiguous()


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    post_residual_addition: Optional[torch.Tensor] = None,
    fp32_residual: bool = False,
    cast_x_before_out_mul: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, new_residual)`` of SGLang's ``RMSNorm.forward_native(x, residual, post_residual_addition)``.

    Args:
        x: ``[..., H]`` bfloat16 or float16 (the dtype of ``out``).
        residual, post_residual_addition: x's shape, bfloat16 / float16 / float32.
        weight: ``[H]`` (bfloat16, float16 or float32); applied in fp32 after the normalisation.
        eps: added to the mean square (as fp32).
        fp32_residual: ``new_residual`` in float32 (SGLang's ``RMSNorm(fp32_residual=True)``), else x's dtype.
        cast_x_before_out_mul: round the normalised row to x's dtype before the weight (weight must be x's dtype).

    Never synchronises with the host; the inputs are not modified.
    """
    _validate(x, residual, weight, eps, post_residual_addition, cast_x_before_out_mul)
    hidden = x.shape[-1]
    res_dtype = torch.float32 if fp32_residual else x.dtype
    # The interpreter (Triton 3.6) truncates fp32 -> bfloat16 casts: there the kernel stores fp32, torch rounds.
    # The cast before the weight cannot be moved to torch: refuse it rather than round it wrongly.
    def store(dtype):
        return torch.float32 if INTERPRETED and dtype == torch.bfloat16 else dtype

    if INTERPRETED and cast_x_before_out_mul and x.dtype == torch.bfloat16:
        raise ValueError("cast_x_before_out_mul with bfloat16 cannot run under TRITON_INTERPRET=1 (the interpreter "
                         "truncates bfloat16 casts); use fused_add_rms_norm_reference on CPU")
    out = torch.empty(x.shape, dtype=store(x.dtype), device=x.device)
    new_residual = torch.empty(x.shape, dtype=store(res_dtype), device=x.device)
    rows = x.numel() // hidden if hidden else 0
    if rows and hidden:
        x2, r2 = _rows(x), _rows(residual)
        p2 = _rows(post_residual_addition) if post_residual_addition is not None else x2
        block = min(MAX_BLOCK, max(16, triton.next_power_of_2(hidden)))
        _fused_add_rms_norm_kernel[(rows,)](
            x2, r2, p2, weight.contiguous(), out, new_residual,
            hidden, float(eps),
            x2.stride(0), r2.stride(0), p2.stride(0), hidden, hidden,
            BLOCK=block, SINGLE_CHUNK=hidden <= block, HAS_POST=post_residual_addition is not None,
            CAST_BEFORE_WEIGHT=cast_x_before_out_mul,
            num_warps=4 if INTERPRETED else min(16, max(1, block // 512)),
        )
    return out.to(x.dtype), new_residual.to(res_dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    post_residual_addition: Optional[torch.Tensor] = None,
    fp32_residual: bool = False,
    cast_x_before_out_mul: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pure torch, ``RMSNorm.forward_native``'s operations in its order (SGLang 0.5.17's layernorm.py); any device."""
    orig_dtype = x.dtype
    s = x.to(torch.float32) + residual.to(torch.float32)
    if post_residual_addition is not None:
        s = s + post_residual_addition.to(torch.float32)
    new_residual = s.clone() if fp32_residual else s.to(orig_dtype)
    variance = s.pow(2).mean(dim=-1, keepdim=True)
    n = s * torch.rsqrt(variance + eps)
    out = weight * n.to(orig_dtype) if cast_x_before_out_mul else (n * weight).to(orig_dtype)
    return out, new_residual
