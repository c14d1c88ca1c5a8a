"""CPU tests of the model-family pairs' weights (sglang_detspec.models.family_weights + family_reference): SGLang's own
model classes consume every tensor and fill every parameter, transformers' own target classes run them, the targets
are mostly bigram models, the reduced-vocabulary draft proposes only hot tokens, and the offline accept length lies in
the issue's [1.5, 3.5] of 4."""

import contextlib
import importlib
import json
import socket

import numpy as np
import pytest
import torch

from sglang_detspec.models import family_config as fc
from sglang_detspec.models.family_pairs import ensure_family_pair
from sglang_detspec.models.family_reference import DRAFT_KIND, load_family_reference
from sglang_detspec.models.tiny_reference import estimate_accept_length


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {pair: ensure_family_pair(root, pair) for pair in fc.FAMILY_PAIRS}


@pytest.fixture(scope="module")
def refs(pairs):
    return {pair: load_family_reference(pairs[pair], pair) for pair in fc.FAMILY_PAIRS}


def _tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _tokens(seed, n):
    return torch.randint(3, fc.VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------
# SGLang's own model classes (constructed on CPU, real load_weights) consume every tensor
# ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _sglang_single_rank(model_path):
    """A world of one CPU rank (gloo) with server args published, enough to construct SGLang's Qwen3, Qwen3-MoE,
    Llama-EAGLE and DeepSeek-V3 classes on CPU; torn down afterwards so other tests see no process group."""
    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_context, get_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = dict(tp_rank=0, pp_rank=0, attn_dp_size=1, attn_dp_rank=0, attn_tp_size=1, attn_tp_rank=0,
                 moe_ep_rank=0, moe_tp_rank=0, moe_dp_rank=0)
    # 0.5.23 reads the MoE ranks explicitly (FusedMoE); 0.5.17 has no such fields and reads them from the groups.
    fields = getattr(runtime_context, "_parallel_fields", None)
    known = fields() if fields is not None else {k for k in ranks if not k.startswith("moe_")}
    with contextlib.ExitStack() as stack:
        stack.enter_context(get_context().override_server_args(model_path=str(model_path), device="cpu"))
        ps.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo"
        )
        stack.callback(ps.destroy_distributed_environment)
        ps.initialize_model_parallel()
        stack.callback(ps.destroy_model_parallel)
        stack.enter_context(get_parallel().override(**{k: v for k, v in ranks.items() if k in known}))
        yield


def _mtp(name):
    return name.startswith(f"model.layers.{fc.DEEPSEEK_LAYERS}.")


# (pair, directory, SGLang class, parameters SGLang shares from the target after loading, file tensors its loader
# skips on purpose). The skipped sets are SGLang's documented behaviour: llama_eagle3.py turns d2t into
# hot_token_id and skips t2d; DeepseekV3ForCausalLM skips layers >= num_hidden_layers (the MTP layer);
# DeepseekV3ForCausalLMNextN reads only model.layers.{L}.* and skips its embed_tokens / shared_head.head
# (deepseek_weight_loader.py, "Use shared head and embed weights from target model").
_SGLANG_CASES = [
    ("qwen3_eagle3", "target", "sglang.srt.models.qwen3:Qwen3ForCausalLM", set(), lambda n: False),
    ("qwen3_eagle3", "draft", "sglang.srt.models.llama_eagle3:LlamaForCausalLMEagle3", {"model.embed_tokens.weight"},
     lambda n: n in ("d2t", "t2d")),
    ("qwen3_moe", "target", "sglang.srt.models.qwen3_moe:Qwen3MoeForCausalLM", set(), lambda n: False),
    ("qwen3_moe", "draft", "sglang.srt.models.llama_eagle:LlamaForCausalLMEagle",
     {"model.embed_tokens.weight", "lm_head.weight"}, lambda n: False),
    ("deepseek_mtp", "target", "sglang.srt.models.deepseek_v2:DeepseekV3ForCausalLM", set(), _mtp),
    ("deepseek_mtp", "draft", "sglang.srt.models.deepseek_nextn:DeepseekV3ForCausalLMNextN",
     {"model.embed_tokens.weight", "lm_head.weight"},
     lambda n: not _mtp(n) or n.endswith(("embed_tokens.weight", "shared_head.head.weight"))),
]


