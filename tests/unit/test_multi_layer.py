"""Multi-layer EAGLE (MTP): every draft site routes through seeded_draft_proposal.

Each test drives the real SGLang method of the installed version (0.5.17 or
0.5.23) -- ``MultiLayerEagleDraftWorker._draft_extend_for_prefill`` /
``_draft_extend_for_decode`` through the DETSPEC subclass, and the single-CG
runner's ``_allocate_buffers`` / ``prepare`` / ``_sample_draft_proposal`` --
with the smallest CPU inputs.  What needs a GPU to construct (the MTP model
runners, ``ForwardBatch.init_new`` on a real ScheduleBatch, a captured CUDA
graph) is replaced by a narrow fake that returns fixed logits.

Expected keys come from the inputs the test builds (prompt lengths, seeds,
N = num_steps + 1), never from the code under test:
prefill (L, layer), decode (L + N, layer), as in sglang 0.5.23.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

import pytest
import torch

import sglang_verify_harness as harness
import sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner as mlr
import sglang.srt.speculative.multi_layer_eagle_worker_v2 as mlw
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.eagle_info import EagleDraftInput

from sglang_detspec.integration import multi_layer as ml
from sglang_detspec.integration import proposal
from sglang_detspec.integration.target_sampler import detspec_sampler_class

SGLANG_0523 = "sampling_seed" in {
    f.name for f in dataclasses.fields(mlr.MultiLayerEagleDraftExtendInputBuffers)
}

NUM_STEPS = 3
NUM_DRAFT_TOKENS = NUM_STEPS + 1
VOCAB = 4100  # > one 4096-wide softmax block, so the wide-row reduction has 2 partials
HIDDEN = 8


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Call:
    probs: torch.Tensor
    sampling_seed: torch.Tensor
    positions: torch.Tensor
    draft_step: int
    top_ks: torch.Tensor | None
    topk_p: torch.Tensor
    topk_index: torch.Tensor


@pytest.fixture
def spy(monkeypatch):
    """Record every seeded_draft_proposal call; delegate to the real function."""
    calls: list[Call] = []
    real = proposal.seeded_draft_proposal

    def recording(probs, sampling_seed, positions, draft_step, top_ks=None):
        topk_p, topk_index = real(probs, sampling_seed, positions, draft_step, top_ks)
        calls.append(
            Call(probs, sampling_seed.clone(), positions.clone(), draft_step,
                 None if top_ks is None else top_ks.clone(), topk_p, topk_index)
        )
        return topk_p, topk_index

    monkeypatch.setattr(proposal, "seeded_draft_proposal", recording)
    return calls


@pytest.fixture
def upstream_kwargs(monkeypatch):
    """What the installed sglang passes to sample_draft_proposal at each call.

    0.5.23 passes its own keys (sampling_seed, positions, draft_step); 0.5.17
    passes none.  Recorded behind the DETSPEC stand-in.
    """
    seen = []
    real = ml._seeded_sample_draft_proposal

    def recording(keys, next_token_logits, temperatures, kwargs):
        seen.append(dict(kwargs))
        return real(keys, next_token_logits, temperatures, kwargs)

    monkeypatch.setattr(ml, "_seeded_sample_draft_proposal", recording)
    return seen


def rebound_globals(name, owner=mlw.MultiLayerEagleDraftWorker):
    """The private globals the DETSPEC override runs upstream ``owner.name`` with."""
    return ml._upstream(owner, name).__globals__


def make_sampling_info(seeds, temperatures, top_ks):
    return SimpleNamespace(
        sampling_seed=torch.tensor(seeds, dtype=torch.int64),
        temperatures=torch.tensor(temperatures, dtype=torch.float32).view(-1, 1),
        top_ks=torch.tensor(top_ks, dtype=torch.int32),
    )


def step_logits(bs, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(bs, VOCAB, generator=g) * 4 for _ in range(NUM_STEPS)]


class FakeMTPRunner:
    """One MTP layer's model runner: returns this layer's fixed logits."""

    def __init__(self, logits):
        self.logits = logits
        self.req_to_token_pool = object()
        self.token_to_kv_pool = object()
        self.attn_backend = SimpleNamespace(init_forward_metadata=lambda fb: None)
        self.model_config = SimpleNamespace(
            hf_config=SimpleNamespace(architectures=["MiMoV2MTPForCausalLM"])
        )
        self.forward_input_ids = []

    def forward(self, forward_batch):
        self.forward_input_ids.append(forward_batch.input_ids.clone())
        return SimpleNamespace(
            logits_output=SimpleNamespace(
                next_token_logits=self.logits, hidden_states=None
            )
        )


def make_draft_worker(logits_per_step, cuda_graph_runner=None):
    """A DETSPEC draft worker without its GPU-only __init__ (model loading)."""
    worker = object.__new__(ml.DetspecMultiLayerEagleDraftWorker)
    runners = [FakeMTPRunner(l) for l in logits_per_step]
    worker.__dict__.update(
        model_config=SimpleNamespace(vocab_size=VOCAB),
        speculative_algorithm=SimpleNamespace(is_standalone=lambda: False),
        chain_mtp_hidden_states=False,
        draft_runner_list=runners,
        draft_runner=runners[0],
        speculative_num_steps=NUM_STEPS,
        speculative_num_draft_tokens=NUM_DRAFT_TOKENS,
        use_rejection_sampling=True,
        topk=1,
        draft_extend_num_front_tokens=0,
        draft_extend_num_warmup_tokens=0,
        plan_stream=None,
        plan_stream_ctx=contextlib.nullcontext(),
        cuda_graph_runner_for_draft_extend=cuda_graph_runner,
        device="cpu",
        server_args=SimpleNamespace(),
    )
    return worker


def assert_keys(calls, seeds, positions, top_ks):
    assert [c.draft_step for c in calls] == list(range(NUM_STEPS))
    for c in calls:
        assert c.sampling_seed.tolist() == seeds
        assert c.positions.tolist() == positions
        assert c.top_ks is not None and c.top_ks.tolist() == top_ks


def assert_greedy_rows_propose_argmax(calls, greedy_rows):
    for c in calls:
        for r in greedy_rows:
            assert c.topk_index[r, 0].item() == int(torch.argmax(c.probs[r]))
        torch.testing.assert_close(
            c.topk_p, c.probs.gather(1, c.topk_index), rtol=0, atol=0
        )


# --------------------------------------------------------------------------
# row 4: prefill, one proposal per MTP layer at position L
# --------------------------------------------------------------------------


def run_prefill(worker, prompt_lens, sampling_info, monkeypatch):
    bs = len(prompt_lens)
    seq_lens = torch.tensor(prompt_lens, dtype=torch.int64)
    ext_lens = torch.tensor(prompt_lens, dtype=torch.int32)
    starts = torch.cumsum(ext_lens, 0, dtype=torch.int32) - ext_lens
    batch = SimpleNamespace(
        seq_lens=seq_lens,
        sampling_info=sampling_info,
        forward_mode=ForwardMode.EXTEND,
        spec_info=None,
    )

    def init_new(cls, batch_, model_runner, **kwargs):
        # What ForwardBatch.init_new yields for an extend batch, minus the GPU
        # plumbing: the prompt tokens, the batch's seq_lens and sampling_info.
        n = int(ext_lens.sum())
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=bs,
            input_ids=torch.arange(n, dtype=torch.int64) % 97,
            req_pool_indices=torch.arange(bs),
            seq_lens=batch_.seq_lens,
            out_cache_loc=torch.arange(n),
            seq_lens_sum=int(seq_lens.sum()),
            extend_seq_lens=ext_lens,
            extend_start_loc=starts,
            sampling_info=batch_.sampling_info,
            spec_info=batch_.spec_info,
        )

    monkeypatch.setattr(ForwardBatch, "init_new", classmethod(init_new))
    next_token_ids = torch.arange(bs, dtype=torch.int64) + 5
    hidden = torch.zeros(int(ext_lens.sum()), HIDDEN)
    return worker._draft_extend_for_prefill(batch, hidden, next_token_ids)


def test_prefill_keys_greedy_and_verify_probs(spy, upstream_kwargs, monkeypatch):
    prompt_lens = [7, 3, 11]
    seeds = [42, -(2**63), 2**62 + 12345]
    top_ks = [1 << 30, 1, 20]  # row 1 is greedy
    info = make_sampling_info(seeds, [0.7, 1.0, 1.3], top_ks)
    logits = step_logits(len(prompt_lens), seed=0)
    worker = make_draft_worker(logits)

    out = run_prefill(worker, prompt_lens, info, monkeypatch)

    assert len(spy) == NUM_STEPS
    assert_keys(spy, seeds, prompt_lens, top_ks)
    assert_greedy_rows_propose_argmax(spy, greedy_rows=[1])
    for s, c in enumerate(spy):
        # q is upstream's sampling softmax of this layer's logits / T ...
        expected_q = torch.softmax(logits[s] / info.temperatures, dim=-1)
        torch.testing.assert_close(c.probs, expected_q, rtol=0, atol=0)
        # ... and verify receives exactly the q each token was drawn from.
        assert torch.equal(out.draft_probs[:, s], c.probs)
        assert torch.equal(out.topk_index[:, s : s + 1], c.topk_index)
        assert torch.equal(out.topk_p[:, s : s + 1], c.topk_p)
    # The proposal of layer s is the input token of layer s + 1 (chain rotation).
    starts = [0, 7, 10]
    for s in range(1, NUM_STEPS):
        fed = worker.draft_runner_list[s].forward_input_ids[0]
        last = [starts[r] + prompt_lens[r] - 1 for r in range(3)]
        assert fed[last].tolist() == spy[s - 1].topk_index[:, 0].tolist()
    if SGLANG_0523:
        # Keys identical to what sglang 0.5.23 itself hands fast_sample.
        assert [kw["draft_step"] for kw in upstream_kwargs] == list(range(NUM_STEPS))
        for kw, c in zip(upstream_kwargs, spy):
            assert torch.equal(kw["positions"].to(torch.int64), c.positions)
            assert torch.equal(kw["sampling_seed"], c.sampling_seed)
    else:
        assert upstream_kwargs == [{}] * NUM_STEPS


def test_prefill_without_seeds_refuses(spy, monkeypatch):
    info = make_sampling_info([1, 2], [1.0, 1.0], [1 << 30, 1 << 30])
    info.sampling_seed = None  # deterministic inference off
    worker = make_draft_worker(step_logits(2, seed=1))
    with pytest.raises(RuntimeError, match="enable-deterministic-inference"):
        run_prefill(worker, [4, 5], info, monkeypatch)
    assert spy == []


def test_upstream_modules_are_not_mutated(spy, monkeypatch):
    """Builtin EAGLE in the same process keeps the upstream names."""
    from sglang.srt.speculative import spec_utils

    before = {
        n: getattr(mlw, n)
        for n in ("sample_draft_proposal", ml._SINGLE_CG_RUNNER_NAME, "MultiLayerEagleDraftWorker")
    }
    info = make_sampling_info([1, 2], [1.0, 1.0], [1 << 30, 1 << 30])
    run_prefill(make_draft_worker(step_logits(2, seed=1)), [4, 5], info, monkeypatch)
    assert len(spy) == NUM_STEPS
    for name, value in before.items():
        assert getattr(mlw, name) is value
    assert mlw.sample_draft_proposal is spec_utils.sample_draft_proposal
    assert mlw.MultiLayerEagleDraftWorker is not ml.DetspecMultiLayerEagleDraftWorker
    # ... while the DETSPEC bodies see the DETSPEC names.
    g = rebound_globals("_draft_extend_for_prefill")
    assert g["sample_draft_proposal"] is ml._detspec_sample_draft_proposal
    g = rebound_globals("__init__", owner=mlw.MultiLayerEagleWorkerV2)
    assert g["MultiLayerEagleDraftWorker"] is ml.DetspecMultiLayerEagleDraftWorker


def test_stand_in_refuses_unknown_caller():
    with pytest.raises(RuntimeError, match="outside a known draft site"):
        ml._detspec_sample_draft_proposal(torch.zeros(1, 4), torch.ones(1, 1))


# --------------------------------------------------------------------------
# rows 5 and 6: decode, position L + N
# --------------------------------------------------------------------------


def decode_inputs(seq_lens, accept_lens, info):
    bs = len(seq_lens)
    batch = SimpleNamespace(
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        sampling_info=info,
        forward_mode=ForwardMode.DECODE,
        spec_info=None,
        req_pool_indices=torch.arange(bs),
        device="cpu",
    )
    predict = torch.arange(bs * NUM_DRAFT_TOKENS, dtype=torch.int64) % 89
    batch_result = SimpleNamespace(
        logits_output=SimpleNamespace(
            hidden_states=torch.zeros(bs * NUM_DRAFT_TOKENS, HIDDEN)
        ),
        next_token_ids=predict,
        accept_lens=torch.tensor(accept_lens, dtype=torch.int32),
        next_draft_input=EagleDraftInput(
            hidden_states=None, bonus_tokens=None,
            num_tokens_per_req=1, num_tokens_for_logprob_per_req=1,
        ),
        can_run_cuda_graph=False,
    )
    return batch, batch_result


def patch_prepare_for_draft_extend(monkeypatch):
    def prepare_for_draft_extend(draft_extend_input, batch, predict, num_draft_tokens,
                                 draft_model_runner, cuda_graph_runner, **kwargs):
        # The fields upstream's prepare_for_draft_extend sets that the draft
        # loop reads; seq_lens is the post-write length L + N, as upstream.
        bs = len(batch.seq_lens)
        batch.spec_info = draft_extend_input
        return ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND_V2,
            batch_size=bs,
            input_ids=predict.clone(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens + num_draft_tokens,
            out_cache_loc=torch.arange(bs * num_draft_tokens),
            seq_lens_sum=int(batch.seq_lens.sum()) + bs * num_draft_tokens,
            extend_seq_lens=torch.full((bs,), num_draft_tokens, dtype=torch.int32),
            extend_start_loc=torch.arange(bs, dtype=torch.int32) * num_draft_tokens,
            sampling_info=batch.sampling_info,
            spec_info=draft_extend_input,
        )

    monkeypatch.setitem(
        rebound_globals("_draft_extend_for_decode"),
        "prepare_for_draft_extend",
        prepare_for_draft_extend,
    )


class NoGraph:
    """A draft-extend graph runner that cannot run this batch (eager path)."""

    prune_draft_extend_logits = True

    def can_run_graph(self, forward_batch):
        return False


def test_decode_eager_keys_greedy_and_verify_probs(spy, upstream_kwargs, monkeypatch):
    seq_lens = [20, 9, 33]
    seeds = [7, 8, 2**63 - 1]
    top_ks = [1, 1 << 30, 5]  # row 0 greedy
    info = make_sampling_info(seeds, [1.0, 0.5, 2.0], top_ks)
    logits = step_logits(3, seed=2)
    worker = make_draft_worker(logits, cuda_graph_runner=NoGraph())
    patch_prepare_for_draft_extend(monkeypatch)
    batch, result = decode_inputs(seq_lens, [1, 4, 2], info)

    worker._draft_extend_for_decode(batch, result)

    assert len(spy) == NUM_STEPS
    assert_keys(spy, seeds, [L + NUM_DRAFT_TOKENS for L in seq_lens], top_ks)
    assert_greedy_rows_propose_argmax(spy, greedy_rows=[0])
    nxt = result.next_draft_input
    for s, c in enumerate(spy):
        # The eager path computes q with the single-CG graph's softmax.
        graph_q = torch.empty(3, 2, VOCAB)
        mlr.wide_row_softmax_triton(logits[s], info.temperatures, graph_q[:, 1])
        assert torch.equal(c.probs, graph_q[:, 1])
        assert torch.equal(nxt.draft_probs[:, s], c.probs)
        assert torch.equal(nxt.topk_index[:, s : s + 1], c.topk_index)
    if SGLANG_0523:
        assert [kw["draft_step"] for kw in upstream_kwargs] == list(range(NUM_STEPS))
        for kw, c in zip(upstream_kwargs, spy):
            assert torch.equal(kw["positions"].to(torch.int64), c.positions)


class PerStepGraph:
    """Narrow fake of MultiLayerEagleMultiStepDraftExtendCudaGraphRunner.

    replay(step) returns the step's logits plus the in-graph top-1 (which the
    worker must discard and re-sample with the seeded proposal).
    """

    rotates_in_graph = False
    prune_draft_extend_logits = True

    def __init__(self, logits):
        self.logits = logits
        self.prepared = None

    def can_run_graph(self, forward_batch):
        return True

    def prepare(self, forward_batch, **kwargs):
        bs = forward_batch.batch_size
        self.prepared = forward_batch
        self.raw_bs = bs
        self.raw_num_tokens = bs * NUM_DRAFT_TOKENS
        self.buffers = SimpleNamespace(
            input_ids=forward_batch.input_ids.clone(),
            extend_start_loc=forward_batch.extend_start_loc,
            extend_seq_lens=forward_batch.extend_seq_lens,
            select_index=torch.arange(bs) * NUM_DRAFT_TOKENS + NUM_DRAFT_TOKENS - 1,
        )

    def replay(self, step):
        bs = self.raw_bs
        out = SimpleNamespace(next_token_logits=self.logits[step])
        return out, torch.full((bs, 1), 0.5), torch.full((bs, 1), 3)


def test_decode_per_step_graphs_resample_after_each_replay(spy, upstream_kwargs, monkeypatch):
    seq_lens = [5, 64]
    seeds = [11, 12]
    top_ks = [1 << 30, 1]
    info = make_sampling_info(seeds, [0.9, 1.0], top_ks)
    logits = step_logits(2, seed=3)
    graph = PerStepGraph(logits)
    worker = make_draft_worker(logits, cuda_graph_runner=graph)
    patch_prepare_for_draft_extend(monkeypatch)
    batch, result = decode_inputs(seq_lens, [4, 1], info)

    worker._draft_extend_for_decode(batch, result)

    assert len(spy) == NUM_STEPS
    assert_keys(spy, seeds, [L + NUM_DRAFT_TOKENS for L in seq_lens], top_ks)
    assert_greedy_rows_propose_argmax(spy, greedy_rows=[1])
    nxt = result.next_draft_input
    for s, c in enumerate(spy):
        assert torch.equal(nxt.topk_index[:, s : s + 1], c.topk_index)
        assert torch.equal(nxt.draft_probs[:, s], c.probs)
    # The seeded token (not the graph's top-1 placeholder 3) advances the chain.
    sel = graph.buffers.select_index
    assert graph.buffers.input_ids[sel].tolist() == spy[NUM_STEPS - 2].topk_index[:, 0].tolist()


def test_decode_eager_and_graph_paths_agree(spy, monkeypatch):
    """Same request, same round: eager fallback and per-step graphs propose alike."""
    seq_lens = [12, 40]
    info = make_sampling_info([3, 4], [0.8, 1.1], [1 << 30, 1 << 30])
    logits = step_logits(2, seed=4)
    patch_prepare_for_draft_extend(monkeypatch)
    outs = []
    for graph in (NoGraph(), PerStepGraph(logits)):
        worker = make_draft_worker(logits, cuda_graph_runner=graph)
        batch, result = decode_inputs(seq_lens, [2, 2], info)
        worker._draft_extend_for_decode(batch, result)
        outs.append(result.next_draft_input)
    assert torch.equal(outs[0].topk_index, outs[1].topk_index)
    assert torch.equal(outs[0].draft_probs, outs[1].draft_probs)


def test_decode_without_rejection_sampling_does_not_sample(spy, monkeypatch):
    info = make_sampling_info([3, 4], [0.8, 1.1], [1 << 30, 1 << 30])
    logits = step_logits(2, seed=5)
    worker = make_draft_worker(logits, cuda_graph_runner=NoGraph())
    worker.use_rejection_sampling = False
    patch_prepare_for_draft_extend(monkeypatch)
    batch, result = decode_inputs([12, 40], [2, 2], info)
    worker._draft_extend_for_decode(batch, result)
    assert spy == []
    assert result.next_draft_input.draft_probs is None


# --------------------------------------------------------------------------
# row 7: the single-CG runner (in-graph sampler, padded batch, strided q)
# --------------------------------------------------------------------------


class FakeBackend:
    supports_draft_extend_metadata_staging = False

    def draft_extend_metadata_captured_in_graph(self):
        return True


def make_single_cg_runner(monkeypatch, max_bs=8, capture_bs=(1, 2, 4, 8)):
    """The DETSPEC single-CG composite with real buffers, no capture.

    _allocate_buffers and prepare are the real upstream methods (plus the
    DETSPEC overrides); only the MTP model runner config is faked.
    """
    monkeypatch.setattr(mlr, "get_draft_input_from_target_hidden_dim", lambda mr: HIDDEN)
    monkeypatch.setattr(
        mlr,
        "get_exec",
        lambda: SimpleNamespace(
            deterministic=SimpleNamespace(enable_deterministic_inference=True),
            mamba=SimpleNamespace(enable_mamba_extra_buffer=False),
        ),
        raising=False,
    )
    model_runner = SimpleNamespace(
        model_config=SimpleNamespace(
            dtype=torch.float32, vocab_size=VOCAB, hf_config=SimpleNamespace()
        )
    )
    eagle_worker = SimpleNamespace(
        use_rejection_sampling=True,
        topk=1,
        mtp_model_runner=lambda step: model_runner,
    )
    composite = object.__new__(ml.DetspecOneGraphDraftExtendRunner)
    runners = []
    for step in range(NUM_STEPS):
        r = object.__new__(ml.DetspecSingleCGStepRunner)
        r.__dict__.update(step=step, model_runner=model_runner, prune_draft_extend_logits=True)
        runners.append(r)
    composite.__dict__.update(
        eagle_worker=eagle_worker,
        device="cpu",
        speculative_num_steps=NUM_STEPS,
        draft_extend_attn_backend_list=[FakeBackend()] * NUM_STEPS,
        runners=runners,
        seq_len_fill_value=1,
        max_bs=max_bs,
        capture_bs=list(capture_bs),
        captured_req_width=NUM_DRAFT_TOKENS,
        num_front_tokens=0,
        prune_draft_extend_logits=True,
        require_gathered_buffer=False,
        require_mlp_tp_gather=False,
        _out_cache_loc_virtual=None,
        _kv_loc_plan=None,
        _kv_loc_cols=None,
    )
    composite.buffers = composite._allocate_buffers()
    for r in runners:
        r.buffers = composite.buffers
    return composite


def draft_extend_forward_batch(seq_lens, info):
    bs = len(seq_lens)
    n = bs * NUM_DRAFT_TOKENS
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int64) + NUM_DRAFT_TOKENS
    return SimpleNamespace(
        batch_size=bs,
        input_ids=torch.arange(n, dtype=torch.int64),
        positions=torch.arange(n, dtype=torch.int64),
        out_cache_loc=torch.arange(n, dtype=torch.int64),
        seq_lens=seq_lens_t,
        seq_lens_cpu=seq_lens_t.clone(),
        seq_lens_sum=int(seq_lens_t.sum()),
        req_pool_indices=torch.arange(bs),
        mamba_track_indices=None,
        out_cache_loc_virtual=None,
        kv_loc_plan=None,
        kv_loc_cols=None,
        spec_info=SimpleNamespace(
            num_correct_drafts=torch.ones(bs, dtype=torch.int32),
            num_accept_tokens=torch.full((bs,), 2, dtype=torch.int32),
            hidden_states=torch.zeros(n, HIDDEN),
        ),
        sampling_info=info,
    )


def replay_steps(composite, logits_padded):
    """Run each captured step's sampler on the prepared buffers (what replay does)."""
    bs = composite.bs
    rets = []
    for r in composite.runners:
        ret = SimpleNamespace(next_token_logits=logits_padded[r.step][:bs])
        r._sample_draft_proposal(ret, bs)
        rets.append(ret)
    return rets


