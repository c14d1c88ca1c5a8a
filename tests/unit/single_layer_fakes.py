"""Shared fakes for the single-layer draft-site tests (CPU, no model weights).

The tests drive the *real* upstream method bodies of the installed SGLang
(0.5.17 or 0.5.23; ``DetspecEagleDraftWorker`` runs them with DETSPEC sampling
names). Only what needs a GPU model is faked here: the draft model runner's
``forward`` (a fixed logits table indexed by input token), attention backends
(no-ops), the draft CUDA-graph backend (a replay re-runs the captured closure)
and the batches the worker is handed.

Two stand-ins for ``seeded_draft_proposal`` record the keys they are given:
``recorder`` draws a simple function of the key, ``(seed + position + 7 * step)
% V`` (argmax of q for greedy rows; :func:`key_token`), so the returned token
chain also reveals a wrong key; ``spy`` draws with the real function.

Used by test_single_layer_keys.py, test_single_layer_graph_runner.py,
test_single_layer_construction.py, test_single_layer_parity.py and
tests/gpu/test_draft_graph_replay.py (which loads this file by path). A test
module takes the fixtures by importing them.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.runtime_context import get_context

from sglang_detspec.integration.sampling import proposal as proposal_mod
from sglang_detspec.integration.workers import single_layer as sl

V = 48
HIDDEN = 8
TOP_K_ALL = 1 << 30

# One batch shared by the key tests: row 1 is a greedy request inside a sampled batch.
SEEDS = [5, 123456789012, -77]
TOP_KS = [TOP_K_ALL, 1, 20]
SEQ_LENS = [10, 33, 1000]


@pytest.fixture(autouse=True)
def eager_torch_compile():
    # Upstream's _select_top_k_tokens_later is @torch.compile; inductor on CPU
    # would need a C++ toolchain and minutes. Run it eagerly.
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


@contextlib.contextmanager
def published(**overrides):
    fields = dict(
        enable_deterministic_inference=True,
        speculative_use_rejection_sampling=True,
        speculative_eagle_topk=1,
        speculative_num_steps=4,
        speculative_num_draft_tokens=5,
        speculative_algorithm="EAGLE",
    )
    fields.update(overrides)
    with get_context().override_server_args(**fields):
        yield


class Recorder:
    """Stands in for seeded_draft_proposal; records every key it is given."""

    def __init__(self):
        self.calls = []

    def __call__(self, probs, sampling_seed, positions, draft_step, top_ks=None, *, hot_vocab=None):
        bs = probs.shape[0]
        self.calls.append(
            dict(
                hot_vocab=hot_vocab,
                probs=probs,
                seed=sampling_seed.clone(),
                positions=positions.to(torch.int64).clone(),
                step=int(draft_step),
                top_ks=None if top_ks is None else top_ks[:bs].clone(),
            )
        )
        idx = (sampling_seed + positions.to(torch.int64) + 7 * int(draft_step)) % probs.shape[1]
        idx = idx.view(-1, 1)
        if top_ks is not None:
            greedy = (top_ks[:bs] <= 1).view(-1, 1)
            idx = torch.where(greedy, probs.argmax(dim=-1, keepdim=True), idx)
        return probs.gather(1, idx), idx


def key_token(seed, pos, step):
    return (seed + pos + 7 * step) % V


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(proposal_mod, "seeded_draft_proposal", rec)
    return rec


class FakeDraftRunner:
    """The draft ModelRunner, reduced to a logits table lookup."""

    def __init__(self, seed=0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        self.table = (torch.randn(V, V, generator=g) * 3).to(device)
        self.model_config = SimpleNamespace(
            hf_config=SimpleNamespace(architectures=["LlamaForCausalLMEagle"]),
            model_is_mrope=False,
            vocab_size=V,
        )
        self.canary_manager = None
        self.forward_inputs = []

    def forward(self, forward_batch, *args, **kwargs):
        ids = forward_batch.input_ids.to(torch.int64)
        self.forward_inputs.append(ids.clone())
        logits = self.table[ids]
        hidden = torch.zeros(ids.shape[0], HIDDEN, device=ids.device)
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden)
        )


def make_worker(num_steps=4, device="cpu"):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    w = object.__new__(sl.DetspecEagleDraftWorker)
    w.topk = 1
    w.speculative_num_steps = num_steps
    w.speculative_num_draft_tokens = num_steps + 1
    w.hot_token_id = None
    w._topk1_parents_prealloc = torch.zeros((64, num_steps), dtype=torch.int64, device=device)
    w._topk1_score_indices_prealloc = torch.zeros((64, num_steps + 1), dtype=torch.int64, device=device)
    w.index_share_for_mtp_iteration = False
    w.seed_dsa_topk_from_draft_extend = False
    w.draft_runner = FakeDraftRunner(device=device)
    w.draft_attn_backend = SimpleNamespace(attn_backends=[None] * num_steps)
    w.speculative_algorithm = SpeculativeAlgorithm.EAGLE
    w.device = device
    w.plan_stream = None
    w.plan_stream_ctx = contextlib.nullcontext()
    w.cuda_graph_runner = None
    w.cuda_graph_runner_for_draft_extend = None
    w.dsa_extend_topk_buf = None
    return w


def sampling_info(seeds, top_ks, temperatures=None, device="cpu"):
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    bs = len(seeds)
    top_ks_t = torch.tensor(top_ks, dtype=torch.int32, device=device)
    return SamplingBatchInfo(
        temperatures=(
            torch.tensor(temperatures, dtype=torch.float32, device=device).view(-1, 1)
            if temperatures is not None
            else torch.ones(bs, 1, device=device)
        ),
        top_ps=torch.ones(bs, device=device),
        top_ks=top_ks_t,
        min_ps=torch.zeros(bs, device=device),
        is_all_greedy=bool((top_ks_t <= 1).all()),
        is_any_greedy=bool((top_ks_t <= 1).any()),
        need_top_p_sampling=False,
        need_top_k_sampling=bool(((top_ks_t > 1) & (top_ks_t < TOP_K_ALL)).any()),
        need_min_p_sampling=False,
        vocab_size=V,
        sampling_seed=torch.tensor(seeds, dtype=torch.int64, device=device),
    )


def decode_forward_batch(si, seq_lens, first_tokens, num_steps=4, device="cpu"):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    bs = len(seq_lens)
    first = torch.tensor(first_tokens, dtype=torch.int64, device=device).view(-1, 1)
    q0 = torch.full((bs, V), 1.0 / V, device=device)
    spec_info = EagleDraftInput(
        topk_p=q0.gather(1, first),
        topk_index=first,
        draft_probs=q0,
        hidden_states=torch.zeros(bs, HIDDEN, device=device),
    )
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        batch_size=bs,
        spec_info=spec_info,
        sampling_info=si,
        positions=torch.tensor(seq_lens, dtype=torch.int64, device=device),
        out_cache_loc=torch.arange(bs * num_steps, dtype=torch.int64, device=device),
        input_ids=None,
        moe_num_token_non_padded=None,
        mrope_positions=None,
    )



class RerunBackend:
    """CPU stand-in for the CUDA-graph backend: a "replay" re-runs the captured
    closure, which reads the same persistent buffers a real graph would.

    0.5.23 captures two variants of one closure and flips the captured
    SamplingBatchInfo.is_all_greedy between them; a real graph freezes that
    choice at capture, so the backend restores it before re-running.
    """

    def __init__(self):
        self.graphs = {}

    def capture_one(self, shape_key, run_once, capture_inputs=None, post_warmup_hook=None):
        cells = dict(zip(run_once.__code__.co_freevars, (c.cell_contents for c in run_once.__closure__)))
        si = cells["forward_batch"].sampling_info
        run_once()  # the warm-up run a real capture does
        self.graphs[shape_key] = (run_once, si, si.is_all_greedy)

    def replay(self, shape_key, forward_batch):
        run_once, si, all_greedy = self.graphs[shape_key]
        si.is_all_greedy = all_greedy
        return run_once()

    def can_run(self, forward_batch, shape_key):
        return shape_key in self.graphs


def make_runner(worker, capture_bs, num_steps, device="cpu", backend=None, draft_vocab=V):
    import dataclasses as dc

    from sglang.srt.speculative import eagle_draft_cuda_graph_runner as edr
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    r = object.__new__(sl.DetspecEAGLEDraftCudaGraphRunner)
    r.eagle_worker = worker
    r.model_runner = SimpleNamespace(
        device=device,
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
        model_config=SimpleNamespace(vocab_size=V, model_is_mrope=False),
        is_draft_worker=False,  # skips flashinfer autotune
        kv_index_translator=SimpleNamespace(bind_runner_slots=lambda fb: None),
        device_timer=None,
        server_args=SimpleNamespace(speculative_use_rejection_sampling=True),
    )
    r.draft_attn_backend = SimpleNamespace(
        attn_backends=[None] * num_steps,
        init_forward_metadata_in_graph=lambda fb: None,
        init_forward_metadata_out_graph=lambda fb, in_capture=False: None,
    )
    r.deepep_adapter = SimpleNamespace(capture=lambda **k: None, replay=lambda: None)
    r.backend = backend if backend is not None else RerunBackend()
    r.model_context = contextlib.nullcontext
    r.speculative_num_steps = num_steps
    r.topk = 1
    r.captured_req_width = 1
    r.capture_bs = sorted(capture_bs)
    r.max_bs = max(capture_bs)
    r.disable_padding = False
    r.require_gathered_buffer = r.require_mlp_tp_gather = False
    r.require_attn_tp_gather = r.require_mlp_sync = False
    r.seq_len_fill_value = 1
    r.extend_seq_lens_cpu = [1] * r.max_bs
    mb = r.max_bs
    r.temperatures = torch.ones((mb, 1), device=device)
    r.top_ks = torch.full((mb,), TOP_K_ALL, dtype=torch.int32, device=device)  # 0.5.23 only
    values = dict(
        input_ids=torch.zeros(mb, dtype=torch.int64),
        req_pool_indices=torch.zeros(mb, dtype=torch.int64),
        out_cache_loc=torch.zeros(mb * num_steps, dtype=torch.int64),
        positions=torch.zeros(mb, dtype=torch.int64),
        mrope_positions=torch.zeros((3, mb), dtype=torch.int64),
        rids_int=None,
        bootstrap_room_ids_int=None,
        seq_lens=torch.full((mb,), 1, dtype=torch.int64),
        seq_lens_cpu=torch.full((mb,), 1, dtype=torch.int64),
        extend_seq_lens=torch.ones(mb, dtype=torch.int32),
        topk_p=torch.zeros((mb, 1)),
        topk_index=torch.zeros((mb, 1), dtype=torch.int64),
        draft_probs=torch.zeros((mb, draft_vocab)),  # a reduced draft's q has its own width
        hidden_states=torch.zeros((mb, HIDDEN)),
        global_num_tokens_gpu=None,
        global_num_tokens_for_logprob_gpu=None,
        dsa_seed_topk=None,
        # 0.5.23 allocates this itself under deterministic RS (0.5.17 has no field)
        sampling_seed=torch.zeros(mb, dtype=torch.int64),
    )
    names = {f.name for f in dc.fields(edr.EagleDraftInputBuffers)}
    values = {k: (v.to(device) if k != "seq_lens_cpu" and v is not None else v) for k, v in values.items()}
    r.buffers = edr.EagleDraftInputBuffers(**{k: v for k, v in values.items() if k in names})
    for bs in sorted(capture_bs, reverse=True):
        r.capture_one_shape(bs, None)
    return r


def replay_batch(si, seq_lens, first_tokens, num_steps, device="cpu"):
    """A live decode ForwardBatch as the worker hands it to runner.execute."""
    fb = decode_forward_batch(si, seq_lens, first_tokens, num_steps, device)
    bs = len(seq_lens)
    fb.seq_lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)
    fb.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
    fb.seq_lens_sum = int(sum(seq_lens))
    fb.req_pool_indices = torch.arange(bs, dtype=torch.int64, device=device)
    fb.rids_int = None
    fb.bootstrap_room_ids_int = None
    fb.spec_info.dsa_topk_indices = None
    return fb


@pytest.fixture
def spy(monkeypatch):
    """Records keys but draws with the real seeded_draft_proposal (reference on CPU)."""
    pytest.importorskip("sglang_detspec.stream.reference")
    real = proposal_mod.seeded_draft_proposal
    calls = []

    def wrapped(probs, sampling_seed, positions, draft_step, top_ks=None, *, hot_vocab=None):
        bs = probs.shape[0]
        calls.append(
            dict(
                hot_vocab=hot_vocab,
                seed=sampling_seed.clone(),
                positions=positions.to(torch.int64).clone(),
                step=int(draft_step),
                top_ks=None if top_ks is None else top_ks[:bs].clone(),
            )
        )
        return real(probs, sampling_seed, positions, draft_step, top_ks, hot_vocab=hot_vocab)

    monkeypatch.setattr(proposal_mod, "seeded_draft_proposal", wrapped)
    return calls
