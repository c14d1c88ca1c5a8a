"""The lean stage 1 experiment (scripts/experiments/stage1_lean.py) returns the reference's tokens.

It shares the product's float64 scoring and stage 2; what it changes is how stage 1 computes its float32
scores and finds its candidates (switches in the module docstring), so every switch combination is checked
on the chunk kinds that take different branches: ordinary and partial chunks, near ties in one chunk (the
multi-candidate branch, which re-reads and re-hashes), all-zero, low, NaN/inf and greedy rows.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "experiments"))

import stage1_lean  # noqa: E402
from sglang_detspec import reference  # noqa: E402
from test_kernel_seeded_draft_sample import DEV, _inputs, _plant_near_tie, _ref  # noqa: E402

SWITCHES = [
    dict(mul_shift=False, kb1=False, cand=0, sel_lg=False),
    dict(mul_shift=True, kb1=True, cand=1, sel_lg=True),
    dict(mul_shift=True, kb1=True, cand=1, sel_lg=False),
]


def _check_lean(probs, seeds, pos, step, greedy=None, **kw):
    p_k, i_k = stage1_lean.launch_lean(probs, seeds, pos, step, greedy, **kw)
    p_r, i_r = _ref(probs, seeds, pos, step, greedy)
    assert torch.equal(i_k.cpu(), i_r), (i_k.flatten().tolist(), i_r.flatten().tolist())
    assert torch.equal(p_k.cpu(), p_r) or torch.equal(torch.isnan(p_k.cpu()), torch.isnan(p_r))
    return i_k


@pytest.mark.parametrize("sw", SWITCHES, ids=lambda d: "-".join(f"{k}{int(v)}" for k, v in d.items()))
def test_lean_matches_reference(sw):
    probs, seeds, pos = _inputs(4, 2500, seed=51)  # partial last chunk
    _check_lean(probs, seeds, pos, 3, block=1024, **sw)
    probs, seeds, pos = _inputs(3, 2048, seed=52, kind="topk")  # all-zero chunks
    greedy = torch.tensor([False, True, False], device=DEV)
    _check_lean(probs, seeds, pos, 1, greedy, block=1024, **sw)
    probs, seeds, pos = _inputs(3, 1537, seed=53, kind="flat")  # many equal p
    _check_lean(probs, seeds, pos, 6, block=512, **sw)


@pytest.mark.parametrize("sw", SWITCHES[1:], ids=lambda d: "-".join(f"{k}{int(v)}" for k, v in d.items()))
def test_lean_near_ties_and_degenerate_rows(sw):
    V = 2048
    probs, seeds, pos = _inputs(4, V, seed=54)
    probs.mul_(1e-6)
    sc = reference.draft_scores(torch.ones(4, V), seeds.cpu(), pos.cpu(), 0)
    for r, (i, j) in enumerate([(10, 11), (300, 301), (7, 200), (1000, 1003)]):  # same 1024-column chunk
        _plant_near_tie(probs, sc, r, i, j)
    _check_lean(probs, seeds, pos, 0, block=1024, **sw)
    V = 3000
    probs, seeds, pos = _inputs(6, V, seed=55)
    probs[0].zero_()
    probs[1, 1700] = float("nan")
    probs[2] = torch.rand(V).to(DEV) * 1e-30
    probs[3, 1234] = float("inf")
    probs[4] = -torch.rand(V).to(DEV)
    probs[5].zero_()
    probs[5, 2999] = 1e-40
    _check_lean(probs, seeds, pos, 2, block=1024, **sw)
