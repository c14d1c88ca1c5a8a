"""Reduced-vocabulary ("hot token") drafts: the map and the CPU twin of their seeded proposal.

Most published EAGLE3 drafts score only ``Vd`` "hot" tokens (e.g. 32,000 of a 128k - 152k target vocabulary); the
checkpoint's ``d2t`` buffer maps draft id ``j`` to target id ``j + d2t[j]`` (SGLang turns it into
``hot_token_id``; EAGLE's ``--speculative-token-map`` loads the same list from a file).  Here the map is
``hot_to_target``: int64 ``[Vd]``, unique target ids.  The draft's q is then supported on the hot set H: q(t) = 0
for every target id t outside H.

The stream (one definition: :mod:`sglang_detspec.stream.keys`)
-------------------------------------------------------------
A hot token is raced under its TARGET id: its column word is ``draft_step * V + hot_to_target[j]`` with ``V`` the
TARGET vocabulary size, its score ``q_j / -log u`` exactly as for a full-vocabulary draft, and the winner is the
maximum score with ties going to the LOWER TARGET ID (not the lower draft index; the two orders differ when the
map is not sorted).  Hence a reduced draft and the full-vocabulary draft ``scatter(q)`` (q at the hot ids, 0
elsewhere) propose the same target token for the same key: off-H tokens score exactly 0, so they cannot win a row
whose largest score is positive -- every row with positive mass, i.e. every softmax output.  (Only degenerate rows
differ: an all-zero row returns its lowest hot target id, the full draw target id 0.)  The draw returns the target
id, the draft index (what SGLang's draft loop maps through ``hot_token_id`` itself) and q at that index.

The verify then reads q(x) = q_draft[target_to_draft[x]] and subtracts q only at hot ids in the residual
max(p - q, 0) over the WHOLE target vocabulary (:mod:`sglang_detspec.stream.hot_chain_verify`).

The draw's input contract is :func:`sglang_detspec.stream.draft_contract.check_hot_draft_inputs` (shapes only,
capture-safe); the map's values (unique ids in range) are checked once, when a :class:`HotVocab` is built.  Slow
reference (``[B, Vd]`` int64 / float64), for CPU tests and audits; the Triton kernel is
:mod:`sglang_detspec.kernels.seeded_hot_draft_sample`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import torch

from .draft_contract import check_hot_draft_inputs
from .reference import murmur3_salted_hash, race_scores

__all__ = ["HotVocab", "HotDraftDraw", "scatter_to_target", "seeded_hot_draft_sample"]

#: ``target_to_draft`` entry of a target id outside the hot set.
NOT_HOT = -1


@dataclasses.dataclass(frozen=True)
class HotVocab:
    """A reduced draft vocabulary: ``hot_to_target`` int64 ``[Vd]`` and its inverse ``target_to_draft`` int32
    ``[V]`` (:data:`NOT_HOT` off the hot set), for a target vocabulary of ``target_vocab_size`` tokens.

    Build it once (at worker start), with :meth:`from_hot_token_id` or :meth:`from_d2t`: both read the map's values
    (a host synchronisation) to refuse a map that is not a set of target ids.
    """

    hot_to_target: torch.Tensor
    target_to_draft: torch.Tensor
    target_vocab_size: int

    @property
    def draft_vocab_size(self) -> int:
        return int(self.hot_to_target.shape[0])

    @classmethod
    def from_hot_token_id(cls, hot_to_target: torch.Tensor, target_vocab_size: int) -> "HotVocab":
        """From SGLang's ``hot_token_id`` (draft index -> target id)."""
        vt = int(target_vocab_size)
        if not isinstance(hot_to_target, torch.Tensor) or hot_to_target.dim() != 1 or hot_to_target.numel() == 0:
            raise ValueError(
                f"hot_to_target must be a non-empty 1-D tensor of target ids (the draft's hot_token_id, or d2t + "
                f"arange), got {getattr(hot_to_target, 'shape', type(hot_to_target))}"
            )
        if hot_to_target.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"hot_to_target must hold integer target ids, got {hot_to_target.dtype}")
        if not 0 < vt < 2**31:
            raise ValueError(f"target_vocab_size must be in [1, 2**31), got {target_vocab_size}")
        ids = hot_to_target.to(torch.int64)
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vt:
            raise ValueError(
                f"hot_to_target holds target ids in [{lo}, {hi}], outside the target vocabulary [0, {vt}); the draft's "
                "d2t / hot-token map does not belong to this target"
            )
        if ids.numel() > vt or torch.unique(ids).numel() != ids.numel():
            raise ValueError(
                "hot_to_target repeats a target id: two draft tokens would share one target token's key and "
                "probability; the draft's d2t / hot-token map is corrupt"
            )
        inverse = torch.full((vt,), NOT_HOT, dtype=torch.int32, device=ids.device)
        inverse[ids] = torch.arange(ids.numel(), dtype=torch.int32, device=ids.device)
        return cls(ids.contiguous(), inverse, vt)

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, target_vocab_size: int) -> "HotVocab":
        """From an EAGLE3 checkpoint's ``d2t`` offsets: target id = draft id + ``d2t[draft id]``."""
        if not isinstance(d2t, torch.Tensor) or d2t.dim() != 1:
            raise ValueError(f"d2t must be a 1-D tensor of offsets, got {getattr(d2t, 'shape', type(d2t))}")
        ids = d2t.to(torch.int64) + torch.arange(d2t.numel(), dtype=torch.int64, device=d2t.device)
        return cls.from_hot_token_id(ids, target_vocab_size)

    def to(self, device) -> "HotVocab":
        return HotVocab(self.hot_to_target.to(device), self.target_to_draft.to(device), self.target_vocab_size)


