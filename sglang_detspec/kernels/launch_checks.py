"""The launch preconditions every Triton wrapper in this package shares, with their one wording.

Each kernel addresses a row as ``base + row * stride(0) + column``, so only the vocab (last) dimension must be
dense, and a launch on CPU tensors works only under Triton's interpreter.  The wrappers check both before
launching so that a wrong tensor gets an actionable ``ValueError`` (naming the tensor, the fix and the CPU
function to use instead) rather than wrong tokens or a launch error.  The launch shape (columns and warps per
program) has one check and one interpreter default here too.  Shapes, strides and devices only: no
tensor values are read, so the checks cost no host synchronisation and run under CUDA-graph capture too.
torch only (no triton import), so importing this module decides nothing about the interpreter.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

__all__ = ["INTERPRETED", "interpreter_block", "overridden_launch", "require_launch", "require_vocab_contiguous", "require_cuda_or_interpreter"]

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


def interpreter_block(vocab: int) -> int:
    """Columns per program under the interpreter, which executes each program in NumPy: few wide programs run much
    faster there than a GPU's tuned launch (a power of two in [1024, 8192], at least the vocab where it fits)."""
    return max(1024, min(8192, 1 << max(0, int(vocab) - 1).bit_length()))


def require_launch(block_size: int, num_warps: Optional[int] = None, block_name: str = "block_size") -> None:
    """Refuse a launch Triton cannot build: ``block_size`` columns per program must be a power of two >= 16 (every
    kernel here tiles with ``tl.arange(0, BLOCK)``), ``num_warps`` (when given) a power of two >= 1.  ``block_name``
    is the caller's keyword for the columns, which the message names."""
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"{block_name} must be a power of two >= 16, got {block_size}")
    if num_warps is not None and (num_warps < 1 or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two >= 1, got {num_warps}")


def overridden_launch(block: int, warps: int, block_size: Optional[int], num_warps: Optional[int]) -> "tuple[int, int]":
    """``(columns, warps)`` per program: a kernel's chosen ``block`` / ``warps`` with the caller's ``block_size`` /
    ``num_warps`` overrides where given, refused (:func:`require_launch`) where Triton cannot build the result."""
    block = int(block_size) if block_size is not None else int(block)
    warps = int(num_warps) if num_warps is not None else int(warps)
    require_launch(block, warps)
    return block, warps
