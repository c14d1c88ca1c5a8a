"""CPU tests of the tiny multi-layer EAGLE (MTP) draft (``sglang_detspec.models.tiny_models``, multi-layer section).

What they pin, all with SGLang's own code (no GPU): the E2E server specs resolve, through SGLang's CLI parser and
resolution, to the multi-layer worker (DETSPEC's and upstream's); the draft becomes SGLang's ``MiMoV2MTP`` with a
plain (non-hybrid) KV pool; SGLang's loader and ``MiMoV2MTP.load_weights`` put every tensor of the weighted draft
where we meant, runner by runner; builds are byte-identical and cached atomically; and the weighted draft's accept
length, on a CPU reference of the multi-layer chain, is in the range the E2E test asserts.
"""

import argparse
import contextlib
import inspect
import json
import math
import socket

import pytest
import torch

from sglang_detspec.plugin import load_plugin

load_plugin()

from sglang.srt.server_args import ServerArgs  # noqa: E402

from sglang_detspec.integration import compat  # noqa: E402
from sglang_detspec.integration.setup.refusals import DetspecConfigError  # noqa: E402
from sglang_detspec.models import model_cache, mtp_draft, tiny_config  # noqa: E402
from sglang_detspec.models import tiny_models as tm  # noqa: E402

import e2e_harness  # noqa: E402

MTP_SPECS = ("detspec_mtp_graph", "detspec_mtp_nograph", "detspec_mtp_fa3_graph", "builtin_mtp_rs")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-mtp")


@pytest.fixture(scope="module")
def weighted(root):
    return tm.ensure_tiny_models(root, pair="weighted"), mtp_draft.ensure_mtp_draft(root, pair="weighted")