def test_single_cg_buffers_exist_before_capture(monkeypatch):
    composite = make_single_cg_runner(monkeypatch)
    keys = composite.detspec_keys
    assert keys.sampling_seed.shape == (8,) and keys.sampling_seed.dtype == torch.int64
    assert keys.top_ks.shape == (8,)
    assert all(r.detspec_keys is keys for r in composite.runners)
    assert composite.buffers.draft_probs.shape == (8, NUM_STEPS, VOCAB)


def test_single_cg_padded_batch_keys_strided_q_and_refresh(spy, monkeypatch):
    composite = make_single_cg_runner(monkeypatch)
    seq_lens = [10, 300, 7]  # raw_bs 3 -> padded bucket 4
    seeds = [5, -3, 2**40]
    top_ks = [1 << 30, 1, 8]  # row 1 greedy
    info = make_sampling_info(seeds, [0.6, 1.0, 1.7], top_ks)
    logits = step_logits(4, seed=6)
    # A previous round's keys linger in the persistent buffers.
    composite.detspec_keys.sampling_seed.fill_(12345)
    composite.detspec_keys.top_ks.fill_(777)

    composite.prepare(draft_extend_forward_batch(seq_lens, info))
    assert (composite.raw_bs, composite.bs) == (3, 4)
    rets = replay_steps(composite, logits)

    assert len(spy) == NUM_STEPS
    buffers = composite.buffers
    positions = [L + NUM_DRAFT_TOKENS for L in seq_lens]
    for s, (c, ret) in enumerate(zip(spy, rets)):
        assert c.draft_step == s
        assert c.probs.shape == (4, VOCAB)
        # q is the draft_probs[:bs, step] slot itself: a strided view.
        assert c.probs.data_ptr() == buffers.draft_probs[:, s].data_ptr()
        assert c.probs.stride() == (NUM_STEPS * VOCAB, 1)
        assert c.sampling_seed[:3].tolist() == seeds
        assert c.positions[:3].tolist() == positions
        assert c.positions.dtype == torch.int32  # the graph buffer's dtype
        assert c.top_ks[:3].tolist() == top_ks
        assert c.sampling_seed[3].item() == 0 and c.top_ks[3].item() == 1
        assert ret.topk_index is c.topk_index
        expected_q = torch.empty(4, VOCAB)
        mlr.wide_row_softmax_triton(logits[s][:4], buffers.temperatures[:4], expected_q)
        assert torch.equal(buffers.draft_probs[:4, s], expected_q)
    assert_greedy_rows_propose_argmax(spy, greedy_rows=[1])
    # What verify receives: the clone of exactly the q the tokens were drawn from.
    q = composite.clone_draft_probs()
    for s, c in enumerate(spy):
        assert torch.equal(q[:, s], c.probs[:3])

    # Next round: new requests, smaller batch; keys are refreshed before replay.
    spy.clear()
    info2 = make_sampling_info([99], [1.0], [1 << 30])
    composite.prepare(draft_extend_forward_batch([1000], info2))
    assert (composite.raw_bs, composite.bs) == (1, 1)
    replay_steps(composite, logits)
    assert [c.sampling_seed.tolist() for c in spy] == [[99]] * NUM_STEPS
    assert [c.positions.tolist() for c in spy] == [[1000 + NUM_DRAFT_TOKENS]] * NUM_STEPS


