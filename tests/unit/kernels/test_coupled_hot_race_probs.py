"""The reduced-vocabulary coupled race (kernels/coupled_hot_race_probs.py) vs its pure-torch twin
(``coupled_hot_race_reference`` in stream/coupled_reference.py), and vs the full-vocabulary kernel on the scattered q.

On CPU the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py), whose ``tl.log`` is numpy's: the twin is fed
``numpy.log(probs)`` there (``torch.log`` on a GPU), as in test_coupled_race.py.  Hot maps are random, unsorted
subsets of the target vocabulary, so draft-column order and target-id order disagree; exact ties (zero, ``+inf``
and NaN scores) are placed so that the lowest target id sits in a later column and chunk than another tied one.
"""

import numpy as np
import pytest
import torch

from sglang_detspec.kernels.coupled_hot_race_probs import coupled_hot_race_probs
from sglang_detspec.kernels.coupled_race_probs import coupled_race_probs
from sglang_detspec.stream.coupled_reference import coupled_hot_race_reference, position_with_hash
from sglang_detspec.stream.hot_vocab import scatter_to_target

DEV = "cuda" if torch.cuda.is_available() else "cpu"
VARIANTS = [(True, "divide"), (False, "reciprocal"), (True, "reciprocal"), (False, "divide")]


def _kernel_log(probs):
    """The float32 ``log`` the kernel takes: torch's on a GPU, numpy's under the interpreter."""
    if DEV == "cuda":
        return torch.log(probs)
    return torch.from_numpy(np.log(probs.numpy()))


def _case(R, Vd, Vt, seed, kind="dense"):
    g = torch.Generator().manual_seed(seed)
    hot = torch.randperm(Vt, generator=g)[:Vd]  # unsorted target ids
    logits = torch.randn(R, Vd, generator=g) * 3.0
    if kind == "truncated":  # top-k 5: whole chunks of zero probabilities beside a few live columns
        thr = logits.topk(min(5, Vd), -1).values[:, -1:]
        logits = logits.masked_fill(logits < thr, float("-inf"))
    probs = torch.softmax(logits, -1)
    if kind == "flat":  # every probability equal: only the noise decides, many near-tie candidates
        probs = torch.full((R, Vd), 1.0 / Vd)
    seeds = torch.randint(-(2**63), 2**63 - 1, (R,), generator=g)
    positions = torch.randint(0, 2**40, (R,), generator=g)
    return probs, hot, seeds, positions


def _check(probs, hot, seeds, positions, cap, uniform=None, block=None):
    got = coupled_hot_race_probs(probs.to(DEV), seeds.to(DEV), positions.to(DEV), hot.to(DEV), cap_unit_uniform=cap,
                                 uniform=uniform, block_size=block)
    want = coupled_hot_race_reference(_kernel_log(probs), seeds, positions, hot, cap_unit_uniform=cap,
                                      uniform=uniform)
    assert got.dtype == torch.int64 and got.shape == (probs.shape[0],)
    assert torch.equal(got.cpu(), want), (got.tolist(), want.tolist())
    return want


@pytest.mark.parametrize(
    "R,Vd,Vt,kind,block",
    [
        (4, 300, 1000, "dense", 64),  # five chunks, the last one ragged (44 columns)
        (3, 256, 700, "dense", 64),  # Vd a multiple of the block: no chunk masks its loads
        (4, 200, 5000, "truncated", 32),  # zero chunks beside live ones
        (3, 257, 600, "flat", 128),
        (3, 100, 100, "dense", None),  # a permutation of the whole target vocabulary, one chunk
        (2, 1, 50, "dense", None),  # Vd = 1
        (3, 17, 40, "dense", 16),  # the smallest block, two chunks
    ],
)
def test_kernel_matches_reference_over_shapes(R, Vd, Vt, kind, block):
    probs, hot, seeds, positions = _case(R, Vd, Vt, seed=R * 1000 + Vd, kind=kind)
    for cap, uniform in VARIANTS[:2] if Vd > 100 else VARIANTS:
        _check(probs, hot, seeds, positions, cap, uniform, block)