def _resolve_argv(argv):
    """``sglang.launch_server``'s parsing and resolution, without its logging set-up."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    sa = ServerArgs.from_cli_args(parser.parse_args(argv))
    if hasattr(sa, "resolve_once"):  # 0.5.23; 0.5.17 resolved in __post_init__
        sa.resolve_once()
    return sa


def _worker_class(sa):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.from_string(compat.read_field(sa, "speculative_algorithm")).create_worker(sa)


# ---------------------------------------------------------------------------------------------------
# Layout, bytes, cache
# ---------------------------------------------------------------------------------------------------


def test_layout_and_cache_names(root, weighted):
    dummy = mtp_draft.ensure_mtp_draft(root, pair="dummy")
    assert dummy.name == f"tiny-mtp-draft-v{mtp_draft.MTP_DRAFT_VERSION}" and dummy.parent == root
    assert [p.name for p in dummy.iterdir()] == ["config.json"]  # served with --speculative-draft-load-format dummy
    _, draft = weighted
    assert draft.parent == root and draft.name.startswith(dummy.name + "-weighted-v")
    assert sorted(p.name for p in draft.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p.name for p in root.iterdir() if p.name.startswith(".tiny-mtp-")]  # nothing left from the build


def test_builds_are_byte_identical(tmp_path):
    for pair in tiny_config.TINY_PAIRS:
        a = mtp_draft.build_mtp_draft(tmp_path / f"{pair}-a", pair=pair)
        b = mtp_draft.build_mtp_draft(tmp_path / f"{pair}-b", pair=pair)
        assert model_cache.tree_digest(a) == model_cache.tree_digest(b)


def test_incomplete_cache_is_rebuilt(tmp_path):
    stale = tmp_path / mtp_draft.mtp_cache_dir_name("weighted")
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # no weights: an interrupted or foreign entry
    d = mtp_draft.ensure_mtp_draft(tmp_path, pair="weighted")
    assert d == stale and (d / "model.safetensors").is_file()
    assert json.loads((d / "config.json").read_text()) == mtp_draft.mtp_draft_config()


def test_unknown_pair_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny model pair 'big'"):
        mtp_draft.ensure_mtp_draft(tmp_path, pair="big")


# ---------------------------------------------------------------------------------------------------
# SGLang chooses the multi-layer worker for the E2E specs, and serves the draft as MiMoV2MTP
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def specs(weighted):
    models, _ = weighted
    return e2e_harness.server_specs(models, "weighted")


@pytest.mark.parametrize("name", MTP_SPECS)
def test_e2e_specs_resolve_to_the_multi_layer_worker(specs, name, monkeypatch):
    """The exact argv each E2E server gets (plus --device cuda: resolution needs a device) goes through SGLang's
    parser and resolution to its multi-layer worker -- DETSPEC's for DETSPEC_EAGLE, upstream's for the control."""
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2

    from sglang_detspec.integration.workers.spec_workers import DetspecMultiLayerEagleWorkerV2

    spec = specs[name]
    for key, value in spec.env.items():
        monkeypatch.setenv(key, value)
    sa = _resolve_argv(spec.args + ["--device", "cuda"])
    detspec = name.startswith("detspec")
    assert _worker_class(sa) is (DetspecMultiLayerEagleWorkerV2 if detspec else MultiLayerEagleWorkerV2)
    got = {f: compat.read_field(sa, f) for f in ("speculative_algorithm", "enable_multi_layer_eagle",
                                                 "speculative_use_rejection_sampling", "speculative_eagle_topk",
                                                 "speculative_num_steps", "chunked_prefill_size")}
    assert got == {"speculative_algorithm": "DETSPEC_EAGLE" if detspec else "EAGLE", "enable_multi_layer_eagle": True,
                   "speculative_use_rejection_sampling": True, "speculative_eagle_topk": 1,
                   "speculative_num_steps": mtp_draft.MTP_LAYERS, "chunked_prefill_size": -1}


def test_without_the_multi_layer_flag_sglang_picks_the_single_layer_worker(specs, monkeypatch):
    """The flag, not the draft, switches the worker (the target is a Llama: no model override applies)."""
    from sglang_detspec.integration.workers.spec_workers import DetspecEAGLEWorkerV2

    argv = [a for a in specs["detspec_mtp_graph"].args if a != "--enable-multi-layer-eagle"]
    assert _worker_class(_resolve_argv(argv + ["--device", "cuda"])) is DetspecEAGLEWorkerV2


def test_detspec_refuses_the_multi_layer_spec_with_chunked_prefill(specs, monkeypatch):
    """Why MTP_SERVER_FLAGS carries --chunked-prefill-size -1: DETSPEC refuses multi-layer EAGLE with chunking."""
    args = list(specs["detspec_mtp_graph"].args)
    args[args.index("--chunked-prefill-size") + 1] = "4096"
    with pytest.raises(DetspecConfigError, match="multi-layer EAGLE") as e:
        _resolve_argv(args + ["--device", "cuda"])
    assert "Pass --chunked-prefill-size -1" in str(e.value)


def test_detspec_refuses_the_multi_layer_spec_with_the_radix_cache(specs, monkeypatch):
    """Why MTP_SERVER_FLAGS carries --disable-radix-cache: DETSPEC refuses multi-layer EAGLE with the radix cache."""
    args = [a for a in specs["detspec_mtp_graph"].args if a != "--disable-radix-cache"]
    with pytest.raises(DetspecConfigError, match="radix cache and multi-layer EAGLE") as e:
        _resolve_argv(args + ["--device", "cuda"])
    assert "Pass --disable-radix-cache" in str(e.value)


@pytest.fixture(scope="module")
def draft_model_config(specs):
    from sglang.srt.configs.model_config import ModelConfig

    sa = _resolve_argv(specs["detspec_mtp_graph"].args + ["--device", "cuda"])
    draft = compat.read_field(sa, "speculative_draft_model_path")
    return sa, ModelConfig.from_server_args(sa, model_path=draft, is_draft_model=True)


def test_the_draft_is_mimo_v2_mtp_with_a_plain_kv_pool(weighted, draft_model_config):
    from sglang.srt.model_loader.utils import get_model_architecture
    from sglang.srt.models.mimo_v2_nextn import MiMoV2MTP

    models, _ = weighted
    _, mc = draft_model_config
    assert mc.hf_config.architectures == ["MiMoV2MTP"]  # SGLang's draft name for MiMoV2FlashForCausalLM
    assert get_model_architecture(mc)[0] is MiMoV2MTP
    assert mc.is_multi_layer_eagle and not mc.is_hybrid_swa and not mc.has_attention_sinks
    # The KV pool is sized from the full-attention keys, the MTP layer reads the SWA ones: they must agree.
    target = json.loads((models.target / "config.json").read_text())
    assert (mc.head_dim, mc.get_num_kv_heads(1), mc.hidden_size, mc.vocab_size) == (
        target["head_dim"], target["num_key_value_heads"], target["hidden_size"], target["vocab_size"])
    assert (mc.hf_text_config.swa_head_dim, mc.get_swa_num_kv_heads(1)) == (mc.head_dim, mc.get_num_kv_heads(1))


def test_why_the_draft_must_be_an_mtp_class_and_the_pool_non_hybrid(specs, monkeypatch):
    """SGLang's loader hands ``draft_model_idx`` to the draft class: MiMoV2MTP takes it, the EAGLE draft does not.
    Without --disable-hybrid-swa-memory the draft would ask for a hybrid-SWA pool (which a Llama target's
    allocator cannot back)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.llama_eagle import LlamaForCausalLMEagle
    from sglang.srt.models.mimo_v2_nextn import MiMoV2MTP

    assert "draft_model_idx" in inspect.signature(MiMoV2MTP.__init__).parameters
    assert "draft_model_idx" not in inspect.signature(LlamaForCausalLMEagle.__init__).parameters
    argv = [a for a in specs["detspec_mtp_graph"].args if a != "--disable-hybrid-swa-memory"]
    sa = _resolve_argv(argv + ["--device", "cuda"])
    draft = compat.read_field(sa, "speculative_draft_model_path")
    assert ModelConfig.from_server_args(sa, model_path=draft, is_draft_model=True).is_hybrid_swa