def test_single_cg_padded_rows_do_not_affect_real_rows(spy, monkeypatch):
    info = make_sampling_info([5, 6, 7], [0.6, 1.0, 1.7], [1 << 30] * 3)
    results = []
    for pad_seed in (0, 1):
        composite = make_single_cg_runner(monkeypatch)
        composite.prepare(draft_extend_forward_batch([10, 20, 30], info))
        logits = step_logits(4, seed=7)
        # Garbage in the padded row: different logits and a different stale key.
        for l in logits:
            l[3] = torch.randn(VOCAB, generator=torch.Generator().manual_seed(pad_seed)) * 9
        composite.detspec_keys.sampling_seed[3] = 1000 + pad_seed
        composite.buffers.seq_lens[3] = 77 + pad_seed
        rets = replay_steps(composite, logits)
        results.append(
            (torch.cat([r.topk_index[:3] for r in rets], 1),
             composite.clone_draft_probs())
        )
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_single_cg_matches_eager_decode(spy, monkeypatch):
    """Graph and eager fallback must draw the same tokens (a batch larger than
    the largest captured graph runs eager; upstream's graph q comes from
    ``wide_row_softmax_triton``, its eager q from ``torch.softmax``)."""
    seq_lens = [10, 300, 7]
    info = make_sampling_info([5, -3, 2**40], [0.6, 1.0, 1.7], [1 << 30, 1, 8])
    logits = step_logits(4, seed=8)

    composite = make_single_cg_runner(monkeypatch)
    composite.prepare(draft_extend_forward_batch(seq_lens, info))
    rets = replay_steps(composite, logits)
    graph_tokens = torch.cat([r.topk_index[:3] for r in rets], 1)
    graph_q = composite.clone_draft_probs()

    worker = make_draft_worker([l[:3] for l in logits], cuda_graph_runner=NoGraph())
    patch_prepare_for_draft_extend(monkeypatch)
    batch, result = decode_inputs(seq_lens, [2, 2, 2], info)
    worker._draft_extend_for_decode(batch, result)

    assert torch.equal(result.next_draft_input.topk_index, graph_tokens)
    assert torch.equal(result.next_draft_input.draft_probs, graph_q)


