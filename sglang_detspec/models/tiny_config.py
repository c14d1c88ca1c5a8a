"""The tiny models' shapes, written once: the embedded pairs' names and the Llama config every tiny model's
``config.json`` starts from (:func:`llama_config`).

Why the shapes are what they are:

* 8 target layers: without explicit aux-layer ids an EAGLE3 target captures layers
  ``[2, L // 2, L - 3]`` (``LlamaForCausalLM.set_eagle3_layers_to_capture``); fewer than 6 layers would
  capture out-of-range layers. The EAGLE3 draft also names them explicitly (``eagle_config``) so the
  choice does not depend on that default.
* ``vocab_size`` equals the tokenizer's size exactly, so every token id the (near-uniform) dummy
  model can sample decodes to real bytes; the tokenizer trainer (:mod:`.tiny_tokenizer`) is asked for that size
  and the build fails loudly if the corpus cannot reach it.
* ``draft_vocab_size == vocab_size`` on the EAGLE3 draft: ``LlamaForCausalLMEagle3`` reads the field
  unconditionally, and equal vocabularies mean no ``d2t`` hot-token map is needed.

Standard library only.
"""

from __future__ import annotations

__all__ = [
    "TINY_PAIRS", "check_pair", "llama_config", "VOCAB_SIZE", "SPECIAL_TOKENS", "BOS_ID", "EOS_ID", "HIDDEN",
    "INTERMEDIATE", "HEADS", "KV_HEADS", "TARGET_LAYERS", "MAX_POS", "ROPE_THETA", "EAGLE3_AUX_LAYER_IDS",
]

# The embedded pairs: "dummy" (config-only, --load-format dummy) and "weighted" (seeded safetensors).
TINY_PAIRS = ("dummy", "weighted")

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")  # ids 0, 1, 2 (the trainer adds specials first)
BOS_ID, EOS_ID = 0, 1
HIDDEN = 256
INTERMEDIATE = 512
HEADS = 4
KV_HEADS = 2
TARGET_LAYERS = 8
#: Positions every tiny config declares: the context length the pairs are served with (``serve`` and the E2E
#: servers), so that ``check``'s long profile can send prompts of 12,000+ tokens in 4096-token chunks without
#: SGLang's "context_length is greater than the derived context_length" override. RoPE has no weights, so the
#: generated weights do not depend on it.
MAX_POS = 16384
ROPE_THETA = 10000.0
# Layer ids the EAGLE3 target exposes to the draft (SGLang adds 1 internally, so these are
# "outputs of layers 1, 3, 4" of 8 -- all in range).
EAGLE3_AUX_LAYER_IDS = [1, 3, 4]


def check_pair(pair: str) -> str:
    """``pair`` if it is one of :data:`TINY_PAIRS`, else a ``ValueError`` naming the choices."""
    if pair not in TINY_PAIRS:
        raise ValueError(f"unknown tiny model pair {pair!r}; choose one of {', '.join(map(repr, TINY_PAIRS))}")
    return pair


def llama_config(num_layers: int, architecture: str) -> dict:
    """The tiny shapes as an HF Llama ``config.json`` dict of ``num_layers`` layers naming ``architecture``."""
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": num_layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-5,
        # Both spellings: transformers 5 reads `rope_parameters`, older readers `rope_theta`.
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
        "initializer_range": 0.02,
        "use_cache": True,
    }
