"""A reduced-vocabulary ("hot token") draft in the single-layer DETSPEC worker, on SGLang's real bodies (CPU).

The draft's logits cover ``VD`` hot tokens of the target's ``V``; ``hot_token_id`` maps draft index -> target id (an
unsorted map, so draft-index order and target-id order differ). Checked against what does not come from the code
under test: every draft token SGLang's own ``draft_forward`` body emits (it maps the proposal through
``hot_token_id``) must be the token the FULL-vocabulary seeded reference (``stream.reference.seeded_draft_sample``)
draws from the scattered q with the same key -- the equivalence the stream layer guarantees; the control without
the map (raced by draft index) must not; the draft-decode graph replay reproduces the eager chain; and
``alloc_memory_pool`` runs upstream's body past its vocabulary check only through DETSPEC's gate.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_detspec.integration.setup.refusals import DetspecConfigError
from sglang_detspec.integration.workers import single_layer as sl
from sglang_detspec.stream import reference
from sglang_detspec.stream.hot_vocab import HotVocab, scatter_to_target

from single_layer_fakes import (  # noqa: F401  (spy, eager_torch_compile: pytest fixtures)
    HIDDEN,
    TOP_K_ALL,
    V,
    decode_forward_batch,
    eager_torch_compile,
    make_runner,
    make_worker,
    published,
    replay_batch,
    sampling_info,
    spy,
)

VD = 16
NUM_STEPS = 4
SEEDS = [5, 123456789012, -77]
TOP_KS = [TOP_K_ALL, 1, 20]
SEQ_LENS = [10, 33, 1000]
FIRST_DRAFT_INDEX = [3, 4, 5]


def _hot_map(seed=7):
    return torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:VD]


def _hot_worker(with_map=True):
    worker = make_worker(NUM_STEPS)
    hot = _hot_map()
    worker.hot_token_id = hot
    worker.draft_runner.table = torch.randn(V, VD, generator=torch.Generator().manual_seed(1)) * 3
    worker.detspec_hot_vocab = HotVocab.from_hot_token_id(hot, V) if with_map else None
    return worker, hot


def _hot_forward_batch(si, builder=decode_forward_batch, **kwargs):
    """A decode batch whose spec_info carries the draft-extend proposal as a DRAFT index and a ``[B, VD]`` q."""
    fb = builder(si, SEQ_LENS, first_tokens=FIRST_DRAFT_INDEX, num_steps=NUM_STEPS, **kwargs)
    q0 = torch.full((len(SEQ_LENS), VD), 1.0 / VD)
    fb.spec_info.draft_probs = q0
    fb.spec_info.topk_p = q0.gather(1, fb.spec_info.topk_index)
    return fb


def _full_vocab_tokens(draft_probs, hot, si):
    """Draft step i's token by the full-vocabulary reference on the scattered q, with 0.5.23's key."""
    greedy = si.top_ks <= 1
    tokens = []
    for i in range(1, NUM_STEPS):
        full_q = scatter_to_target(draft_probs[:, i], hot, V)
        positions = torch.tensor([s + i for s in SEQ_LENS])
        _, idx = reference.seeded_draft_sample(full_q, si.sampling_seed, positions, i, greedy=greedy)
        tokens.append(idx.view(-1))
    return torch.stack(tokens, dim=1)


def test_hot_draft_forward_proposes_what_the_full_draft_of_scattered_q_proposes(spy):
    with published(speculative_num_steps=NUM_STEPS, speculative_num_draft_tokens=NUM_STEPS + 1):
        worker, hot = _hot_worker()
        si = sampling_info(SEEDS, TOP_KS, temperatures=[0.7, 1.0, 1.3])
        _, _, draft_tokens, draft_probs = worker.draft_forward(_hot_forward_batch(si))

    assert [c["hot_vocab"] for c in spy] == [worker.detspec_hot_vocab] * (NUM_STEPS - 1)
    assert draft_probs.shape == (3, NUM_STEPS, VD)  # the reduced q goes to verify, never a [B, S, V] scatter
    assert draft_tokens[:, 0].tolist() == hot[FIRST_DRAFT_INDEX].tolist()
    assert bool(torch.isin(draft_tokens, hot).all()), "a draft token outside the hot set"
    assert torch.equal(draft_tokens[:, 1:], _full_vocab_tokens(draft_probs, hot, si))
    # Each step's q is softmax(logits / T) of the target token the step consumed (the table is indexed by it).
    for i in range(1, NUM_STEPS):
        expect_q = torch.softmax(worker.draft_runner.table[draft_tokens[:, i - 1]] / si.temperatures, dim=-1)
        torch.testing.assert_close(draft_probs[:, i], expect_q, rtol=1e-5, atol=1e-6)


def test_control_without_the_map_races_by_draft_index_and_differs(spy):
    """The same draft with no HotVocab on the sites (raced by draft column index): the check above must fail."""
    with published(speculative_num_steps=NUM_STEPS, speculative_num_draft_tokens=NUM_STEPS + 1):
        worker, hot = _hot_worker(with_map=False)
        si = sampling_info(SEEDS, [TOP_K_ALL, TOP_K_ALL, TOP_K_ALL], temperatures=[1.0, 1.0, 1.0])
        _, _, draft_tokens, draft_probs = worker.draft_forward(_hot_forward_batch(si))
    assert not torch.equal(draft_tokens[:, 1:], _full_vocab_tokens(draft_probs, hot, si))


@pytest.mark.parametrize("raw_bs", [2, 3])  # 3 pads to the captured 4
def test_hot_draft_graph_replay_matches_eager(spy, raw_bs):
    seeds, top_ks, seq_lens = SEEDS[:raw_bs], TOP_KS[:raw_bs], SEQ_LENS[:raw_bs]
    temps = [0.8, 1.0, 1.7][:raw_bs]

    def batch(builder):
        fb = builder(sampling_info(seeds, top_ks, temps), seq_lens, FIRST_DRAFT_INDEX[:raw_bs], NUM_STEPS)
        q0 = torch.full((raw_bs, VD), 1.0 / VD)
        fb.spec_info.draft_probs = q0
        fb.spec_info.topk_p = q0.gather(1, fb.spec_info.topk_index)
        return fb

    with published(speculative_num_steps=NUM_STEPS, speculative_num_draft_tokens=NUM_STEPS + 1):
        worker, hot = _hot_worker()
        runner = make_runner(worker, capture_bs=[2, 4], num_steps=NUM_STEPS, draft_vocab=VD)
        spy.clear()
        eager = worker.draft_forward(batch(decode_forward_batch))
        spy.clear()
        runner.buffers.positions.fill_(123456)  # the padded row's inputs must not reach real rows
        graph = runner.execute(batch(replay_batch))
    assert all(c["hot_vocab"] is worker.detspec_hot_vocab for c in spy) and len(spy) == NUM_STEPS - 1
    assert torch.equal(graph[2], eager[2]) and torch.equal(graph[3], eager[3])
    assert graph[3].shape == (raw_bs, NUM_STEPS, VD)
    assert bool(torch.isin(graph[2], hot).all())


# ---------------------------------------------------------------------------
# Worker start: upstream's alloc_memory_pool body, then DETSPEC's gate
# ---------------------------------------------------------------------------


def _pool_worker(hot, algorithm):
    """A draft worker whose upstream ``alloc_memory_pool`` body runs for real up to the draft model's own objects."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    w = object.__new__(sl.DetspecEagleDraftWorker)
    w.speculative_algorithm = SpeculativeAlgorithm.from_string(algorithm)
    w.draft_worker = SimpleNamespace(alloc_memory_pool=lambda **kwargs: None)
    embed, head = torch.zeros(V, HIDDEN), torch.zeros(V, HIDDEN)
    w.target_worker = SimpleNamespace(
        model_config=SimpleNamespace(vocab_size=V),
        model_runner=SimpleNamespace(model=SimpleNamespace(get_embed_and_head=lambda: (embed, head), lm_head=None)),
    )
    w._resolve_shared_embed_and_head = lambda: (embed, head)  # 0.5.23 resolves them through the model loader
    w.draft_runner = SimpleNamespace(
        model=SimpleNamespace(hot_token_id=hot, set_embed=lambda e: None, load_lm_head_from_target=False)
    )
    return w


