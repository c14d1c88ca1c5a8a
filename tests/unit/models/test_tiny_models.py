"""CPU tests of the tiny offline model dirs (sglang_detspec.models.tiny_models): they load with
transformers, are byte-identical across builds, build without network, and cache atomically."""

import json
import socket

import pytest

from sglang_detspec.models import model_cache, second_eagle_draft, tiny_config, tiny_servers
from sglang_detspec.models import tiny_models as tm


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return root, tm.ensure_tiny_models(root)


def test_layout_and_cache_location(built):
    root, m = built
    assert m.target.parent == m.eagle_draft.parent == m.eagle3_draft.parent
    assert m.target.parent.parent == root
    assert m.target.parent.name == f"tiny-models-v{tm.TINY_MODELS_VERSION}"
    assert {p.name for p in m.target.iterdir()} >= {"config.json", "tokenizer.json", "tokenizer_config.json"}
    # Config-only drafts: served with --load-format dummy, no weight files anywhere.
    assert [p.name for p in m.eagle_draft.iterdir()] == ["config.json"]
    assert [p.name for p in m.eagle3_draft.iterdir()] == ["config.json"]
    assert not any(p.suffix in (".safetensors", ".bin", ".pt") for p in m.target.parent.rglob("*"))
    # Nothing left over from the atomic build.
    assert sorted(p.name for p in root.iterdir()) == [m.target.parent.name]


