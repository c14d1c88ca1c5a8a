"""DETSPEC single-layer draft sites call seeded_draft_proposal with 0.5.23's keys.

Each test drives the *real* upstream method body of the installed SGLang
(0.5.17 or 0.5.23; ``DetspecEagleDraftWorker`` runs it with DETSPEC sampling
names) on CPU. Only what needs a GPU model is faked: the draft model runner's
``forward`` (a fixed logits table indexed by input token), attention backends
(no-ops) and, for the extend sites, ForwardBatch construction.

``seeded_draft_proposal`` is replaced by a recorder whose draw is a simple
function of the key, ``(seed + position + 7 * step) % V`` (argmax of q for
greedy rows), so the returned token chain also reveals a wrong key.
Expectations are written from the keys sglang 0.5.23's own seeded calls pass
(``speculative/eagle_worker_v2.py``: ``_draft_extend_for_prefill``,
``draft_forward``, ``_draft_extend_for_decode``), not from the code under test:
    prefill draft-extend : (seed, L, 0)
    draft-decode step i  : (seed, seq_lens + i + 1, i + 1)
    decode draft-extend  : (seed, new_seq_lens, 0)
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

import sglang_verify_harness as harness
from sglang.srt.runtime_context import get_context

from sglang_detspec.integration import proposal as proposal_mod
from sglang_detspec.integration import single_layer as sl
from sglang_detspec.integration.target_sampler import detspec_sampler_class

V = 48
HIDDEN = 8
TOP_K_ALL = 1 << 30


# ---------------------------------------------------------------------------
# Fixtures and fakes
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _eager_torch_compile():
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

    def __call__(self, probs, sampling_seed, positions, draft_step, top_ks=None):
        bs = probs.shape[0]
        self.calls.append(
            dict(
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


# ---------------------------------------------------------------------------
# Site 2: draft-decode (draft_forward), eager
# ---------------------------------------------------------------------------

SEEDS = [5, 123456789012, -77]
TOP_KS = [TOP_K_ALL, 1, 20]  # row 1 is a greedy request inside a sampled batch
SEQ_LENS = [10, 33, 1000]


def test_draft_forward_keys_every_step_and_hands_q_to_verify(recorder):
    num_steps = 4
    with published(speculative_num_steps=num_steps, speculative_num_draft_tokens=num_steps + 1):
        w = make_worker(num_steps)
        si = sampling_info(SEEDS, TOP_KS, temperatures=[0.7, 1.0, 1.3])
        fb = decode_forward_batch(si, SEQ_LENS, first_tokens=[3, 4, 5])
        _, _, draft_tokens, draft_probs = w.draft_forward(fb)

    assert [c["step"] for c in recorder.calls] == [1, 2, 3]
    for i, call in enumerate(recorder.calls):
        assert call["seed"].tolist() == SEEDS
        assert call["positions"].tolist() == [s + i + 1 for s in SEQ_LENS]
        assert call["top_ks"].tolist() == TOP_KS

    # The chain is what the keyed draws returned: token i+1 is call i's index.
    assert draft_tokens.shape == (3, num_steps)
    assert draft_tokens[:, 0].tolist() == [3, 4, 5]
    for i in range(num_steps - 1):
        for b in (0, 2):
            assert draft_tokens[b, i + 1].item() == key_token(SEEDS[b], SEQ_LENS[b] + i + 1, i + 1)

    # Greedy row proposes argmax of the very q handed to verify.
    # draft_probs[:, i + 1] must be the q step i drew from (verify contract).
    assert draft_probs.shape == (3, num_steps, V)
    for i, call in enumerate(recorder.calls):
        assert torch.equal(draft_probs[:, i + 1], call["probs"])
        assert draft_tokens[1, i + 1].item() == call["probs"][1].argmax().item()
        # q = softmax(logits / T) of the token the step consumed.
        logits = w.draft_runner.table[draft_tokens[:, i]]
        expect_q = torch.softmax(logits / si.temperatures, dim=-1)
        torch.testing.assert_close(call["probs"], expect_q, rtol=1e-5, atol=1e-6)


# A DETSPEC site never falls back to upstream's global-RNG sampler, even where the mode says seeds are optional.
@pytest.mark.parametrize("deterministic", [True, False])
def test_draft_forward_without_seed_refuses_in_any_mode(recorder, deterministic):
    with published(enable_deterministic_inference=deterministic):
        w = make_worker(4)
        si = sampling_info(SEEDS, TOP_KS)
        si.sampling_seed = None
        fb = decode_forward_batch(si, SEQ_LENS, first_tokens=[3, 4, 5])
        with pytest.raises(RuntimeError, match="sampling_seed"):
            w.draft_forward(fb)
    assert recorder.calls == []


def test_fast_sample_refuses_more_than_one_draft_per_row(recorder):
    site = sl.DraftSite(sl.PREFILL_EXTEND, SimpleNamespace(sampling_seed=torch.tensor([1]), top_ks=None), lambda: None)
    with published(), sl._DRAFT_SITE.entered(site), pytest.raises(RuntimeError, match="2 drafts per row"):
        sl._detspec_fast_sample(torch.full((1, V), 1.0 / V), 2)
    assert recorder.calls == []


def test_builtin_eagle_worker_is_untouched(recorder):
    """Same process, builtin EagleDraftWorker: upstream sampling, no DETSPEC keys."""
    from sglang.srt.speculative import eagle_worker_v2, spec_utils

    # The DETSPEC bodies are built (cached) first, so any module mutation
    # would already be visible here.
    sl._upstream(eagle_worker_v2.EagleDraftWorker, "draft_forward")
    assert eagle_worker_v2.sample_draft_proposal is spec_utils.sample_draft_proposal
    assert eagle_worker_v2.fast_sample is spec_utils.fast_sample
    assert eagle_worker_v2.EagleDraftWorker.draft_forward.__globals__[
        "sample_draft_proposal"
    ] is spec_utils.sample_draft_proposal
    with published(enable_deterministic_inference=False):
        w = make_worker(4)
        w.__class__ = eagle_worker_v2.EagleDraftWorker
        si = sampling_info(SEEDS, TOP_KS)
        si.sampling_seed = None
        fb = decode_forward_batch(si, SEQ_LENS, first_tokens=[3, 4, 5])
        w.draft_forward(fb)
    assert recorder.calls == []


# ---------------------------------------------------------------------------
# Site 1: prefill draft-extend
# ---------------------------------------------------------------------------


def test_prefill_draft_extend_keys_prompt_length_step0(recorder, monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    prompt_lens = [4, 2, 3]
    created = []

    def fake_init_new(batch, model_runner, *args, **kwargs):
        # One logits row per request (LAST capture): the last rotated input id.
        ends = torch.tensor(prompt_lens).cumsum(0) - 1
        fb = SimpleNamespace(
            input_ids=batch.input_ids[ends],
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(prompt_lens),
            spec_info=batch.spec_info,
            return_logprob=False,
        )
        created.append(fb)
        return fb

    monkeypatch.setattr(ForwardBatch, "init_new", staticmethod(fake_init_new))
    si = sampling_info(SEEDS, TOP_KS, temperatures=[0.5, 1.0, 2.0])
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        input_ids=torch.arange(sum(prompt_lens), dtype=torch.int64) % V,
        extend_lens=prompt_lens,
        seq_lens=torch.tensor(prompt_lens, dtype=torch.int64),
        sampling_info=si,
        chunked_req_next_prompt_token=None,
        reqs=[None] * 3,
        chunked_req=None,
        spec_info=None,
    )
    next_token_ids = torch.tensor([7, 8, 9])
    with published():
        w = make_worker(4)
        out = w._draft_extend_for_prefill(batch, torch.zeros(9, HIDDEN), next_token_ids)

    assert len(recorder.calls) == 1
    call = recorder.calls[0]
    assert call["seed"].tolist() == SEEDS
    assert call["positions"].tolist() == prompt_lens
    assert call["step"] == 0
    assert call["top_ks"].tolist() == TOP_KS
    # Tokens: keyed draw for sampled rows, argmax for the greedy row.
    assert out.topk_index[0, 0].item() == key_token(SEEDS[0], prompt_lens[0], 0)
    assert out.topk_index[2, 0].item() == key_token(SEEDS[2], prompt_lens[2], 0)
    assert out.topk_index[1, 0].item() == call["probs"][1].argmax().item()
    # Verify receives exactly the q the proposal was drawn from.
    assert out.draft_probs is call["probs"]
    assert torch.equal(out.topk_p, call["probs"].gather(1, out.topk_index))
    # q tracks the request temperature (the bonus token is each row's last input).
    expect_q = torch.softmax(w.draft_runner.table[next_token_ids] / si.temperatures, dim=-1)
    torch.testing.assert_close(call["probs"], expect_q, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Site 3: decode draft-extend
# ---------------------------------------------------------------------------


def test_decode_draft_extend_keys_new_seq_lens_step0(recorder, monkeypatch):
    from sglang.srt.speculative import eagle_worker_v2

    num_steps = 3
    n = num_steps + 1
    accept_lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int64)
    new_seq_lens = seq_lens + accept_lens
    verified = torch.arange(3 * n, dtype=torch.int64) % V  # target tokens per slot

    def fake_prepare_for_draft_extend(draft_extend_input, batch, next_token_ids, *a, **k):
        # The draft extend forward sees every verified slot of every request.
        return SimpleNamespace(input_ids=verified.clone(), spec_info=draft_extend_input)

    monkeypatch.setattr(eagle_worker_v2, "prepare_for_draft_extend", fake_prepare_for_draft_extend)
    sl._upstream.cache_clear()  # re-snapshot module globals with the fake
    try:
        si = sampling_info(SEEDS, TOP_KS, temperatures=[0.9, 1.0, 1.1])
        batch = SimpleNamespace(seq_lens=seq_lens, sampling_info=si)
        batch_result = SimpleNamespace(
            prepared_draft_extend_inputs=None,
            accept_lens=accept_lens,
            next_token_ids=verified.clone(),
            logits_output=SimpleNamespace(hidden_states=torch.zeros(3 * n, HIDDEN)),
            new_seq_lens=new_seq_lens,
            next_draft_input=SimpleNamespace(),
        )
        with published(speculative_num_steps=num_steps, speculative_num_draft_tokens=n):
            w = make_worker(num_steps)
            w._draft_extend_for_decode(batch, batch_result)
    finally:
        sl._upstream.cache_clear()

    assert len(recorder.calls) == 1
    call = recorder.calls[0]
    assert call["seed"].tolist() == SEEDS
    assert call["positions"].tolist() == new_seq_lens.tolist()
    assert call["step"] == 0
    assert call["top_ks"].tolist() == TOP_KS
    nd = batch_result.next_draft_input
    for b in (0, 2):
        assert nd.topk_index[b, 0].item() == key_token(SEEDS[b], new_seq_lens[b].item(), 0)
    assert nd.topk_index[1, 0].item() == call["probs"][1].argmax().item()
    assert nd.draft_probs is call["probs"]
    # q is the draft distribution at each request's last accepted slot.
    last_slot = torch.arange(3) * n + accept_lens.to(torch.int64) - 1
    expect_q = torch.softmax(w.draft_runner.table[verified[last_slot]] / si.temperatures, dim=-1)
    torch.testing.assert_close(call["probs"], expect_q, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Draft-decode CUDA-graph runner: capture two shapes, replay a padded batch
# ---------------------------------------------------------------------------


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


def make_runner(worker, capture_bs, num_steps, device="cpu", backend=None):
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
        draft_probs=torch.zeros((mb, V)),
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
    pytest.importorskip("sglang_detspec.reference")
    real = proposal_mod.seeded_draft_proposal
    calls = []

    def wrapped(probs, sampling_seed, positions, draft_step, top_ks=None):
        bs = probs.shape[0]
        calls.append(
            dict(
                seed=sampling_seed.clone(),
                positions=positions.to(torch.int64).clone(),
                step=int(draft_step),
                top_ks=None if top_ks is None else top_ks[:bs].clone(),
            )
        )
        return real(probs, sampling_seed, positions, draft_step, top_ks)

    monkeypatch.setattr(proposal_mod, "seeded_draft_proposal", wrapped)
    return calls


@pytest.mark.parametrize("raw_bs", [2, 3])  # 3 pads to the captured 4
def test_draft_graph_replay_matches_eager_with_padding(spy, raw_bs):
    num_steps = 4
    seeds = [11, -3, 2**40 + 5][:raw_bs]
    top_ks = [TOP_K_ALL, 1, 30][:raw_bs]
    seq_lens = [17, 250, 64][:raw_bs]
    first = [1, 2, 3][:raw_bs]
    temps = [0.8, 1.0, 1.7][:raw_bs]
    with published(speculative_num_steps=num_steps, speculative_num_draft_tokens=num_steps + 1):
        worker = make_worker(num_steps)
        runner = make_runner(worker, capture_bs=[2, 4], num_steps=num_steps)
        # Capture saw only persistent buffers, never a live batch's seeds.
        spy.clear()

        eager = worker.draft_forward(
            decode_forward_batch(sampling_info(seeds, top_ks, temps), seq_lens, first, num_steps)
        )
        eager_calls = list(spy)
        spy.clear()

        # Poison the padded row's inputs: it must not change real rows.
        runner.buffers.positions.fill_(123456)
        graph = runner.execute(replay_batch(sampling_info(seeds, top_ks, temps), seq_lens, first, num_steps))
        graph_calls = list(spy)

    _, _, eager_tokens, eager_probs = eager
    _, _, graph_tokens, graph_probs = graph
    assert graph_tokens.shape == (raw_bs, num_steps)
    assert torch.equal(graph_tokens, eager_tokens)
    assert torch.equal(graph_probs, eager_probs)

    padded_bs = 2 if raw_bs == 2 else 4
    assert [c["step"] for c in graph_calls] == [1, 2, 3]
    for i, (g, e) in enumerate(zip(graph_calls, eager_calls)):
        assert g["seed"].shape[0] == padded_bs  # the graph draws for padded rows too
        assert g["seed"][:raw_bs].tolist() == seeds == e["seed"].tolist()
        assert g["positions"][:raw_bs].tolist() == [s + i + 1 for s in seq_lens]
        assert g["positions"][:raw_bs].tolist() == e["positions"].tolist()
        # A real top_k reached the graph (0.5.17 would otherwise capture -1 = greedy).
        assert g["top_ks"][:raw_bs].tolist() == top_ks
    # The greedy request proposed the argmax of its q at every step.
    for i in range(1, num_steps):
        assert graph_tokens[1, i].item() == graph_probs[1, i].argmax().item()


def test_draft_graph_replay_reads_refreshed_seeds(spy):
    """A second replay with other seeds must not reuse the first batch's."""
    num_steps = 3
    with published(speculative_num_steps=num_steps, speculative_num_draft_tokens=num_steps + 1):
        worker = make_worker(num_steps)
        runner = make_runner(worker, capture_bs=[2], num_steps=num_steps)
        outs = []
        for seeds in ([1, 2], [1000003, 2**50 + 7]):
            spy.clear()
            si = sampling_info(seeds, [TOP_K_ALL, TOP_K_ALL])
            outs.append(runner.execute(replay_batch(si, [40, 41], [5, 6], num_steps))[2])
            assert spy[0]["seed"].tolist() == seeds
            eager = worker.draft_forward(
                decode_forward_batch(sampling_info(seeds, [TOP_K_ALL, TOP_K_ALL]), [40, 41], [5, 6], num_steps)
            )[2]
            assert torch.equal(outs[-1], eager)


