"""Placeholder: the MULTI-LAYER helper owns this file and replaces it."""

from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2


class DetspecMultiLayerEagleWorkerV2(MultiLayerEagleWorkerV2):
    """Placeholder subclass until the multi-layer helper's version lands."""
