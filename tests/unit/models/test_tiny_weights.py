"""CPU tests of the weighted tiny pair (sglang_detspec.models.tiny_weights + tiny_reference): byte-stable
bf16 safetensors that SGLang's real model classes load completely, a CPU reference that agrees with HF
transformers' independent Llama, a mostly-bigram target, and an offline accept length inside [1.5, 3.5]."""

import contextlib
import hashlib
import json
import socket

import numpy as np
import pytest
import torch

from sglang_detspec.models import model_cache, tiny_config
from sglang_detspec.models import tiny_models as tm
from sglang_detspec.models import tiny_weights as tw
from sglang_detspec.models.tiny_reference import estimate_accept_length, load_reference, simulate_served_accept_length

# sha256 of the three model.safetensors files. A changed byte must come with a TINY_WEIGHTS_VERSION bump
# (the cache directory is named after it, so stale caches are never served); update both together.
# The same digests on sglang 0.5.17's and 0.5.23's venvs are what "byte-identical across venvs" means.
PINNED_SHA256 = {
    "target": "8bcc32928a3487b39629e18c6c8370724354346021f62ea4bd364720a4d5011f",
    "eagle_draft": "f6f5b2df544311ba2ceb5ea358436fabd02a5dd01c0edd1f3befa4535cbf8ca2",
    "eagle3_draft": "08872632c6386644fd597821852c48e1c146583e9b4791e2b8a251205ab862ea",
}


@pytest.fixture(scope="module")
def weighted(tmp_path_factory):
    return tm.ensure_tiny_models(tmp_path_factory.mktemp("tinyw"), pair="weighted")


@pytest.fixture(scope="module")
def ref(weighted):
    return load_reference(weighted)


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_weighted_layout_and_configs(weighted):
    assert weighted.target.parent.name == tm.cache_dir_name("weighted")
    assert tw.TINY_WEIGHTS_VERSION in weighted.target.parent.name
    for d in weighted:
        assert (d / "model.safetensors").is_file() and (d / "config.json").is_file()
    t, e3 = (json.loads((d / "config.json").read_text()) for d in (weighted.target, weighted.eagle3_draft))
    assert t == json.loads(json.dumps(tiny_config.llama_config(tiny_config.TARGET_LAYERS, "LlamaForCausalLM")))  # same target config
    assert e3["num_key_value_heads"] == e3["num_attention_heads"] == 4  # see tiny_weights' docstring
    assert e3["draft_vocab_size"] == t["vocab_size"]


def test_weighted_builds_are_byte_identical_and_pinned(tmp_path, weighted):
    a = tm.build_tiny_models(tmp_path / "a", pair="weighted")
    tm.build_tiny_models(tmp_path / "b", pair="weighted")
    assert model_cache.tree_digest(tmp_path / "a") == model_cache.tree_digest(tmp_path / "b") == model_cache.tree_digest(weighted.target.parent)
    got = {name: _sha256(d / "model.safetensors") for name, d in zip(("target", "eagle_draft", "eagle3_draft"), a)}
    assert got == PINNED_SHA256, "weights changed: bump TINY_WEIGHTS_VERSION and update PINNED_SHA256"


def test_incomplete_weighted_cache_is_rebuilt(tmp_path):
    final = tmp_path / tm.cache_dir_name("weighted")
    tm.build_tiny_models(final)  # the config-only layout: what a stale or foreign entry could hold
    assert not (final / "target" / "model.safetensors").exists()
    m = tm.ensure_tiny_models(tmp_path, pair="weighted")
    assert all((d / "model.safetensors").is_file() for d in m)


