"""The one entry point for row-local top-k / top-p / min-p truncation of probabilities.

``truncate_probs`` replaces, for DETSPEC, both SGLang's batch-wide renormalisation in EAGLE verify (FlashInfer
``top_k_renorm_probs`` / ``top_p_renorm_probs`` for every row as soon as one row has top-k, top-p or greedy;
min-p ignored) and the rank-hashed truncation of the seeded non-speculative sampler: a row's result depends
only on that row and its own ``top_k`` / ``top_p`` / ``min_p``, bit for bit (rules in
:mod:`sglang_detspec.stream.reference`, "Row-local top-k / top-p / min-p truncation").

Dispatch: CUDA tensors go to the Triton kernel (:mod:`sglang_detspec.kernels.row_truncation`), CPU tensors
to the pure-torch reference; both give the same bits.  Neither SGLang nor the kernel is imported here at
module import time (the kernel module defines Triton kernels, which must be imported after
``TRITON_INTERPRET`` is decided).

CUDA-graph caveat: on CUDA the call is capturable -- all parameters are read from device memory at replay
(keep them in persistent graph buffers, sliced to the live rows, and update them in place); it validates
shapes, dtypes and devices only (value checks would synchronise with the host), allocates only the output
(nothing with ``out=``) and never synchronises.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["truncate_probs", "batch_truncates", "truncate_request_rows"]


def truncate_probs(
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: Optional[torch.Tensor],
    *,
    renormalize: bool,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Row-local truncation of ``probs`` ``[N, V]`` float32 by each row's top-k, top-p and min-p.

    Args:
        probs: ``[N, V]`` float32, finite, >= 0 (row-strided views are fine; on CUDA the vocab dimension
            must be contiguous).
        top_ks: ``[N]`` int32 or int64, values >= 1 (SGLang's ``1 << 30`` means no top-k).
        top_ps: ``[N]`` float32 in (0, 1].
        min_ps: ``[N]`` float32 in [0, 1], or None (no min-p).
        renormalize: keyword-only; True divides the kept values by their exact fixed-point sum.
        out: optional ``[N, V]`` float32 destination; ``out=probs`` truncates in place.

    Returns a new tensor (or ``out``).  Rows with ``top_k >= V``, ``top_p >= 1`` and ``min_p <= 0`` come back
    bit for bit unchanged, even with ``renormalize=True``.
    """
    if not isinstance(probs, torch.Tensor):
        raise ValueError(f"probs must be a torch.Tensor, got {type(probs).__name__}")
    if probs.device.type == "cuda":
        # Imported lazily: the kernel module defines Triton kernels (see the module docstring).
        from sglang_detspec.kernels import truncate_probs_triton as implementation
    elif probs.device.type == "cpu":
        from sglang_detspec.stream.reference import truncate_probs_reference as implementation
    else:
        raise ValueError(
            f"truncate_probs runs on CUDA (Triton kernel) or CPU (torch reference) tensors, got probs on "
            f"{probs.device}; move the tensors to one of those devices"
        )
    # Both implementations validate shapes, dtypes and devices with the same messages.
    return implementation(probs, top_ks, top_ps, min_ps, renormalize=renormalize, out=out)


def batch_truncates(sampling_info: Any) -> bool:
    """Whether a row of the batch has top-k, top-p or min-p: SGLang's host-side ``need_*`` flags (no device read).
    ``need_min_p_sampling`` is read where the release has it."""
    return bool(sampling_info.need_top_k_sampling or sampling_info.need_top_p_sampling
                or getattr(sampling_info, "need_min_p_sampling", False))


def truncate_request_rows(rows: torch.Tensor, sampling_info: Any, rows_per_request: int, *,
                          renormalize: bool) -> torch.Tensor:
    """:func:`truncate_probs` of ``rows`` ``[B * rows_per_request, V]`` (request ``b``'s rows back to back, as a
    verify's ``[B, steps + 1, V]`` flattens) by each request's own ``top_ks`` / ``top_ps`` / ``min_ps`` from
    ``sampling_info`` (its first ``B`` entries: a graph runner's buffers may be longer).  Call it only when
    :func:`batch_truncates`; min-p is applied only where ``need_min_p_sampling`` is set."""
    bs = rows.shape[0] // rows_per_request

    def per_row(values: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(values.reshape(-1)[:bs], rows_per_request)

    need_min_p = bool(getattr(sampling_info, "need_min_p_sampling", False))
    return truncate_probs(
        rows,
        per_row(sampling_info.top_ks),
        per_row(sampling_info.top_ps),
        per_row(sampling_info.min_ps) if need_min_p else None,
        renormalize=renormalize,
    )
