"""The ``sglang.srt.plugins`` entry point: ``detspec = sglang_detspec.plugin:load_plugin``.

SGLang's ``load_plugins()`` runs :func:`load_plugin` in every process it starts a server from
(``sglang serve``, ``python -m sglang.launch_server``, ``sglang.Engine``) and again in every spawned
scheduler, DP-controller and detokenizer process. It registers

* the speculative algorithms ``DETSPEC_EAGLE`` and ``DETSPEC_EAGLE3``
  (:mod:`sglang_detspec.integration.setup.algorithm`), and
* the server-argument resolution hook (:mod:`sglang_detspec.integration.setup.server_args`),
* per-request checks that answer a malformed request with HTTP 400 instead of letting it reach (and kill) the
  scheduler (:mod:`sglang_detspec.integration.setup.request_validation`),
* per-choice seeds for ``n > 1`` on DETSPEC servers (:mod:`sglang_detspec.integration.setup.parallel_sampling`),
* replay from the prompt for retracted requests on DETSPEC schedulers (:mod:`sglang_detspec.integration.setup.retraction`),
* a scheduler start-up check that a DETSPEC algorithm really got the DETSPEC workers and target sampler
  (:mod:`sglang_detspec.integration.setup.scheduler_check`),
* the opt-in token-id-keyed target sampler for non-speculative deterministic servers,
  ``SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1`` (:mod:`sglang_detspec.integration.setup.token_id_sampler_opt_in`),
* the plugin's batch-invariant GEMM and residual RMSNorm in SGLang's deterministic mode, with a start-up self-check
  (:mod:`sglang_detspec.integration.setup.batch_invariant_ops`; ``SGLANG_DETSPEC_OPS`` chooses where),

and checks both. SGLang's loader only *logs* an exception raised by a plugin and carries on, so this function
logs an error itself before re-raising; and because a plugin's hooks are applied by the loader *after* the
plugin returns, the registered algorithms refuse to be configured (with an explanation) if SGLang ever
resolves a DETSPEC name without the hook.

Importing this module checks the installed SGLang release (0.5.17 to 0.5.23) and raises
:class:`~sglang_detspec.integration.compat.UnsupportedSGLangVersion` outside that range.
"""

from __future__ import annotations

import logging
from typing import Dict

from sglang_detspec.algorithm_names import DETSPEC_ALGORITHMS
from sglang_detspec.integration import compat

logger = logging.getLogger(__name__)

__all__ = ["load_plugin", "plugin_status"]

SGLANG_VERSION = compat.check_sglang_version(required=True)


def _inside_sglang_loader() -> bool:
    """True while SGLang's ``load_plugins`` is running plugin functions (it applies hooks afterwards)."""
    try:
        from sglang.srt.plugins.hook_registry import _current_plugin_source
    except ImportError:  # pragma: no cover - both supported releases have it
        return False
    return _current_plugin_source.get() is not None


