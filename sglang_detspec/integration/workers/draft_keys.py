"""The per-request key rows a draft proposal reads, on their way from a batch to ``seeded_draft_proposal``.

Eager draft sites read ``sampling_info.sampling_seed`` / ``top_ks`` of the live batch. A captured CUDA graph reads
persistent rows instead: the DETSPEC draft graph runners (single-layer draft-decode on releases whose runner has no
seed buffer, and the multi-layer single-CG draft-extend runner) own one :class:`GraphKeyBuffers`, hand views of it
to what they capture, and stage the live batch's rows into it before every replay.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

__all__ = ["GraphKeyBuffers", "require_seed"]

#: What a graph's rows hold before their first real request and, where the runner knows the padded size, past the
#: live batch: seed 0, greedy (top_k 1). The proposal is row-independent, so a filler row never changes a real one.
FILLER_SEED = 0
FILLER_TOP_K = 1


def require_seed(sampling_seed: Optional[torch.Tensor], where: str) -> torch.Tensor:
    """``sampling_seed``, or the one error for a draft proposal that would otherwise need the global RNG."""
    if sampling_seed is None:
        # Never fall back to the global RNG: that is the batch-shape dependence DETSPEC exists to remove.
        raise RuntimeError(
            f"DETSPEC {where}: a draft proposal got no per-request seeds (sampling_info.sampling_seed is None). "
            "Seeds exist only under --enable-deterministic-inference; launch with it, or use the builtin EAGLE "
            "algorithm. (A draft CUDA-graph runner built without the DETSPEC key buffers, e.g. by adaptive "
            "speculative decoding, loses them too.)"
        )
    return sampling_seed


@dataclasses.dataclass
class GraphKeyBuffers:
    """Persistent per-row key inputs of a captured draft graph: ``[max_bs]`` seeds and top-k."""

    sampling_seed: torch.Tensor  # int64
    top_ks: torch.Tensor  # int32

    @classmethod
    def allocate(cls, max_bs: int, device: Any) -> "GraphKeyBuffers":
        # Outside upstream's buffer dataclasses, so their buffer-pool sharing never aliases these rows.
        return cls(
            sampling_seed=torch.full((max_bs,), FILLER_SEED, dtype=torch.int64, device=device),
            top_ks=torch.full((max_bs,), FILLER_TOP_K, dtype=torch.int32, device=device),
        )

    def rows(self, size: int) -> "GraphKeyBuffers":
        """Views of the first ``size`` rows: what one captured batch size reads."""
        return GraphKeyBuffers(self.sampling_seed[:size], self.top_ks[:size])

    def stage(self, sampling_info: Any, raw_bs: int, where: str) -> None:
        """Copy the live batch's ``raw_bs`` rows in (before a replay)."""
        if raw_bs > 0:
            seed = require_seed(getattr(sampling_info, "sampling_seed", None), where)
            self.sampling_seed[:raw_bs].copy_(seed[:raw_bs])
            self.top_ks[:raw_bs].copy_(sampling_info.top_ks[:raw_bs])

    def fill_padding(self, raw_bs: int, bs: int) -> None:
        """Rows ``raw_bs:bs`` (the padding of a replay) get the filler, so a replay never depends on a previous
        round's requests, even in rows it discards."""
        self.sampling_seed[raw_bs:bs].fill_(FILLER_SEED)
        self.top_ks[raw_bs:bs].fill_(FILLER_TOP_K)