@pytest.mark.parametrize("pair, which, cls_path, shared, skipped", _SGLANG_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in _SGLANG_CASES])
def test_sglang_load_weights_consumes_every_tensor_and_fills_every_parameter(pairs, pair, which, cls_path, shared,
                                                                             skipped, monkeypatch):
    """Each tensor is loaded once with its real values (SGLang's loaders assert every shape) and once replaced by a
    constant tag equal to its index: the tags found in the parameters afterwards name exactly the tensors SGLang's
    loader consumed (fused q/k/v, gate/up, per-expert and q_a/kv_a_with_mqa shards included)."""
    from transformers import AutoConfig

    import sglang.srt.layers.rotary_embedding.base as rope_base

    monkeypatch.setattr(rope_base, "_is_cpu", True)  # SGLang's torch-native rotary embedding, as its CPU engine
    if pair == "deepseek_mtp":
        # SGLang's CPU engine builds DeepSeek's rope only for yarn-scaled checkpoints (get_rope_cpu asserts
        # rope_scaling); ours has plain RoPE, which the GPU path builds.
        import sglang.srt.models.deepseek_v2 as dsv2

        build_rope = dsv2.get_rope_wrapper
        monkeypatch.setattr(dsv2, "get_rope_wrapper", lambda *a, device=None, **k: build_rope(*a, device=None, **k))
    module, cls_name = cls_path.split(":")
    directory = getattr(pairs[pair], which)
    file_tensors = _tensors(directory)
    cfg = AutoConfig.from_pretrained(directory)
    if cls_name.endswith("NextN"):
        cfg.architectures = ["DeepseekV3ForCausalLMNextN"]  # SGLang's draft rewrite (ModelConfig, is_draft_model)
    tags = {name: i + 1 for i, name in enumerate(sorted(n for n, t in file_tensors.items() if t.is_floating_point()))}
    assert len(tags) < 256  # exact in bf16 too
    with _sglang_single_rank(pairs[pair].target):
        model = getattr(importlib.import_module(module), cls_name)(cfg)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for p in params.values():
                p.fill_(float("nan"))
        model.load_weights(iter(file_tensors.items()))
        unloaded = {n for n, p in params.items() if torch.isnan(p.float()).any()}
        hot = getattr(model, "hot_token_id", None)
        with torch.no_grad():
            for p in params.values():
                p.fill_(float("nan"))
        model.load_weights((n, torch.full_like(t, float(tags[n])) if n in tags else t) for n, t in file_tensors.items())
    assert unloaded == shared
    seen = set()
    for p in params.values():
        values = p.detach().float()
        seen |= {int(v) for v in values[~torch.isnan(values)].unique().tolist()}
    consumed = {n for n, tag in tags.items() if tag in seen}
    assert consumed == {n for n in tags if not skipped(n)}
    if "d2t" in file_tensors:  # the reduced vocabulary: hot_token_id = d2t + arange, the target ids of the draft's
        assert torch.equal(hot, file_tensors["d2t"] + torch.arange(fc.DRAFT_VOCAB_SIZE))
        assert params["lm_head.weight"].shape[0] == fc.DRAFT_VOCAB_SIZE
    else:
        assert hot is None


# ---------------------------------------------------------------------------------------------------
# transformers' own target classes, and the recipe as documented
# ---------------------------------------------------------------------------------------------------

_HF_CLASSES = {"qwen3_eagle3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
               "deepseek_mtp": "DeepseekV3ForCausalLM"}