def test_bf16_rounding_matches_torch():
    rng = np.random.RandomState(7)
    x = np.concatenate([
        rng.standard_normal(10000) * 3,
        rng.standard_normal(1000) * 1e-30,  # subnormal range
        # exact ties between two bf16 values (round half to even) and boundary values
        np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 0.0, -0.0, 3.3895e38, 1e-45], dtype=np.float64),
    ]).astype(np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(tw.to_bf16_bits(x), want)
    with pytest.raises(ValueError, match="finite"):
        tw.to_bf16_bits(np.array([np.nan], dtype=np.float32))


def test_safetensors_read_back_with_the_safetensors_library(weighted):
    from safetensors import safe_open

    configs = {k: json.loads((d / "config.json").read_text()) for k, d in zip(("target", "eagle_draft", "eagle3_draft"), weighted)}
    generated = tw.generate_weights(configs)
    for key, d in zip(("target", "eagle_draft", "eagle3_draft"), weighted):
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            assert f.metadata() == {"format": "pt"}
            assert sorted(f.keys()) == sorted(generated[key])
            for name in f.keys():
                t = f.get_tensor(name)
                assert t.dtype == torch.bfloat16
                assert torch.equal(t.float(), torch.from_numpy(generated[key][name])), name


def test_recipe_structure_as_documented(weighted):
    from safetensors.torch import load_file

    t = {k: v.float() for k, v in load_file(str(weighted.target / "model.safetensors")).items()}
    e = {k: v.float() for k, v in load_file(str(weighted.eagle_draft / "model.safetensors")).items()}
    e3 = {k: v.float() for k, v in load_file(str(weighted.eagle3_draft / "model.safetensors")).items()}
    h = t["model.norm.weight"].numel()
    assert abs(t["model.embed_tokens.weight"].std() - 1.0) < 0.02
    assert abs(t["lm_head.weight"].std() * h**0.5 - 3.0) < 0.06
    q, o = t["model.layers.3.self_attn.q_proj.weight"], t["model.layers.3.self_attn.o_proj.weight"]
    assert abs(q.std() * h**0.5 - 1.0) < 0.03 and abs(o.std() * h**0.5 - 0.05) < 0.002
    assert not torch.equal(t["model.layers.0.mlp.up_proj.weight"], t["model.layers.1.mlp.up_proj.weight"])
    # EAGLE fc: [I + noise | 0] on cat(embed, target hidden); no input_layernorm on layer 0.
    fc = e["fc.weight"]
    assert fc.shape == (h, 2 * h) and torch.all(fc[:, h:] == 0) and torch.all(e["fc.bias"] == 0)
    assert abs((fc[:, :h] - torch.eye(h)).std() * h**0.5 - 0.3) < 0.02
    assert not any("input_layernorm" in k or k.startswith("model.") for k in e)
    # EAGLE3: own lm_head equal to the target's, fc 3H -> H.
    assert torch.equal(e3["lm_head.weight"], t["lm_head.weight"])
    assert e3["fc.weight"].shape == (h, 3 * h)


# ---------------------------------------------------------------------------------------------------
# SGLang's own model classes load every tensor (constructed on CPU, real load_weights)
# ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _sglang_single_rank(model_path):
    """A world of one CPU rank (gloo) with server args published, enough to construct SGLang's Llama
    classes on CPU; torn down afterwards so other tests see no process group."""
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_context, get_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with contextlib.ExitStack() as stack:
        stack.enter_context(get_context().override_server_args(model_path=str(model_path), device="cpu"))
        ps.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo"
        )
        stack.callback(ps.destroy_distributed_environment)
        ps.initialize_model_parallel()
        stack.callback(ps.destroy_model_parallel)
        stack.enter_context(get_parallel().override(tp_rank=0, pp_rank=0))  # 0.5.23 reads these explicitly
        yield


def _expected_param(name, params):
    """Where SGLang's loaders put an HF tensor: q/k/v into qkv_proj, gate/up into gate_up_proj
    (returned with the shard's index in the fused tensor), drafts' names under ``model.``."""
    shards = {".q_proj": (".qkv_proj", 0), ".k_proj": (".qkv_proj", 1), ".v_proj": (".qkv_proj", 2),
              ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}
    shard = None
    for hf, (fused, index) in shards.items():
        if hf in name:
            name, shard = name.replace(hf, fused), index
    return (name if name in params else f"model.{name}"), shard


