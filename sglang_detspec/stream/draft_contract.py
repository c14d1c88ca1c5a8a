"""The input contract of a seeded draft draw, written once.

Three callers hand the same inputs on: ``integration.sampling.proposal.seeded_draft_proposal`` (what every DETSPEC
draft site calls), the CPU twin ``reference.seeded_draft_sample`` and the Triton kernel
``kernels.seeded_draft_sample``.  Each validates through here, so a wrong input gets the same actionable
``ValueError`` (naming the argument and the fix) wherever it enters, instead of a wrong stream or an error
deep inside a kernel launch.  Nothing here reads tensor values: no host synchronisation, so the checks run
under CUDA-graph capture too.  torch only; the key layout's limits come from :mod:`sglang_detspec.stream.keys`.

* :func:`check_draft_rows`: the per-row inputs (2-D ``probs`` of any float dtype; int64 seeds and
  int32/int64 positions, one per row) -- what the proposal checks before it derives greedy rows and casts
  half-precision ``probs``;
* :func:`check_draft_sample_inputs`: all of a sampler's inputs (``probs`` float32, ``greedy``,
  ``draft_step``); the reference's contract;
* :func:`check_kernel_inputs`: the kernel's, that plus one device for all inputs (the memory layout and
  CUDA-or-interpreter checks every kernel shares are in ``kernels.launch_checks``).
"""

from __future__ import annotations

import torch

from . import keys

__all__ = ["check_draft_rows", "check_draft_sample_inputs", "check_kernel_inputs"]


def check_draft_rows(probs, sampling_seed, positions) -> None:
    """``probs`` ``[B, V]``; ``sampling_seed`` int64 and ``positions`` int32/int64 of one shape, B values."""
    if not isinstance(probs, torch.Tensor) or probs.dim() != 2:
        raise ValueError(f"probs must be a 2-D [batch, vocab] tensor, got {getattr(probs, 'shape', type(probs))}")
    if sampling_seed is None or positions is None:
        raise ValueError(
            "a seeded draft draw needs sampling_seed and positions (one int64 seed and one key position per "
            "probs row); the DETSPEC workers only draw seeded drafts under --enable-deterministic-inference"
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
            f"sampling_seed and positions must have matching shapes, one entry per probs row; got "
            f"{tuple(sampling_seed.shape)} and {tuple(positions.shape)} for probs {tuple(probs.shape)}"
        )
    if sampling_seed.numel() != probs.shape[0]:
        raise ValueError(
            f"sampling_seed must have one value per probability row, got {sampling_seed.numel()} seeds for "
            f"{probs.shape[0]} rows (slice graph buffers to the live batch: seeds[:bs])"
        )


def check_draft_sample_inputs(probs, sampling_seed, positions, draft_step, greedy) -> None:
    """A sampler's inputs: :func:`check_draft_rows`, float32 ``probs``, the ``greedy`` mask and ``draft_step``."""
    check_draft_rows(probs, sampling_seed, positions)
    if probs.dtype != torch.float32:
        raise ValueError(
            f"probs must be float32 (what upstream's sampling softmax produces), got {probs.dtype}; "
            "cast with probs.float() before sampling"
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


def check_kernel_inputs(probs, sampling_seed, positions, draft_step, greedy) -> None:
    """The Triton kernel's inputs: :func:`check_draft_sample_inputs` and all of them on one device.  The
    launch preconditions every kernel shares (a dense vocab dimension; CUDA tensors unless Triton's
    interpreter runs) the kernel checks itself, through :mod:`sglang_detspec.kernels.launch_checks`."""
    check_draft_sample_inputs(probs, sampling_seed, positions, draft_step, greedy)
    dev = probs.device
    for name, t in (("sampling_seed", sampling_seed), ("positions", positions), ("greedy", greedy)):
        if t is not None and t.device != dev:
            raise ValueError(f"{name} is on {t.device} but probs is on {dev}; all inputs must share a device")
