"""DETSPEC single-layer EAGLE / NEXTN / EAGLE3 workers (work in progress)."""

from __future__ import annotations

from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, EagleDraftWorker


class DetspecEagleDraftWorker(EagleDraftWorker):
    """Draft worker whose every proposal goes through seeded_draft_proposal."""


class DetspecEAGLEWorkerV2(EAGLEWorkerV2):
    """EAGLEWorkerV2 whose draft worker is swapped for DetspecEagleDraftWorker."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Only methods differ (no new state), and graphs are captured later in
        # init_cuda_graphs, so swapping the class after construction is safe.
        self._draft_worker.__class__ = DetspecEagleDraftWorker
