"""seeded_draft_proposal: device dispatch, greedy override, input validation.

No SGLang needed: the proposal entry point imports only torch and (lazily) the
project's reference / kernel.
"""

from __future__ import annotations

import pytest
import torch

from sglang_detspec.integration.sampling import proposal
from sglang_detspec.stream import reference

TOP_K_ALL = 1 << 30


def _inputs(bs=5, vocab=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, vocab, generator=g) * 2
    probs = torch.softmax(logits, dim=-1)
    seeds = torch.randint(-(2**62), 2**62, (bs,), generator=g, dtype=torch.int64)
    positions = torch.randint(0, 2**31, (bs,), generator=g, dtype=torch.int64)
    return probs, seeds, positions


def test_cpu_tensors_use_the_reference(monkeypatch):
    probs, seeds, positions = _inputs()
    seen = []
    real = reference.seeded_draft_sample

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(reference, "seeded_draft_sample", spy)
    p, idx = proposal.seeded_draft_proposal(probs, seeds, positions, 3)
    assert len(seen) == 1
    args, kwargs = seen[0]
    assert args[3] == 3 and kwargs["greedy"] is None
    want_p, want_idx = real(probs, seeds, positions, 3)
    assert torch.equal(idx, want_idx)
    assert torch.equal(p, want_p)
    assert idx.dtype == torch.int64 and idx.shape == (5, 1) and p.shape == (5, 1)


def test_key_changes_the_draw():
    """Seed, position and draft step are all part of the key."""
    probs, seeds, positions = _inputs(bs=64, vocab=4096, seed=1)
    probs = torch.full_like(probs, 1.0 / probs.shape[1])  # uniform: every token equally likely
    base = proposal.seeded_draft_proposal(probs, seeds, positions, 1)[1]
    for variant in (
        proposal.seeded_draft_proposal(probs, seeds + 1, positions, 1)[1],
        proposal.seeded_draft_proposal(probs, seeds, positions + 1, 1)[1],
        proposal.seeded_draft_proposal(probs, seeds, positions, 2)[1],
    ):
        # 64 uniform draws over 4096 tokens: all equal by chance has prob ~0.
        assert (variant != base).sum() > 32


def test_greedy_rows_propose_the_argmax_others_are_unchanged():
    probs, seeds, positions = _inputs(bs=6, vocab=257, seed=2)
    top_ks = torch.tensor([TOP_K_ALL, 1, 50, 0, 1, 2], dtype=torch.int32)
    p, idx = proposal.seeded_draft_proposal(probs, seeds, positions, 0, top_ks=top_ks)
    sampled_p, sampled_idx = reference.seeded_draft_sample(probs, seeds, positions, 0)
    greedy = top_ks <= 1
    assert torch.equal(idx[greedy, 0], probs.argmax(dim=-1)[greedy])
    assert torch.equal(idx[~greedy], sampled_idx[~greedy])
    # topk_p is q(X) of the proposed token, greedy or not (verify's accept test).
    assert torch.equal(p, probs.gather(1, idx))


def test_graph_sized_top_ks_buffer_is_sliced_to_the_batch():
    probs, seeds, positions = _inputs(bs=3, vocab=100, seed=3)
    buf = torch.tensor([1, TOP_K_ALL, 1, 1, 1, 1, 1, 1], dtype=torch.int32)  # max_bs = 8
    _, idx = proposal.seeded_draft_proposal(probs, seeds, positions, 1, top_ks=buf)
    _, want = proposal.seeded_draft_proposal(probs, seeds, positions, 1, top_ks=buf[:3].clone())
    assert torch.equal(idx, want)
    assert idx[0, 0].item() == probs[0].argmax().item()
    assert idx[2, 0].item() == probs[2].argmax().item()


def test_strided_row_view_of_probs():
    """Multi-layer graph buffers hand draft_probs[:bs, step] (row stride S*V)."""
    probs, seeds, positions = _inputs(bs=4, vocab=128, seed=4)
    stacked = torch.stack([torch.roll(probs, 1, dims=1), probs, probs.flip(1)], dim=1)
    view = stacked[:, 1]
    assert not view.is_contiguous()
    assert torch.equal(
        proposal.seeded_draft_proposal(view, seeds, positions, 2)[1],
        proposal.seeded_draft_proposal(probs, seeds, positions, 2)[1],
    )


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(probs=torch.ones(3)), "probs must be"),
        (dict(seeds=torch.zeros(2, dtype=torch.int64)), "one entry per probs row"),
        (dict(positions=torch.zeros(4, dtype=torch.int64)), "one entry per probs row"),
        (dict(seeds=None), "needs sampling_seed"),
        (dict(top_ks=torch.ones(2, dtype=torch.int32)), "top_ks must be"),
    ],
)
def test_invalid_inputs_raise_actionable_errors(bad, match):
    probs, seeds, positions = _inputs(bs=3, vocab=10)
    args = dict(probs=probs, seeds=seeds, positions=positions, top_ks=None)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        proposal.seeded_draft_proposal(
            args["probs"], args["seeds"], args["positions"], 0, top_ks=args["top_ks"]
        )


@pytest.mark.gpu  # tests/conftest.py skips it without a GPU
def test_cuda_tensors_use_the_kernel_and_match_the_reference(monkeypatch):
    from sglang_detspec import kernels

    probs, seeds, positions = _inputs(bs=33, vocab=32000, seed=5)
    top_ks = torch.tensor([1 if i % 5 == 0 else TOP_K_ALL for i in range(33)], dtype=torch.int32)
    seen = []
    real = kernels.seeded_draft_sample
    monkeypatch.setattr(kernels, "seeded_draft_sample", lambda *a, **k: seen.append(1) or real(*a, **k))
    p, idx = proposal.seeded_draft_proposal(
        probs.cuda(), seeds.cuda(), positions.cuda(), 2, top_ks=top_ks.cuda()
    )
    assert seen == [1]
    want_p, want_idx = proposal.seeded_draft_proposal(probs, seeds, positions, 2, top_ks=top_ks)
    assert torch.equal(idx.cpu(), want_idx)
    assert torch.equal(p.cpu(), want_p)


def test_half_precision_q_draws_like_its_exact_float32_upcast():
    probs, seeds, positions = _inputs(bs=4, vocab=200, seed=6)
    q16 = probs.to(torch.bfloat16)
    p, idx = proposal.seeded_draft_proposal(q16, seeds, positions, 1)
    _, want = reference.seeded_draft_sample(q16.float(), seeds, positions, 1)
    assert torch.equal(idx, want)
    assert p.dtype == torch.bfloat16 and torch.equal(p, q16.gather(1, idx))