@pytest.mark.parametrize("which, cls_path, shared", [
    ("target", "sglang.srt.models.llama:LlamaForCausalLM", set()),
    # SGLang hands the draft the target's embedding (and, for EAGLE, the lm_head) after loading.
    ("eagle_draft", "sglang.srt.models.llama_eagle:LlamaForCausalLMEagle", {"model.embed_tokens.weight", "lm_head.weight"}),
    ("eagle3_draft", "sglang.srt.models.llama_eagle3:LlamaForCausalLMEagle3", {"model.embed_tokens.weight"}),
])
def test_sglang_load_weights_fills_every_parameter_with_our_tensors(weighted, which, cls_path, shared, monkeypatch):
    import importlib

    from safetensors.torch import load_file
    from transformers import AutoConfig

    # SGLang's rotary embedding picks a fallback CUDA/vLLM kernel unless it believes it runs on its CPU
    # engine; construction is all this test needs, so tell it so.
    import sglang.srt.layers.rotary_embedding.base as rope_base

    monkeypatch.setattr(rope_base, "_is_cpu", True)
    module, cls_name = cls_path.split(":")
    directory = getattr(weighted, which)
    file_tensors = load_file(str(directory / "model.safetensors"))
    with _sglang_single_rank(weighted.target):
        model = getattr(importlib.import_module(module), cls_name)(AutoConfig.from_pretrained(directory))
        params = dict(model.named_parameters())
        with torch.no_grad():
            for p in params.values():
                p.fill_(float("nan"))
        model.load_weights(iter(file_tensors.items()))
    unloaded = {n for n, p in params.items() if torch.isnan(p).any()}
    assert unloaded == shared
    # Every file tensor landed, unchanged, where SGLang reads it (fused shards in order).
    fused = {}
    for name, tensor in sorted(file_tensors.items()):
        target_name, shard = _expected_param(name, params)
        assert target_name in params, f"{name}: no SGLang parameter {target_name}"
        if shard is None:
            assert torch.equal(params[target_name].detach(), tensor.to(params[target_name].dtype)), name
        else:
            fused.setdefault(target_name, {})[shard] = tensor
    for target_name, parts in fused.items():
        want = torch.cat([parts[i] for i in sorted(parts)]).to(params[target_name].dtype)
        assert torch.equal(params[target_name].detach(), want), target_name


# ---------------------------------------------------------------------------------------------------
# The CPU reference
# ---------------------------------------------------------------------------------------------------


def _tokens(seed, n):
    return torch.randint(3, tiny_config.VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(seed))


