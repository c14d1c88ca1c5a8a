"""The reduced-vocabulary Triton sampler vs its pure-torch twin, and vs the full sampler on the scattered q.

CPU: the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py); shapes stay small.  The expected draws come
from ``stream.hot_vocab.seeded_hot_draft_sample`` (itself equal to the full-vocabulary reference on the scattered
q, tests/unit/stream/test_hot_vocab.py) and from the full Triton sampler.
"""

import pytest
import torch

from sglang_detspec.kernels.seeded_draft_sample import seeded_draft_sample as full_kernel
from sglang_detspec.kernels.seeded_hot_draft_sample import seeded_hot_draft_sample as hot_kernel
from sglang_detspec.stream.hot_vocab import scatter_to_target
from sglang_detspec.stream.hot_vocab import seeded_hot_draft_sample as hot_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(B, Vd, Vt, seed, kind):
    g = torch.Generator().manual_seed(seed)
    hot = torch.randperm(Vt, generator=g)[:Vd]
    logits = torch.randn(B, Vd, generator=g) * 3.0
    if kind == "topk":  # truncated draft: most columns exactly zero, all-zero chunks
        thr = logits.topk(min(5, Vd), -1).values[:, -1:]
        logits = logits.masked_fill(logits < thr, float("-inf"))
    q = torch.softmax(logits, -1)
    if kind == "flat":  # every p equal: many near-tie candidates per chunk
        q = torch.full((B, Vd), 1.0 / Vd)
    if kind == "odd":  # degenerate rows: NaN, +inf, negative, all-zero, tiny (below 2**-80 scores)
        q[0, 3] = float("nan")
        q[1, Vd - 2] = float("inf")
        q[2] = -q[2]
        q[3] = 0.0
        q[4] = q[4] * 2.0**-100
        q[5, : Vd // 2] = 0.0
    seeds = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
    pos = torch.randint(0, 2**40, (B,), generator=g)
    return q, hot, seeds, pos


def _check(q, hot, Vt, seeds, pos, step, greedy=None, **kw):
    got = hot_kernel(q.to(DEV), seeds.to(DEV), pos.to(DEV), step, hot.to(DEV), Vt,
                     greedy=None if greedy is None else greedy.to(DEV), **kw)
    want = hot_reference(q, seeds, pos, step, hot, Vt, greedy=greedy)
    assert got.token.dtype == torch.int64 and got.token.shape == (q.shape[0], 1)
    assert torch.equal(got.token.cpu(), want.token), (got.token.flatten().tolist(), want.token.flatten().tolist())
    assert torch.equal(got.draft_index.cpu(), want.draft_index)
    assert torch.equal(got.prob.cpu().isnan(), want.prob.isnan())
    assert torch.equal(got.prob.cpu().nan_to_num(), want.prob.nan_to_num())
    return got


@pytest.mark.parametrize("B,Vd,Vt,step,kind,block", [
    (4, 300, 1000, 0, "dense", 128),  # Vd not a multiple of the block: a partial last chunk
    (3, 1000, 1000, 2, "dense", None),  # a permutation of the whole vocabulary
    (5, 200, 5000, 1, "topk", 64),
    (3, 257, 600, 4, "flat", 128),
    (6, 130, 700, 0, "odd", 64),
])
def test_kernel_equals_reference(B, Vd, Vt, step, kind, block):
    q, hot, seeds, pos = _case(B, Vd, Vt, seed=Vd + step, kind=kind)
    _check(q, hot, Vt, seeds, pos, step, block_size=block)


def test_greedy_rows_in_a_sampled_batch():
    q, hot, seeds, pos = _case(6, 150, 400, seed=3, kind="dense")
    q[0] = 1.0 / 150  # a greedy tie: lowest target id wins
    greedy = torch.tensor([True, False, True, False, True, False])
    got = _check(q, hot, 400, seeds, pos, 1, greedy=greedy, block_size=64)
    assert got.token[0].item() == hot.min().item()


def test_column_word_at_the_top_of_the_uint32_range():
    """V = 2**30 and draft_step 3: columns up to 2**32 - 1 -- no [B, V] buffer could exist, neither is built."""
    Vt = 2**30
    g = torch.Generator().manual_seed(4)
    hot = torch.cat([torch.tensor([Vt - 1, 0]), torch.randint(1, Vt - 1, (62,), generator=g).unique()])
    q = torch.softmax(torch.randn(3, hot.numel(), generator=g), -1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (3,), generator=g)
    _check(q, hot, Vt, seeds, torch.arange(3), 3, block_size=32)


def test_equals_the_full_kernel_on_the_scattered_q():
    B, Vd, Vt = 6, 180, 640
    q, hot, seeds, pos = _case(B, Vd, Vt, seed=11, kind="dense")
    for step in (0, 2):
        got = hot_kernel(q.to(DEV), seeds.to(DEV), pos.to(DEV), step, hot.to(DEV), Vt, block_size=64)
        want_p, want_tok = full_kernel(scatter_to_target(q, hot, Vt).to(DEV), seeds.to(DEV), pos.to(DEV), step)
        assert torch.equal(got.token, want_tok)
        assert torch.equal(got.prob, want_p)


def test_row_view_and_empty_batch():
    q, hot, seeds, pos = _case(4, 100, 300, seed=2, kind="dense")
    stacked = torch.stack([q, q.flip(0)], dim=1)  # [B, 2, Vd]: draft_probs[:bs, step] is a strided row view
    _check(stacked[:, 1], hot, 300, seeds, pos, 1, block_size=32)
    empty = hot_kernel(q[:0].to(DEV), seeds[:0].to(DEV), pos[:0].to(DEV), 0, hot.to(DEV), 300)
    assert empty.token.shape == (0, 1)


def test_refuses_a_map_of_the_wrong_width():
    q, hot, seeds, pos = _case(2, 100, 300, seed=2, kind="dense")
    with pytest.raises(ValueError, match="hot_to_target has 99 entries"):
        hot_kernel(q.to(DEV), seeds.to(DEV), pos.to(DEV), 0, hot[:99].to(DEV), 300)
