"""Multi-layer EAGLE (MTP) under the coupled scheme (``DETSPEC_*_INVARIANT``): every MTP layer races its q with the
key of the verify row it will be compared with.

The coupled verify races the target at row ``j`` of a verify with SGLang's non-speculative key
``(seed, seq_lens + j, token id)`` (``coupled_verify.target_race_positions``). A draft is accepted when its proposal
equals the target's race there, so MTP layer ``k`` must propose ``argmax(log q_k + G(seed, base + k, t))`` where
``base`` is the seq_lens of the verify its drafts go to: the prompt length L after a prefill (the prefill's
``new_seq_lens`` is ``batch.seq_lens``), ``L + accept_lens`` after a verify (``run_eagle_verify``'s
``new_seq_lens``). Keyed like the rejection scheme instead (L + N for every layer) the tokens would stay right but
almost no draft would be accepted.

Each test drives the real upstream method bodies (0.5.17 or 0.5.23) through the DETSPEC subclasses with CPU fakes
(multi_layer_fakes.py) and checks every proposal against SGLang's own non-speculative seeded sampler
(``sampling_from_probs_torch`` -> ``multinomial_with_seed``, run eagerly on CPU) applied to the q the layer
produced, at the positions computed here from the inputs. The GPU path is tests/e2e/test_e2e_multi_layer.py's
invariant servers.
"""

from __future__ import annotations

import pytest
import torch

from sglang_detspec.integration.sampling import scheme

import sglang_verify_harness as harness
from multi_layer_fakes import (  # noqa: F401  (spy: a pytest fixture)
    NUM_DRAFT_TOKENS,
    NUM_STEPS,
    NoGraph,
    PerStepGraph,
    decode_inputs,
    draft_extend_forward_batch,
    make_draft_worker,
    make_sampling_info,
    make_single_cg_runner,
    patch_prepare_for_draft_extend,
    replay_steps,
    run_prefill,
    spy,
    step_logits,
)


@pytest.fixture
def coupled():
    with scheme.selected(scheme.COUPLED):
        yield


@pytest.fixture
def sglang_sample(monkeypatch):
    """``(q, seeds, positions) -> tokens`` by SGLang's non-speculative seeded sampler."""
    sampler_module, _ = harness.sglang_seeded_sampler(monkeypatch)

    def sample(q, seeds, positions):
        return sampler_module.sampling_from_probs_torch(
            q.clone(), sampling_seed=seeds.to(torch.int64), positions=positions.to(torch.int64)
        ).to(torch.int64).view(-1)

    return sample


def _assert_each_layer_is_sglangs_race(calls, seeds, bases, greedy_rows, sglang_sample):
    seeds_t = torch.tensor(seeds, dtype=torch.int64)
    rows = len(seeds)
    assert len(calls) == NUM_STEPS
    for k, c in enumerate(calls):
        expected_positions = [b + k for b in bases]
        assert c.positions[:rows].tolist() == expected_positions, (k, c.positions.tolist())
        q = c.probs[:rows].float()
        expected = sglang_sample(q, seeds_t, torch.tensor(expected_positions))
        for r in greedy_rows:
            expected[r] = int(torch.argmax(q[r]))
        assert c.topk_index[:rows, 0].tolist() == expected.tolist(), k
        torch.testing.assert_close(c.topk_p, c.probs.gather(1, c.topk_index), rtol=0, atol=0)


def test_prefill_layers_race_at_prompt_length_plus_layer(coupled, spy, sglang_sample, monkeypatch):
    prompt_lens = [7, 3, 11]
    seeds = [42, -(2**63), 2**62 + 12345]
    top_ks = [1 << 30, 1, 20]  # row 1 greedy
    info = make_sampling_info(seeds, [0.7, 1.0, 1.3], top_ks)
    worker = make_draft_worker(step_logits(3, seed=0))

    run_prefill(worker, prompt_lens, info, monkeypatch)

    _assert_each_layer_is_sglangs_race(spy, seeds, prompt_lens, [1], sglang_sample)


