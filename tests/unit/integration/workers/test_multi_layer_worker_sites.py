"""Multi-layer EAGLE (MTP) worker-side draft sites (rows 4-6) route through seeded_draft_proposal.

Each test drives the real SGLang method of the installed version (0.5.17 or
0.5.23) -- ``MultiLayerEagleDraftWorker._draft_extend_for_prefill`` /
``_draft_extend_for_decode`` through the DETSPEC subclass -- with the smallest
CPU inputs; what needs a GPU is faked (multi_layer_fakes.py): the prefill
site, the decode site on the eager path and with per-step CUDA graphs (the
worker re-samples after each replay).

Expected keys come from the inputs the test builds (prompt lengths, seeds,
N = num_steps + 1), never from the code under test:
prefill (L, layer), decode (L + N, layer), as in sglang 0.5.23.
"""

from __future__ import annotations

import pytest
import torch

import sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner as mlr

from multi_layer_fakes import (  # noqa: F401  (spy, upstream_kwargs: pytest fixtures)
    NUM_DRAFT_TOKENS,
    NUM_STEPS,
    SGLANG_0523,
    VOCAB,
    NoGraph,
    PerStepGraph,
    assert_greedy_rows_propose_argmax,
    assert_keys,
    decode_inputs,
    make_draft_worker,
    make_sampling_info,
    patch_prepare_for_draft_extend,
    run_prefill,
    spy,
    step_logits,
    upstream_kwargs,
)

# --------------------------------------------------------------------------
# row 4: prefill, one proposal per MTP layer at position L
# --------------------------------------------------------------------------


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



# --------------------------------------------------------------------------
# rows 5 and 6: decode, position L + N
# --------------------------------------------------------------------------


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