def test_equals_the_full_kernel_on_the_scattered_q():
    """Independent of the twin: with the capped noise every winner is finite, so the reduced race is the full
    race (kernels/coupled_race_probs.py) on q scattered into the target vocabulary, zeros off the hot set."""
    R, Vd, Vt = 6, 180, 640
    probs, hot, seeds, positions = _case(R, Vd, Vt, seed=11)
    got = coupled_hot_race_probs(probs.to(DEV), seeds.to(DEV), positions.to(DEV), hot.to(DEV), block_size=64)
    full = coupled_race_probs(scatter_to_target(probs, hot, Vt).to(DEV), seeds.to(DEV), positions.to(DEV),
                              block_size=128)
    assert torch.equal(got, full)


def _identity_rows(R, V, seed):
    """Rows of every kind the two kernels' paths tell apart (columns are their own target ids here): dense, zero
    chunks, flat (many near ties), and exact ties -- an all-zero row, +inf and NaN in two chunks, a NaN beside a
    negative probability, a value above the screen's limit, and a zero probability on hash 2**32 - 1 (uncapped:
    NaN) in a later chunk than a NaN."""
    probs, _, seeds, positions = _case(R, V, V, seed=seed)
    g = torch.Generator().manual_seed(seed)
    probs[1] = probs[1].masked_fill(probs[1] < probs[1].topk(3).values[-1], 0.0)  # zero chunks beside live ones
    probs[2] = 1.0 / V  # flat: only the noise decides
    a, b = 5, V - 7  # first and last chunk
    probs[3] = 0.0
    probs[4, a], probs[4, b] = float("inf"), float("inf")
    probs[5, b], probs[5, a] = float("nan"), float("nan")
    probs[6, b], probs[6, a + 1] = float("nan"), -0.5
    probs[7, a] = 2.0**20
    positions[8] = position_with_hash(int(seeds[8]), a, 0xFFFFFFFF)
    probs[8, a] = 0.0
    probs[8, b] = float("nan")
    probs[9:] = probs[9:] * torch.rand(R - 9, 1, generator=g)  # sub-stochastic rows: the race does not normalise
    return probs, seeds, positions


@pytest.mark.parametrize("V,block", [(300, 64), (256, 64), (70, None)])
def test_identity_map_gives_the_full_race_bit_for_bit(V, block):
    """``hot_to_target = arange(V)``: the keyed stages (kernels/coupled_race_probs.py, ``KEYED`` on) must reduce to
    the full race's own (``KEYED`` off) -- every tie rule by target id to its first-column rule -- on every path:
    lone candidates, near-tie rescoring, zero chunks, rescans, NaN and +inf ties, both clamps and both uniforms.
    Kernel against kernel, no twin; the control below shows the comparison can fail."""
    probs, seeds, positions = _identity_rows(12, V, seed=V)
    identity = torch.arange(V)
    args = (probs.to(DEV), seeds.to(DEV), positions.to(DEV))
    for cap, uniform in VARIANTS:
        full = coupled_race_probs(*args, cap_unit_uniform=cap, uniform=uniform, block_size=block)
        hot = coupled_hot_race_probs(*args, identity.to(DEV), cap_unit_uniform=cap, uniform=uniform,
                                     block_size=block)
        assert torch.equal(hot, full), (cap, uniform, hot.tolist(), full.tolist())
        # what the definition implies on the exact-tie rows, independently of either kernel
        assert full[3:8].tolist() == [0, 5, 5, 6, 5] and full[8] == (V - 7 if cap else 5)
    # control: another bijection of the same columns races other noise and breaks ties elsewhere
    reversed_map = identity.flip(0).contiguous().to(DEV)
    other = coupled_hot_race_probs(*args, reversed_map, block_size=block)
    assert (other != coupled_race_probs(*args, block_size=block)).sum() >= 6


def test_control_racing_by_column_index_is_another_race():
    """The tests above can fail: keying each hot column by its draft index (the full kernel on the reduced q, mapped
    to target ids afterwards) proposes other tokens on most rows."""
    R, Vd, Vt = 16, 96, 400
    probs, hot, seeds, positions = _case(R, Vd, Vt, seed=5)
    by_target = coupled_hot_race_probs(probs.to(DEV), seeds.to(DEV), positions.to(DEV), hot.to(DEV), block_size=32)
    by_column = hot.to(DEV)[coupled_race_probs(probs.to(DEV), seeds.to(DEV), positions.to(DEV), block_size=32)]
    assert (by_target != by_column).float().mean() > 0.3


