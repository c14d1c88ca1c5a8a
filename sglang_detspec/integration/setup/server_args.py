"""Server-argument handling for ``--speculative-algorithm DETSPEC_EAGLE | DETSPEC_EAGLE3``.

What the plugin does at startup
===============================

SGLang resolves server arguments once, in the launcher process, and hands the resolved record to every
scheduler. The plugin wraps that one resolution (``HookRegistry`` AROUND hook on
``arg_groups.pipeline.run_resolution_pipeline`` on 0.5.23, on ``ServerArgs.__post_init__`` on 0.5.17; see
:mod:`~sglang_detspec.integration.compat`). For a DETSPEC name it:

1. refuses flags that cannot give reproducible output (see "Refused flags"), naming the flag and what to do;
2. fills the linear-chain defaults: ``--speculative-eagle-topk 1``; ``--speculative-num-steps 3`` unless
   given (``--speculative-num-draft-tokens - 1`` if only that is given);
   ``--speculative-num-draft-tokens = steps + 1`` (a value given off the chain is refused in step 1);
3. runs SGLang's *own* resolution with the algorithm name set to the builtin twin (``EAGLE`` /
   ``EAGLE3``) and rejection sampling off, so every resolution step behaves exactly as for upstream EAGLE:
   ``_handle_eagle_family`` (``--max-running-requests`` default 48, draft path = model path for DeepSeek-
   style MTP checkpoints, topk/page/backend checks, overlap off on CPU), NEXTN/EAGLE aliasing, the
   model overrides that switch on multi-layer EAGLE (MiMo-V2, Step-3.5, GigaChat-3.5), the DeepSeek-V4 /
   KV-sharding / unified-memory / LoRA / pipeline-parallel checks that accept only the EAGLE names, etc.
   Rejection sampling is off during this run because 0.5.17 refuses rejection sampling together with
   ``--enable-deterministic-inference`` (its sampler was not seeded); the equivalent checks are step 4;
4. checks the resolved result (CUDA device, deterministic inference on, topk 1, draft tokens = steps + 1,
   a draft model, same draft/target vocabulary, the name still the twin -- not promoted to FROZEN_KV_MTP);
5. sets the algorithm name back to ``DETSPEC_*`` and ``--speculative-use-rejection-sampling`` on. The
   resolved name is what the scheduler passes to ``SpeculativeAlgorithm.from_string``, which returns the
   registered DETSPEC algorithm and its workers.

``--speculative-use-rejection-sampling`` need not be passed; it is always on.

Refused flags
=============

Each refusal raises :class:`~.refusals.DetspecConfigError` (a ``ValueError``) at startup, before any model loads,
naming the flag and the fix. The refusals, with their reasons and fixes, are one table: :data:`.refusals.REFUSALS`;
README.md's "Flags it refuses at startup" explains them (``tests/unit/integration/setup/test_refusal_table.py`` checks that the two
name the same flags).

Not refused, documented instead (checked against the 0.5.17 and 0.5.23 sources):

* overlap scheduling: allowed. Every sampling key is built from per-request device tensors (seed,
  ``seq_lens`` / positions) on the stream, so the CPU lag of the overlap scheduler cannot shift it.
* DP attention, TP > 1, two-batch overlap, pipeline parallelism: allowed where upstream allows them for
  EAGLE; batch invariance of the model forward is upstream deterministic mode's job. Only TP=1 without
  these is exercised by this project's tests.
* ``n > 1``: choice i of a seeded request samples with ``choice_seed(seed, i)`` (choice 0 keeps the seed;
  :mod:`sglang_detspec.stream.choice_seeds`, installed by :mod:`.parallel_sampling`); upstream's one seed for all n
  with ``SGLANG_DETSPEC_SAME_SEED_FOR_N=1`` or ``custom_params={"detspec_same_seed_for_n": true}``.
* retraction under memory pressure: replayed (:mod:`.retraction`). A retracted request restarts from its prompt
  and regenerates its tokens, each checked against what was already sent and withheld from the client until it is
  past that point; a mismatch aborts the request with a message naming the token. Grammar-constrained requests
  are not rewound (their grammar state cannot be) and warn once.
* multi-layer EAGLE: chosen exactly as upstream chooses it (``--enable-multi-layer-eagle`` or a model
  override), with chunked prefill and the radix cache off (refused otherwise); the multi-layer worker owns its
  numerics caveats.

Where SGLang compares the algorithm *name* (not ``is_eagle()``)
=================================================================

About 25 places compare ``speculative_algorithm`` to the strings ``"EAGLE"`` / ``"EAGLE3"``. How each one
sees a DETSPEC algorithm:

*During resolution* the name is the twin, so all of these behave exactly as for upstream EAGLE / EAGLE3
(0.5.23 file:line; 0.5.17 has a subset):

* ``arg_groups/speculative_hook.py`` -- NEXTN/EAGLE alias and Gemma-4 promotion (:109), PD-decode radix
  cache (:167), block verification (:176, :188), draft window (:213), DP spec-prefill coordination
  (:254), the rejection-sampling gate (:1215; bypassed on purpose, see step 3), HIP auto-RS (:56);
  0.5.17 also ``--speculative-skip-dp-mlp-sync`` (:133);
* ``speculative/adaptive_spec_params.py:61`` (adaptive; refused anyway);
* ``arg_groups/overrides.py:346`` Step-3.5 / ``model_overrides/mimo_v2.py:23`` /
  ``model_overrides/gigachat35.py:18`` -- switch on multi-layer EAGLE (0.5.17: ``overrides.py:680, 1381``);
  ``overrides.py:858`` HIP DeepSeek draft MoE backend;
* ``arg_groups/deepseek_v4_hook.py:149-155`` (DeepSeek-V4 accepts EAGLE only);
* ``arg_groups/kv_shard_hook.py:109``, ``arg_groups/kv_cache_hook.py:160, 588-679`` (SM100 NVFP4 KV,
  unified memory pool), ``arg_groups/validation_hook.py:90`` (watermark), ``:133`` (pipeline
  parallelism), ``:694-730`` (aux hidden-state capture), ``arg_groups/lora_hook.py:252``,
  ``arg_groups/cp_tp_group_sharing_hook.py:59``, ``model_overrides/iquest_q1.py:25``,
  ``model_overrides/nemotron_h.py:137-144``, ``kernel_plugins/amd/binding.py:108``;
  0.5.17 ``server_args.py:8929`` (LoRA only with NGRAM).

*After startup* (in the scheduler, reading the published name ``DETSPEC_*``):

* ``layers/attention/attention_registry.py:63`` (0.5.17 :52) -- creates ``plan_stream_for_flashinfer``
  for EAGLE + FlashInfer; nothing reads that attribute in either release: no effect.
* ``layers/layer_boundary/adapters/attention.py:90`` (0.5.17 ``layers/communicator.py:281``) -- disables
  attention-TP input scattering for EAGLE3: covered by refusing ``--enable-attn-tp-input-scattered`` with
  ``DETSPEC_EAGLE3``.
* ``lora/utils.py:20`` -- a warning about LoRA adapters on embeddings: cosmetic.
* ``managers/scheduler_components/metrics_reporter.py:62`` (``spec_algorithm in (EAGLE, EAGLE3, ...)``,
  enum identity) -- forward-pass metrics snapshot only with ``enable_fpm``: metrics only.
* ``mem_cache/page_interleave.py:264``, ``mem_cache/kv_cache_configurator.py:1938`` (``!= EAGLE``, enum
  identity) -- KV-cache sharding's MTP scratch / shared draft pool; raise a clear upstream error with
  ``--enable-kv-cache-sharding`` (PD-prefill only, GLM-DSA MTP only): unsupported, not silently wrong.
* ``speculative/eagle_worker_v2.py:503, 620`` pass ``algorithm.name`` to out-of-tree platform runners:
  out-of-tree platforms are refused.

Everything else asks the algorithm object (``is_eagle()``, ``is_eagle3()``, ``need_topk()``, ...), which
the registered class answers like the twin (:mod:`~sglang_detspec.integration.setup.algorithm`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from sglang_detspec.algorithm_names import DETSPEC_TWINS
from sglang_detspec.integration import compat
from sglang_detspec.integration.sampling import scheme
from sglang_detspec.integration.setup import split_kv_verify_switch
from sglang_detspec.integration.setup.refusals import refuse

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_NUM_STEPS",
    "around_resolution",
    "RETIRED_REDUCED_VOCAB_ENV",
    "check_draft_vocab",
    "install_resolution_hook",
    "requested_detspec_algorithm",
    "resolution_hook_active",
    "warn_retired_reduced_vocab_env",
]

#: Draft steps when neither --speculative-num-steps nor --speculative-num-draft-tokens is given: upstream's
#: own choice for every topk-1 configuration (``_auto_choose_speculative_params`` returns (3, 1, 4)).
DEFAULT_NUM_STEPS = 3

#: A retired opt-in: reduced-vocabulary drafts are served without it. Set, it changes nothing; the launcher warns once
#: (:func:`warn_retired_reduced_vocab_env`) so a deployment that still sets it learns it may drop it.
RETIRED_REDUCED_VOCAB_ENV = "SGLANG_DETSPEC_REDUCED_VOCAB"


def requested_detspec_algorithm(server_args: Any) -> Optional[str]:
    """``"DETSPEC_EAGLE"`` / ``"DETSPEC_EAGLE3"`` when the user asked for one (any case), else None."""
    raw = compat.read_field(server_args, "speculative_algorithm", None)
    if raw is None:
        return None
    name = str(raw).strip().upper()
    return name if name in DETSPEC_TWINS else None


def _flag(server_args: Any, field: str, default: Any = None) -> Any:
    return compat.read_field(server_args, field, default)


def _refuse_unsupported_inputs(server_args: Any, name: str) -> None:
    """Refusals that depend only on what the user passed (run before SGLang resolves anything)."""
    if not _flag(server_args, "enable_deterministic_inference", False) and _flag(server_args, "rl_on_policy_target") is None:
        raise refuse("deterministic_inference", name)
    device = _flag(server_args, "device")
    if device is not None and not str(device).startswith("cuda"):
        raise refuse("device", name, device=device)
    _refuse_non_nvidia(server_args, name)
    topk = _flag(server_args, "speculative_eagle_topk")
    if topk is not None and int(topk) != 1:
        raise refuse("topk", name, topk=topk)
    steps, tokens = _flag(server_args, "speculative_num_steps"), _flag(server_args, "speculative_num_draft_tokens")
    chain_steps = int(steps) if steps is not None else int(tokens) - 1 if tokens is not None else None
    if tokens is not None and (chain_steps < 1 or int(tokens) != chain_steps + 1):
        # SGLang's own resolution would reset it to steps + 1 with a log line; an explicit flag is not rewritten.
        given = f" and --speculative-num-steps {steps}" if steps is not None else ""
        raise refuse("num_draft_tokens", name, tokens=tokens, given=given)
    if _flag(server_args, "speculative_adaptive", False):
        raise refuse("adaptive", name)
    if _flag(server_args, "enable_mixed_chunk", False):
        raise refuse("mixed_chunk", name)
    for field in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        value = _flag(server_args, field, 1.0)
        if value is not None and float(value) != 1.0:
            raise refuse("accept_threshold", name, field=field.replace("_", "-"), value=value)
    token_map = _flag(server_args, "speculative_token_map")
    if token_map is not None and DETSPEC_TWINS[name] == "EAGLE3":
        # Upstream's EAGLE3 worker ignores the flag (first: under DETSPEC_EAGLE3_INVARIANT too, the map is ignored
        # rather than raced, so the invariant refusal's reason would not apply).
        raise refuse("token_map_eagle3", name, token_map=token_map)
    if token_map is not None and scheme.scheme_for_algorithm(name) == scheme.COUPLED:
        # A token map is a reduced draft vocabulary (SGLang slices the draft's LM head to the hot ids), served by
        # DETSPEC_EAGLE through the same hot-vocabulary path as an EAGLE3 d2t map (the draft worker runs
        # check_draft_vocab); the invariant mode's race over it has never run on a GPU.
        raise refuse("token_map_invariant", name, token_map=token_map)
    split_kv_verify = split_kv_verify_switch.split_kv_verify_setting()
    if scheme.scheme_for_algorithm(name) == scheme.COUPLED and split_kv_verify == split_kv_verify_switch.ON:
        raise refuse("split_kv_verify_invariant", name, rejection_name=name[: -len(scheme.INVARIANT_SUFFIX)])
    if _flag(server_args, "speculative_use_block_verification", False):
        raise refuse("block_verification", name)
    if _flag(server_args, "enable_watermark", False):
        raise refuse("watermark", name)
    if _flag(server_args, "enable_return_aux_hidden_states", False):
        raise refuse("aux_hidden_states", name)
    mode = _flag(server_args, "disaggregation_mode", "null")
    if mode not in (None, "null"):
        if compat.pd_decode_first_proposal_is_one_hot():
            raise refuse("disaggregation_one_hot_first_draft", name, mode=mode)
        raise refuse("disaggregation_no_draft_probs", name, mode=mode)
    simulate = _simulated_acceptance_length()
    if simulate > 0:
        raise refuse("simulated_acceptance", name, simulate=simulate)
    if DETSPEC_TWINS[name] == "EAGLE3" and _flag(server_args, "enable_attn_tp_input_scattered", False):
        raise refuse("attn_tp_input_scattered", name)
    if _flag(server_args, "enable_memory_saver", False) and not (
            _flag(server_args, "enable_draft_weights_cpu_backup", False)
            or _flag(server_args, "enable_weights_cpu_backup", False)):
        raise refuse("memory_saver_draft_weights", name)


def _simulated_acceptance_length() -> float:
    """``SGLANG_SIMULATE_ACC_LEN`` parsed as ``spec_utils`` parses it (``envs``; off when <= 0)."""
    from sglang.srt.environ import envs

    return float(envs.SGLANG_SIMULATE_ACC_LEN.get())


def torch_is_rocm() -> bool:
    """ROCm builds of torch report ``device == "cuda"`` too; this tells them apart."""
    import torch

    return getattr(torch.version, "hip", None) is not None


def platform_is_out_of_tree() -> bool:
    """An out-of-tree hardware platform plugin is active (every supported release exposes ``current_platform``)."""
    try:
        from sglang.srt.platforms import current_platform
    except ImportError:  # pragma: no cover - every supported release has it
        return False
    probe = getattr(current_platform, "is_out_of_tree", None)
    return bool(probe()) if callable(probe) else False


def _refuse_non_nvidia(server_args: Any, name: str) -> None:
    if torch_is_rocm():
        raise refuse("rocm", name)
    if platform_is_out_of_tree():
        raise refuse("out_of_tree_platform", name)


def _chain_defaults(server_args: Any) -> dict:
    """The linear-chain defaults (topk 1, steps, steps + 1 draft tokens) for the fields the user left unset."""
    out = {}
    topk = _flag(server_args, "speculative_eagle_topk")
    steps = _flag(server_args, "speculative_num_steps")
    tokens = _flag(server_args, "speculative_num_draft_tokens")
    if topk is None:
        out["speculative_eagle_topk"] = 1
    if steps is None:
        # Upstream asserts topk and draft tokens are unset when steps is; derive steps from draft tokens.
        steps = int(tokens) - 1 if tokens is not None and int(tokens) >= 2 else DEFAULT_NUM_STEPS
        out["speculative_num_steps"] = steps
    if tokens is None:
        out["speculative_num_draft_tokens"] = int(steps) + 1
    return out


def warn_retired_reduced_vocab_env() -> None:
    """Warn (once per resolution, in the launcher) when :data:`RETIRED_REDUCED_VOCAB_ENV` is set to anything: it no
    longer changes what is served or refused."""
    if RETIRED_REDUCED_VOCAB_ENV in os.environ:
        logger.warning("%s is set but no longer needed and has no effect: reduced-vocabulary drafts are served without "
                       "it. Unset it.", RETIRED_REDUCED_VOCAB_ENV)


def check_draft_vocab(
    name: str,
    draft_vocab_size: Optional[int],
    target_vocab_size: Optional[int],
    *,
    multi_layer: bool = False,
    reduced: Optional[bool] = None,
    token_map: bool = False,
) -> None:
    """Refuse a reduced-vocabulary draft unless DETSPEC can serve it (also called by the draft worker at init).

    ``reduced``: whether the draft maps its vocabulary into the target's (a hot-token map: an EAGLE3 ``d2t`` or
    ``--speculative-token-map``); by default, whether the sizes differ. ``token_map``: the map is a
    ``--speculative-token-map`` (what an EAGLE-twin worker's hot map always is). Served, with an info line:

    * an EAGLE3 draft's ``d2t`` map under DETSPEC_EAGLE3 and DETSPEC_EAGLE3_INVARIANT;
    * a token map under DETSPEC_EAGLE.

    Each was verified on an H100 (one output per seed, graphs on == off; lossless at N = 10,000 for the
    rejection-sampling paths, the invariant mode equal to the non-speculative reference over 100 seeds). Refused:
    any reduced draft with multi-layer EAGLE (SGLang's multi-layer worker has no hot map), a token map under an
    ``_INVARIANT`` algorithm (never run on a GPU), and under the EAGLE twin a reduced draft that is not a token map
    (a config's own ``draft_vocab_size``, which only the EAGLE3 twins map).
    """
    if draft_vocab_size is None or target_vocab_size is None:
        return
    if reduced is None:
        reduced = int(draft_vocab_size) != int(target_vocab_size)
    if not reduced:
        return
    sizes = {"draft_vocab_size": draft_vocab_size, "target_vocab_size": target_vocab_size}
    if multi_layer:
        raise refuse("draft_vocab_multi_layer", name, **sizes)
    invariant = scheme.scheme_for_algorithm(name) == scheme.COUPLED
    twin = DETSPEC_TWINS.get(name)
    if twin == "EAGLE3":
        how = ("each draft column raced under its target id's noise" if invariant
               else "the verify reading q through the hot-token map")
        _log_served(name, draft_vocab_size, target_vocab_size, f"the EAGLE3 draft's hot-token map, {how}")
        return
    if invariant:
        raise refuse("draft_vocab_invariant", name, **sizes)
    if not token_map:
        raise refuse("draft_vocab", name, **sizes)
    _log_served(name, draft_vocab_size, target_vocab_size,
                "the --speculative-token-map, the verify reading q through it")


def _log_served(name: str, draft_vocab_size: int, target_vocab_size: int, how: str) -> None:
    logger.info("sglang-detspec: %s: serving a reduced-vocabulary draft (%s of %s target tokens): proposals keyed by "
                "target id through %s.", name, draft_vocab_size, target_vocab_size, how)


def _check_resolved(server_args: Any, name: str, twin: str) -> None:
    """Refusals that need the resolved configuration (run after SGLang's resolution)."""
    algo = _flag(server_args, "speculative_algorithm")
    if algo != twin:
        raise refuse("resolved_algorithm", name, algorithm=algo)
    if not _flag(server_args, "enable_deterministic_inference", False):
        raise refuse("resolved_deterministic_inference", name)
    device = _flag(server_args, "device")
    if not str(device).startswith("cuda"):
        raise refuse("resolved_device", name, device=device)
    _refuse_non_nvidia(server_args, name)
    topk = _flag(server_args, "speculative_eagle_topk")
    if topk != 1:
        raise refuse("resolved_topk", name, topk=topk)
    steps = _flag(server_args, "speculative_num_steps")
    tokens = _flag(server_args, "speculative_num_draft_tokens")
    if steps is None or tokens != steps + 1:
        raise refuse("resolved_chain_length", name, steps=steps, tokens=tokens)
    if _flag(server_args, "speculative_adaptive", False):
        raise refuse("resolved_adaptive", name)
    if _flag(server_args, "enable_mixed_chunk", False):
        # The user did not ask for it (that is refused earlier): some default switched it on. Upstream turns
        # it off for algorithms without mixed-chunk support, and so do we.
        logger.warning("%s: disabling mixed chunked prefill (not reproducible with speculative decoding).", name)
        compat.write_fields(server_args, "detspec.no_mixed_chunk", enable_mixed_chunk=False)
    draft_path = _flag(server_args, "speculative_draft_model_path")
    if draft_path is None:
        raise refuse("no_draft_model", name)
    token_map = _flag(server_args, "speculative_token_map")
    if token_map is not None and compat.multi_layer_eagle_enabled(server_args):
        # SGLang's multi-layer draft worker never loads the token map: the draft would silently score the full
        # vocabulary the user asked to reduce.
        raise refuse("token_map_multi_layer", name, token_map=token_map)
    _check_draft_vocab_from_configs(server_args, name, draft_path)


def _refuse_chunked_prefill(server_args: Any, name: str, requested: Optional[int]) -> None:
    """Refuse a resolved ``--chunked-prefill-size`` that cannot serve every prompt reproducibly.

    ``requested`` is what the user passed (None: SGLang chose the size from the GPU's memory). The resolved
    size is per DP-attention rank: resolution divides it by the rank count, and the scheduler uses it as is.
    """
    chunk = _flag(server_args, "chunked_prefill_size")
    if chunk is None or int(chunk) <= 0:
        return  # chunked prefill is off: every prompt is prefilled in one piece
    chunk = int(chunk)
    ranks = compat.attention_dp_size(server_args)
    if requested is None:
        setting = f"{chunk} (SGLang's default for this GPU)"
    else:
        setting = f"{requested}"
        if int(requested) != chunk:
            per_rank = f" per DP-attention rank, {ranks} ranks" if ranks > 1 else ""
            setting += f" (resolved to {chunk}{per_rank})"
    if compat.multi_layer_eagle_enabled(server_args):
        raise refuse("chunked_prefill_multi_layer", name, chunk_setting=setting)
    alignment = compat.deterministic_prefill_alignment(server_args)
    if alignment is None or (alignment.tokens > 0 and chunk % alignment.tokens == 0):
        return
    if alignment.tokens <= 0:
        key = "chunked_prefill_nonpositive_alignment"
    elif chunk < alignment.tokens:
        key = "chunked_prefill_below_alignment"
    else:
        key = "chunked_prefill_off_alignment"
    step = alignment.tokens * ranks
    raise refuse(key, name, chunk_setting=setting, chunk=chunk, tokens=alignment.tokens, backend=alignment.backend,
                 env_var=alignment.env_var, step=step, step2=2 * step)


def _refuse_radix_cache_with_multi_layer(server_args: Any, name: str) -> None:
    """Refuse the radix cache with multi-layer EAGLE (measured on the H200: a prompt half cached by another prompt
    changed a seeded request's tokens from its third token on; a fully cached or cold prompt did not)."""
    if not compat.multi_layer_eagle_enabled(server_args) or _flag(server_args, "disable_radix_cache", False):
        return
    raise refuse("radix_cache_multi_layer", name)


def is_dummy_model(server_args: Any) -> bool:
    """``--model-path dummy``/``none``: every supported release stops resolving right away (no spec handling)."""
    path = compat.read_field(server_args, "model_path", None)
    return str(path).lower() in ("none", "dummy")


def load_hf_config(path: str, *, trust_remote_code: bool = False, revision: Optional[str] = None) -> Any:
    """A checkpoint's HF config, through the same helper SGLang's speculative handler uses."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    kwargs = {}
    if revision is not None:
        kwargs["revision"] = revision
    return get_config(path, trust_remote_code=trust_remote_code, **kwargs)


def _check_draft_vocab_from_configs(server_args: Any, name: str, draft_path: str) -> None:
    # EAGLE-3 drafts declare a reduced vocabulary as ``draft_vocab_size`` (and ship a d2t map); SGLang
    # builds its hot-token map from it. Reading the configs here turns SGLang's worker-init refusal into a
    # startup one; when a config cannot be read here, that worker-init check still applies.
    try:
        target_vocab = getattr(compat.model_config(server_args), "vocab_size", None)
        draft_cfg = load_hf_config(
            draft_path,
            trust_remote_code=bool(_flag(server_args, "trust_remote_code", False)),
            revision=_flag(server_args, "speculative_draft_model_revision"),
        )
    except Exception as exc:  # noqa: BLE001 - best effort, the worker re-checks
        logger.warning("%s: could not compare draft and target vocabularies at startup (%s); the draft worker "
                       "checks again when it loads.", name, exc)
        return
    check_draft_vocab(name, getattr(draft_cfg, "draft_vocab_size", None), target_vocab,
                      multi_layer=compat.multi_layer_eagle_enabled(server_args))


def around_resolution(original: Any, server_args: Any, *args: Any, **kwargs: Any) -> Any:
    """``HookRegistry`` AROUND hook on SGLang's resolution entry point (see the module docstring)."""
    name = requested_detspec_algorithm(server_args)
    if name is None or is_dummy_model(server_args):
        # Not ours; or --model-path dummy, for which SGLang itself skips all speculative handling.
        return original(server_args, *args, **kwargs)
    twin = DETSPEC_TWINS[name]
    warn_retired_reduced_vocab_env()
    _refuse_unsupported_inputs(server_args, name)
    compat.write_fields(
        server_args,
        "detspec.resolve_as_twin",
        speculative_algorithm=twin,
        speculative_use_rejection_sampling=False,
        **_chain_defaults(server_args),
    )
    requested_chunk = _flag(server_args, "chunked_prefill_size")  # before SGLang picks a default
    result = original(server_args, *args, **kwargs)
    _check_resolved(server_args, name, twin)
    _refuse_chunked_prefill(server_args, name, requested_chunk)
    _refuse_radix_cache_with_multi_layer(server_args, name)
    compat.write_fields(
        server_args,
        "detspec.restore_name",
        speculative_algorithm=name,
        speculative_use_rejection_sampling=True,
    )
    logger.info(
        "%s: resolved as %s with rejection sampling on (steps=%s, topk=1, draft tokens=%s).",
        name,
        twin,
        _flag(server_args, "speculative_num_steps"),
        _flag(server_args, "speculative_num_draft_tokens"),
    )
    return result


def install_resolution_hook() -> str:
    """Register :func:`around_resolution` with ``HookRegistry`` (once per process); return the target path.

    ``load_plugins`` applies registered hooks right after running the plugin functions; a caller outside
    ``load_plugins`` must apply them itself (``load_plugin`` does).
    """
    from sglang_detspec.integration.setup.hooks import register_once

    return register_once(compat.resolution_entry_target(), around_resolution, "AROUND")


def resolution_hook_active() -> bool:
    """Whether SGLang's resolution entry point currently runs :func:`around_resolution`."""
    from sglang_detspec.integration.setup.hooks import hook_active

    return hook_active(compat.resolution_entry_target(), around_resolution)
