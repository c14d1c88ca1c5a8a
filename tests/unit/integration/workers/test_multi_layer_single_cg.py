"""The single-CG multi-layer path end to end on CPU: worker -> runner -> "graph".

Drives the real upstream code of the installed sglang (0.5.17 or 0.5.23):
``MultiLayerEagleDraftWorker._draft_extend_for_decode`` (through the DETSPEC
override) calling the DETSPEC single-CG runner's real ``prepare`` /
``replay`` / ``clone_draft_probs``, whose graph body is upstream's
``_capture_one_graph.multi_step_fn`` -> ``_run_step_body`` (model forward,
in-graph rotation, in-graph sampler) captured by a fake graph backend that
records the function at capture time and runs it at replay.  The MTP layers
are a fake model whose logits depend on the token the rotation feeds it, so a
wrong token in the rotation changes later layers.

What this cannot show on CPU: a real ``torch.cuda.graph`` capture (static
addresses, graph-pool allocations of the Triton sampler).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner as mlr
import sglang.srt.speculative.multi_layer_eagle_worker_v2 as mlw
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.eagle_info import EagleDraftInput

from sglang_detspec.integration.sampling import proposal
from sglang_detspec.integration.workers import multi_layer as ml

NUM_STEPS = 3
N = NUM_STEPS + 1  # speculative_num_draft_tokens: the draft-extend width
VOCAB = 4100
HIDDEN = 8
CAPTURE_BS = [1, 2, 4]


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = proposal.seeded_draft_proposal

    def recording(probs, sampling_seed, positions, draft_step, top_ks=None):
        out = real(probs, sampling_seed, positions, draft_step, top_ks)
        calls.append(
            SimpleNamespace(
                probs=probs, seed=sampling_seed.clone(), positions=positions.clone(),
                step=draft_step, top_ks=None if top_ks is None else top_ks.clone(),
                index=out[1],
            )
        )
        return out

    monkeypatch.setattr(proposal, "seeded_draft_proposal", recording)
    return calls


class FakeMTPModel:
    """Layer ``step``'s logits: a fixed random row per input token (pruned rows)."""

    def __init__(self, step):
        g = torch.Generator().manual_seed(100 + step)
        self.table = torch.randn(VOCAB, VOCAB, generator=g) * 3

    def logits_for(self, input_ids, select_index):
        return self.table[input_ids[select_index]]

    def forward(self, input_ids, positions, forward_batch):
        sel = forward_batch.spec_info.select_index
        return SimpleNamespace(
            next_token_logits=self.logits_for(input_ids, sel), hidden_states=None
        )


class FakeGraphBackend:
    """capture_one records the function (after one warm-up run, as upstream); replay runs it."""

    def __init__(self):
        self.graphs = {}

    def capture_one(self, shape_key, fn, capture_inputs=None, post_warmup_hook=None):
        fn()  # warm-up mutates the buffers; upstream restores them afterwards
        self.graphs[shape_key] = fn

    def replay(self, shape_key, *args, **kwargs):
        return self.graphs[shape_key]()

    def can_run(self, forward_batch, shape_key):
        return shape_key in self.graphs


class FakeAttnBackend:
    supports_draft_extend_metadata_staging = False

    def draft_extend_metadata_captured_in_graph(self):
        return True

    def init_forward_metadata_out_graph(self, *args, **kwargs):
        pass

    def init_forward_metadata_in_graph(self, *args, **kwargs):
        pass

    def init_forward_metadata(self, *args, **kwargs):
        pass