def _no_warnings(caplog) -> bool:
    return not [r for r in caplog.records if r.levelname == "WARNING"]


def test_worker_start_serves_a_reduced_eagle3_draft(monkeypatch, caplog):
    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    hot = _hot_map()
    with published(speculative_algorithm="EAGLE3"):
        w = _pool_worker(hot, "EAGLE3")
        with caplog.at_level("INFO"):
            w.alloc_memory_pool()
    assert f"DETSPEC_EAGLE3: serving a reduced-vocabulary draft ({VD} of {V} target tokens)" in caplog.text
    assert _no_warnings(caplog)
    assert torch.equal(w.detspec_hot_vocab.hot_to_target, hot)
    assert w.detspec_hot_vocab.target_vocab_size == V
    assert int(w.detspec_hot_vocab.target_to_draft[int(hot[5])]) == 5


def test_upstream_alloc_memory_pool_refuses_the_reduced_draft_itself(monkeypatch):
    """Control: upstream's own body (no DETSPEC get_spec) raises its vocabulary check on the same worker."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    with published(speculative_algorithm="EAGLE3"):
        w = _pool_worker(_hot_map(), "EAGLE3")
        with pytest.raises(ValueError, match="share one vocab"):
            EagleDraftWorker.alloc_memory_pool(w)


def test_worker_start_without_a_hot_map_builds_nothing(monkeypatch):
    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    with published(speculative_algorithm="EAGLE3"):
        w = _pool_worker(None, "EAGLE3")
        w.alloc_memory_pool()
    assert w.detspec_hot_vocab is None


def _token_map_worker(tmp_path, hot):
    """An EAGLE draft worker whose upstream body loads ``--speculative-token-map`` from a file and slices the shared
    LM head to it (init_token_map / init_lm_head run for real)."""
    path = tmp_path / "hot_tokens.pt"
    torch.save(hot.tolist(), path)
    w = _pool_worker(None, "EAGLE")
    heads = {}
    w.draft_runner = SimpleNamespace(model=SimpleNamespace(set_embed_and_head=lambda e, h: heads.update(head=h)))
    return w, str(path), heads


def test_an_eagle_token_map_takes_the_reduced_vocabulary_path(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    hot = _hot_map()
    w, path, heads = _token_map_worker(tmp_path, hot)
    with published(speculative_algorithm="EAGLE", speculative_token_map=path):
        with caplog.at_level("INFO"):
            w.alloc_memory_pool()
    assert f"DETSPEC_EAGLE: serving a reduced-vocabulary draft ({VD} of {V} target tokens)" in caplog.text
    assert "--speculative-token-map" in caplog.text and _no_warnings(caplog)
    assert torch.equal(w.detspec_hot_vocab.hot_to_target, hot)  # the file's ids, in the file's order
    assert int(w.detspec_hot_vocab.target_to_draft[int(hot[3])]) == 3
    assert heads["head"].shape == (VD, HIDDEN)  # upstream sliced the draft's LM head to the hot ids


def test_the_invariant_mode_refuses_a_token_map_at_worker_start(monkeypatch, tmp_path):
    """The launcher refuses it first; the worker's own gate refuses it too (its race was never run on a GPU)."""
    from sglang_detspec.integration.sampling import scheme

    w, path, _heads = _token_map_worker(tmp_path, _hot_map())
    with published(speculative_algorithm="EAGLE", speculative_token_map=path), scheme.selected(scheme.COUPLED):
        with pytest.raises(DetspecConfigError, match="DETSPEC_EAGLE_INVARIANT.*never run on a GPU"):
            w.alloc_memory_pool()


def test_invariant_mode_serves_a_reduced_eagle3_draft(monkeypatch, caplog):
    from sglang_detspec.integration.sampling import scheme

    monkeypatch.delenv("SGLANG_DETSPEC_REDUCED_VOCAB", raising=False)
    hot = _hot_map()
    with published(speculative_algorithm="EAGLE3"), scheme.selected(scheme.COUPLED):
        w = _pool_worker(hot, "EAGLE3")
        with caplog.at_level("INFO"):
            w.alloc_memory_pool()
    assert f"DETSPEC_EAGLE3_INVARIANT: serving a reduced-vocabulary draft ({VD} of {V} target tokens)" in caplog.text
    assert _no_warnings(caplog)
    assert torch.equal(w.detspec_hot_vocab.hot_to_target, hot)