def test_near_ties_across_chunks_and_inside_one():
    """Two columns whose float64 scores lie within 0 .. 1e-2 of each other (inside and outside the screen's margin),
    in one chunk or in two; every other column far below."""
    from sglang_detspec.stream.coupled_reference import coupled_gumbel_reference

    R, Vd, Vt, block = 12, 160, 900, 32
    probs, hot, seeds, positions = _case(R, Vd, Vt, seed=3)
    g = torch.Generator().manual_seed(4)
    deltas = [0.0, 1e-9, -1e-9, 1e-7, -1e-7, 1e-5, -1e-5, 1e-3, -1e-3, 3e-3, -6e-3, 1e-2]
    for cap in (True, False):
        gumbel = coupled_gumbel_reference(seeds, positions, 0, cap_unit_uniform=cap, token_ids=hot)
        logq = torch.full((R, Vd), -40.0)
        for r in range(R):
            i = int(torch.randint(0, Vd - 100, (1,), generator=g))
            j = i + (1 if r % 2 == 0 else 65)  # same chunk / two chunks later
            logq[r, i] = -1.0
            logq[r, j] = float(gumbel[r, i] - gumbel[r, j] - 1.0 + deltas[r])
        q = torch.exp(logq)
        want = _check(q, hot, seeds, positions, cap, block=block)
        scores = gumbel + _kernel_log(q).double()
        top2 = scores.topk(2, dim=1).values
        assert int(((top2[:, 0] - top2[:, 1]) < 2.0**-8).sum()) >= R * 2 // 3  # they are near ties
        assert set(want.tolist()) <= set(hot.tolist())


def _order(hot, block):
    """Two draft columns in different chunks whose target ids decrease: ``(early column, later column)``."""
    for a in range(block):
        for b in range(block, hot.numel()):
            if hot[b] < hot[a]:
                return a, b
    raise AssertionError("the map has no inversion across chunks")


def test_exact_ties_go_to_the_lowest_target_id_not_the_first_column():
    """Exact ties: an all-zero row (every score -inf), +inf in two chunks, NaN in two chunks (the lowest NaN target
    id wins even after a NaN chunk), a zero chunk beside a zero row remainder; with ``cap_unit_uniform=False`` a
    zero probability on hash 2**32 - 1 (Gumbel +inf: NaN) in a later chunk than another NaN."""
    R, Vd, Vt, block = 7, 150, 500, 32
    probs, hot, seeds, positions = _case(R, Vd, Vt, seed=21)
    a, b = _order(hot, block)  # hot[b] < hot[a], b in a later chunk
    lowest = int(hot.min())
    probs[0] = 0.0  # every score -inf: the lowest target id of the row
    probs[1, a], probs[1, b] = float("inf"), float("inf")
    probs[2, a], probs[2, b] = float("nan"), float("nan")
    probs[3, a], probs[3, b] = float("nan"), -0.5  # log(-0.5) is NaN too
    probs[4, :] = 0.0
    probs[4, Vd - 1] = -0.0  # -0.0: log -inf as well
    probs[5, a] = float("inf")
    probs[5, b] = 2.0**20  # above the screen's limit, finite: +inf still wins
    positions[6] = position_with_hash(int(seeds[6]), int(hot[b]), 0xFFFFFFFF)
    probs[6, b] = 0.0  # uncapped: +inf + -inf = NaN at target id hot[b]
    probs[6, a] = float("nan")
    for cap, uniform in VARIANTS:
        want = _check(probs, hot, seeds, positions, cap, uniform, block).tolist()
        # what the definition implies, independently of either implementation (target ids, not columns)
        assert want[0] == lowest and want[4] == lowest and lowest != int(hot[0])
        assert want[1:4] == [int(hot[b])] * 3 and want[5] == int(hot[a])
        assert want[6] == int(hot[b] if not cap else hot[a])


