"""Multi-layer EAGLE single-CG draft-extend runner (row 7): its in-graph sampler is seeded.

Drives the DETSPEC single-CG composite's real upstream ``_allocate_buffers`` and
``prepare`` (0.5.17 or 0.5.23) and each step runner's ``_sample_draft_proposal``
on the prepared buffers (what a replay runs), without a capture: per-request
seed and top-k buffers exist before capture and are refreshed before every
replay, q is the strided ``draft_probs`` slot itself, padded rows do not reach
real ones, and the eager fallback draws the same tokens as the graph.
test_multi_layer_single_cg.py runs the whole worker -> runner -> "graph" path.
"""

from __future__ import annotations

import pytest
import torch

import sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner as mlr

from multi_layer_fakes import (  # noqa: F401  (spy: a pytest fixture)
    NUM_DRAFT_TOKENS,
    NUM_STEPS,
    VOCAB,
    NoGraph,
    assert_greedy_rows_propose_argmax,
    decode_inputs,
    draft_extend_forward_batch,
    make_draft_worker,
    make_sampling_info,
    make_single_cg_runner,
    patch_prepare_for_draft_extend,
    replay_steps,
    spy,
    step_logits,
)


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
        for layer_logits in logits:
            layer_logits[3] = torch.randn(VOCAB, generator=torch.Generator().manual_seed(pad_seed)) * 9
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

    worker = make_draft_worker([layer_logits[:3] for layer_logits in logits], cuda_graph_runner=NoGraph())
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