@pytest.mark.parametrize("path", ["eager", "per_step_graphs"])
def test_decode_layers_race_at_the_next_verify_rows(coupled, spy, sglang_sample, monkeypatch, path):
    seq_lens = [20, 9, 33]
    accept_lens = [1, 4, 2]  # with the bonus token, as run_eagle_verify returns them
    seeds = [7, 8, 2**63 - 1]
    top_ks = [1, 1 << 30, 5]  # row 0 greedy
    info = make_sampling_info(seeds, [1.0, 0.5, 2.0], top_ks)
    logits = step_logits(3, seed=2)
    graph = NoGraph() if path == "eager" else PerStepGraph(logits)
    worker = make_draft_worker(logits, cuda_graph_runner=graph)
    patch_prepare_for_draft_extend(monkeypatch)
    batch, result = decode_inputs(seq_lens, accept_lens, info)

    worker._draft_extend_for_decode(batch, result)

    bases = [L + a for L, a in zip(seq_lens, accept_lens)]
    _assert_each_layer_is_sglangs_race(spy, seeds, bases, [0], sglang_sample)
    nxt = result.next_draft_input
    for k, c in enumerate(spy):
        assert torch.equal(nxt.topk_index[:, k : k + 1], c.topk_index)


def test_decode_without_new_seq_lens_refuses(coupled, spy, monkeypatch):
    info = make_sampling_info([3, 4], [0.8, 1.1], [1 << 30, 1 << 30])
    worker = make_draft_worker(step_logits(2, seed=5), cuda_graph_runner=NoGraph())
    patch_prepare_for_draft_extend(monkeypatch)
    batch, result = decode_inputs([12, 40], [2, 2], info)
    del result.new_seq_lens
    with pytest.raises(RuntimeError, match="new_seq_lens"):
        worker._draft_extend_for_decode(batch, result)
    assert spy == []


def test_single_graph_keys_from_its_buffers_and_matches_eager(coupled, spy, sglang_sample, monkeypatch):
    """Row 7 reads L + accept_lens + step from the graph's buffers (refreshed by prepare before each replay); padded
    rows do not matter, and the eager fallback proposes the same tokens."""
    seq_lens = [10, 300, 7]  # raw_bs 3 -> padded bucket 4
    accept_lens = [3, 1, 4]
    seeds = [5, -3, 2**40]
    top_ks = [1 << 30, 1, 8]  # row 1 greedy
    info = make_sampling_info(seeds, [0.6, 1.0, 1.7], top_ks)
    logits = step_logits(4, seed=6)
    composite = make_single_cg_runner(monkeypatch)

    composite.prepare(draft_extend_forward_batch(seq_lens, info, accept_lens))
    rets = replay_steps(composite, logits)

    bases = [L + a for L, a in zip(seq_lens, accept_lens)]
    _assert_each_layer_is_sglangs_race(spy, seeds, bases, [1], sglang_sample)
    graph_tokens = torch.cat([r.topk_index[:3] for r in rets], 1)

    spy.clear()
    worker = make_draft_worker([layer_logits[:3] for layer_logits in logits], cuda_graph_runner=NoGraph())
    patch_prepare_for_draft_extend(monkeypatch)
    batch, result = decode_inputs(seq_lens, accept_lens, info)
    worker._draft_extend_for_decode(batch, result)
    assert torch.equal(result.next_draft_input.topk_index, graph_tokens)


def test_rejection_scheme_keeps_upstreams_keys(spy, monkeypatch):
    """The same decode round under DETSPEC_EAGLE: every layer at L + N (sglang 0.5.23's key), whatever was accepted."""
    seq_lens = [20, 9]
    info = make_sampling_info([7, 8], [1.0, 0.5], [1 << 30, 1 << 30])
    worker = make_draft_worker(step_logits(2, seed=2), cuda_graph_runner=NoGraph())
    patch_prepare_for_draft_extend(monkeypatch)
    batch, result = decode_inputs(seq_lens, [1, 4], info)
    with scheme.selected(scheme.REJECTION):
        worker._draft_extend_for_decode(batch, result)
    assert [c.positions.tolist() for c in spy] == [[L + NUM_DRAFT_TOKENS for L in seq_lens]] * NUM_STEPS