def test_row_view_int32_positions_and_empty_batch():
    R, Vd, Vt = 3, 120, 300
    probs, hot, seeds, positions = _case(R, Vd, Vt, seed=8)
    stacked = torch.stack([probs.flip(0), probs], dim=1)  # [R, 2, Vd]: draft_probs[:bs, step], a strided row view
    view = stacked[:, 1]
    got = coupled_hot_race_probs(view.to(DEV), seeds.to(DEV), positions.to(torch.int32).to(DEV), hot.to(DEV),
                                 block_size=32)
    want = coupled_hot_race_reference(_kernel_log(probs), seeds, positions.to(torch.int32), hot)
    assert torch.equal(got.cpu(), want)
    empty = coupled_hot_race_probs(probs[:0].to(DEV), seeds[:0].to(DEV), positions[:0].to(DEV), hot.to(DEV))
    assert empty.shape == (0,) and empty.dtype == torch.int64


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: dict(a, probs=a["probs"].double()), "float32"),
        (lambda a: dict(a, probs=torch.zeros(3, 128, device=DEV)[:, ::2]), "contiguous in its last"),
        (lambda a: dict(a, seeds=a["seeds"].to(torch.int32)), "int64"),
        (lambda a: dict(a, positions=a["positions"][:1]), "one entry per logprobs row"),
        (lambda a: dict(a, hot=a["hot"].to(torch.int32)), r"hot_to_target must be int64 \[64\]"),
        (lambda a: dict(a, hot=a["hot"][:63]), r"hot_to_target must be int64 \[64\]"),
        (lambda a: dict(a, hot=torch.stack([a["hot"], a["hot"]], 1)[:, 0]), "hot_to_target must be contiguous"),
        (lambda a: dict(a, hot=a["hot"].to("meta")), "hot_to_target is on meta.*HotVocab.to"),
        (lambda a: dict(a, uniform="half"), "uniform must be"),
        (lambda a: dict(a, block_size=100), "power of two"),
    ],
)
def test_invalid_inputs_are_refused_with_the_fix(change, match):
    probs, hot, seeds, positions = _case(3, 64, 200, seed=0)
    args = dict(probs=probs.to(DEV), seeds=seeds.to(DEV), positions=positions.to(DEV), hot=hot.to(DEV))
    bad = change(args)
    with pytest.raises(ValueError, match=match):
        coupled_hot_race_probs(bad.pop("probs"), bad.pop("seeds"), bad.pop("positions"), bad.pop("hot"), **bad)


gpu = pytest.mark.gpu  # tests/conftest.py skips these without a GPU, with its GPU_SKIP_REASON


def _cuda_case(R, Vd, Vt, seed):
    g = torch.Generator().manual_seed(seed)
    hot = torch.randperm(Vt, generator=g)[:Vd]
    temperature = torch.linspace(0.5, 8.0, R).view(-1, 1)  # flat to peaked rows
    probs = torch.softmax(torch.randn(R, Vd, generator=g) * temperature, -1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (R,), generator=g)
    positions = torch.randint(0, 2**40, (R,), generator=g)
    return probs.cuda(), hot.cuda(), seeds.cuda(), positions.cuda()


@gpu
@pytest.mark.parametrize("R", [1, 8, 256])
def test_gpu_parity_at_an_eagle3_draft_size(R):
    """The compiled kernel (default launch, fast screen) at a Qwen3 EAGLE3 draft's size vs the twin of torch.log."""
    probs, hot, seeds, positions = _cuda_case(R, 32000, 151936, seed=R)
    for cap in (True, False):
        got = coupled_hot_race_probs(probs, seeds, positions, hot, cap_unit_uniform=cap)
        want = coupled_hot_race_reference(torch.log(probs), seeds, positions, hot, cap_unit_uniform=cap)
        assert torch.equal(got, want), int((got != want).sum())


@gpu
def test_gpu_graph_replay_reads_seeds_positions_probs_and_map_in_place():
    R, Vd, Vt = 16, 4096, 32000
    probs, hot, seeds, positions = _cuda_case(R, Vd, Vt, seed=1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        coupled_hot_race_probs(probs, seeds, positions, hot)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = coupled_hot_race_probs(probs, seeds, positions, hot)
    for trial in range(3):
        new_probs, new_hot, new_seeds, new_positions = _cuda_case(R, Vd, Vt, seed=100 + trial)
        probs.copy_(new_probs)
        hot.copy_(new_hot)
        seeds.copy_(new_seeds)
        positions.copy_(new_positions)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, coupled_hot_race_reference(torch.log(probs), seeds, positions, hot))


@gpu
@pytest.mark.parametrize("R", [1, 8, 256])
def test_gpu_identity_map_gives_the_full_race_bit_for_bit(R):
    """The compiled keyed and unkeyed kernels (default launch, fast screen) at a Qwen3 target vocabulary: the hot race
    over ``arange(V)`` is the full race, token for token."""
    V = 151936
    probs, _, seeds, positions = _cuda_case(R, V, V, seed=R)
    identity = torch.arange(V, device="cuda")
    for cap in (True, False):
        full = coupled_race_probs(probs, seeds, positions, cap_unit_uniform=cap)
        assert torch.equal(coupled_hot_race_probs(probs, seeds, positions, identity, cap_unit_uniform=cap), full)