def test_single_cg_refuses_missing_seeds(monkeypatch):
    composite = make_single_cg_runner(monkeypatch)
    info = make_sampling_info([1], [1.0], [1 << 30])
    info.sampling_seed = None
    with pytest.raises(RuntimeError, match="enable-deterministic-inference"):
        composite.prepare(draft_extend_forward_batch([10], info))


# --------------------------------------------------------------------------
# capture: the DETSPEC worker builds the DETSPEC single-CG runner, builtin not
# --------------------------------------------------------------------------


@pytest.fixture
def capture_env(monkeypatch):
    """Let _capture_cuda_graphs reach the runner choice on CPU; record the runner built."""
    built = []

    def fake_init(self, eagle_worker):
        built.append(self)
        self.eagle_worker = eagle_worker

    fakes = {
        "_is_cpu": False,
        "check_cuda_graph_backend": lambda *a, **k: False,
        "get_available_gpu_memory": lambda *a, **k: 0.0,
    }
    # The DETSPEC body reads its private globals, the builtin one the module.
    detspec_globals = rebound_globals("_capture_cuda_graphs")
    for name, value in fakes.items():
        monkeypatch.setitem(detspec_globals, name, value)
        monkeypatch.setattr(mlw, name, value)
    monkeypatch.setattr(
        mlr.OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner, "__init__", fake_init
    )
    monkeypatch.setenv("SGLANG_ENABLE_SINGLE_CG_DRAFT", "1")
    monkeypatch.delenv("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", raising=False)
    return built