# ---------------------------------------------------------------------------------------------------
# SGLang's loader puts every tensor of the weighted draft where we meant, one MTP layer per runner
# ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _sglang_single_rank(model_path):
    """A world of one CPU rank (gloo), enough to construct SGLang's MiMoV2MTP on CPU; torn down afterwards."""
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
        # The MTP layer's communicator reads the attention-DP layout, which only a scheduler initialises.
        stack.enter_context(get_parallel().override(tp_rank=0, pp_rank=0, attn_dp_size=1, attn_dp_rank=0,
                                                    attn_tp_size=1, attn_tp_rank=0))
        yield


_FUSED = {".q_proj.": (".qkv_proj.", 0), ".k_proj.": (".qkv_proj.", 1), ".v_proj.": (".qkv_proj.", 2),
          ".gate_proj.": (".gate_up_proj.", 0), ".up_proj.": (".gate_up_proj.", 1)}


def _sglang_name(hf_name):
    """Where MiMoV2MTP keeps HF tensor ``model.mtp.layers.0.X`` (and the shard index for fused q/k/v, gate/up)."""
    rest = hf_name[len("model.mtp.layers.0."):]
    for outer in ("enorm", "hnorm", "eh_proj", "final_layernorm"):
        if rest.startswith(outer + "."):
            return f"model.{rest}", None
    name = f"model.mtp_block.{rest}"
    for part, (fused, index) in _FUSED.items():
        if part in name:
            return name.replace(part, fused), index
    return name, None


@pytest.mark.parametrize("layer", range(mtp_draft.MTP_LAYERS))
def test_sglang_loads_mtp_layer_i_into_runner_i(weighted, layer, monkeypatch):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    import sglang.srt.layers.rotary_embedding.base as rope_base
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.models.mimo_v2_nextn import MiMoV2MTP

    monkeypatch.setattr(rope_base, "_is_cpu", True)  # construct SGLang's rotary embedding as its CPU engine does
    models, draft = weighted
    file_tensors = load_file(str(draft / "model.safetensors"))
    assert sorted({n.split(".")[3] for n in file_tensors}) == [str(i) for i in range(mtp_draft.MTP_LAYERS)]
    with _sglang_single_rank(models.target):
        model = MiMoV2MTP(AutoConfig.from_pretrained(draft), draft_model_idx=layer)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for p in params.values():
                p.fill_(float("nan"))
        # Runner ``layer`` reads the checkpoint through the loader's MTP filter (its layer, renamed to layer 0).
        model.load_weights(DefaultModelLoader._filter_mtp_weights(iter(file_tensors.items()), "", layer))
    # The target's embedding and lm_head are shared into the draft after loading, as for every EAGLE draft.
    assert {n for n, p in params.items() if torch.isnan(p).any()} == {"model.embed_tokens.weight", "lm_head.weight"}
    ours = {n.replace(f"model.mtp.layers.{layer}.", "model.mtp.layers.0."): t
            for n, t in file_tensors.items() if n.startswith(f"model.mtp.layers.{layer}.")}
    fused = {}
    for name, tensor in sorted(ours.items()):
        target, shard = _sglang_name(name)
        if shard is None:
            assert torch.equal(params[target].detach(), tensor.to(params[target].dtype)), name
        else:
            fused.setdefault(target, {})[shard] = tensor
    for target, parts in fused.items():
        want = torch.cat([parts[i] for i in sorted(parts)]).to(params[target].dtype)
        assert torch.equal(params[target].detach(), want), target