class HotDraftDraw(NamedTuple):
    """One seeded draw from a reduced draft: ``prob`` = q at the drawn index (float32 ``[B, 1]``), ``token`` its
    TARGET id and ``draft_index`` its index in the draft vocabulary (both int64 ``[B, 1]``)."""

    prob: torch.Tensor
    token: torch.Tensor
    draft_index: torch.Tensor


def scatter_to_target(q: torch.Tensor, hot_to_target: torch.Tensor, target_vocab_size: int) -> torch.Tensor:
    """The full-vocabulary q of a reduced one: ``[..., V]`` zeros with ``q[..., j]`` at ``hot_to_target[j]``.

    What a reduced draft's distribution IS over the target vocabulary (tests and audits compare both paths with
    it); the kernels never build it.
    """
    full = q.new_zeros((*q.shape[:-1], int(target_vocab_size)))
    return full.index_copy_(q.dim() - 1, hot_to_target.to(q.device), q)


def seeded_hot_draft_sample(
    probs: torch.Tensor,
    sampling_seed: torch.Tensor,
    positions: torch.Tensor,
    draft_step: int,
    hot_to_target: torch.Tensor,
    target_vocab_size: int,
    *,
    greedy: Optional[torch.Tensor] = None,
) -> HotDraftDraw:
    """Reference seeded draw from a reduced draft ``probs`` ``[B, Vd]`` (float32), keyed by target id.

    Race scores are :func:`~sglang_detspec.stream.reference.race_scores` of the hashes of the target columns;
    ``torch.argmax`` over the columns sorted by target id gives the first-target-id maximum (or the first NaN by
    target id).  Rows where ``greedy`` is True take the first-target-id argmax of ``probs`` instead.
    """
    check_hot_draft_inputs(probs, sampling_seed, positions, draft_step, greedy, hot_to_target, target_vocab_size)
    cols = hot_to_target + int(draft_step) * int(target_vocab_size)
    scores = race_scores(murmur3_salted_hash(sampling_seed, positions, cols), probs)
    by_target = torch.argsort(hot_to_target)
    pick = scores[:, by_target].argmax(dim=-1, keepdim=True)
    if greedy is not None:
        greedy_pick = probs[:, by_target].argmax(dim=-1, keepdim=True)
        pick = torch.where(greedy.reshape(-1, 1).to(probs.device), greedy_pick, pick)
    index = by_target[pick]
    return HotDraftDraw(probs.gather(1, index), hot_to_target[index], index)
