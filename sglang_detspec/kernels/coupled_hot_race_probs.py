"""Coupled race of a reduced-vocabulary ("hot token") draft, on probabilities, keyed by TARGET id (issue 33).

What: for a draft distribution ``probs`` ``[R, Vd]`` over a draft's hot tokens and ``hot_to_target`` int64 ``[Vd]``
(the target id of each draft column), the target id ``argmax_j(log q_j + G(seed, position, hot_to_target[j]))`` of
every row: SGLang's non-speculative seeded race with each hot token raced under its TARGET id's noise, the first NaN
or the first maximum by TARGET id.  Bit for bit
:func:`~sglang_detspec.stream.coupled_reference.coupled_hot_race_reference` of ``torch.log(probs)``, which is the
full race on the scattered q wherever that race's winner is finite.  Why: the speculation-invariant proposal of an
EAGLE3 (``d2t``) or ``--speculative-token-map`` draft must race the noise the target's verify races for the same
token id, or its proposals are rejected for nothing.

Design: :mod:`.coupled_race_probs`'s two stages and its float32 ratio screen, launched with ``KEYED`` (one kernel,
one screen bound: the bound is per element, whatever the key), over the ``Vd`` draft columns, with each column's
hash key read from the map beside ``probs`` (no ``[R, V]`` scatter).  The map is not sorted in general (SGLang's
``hot_token_id``), so ``KEYED`` breaks every tie by target id, as :mod:`.seeded_hot_draft_sample` does:
  * stage 1 re-scores a chunk's near-tie candidates by ``(score, -target id)``; a chunk of zero probabilities only
    reports its lowest target id; lone candidates and chunks the screen cannot judge go to stage 2 as there;
  * stage 2 takes the lowest target id among the row's equal maxima, and rescans EVERY unjudged chunk (the lowest
    NaN target id may sit in a later chunk than the first NaN), keeping the lowest NaN target id.
With the identity map (``hot_to_target = arange(V)``) this is :func:`~.coupled_race_probs.coupled_race_probs`, bit
for bit (tests/unit/kernels/test_coupled_hot_race_probs.py checks it).

CUDA graphs: capturable.  ``seeds``, ``positions`` and ``hot_to_target`` are read from device memory at replay
(``hot_to_target`` must be contiguous, so that no copy of it is baked into the capture); shapes,
``cap_unit_uniform``, ``uniform`` and the launch are fixed at capture.  No host synchronisation; the ``[R]`` output
and ``[R, cdiv(Vd, BLOCK)]`` float64 + int32 partials are allocated per call (from the graph's pool under capture).
Exact where the kernel's float32 ``log`` is CUDA torch's (:mod:`.coupled_race_probs`' docstring).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..stream.coupled_reference import check_coupled_race_inputs, check_hot_to_target
from .coupled_race_probs import launch_probs_race, resolve_fast_screen
from .launch_checks import require_cuda_or_interpreter, require_vocab_contiguous

__all__ = ["coupled_hot_race_probs"]


def coupled_hot_race_probs(
    probs: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    hot_to_target: torch.Tensor,
    *,
    cap_unit_uniform: bool = True,
    uniform: Optional[str] = None,
    block_size: Optional[int] = None,
    num_warps: Optional[int] = None,
    fast_screen: Optional[bool] = None,
) -> torch.Tensor:
    """The coupled race of a reduced draft, keyed by target id, the log taken in the kernel: the winning TARGET ids,
    int64 ``[R]`` (map them to draft indices with ``HotVocab.target_to_draft``).

    Args:
        probs: ``[R, Vd]`` float32 draft distribution over the hot tokens, contiguous in its last dimension (a
            strided row view such as ``draft_probs[:bs, step]`` is read in place).
        seeds, positions: ``[R]`` int64 request seeds and int32/int64 key positions.
        hot_to_target: contiguous int64 ``[Vd]`` target id of each draft column (``HotVocab.hot_to_target``: unique
            ids below ``2**31``; not re-checked here, which would synchronise).  Need not be sorted.
        cap_unit_uniform, uniform: the release's clamp of ``log(u)`` and the float64 form of ``u``, as
            :func:`~sglang_detspec.kernels.coupled_race_probs.coupled_race_probs`.
        block_size, num_warps, fast_screen: the stage-1 launch and screen form, as there
            (:func:`~.coupled_race_probs.race_launch` of ``[R, Vd]`` by default).

    Degenerate rows as the reference: all zero gives the lowest target id, a NaN or negative probability (and, with
    ``cap_unit_uniform=False``, a zero probability on hash ``2**32 - 1``) the lowest such target id, ``+inf`` the
    lowest target id at ``+inf``.  Under the interpreter (CPU tests) the kernel's ``log`` is numpy's: the CPU twin is
    then the reference of ``numpy.log(probs)``.  CUDA-graph caveats: module docstring.
    """
    check_coupled_race_inputs(probs, seeds, positions, uniform, float32_only=True)
    check_hot_to_target(hot_to_target, probs.shape[1], probs.device)
    if not hot_to_target.is_contiguous():
        raise ValueError("hot_to_target must be contiguous (HotVocab.hot_to_target is); call .contiguous() once, "
                         "outside any CUDA-graph capture, so that replays read the map itself and not a copy")
    require_vocab_contiguous("probs", probs, row_view="draft_probs[:bs, step]")
    require_cuda_or_interpreter(probs, "sglang_detspec.stream.coupled_reference.coupled_hot_race_reference")
    return launch_probs_race(probs, seeds, positions, hot_to_target, cap_unit_uniform=cap_unit_uniform,
                             uniform=uniform, block_size=block_size, num_warps=num_warps,
                             fast=resolve_fast_screen(fast_screen))