def test_target_reference_matches_hf_transformers(weighted, ref):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(weighted.target, dtype=torch.float32).eval()
    tokens = _tokens(1, 24)
    with torch.no_grad():
        out = hf(tokens[None], output_hidden_states=True)
    mine = ref.target(tokens)
    torch.testing.assert_close(mine.logits, out.logits[0], rtol=0, atol=1e-4)
    torch.testing.assert_close(mine.hidden, out.hidden_states[-1][0], rtol=0, atol=1e-5)  # after the final norm
    # EAGLE3 aux: the residual stream entering layers aux_id + 1 = HF's hidden_states[aux_id + 1].
    ids = json.loads((weighted.eagle3_draft / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    want_aux = torch.cat([out.hidden_states[i + 1][0] for i in ids], dim=-1)
    torch.testing.assert_close(mine.aux, want_aux, rtol=0, atol=1e-5)


def _hf_draft_layer(ref, kind, attn_in_width):
    """HF's LlamaDecoderLayer (an independent attention/RoPE/MLP) loaded with a draft's layer-0 weights;
    q/k/v take ``attn_in_width`` inputs (2H for EAGLE3's cat(embed, hidden))."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    layer_ref = ref.eagle_layer if kind == "eagle" else ref.eagle3_layer
    cfg = LlamaConfig(**{k: v for k, v in (ref.eagle_cfg if kind == "eagle" else ref.eagle3_cfg).items()
                         if k not in ("architectures", "torch_dtype", "dtype")})
    cfg._attn_implementation = "sdpa"  # causal without an explicit mask
    layer = LlamaDecoderLayer(cfg, layer_idx=0)
    for proj in ("q_proj", "k_proj", "v_proj"):
        w = layer_ref.w[f"self_attn.{proj}.weight"]
        assert w.shape[1] == attn_in_width
        setattr(layer.self_attn, proj, torch.nn.Linear(attn_in_width, w.shape[0], bias=False))
    state = {k: v for k, v in layer_ref.w.items() if not k.startswith("input_layernorm")}
    missing = layer.load_state_dict(state, strict=False).missing_keys
    assert missing == ["input_layernorm.weight"]
    return layer.eval(), LlamaRotaryEmbedding(cfg)


def test_eagle_draft_reference_matches_an_hf_decoder_layer(ref):
    # EAGLE: h = fc(cat(embed(token), hidden)), then a decoder layer whose input_layernorm is the identity.
    layer, rope = _hf_draft_layer(ref, "eagle", tiny_config.HIDDEN)
    layer.input_layernorm = torch.nn.Identity()
    tokens, hidden = _tokens(2, 12), torch.randn(12, tiny_config.HIDDEN, generator=torch.Generator().manual_seed(3))
    h = torch.cat([ref.embed[tokens], hidden], -1) @ ref.eagle_fc_w.T + ref.eagle_fc_b
    pos = torch.arange(12)[None]
    with torch.no_grad():
        want = layer(h[None], position_ids=pos, position_embeddings=rope(h[None], pos))
    want = want[0] if isinstance(want, tuple) else want
    got = ref.eagle(tokens, hidden)
    torch.testing.assert_close(got.hidden, want[0], rtol=0, atol=1e-4)
    torch.testing.assert_close(got.logits, want[0] @ ref.lm_head.T, rtol=0, atol=1e-3)  # no final norm


def test_eagle3_draft_reference_matches_an_hf_attention(ref):
    # EAGLE3 layer 0: attention over cat(input_layernorm(embed), hidden_norm(h)), residual h, then as Llama.
    layer, rope = _hf_draft_layer(ref, "eagle3", 2 * tiny_config.HIDDEN)
    tokens, h = _tokens(4, 10), 3 * torch.randn(10, tiny_config.HIDDEN, generator=torch.Generator().manual_seed(5))
    norm = lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)  # noqa: E731 (weights are 1)
    attn_in = torch.cat([norm(ref.embed[tokens]), norm(h)], -1)[None]
    pos = torch.arange(10)[None]
    with torch.no_grad():
        attn = layer.self_attn(attn_in, position_embeddings=rope(attn_in, pos), attention_mask=None)[0][0]
        x = h + attn
        out = x + layer.mlp(layer.post_attention_layernorm(x))
    got = ref.eagle3(tokens, h)
    torch.testing.assert_close(got.hidden, out, rtol=0, atol=1e-4)
    torch.testing.assert_close(got.logits, norm(out) @ ref.eagle3_lm_head.T, rtol=0, atol=1e-3)


def test_reference_distributions_are_proper(ref):
    context = _tokens(6, 16).tolist()
    p = ref.target(torch.tensor(context)).logits.double().softmax(-1)
    for kind in ("eagle", "eagle3"):
        drafts, logits = ref.draft_chain(kind, context, 3, lambda k, lg: int(lg.argmax()))
        assert len(drafts) == len(logits) == 3
        for lg in logits:
            q = lg.double().softmax(-1)
            assert lg.shape == (tiny_config.VOCAB_SIZE,) and torch.isfinite(lg).all()
            assert torch.all(q >= 0) and abs(float(q.sum()) - 1) < 1e-9
            assert float(q.max()) < 0.99  # a real distribution to sample, not a one-hot
    assert torch.allclose(p.sum(-1), torch.ones(16, dtype=torch.float64))
    # Peaked but not degenerate: well below uniform entropy (ln 1024 = 6.93 nats).
    entropy = -(p * p.log()).sum(-1)
    assert 1.0 < float(entropy.mean()) < 5.0


def test_target_is_mostly_bigram(ref):
    def next_dist(context, last):
        return ref.target(torch.cat([context, torch.tensor([last])])).logits[-1].softmax(-1)

    same, other = [], []
    for i in range(4):
        c1, c2 = _tokens(10 + i, 20), _tokens(20 + i, 20)
        last = int(_tokens(30 + i, 1))
        p1, p2, p3 = next_dist(c1, last), next_dist(c2, last), next_dist(c2, (last + 1) % tiny_config.VOCAB_SIZE)
        same.append(0.5 * float((p1 - p2).abs().sum()))
        other.append(0.5 * float((p2 - p3).abs().sum()))
    # Earlier context moves the distribution a little (total variation), the last token moves it a lot.
    assert 0.005 < max(same) < 0.2
    assert min(other) > 0.8


def test_draft_chain_feeds_the_drafts_own_hidden_state(ref):
    # Chained steps must depend on the chosen draft tokens (the chain really advances).
    context = _tokens(7, 12).tolist()
    for kind in ("eagle", "eagle3"):
        _, a = ref.draft_chain(kind, context, 2, lambda k, lg: 5)
        _, b = ref.draft_chain(kind, context, 2, lambda k, lg: 6)
        assert torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])


# ---------------------------------------------------------------------------------------------------
# Offline accept length
# ---------------------------------------------------------------------------------------------------

_PROMPTS = [_tokens(100 + i, 6).tolist() for i in range(2)]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_accept_length_estimate_is_in_the_goal_range(ref, kind):
    est = estimate_accept_length(ref, kind, prompts=_PROMPTS, new_tokens=24, seed=1)
    assert 1.5 <= est.accept_length <= 3.5, est
    assert est.verify_steps >= 24 / 4 and 0 < est.first_draft_acceptance < 1


def test_estimator_gives_full_length_for_a_perfect_draft_and_little_for_a_bad_one(ref, monkeypatch):
    # A draft whose q is the target's own p accepts every draft (r = 1): accept length = steps + 1.
    def target_as_draft(transform):
        def chain(kind, context, steps, choose):
            drafts, logits = [], []
            for k in range(steps):
                logits.append(transform(ref.target(torch.tensor(context + drafts)).logits[-1]))
                drafts.append(int(choose(k, logits[-1])))
            return drafts, logits

        return chain

    monkeypatch.setattr(ref, "draft_chain", target_as_draft(lambda lg: lg))
    perfect = estimate_accept_length(ref, "eagle", prompts=_PROMPTS[:1], new_tokens=12, seed=2)
    assert perfect.accept_length == pytest.approx(4.0) and perfect.first_draft_acceptance == pytest.approx(1.0)
    # The same peakedness on the wrong tokens: almost every first draft is rejected.
    monkeypatch.setattr(ref, "draft_chain", target_as_draft(lambda lg: lg.roll(1)))
    bad = estimate_accept_length(ref, "eagle", prompts=_PROMPTS[:1], new_tokens=12, seed=2)
    assert bad.accept_length < 1.3 and bad.first_draft_acceptance < 0.3
    # Right, wrong, right: a later draft counts only if every earlier one is accepted, so ~2 tokens per
    # verify (the first draft plus the correction), not ~3.
    def second_wrong(kind, context, steps, choose):
        drafts, logits = [], []
        for k in range(steps):
            lg = ref.target(torch.tensor(context + drafts)).logits[-1]
            logits.append(lg.roll(1) if k == 1 else lg)
            drafts.append(int(choose(k, logits[-1])))
        return drafts, logits

    monkeypatch.setattr(ref, "draft_chain", second_wrong)
    chained = estimate_accept_length(ref, "eagle", prompts=_PROMPTS[:1], new_tokens=12, seed=2)
    assert chained.first_draft_acceptance == pytest.approx(1.0)
    assert 2.0 <= chained.accept_length < 2.4


def test_estimator_validates_its_arguments(ref):
    with pytest.raises(ValueError, match="draft kind"):
        estimate_accept_length(ref, "medusa", prompts=_PROMPTS)
    with pytest.raises(ValueError, match="prompts"):
        estimate_accept_length(ref, "eagle", prompts=[[5]])


def test_served_accept_length_counts_as_a_server_does(ref, monkeypatch):
    # With the target as its own draft every draft is accepted: each verify round adds steps + 1 = 4 tokens.
    def target_as_draft(kind, context, steps, choose):
        drafts, logits = [], []
        for k in range(steps):
            logits.append(ref.target(torch.tensor(context + drafts)).logits[-1])
            drafts.append(int(choose(k, logits[-1])))
        return drafts, logits

    monkeypatch.setattr(ref, "draft_chain", target_as_draft)
    # 24 tokens: the prefill's 1, then 23 from verify rounds of 4 -> 6 rounds (the last one's surplus cut): 24 / 6.
    assert simulate_served_accept_length(ref, prompt=_PROMPTS[0], sequences=2, new_tokens=24).accept_length == 4.0
    # 9 tokens: 8 after the prefill -> 2 rounds: 4.5, above steps + 1, as SGLang reports it (without the prefill's
    # token 3 rounds would give 3.0).
    short = simulate_served_accept_length(ref, prompt=_PROMPTS[0], sequences=2, new_tokens=9)
    assert short.accept_length == 4.5 and short.per_sequence_stderr == 0.0
    with pytest.raises(ValueError, match="new_tokens >= 2"):
        simulate_served_accept_length(ref, prompt=_PROMPTS[0], sequences=1, new_tokens=1)


def test_served_accept_length_of_the_real_draft_is_below_the_maximum(ref):
    est = simulate_served_accept_length(ref, prompt=_PROMPTS[0], sequences=3, new_tokens=12, seed=4)
    assert 1.0 < est.accept_length < 4.0 and est.sequences == 3