class FakeModelRunner:
    def __init__(self, step):
        self.model = FakeMTPModel(step)
        self.model_config = SimpleNamespace(
            dtype=torch.float32, vocab_size=VOCAB,
            hf_config=SimpleNamespace(architectures=["MiMoV2MTP"]),
        )
        self.spec_algorithm = SimpleNamespace(is_standalone=lambda: False)
        self.kv_index_translator = SimpleNamespace(bind_runner_slots=lambda fb: None)
        self.device_timer = None
        self.req_to_token_pool = object()
        self.token_to_kv_pool = object()
        self.attn_backend = FakeAttnBackend()

    def forward(self, forward_batch):
        """Eager draft-extend forward, as the worker's eager path calls it."""
        sel = forward_batch.spec_info.select_index
        logits = self.model.logits_for(forward_batch.input_ids, sel)
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=None)
        )


class NullAdapter:
    def capture(self, **kwargs):
        pass

    def replay(self):
        pass


@pytest.fixture
def env(monkeypatch):
    """Module-level collaborators of the runner that need a GPU or a published config."""
    monkeypatch.setattr(mlr, "get_draft_input_from_target_hidden_dim", lambda mr: HIDDEN)
    monkeypatch.setattr(
        mlr, "get_exec",
        lambda: SimpleNamespace(
            deterministic=SimpleNamespace(enable_deterministic_inference=True),
            mamba=SimpleNamespace(enable_mamba_extra_buffer=False),
        ),
        raising=False,
    )
    monkeypatch.setattr(mlr, "check_cuda_graph_backend", lambda *a, **k: False)
    monkeypatch.setattr(mlr, "get_available_gpu_memory", lambda *a, **k: 0.0)
    monkeypatch.setattr(mlr, "model_capture_mode", contextlib.nullcontext)
    monkeypatch.setattr(mlr, "resolve_decode_backend", lambda runner: FakeGraphBackend())


def build(monkeypatch):
    model_runners = [FakeModelRunner(s) for s in range(NUM_STEPS)]
    draft = object.__new__(ml.DetspecMultiLayerEagleDraftWorker)
    draft.__dict__.update(
        model_config=SimpleNamespace(vocab_size=VOCAB),
        speculative_algorithm=SimpleNamespace(is_standalone=lambda: False),
        chain_mtp_hidden_states=False,
        draft_runner_list=model_runners,
        draft_runner=model_runners[0],
        draft_extend_attn_backend_list=[r.attn_backend for r in model_runners],
        speculative_num_steps=NUM_STEPS,
        speculative_num_draft_tokens=N,
        use_rejection_sampling=True,
        topk=1,
        draft_extend_num_front_tokens=0,
        draft_extend_num_warmup_tokens=0,
        plan_stream=None,
        plan_stream_ctx=contextlib.nullcontext(),
        device="cpu",
        gpu_id=0,
        server_args=SimpleNamespace(),
        mtp_model_runner=lambda step: model_runners[step],
    )

    def step_runner_init(r, eagle_worker, step):
        # DetspecSingleCGStepRunner without the GPU-only DecodeCudaGraphRunner
        # setup; the attributes are the ones upstream's __init__ sets.
        assert eagle_worker is draft
        r.__dict__.update(
            step=step, eagle_worker=draft, model_runner=model_runners[step],
            forward_mode=ForwardMode.DRAFT_EXTEND_V2, device="cpu",
            num_dp_ranks=1, dp_size=1, enable_torch_compile=False, disable_padding=False,
            require_gathered_buffer=False, require_mlp_tp_gather=False,
            require_mlp_sync=False, require_attn_tp_gather=False,
            speculative_num_steps=NUM_STEPS, speculative_num_draft_tokens=N, topk=1,
            attn_backend=model_runners[step].attn_backend,
            metadata_captured_in_graph=True, prune_draft_extend_logits=True,
            deepep_adapter=NullAdapter(), capture_bs=list(CAPTURE_BS),
            num_front_tokens=0, captured_req_width=N, max_bs=max(CAPTURE_BS),
            max_num_token=max(CAPTURE_BS) * N,
            extend_seq_lens_cpu=[N] * max(CAPTURE_BS), seq_len_fill_value=1,
        )
        r.model_context = contextlib.nullcontext

    monkeypatch.setattr(ml.DetspecSingleCGStepRunner, "__init__", step_runner_init)

    cls = ml.DetspecOneGraphDraftExtendRunner
    runner = object.__new__(cls)
    runner.__dict__.update(
        eagle_worker=draft, device="cpu", gpu_id=0, speculative_num_steps=NUM_STEPS,
        draft_extend_attn_backend_list=draft.draft_extend_attn_backend_list,
        runners=[], seq_len_fill_value=1, max_bs=1, captured_req_width=1,
        num_front_tokens=0, prune_draft_extend_logits=False,
        _out_cache_loc_virtual=None, _kv_loc_plan=None, _kv_loc_cols=None,
    )
    runner._init_and_capture()  # real upstream capture loop, fake graph backend
    draft.cuda_graph_runner_for_draft_extend = runner
    return draft, runner


