"""The model-family pairs' names and ``config.json`` dicts: tiny, seeded stand-ins for the families users serve with
speculative decoding, beside the Llama-shaped tiny pairs of :mod:`.tiny_config`.

* ``qwen3_eagle3`` -- a Qwen3 dense target (``Qwen3ForCausalLM``: per-head q/k RMSNorm, an explicit ``head_dim``
  of 128 that differs from ``hidden_size / heads`` as in the real Qwen3 checkpoints) and an EAGLE3 draft
  (``LlamaForCausalLMEagle3``, as published Qwen3 EAGLE3 drafts are) with a REDUCED draft vocabulary:
  ``draft_vocab_size`` = :data:`DRAFT_VOCAB_SIZE` hot tokens of the target's 1024, mapped back by ``d2t``.
* ``qwen3_moe``    -- a Qwen3-MoE target (``Qwen3MoeForCausalLM``: 8 experts, top-2 softmax routing with
  renormalised weights, every layer sparse) and a full-vocabulary EAGLE draft (``LlamaForCausalLMEagle``).
* ``deepseek_mtp`` -- a DeepSeek-V3-shaped target (``DeepseekV3ForCausalLM``: MLA attention with q/kv low-rank
  projections and a decoupled RoPE part, MoE with one shared expert after ``first_k_dense_replace`` dense layers,
  sigmoid ``noaux_tc`` routing over ``n_group`` groups) whose checkpoint carries its own NEXTN/MTP layer at
  ``model.layers.{num_hidden_layers}`` (``num_nextn_predict_layers`` = 1), as DeepSeek-V3's does: SGLang serves
  the same directory as the draft (``DeepseekV3ForCausalLMNextN``).

Shapes shared with the tiny pairs: the tiny tokenizer's 1024-token vocabulary, hidden size 256 (512 for deepseek_mtp:
SGLang's CUDA NEXTN layer runs ``fused_eh_norm``, which takes hidden sizes in (256, 8192] that are multiples of 256
only), 16,384 positions (what ``serve`` and the E2E servers pass as ``--context-length``). MLA's dims are MiniCPM3's (kv_lora_rank 256 +
qk_rope_head_dim 32 = 288, a key width SGLang's triton MLA kernels have a dedicated block shape for).

Every dict is written with ``json.dumps(sort_keys=True)`` (:func:`~.model_cache.write_json`); keys follow the real
checkpoints' ``config.json`` (e.g. DeepSeek-V3's ``scoring_func`` / ``topk_method``, which SGLang reads and
transformers keeps as extra attributes). Standard library only.
"""

from __future__ import annotations

from typing import Dict

from sglang_detspec.models.tiny_config import (
    BOS_ID,
    EAGLE3_AUX_LAYER_IDS,
    EOS_ID,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    MAX_POS,
    ROPE_THETA,
    VOCAB_SIZE,
    llama_config,
)

__all__ = [
    "FAMILY_PAIRS", "FAMILY_VERSIONS", "FAMILY_ALGORITHMS", "DRAFT_VOCAB_SIZE", "check_family_pair",
    "family_configs", "qwen3_config", "qwen3_eagle3_draft_config", "qwen3_moe_config", "eagle_draft_config",
    "deepseek_v3_config", "DEEPSEEK_HIDDEN",
]

FAMILY_PAIRS = ("qwen3_eagle3", "qwen3_moe", "deepseek_mtp")
#: Bump a pair's version whenever any byte it generates changes: its cache directory is named after it.
FAMILY_VERSIONS: Dict[str, str] = {"qwen3_eagle3": "1", "qwen3_moe": "1", "deepseek_mtp": "2"}
#: The DETSPEC algorithms each pair's draft is served with (the first is ``serve``'s choice for the pair):
#: an EAGLE3 draft runs under the EAGLE3 worker, an EAGLE draft and a NEXTN/MTP layer under the EAGLE one
#: (SGLang aliases NEXTN to EAGLE; DETSPEC_EAGLE is that twin).
FAMILY_ALGORITHMS: Dict[str, tuple] = {
    "qwen3_eagle3": ("DETSPEC_EAGLE3", "DETSPEC_EAGLE3_INVARIANT"),
    "qwen3_moe": ("DETSPEC_EAGLE", "DETSPEC_EAGLE_INVARIANT"),
    "deepseek_mtp": ("DETSPEC_EAGLE", "DETSPEC_EAGLE_INVARIANT"),
}

