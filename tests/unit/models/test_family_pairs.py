"""CPU tests of the model-family pair builders (sglang_detspec.models.family_pairs): layout and versioned cache,
byte-identical builds (pinned, so both SGLang venvs build the same bytes), SGLang's own config parsing of every
directory, the reduced-vocabulary maps, and ``serve --tiny-pair`` through SGLang's resolution with the plugin."""

import hashlib
import json
import os
import shlex
import subprocess
import sys

import pytest
import torch

from sglang_detspec.models import family_config as fc
from sglang_detspec.models import family_pairs as fp
from sglang_detspec.models import model_cache, tiny_servers

# sha256 of each directory's model.safetensors. A changed byte must come with a FAMILY_VERSIONS bump (the cache
# directory is named after it, so a stale cache is never served); update both together.
PINNED_SHA256 = {
    "qwen3_eagle3": {"target": "a188dd45ddc5d62c1387e923331a6cb13620ee5cae06beba904570d733ce5982",
                     "eagle3_draft": "3f20f508f07fb6a9c40eec9f32c692f45547907b8355588edb44772bcf8a77da"},
    "qwen3_moe": {"target": "8f2f95d87024038354169915bc4e284a04b5e6af97e8a8e1bb24aa8b3aea340f",
                  "eagle_draft": "7f68cbe11bb013f10ce3c5926c29e76b52da59680fbb3dba2586c12223ac24a2"},
    "deepseek_mtp": {"target": "1b82b7cd63bbd72fa62a115cc32a7924a26ea2a2cd604cce58773e8157ef8531"},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return root, {pair: fp.ensure_family_pair(root, pair) for pair in fc.FAMILY_PAIRS}


def test_layout_and_cache_names(built):
    root, pairs = built
    assert sorted(p.name for p in root.iterdir()) == sorted(f"family-{p}-v{fc.FAMILY_VERSIONS[p]}" for p in pairs)
    for pair, models in pairs.items():
        assert models.target.parent.name == fp.family_cache_dir_name(pair)
        assert {p.name for p in models.target.iterdir()} == {
            "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "generation_config.json"}
        if pair == "deepseek_mtp":
            assert models.draft == models.target  # the checkpoint carries its MTP layer
        else:
            assert models.draft.parent == models.target.parent
            assert sorted(p.name for p in models.draft.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("pair", fc.FAMILY_PAIRS)
def test_builds_are_byte_identical_and_pinned(tmp_path, built, pair):
    _, pairs = built
    a = fp.build_family_pair(tmp_path / "a", pair)
    fp.build_family_pair(tmp_path / "b", pair)
    assert model_cache.tree_digest(tmp_path / "a") == model_cache.tree_digest(tmp_path / "b") == model_cache.tree_digest(
        pairs[pair].target.parent)
    got = {d.name: hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() for d in set(a)}
    assert got == PINNED_SHA256[pair], "weights changed: bump FAMILY_VERSIONS[pair] and update PINNED_SHA256"
    # The tokenizer is the tiny pairs' own.
    from sglang_detspec.models.tiny_tokenizer import train_tokenizer_json

    assert (a.target / "tokenizer.json").read_text(encoding="utf-8") == train_tokenizer_json()


def test_cache_is_reused_and_an_incomplete_entry_rebuilt(tmp_path, built, monkeypatch):
    root, pairs = built

    def fail(*a, **k):
        raise AssertionError("a cached family pair was rebuilt")

    with monkeypatch.context() as m:
        m.setattr(fp, "build_family_pair", fail)
        assert fp.ensure_family_pair(root, "qwen3_moe") == pairs["qwen3_moe"]
    stale = tmp_path / fp.family_cache_dir_name("qwen3_moe")
    (stale / "target").mkdir(parents=True)
    (stale / "target" / "config.json").write_text("{}")  # a killed build's leftovers
    models = fp.ensure_family_pair(tmp_path, "qwen3_moe")
    assert model_cache.tree_digest(models.target.parent) == model_cache.tree_digest(pairs["qwen3_moe"].target.parent)
    assert sorted(p.name for p in tmp_path.iterdir()) == [stale.name]


def test_unknown_pair_is_refused(tmp_path):
    for bad in ("qwen3", "Qwen3_MoE", "weighted"):
        with pytest.raises(ValueError, match="'qwen3_eagle3', 'qwen3_moe', 'deepseek_mtp'"):
            fp.ensure_family_pair(tmp_path, bad)
    assert not list(tmp_path.iterdir())


def test_reduced_vocabulary_maps_are_consistent(built):
    from safetensors import safe_open

    _, pairs = built
    draft = pairs["qwen3_eagle3"].draft
    cfg = json.loads((draft / "config.json").read_text())
    target_vocab = json.loads((pairs["qwen3_eagle3"].target / "config.json").read_text())["vocab_size"]
    assert cfg["draft_vocab_size"] == fc.DRAFT_VOCAB_SIZE < cfg["vocab_size"] == target_vocab
    with safe_open(str(draft / "model.safetensors"), "pt") as f:
        d2t, t2d, head = f.get_tensor("d2t"), f.get_tensor("t2d"), f.get_tensor("lm_head.weight")
    assert d2t.dtype == torch.int64 and d2t.shape == (fc.DRAFT_VOCAB_SIZE,)
    assert t2d.dtype == torch.bool and t2d.shape == (target_vocab,)
    assert head.shape[0] == fc.DRAFT_VOCAB_SIZE
    hot = d2t + torch.arange(fc.DRAFT_VOCAB_SIZE)  # SGLang's hot_token_id (llama_eagle3.py)
    assert hot.unique().numel() == fc.DRAFT_VOCAB_SIZE and int(hot.min()) >= 0 and int(hot.max()) < target_vocab
    assert torch.all(t2d[hot]) and int(t2d.sum()) == fc.DRAFT_VOCAB_SIZE  # t2d marks exactly the hot ids
    assert torch.all(hot[1:] > hot[:-1]) and torch.all(d2t >= 0)  # ascending, as published drafts order them
    assert int(hot.min()) >= 3  # no special token is hot: the target's frequent tokens are ordinary ones


_EXPECTED_MODEL_CONFIG = {  # (directory, as a draft?) -> architecture SGLang serves, attention kind
    ("qwen3_eagle3", "target", False): ("Qwen3ForCausalLM", "MHA"),
    ("qwen3_eagle3", "draft", True): ("LlamaForCausalLMEagle3", "MHA"),
    ("qwen3_moe", "target", False): ("Qwen3MoeForCausalLM", "MHA"),
    ("qwen3_moe", "draft", True): ("LlamaForCausalLMEagle", "MHA"),
    ("deepseek_mtp", "target", False): ("DeepseekV3ForCausalLM", "MLA"),
    ("deepseek_mtp", "draft", True): ("DeepseekV3ForCausalLMNextN", "MLA"),  # SGLang's draft rewrite
}


@pytest.mark.parametrize("pair, which, is_draft", list(_EXPECTED_MODEL_CONFIG), ids=lambda v: str(v))
def test_every_directory_parses_with_sglangs_model_config(built, pair, which, is_draft):
    pytest.importorskip("sglang")
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    _, pairs = built
    directory = getattr(pairs[pair], which)
    mc = ModelConfig(str(directory), is_draft_model=is_draft)
    arch, attention = _EXPECTED_MODEL_CONFIG[(pair, which, is_draft)]
    assert mc.hf_config.architectures == [arch]
    assert mc.attention_arch == getattr(AttentionArch, attention)
    assert mc.vocab_size == fc.VOCAB_SIZE and mc.hidden_size == fc.family_configs(pair)["target"]["hidden_size"]
    assert mc.context_len == fc.MAX_POS  # what serve and the E2E servers pass as --context-length
    raw = json.loads((directory / "config.json").read_text())
    if attention == "MLA":
        assert (mc.kv_lora_rank, mc.qk_rope_head_dim) == (raw["kv_lora_rank"], raw["qk_rope_head_dim"])
    else:
        assert (mc.head_dim, mc.get_num_kv_heads(1)) == (raw["head_dim"], raw["num_key_value_heads"])


def test_server_flags_of_the_family_pairs():
    weighted = tiny_servers.server_flags("weighted")
    for pair in fc.FAMILY_PAIRS:
        assert tiny_servers.server_flags(pair) == weighted  # generated safetensors: no load-format override
    assert tiny_servers.SERVABLE_PAIRS[-3:] == fc.FAMILY_PAIRS
    with pytest.raises(ValueError, match="'deepseek_mtp'"):
        tiny_servers.server_flags("deepseek")


# ---------------------------------------------------------------------------------------------------
# serve --tiny-pair NAME --dry-run: SGLang's parser and resolution, with the plugin loaded (a subprocess each)
# ---------------------------------------------------------------------------------------------------


def _serve_dry_run(root, *args):
    proc = subprocess.run([sys.executable, "-m", "sglang_detspec", "serve", "--dry-run", "--tiny-models-dir", str(root),
                           *args], capture_output=True, text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _opt(argv, flag):
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("pair", ["qwen3_moe", "deepseek_mtp"])
def test_serve_dry_run_resolves_the_eagle_family_pairs(built, pair):
    pytest.importorskip("sglang")
    root, pairs = built
    proc = _serve_dry_run(root, "--tiny-pair", pair)
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout.strip())
    argv = argv[argv.index("sglang.launch_server") + 1:]
    assert _opt(argv, "--model-path") == str(pairs[pair].target)
    assert _opt(argv, "--speculative-draft-model-path") == str(pairs[pair].draft)
    assert _opt(argv, "--attention-backend") == "triton"
    assert ("algorithm DETSPEC_EAGLE, steps 3, topk 1, draft tokens 4, rejection sampling on, "
            "deterministic inference on, attention backend triton") in proc.stderr


def test_serve_dry_run_of_the_reduced_vocabulary_pair(built):
    """Resolution either accepts the reduced-vocabulary EAGLE3 draft or refuses it at start-up with the plugin's
    draft-vocabulary refusal naming both sizes (until reduced vocabularies are supported): never later, never
    another error."""
    pytest.importorskip("sglang")
    root, pairs = built
    proc = _serve_dry_run(root, "--tiny-pair", "qwen3_eagle3", "--algorithm", "DETSPEC_EAGLE3")
    if proc.returncode == 0:
        assert str(pairs["qwen3_eagle3"].draft) in proc.stdout
        assert "algorithm DETSPEC_EAGLE3, steps 3, topk 1, draft tokens 4, rejection sampling on" in proc.stderr
    else:
        assert proc.returncode == 2, proc.stderr
        assert f"a draft vocabulary of {fc.DRAFT_VOCAB_SIZE} tokens (target: {fc.VOCAB_SIZE})" in proc.stderr


def test_serve_refuses_an_algorithm_the_pairs_draft_does_not_fit(built):
    root, _ = built
    proc = _serve_dry_run(root, "--tiny-pair", "qwen3_eagle3")  # the default algorithm, DETSPEC_EAGLE
    assert proc.returncode == 2
    assert "--tiny-pair qwen3_eagle3 is served with --algorithm DETSPEC_EAGLE3 or DETSPEC_EAGLE3_INVARIANT" in proc.stderr
    assert proc.stdout == ""


def test_deepseek_hidden_size_fits_sglangs_fused_nextn_norm(built):
    """SGLang's CUDA NEXTN layer runs ``fused_eh_norm``, which refuses some hidden sizes: with one it refuses, every
    deepseek_mtp server died in draft CUDA-graph capture (H100, 2026-12-06)."""
    eh_norm = pytest.importorskip("sglang.kernels.ops.layernorm.fused_eh_norm")
    _, pairs = built
    hidden = json.loads((pairs["deepseek_mtp"].target / "config.json").read_text())["hidden_size"]
    assert eh_norm.is_supported_fused_eh_norm_hidden_size(hidden), hidden
    assert not eh_norm.is_supported_fused_eh_norm_hidden_size(fc.HIDDEN)  # control: the tiny pairs' 256 is refused


def test_sglang_recognises_the_deepseek_target_in_deterministic_mode(built):
    """SGLang's deterministic mode restricts DeepSeek models' attention backends (fa3 / fa4 / triton): the target
    is recognised as one, so flashinfer is refused at resolution."""
    pytest.importorskip("sglang")
    root, _ = built
    proc = _serve_dry_run(root, "--tiny-pair", "deepseek_mtp", "--attention-backend", "flashinfer")
    assert proc.returncode == 2
    assert "attention backends are supported for deterministic inference with" in proc.stderr
    assert "flashinfer" in proc.stderr
