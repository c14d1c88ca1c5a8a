"""The launch preconditions every Triton wrapper in this package shares, with their one wording.

Each kernel addresses a row as ``base + row * stride(0) + column``, so only the vocab (last) dimension must be
dense, and a launch on CPU tensors works only under Triton's interpreter.  The wrappers check both before
launching so that a wrong tensor gets an actionable ``ValueError`` (naming the tensor, the fix and the CPU
function to use instead) rather than wrong tokens or a launch error.  Shapes, strides and devices only: no
tensor values are read, so the checks cost no host synchronisation and run under CUDA-graph capture too.
torch only (no triton import), so importing this module decides nothing about the interpreter.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

__all__ = ["INTERPRETED", "require_vocab_contiguous", "require_cuda_or_interpreter"]

#: True when Triton runs kernels in its NumPy interpreter (``TRITON_INTERPRET=1`` set before import).
#: Read once, when the kernels package is first imported -- the moment Triton itself reads the variable.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def require_vocab_contiguous(name: str, tensor: Optional[torch.Tensor], row_view: Optional[str] = None) -> None:
    """Refuse a 2-D ``tensor`` whose last (vocab) dimension is strided; ``None`` passes (an absent ``out``).

    Row-strided views are fine (the kernels take ``stride(0)``); ``row_view`` is the example of one that the
    message names (default ``f"{name}[::2]"``), so each call site can cite the view its callers actually pass.
    """
    if tensor is None or tensor.shape[1] <= 1 or tensor.stride(1) == 1:
        return
    example = row_view if row_view is not None else f"{name}[::2]"
    raise ValueError(
        f"{name} must be contiguous in its last (vocab) dimension, got strides {tuple(tensor.stride())}; "
        f"row views such as {example} are fine, a transposed tensor is not (use .contiguous())"
    )


def require_cuda_or_interpreter(tensor: torch.Tensor, cpu_alternative: str) -> None:
    """Refuse a non-CUDA ``tensor`` unless the interpreter runs the kernels; ``cpu_alternative`` is the CPU
    function (dotted path, optionally with a parenthesised second choice) that the message points to."""
    if tensor.device.type == "cuda" or INTERPRETED:
        return
    raise ValueError(
        f"the Triton kernel needs CUDA tensors (got {tensor.device}); on CPU use {cpu_alternative}, "
        "or set TRITON_INTERPRET=1 before importing sglang_detspec.kernels"
    )
