"""Seeded synthetic bf16 weights of the model-family pairs (:mod:`.family_config`): the weighted tiny pair's recipe
(:mod:`.tiny_weights`) carried over to Qwen3, Qwen3-MoE and DeepSeek-V3 layouts, so each target is *mostly a bigram
model* with peaked distributions and each draft approximates it imperfectly (drafts partly accepted).

Shared recipe (``H`` = hidden size; every matrix N(0, 1/fan_in) unless said otherwise): embeddings N(0, 1); the
projections that write into the residual stream (attention ``o_proj``, every MLP's or expert's ``down_proj``) times
``residual_write_scale`` (0.05), so the final state stays close to the last token's embedding; every norm weight 1;
lm_head N(0, 9 / H). Family specifics:

* **qwen3_eagle3** target (``Qwen3ForCausalLM``): per-head ``q_norm`` / ``k_norm`` of ``head_dim``; plus a
  *frequency direction* so that a reduced draft vocabulary can cover most of the target's mass: every embedding
  gets ``FREQUENT_OFFSET * u`` (``u`` a seeded unit vector) and the lm_head rows of 256 seeded "frequent" tokens
  get ``(FREQUENT_LOGIT_BONUS / FREQUENT_OFFSET) * u``, which raises those tokens' logits by about
  ``FREQUENT_LOGIT_BONUS`` in every context (a Zipf-like unigram skew, as real text has).
  The draft's hot tokens (:func:`hot_token_ids`) are then *measured*, not assumed: the 256 most frequent tokens of
  the stationary distribution of the target's bigram chain (next-token probabilities of every one-token context,
  computed here in float64).
  EAGLE3 draft: the weighted tiny pair's EAGLE3 recipe (``tiny_weights.eagle3_weights``) whose lm_head is the
  target lm_head's hot rows (``[draft_vocab_size, H]``), with ``d2t`` (int64, ``hot[i] - i``) and ``t2d`` (bool
  over the target vocabulary, true on the hot set), the tensors published EAGLE3 drafts ship and SGLang's
  ``LlamaForCausalLMEagle3.load_weights`` reads (``hot_token_id = d2t + arange``; ``t2d`` is skipped).
* **qwen3_moe** target (``Qwen3MoeForCausalLM``): every layer sparse, ``mlp.gate`` N(0, 1/H) (router logits of
  standard deviation ~1, so tokens really spread over the 8 experts), experts as dense MLPs of
  ``moe_intermediate_size``. EAGLE draft: the weighted pair's EAGLE recipe (``tiny_weights.eagle_weights``).
* **deepseek_mtp** target (``DeepseekV3ForCausalLM``): MLA (``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``;
  ``kv_a_proj_with_mqa`` -> ``kv_a_layernorm`` -> ``kv_b_proj``), layer 0 a dense MLP, later layers MoE with a
  shared expert, ``mlp.gate.e_score_correction_bias`` N(0, 0.1^2) stored as float32 like DeepSeek-V3's (it moves
  the top-k choice, not the weights). The NEXTN/MTP layer ``model.layers.{L}`` (L = num_hidden_layers): ``eh_proj``
  sees ``cat(enorm(embed(token)), hnorm(target hidden))``, so ``eh_proj = [I + 0.3 N(0, 1/H) | 0.3 N(0, 1/H)]``
  (the multi-layer MTP draft's recipe, ``mtp_draft``), then one MoE decoder layer built like the target's,
  ``shared_head.norm`` 1, and ``embed_tokens`` / ``shared_head.head`` copies of the target's (SGLang skips both and
  shares the target's; DeepSeek-V3's checkpoint ships them too).

Each pair draws under its own recipe seed (:data:`FAMILY_SEEDS`) and each tensor from its own seeded stream
(``tiny_weights.Draw``), rounded to bf16 and written by ``tiny_weights.write_safetensors``: the same bytes on every
build and every installed torch / safetensors.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Tuple

import numpy as np

from sglang_detspec.models.tiny_weights import (
    DEFAULT_RECIPE,
    Arrays,
    Draw,
    WeightRecipe,
    attention_weights,
    bf16_round,
    eagle3_weights,
    eagle_weights,
    mlp_weights,
    tensor_seed,
)

__all__ = ["FAMILY_SEEDS", "FREQUENT_OFFSET", "FREQUENT_LOGIT_BONUS", "MTP_HIDDEN_GAIN", "generate_family_weights",
           "hot_token_ids", "tokens_by_frequency", "bigram_next_token_probs", "float32_tensors"]

#: Recipe seed of each pair (the weighted tiny pair's is ``tiny_weights.DEFAULT_RECIPE.seed``).
FAMILY_SEEDS = {"qwen3_eagle3": 20270101, "qwen3_moe": 20270102, "deepseek_mtp": 20270103}
FREQUENT_OFFSET = 4.0
FREQUENT_LOGIT_BONUS = 3.0
MTP_HIDDEN_GAIN = 0.3
ROUTER_BIAS_STD = 0.1
#: Tensors stored as float32 rather than bf16 (DeepSeek-V3 ships its routing bias so).
float32_tensors = ("e_score_correction_bias",)


def _recipe(pair: str) -> WeightRecipe:
    return dataclasses.replace(DEFAULT_RECIPE, seed=FAMILY_SEEDS[pair])


def _matrix(draw: Draw, name: str, rows: int, cols: int, recipe: WeightRecipe, *, writes_residual: bool = False):
    scale = recipe.residual_write_scale if writes_residual else 1.0
    return draw.normal(name, (rows, cols), scale / math.sqrt(cols))


def _experts(draw: Draw, prefix: str, n: int, hidden: int, inter: int, recipe: WeightRecipe) -> Arrays:
    """``{prefix}{e}.gate_proj/up_proj/down_proj.weight`` for experts ``e < n`` (the per-expert checkpoint layout)."""
    w = {}
    for e in range(n):
        p = f"{prefix}{e}."
        w[f"{p}gate_proj.weight"] = _matrix(draw, f"{p}gate_proj", inter, hidden, recipe)
        w[f"{p}up_proj.weight"] = _matrix(draw, f"{p}up_proj", inter, hidden, recipe)
        w[f"{p}down_proj.weight"] = _matrix(draw, f"{p}down_proj", hidden, inter, recipe, writes_residual=True)
    return w


def _embed_and_head(cfg: dict, recipe: WeightRecipe, draw: Draw) -> Arrays:
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    return {
        "model.embed_tokens.weight": draw.normal("embed", (vocab, hidden), recipe.embed_std),
        "model.norm.weight": draw.ones(hidden),
        "lm_head.weight": draw.normal("lm_head", (vocab, hidden), recipe.lm_head_std / math.sqrt(hidden)),
    }


# ----------------------------------------------------------------------------------------------------------------
# Qwen3 (dense and MoE)


def _qwen3_layers(cfg: dict, recipe: WeightRecipe, draw: Draw, *, moe: bool) -> Arrays:
    hidden = cfg["hidden_size"]
    w = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update(attention_weights(draw, p, cfg, recipe))
        w[f"{p}self_attn.q_norm.weight"] = draw.ones(cfg["head_dim"])
        w[f"{p}self_attn.k_norm.weight"] = draw.ones(cfg["head_dim"])
        w[f"{p}input_layernorm.weight"] = draw.ones(hidden)
        if moe:
            w[f"{p}mlp.gate.weight"] = _matrix(draw, f"{p}mlp.gate", cfg["num_experts"], hidden, recipe)
            w.update(_experts(draw, f"{p}mlp.experts.", cfg["num_experts"], hidden, cfg["moe_intermediate_size"],
                              recipe))
            w[f"{p}post_attention_layernorm.weight"] = draw.ones(hidden)
        else:
            w.update(mlp_weights(draw, p, cfg, recipe))  # with post_attention_layernorm
    return w


def _qwen3_eagle3(configs: Dict[str, dict], recipe: WeightRecipe) -> Dict[str, Arrays]:
    cfg, draft_cfg = configs["target"], configs["eagle3_draft"]
    draw = Draw(recipe, "target")
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    target = _embed_and_head(cfg, recipe, draw)
    # The frequency direction (module docstring): a shared embedding component and a lm_head bonus along it.
    u = draw.normal("frequency_direction", (hidden,), 1.0)
    u = u / np.linalg.norm(u)
    order = np.random.RandomState(tensor_seed(recipe.seed, "target", "frequent_tokens")).permutation(vocab - 3) + 3
    frequent = np.zeros(vocab)
    frequent[order[: draft_cfg["draft_vocab_size"]]] = FREQUENT_LOGIT_BONUS / FREQUENT_OFFSET
    target["model.embed_tokens.weight"] = target["model.embed_tokens.weight"] + FREQUENT_OFFSET * u[None, :]
    target["lm_head.weight"] = target["lm_head.weight"] + frequent[:, None] * u[None, :]
    target.update(_qwen3_layers(cfg, recipe, draw, moe=False))
    target = {name: bf16_round(a) for name, a in target.items()}
    hot = hot_token_ids(cfg, target, draft_cfg["draft_vocab_size"])
    draft = eagle3_weights(draft_cfg, target["lm_head.weight"][hot], recipe)
    draft = {name: bf16_round(a) for name, a in draft.items()}
    t2d = np.zeros(vocab, dtype=np.bool_)
    t2d[hot] = True
    draft["d2t"] = (hot - np.arange(len(hot))).astype(np.int64)
    draft["t2d"] = t2d
    return {"target": target, "eagle3_draft": draft}


def bigram_next_token_probs(cfg: dict, w: Arrays) -> np.ndarray:
    """``P[a, b]``: a Qwen3 or Llama target's probability of token ``b`` after the one-token context ``a`` (float64).

    At one position attention attends to that position only, so each head's output is its key/value head's value
    (q/k, their norms and RoPE drop out): a layer is ``x += o_proj(expand(v_proj(norm(x))))``, then the MLP.
    """
    eps, heads, kv_heads, head_dim = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def norm(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    x = w["model.embed_tokens.weight"].astype(np.float64)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        v = norm(x, w[f"{p}input_layernorm.weight"]) @ w[f"{p}self_attn.v_proj.weight"].T
        v = np.repeat(v.reshape(len(x), kv_heads, head_dim), heads // kv_heads, axis=1).reshape(len(x), -1)
        x = x + v @ w[f"{p}self_attn.o_proj.weight"].T
        h = norm(x, w[f"{p}post_attention_layernorm.weight"])
        gate = h @ w[f"{p}mlp.gate_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[f"{p}mlp.up_proj.weight"].T)) @ w[f"{p}mlp.down_proj.weight"].T
    logits = norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T.astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(-1, keepdims=True)


def tokens_by_frequency(cfg: dict, w: Arrays) -> np.ndarray:
    """Every token id, most frequent first in the target's bigram chain (its stationary distribution, by power
    iteration from uniform), as int64. Frequencies are rounded to 12 decimals and ties go to the lower id, so
    last-bit differences between BLAS builds cannot reorder the ranking."""
    probs = bigram_next_token_probs(cfg, w)
    pi = np.full(len(probs), 1.0 / len(probs))
    for _ in range(200):
        pi = pi @ probs
    return np.argsort(-np.round(pi, 12), kind="stable").astype(np.int64)


def hot_token_ids(cfg: dict, w: Arrays, size: int) -> np.ndarray:
    """The ``size`` most frequent tokens of the target's bigram chain (:func:`tokens_by_frequency`), as sorted int64
    ids."""
    return np.sort(tokens_by_frequency(cfg, w)[:size])


# ----------------------------------------------------------------------------------------------------------------
# DeepSeek-V3 (MLA, MoE with a shared expert, the NEXTN/MTP layer)


def _mla(draw: Draw, p: str, cfg: dict, recipe: WeightRecipe) -> Arrays:
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    q_lora, kv_lora, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    a = f"{p}self_attn."
    return {
        f"{a}q_a_proj.weight": _matrix(draw, f"{a}q_a_proj", q_lora, hidden, recipe),
        f"{a}q_a_layernorm.weight": draw.ones(q_lora),
        f"{a}q_b_proj.weight": _matrix(draw, f"{a}q_b_proj", heads * (nope + rope), q_lora, recipe),
        f"{a}kv_a_proj_with_mqa.weight": _matrix(draw, f"{a}kv_a_proj_with_mqa", kv_lora + rope, hidden, recipe),
        f"{a}kv_a_layernorm.weight": draw.ones(kv_lora),
        f"{a}kv_b_proj.weight": _matrix(draw, f"{a}kv_b_proj", heads * (nope + v), kv_lora, recipe),
        f"{a}o_proj.weight": _matrix(draw, f"{a}o_proj", hidden, heads * v, recipe, writes_residual=True),
    }


def _deepseek_layer(draw: Draw, i: int, cfg: dict, recipe: WeightRecipe) -> Arrays:
    hidden, p = cfg["hidden_size"], f"model.layers.{i}."
    w = _mla(draw, p, cfg, recipe)
    w[f"{p}input_layernorm.weight"] = draw.ones(hidden)
    if i < cfg["first_k_dense_replace"]:
        return {**w, **mlp_weights(draw, p, cfg, recipe)}  # with post_attention_layernorm
    experts, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    w[f"{p}post_attention_layernorm.weight"] = draw.ones(hidden)
    w[f"{p}mlp.gate.weight"] = _matrix(draw, f"{p}mlp.gate", experts, hidden, recipe)
    w[f"{p}mlp.gate.e_score_correction_bias"] = draw.normal(f"{p}mlp.gate.bias", (experts,), ROUTER_BIAS_STD)
    w.update(_experts(draw, f"{p}mlp.experts.", experts, hidden, inter, recipe))
    shared = inter * cfg["n_shared_experts"]
    s = f"{p}mlp.shared_experts."
    w[f"{s}gate_proj.weight"] = _matrix(draw, f"{s}gate_proj", shared, hidden, recipe)
    w[f"{s}up_proj.weight"] = _matrix(draw, f"{s}up_proj", shared, hidden, recipe)
    w[f"{s}down_proj.weight"] = _matrix(draw, f"{s}down_proj", hidden, shared, recipe, writes_residual=True)
    return w


def _deepseek_mtp(configs: Dict[str, dict], recipe: WeightRecipe) -> Dict[str, Arrays]:
    cfg = configs["target"]
    draw = Draw(recipe, "target")
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    w = _embed_and_head(cfg, recipe, draw)
    for i in range(layers):
        w.update(_deepseek_layer(draw, i, cfg, recipe))
    mtp_draw, p = Draw(recipe, "mtp"), f"model.layers.{layers}."
    w.update(_deepseek_layer(mtp_draw, layers, cfg, recipe))  # MoE: the MTP layer is sparse in SGLang and HF
    token_half = np.eye(hidden) + mtp_draw.normal(f"{p}eh_proj.token", (hidden, hidden),
                                                  recipe.eagle_fc_noise / math.sqrt(hidden))
    hidden_half = mtp_draw.normal(f"{p}eh_proj.hidden", (hidden, hidden), MTP_HIDDEN_GAIN / math.sqrt(hidden))
    w.update({
        f"{p}eh_proj.weight": np.concatenate([token_half, hidden_half], axis=1),
        f"{p}enorm.weight": np.ones(hidden),
        f"{p}hnorm.weight": np.ones(hidden),
        f"{p}shared_head.norm.weight": np.ones(hidden),
        f"{p}embed_tokens.weight": w["model.embed_tokens.weight"],
        f"{p}shared_head.head.weight": w["lm_head.weight"],
    })
    return {"target": w}


# ----------------------------------------------------------------------------------------------------------------


def generate_family_weights(pair: str, configs: Dict[str, dict]) -> Tuple[Dict[str, Arrays], Dict[str, Dict[str, str]]]:
    """``pair``'s weights, ``({directory: {HF name: array}}, {directory: {name: safetensors dtype}})``: float
    arrays hold exactly their bf16 values (float32 for the names the second dict marks ``F32``); ``d2t`` / ``t2d``
    are int64 / bool. ``configs`` is :func:`~.family_config.family_configs` ``(pair)``."""
    recipe = _recipe(pair)
    if pair == "qwen3_eagle3":
        raw = _qwen3_eagle3(configs, recipe)
    elif pair == "qwen3_moe":
        target = _embed_and_head(configs["target"], recipe, Draw(recipe, "target"))
        target.update(_qwen3_layers(configs["target"], recipe, Draw(recipe, "target"), moe=True))
        raw = {"target": target,
               "eagle_draft": eagle_weights(configs["eagle_draft"], recipe, Draw(recipe, "eagle_draft"))}
    elif pair == "deepseek_mtp":
        raw = _deepseek_mtp(configs, recipe)
    else:
        raise ValueError(f"unknown model-family pair {pair!r}")
    out, dtypes = {}, {}
    for d, tensors in raw.items():
        out[d], dtypes[d] = {}, {}
        for name, a in sorted(tensors.items()):
            if a.dtype in (np.bool_, np.int64):
                out[d][name] = a
            elif name.endswith(float32_tensors):
                out[d][name], dtypes[d][name] = a.astype(np.float32), "F32"
            else:
                out[d][name] = bf16_round(a)
    return out, dtypes
