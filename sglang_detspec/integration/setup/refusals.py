"""Every server argument DETSPEC speculative decoding refuses, and why: one table.

:data:`REFUSALS` maps a key to the flag or situation refused, the reason, and the fix; the server-argument hook
(:mod:`.server_args`) raises :func:`refuse` of a key, so each message is written here once. README.md's "Flags it
refuses at startup" explains the same refusals to users; ``tests/unit/integration/setup/test_refusal_table.py`` reads this table and
that README table and checks that they name the same flags. Standard library only (no SGLang, no torch).

A message reads ``--speculative-algorithm NAME cannot be used with FLAG: WHY. FIX`` (the two
``--enable-deterministic-inference`` entries say what NAME *requires* instead). ``FLAG``, ``WHY`` and ``FIX`` are
``str.format`` templates; :func:`refuse` fills them with ``name`` (the DETSPEC algorithm asked for), ``twin`` (its
builtin EAGLE / EAGLE3 algorithm) and the values the caller passes.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

from sglang_detspec.algorithm_names import DETSPEC_TWINS

__all__ = ["DetspecConfigError", "REFUSALS", "Refusal", "refuse"]


class DetspecConfigError(ValueError):
    """A server argument that DETSPEC speculative decoding refuses (the message names the flag and the fix)."""


_CANNOT = "--speculative-algorithm {name} cannot be used with {flag}: {why}. {fix}"

_NVIDIA_ONLY = "the seeded draft sampler is validated on NVIDIA CUDA GPUs only"
_TRITON_NVIDIA_ONLY = "the seeded draft sampler is a Triton kernel validated on NVIDIA CUDA GPUs only"
_LINEAR_CHAIN_ONLY = "rejection sampling is implemented for the linear (topk 1) draft chain only"
_ALIGNMENT = ("under --enable-deterministic-inference SGLang aligns chunked prefill to {tokens} tokens for the "
              "{backend} prefill backend ({env_var})")
_ALIGNED_SIZES = ("Pass --chunked-prefill-size a multiple of {step} (e.g. {step} or {step2}), or -1 to turn chunked "
                  "prefill off; or set {env_var} to a divisor of {chunk}.")
_DISAGGREGATION_FIX = ("Serve prefill and decode in one server (drop --disaggregation-mode), or use "
                       "--speculative-algorithm {twin} for disaggregated serving (not reproducible).")


class Refusal(NamedTuple):
    """One refusal: ``flag`` (the flag or situation refused, as the message names it), ``why`` and ``fix``, each a
    ``str.format`` template; ``form`` is how the three make the message."""

    flag: str
    why: str
    fix: str
    form: str = _CANNOT


#: Every refusal, by key. Those run before SGLang resolves anything judge what the user passed; those marked
#: "(as resolved)" / "(auto-detected)" judge SGLang's resolution.
REFUSALS: Dict[str, Refusal] = {
    # --- what the user passed -------------------------------------------------------------------------------------
    "deterministic_inference": Refusal(
        "--enable-deterministic-inference",
        "requests only carry a sampling seed in deterministic mode, and only then are the kernels batch-invariant",
        "Add --enable-deterministic-inference (or use --speculative-algorithm {twin} for non-reproducible "
        "speculative sampling).",
        form="--speculative-algorithm {name} requires {flag}: {why}. {fix}",
    ),
    "device": Refusal(
        "--device {device}",
        _TRITON_NVIDIA_ONLY,
        "Run on an NVIDIA GPU with --device cuda (or leave --device unset).",
    ),
    "rocm": Refusal("a ROCm build of torch", _NVIDIA_ONLY, "Run on an NVIDIA GPU."),
    "out_of_tree_platform": Refusal(
        "an out-of-tree SGLang platform plugin",
        "such platforms substitute their own speculative workers, which do not seed the draft",
        "Run on an NVIDIA GPU without SGLANG_PLATFORM plugins.",
    ),
    "topk": Refusal(
        "--speculative-eagle-topk {topk}",
        _LINEAR_CHAIN_ONLY,
        "Drop the flag; DETSPEC algorithms default to --speculative-eagle-topk 1.",
    ),
    "num_draft_tokens": Refusal(
        "--speculative-num-draft-tokens {tokens}{given}",
        "a linear (topk 1) draft chain verifies exactly --speculative-num-steps + 1 tokens (at least 2)",
        "Leave --speculative-num-draft-tokens unset (it defaults to --speculative-num-steps + 1).",
    ),
    "adaptive": Refusal(
        "--speculative-adaptive",
        "adaptive speculation picks the draft length from the batch size, so a request's tokens would depend on what "
        "else is running",
        "Drop --speculative-adaptive and choose a fixed --speculative-num-steps.",
    ),
    "mixed_chunk": Refusal(
        "--enable-mixed-chunk",
        "mixed chunked prefill decodes running speculative requests with the plain target sampler whenever a prefill "
        "is co-scheduled, so a request's tokens would depend on other requests",
        "Drop --enable-mixed-chunk.",
    ),
    # {field}: speculative-accept-threshold-single or -acc
    "accept_threshold": Refusal(
        "--{field} {value}",
        "rejection sampling ignores accept thresholds",
        "Leave --speculative-accept-threshold-single and --speculative-accept-threshold-acc at 1.0.",
    ),
    # Read from SGLang (0.5.17 - 0.5.23): EAGLEWorkerV2.init_token_map sets no hot map from the flag for EAGLE3, only
    # a warning; the draft's own d2t map becomes hot_token_id at init_lm_head.
    "token_map_eagle3": Refusal(
        "--speculative-token-map {token_map} with an EAGLE3 algorithm",
        "SGLang's EAGLE3 draft worker ignores the token map (with only a warning) and serves the EAGLE3 draft's own "
        "d2t hot-token map, so the map passed would silently not be the one served",
        "Drop --speculative-token-map: {name} serves an EAGLE3 draft's own d2t hot-token map. For an EAGLE draft "
        "with a token map, use --speculative-algorithm DETSPEC_EAGLE.",
    ),
    "token_map_invariant": Refusal(
        "--speculative-token-map {token_map} with an _INVARIANT algorithm",
        "the invariant mode's race over a token map's reduced (hot-token) vocabulary has never run on a GPU, so its "
        "identity with the non-speculative server is unmeasured (the invariant mode serves an EAGLE3 draft's own "
        "hot-token map, DETSPEC_EAGLE serves a token map)",
        "Use --speculative-algorithm DETSPEC_EAGLE with the map (reproducible per seed, lossless), or {name} "
        "without the map (a full-vocabulary draft).",
    ),
    "token_map_multi_layer": Refusal(
        "--speculative-token-map {token_map} with multi-layer EAGLE",
        "SGLang's multi-layer draft worker never loads the token map, so the draft would score the full vocabulary",
        "Serve the reduced draft with the single-layer worker (drop --enable-multi-layer-eagle), or drop the token "
        "map.",
    ),
    "block_verification": Refusal(
        "--speculative-use-block-verification",
        "block verification has not been validated with the seeded draft stream",
        "Drop --speculative-use-block-verification (plain rejection sampling is always on).",
    ),
    "watermark": Refusal(
        "--enable-watermark",
        "SGLang does not support watermarking together with rejection sampling",
        "Drop --enable-watermark.",
    ),
    "aux_hidden_states": Refusal(
        "--enable-return-aux-hidden-states",
        "that flag captures hidden states without a draft and turns speculative decoding off",
        "Use --speculative-algorithm EAGLE3 to name the capture convention.",
    ),
    # 0.5.22+ (compat.pd_decode_first_proposal_is_one_hot)
    "disaggregation_one_hot_first_draft": Refusal(
        "--disaggregation-mode {mode}",
        "the decode server proposes the draft token handed over by the prefill server with probability one "
        "(pd_first_draft_proposal): its first verify accepts it with probability p(x) instead of min(1, p(x) / q(x)), "
        "so a seed gives other tokens than co-located serving",
        _DISAGGREGATION_FIX,
    ),
    # 0.5.17 - 0.5.21
    "disaggregation_no_draft_probs": Refusal(
        "--disaggregation-mode {mode}",
        "the draft state the prefill server hands over carries no draft probabilities "
        "(build_eagle_disagg_draft_input sets no draft_probs), so the decode server's first rejection-sampling step "
        "has no proposal distribution",
        _DISAGGREGATION_FIX,
    ),
    "simulated_acceptance": Refusal(
        "SGLANG_SIMULATE_ACC_LEN={simulate}",
        "simulated acceptance, a benchmarking knob, overwrites the verify's accept decisions with draws from the "
        "global RNG, so a request's tokens would depend on what else is running",
        "Unset SGLANG_SIMULATE_ACC_LEN (or set it <= 0), or use --speculative-algorithm {twin} for acceptance-length "
        "simulations.",
    ),
    "attn_tp_input_scattered": Refusal(
        "--enable-attn-tp-input-scattered",
        "SGLang turns input scattering off for EAGLE3 by comparing the algorithm name to 'EAGLE3' at model build "
        "time, which the DETSPEC_EAGLE3 name would slip past",
        "Drop --enable-attn-tp-input-scattered.",
    ),
    "draft_vocab": Refusal(
        "a draft vocabulary of {draft_vocab_size} tokens (target: {target_vocab_size})",
        "{name} maps a reduced (hot-token) draft vocabulary into the target's only through --speculative-token-map; "
        "a draft whose config declares its own draft_vocab_size (an EAGLE3-style hot-token draft) is mapped by the "
        "EAGLE3 algorithms only, so its proposals would be draft indices read as target ids",
        "Use --speculative-algorithm DETSPEC_EAGLE3 for an EAGLE3 draft, or a draft with the target's full "
        "vocabulary (with or without --speculative-token-map), or --speculative-algorithm {twin} (not reproducible).",
    ),
    "draft_vocab_invariant": Refusal(
        "a draft vocabulary of {draft_vocab_size} tokens (target: {target_vocab_size})",
        "the invariant mode races a reduced (hot-token) vocabulary only for an EAGLE3 draft's own hot-token map "
        "(DETSPEC_EAGLE3_INVARIANT); a token map or a draft config's own draft_vocab_size under {name} has never run "
        "on a GPU",
        "Use --speculative-algorithm DETSPEC_EAGLE3_INVARIANT for an EAGLE3 draft, or a draft with the target's "
        "full vocabulary and no token map, or --speculative-algorithm DETSPEC_EAGLE (reproducible per seed, "
        "lossless) for a token map.",
    ),
    "draft_vocab_multi_layer": Refusal(
        "a draft vocabulary of {draft_vocab_size} tokens (target: {target_vocab_size}) and multi-layer EAGLE",
        "SGLang's multi-layer draft worker never maps draft indices through the hot-token map (it has no "
        "hot_token_id), so its proposals would be draft indices read as target ids",
        "Serve the reduced draft with the single-layer worker (drop --enable-multi-layer-eagle), or use a draft "
        "with the target's full vocabulary.",
    ),
    # --- what SGLang resolved ---------------------------------------------------------------------------------------
    "resolved_algorithm": Refusal(
        "this draft (SGLang resolved the algorithm to {algorithm})",
        "SGLang serves it with a different speculative algorithm (e.g. a Gemma-4 assistant draft becomes "
        "FROZEN_KV_MTP), which has no rejection sampling",
        "Use --speculative-algorithm {twin} for this draft.",
    ),
    "resolved_deterministic_inference": Refusal(
        "--enable-deterministic-inference",
        "it resolved to off",
        "Add --enable-deterministic-inference.",
        form="--speculative-algorithm {name} requires {flag} ({why}). {fix}",
    ),
    "resolved_device": Refusal(
        "--device {device} (auto-detected)",
        _TRITON_NVIDIA_ONLY,
        "Run on a machine with an NVIDIA GPU (--device cuda).",
    ),
    "resolved_topk": Refusal(
        "--speculative-eagle-topk {topk} (as resolved)",
        _LINEAR_CHAIN_ONLY,
        "Pass --speculative-eagle-topk 1.",
    ),
    "resolved_chain_length": Refusal(
        "--speculative-num-steps {steps} / --speculative-num-draft-tokens {tokens} (as resolved)",
        "a linear draft chain verifies exactly steps + 1 tokens",
        "Pass --speculative-num-draft-tokens equal to --speculative-num-steps + 1.",
    ),
    "resolved_adaptive": Refusal(
        "--speculative-adaptive (as resolved)",
        "adaptive speculation makes a request's draft length depend on the batch size",
        "Drop --speculative-adaptive.",
    ),
    # Read from SGLang (0.5.17 - 0.5.23): release_memory_occupation pauses the draft's weights with the target's
    # (load_model_utils: one GPU_MEMORY_TYPE_WEIGHTS region, CPU backup only with the two flags), but
    # update_weights_from_disk hands the draft the *target's* checkpoint, whose names the EAGLE draft loader skips,
    # and update_weights_from_tensor only reaches the draft with the draft's own tensor names.
    "memory_saver_draft_weights": Refusal(
        "--enable-memory-saver without --enable-draft-weights-cpu-backup or --enable-weights-cpu-backup",
        "release_memory_occupation would discard the draft's weights and the usual re-push after resume "
        "(update_weights_from_disk / _from_tensor of the target's weights) does not restore them, so a seeded "
        "request's tokens would silently change after resume",
        "Add --enable-draft-weights-cpu-backup (keeps the draft's weights in CPU memory across a release; the draft is "
        "small), or --enable-weights-cpu-backup.",
    ),
    "no_draft_model": Refusal(
        "no --speculative-draft-model-path",
        "the draft worker needs a draft checkpoint",
        "Pass --speculative-draft-model-path (for a checkpoint that carries its own MTP/NEXTN layer, the target "
        "path).",
    ),
    # {chunk_setting}: the size as given ("4096 (resolved to 2048 per DP-attention rank, 2 ranks)") or chosen by SGLang
    "chunked_prefill_multi_layer": Refusal(
        "--chunked-prefill-size {chunk_setting} and multi-layer EAGLE",
        "the multi-layer draft worker shifts each prefill chunk's tokens by one and appends the target's sampled token "
        "even where the prompt continues in the next chunk (upstream TODO 'same chunked-prefill chain divergence as "
        "PR #26329', fixed for the single-layer worker only), so the draft KV, hence the draft tokens, depend on "
        "where the prompt was cut, which depends on what else was scheduled",
        "Pass --chunked-prefill-size -1 (multi-layer EAGLE is on through --enable-multi-layer-eagle or SGLang's "
        "override for this model).",
    ),
    "chunked_prefill_nonpositive_alignment": Refusal(
        "--chunked-prefill-size {chunk_setting}",
        _ALIGNMENT + ", and a non-positive alignment fails the first chunked prompt",
        "Unset {env_var} (or set it to a positive tile size), or pass --chunked-prefill-size -1.",
    ),
    "chunked_prefill_below_alignment": Refusal(
        "--chunked-prefill-size {chunk_setting}",
        _ALIGNMENT + "; a chunk shorter than that is cut to zero tokens, so the first prompt longer than {chunk} "
        "tokens is never scheduled and every request queued behind it waits forever",
        _ALIGNED_SIZES,
    ),
    "chunked_prefill_off_alignment": Refusal(
        "--chunked-prefill-size {chunk_setting}",
        _ALIGNMENT + "; only a prompt's first chunk is cut to a multiple of it, later chunks are {chunk} tokens long, "
        "so they start off the alignment (and, for a chunk of twice the alignment or more, at offsets that depend on "
        "what else was scheduled with the first chunk)",
        _ALIGNED_SIZES,
    ),
    "radix_cache_multi_layer": Refusal(
        "the radix cache and multi-layer EAGLE",
        "draft step i's layer reads the prompt shifted by i + 1 tokens (rotate_input_ids per step), so its KV at a "
        "cached position depends on the i + 1 tokens that followed it in the request that filled the cache, while "
        "EAGLE's bigram radix keys only guarantee the next one; a prompt that shares a prefix with an earlier, "
        "different prompt therefore gets other draft proposals, hence other tokens, than the same prompt cold",
        "Pass --disable-radix-cache (multi-layer EAGLE is on through --enable-multi-layer-eagle or SGLang's override "
        "for this model), or use single-layer EAGLE, whose cache reuse is reproducible.",
    ),
    # --- the environment of any process with the plugin installed (read before any model loads) -----------------
    "ops_choice": Refusal(
        "SGLANG_DETSPEC_OPS={value!r}",
        "it chooses which batch-invariant kernels a deterministic server computes with, and a typo read as a default "
        "would give a server whose numbers differ from its reference's",
        "Use 'auto' (the plugin's GEMM and RMSNorm on DETSPEC servers and the token-id reference server; the "
        "default), 'sglang' (SGLang's own deterministic kernels everywhere) or 'all' (the plugin's kernels on every "
        "deterministic server).",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "fast_invariant_draft": Refusal(
        "SGLANG_DETSPEC_FAST_INVARIANT_DRAFT={value!r}",
        "it chooses whether a speculation-invariant server's draft computes its GEMMs with cuBLAS, and a typo read as "
        "a default would leave a benchmark measuring another configuration than it names",
        "Use '1' (the DETSPEC_*_INVARIANT draft's GEMMs on cuBLAS) or '0' / unset (the batch-invariant kernels).",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "token_id_sampler_value": Refusal(
        "SGLANG_DETSPEC_TOKEN_ID_SAMPLER={value!r}",
        "it chooses whether a non-speculative deterministic server samples with the token-id-keyed target sampler, "
        "and a typo read as off would give a reference server that silently keys by rank",
        "Use SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1 to sample with the token-id-keyed target sampler on a non-speculative "
        "--enable-deterministic-inference server, or unset it (or 0) for SGLang's own sampler.",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "token_id_sampler_algorithm": Refusal(
        "--speculative-algorithm {algorithm}",
        "it keys only the target Sampler by token id, while that algorithm's verify samples the speculated tokens its "
        "own way, so the outputs would match neither a non-speculative server nor a DETSPEC one",
        "Use --speculative-algorithm DETSPEC_EAGLE_INVARIANT (DETSPEC_EAGLE3_INVARIANT for EAGLE3 drafts), or unset "
        "SGLANG_DETSPEC_TOKEN_ID_SAMPLER.",
        form="SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1 cannot be used with {flag}: {why}. {fix}",
    ),
    "token_id_sampler_nondeterministic": Refusal(
        "--enable-deterministic-inference",
        "it changes only how *seeded* sampling keys its noise, and SGLang seeds sampling only in deterministic mode, "
        "so without it the variable would do nothing",
        "Add --enable-deterministic-inference, or unset SGLANG_DETSPEC_TOKEN_ID_SAMPLER.",
        form="SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1 needs {flag}: {why}. {fix}",
    ),
    "gemm_split_k": Refusal(
        "SGLANG_DETSPEC_GEMM_SPLIT_K={value!r}",
        "it chooses whether the batch-invariant GEMM splits K on the weight shapes its SPLIT_K_TABLE names (another "
        "reduction, so other numbers), and a typo read as a default would leave a benchmark measuring another "
        "configuration than it names",
        "Use '1' / unset (the table's splits, the default) or '0' (no weight shape split).",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "attn_index_cache": Refusal(
        "SGLANG_DETSPEC_ATTN_INDEX_CACHE={value!r}",
        "it chooses whether the deterministic Triton attention builds its unified KV indices once per forward, and a "
        "typo read as a default would leave a benchmark measuring another configuration than it names",
        "Use '1' / unset (build them once per forward, the default) or '0' (SGLang's per-layer build).",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "verify_coins_kernel": Refusal(
        "SGLANG_DETSPEC_VERIFY_COINS_KERNEL={value!r}",
        "it chooses whether a DETSPEC verify draws its seeded coins in one Triton launch or in SGLang's torch ops (the "
        "same values), and a typo read as a default would leave a benchmark measuring another configuration than it "
        "names",
        "Use '1' / unset (one launch, the default) or '0' (SGLang's torch ops).",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "decode_order_verify": Refusal(
        "SGLANG_DETSPEC_DECODE_ORDER_VERIFY={value!r}",
        "it chooses whether a DETSPEC_EAGLE verify runs its attention in the decode kernel's order or in SGLang's "
        "one-stage extend kernel (other numbers, so other tokens for a seed), and a typo read as a default would "
        "serve another configuration than the environment names",
        "Use '1' (the decode kernel's order) or '0' / unset (SGLang's extend kernel, the default).",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "split_kv_verify": Refusal(
        "SGLANG_DETSPEC_SPLIT_KV_VERIFY={value!r}",
        "it chooses whether a DETSPEC_EAGLE verify runs its attention in the plugin's split-KV verify kernel or in "
        "SGLang's one-stage extend kernel (other numbers, so other tokens for a seed), and a typo read as a default "
        "would serve another configuration than the environment names",
        "Use '1' (the split-KV verify kernel, or a refusal where it cannot serve the model), '0' (SGLang's extend "
        "kernel) or unset (the split-KV kernel wherever it can serve the model, the default).",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "split_kv_draft_extend": Refusal(
        "SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND={value!r}",
        "it chooses whether a DETSPEC draft runs its extend of each verified chain in the plugin's split-KV verify "
        "kernel or in SGLang's one-stage extend kernel (other draft numbers, so other DETSPEC_EAGLE tokens for a "
        "seed), and a typo read as a default would serve another configuration than the environment names",
        "Use '1' (the split-KV verify kernel, or a refusal where it cannot serve the draft) or '0' / unset (SGLang's "
        "extend kernel, the default).",
        form="{flag} is not an allowed value: {why}. {fix}",
    ),
    "split_kv_verify_with_decode_order": Refusal(
        "SGLANG_DETSPEC_SPLIT_KV_VERIFY=1 with SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1",
        "both replace the verify's attention kernel, and only one can run",
        "Unset one of the two.",
        form="{flag} cannot be combined: {why}. {fix}",
    ),
    "split_kv_verify_invariant": Refusal(
        "SGLANG_DETSPEC_SPLIT_KV_VERIFY=1",
        "its verify attention must run in the decode kernel's order to emit the non-speculative server's tokens, and "
        "the split-KV verify kernel sums in another order",
        "Unset SGLANG_DETSPEC_SPLIT_KV_VERIFY (the invariant algorithms keep the decode order), or use "
        "--speculative-algorithm {rejection_name}.",
    ),
}


def refuse(key: str, name: Optional[str], **values: Any) -> DetspecConfigError:
    """The :class:`DetspecConfigError` of refusal ``key`` for the DETSPEC algorithm ``name`` (None for a refusal that
    names no algorithm), its templates filled with ``values`` (and ``name`` / ``twin``). Raise it:
    ``raise refuse("topk", name, topk=topk)``."""
    entry = REFUSALS[key]
    values = {"name": name, "twin": DETSPEC_TWINS.get(name), **values}
    parts = {part: getattr(entry, part).format(**values) for part in ("flag", "why", "fix")}
    return DetspecConfigError(entry.form.format(name=name, **parts))