def load_plugin() -> Dict[str, object]:
    """Register the DETSPEC algorithms and the resolution hook; idempotent within a process.

    Returns :func:`plugin_status`. Raises (after logging) if registration or its self-check fails.
    """
    try:
        from sglang_detspec.integration.setup import (
            algorithm,
            attention_index_cache,
            batch_invariant_ops,
            decode_order_verify_switch,
            parallel_sampling,
            request_validation,
            retraction,
            scheduler_check,
            server_args,
            split_kv_draft_extend_switch,
            split_kv_verify_switch,
            token_id_sampler_opt_in,
            verify_coins_switch,
        )

        algorithm.register_algorithms()
        server_args.install_resolution_hook()
        request_validation.install_request_validation()
        parallel_sampling.install_parallel_sampling_seeds()
        retraction.install_retraction_replay()
        scheduler_check.install_scheduler_check()
        token_id_sampler_opt_in.install_token_id_sampler_opt_in()
        batch_invariant_ops.install_batch_invariant_ops()
        attention_index_cache.install_attention_index_cache()
        verify_coins_switch.verify_coins_kernel_wanted()  # refuse a bad value now, not at the first verify
        decode_order_verify_switch.decode_order_verify_wanted()  # likewise, not when the spec worker starts
        split_kv_verify_switch.split_kv_verify_setting()  # likewise (and refuses 1 beside the decode-order verify)
        split_kv_draft_extend_switch.split_kv_draft_extend_wanted()  # likewise
        if not _inside_sglang_loader():
            # Called directly (a test, a notebook, an embedding application): nobody will apply the hook for
            # us. Targets that are already patched are skipped by apply_hooks, so this is idempotent.
            from sglang.srt.plugins.hook_registry import HookRegistry

            HookRegistry.apply_hooks()
            if not server_args.resolution_hook_active():
                raise RuntimeError(
                    "the server-argument resolution hook on "
                    f"{compat.resolution_entry_target()} could not be applied (see the HookRegistry error above)"
                )
            if not scheduler_check.scheduler_check_active():
                raise RuntimeError(
                    f"the scheduler start-up check on {scheduler_check.SCHEDULER_HOOK_TARGET} could not be applied "
                    "(see the HookRegistry error above)"
                )
            if not retraction.retraction_replay_active():
                raise RuntimeError(
                    "the retraction replay hooks on "
                    f"{' and '.join(retraction.retraction_replay_targets())} could not be applied "
                    "(see the HookRegistry error above)"
                )
            if not request_validation.request_validation_active():
                raise RuntimeError(
                    "the request checks on "
                    f"{', '.join(request_validation.REQUEST_VALIDATION_TARGETS)} could not be applied "
                    "(see the HookRegistry error above)"
                )
            if not token_id_sampler_opt_in.token_id_sampler_opt_in_active():
                raise RuntimeError(
                    "the token-id sampler opt-in hook on "
                    f"{token_id_sampler_opt_in.TARGET_WORKER_HOOK_TARGET} could not be applied "
                    "(see the HookRegistry error above)"
                )
            if not batch_invariant_ops.batch_invariant_ops_hooks_active():
                raise RuntimeError(
                    f"the batch-invariant op hooks on {batch_invariant_ops.MATMUL_HOOK_TARGET}, "
                    f"{batch_invariant_ops.RMS_NORM_HOOK_TARGET} and {batch_invariant_ops.ENABLE_HOOK_TARGET} could "
                    "not be applied (see the HookRegistry error above)"
                )
            if not attention_index_cache.attention_index_cache_hooks_active():
                raise RuntimeError(
                    f"the attention index cache hook on {attention_index_cache.FORWARD_EXTEND_UNIFIED_TARGET} could not "
                    "be applied (see the HookRegistry error above)"
                )
        algorithm.verify_registration()
    except Exception:
        logger.error(
            "sglang-detspec: plugin registration FAILED; --speculative-algorithm DETSPEC_EAGLE / DETSPEC_EAGLE3 "
            "will not work in this process.",
            exc_info=True,
        )
        raise
    status = plugin_status()
    logger.info(
        "sglang-detspec: registered %s for sglang %s (resolution hook on %s).",
        ", ".join(status["algorithms"]),
        status["sglang_version"],
        status["resolution_target"],
    )
    return status


def plugin_status() -> Dict[str, object]:
    """What this process has registered (used by ``load_plugin``, the CLI and tests)."""
    from sglang_detspec.integration.setup import (
        algorithm,
        attention_index_cache,
        batch_invariant_ops,
        request_validation,
        retraction,
        scheduler_check,
        server_args,
        token_id_sampler_opt_in,
    )

    return {
        "sglang_version": compat.installed_sglang_version(),
        "algorithms": [name for name in DETSPEC_ALGORITHMS if algorithm.lookup(name) is not None],
        "resolution_target": compat.resolution_entry_target(),
        "resolution_hook_active": server_args.resolution_hook_active(),
        "scheduler_check_active": scheduler_check.scheduler_check_active(),
        "retraction_replay_active": retraction.retraction_replay_active(),
        "token_id_sampler_hook_active": token_id_sampler_opt_in.token_id_sampler_opt_in_active(),
        "batch_invariant_ops_hooks_active": batch_invariant_ops.batch_invariant_ops_hooks_active(),
        "attention_index_cache_hooks_active": attention_index_cache.attention_index_cache_hooks_active(),
        "request_validation_active": request_validation.request_validation_active(),
    }