def capture_with(cls, logits):
    worker = make_draft_worker(logits)
    worker.__class__ = cls
    for r in worker.draft_runner_list:
        r.attn_backend = FakeBackend()
    worker.gpu_id = 0
    worker._specialized_graph_memory_usage = {}
    worker._specialized_graph_time_usage = {}
    worker._capture_cuda_graphs()
    return worker


def test_capture_uses_detspec_single_cg_runner_only_for_detspec(capture_env):
    upstream_cls = mlw.OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner
    logits = step_logits(1, seed=9)

    detspec = capture_with(ml.DetspecMultiLayerEagleDraftWorker, logits)
    assert type(detspec.cuda_graph_runner_for_draft_extend) is ml.DetspecOneGraphDraftExtendRunner
    assert mlw.OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner is upstream_cls

    builtin = capture_with(mlw.MultiLayerEagleDraftWorker, logits)
    assert type(builtin.cuda_graph_runner_for_draft_extend) is upstream_cls
    assert len(capture_env) == 2


def test_detspec_runner_overrides_the_upstream_sampler_hook():
    # The in-graph sampler upstream selects when draft_probs exists.
    assert "_sample_draft_proposal" in vars(mlr.MultiLayerEagleDraftExtendCudaGraphRunner)
    assert "_sample_draft_proposal" in vars(ml.DetspecSingleCGStepRunner)
    assert "prepare" in vars(mlr.MultiLayerEagleMultiStepDraftExtendCudaGraphRunner)
    assert hasattr(mlw, ml._SINGLE_CG_RUNNER_NAME)