def test_empty_batch_draws_nothing_and_needs_no_seed(recorder):
    """Idle DP-attention batches reach the sites with zero rows and maybe no seed."""
    site = sl.DraftSite(sl.DECODE_EXTEND, SimpleNamespace(sampling_seed=None, top_ks=None), lambda: None)
    with published(), sl._DRAFT_SITE.entered(site):
        probs, p, idx = sl._detspec_sample_draft_proposal(torch.zeros(0, V), torch.ones(0, 1))
        p2, idx2 = sl._detspec_fast_sample(torch.zeros(0, V), 1)
    assert probs.shape == (0, V) and idx.shape == (0, 1) and idx2.shape == (0, 1)
    assert recorder.calls == []


def test_stand_in_outside_a_known_site_refuses():
    with pytest.raises(RuntimeError, match="outside a known draft site"):
        sl._detspec_sample_draft_proposal(torch.zeros(1, V), torch.ones(1, 1))


# ---------------------------------------------------------------------------
# Construction: DETSPEC builds its draft worker, builtin EAGLE keeps upstream's
# ---------------------------------------------------------------------------


def test_spec_worker_builds_the_detspec_draft_worker_and_builtin_does_not(monkeypatch):
    import inspect

    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative import eagle_worker_v2
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, EagleDraftWorker

    built = []

    def fake_draft_init(self, *args, **kwargs):  # the real one loads a model on a GPU
        built.append(type(self))
        self.parallel_layout = None

    monkeypatch.setattr(EagleDraftWorker, "__init__", fake_draft_init)
    params = inspect.signature(EAGLEWorkerV2.__init__).parameters
    server_args = SimpleNamespace(
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        device="cpu",
        page_size=1,
        speculative_algorithm="EAGLE",
        speculative_adaptive=False,
    )
    target = harness.bare_target_worker()
    kwargs = dict(server_args=server_args, gpu_id=0, nccl_port=0, target_worker=target)
    if "ps" in params:  # 0.5.17 passes the ParallelState explicitly
        kwargs["ps"] = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(published(speculative_num_steps=3, speculative_num_draft_tokens=4, device="cpu"))
        if "ps" not in params:  # 0.5.21+ read the pipeline rank from the runtime context
            stack.enter_context(get_parallel().override(pp_group=SimpleNamespace(is_last_rank=True)))
        # 0.5.19 - 0.5.20 still take ps but read the rank from parallel_state's group (eagle_worker_v2.py:1086).
        if hasattr(eagle_worker_v2, "get_pp_group"):
            monkeypatch.setattr(eagle_worker_v2, "get_pp_group", lambda: SimpleNamespace(is_last_rank=True))
        detspec = sl.DetspecEAGLEWorkerV2(**kwargs)
        builtin = EAGLEWorkerV2(**kwargs)
    assert type(detspec._draft_worker) is sl.DetspecEagleDraftWorker
    assert type(builtin._draft_worker) is EagleDraftWorker
    assert built == [sl.DetspecEagleDraftWorker, EagleDraftWorker]
    assert isinstance(detspec, EAGLEWorkerV2)
    # The target model runner now samples with the token-id-keyed DETSPEC sampler (the builtin worker built
    # after it shares the target worker here; a real server has one of the two).
    assert isinstance(target.model_runner.sampler, detspec_sampler_class())