#: The qwen3_eagle3 draft's vocabulary: the target's most frequent tokens (``family_weights.hot_token_ids``).
DRAFT_VOCAB_SIZE = 256
QWEN3_LAYERS = 8  # EAGLE3 aux layers [1, 3, 4] (tiny_config.EAGLE3_AUX_LAYER_IDS) must exist
QWEN3_HEAD_DIM = 128  # explicit, != HIDDEN // HEADS (64), as in Qwen3 checkpoints
QWEN3_MOE_LAYERS = 4
MOE_EXPERTS = 8
MOE_TOP_K = 2
MOE_INTERMEDIATE = 128
#: deepseek_mtp's hidden size: SGLang's NEXTN layer fuses its enorm / hnorm / cat on CUDA with ``fused_eh_norm``,
#: which refuses hidden sizes outside (256, 8192] or not a multiple of 256 (the draft's CUDA-graph capture fails).
DEEPSEEK_HIDDEN = 512
DEEPSEEK_LAYERS = 4  # layer 0 dense (first_k_dense_replace 1), 1-3 MoE; the MTP layer is layer 4
DEEPSEEK_MLA = {"q_lora_rank": 128, "kv_lora_rank": 256, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64,
                "v_head_dim": 64}


def check_family_pair(pair: str) -> str:
    """``pair`` if it is one of :data:`FAMILY_PAIRS`, else a ``ValueError`` naming the choices."""
    if pair not in FAMILY_PAIRS:
        raise ValueError(f"unknown model-family pair {pair!r}; choose one of {', '.join(map(repr, FAMILY_PAIRS))}")
    return pair


def _common(architecture: str, model_type: str, num_layers: int) -> dict:
    """The keys every family target shares with the tiny Llama config (vocabulary, positions, dtype, tokens)."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "num_hidden_layers": num_layers,
        "num_attention_heads": HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-6,
        # Both spellings: transformers 5 reads `rope_parameters`, SGLang and older readers `rope_theta`.
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
        "initializer_range": 0.02,
        "use_cache": True,
    }


def qwen3_config() -> dict:
    """The qwen3_eagle3 target: ``Qwen3ForCausalLM``, 8 layers, GQA 4/2 heads of an explicit head_dim 128."""
    cfg = _common("Qwen3ForCausalLM", "qwen3", QWEN3_LAYERS)
    cfg.update({
        "intermediate_size": INTERMEDIATE,
        "num_key_value_heads": KV_HEADS,
        "head_dim": QWEN3_HEAD_DIM,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": QWEN3_LAYERS,
    })
    return cfg


def qwen3_eagle3_draft_config() -> dict:
    """The reduced-vocabulary EAGLE3 draft: one Llama layer of plain multi-head attention (the weighted tiny pair's
    EAGLE3 recipe needs it, see ``tiny_weights``), ``draft_vocab_size`` hot tokens of the target's vocabulary."""
    cfg = llama_config(1, "LlamaForCausalLMEagle3")
    cfg.update({
        "num_key_value_heads": HEADS,
        "draft_vocab_size": DRAFT_VOCAB_SIZE,
        "target_hidden_size": HIDDEN,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYER_IDS)},
    })
    return cfg


def qwen3_moe_config() -> dict:
    """The qwen3_moe target: ``Qwen3MoeForCausalLM``, 4 sparse layers of 8 experts, top-2."""
    cfg = _common("Qwen3MoeForCausalLM", "qwen3_moe", QWEN3_MOE_LAYERS)
    cfg.update({
        "intermediate_size": INTERMEDIATE,  # a dense layer's width; every layer here is sparse
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "num_experts": MOE_EXPERTS,
        "num_experts_per_tok": MOE_TOP_K,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": QWEN3_MOE_LAYERS,
    })
    return cfg


def eagle_draft_config() -> dict:
    """The qwen3_moe pair's EAGLE draft: the weighted tiny pair's (one Llama layer, the target's vocabulary)."""
    return llama_config(1, "LlamaForCausalLMEagle")


def deepseek_v3_config() -> dict:
    """The deepseek_mtp target (and, through SGLang's NextN rewrite of its architecture, its draft)."""
    cfg = _common("DeepseekV3ForCausalLM", "deepseek_v3", DEEPSEEK_LAYERS)
    cfg.update(DEEPSEEK_MLA)
    cfg.update({
        "hidden_size": DEEPSEEK_HIDDEN,
        "intermediate_size": INTERMEDIATE,  # the dense layers' MLP
        "num_key_value_heads": HEADS,  # MLA: one latent KV, expanded per head
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "n_routed_experts": MOE_EXPERTS,
        "n_shared_experts": 1,
        "num_experts_per_tok": MOE_TOP_K,
        "n_group": 4,
        "topk_group": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "ep_size": 1,
        "num_nextn_predict_layers": 1,
        "rope_scaling": None,
        "rope_interleave": True,
    })
    return cfg


def family_configs(pair: str) -> Dict[str, dict]:
    """``{directory name: config.json dict}`` of ``pair``: ``target`` plus its separate draft directory, if any
    (deepseek_mtp's draft is its target directory)."""
    pair = check_family_pair(pair)
    if pair == "qwen3_eagle3":
        return {"target": qwen3_config(), "eagle3_draft": qwen3_eagle3_draft_config()}
    if pair == "qwen3_moe":
        return {"target": qwen3_moe_config(), "eagle_draft": eagle_draft_config()}
    return {"target": deepseek_v3_config()}
