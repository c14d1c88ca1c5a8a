"""The input contract of a seeded draft draw (full and reduced vocabulary), written once.

Each draw validates its own inputs through here: the CPU twins ``reference.seeded_draft_sample`` and
``hot_vocab.seeded_hot_draft_sample``, and the Triton kernels ``kernels.seeded_draft_sample`` and
``kernels.seeded_hot_draft_sample``.  ``integration.sampling.proposal.seeded_draft_proposal`` (what every DETSPEC draft
site calls) only picks the draw and hands the batch on, so the rows are checked once, by the draw that reads them,
and a wrong input gets the same actionable ``ValueError`` (naming the argument and the fix) wherever it enters,
instead of a wrong stream or an error deep inside a kernel launch.  Nothing here reads tensor values: no host
synchronisation, so the checks run under CUDA-graph capture too.  torch only; the key layout's limits come from
:mod:`sglang_detspec.stream.keys`.

* :func:`check_draft_sample_inputs`: a draw's inputs (2-D float32 ``probs``; int64 seeds and int32/int64
  positions, one per row; the ``greedy`` mask; ``draft_step``); the CPU twin's contract;
* :func:`check_kernel_inputs`: the kernel's, that plus one device for all inputs (the memory layout and
  CUDA-or-interpreter checks every kernel shares are in ``kernels.launch_checks``);
* :func:`check_hot_draft_inputs`: a reduced-vocabulary draw's, the draw's contract plus the hot-token map.
"""

from __future__ import annotations

import torch

from . import keys

__all__ = ["check_draft_sample_inputs", "check_kernel_inputs", "check_hot_draft_inputs"]


def check_draft_sample_inputs(probs, sampling_seed, positions, draft_step, greedy) -> None:
    """``probs`` float32 ``[B, V]``; ``sampling_seed`` int64 and ``positions`` int32/int64 of one shape, B values;
    ``greedy`` None or bool with B values; ``draft_step`` a Python int inside the key range."""
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


def check_hot_draft_inputs(probs, sampling_seed, positions, draft_step, greedy, hot_to_target, target_vocab_size):
    """A reduced draw's inputs: the full draw's contract, with ``draft_step`` checked against the TARGET vocabulary
    (the column word is ``draft_step * V + target id``) and ``hot_to_target`` int64 ``[Vd]`` on ``probs``' device,
    ``Vd`` = ``probs.shape[1]`` <= ``target_vocab_size``.  Shapes only: no host synchronisation (the map's values
    are checked once, when its ``HotVocab`` is built)."""
    check_draft_sample_inputs(probs, sampling_seed, positions, draft_step, greedy)
    vt = target_vocab_size
    if isinstance(vt, torch.Tensor) or int(vt) != vt or not 0 < int(vt) < 2**31:
        raise ValueError(f"target_vocab_size must be a Python int in [1, 2**31), got {target_vocab_size!r}")
    if not isinstance(hot_to_target, torch.Tensor) or hot_to_target.dtype != torch.int64 or hot_to_target.dim() != 1:
        raise ValueError(
            f"hot_to_target must be a 1-D int64 tensor of target ids (HotVocab.hot_to_target), got "
            f"{getattr(hot_to_target, 'dtype', type(hot_to_target))} {tuple(getattr(hot_to_target, 'shape', ()))}"
        )
    if hot_to_target.numel() != probs.shape[1]:
        raise ValueError(
            f"hot_to_target has {hot_to_target.numel()} entries but the draft distribution has {probs.shape[1]} "
            "columns; pass the draft's own map (one target id per draft-vocabulary column)"
        )
    if probs.shape[1] > vt:
        raise ValueError(f"a draft vocabulary of {probs.shape[1]} tokens cannot map into a target vocabulary of {vt}")
    if hot_to_target.device != probs.device:
        raise ValueError(f"hot_to_target is on {hot_to_target.device} but probs is on {probs.device}")
    keys.check_draft_step(int(draft_step), int(vt))