def test_capture_builds_the_detspec_draft_graph_runner():
    """_capture_cuda_graphs (skipped on CPU) resolves the runner class to ours, only ours."""
    from sglang.srt.speculative import eagle_worker_v2

    rebound = sl._upstream(eagle_worker_v2.EagleDraftWorker, "_capture_cuda_graphs")
    assert rebound.__code__ is eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs.__code__
    assert rebound.__globals__["EAGLEDraftCudaGraphRunner"] is sl.DetspecEAGLEDraftCudaGraphRunner
    # The draft-extend runner keeps upstream's class (it returns logits only).
    assert (
        rebound.__globals__["EAGLEDraftExtendCudaGraphRunner"]
        is eagle_worker_v2.EAGLEDraftExtendCudaGraphRunner
    )
    assert eagle_worker_v2.EAGLEDraftCudaGraphRunner is not sl.DetspecEAGLEDraftCudaGraphRunner
    assert issubclass(sl.DetspecEAGLEDraftCudaGraphRunner, eagle_worker_v2.EAGLEDraftCudaGraphRunner)


def test_simulated_acceptance_is_refused_under_deterministic_mode(monkeypatch):
    from sglang.srt.speculative import spec_utils

    monkeypatch.setattr(spec_utils, "SIMULATE_ACC_LEN", 3.0)
    with published(), pytest.raises(ValueError, match="SGLANG_SIMULATE_ACC_LEN"):
        sl.DetspecEAGLEWorkerV2(server_args=None, gpu_id=0, nccl_port=0, target_worker=None)