def test_configs_load_with_transformers(built):
    from transformers import AutoConfig

    _, m = built
    t = AutoConfig.from_pretrained(m.target)
    e = AutoConfig.from_pretrained(m.eagle_draft)
    e3 = AutoConfig.from_pretrained(m.eagle3_draft)
    assert t.architectures == ["LlamaForCausalLM"] and t.model_type == "llama"
    assert e.architectures == ["LlamaForCausalLMEagle"]
    assert e3.architectures == ["LlamaForCausalLMEagle3"]
    assert t.num_hidden_layers == 8
    assert e.num_hidden_layers == e3.num_hidden_layers == 1
    for d in (e, e3):  # the draft shares the target's embedding/lm_head shapes
        assert (d.hidden_size, d.vocab_size, d.num_attention_heads, d.num_key_value_heads) == (
            t.hidden_size, t.vocab_size, t.num_attention_heads, t.num_key_value_heads)
    # LlamaForCausalLMEagle3 reads draft_vocab_size unconditionally; equal vocab means no d2t map.
    raw3 = json.loads((m.eagle3_draft / "config.json").read_text())
    assert raw3["draft_vocab_size"] == t.vocab_size
    aux = raw3["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(aux) == 3 and all(0 <= i + 1 < t.num_hidden_layers for i in aux)
    raw = json.loads((m.target / "config.json").read_text())
    assert raw["torch_dtype"] == "bfloat16"


def test_tokenizer_loads_and_covers_the_vocab(built):
    from transformers import AutoConfig, AutoTokenizer

    _, m = built
    tok = AutoTokenizer.from_pretrained(m.target)
    cfg = AutoConfig.from_pretrained(m.target)
    # Every id the dummy model can sample must be a real token.
    assert len(tok) == cfg.vocab_size
    assert tok.bos_token_id == cfg.bos_token_id == 0
    assert tok.eos_token_id == cfg.eos_token_id == 1
    text = "The river ran past the old mill: speculative decoding, 1234!"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE round-trips arbitrary text
    assert len(ids) < len(text)  # and actually merges (a trained, non-trivial tokenizer)
    assert all(0 <= i < cfg.vocab_size for i in ids)


def test_builds_are_byte_identical(tmp_path):
    a = tm.build_tiny_models(tmp_path / "a")
    b = tm.build_tiny_models(tmp_path / "b")
    assert model_cache.tree_digest(tmp_path / "a") == model_cache.tree_digest(tmp_path / "b")
    for x, y in zip(a, b):
        for f in sorted(p.name for p in x.iterdir()):
            assert (x / f).read_bytes() == (y / f).read_bytes(), f


def test_build_needs_no_network(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("tiny model build tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tm.build_tiny_models(tmp_path / "m")
    assert (tmp_path / "m" / "target" / "tokenizer.json").is_file()


def test_default_root_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache.default_cache_root() == tmp_path / "xdg" / "sglang-detspec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_cache.default_cache_root() == tmp_path / "home" / ".cache" / "sglang-detspec"


def test_cache_is_reused_not_rebuilt(built, monkeypatch):
    root, m = built
    before = {p: p.stat().st_mtime_ns for p in m.target.parent.rglob("*") if p.is_file()}

    def fail(*a, **k):
        raise AssertionError("cached tiny models were rebuilt")

    monkeypatch.setattr(tm, "build_tiny_models", fail)
    again = tm.ensure_tiny_models(root)
    assert again == m
    assert {p: p.stat().st_mtime_ns for p in m.target.parent.rglob("*") if p.is_file()} == before


def test_incomplete_cache_entry_is_replaced(tmp_path):
    final = tmp_path / f"tiny-models-v{tm.TINY_MODELS_VERSION}"
    (final / "target").mkdir(parents=True)
    (final / "target" / "config.json").write_text("{}")  # a half-written dir from a killed build
    m = tm.ensure_tiny_models(tmp_path)
    assert (m.target / "tokenizer.json").is_file() and (m.eagle3_draft / "config.json").is_file()
    tm.build_tiny_models(tmp_path / "ref")
    assert model_cache.tree_digest(final) == model_cache.tree_digest(tmp_path / "ref")


def test_lost_race_keeps_the_winner(tmp_path, monkeypatch):
    # Simulate another process finishing first: the rename target appears during our build.
    real_build = tm.build_tiny_models
    final = tmp_path / f"tiny-models-v{tm.TINY_MODELS_VERSION}"

    def racing_build(dest, *, pair):
        real_build(final, pair=pair)  # the "other process"
        return real_build(dest, pair=pair)

    monkeypatch.setattr(tm, "build_tiny_models", racing_build)
    m = tm.ensure_tiny_models(tmp_path)
    assert m.target == final / "target"
    assert sorted(p.name for p in tmp_path.iterdir()) == [final.name]  # temp dir cleaned up


def test_pair_names_and_server_flags():
    assert tiny_config.TINY_PAIRS == ("dummy", "weighted")
    assert tiny_servers.server_flags("dummy") == tiny_servers.TINY_SERVER_FLAGS
    dummy = dict(tiny_servers.server_flags("dummy"))
    weighted = dict(tiny_servers.server_flags("weighted"))
    assert dummy["--load-format"] == ("dummy",) and dummy["--speculative-draft-load-format"] == ("dummy",)
    # The weighted pair loads its safetensors: no load-format override, every other flag the same.
    assert not any("load-format" in flag for flag in weighted)
    assert {k: v for k, v in dummy.items() if "load-format" not in k} == weighted
    for bad in ("Dummy", "", "weights"):
        with pytest.raises(ValueError, match="'dummy', 'weighted'"):
            tiny_servers.server_flags(bad)
        with pytest.raises(ValueError, match="unknown tiny model pair"):
            tm.ensure_tiny_models(pair=bad)
    assert tm.cache_dir_name("dummy") == f"tiny-models-v{tm.TINY_MODELS_VERSION}"
    assert tm.cache_dir_name("weighted") != tm.cache_dir_name("dummy")


# ---------------------------------------------------------------------------------------------------
# The second EAGLE draft (speculation-invariance E2E test): the pair's recipe, another seed
# ---------------------------------------------------------------------------------------------------


def _safetensors(path):
    """{name: float32 array}: numpy has no bfloat16, so through torch."""
    from safetensors.torch import load_file

    return {name: t.float().numpy() for name, t in load_file(str(path)).items()}


@pytest.fixture(scope="module")
def weighted_and_draft2(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-draft2")
    return root, tm.ensure_tiny_models(root, pair="weighted"), second_eagle_draft.ensure_second_eagle_draft(root)


def test_second_draft_with_the_pairs_seed_is_the_pairs_draft(tmp_path, weighted_and_draft2):
    """"The same recipe": under the pair's own recipe seed the builder writes the pair's eagle_draft byte for byte."""
    from sglang_detspec.models.tiny_weights import DEFAULT_RECIPE

    _, models, _ = weighted_and_draft2
    same = second_eagle_draft.build_second_eagle_draft(tmp_path / "same", seed=DEFAULT_RECIPE.seed)
    assert model_cache.tree_digest(same) == model_cache.tree_digest(models.eagle_draft)


def test_second_draft_differs_in_every_drawn_tensor_only(weighted_and_draft2):
    root, models, draft2 = weighted_and_draft2
    assert draft2.parent == root and draft2.name == second_eagle_draft.second_eagle_draft_dir_name()
    assert str(second_eagle_draft.SECOND_EAGLE_DRAFT_SEED) in draft2.name
    assert sorted(p.name for p in draft2.iterdir()) == ["config.json", "model.safetensors"]
    assert (draft2 / "config.json").read_bytes() == (models.eagle_draft / "config.json").read_bytes()
    a, b = _safetensors(models.eagle_draft / "model.safetensors"), _safetensors(draft2 / "model.safetensors")
    assert sorted(a) == sorted(b) and all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    # Drawn from the seed: fc (noise on the identity) and the decoder layer's matrices; not drawn: fc.bias, norms.
    differ = sorted(k for k in a if (a[k] != b[k]).any())
    same = sorted(k for k in a if k not in differ)
    assert "fc.weight" in differ and all(k.endswith(".weight") for k in differ)
    assert any("self_attn" in k for k in differ) and any("mlp" in k for k in differ)
    assert all(k == "fc.bias" or "layernorm" in k for k in same), same
    # Still the recipe's draft: the token half of fc is the identity plus small noise, the hidden half zero.
    import numpy as np

    fc = b["fc.weight"].astype(np.float32)
    hidden = fc.shape[0]
    assert np.abs(fc[:, hidden:]).max() == 0
    noise = fc[:, :hidden] - np.eye(hidden, dtype=np.float32)
    assert 0.01 < noise.std() < 0.05  # eagle_fc_noise / sqrt(H) = 0.3 / 16


def test_second_draft_builds_are_byte_identical_and_cached(tmp_path, weighted_and_draft2, monkeypatch):
    root, _, draft2 = weighted_and_draft2
    again = second_eagle_draft.build_second_eagle_draft(tmp_path / "again")
    assert model_cache.tree_digest(again) == model_cache.tree_digest(draft2)

    def fail(*a, **k):
        raise AssertionError("the cached second draft was rebuilt")

    monkeypatch.setattr(second_eagle_draft, "build_second_eagle_draft", fail)
    assert second_eagle_draft.ensure_second_eagle_draft(root) == draft2
    assert not [p.name for p in root.iterdir() if p.name.startswith(".tiny-eagle-draft-")]


def test_incomplete_second_draft_is_rebuilt(tmp_path):
    stale = tmp_path / second_eagle_draft.second_eagle_draft_dir_name()
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # no weights: an interrupted build
    d = second_eagle_draft.ensure_second_eagle_draft(tmp_path)
    assert d == stale and (d / "model.safetensors").is_file()
    assert json.loads((d / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle"]


def test_second_draft_is_as_good_a_draft_on_the_cpu_reference(weighted_and_draft2):
    """Its offline accept length (rejection sampling, the pair's estimator) is in the pair's goal range, so the E2E
    comparison of two drafts compares two drafts that are both really accepted."""
    import torch

    from sglang_detspec.models.tiny_reference import estimate_accept_length, load_reference

    _, models, draft2 = weighted_and_draft2
    ref = load_reference(tm.TinyModels(models.target, draft2, None))
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, tiny_config.VOCAB_SIZE, (6,), generator=gen).tolist() for _ in range(2)]
    est = estimate_accept_length(ref, "eagle", prompts=prompts, new_tokens=24, seed=1)
    assert 1.5 <= est.accept_length <= 3.5, est


def _flag(argv, flag):
    return argv[len(argv) - 1 - argv[::-1].index(flag) + 1]


def test_every_tiny_config_declares_the_context_length_it_is_served_with(tmp_path, monkeypatch):
    """SGLang warns that outputs may be wrong when --context-length exceeds what a model's config derives (and
    refuses it without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN): target and every draft must declare the context
    length ``serve`` and the E2E servers pass. Read through SGLang's own derivation."""
    pytest.importorskip("sglang")
    from transformers import AutoConfig

    from sglang.srt.utils.hf_transformers_utils import get_context_length

    from sglang_detspec import serve
    from sglang_detspec.models.mtp_draft import ensure_mtp_draft

    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    models = tm.ensure_tiny_models(tmp_path, pair="dummy")  # the weighted pair's configs are the same builders'
    cmd, env_changes = serve.build_serve_command(
        model_path=None, draft_model_path=None, algorithm="DETSPEC_EAGLE", steps=3, topk=1, draft_tokens=None,
        attention_backend="triton", host="127.0.0.1", port=30000, tiny_models_dir=str(tmp_path), tiny_pair="dummy")
    served = {int(_flag(cmd, "--context-length")),
              int(_flag(tiny_servers.common_args(models.target, "dummy"), "--context-length"))}
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" not in env_changes
    for d in (*models, ensure_mtp_draft(tmp_path, pair="dummy")):
        derived = get_context_length(AutoConfig.from_pretrained(d))
        assert max(served) <= derived, f"{d.name}: served with {max(served)} positions, its config derives {derived}"