# ---------------------------------------------------------------------------------------------------
# The weighted draft's accept length (CPU reference of SGLang's multi-layer chain)
# ---------------------------------------------------------------------------------------------------


class _MultiLayerReference:
    """Float32 CPU forward of the weighted pair's target and MTP draft, in the shape ``estimate_accept_length``
    drives (``target`` and ``draft_chain``; its ``kind`` argument is ignored).

    As SGLang's multi-layer worker runs it (``multi_layer_eagle_worker_v2.py``, ``_draft_extend_for_prefill``): MTP
    layer k sees, at target position j, the token k + 1 places ahead (``rotate_input_ids`` once per step, the last
    slots filled by the bonus token and the earlier steps' drafts) next to the target's hidden state at j (not
    chained: ``chain_mtp_hidden_states`` is off for MiMoV2MTP); its last row gives draft k + 1."""

    def __init__(self, models, draft):
        from sglang_detspec.models import tiny_reference as tr

        self.ref, self.tr = tr.load_reference(models), tr
        self.cfg, self.w = tr._load(draft)
        self.eps = float(self.cfg["rms_norm_eps"])
        self.layers = [tr._Layer(self.cfg, self.w, f"model.mtp.layers.{i}.") for i in range(mtp_draft.MTP_LAYERS)]

    def target(self, tokens):
        return self.ref.target(tokens)

    def mtp(self, k, tokens, hidden):
        layer, norm = self.layers[k], self.tr._rms_norm
        x = torch.cat([norm(self.ref.embed[tokens], layer.w["enorm.weight"], self.eps),
                       norm(hidden, layer.w["hnorm.weight"], self.eps)], dim=-1) @ layer.w["eh_proj.weight"].T
        x = x + layer.attention(layer.norm("input_layernorm", x), torch.arange(len(tokens)))
        x = x + layer.mlp(layer.norm("post_attention_layernorm", x))
        return norm(x, layer.w["final_layernorm.weight"], self.eps) @ self.ref.lm_head.T

    def draft_chain(self, kind, context, steps, choose):
        hidden = self.ref.target(torch.tensor(context)).hidden[:-1]  # positions 0 .. n-2
        tokens, logits = list(context), []
        for k in range(steps):
            logits.append(self.mtp(k, torch.tensor(tokens[k + 1: k + len(context)]), hidden)[-1])
            tokens.append(int(choose(k, logits[-1])))
        return tokens[len(context):], logits


def test_weighted_mtp_draft_accept_length_is_in_the_e2e_range(weighted):
    from sglang_detspec.models.tiny_reference import estimate_accept_length

    ref = _MultiLayerReference(*weighted)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, tiny_config.VOCAB_SIZE, (8,), generator=gen).tolist() for _ in range(4)]
    est = estimate_accept_length(ref, "eagle", prompts=prompts, new_tokens=48, steps=mtp_draft.MTP_LAYERS)
    # tests/e2e/test_e2e_multi_layer.py asserts [1.5, 3.5] on the H200; drafts must be rejected part of the time.
    low, high = est.accept_length - 2 * est.accept_length_stderr, est.accept_length + 2 * est.accept_length_stderr
    assert 1.5 <= low and high <= 3.5, est
    assert 0.2 < est.first_draft_acceptance < 0.95, est
    assert math.isfinite(est.accept_length_stderr)
