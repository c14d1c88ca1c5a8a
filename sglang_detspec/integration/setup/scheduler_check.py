"""The scheduler-side launch check: a DETSPEC scheduler must hold the DETSPEC worker, draft worker and sampler.

:func:`check_scheduler_workers` is a ``HookRegistry`` AFTER hook on ``Scheduler.maybe_init_draft_worker`` (same name in
0.5.17 - 0.5.23): once the scheduler has built its speculative worker for a DETSPEC algorithm, the worker, its draft
worker and the target sampler must be the DETSPEC classes. This catches a scheduler that obtained its worker some
other way than through the registered factory (e.g. another plugin overriding it). The worker's own checks while it
is built are :mod:`.worker_checks`.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_detspec.integration.setup.hooks import hook_active, register_once

logger = logging.getLogger(__name__)

__all__ = ["SCHEDULER_HOOK_TARGET", "WORKER_LOG_FORMAT", "check_scheduler_workers", "install_scheduler_check",
           "scheduler_check_active"]

SCHEDULER_HOOK_TARGET = "sglang.srt.managers.scheduler.Scheduler.maybe_init_draft_worker"

#: The start-up line that names the worker, the draft worker and the sampler the scheduler built (E2E tests look for it).
WORKER_LOG_FORMAT = ("sglang-detspec: %s runs %s with %s and the DETSPEC target sampler; retracted requests replay "
                     "from their prompts.")


def _detspec_worker_classes() -> tuple:
    from sglang_detspec.integration.workers.spec_workers import DetspecEAGLEWorkerV2, DetspecMultiLayerEagleWorkerV2

    return DetspecEAGLEWorkerV2, DetspecMultiLayerEagleWorkerV2


def check_scheduler_workers(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook: a DETSPEC scheduler must hold DETSPEC workers (raises otherwise; returns ``result``)."""
    from sglang_detspec.integration.sampling.target_sampler import detspec_sampler_class
    from sglang_detspec.integration.setup.algorithm import DetspecSpecAlgo

    algorithm = getattr(scheduler, "spec_algorithm", None)
    if not isinstance(algorithm, DetspecSpecAlgo):
        return result
    spec_worker = getattr(scheduler, "draft_worker", None)
    if spec_worker is None:
        # Pipeline-parallel stages other than the last build no draft worker (upstream's design).
        return result
    if not isinstance(spec_worker, _detspec_worker_classes()):
        raise RuntimeError(
            f"--speculative-algorithm {algorithm.name}: the scheduler built a {type(spec_worker).__name__}, not a "
            "DETSPEC worker, so its sampling would not be reproducible. Is another plugin overriding the "
            "speculative worker factory? (SGLANG_PLUGINS=detspec loads only this plugin.)"
        )
    sampler = getattr(getattr(spec_worker.target_worker, "model_runner", None), "sampler", None)
    if not isinstance(sampler, detspec_sampler_class()):
        raise RuntimeError(
            f"--speculative-algorithm {algorithm.name}: the target model runner samples with "
            f"{type(sampler).__name__}, not the DETSPEC sampler; sglang-detspec needs updating for this SGLang version"
        )
    from sglang_detspec.integration.setup.retraction import enable_replay

    enable_replay()  # this scheduler's retracted requests replay from their prompts (see .retraction)
    logger.info(
        WORKER_LOG_FORMAT,
        algorithm.name,
        type(spec_worker).__name__,
        type(spec_worker.draft_worker).__name__,
    )
    return result


def install_scheduler_check() -> str:
    """Register :func:`check_scheduler_workers` with ``HookRegistry`` (once per process); return the target."""
    return register_once(SCHEDULER_HOOK_TARGET, check_scheduler_workers, "AFTER")


def scheduler_check_active() -> bool:
    """Whether ``Scheduler.maybe_init_draft_worker`` currently runs :func:`check_scheduler_workers`."""
    return hook_active(SCHEDULER_HOOK_TARGET, check_scheduler_workers)