@pytest.mark.parametrize("pair", fc.FAMILY_PAIRS)
def test_targets_run_in_transformers_own_classes(refs, pair):
    import transformers

    ref = refs[pair]
    assert type(ref.hf) is getattr(transformers, _HF_CLASSES[pair])
    out = ref.target(_tokens(1, 9))
    assert out.logits.shape == (9, fc.VOCAB_SIZE) and torch.isfinite(out.logits).all()
    # The hidden state handed to an EAGLE / NEXTN draft is the final norm's output: the lm_head's input.
    torch.testing.assert_close(out.hidden @ ref.lm_head.T, out.logits, rtol=0, atol=1e-4)
    assert 1.5 < float(out.logits.std()) < 5  # peaked distributions (lm_head std 3 / sqrt(H) on a unit-RMS state)


def test_recipe_structure_as_documented(pairs):
    q3, q3d = _tensors(pairs["qwen3_eagle3"].target), _tensors(pairs["qwen3_eagle3"].draft)
    assert q3["model.layers.0.self_attn.q_proj.weight"].shape == (fc.HEADS * fc.QWEN3_HEAD_DIM, fc.HIDDEN)
    assert q3["model.layers.0.self_attn.q_norm.weight"].shape == (fc.QWEN3_HEAD_DIM,)
    assert q3d["d2t"].dtype == torch.int64 and q3d["t2d"].dtype == torch.bool
    hot = q3d["d2t"] + torch.arange(fc.DRAFT_VOCAB_SIZE)
    assert torch.equal(q3d["lm_head.weight"], q3["lm_head.weight"][hot])  # the target's hot rows
    moe = _tensors(pairs["qwen3_moe"].target)
    assert moe["model.layers.2.mlp.gate.weight"].shape == (fc.MOE_EXPERTS, fc.HIDDEN)
    assert moe["model.layers.2.mlp.experts.7.down_proj.weight"].shape == (fc.HIDDEN, fc.MOE_INTERMEDIATE)
    ds = _tensors(pairs["deepseek_mtp"].target)
    layers = fc.DEEPSEEK_LAYERS
    assert "model.layers.0.mlp.gate_proj.weight" in ds and "model.layers.0.mlp.gate.weight" not in ds  # dense first
    assert ds["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32  # as DeepSeek-V3 ships it
    assert ds["model.layers.1.mlp.shared_experts.down_proj.weight"].shape == (fc.DEEPSEEK_HIDDEN, fc.MOE_INTERMEDIATE)
    m = f"model.layers.{layers}."
    assert torch.equal(ds[f"{m}embed_tokens.weight"], ds["model.embed_tokens.weight"])
    assert torch.equal(ds[f"{m}shared_head.head.weight"], ds["lm_head.weight"])
    eh = ds[f"{m}eh_proj.weight"].float()
    h = fc.DEEPSEEK_HIDDEN
    assert eh.shape == (h, 2 * h) and abs((eh[:, :h] - torch.eye(h)).std() * h**0.5 - 0.3) < 0.03
    others = [t for n, t in {**q3, **moe, **ds}.items() if n.endswith("_proj.weight") and "eh_proj" not in n]
    assert all(t.dtype == torch.bfloat16 for t in others)


def test_hot_tokens_are_the_targets_most_frequent(refs, pairs):
    """Independent of the builder's numpy forward: transformers' Qwen3 gives every one-token context's next-token
    distribution; the top draft_vocab_size tokens of that bigram chain's stationary distribution are the hot set, and
    the hot set holds most of the target's mass in longer contexts too."""
    ref = refs["qwen3_eagle3"]
    with torch.no_grad():
        probs = ref.hf(torch.arange(fc.VOCAB_SIZE)[:, None]).logits[:, 0].double().softmax(-1)
    pi = torch.full((fc.VOCAB_SIZE,), 1.0 / fc.VOCAB_SIZE, dtype=torch.float64)
    for _ in range(200):
        pi = pi @ probs
    top = set(torch.topk(pi, fc.DRAFT_VOCAB_SIZE).indices.tolist())
    hot = set(ref.hot_token_ids.tolist())
    assert len(top & hot) >= fc.DRAFT_VOCAB_SIZE - 2  # float32 vs float64 may swap a near-tie at the boundary
    mass = ref.target(_tokens(3, 40)).logits.double().softmax(-1)[:, ref.hot_token_ids].sum(-1)
    assert float(mass.mean()) > 0.7 and float(pi[ref.hot_token_ids].sum()) > 0.7


def test_reduced_vocabulary_draft_proposes_only_hot_tokens(refs):
    ref = refs["qwen3_eagle3"]
    context = _tokens(4, 12).tolist()
    _, logits = ref.draft_chain("eagle3", context, 3, lambda k, lg: int(lg.argmax()))
    cold = torch.ones(fc.VOCAB_SIZE, dtype=torch.bool)
    cold[ref.hot_token_ids] = False
    for lg in logits:
        q = lg.double().softmax(-1)
        assert float(q[cold].sum()) == 0.0 and abs(float(q.sum()) - 1) < 1e-9 and float(q.max()) < 0.99


@pytest.mark.parametrize("pair", fc.FAMILY_PAIRS)
def test_targets_are_mostly_bigram(refs, pair):
    ref = refs[pair]

    def next_dist(context, last):
        return ref.target(torch.cat([context, torch.tensor([last])])).logits[-1].softmax(-1)

    same, other = [], []
    for i in range(3):
        c1, c2, last = _tokens(10 + i, 16), _tokens(20 + i, 16), int(_tokens(30 + i, 1))
        p1, p2, p3 = next_dist(c1, last), next_dist(c2, last), next_dist(c2, (last + 1) % fc.VOCAB_SIZE)
        same.append(0.5 * float((p1 - p2).abs().sum()))
        other.append(0.5 * float((p2 - p3).abs().sum()))
    # Earlier context moves the distribution a little (total variation), the last token moves it a lot.
    assert 0.001 < max(same) < 0.25 and min(other) > 0.6, (same, other)


def test_mtp_draft_depends_on_the_token_and_a_little_on_the_hidden_state(refs):
    ref = refs["deepseek_mtp"]
    tokens, hidden = _tokens(5, 8), ref.target(_tokens(6, 8)).hidden
    base = ref.eagle(tokens, hidden).logits[-1].softmax(-1)
    other_token = ref.eagle(torch.cat([tokens[:-1], tokens[-1:] + 1]), hidden).logits[-1].softmax(-1)
    other_hidden = ref.eagle(tokens, hidden.roll(1, dims=0)).logits[-1].softmax(-1)
    assert 0.5 * float((base - other_token).abs().sum()) > 0.6
    assert 0.001 < 0.5 * float((base - other_hidden).abs().sum()) < 0.5


# ---------------------------------------------------------------------------------------------------
# Offline accept length (rejection sampling, 3 chained drafts, T = 1)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", fc.FAMILY_PAIRS)
def test_accept_length_estimate_is_in_the_goal_range(refs, pair):
    prompts = [_tokens(100 + i, 6).tolist() for i in range(2)]
    est = estimate_accept_length(refs[pair], DRAFT_KIND[pair], prompts=prompts, new_tokens=24, seed=1)
    assert 1.5 <= est.accept_length <= 3.5, est
    assert 0 < est.first_draft_acceptance < 1


def test_configs_are_the_documented_shapes(pairs):
    ds = json.loads((pairs["deepseek_mtp"].target / "config.json").read_text())
    assert ds["n_routed_experts"] % ds["n_group"] == 0 and ds["topk_group"] <= ds["n_group"]
    assert ds["kv_lora_rank"] + ds["qk_rope_head_dim"] == 288  # SGLang's triton MLA kernels' 256 + 32 block shape
    q3 = json.loads((pairs["qwen3_eagle3"].target / "config.json").read_text())
    assert q3["head_dim"] * q3["num_attention_heads"] != q3["hidden_size"]  # explicit head_dim, as Qwen3's
    assert np.all(np.array(json.loads((pairs["qwen3_eagle3"].draft / "config.json").read_text())[
        "eagle_config"]["eagle_aux_hidden_state_layer_ids"]) + 1 < q3["num_hidden_layers"])
