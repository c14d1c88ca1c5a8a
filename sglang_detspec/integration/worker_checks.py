"""Checks that a DETSPEC server really runs the DETSPEC sampling code, made when it starts, not at a request.

Two moments:

* :func:`complete_spec_worker` -- the last step of every DETSPEC spec worker's ``__init__`` (single- and multi-layer):
  it makes the target model runner's sampler the token-id-keyed :mod:`.target_sampler`, checks the draft worker is
  the DETSPEC class, and builds every rebound upstream body now (verify, target sampler, the draft sites), so a
  renamed upstream name fails the launch instead of the first request.
* :func:`check_scheduler_workers` -- a ``HookRegistry`` AFTER hook on ``Scheduler.maybe_init_draft_worker`` (same
  name in 0.5.17 - 0.5.23): once the scheduler has built its speculative worker for a DETSPEC algorithm, the worker,
  its draft worker and the target sampler must be the DETSPEC classes. This catches a scheduler that obtained its
  worker some other way than through the registered factory.
"""

from __future__ import annotations

import logging
import pkgutil
from typing import Any, Callable, Iterable

logger = logging.getLogger(__name__)

__all__ = [
    "SCHEDULER_HOOK_TARGET",
    "refuse_global_rng_verify_paths",
    "check_scheduler_workers",
    "complete_spec_worker",
    "hook_active",
    "install_scheduler_check",
    "scheduler_check_active",
]

SCHEDULER_HOOK_TARGET = "sglang.srt.managers.scheduler.Scheduler.maybe_init_draft_worker"


def complete_spec_worker(worker: Any, *, draft_worker_cls: type, upstream_owner: type, build_rebound: Iterable[Callable[[], Any]]) -> None:
    """Finish a DETSPEC spec worker: install the target sampler, check classes, build rebound bodies eagerly."""
    from sglang_detspec.integration import target_sampler, verify

    draft = worker.draft_worker
    if not isinstance(draft, draft_worker_cls):
        raise RuntimeError(
            f"DETSPEC spec worker built a {type(draft).__name__} draft worker, expected {draft_worker_cls.__name__}; "
            "sglang-detspec needs updating for this SGLang version"
        )
    target_sampler.install_detspec_sampler(worker.target_worker.model_runner)
    verify.rebound_verify(upstream_owner)
    verify.detspec_run_eagle_verify()
    verify._rebound_eagle_sample()  # noqa: SLF001 - built here so its name checks run at launch
    for build in build_rebound:
        build()


def refuse_global_rng_verify_paths() -> None:
    """Refuse, first thing in every DETSPEC worker's construction, verify paths that draw from the global RNG.

    ``SGLANG_SIMULATE_ACC_LEN`` (a benchmarking knob read at import into ``spec_utils.SIMULATE_ACC_LEN``) makes
    ``eagle_sample`` overwrite the accept decisions with ``torch.multinomial`` / NumPy draws on every release;
    nothing seeds them, so outputs would again depend on batch composition. (Server-argument resolution refuses
    it too; this catches a scheduler process whose environment differs from the launcher's.)
    """
    from sglang.srt.runtime_context import get_exec
    from sglang.srt.speculative import spec_utils

    simulate = getattr(spec_utils, "SIMULATE_ACC_LEN", -1)
    if simulate is not None and simulate > 0 and get_exec().deterministic.enable_deterministic_inference:
        raise ValueError(
            "DETSPEC speculative decoding is reproducible per seed only without "
            f"SGLANG_SIMULATE_ACC_LEN (set to {simulate}): simulated acceptance draws "
            "from the global RNG. Unset it, or use --speculative-algorithm EAGLE for "
            "acceptance-length simulations."
        )


def _detspec_worker_classes() -> tuple:
    from sglang_detspec.integration.workers import DetspecEAGLEWorkerV2, DetspecMultiLayerEagleWorkerV2

    return DetspecEAGLEWorkerV2, DetspecMultiLayerEagleWorkerV2


def check_scheduler_workers(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook: a DETSPEC scheduler must hold DETSPEC workers (raises otherwise; returns ``result``)."""
    from sglang_detspec.integration.algorithm import DetspecSpecAlgo
    from sglang_detspec.integration.target_sampler import detspec_sampler_class

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
    logger.info(
        "sglang-detspec: %s runs %s with %s and the DETSPEC target sampler.",
        algorithm.name,
        type(spec_worker).__name__,
        type(spec_worker.draft_worker).__name__,
    )
    return result


def install_scheduler_check() -> str:
    """Register :func:`check_scheduler_workers` with ``HookRegistry`` (once per process); return the target."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    registered = HookRegistry._hooks.get(SCHEDULER_HOOK_TARGET, [])  # noqa: SLF001 - no public query
    if not any(hook is check_scheduler_workers for _, hook, _ in registered):
        HookRegistry.register(SCHEDULER_HOOK_TARGET, check_scheduler_workers, HookType.AFTER)
    return SCHEDULER_HOOK_TARGET


def hook_active(target: str, hook: Callable) -> bool:
    """Whether the function at dotted path ``target`` currently runs ``hook`` (a ``HookRegistry`` wrapper chain)."""
    try:
        fn = pkgutil.resolve_name(target)
    except Exception:  # noqa: BLE001 - an unresolvable target has no hook
        return False
    for _ in range(64):
        if fn is None:
            return False
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
    return False


def scheduler_check_active() -> bool:
    """Whether ``Scheduler.maybe_init_draft_worker`` currently runs :func:`check_scheduler_workers`."""
    return hook_active(SCHEDULER_HOOK_TARGET, check_scheduler_workers)
