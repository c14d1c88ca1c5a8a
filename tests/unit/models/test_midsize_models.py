"""The serving benchmark's mid-size pair (``sglang_detspec.models.midsize_models``) on CPU: its shapes and configs, a build at
a small shape (the same code the GPU runs at full size), the weighted recipe's structure in it, and the tokenizer
whose every id must decode (bench_serving's random-ids dataset sends any id below ``tokenizer.vocab_size``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sglang_detspec.models import midsize_models as mm

SMALL = mm.MidsizeShape(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, vocab=mm.MIN_VOCAB + 50)


def test_default_shape_is_the_issues_mid_size_llama():
    cfg = mm.midsize_configs(mm.MidsizeShape())
    t, d = cfg["target"], cfg["eagle_draft"]
    assert t["architectures"] == ["LlamaForCausalLM"] and d["architectures"] == ["LlamaForCausalLMEagle"]
    assert 2048 <= t["hidden_size"] <= 4096 and 16 <= t["num_hidden_layers"] <= 32 and t["vocab_size"] >= 32000
    assert t["head_dim"] * t["num_attention_heads"] == t["hidden_size"]
    assert d["num_hidden_layers"] == 1
    for key in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size"):
        assert d[key] == t[key], key
    counts = mm.parameter_count(mm.MidsizeShape())
    assert 0.8e9 < counts["target"] < 1.0e9 and counts["eagle_draft"] < counts["target"] / 10


@pytest.mark.parametrize("kwargs, message", [
    (dict(hidden=100, heads=16), "divide"),
    (dict(heads=16, kv_heads=3), "divide"),
    (dict(vocab=1000), "at least"),
    (dict(layers=0), "positive"),
])
def test_bad_shapes_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mm.MidsizeShape(**kwargs)


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("midsize")
    return mm.build_midsize_pair(root / "a", SMALL, device="cpu"), mm.build_midsize_pair(root / "b", SMALL, device="cpu")


def _load(d: Path):
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def test_small_build_is_deterministic_and_loads_as_bf16(small_pair):
    a, b = small_pair
    for d in ("target", "eagle_draft"):
        assert (getattr(a, d) / "model.safetensors").read_bytes() == (getattr(b, d) / "model.safetensors").read_bytes()
    tensors = _load(a.target)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert sum(t.numel() for t in tensors.values()) == mm.parameter_count(SMALL)["target"]
    assert sum(t.numel() for t in _load(a.eagle_draft).values()) == mm.parameter_count(SMALL)["eagle_draft"]
    assert tensors["model.embed_tokens.weight"].shape == (SMALL.vocab, SMALL.hidden)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (SMALL.kv_heads * SMALL.head_dim, SMALL.hidden)
    stamp = json.loads((a.target.parent / "midsize.json").read_text())
    assert stamp["shape"]["hidden"] == 64 and stamp["recipe"]["eagle_fc_noise"] == mm.MIDSIZE_EAGLE_FC_NOISE


def test_small_build_follows_the_weighted_recipe(small_pair):
    t, e = _load(small_pair[0].target), _load(small_pair[0].eagle_draft)
    h = SMALL.hidden
    fc = e["fc.weight"].float()
    assert fc.shape == (h, 2 * h) and torch.all(fc[:, h:] == 0), "the draft ignores the target's hidden state"
    noise = fc[:, :h] - torch.eye(h)
    assert 0.5 * mm.MIDSIZE_EAGLE_FC_NOISE < noise.std() * h ** 0.5 < 2 * mm.MIDSIZE_EAGLE_FC_NOISE
    assert "layers.0.input_layernorm.weight" not in e, "SGLang's EAGLE layer 0 has no input norm"
    # Residual writes are scaled down (mostly-bigram target), reads are not.
    o = t["model.layers.0.self_attn.o_proj.weight"].float().std() * h ** 0.5
    q = t["model.layers.0.self_attn.q_proj.weight"].float().std() * h ** 0.5
    assert o < 0.1 < 0.5 < q


def test_ensure_builds_once_and_reuses(tmp_path, monkeypatch):
    first = mm.ensure_midsize_pair(tmp_path, SMALL, device="cpu")
    stamp = (first.target.parent / "midsize.json").stat().st_mtime_ns
    monkeypatch.setattr(mm, "build_midsize_pair", lambda *a, **k: pytest.fail("rebuilt a complete pair"))
    again = mm.ensure_midsize_pair(tmp_path, SMALL, device="cpu")
    assert again == first and (first.target.parent / "midsize.json").stat().st_mtime_ns == stamp


def test_tokenizer_has_exactly_vocab_size_tokens_and_every_id_decodes(tmp_path):
    transformers = pytest.importorskip("transformers")
    vocab = 32000
    (tmp_path / "tokenizer.json").write_text(mm.tokenizer_json(vocab), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok.vocab_size == vocab == len(tok)
    assert [tok.convert_ids_to_tokens(i) for i in range(3)] == ["<s>", "</s>", "<unk>"]
    assert all(tok.decode([i]) for i in range(vocab)), "an id that decodes to nothing"
    text = "the river ran past the old mill. 42"
    assert tok.decode(tok.encode(text)) == text
    with pytest.raises(ValueError):
        mm.tokenizer_json(mm.MAX_VOCAB + 1)
