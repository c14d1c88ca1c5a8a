"""The input contract of row-local top-k / top-p / min-p truncation, written once.

Two implementations take the same inputs: the pure-torch reference ``reference.truncate_probs_reference`` and the
Triton kernel ``kernels.row_truncation.truncate_probs_triton`` (both reached through
``integration.sampling.truncation.truncate_probs``). Each validates through here, so a wrong input gets the same actionable
``ValueError`` wherever it enters. Nothing here reads tensor values (no host synchronisation: the checks also run
under CUDA-graph capture). torch only. The rules themselves are stated once, in :mod:`sglang_detspec.stream.reference`
("Row-local top-k / top-p / min-p truncation").
"""

from __future__ import annotations

import torch

__all__ = ["TRUNCATION_FIXED_POINT_BITS", "truncation_out_is_input", "validate_truncation_inputs"]

TRUNCATION_FIXED_POINT_BITS = 60


def validate_truncation_inputs(probs, top_ks, top_ps, min_ps, renormalize, out) -> None:
    """Shapes, dtypes and devices of :func:`truncate_probs_reference` / the Triton kernel's inputs.

    Checks nothing that would need the values (no host synchronisation: the verify step is captured in
    CUDA graphs); ``ValueError`` messages name the argument and the fix.
    """
    if not isinstance(probs, torch.Tensor) or probs.dim() != 2:
        raise ValueError(f"probs must be a 2-D [rows, vocab] tensor, got {getattr(probs, 'shape', type(probs))}")
    if probs.dtype != torch.float32:
        raise ValueError(
            f"probs must be float32 (what SGLang's sampling softmax produces), got {probs.dtype}; "
            "cast with probs.float() first"
        )
    rows, vocab = probs.shape
    if vocab < 1:
        raise ValueError(f"probs must have at least one column (vocab >= 1), got shape {tuple(probs.shape)}")
    if not isinstance(renormalize, bool):
        raise ValueError(f"renormalize must be True or False, got {renormalize!r}")
    params = (
        ("top_ks", top_ks, (torch.int32, torch.int64), "int32 or int64 (SamplingBatchInfo.top_ks)"),
        ("top_ps", top_ps, (torch.float32,), "float32 (SamplingBatchInfo.top_ps)"),
        ("min_ps", min_ps, (torch.float32,), "float32 (SamplingBatchInfo.min_ps), or None for no min-p"),
    )
    for name, t, dtypes, what in params:
        if t is None and name == "min_ps":
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor of {what}, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise ValueError(f"{name} must be {what}, got {t.dtype}")
        if t.dim() != 1 or t.shape[0] != rows:
            raise ValueError(
                f"{name} must have shape [{rows}] (one value per probs row), got {tuple(t.shape)}; slice "
                f"graph buffers to the live rows ({name}[:{rows}]) and flatten [rows, 1] with .view(-1)"
            )
        if t.device != probs.device:
            raise ValueError(f"{name} is on {t.device} but probs is on {probs.device}; move it with .to(probs.device)")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.shape != probs.shape:
            raise ValueError(
                f"out must be a float32 tensor of probs' shape {tuple(probs.shape)}, got "
                f"{getattr(out, 'dtype', type(out))} {tuple(getattr(out, 'shape', ()))}"
            )
        if out.device != probs.device:
            raise ValueError(f"out is on {out.device} but probs is on {probs.device}")
        if not truncation_out_is_input(probs, out) and _storage_ranges_overlap(probs, out):
            raise ValueError(
                "out overlaps probs without being probs itself; pass out=probs for in-place truncation or a "
                "separate tensor"
            )


def truncation_out_is_input(probs: torch.Tensor, out: torch.Tensor) -> bool:
    """True when ``out`` is ``probs`` (same memory, same layout): the in-place case."""
    return out.data_ptr() == probs.data_ptr() and out.stride() == probs.stride()


def _storage_ranges_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False

    def span(t):
        start = t.data_ptr()
        extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) + 1
        return start, start + extent * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