# --------------------------------------------------------------------------
# the spec worker: upstream __init__ of each version, DETSPEC draft worker
# --------------------------------------------------------------------------


def test_worker_builds_detspec_draft_worker(monkeypatch):
    import inspect

    built = []

    def fake_draft_init(self, *args, **kwargs):  # model loading needs a GPU
        built.append(args)
        self.parallel_layout = None

    monkeypatch.setattr(ml.DetspecMultiLayerEagleDraftWorker, "__init__", fake_draft_init)
    target = harness.bare_target_worker()
    spec = dict(speculative_eagle_topk=1, speculative_num_steps=NUM_STEPS,
                speculative_num_draft_tokens=NUM_DRAFT_TOKENS)
    if "ps" in inspect.signature(mlw.MultiLayerEagleWorkerV2.__init__).parameters:
        # 0.5.17 - 0.5.20: (server_args, gpu_id, ps, nccl_port, target_worker); 0.5.17 reads server_args,
        # 0.5.18 - 0.5.20 already read the page size from the runtime context (get_schedule()).
        server_args = SimpleNamespace(device="cpu", page_size=1,
                                      speculative_algorithm="EAGLE", **spec)
        from sglang.srt.runtime_context import get_context

        ctx = get_context().override_server_args(speculative_algorithm="EAGLE", device="cpu", page_size=1, **spec)
        kwargs = dict(server_args=server_args, gpu_id=0, ps=None, nccl_port=1,
                      target_worker=target)
    else:
        # 0.5.21+: (server_args, gpu_id, nccl_port, target_worker), reads the runtime context.
        from sglang.test.test_utils import published_topology

        ctx = published_topology(speculative_algorithm="EAGLE", device="cpu", **spec)
        kwargs = dict(server_args=None, gpu_id=0, nccl_port=1, target_worker=target)
    with ctx:
        worker = ml.DetspecMultiLayerEagleWorkerV2(**kwargs)
    assert type(worker._draft_worker) is ml.DetspecMultiLayerEagleDraftWorker
    assert len(built) == 1 and built[0][-1] is target
    assert worker.speculative_num_steps == NUM_STEPS
    assert isinstance(worker, mlw.MultiLayerEagleWorkerV2)
    # The target model runner now samples with the token-id-keyed DETSPEC sampler.
    assert isinstance(target.model_runner.sampler, detspec_sampler_class())
