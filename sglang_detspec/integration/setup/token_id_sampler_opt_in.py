"""Opt-in: the token-id-keyed target sampler on a *non-speculative* server (``SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1``).

Why
---
A DETSPEC speculative worker makes its target model runner sample with the DETSPEC sampler
(:mod:`.target_sampler`), whose seeded noise is keyed by token id on every path. SGLang's own ``Sampler`` keys it
by sorted *rank* as soon as one row of the batch has top-k / top-p / min-p. ``DETSPEC_EAGLE_INVARIANT`` /
``DETSPEC_EAGLE3_INVARIANT`` emit exactly the tokens a non-speculative seeded server would -- a non-speculative
server that keys by token id too. This module is how to start that reference server (for
``sglang-detspec check --against`` and the invariant-mode end-to-end test): the plugin loaded,
``--enable-deterministic-inference``, no ``--speculative-algorithm``, and ``SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1``.

Values: unset, empty or ``0`` = off (upstream's sampler); ``1`` = on; anything else is refused at startup. With ``1``:

* no speculative algorithm, deterministic inference on: the target model runner's sampler becomes the DETSPEC
  sampler (one INFO line);
* a DETSPEC algorithm: nothing to do (its worker installs the same sampler), no error;
* a built-in / other speculative algorithm (``EAGLE``, ``NGRAM``, ...): refused -- its verify samples the
  speculated tokens its own way, so swapping the target sampler would not make it match anything;
* deterministic inference off: refused -- SGLang seeds sampling only in deterministic mode, and the DETSPEC
  sampler changes only the seeded path, so the variable would silently do nothing.

Hook point
----------
A ``HookRegistry`` AROUND hook on ``Scheduler.init_tp_model_worker`` (same name and body shape in 0.5.17 - 0.5.23):
it runs in every scheduler process, builds exactly the *target* ``TpModelWorker`` (draft workers are built later by
``maybe_init_draft_worker``), ``self.spec_algorithm`` is already set, and it returns before the memory pools and CUDA
graphs. The checks run before the original (so a refusal costs no weight loading); the swap after it. The swap
keeps the sampler instance (only its class changes), and SGLang runs the target sampler eagerly, outside any
captured CUDA graph (no graph runner references ``model_runner.sampler``), so a graph captured later needs nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from sglang_detspec.integration.setup.env_switch import env_switch
from sglang_detspec.integration.setup.hooks import hook_active, register_once

logger = logging.getLogger(__name__)

__all__ = [
    "TARGET_WORKER_HOOK_TARGET",
    "TOKEN_ID_SAMPLER_ENV",
    "around_init_tp_model_worker",
    "check_opt_in",
    "install_token_id_sampler_opt_in",
    "token_id_sampler_opt_in_active",
    "token_id_sampler_requested",
]

TOKEN_ID_SAMPLER_ENV = "SGLANG_DETSPEC_TOKEN_ID_SAMPLER"
TARGET_WORKER_HOOK_TARGET = "sglang.srt.managers.scheduler.Scheduler.init_tp_model_worker"


def token_id_sampler_requested(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``SGLANG_DETSPEC_TOKEN_ID_SAMPLER`` asks for the token-id sampler (read by :func:`.env_switch`: a typo
    read as off would give a reference server that silently keys by rank, so it is refused)."""
    return env_switch(TOKEN_ID_SAMPLER_ENV, "token_id_sampler_value", environ)


def check_opt_in(spec_algorithm: Any, deterministic: bool) -> bool:
    """With the variable set to 1: True when this scheduler must install the sampler itself, False when a DETSPEC
    algorithm's worker already does; raises ``DetspecConfigError`` for a server it cannot serve."""
    from sglang_detspec.integration.setup.algorithm import DetspecSpecAlgo
    from sglang_detspec.integration.setup.refusals import refuse

    if isinstance(spec_algorithm, DetspecSpecAlgo):
        return False
    if spec_algorithm is not None and not spec_algorithm.is_none():
        raise refuse("token_id_sampler_algorithm", None, algorithm=getattr(spec_algorithm, "name", spec_algorithm))
    if not deterministic:
        raise refuse("token_id_sampler_nondeterministic", None)
    return True


def _deterministic_inference() -> bool:
    # What SGLang's own Sampler reads in its constructor (the same accessor on 0.5.17 - 0.5.23).
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().deterministic.enable_deterministic_inference)


def _install_on_target_worker(tp_worker: Any) -> None:
    from sglang.srt.layers.sampler import Sampler

    from sglang_detspec.integration.sampling.target_sampler import detspec_sampler_class, install_detspec_sampler

    model_runner = getattr(tp_worker, "model_runner", None)
    sampler = getattr(model_runner, "sampler", None)
    # install_detspec_sampler refuses these too, but in words about DETSPEC algorithms; say what to change here.
    if type(sampler) is not Sampler and not isinstance(sampler, detspec_sampler_class()):
        raise RuntimeError(
            f"{TOKEN_ID_SAMPLER_ENV}=1 needs SGLang's own Sampler on the target model runner, found "
            f"{type(sampler).__name__} (a sampler backend registered with register_sampler_backend, or a worker "
            f"without a torch Sampler such as MLX). Unset {TOKEN_ID_SAMPLER_ENV} on this server."
        )
    install_detspec_sampler(model_runner)
    logger.info(
        "sglang-detspec: %s=1: the target model runner samples with %s (seeded noise keyed by token id on every "
        "path), the non-speculative reference for DETSPEC_*_INVARIANT servers.",
        TOKEN_ID_SAMPLER_ENV,
        type(model_runner.sampler).__name__,
    )


def around_init_tp_model_worker(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """``HookRegistry`` AROUND hook on ``Scheduler.init_tp_model_worker`` (see the module docstring)."""
    if not token_id_sampler_requested():
        return original(scheduler, *args, **kwargs)
    install = check_opt_in(getattr(scheduler, "spec_algorithm", None), _deterministic_inference())
    result = original(scheduler, *args, **kwargs)
    if install:
        _install_on_target_worker(scheduler.tp_worker)
    else:
        logger.debug("%s=1 on a DETSPEC server: its speculative worker installs the token-id sampler itself.",
                     TOKEN_ID_SAMPLER_ENV)
    return result


def install_token_id_sampler_opt_in() -> str:
    """Register :func:`around_init_tp_model_worker` with ``HookRegistry`` (once per process); return the target.

    Registered unconditionally: the variable is read when a scheduler builds its target worker, not at import.
    """
    return register_once(TARGET_WORKER_HOOK_TARGET, around_init_tp_model_worker, "AROUND")


def token_id_sampler_opt_in_active() -> bool:
    """Whether ``Scheduler.init_tp_model_worker`` currently runs :func:`around_init_tp_model_worker`."""
    return hook_active(TARGET_WORKER_HOOK_TARGET, around_init_tp_model_worker)
