"""The loop-over-chunks stage 1 experiment (scripts/experiments/stage1_loop.py) returns the reference's tokens.

It shares the product's per-chunk code and stage 2, so this guards the loop bookkeeping (chunk -> row and
column, programs walking several chunks, the always-masked last chunk) before its GPU timing decides whether
it replaces the one-chunk-per-program stage 1.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "experiments"))

import stage1_loop  # noqa: E402
from test_kernel_seeded_draft_sample import DEV, _inputs, _ref  # noqa: E402


def _check_loop(probs, seeds, pos, step, greedy=None, **kw):
    p_k, i_k = stage1_loop.launch_loop(probs, seeds, pos, step, greedy, **kw)
    p_r, i_r = _ref(probs, seeds, pos, step, greedy)
    assert torch.equal(i_k.cpu(), i_r), (i_k.flatten().tolist(), i_r.flatten().tolist())
    assert torch.equal(p_k.cpu(), p_r) or torch.equal(torch.isnan(p_k.cpu()), torch.isnan(p_r))


def test_loop_matches_reference_across_rows_and_chunks():
    # 4 rows x 3 chunks (partial last one) walked by 3 programs: chunks of different rows in one program
    probs, seeds, pos = _inputs(4, 2500, seed=41)
    _check_loop(probs, seeds, pos, 3, block=1024)
    probs, seeds, pos = _inputs(5, 2048, seed=42, kind="topk")  # all-zero chunks
    greedy = torch.tensor([False, True, False, False, True], device=DEV)
    _check_loop(probs, seeds, pos, 1, greedy, block=1024)


def test_loop_degenerate_rows():
    V = 3000
    probs, seeds, pos = _inputs(6, V, seed=43)
    probs[0].zero_()
    probs[1, 1700] = float("nan")
    probs[2] = torch.rand(V).to(probs.device) * 1e-30
    probs[3, 1234] = float("inf")
    probs[4] = -torch.rand(V).to(probs.device)
    _check_loop(probs, seeds, pos, 2, block=1024)
