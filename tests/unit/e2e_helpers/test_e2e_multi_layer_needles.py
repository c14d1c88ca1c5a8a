"""CPU test of what tests/e2e/test_e2e_multi_layer.py looks for in a server's log: the line the plugin's scheduler
check writes for a multi-layer DETSPEC_EAGLE server (a needle the code no longer writes would fail only on a GPU)."""

import test_e2e_multi_layer as e2e

from sglang_detspec.integration.setup.scheduler_check import WORKER_LOG_FORMAT


def test_the_worker_needle_is_what_the_scheduler_check_logs():
    from sglang_detspec.integration.workers.multi_layer import (
        DetspecMultiLayerEagleDraftWorker,
        DetspecMultiLayerEagleWorkerV2,
    )

    line = WORKER_LOG_FORMAT % ("DETSPEC_EAGLE", DetspecMultiLayerEagleWorkerV2.__name__,
                                DetspecMultiLayerEagleDraftWorker.__name__)
    assert e2e.WORKER_LOG_LINE in line
