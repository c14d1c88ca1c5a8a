"""Reduced-vocabulary drafts (stream/hot_vocab.py): the map, the contract, and the draw keyed by TARGET id.

The expected tokens come from the full-vocabulary reference (``reference.seeded_draft_sample``, itself checked
against SGLang's own hash kernel in test_reference.py) run on the scattered q -- never from the code under test.
"""

import pytest
import torch

from sglang_detspec.stream import reference
from sglang_detspec.stream.draft_contract import check_hot_draft_inputs
from sglang_detspec.stream.hot_vocab import (
    NOT_HOT,
    HotVocab,
    scatter_to_target,
    seeded_hot_draft_sample,
)


def hot_case(B, Vd, Vt, seed=0, *, sorted_map=False, temp=1.0):
    """Random reduced q ``[B, Vd]``, a random (unsorted unless asked) hot map into ``Vt``, seeds and positions."""
    g = torch.Generator().manual_seed(seed)
    hot = torch.randperm(Vt, generator=g)[:Vd]
    if sorted_map:
        hot = hot.sort().values
    q = torch.softmax(torch.randn(B, Vd, generator=g) * 3.0 / temp, -1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
    pos = torch.randint(0, 2**40, (B,), generator=g)
    return q, hot, seeds, pos


def full_draw(q, hot, Vt, seeds, pos, step, greedy=None):
    """The full-vocabulary draw of the scattered q: (q(x), target id x)."""
    return reference.seeded_draft_sample(scatter_to_target(q, hot, Vt), seeds, pos, step, greedy=greedy)


@pytest.mark.parametrize("B,Vd,Vt,step,sorted_map", [
    (64, 37, 101, 0, False),
    (64, 37, 101, 3, True),
    (32, 250, 1000, 1, False),
    (16, 1000, 1000, 2, False),  # a permutation of the whole vocabulary: H is everything
])
def test_reduced_draw_equals_full_draw_of_the_scattered_q(B, Vd, Vt, step, sorted_map):
    q, hot, seeds, pos = hot_case(B, Vd, Vt, seed=Vd + step, sorted_map=sorted_map)
    draw = seeded_hot_draft_sample(q, seeds, pos, step, hot, Vt)
    want_p, want_tok = full_draw(q, hot, Vt, seeds, pos, step)
    assert draw.token.shape == (B, 1) and draw.token.dtype == torch.int64
    assert torch.equal(draw.token, want_tok)
    assert torch.equal(draw.prob, want_p)
    assert torch.equal(hot[draw.draft_index], draw.token)
    assert torch.equal(q.gather(1, draw.draft_index), draw.prob)


def test_keying_by_draft_index_is_a_different_stream():
    """Control: racing the reduced q under its DRAFT ids (the full sampler on [B, Vd], then mapping) is not the
    stream -- the equivalence test above would catch a kernel keyed that way."""
    B, Vd, Vt = 200, 40, 160
    q, hot, seeds, pos = hot_case(B, Vd, Vt, seed=5)
    _, by_draft_id = reference.seeded_draft_sample(q, seeds, pos, 0)
    _, want = full_draw(q, hot, Vt, seeds, pos, 0)
    assert (hot[by_draft_id] != want).float().mean() > 0.3


def test_greedy_rows_and_ties_go_to_the_lowest_target_id():
    B, Vd, Vt = 8, 6, 20
    hot = torch.tensor([17, 3, 11, 0, 9, 5])  # draft order != target order
    q = torch.full((B, Vd), 1.0 / Vd)  # every greedy row is a six-way tie
    q[4:, 2] = 0.5  # rows 4.. have a unique mode (target 11)
    q[4:] /= q[4:].sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
    pos = torch.arange(B)
    greedy = torch.tensor([True, False] * 4)
    draw = seeded_hot_draft_sample(q, seeds, pos, 1, hot, Vt, greedy=greedy)
    _, want = full_draw(q, hot, Vt, seeds, pos, 1, greedy=greedy)
    assert torch.equal(draw.token, want)
    assert draw.token[0].item() == 0 and draw.token[4].item() == 11


def test_nan_rows_return_the_first_nan_by_target_id():
    B, Vd, Vt = 4, 8, 30
    q, hot, seeds, pos = hot_case(B, Vd, Vt, seed=9)
    q[1, [2, 6]] = float("nan")
    q[3, :] = float("nan")
    draw = seeded_hot_draft_sample(q, seeds, pos, 0, hot, Vt)
    _, want = full_draw(q, hot, Vt, seeds, pos, 0)
    assert torch.equal(draw.token, want)
    assert draw.token[1].item() == min(hot[2].item(), hot[6].item())


def test_hot_vocab_from_d2t_and_its_inverse():
    hot = torch.tensor([2, 5, 6, 9])
    d2t = hot - torch.arange(4)  # what an EAGLE3 checkpoint stores
    hv = HotVocab.from_d2t(d2t, 12)
    assert torch.equal(hv.hot_to_target, hot) and hv.draft_vocab_size == 4 and hv.target_vocab_size == 12
    want = torch.full((12,), NOT_HOT, dtype=torch.int32)
    want[hot] = torch.arange(4, dtype=torch.int32)
    assert torch.equal(hv.target_to_draft, want)
    assert torch.equal(HotVocab.from_hot_token_id(hot.to(torch.int32), 12).hot_to_target, hot)


@pytest.mark.parametrize("ids,vt,match", [
    ([0, 3, 3], 8, "repeats a target id"),
    ([0, 8], 8, "outside the target vocabulary"),
    ([-1, 2], 8, "outside the target vocabulary"),
    ([0.0, 1.0], 8, "integer target ids"),
    ([], 8, "non-empty"),
])
def test_hot_vocab_refuses_a_map_that_is_not_a_set_of_target_ids(ids, vt, match):
    with pytest.raises(ValueError, match=match):
        HotVocab.from_hot_token_id(torch.tensor(ids), vt)


def test_contract_checks_shapes_against_the_target_vocabulary():
    q, hot, seeds, pos = hot_case(2, 10, 50)
    with pytest.raises(ValueError, match="10 entries but the draft distribution has 9"):
        check_hot_draft_inputs(q[:, :9].contiguous(), seeds, pos, 0, None, hot, 50)
    with pytest.raises(ValueError, match="int64"):
        check_hot_draft_inputs(q, seeds, pos, 0, None, hot.to(torch.int32), 50)
    with pytest.raises(ValueError, match="cannot map into"):
        check_hot_draft_inputs(q, seeds, pos, 0, None, hot, 5)
    # the column word is draft_step * V_target + id: the step bound is the TARGET vocabulary's
    largest = (2**32) // 50 - 1
    check_hot_draft_inputs(q, seeds, pos, largest, None, hot, 50)
    with pytest.raises(ValueError, match="uint32 hash-key range"):
        check_hot_draft_inputs(q, seeds, pos, largest + 1, None, hot, 50)
