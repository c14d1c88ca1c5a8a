"""DETSPEC's draft-decode CUDA-graph runner replays the eager draft-decode proposals.

``DetspecEAGLEDraftCudaGraphRunner`` runs the installed SGLang's real
``capture_one_shape`` / ``execute`` (0.5.17 or 0.5.23) on CPU with a backend
whose "replay" re-runs the captured closure over the same persistent buffers a
real graph reads (single_layer_fakes.RerunBackend). Two batch sizes are
captured; a padded batch and a second batch with other seeds must reproduce an
eager ``draft_forward`` of the same batch: same draft chain, same q for verify,
same keys for the real rows. tests/gpu/test_draft_graph_replay.py does the same
with real CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch

from single_layer_fakes import (  # noqa: F401  (spy, eager_torch_compile: pytest fixtures)
    TOP_K_ALL,
    decode_forward_batch,
    eager_torch_compile,
    make_runner,
    make_worker,
    published,
    replay_batch,
    sampling_info,
    spy,
)


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