def sampling_info(seeds, temps, top_ks):
    return SimpleNamespace(
        sampling_seed=torch.tensor(seeds, dtype=torch.int64),
        temperatures=torch.tensor(temps, dtype=torch.float32).view(-1, 1),
        top_ks=torch.tensor(top_ks, dtype=torch.int32),
    )


def patch_prepare_for_draft_extend(monkeypatch):
    def prepare_for_draft_extend(draft_extend_input, batch, predict, num_draft_tokens,
                                 draft_model_runner, cuda_graph_runner, **kwargs):
        bs = len(batch.seq_lens)
        batch.spec_info = draft_extend_input
        draft_extend_input.num_tokens_per_req = num_draft_tokens
        seq_lens = batch.seq_lens + num_draft_tokens
        positions = (batch.seq_lens.repeat_interleave(num_draft_tokens)
                     + torch.arange(num_draft_tokens).repeat(bs))
        return ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=bs,
            input_ids=predict.clone(), req_pool_indices=torch.arange(bs),
            seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
            out_cache_loc=torch.arange(bs * num_draft_tokens),
            positions=positions, seq_lens_sum=int(seq_lens.sum()),
            extend_seq_lens=torch.full((bs,), num_draft_tokens, dtype=torch.int32),
            extend_start_loc=torch.arange(bs, dtype=torch.int32) * num_draft_tokens,
            sampling_info=batch.sampling_info, spec_info=draft_extend_input,
        )

    monkeypatch.setitem(
        ml._upstream(mlw.MultiLayerEagleDraftWorker, "_draft_extend_for_decode").__globals__,
        "prepare_for_draft_extend", prepare_for_draft_extend,
    )


def decode_round(draft, seq_lens, accept_lens, info):
    bs = len(seq_lens)
    batch = SimpleNamespace(
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64), sampling_info=info,
        forward_mode=ForwardMode.DECODE, spec_info=None,
        req_pool_indices=torch.arange(bs), device="cpu",
    )
    predict = (torch.arange(bs * N, dtype=torch.int64) * 37) % VOCAB
    result = SimpleNamespace(
        logits_output=SimpleNamespace(hidden_states=torch.zeros(bs * N, HIDDEN)),
        next_token_ids=predict,
        accept_lens=torch.tensor(accept_lens, dtype=torch.int32),
        next_draft_input=EagleDraftInput(
            hidden_states=None, bonus_tokens=None,
            num_tokens_per_req=1, num_tokens_for_logprob_per_req=1,
        ),
        can_run_cuda_graph=True,
    )
    draft._draft_extend_for_decode(batch, result)
    return result.next_draft_input


def expected_chain(info, seq_lens, accept_lens):
    """The chain computed directly: q = softmax(table[token] / T), seeded draw, feed forward."""
    bs = len(seq_lens)
    predict = (torch.arange(bs * N, dtype=torch.int64) * 37) % VOCAB
    tokens = predict[torch.arange(bs) * N + torch.tensor(accept_lens) - 1]
    positions = torch.tensor(seq_lens) + N
    out = []
    for step in range(NUM_STEPS):
        logits = FakeMTPModel(step).table[tokens]
        q = torch.softmax(logits / info.temperatures, dim=-1)
        _, idx = proposal.seeded_draft_proposal(
            q, info.sampling_seed, positions, step, top_ks=info.top_ks
        )
        out.append(idx)
        tokens = idx[:, 0]
    return torch.cat(out, 1)


