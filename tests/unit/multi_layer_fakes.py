"""Shared fakes for the multi-layer EAGLE (MTP) draft-site tests (CPU, no model weights).

The tests drive the real SGLang methods of the installed version (0.5.17 or
0.5.23) -- ``MultiLayerEagleDraftWorker._draft_extend_for_prefill`` /
``_draft_extend_for_decode`` through the DETSPEC subclass, and the single-CG
runner's ``_allocate_buffers`` / ``prepare`` / ``_sample_draft_proposal`` --
with the smallest CPU inputs.  What needs a GPU to construct (the MTP model
runners, ``ForwardBatch.init_new`` on a real ScheduleBatch, a captured CUDA
graph) is replaced here by a narrow fake that returns fixed logits.

``spy`` records every ``seeded_draft_proposal`` call and delegates to the real
function; ``upstream_kwargs`` records what the installed SGLang itself passes
to ``sample_draft_proposal``.  Used by test_multi_layer_worker_sites.py,
test_multi_layer_single_cg_sampler.py and test_multi_layer_construction.py,
which take the fixtures by importing them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner as mlr
import sglang.srt.speculative.multi_layer_eagle_worker_v2 as mlw
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.eagle_info import EagleDraftInput

from sglang_detspec.integration.sampling import proposal
from sglang_detspec.integration.workers import multi_layer as ml

SGLANG_0523 = "sampling_seed" in {
    f.name for f in dataclasses.fields(mlr.MultiLayerEagleDraftExtendInputBuffers)
}

NUM_STEPS = 3
NUM_DRAFT_TOKENS = NUM_STEPS + 1
VOCAB = 4100  # > one 4096-wide softmax block, so the wide-row reduction has 2 partials
HIDDEN = 8




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
    runners = [FakeMTPRunner(layer_logits) for layer_logits in logits_per_step]
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
        # What run_eagle_verify returns (eagle_worker_common.py: new_seq_lens = batch.seq_lens + accept_lens).
        new_seq_lens=torch.tensor(seq_lens, dtype=torch.int64) + torch.tensor(accept_lens, dtype=torch.int64),
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


class FakeBackend:
    supports_draft_extend_metadata_staging = False

    def draft_extend_metadata_captured_in_graph(self):
        return True


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
        # What the real step runner's __init__ sets (multi_layer_eagle_draft_extend_cuda_graph_runner.py).
        r.__dict__.update(step=step, model_runner=model_runner, prune_draft_extend_logits=True,
                          speculative_num_draft_tokens=NUM_DRAFT_TOKENS)
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


def draft_extend_forward_batch(seq_lens, info, accept_lens=None):
    """The forward batch ``_draft_extend_for_decode`` hands ``prepare()``; ``accept_lens`` (with the bonus token)
    defaults to 2 per request."""
    bs = len(seq_lens)
    accept = torch.full((bs,), 2, dtype=torch.int32) if accept_lens is None else torch.tensor(accept_lens, dtype=torch.int32)
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
            num_correct_drafts=accept - 1,
            num_accept_tokens=accept,
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
