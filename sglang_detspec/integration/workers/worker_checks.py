"""Checks a DETSPEC spec worker makes on itself while it is built, so a server fails at launch, not at a request.

* :func:`refuse_global_rng_verify_paths` -- first thing in every DETSPEC worker's ``__init__``.
* :func:`complete_spec_worker` -- the last step of every DETSPEC spec worker's ``__init__`` (single- and multi-layer):
  it makes the target model runner's sampler the token-id-keyed :mod:`.target_sampler`, checks the draft worker is
  the DETSPEC class, and builds every rebound upstream body now (verify, target sampler, the draft sites), so a
  renamed upstream name fails the launch instead of the first request.

The check from the scheduler's side, once it holds its worker, is :mod:`.scheduler_check` (it imports the worker
classes, which import this module: kept apart so the two never import each other).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["complete_spec_worker", "refuse_global_rng_verify_paths"]


def complete_spec_worker(worker: Any, *, draft_worker_cls: type, upstream_owner: type, build_rebound: Iterable[Callable[[], Any]]) -> None:
    """Finish a DETSPEC spec worker: install the target sampler, check classes, build rebound bodies eagerly."""
    from sglang_detspec.integration.sampling import target_sampler, verify

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