def test_single_cg_decode_through_worker(env, spy, monkeypatch):
    draft, runner = build(monkeypatch)
    assert isinstance(runner.runners[0], ml.DetspecSingleCGStepRunner)
    assert set(runner.runners[0].backend.graphs) == {mlr.ShapeKey(size=b) for b in CAPTURE_BS}
    patch_prepare_for_draft_extend(monkeypatch)
    spy.clear()  # capture warm-ups sampled with placeholder keys

    seq_lens, accept = [50, 7, 300], [2, 4, 1]  # raw_bs 3 -> bucket 4
    info = sampling_info([101, -5, 2**50], [0.8, 1.0, 1.5], [1 << 30, 1, 40])
    nxt = decode_round(draft, seq_lens, accept, info)

    assert (runner.raw_bs, runner.bs) == (3, 4)
    assert [c.step for c in spy] == list(range(NUM_STEPS))
    for s, c in enumerate(spy):
        assert c.seed[:3].tolist() == [101, -5, 2**50]
        assert c.positions[:3].tolist() == [L + N for L in seq_lens]
        assert c.top_ks[:3].tolist() == [1 << 30, 1, 40]
        assert c.probs.shape == (4, VOCAB)  # padded graph batch, strided slot
        assert c.probs.stride() == (NUM_STEPS * VOCAB, 1)
        # verify gets exactly the q each token was drawn from
        assert torch.equal(nxt.draft_probs[:, s], c.probs[:3])
        assert torch.equal(nxt.topk_index[:, s], c.index[:3, 0])
        # greedy row 1 proposes the argmax
        assert c.index[1, 0].item() == int(torch.argmax(c.probs[1]))
    # The in-graph rotation fed each seeded token to the next layer.
    torch.testing.assert_close(
        nxt.draft_probs,
        torch.stack([c.probs[:3] for c in spy], 1), rtol=0, atol=0,
    )
    exp = expected_chain(info, seq_lens, accept)
    # Tokens agree with a plain-torch chain (softmax differs only in last bits,
    # which cannot flip these well-separated draws for this fixed input).
    assert torch.equal(nxt.topk_index, exp)

    # Next round, other requests, smaller bucket: keys refreshed before replay.
    spy.clear()
    info2 = sampling_info([9], [1.2], [1 << 30])
    nxt2 = decode_round(draft, [1234], [3], info2)
    assert (runner.raw_bs, runner.bs) == (1, 1)
    assert [c.seed.tolist() for c in spy] == [[9]] * NUM_STEPS
    assert [c.positions.tolist() for c in spy] == [[1234 + N]] * NUM_STEPS
    assert nxt2.topk_index.shape == (1, NUM_STEPS)


def test_single_cg_and_eager_fallback_agree(env, spy, monkeypatch):
    """A batch that falls back to eager draws the same tokens (upstream's graph q
    comes from ``wide_row_softmax_triton``, its eager q from ``torch.softmax``)."""
    seq_lens, accept = [50, 7, 300], [2, 4, 1]
    info = sampling_info([101, -5, 2**50], [0.8, 1.0, 1.5], [1 << 30, 1, 40])
    patch_prepare_for_draft_extend(monkeypatch)

    draft, runner = build(monkeypatch)
    graph = decode_round(draft, seq_lens, accept, info)

    runner.can_run_graph = lambda forward_batch: False  # e.g. bs > max captured
    eager = decode_round(draft, seq_lens, accept, info)

    assert torch.equal(graph.topk_index, eager.topk_index)
    assert torch.equal(graph.draft_probs, eager.draft_probs)
    assert torch.equal(graph.topk_p, eager.topk_p)
