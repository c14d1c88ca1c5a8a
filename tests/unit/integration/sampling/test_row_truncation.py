"""Row-local top-k / top-p / min-p truncation: the Triton kernel, the torch reference and the entry point.

Three implementations of one rule set (sglang_detspec/stream/reference.py, "Row-local ... truncation") are checked
against each other: the kernel (bisection over float bit patterns; the interpreter on CPU), the reference
(one int64-key sort) and a brute force in plain Python ints here.  SGLang's own pytorch sampler rules are
checked on rows without near-ties.  The kernel tests need no SGLang; GPU tests are marked ``gpu``.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from sglang_detspec.integration.sampling.truncation import truncate_probs
from sglang_detspec.kernels import truncate_probs_triton
from sglang_detspec.stream.reference import truncate_probs_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
NO_TOP_K = 1 << 30
SCALE = 2**60


# ----------------------------------------------------------------------------------------------- helpers


def _softmax_rows(n, vocab, temperature=1.0, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, vocab, generator=g) * scale / temperature, dim=-1)


def _quantised_rows(n, vocab, levels=4, seed=0, zero_share=0.0):
    """Rows of exactly equal values: integer weights in [1, levels] (some zeroed) divided by their sum."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randint(1, levels + 1, (n, vocab), generator=g).float()
    if zero_share:
        weights[torch.rand(n, vocab, generator=g) < zero_share] = 0.0
        weights[:, 0] += 1.0  # keep every row non-zero
    return weights / weights.sum(-1, keepdim=True)


def _param_grid(vocab):
    """Every combination of the brief's top-p / min-p values with tiny to large top-k."""
    top_ks = sorted({1, 2, 7, max(1, vocab // 3), max(1, vocab - 1), vocab, NO_TOP_K})
    rows = [(k, p, m) for k in top_ks for p in (0.05, 0.5, 0.9, 0.999, 1.0) for m in (0.0, 0.05, 0.5)]
    k, p, m = zip(*rows)
    return torch.tensor(k, dtype=torch.int64), torch.tensor(p), torch.tensor(m)


def _bits(t):
    return t.detach().cpu().contiguous().view(torch.int32)


def _assert_bits_equal(actual, expected):
    a, e = _bits(actual), _bits(expected)
    assert a.shape == e.shape
    bad = (a != e).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} elements differ, first at {bad[:5].tolist()}"


def _kernel(probs, top_ks, top_ps, min_ps, *, renormalize, out=None, block=None):
    args = [None if t is None else t.to(DEV) for t in (probs, top_ks, top_ps, min_ps)]
    return truncate_probs_triton(*args, renormalize=renormalize, out=out, block=block).cpu()


def _f32(x) -> float:
    return float(np.float32(x))


def _f32_of_int(n: int) -> float:
    """int -> nearest float32 (ties to even), exactly, without the double rounding of float(np.float32(float(n)))."""
    if n.bit_length() <= 24:
        return float(n)
    shift = n.bit_length() - 24
    mant, rest = n >> shift, n & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rest > half or (rest == half and mant & 1):
        mant += 1
    return float(mant << shift)


def brute_force_row(row, top_k, top_p, min_p, renormalize):
    """The rules in plain Python: a sorted list, Python ints for the masses."""
    row = [_f32(x) for x in row]
    vocab = len(row)
    top_p, min_p = _f32(top_p), _f32(min_p)
    if not (top_k < vocab or top_p < 1 or min_p > 0):
        return list(row)
    order = sorted(range(vocab), key=lambda i: (-row[i], i))
    threshold = _f32(np.float32(row[order[0]]) * np.float32(min_p))
    cap = int(top_p * SCALE)
    kept, prefix = set(), 0
    for rank, i in enumerate(order):
        if rank == 0 or (rank < top_k and prefix <= cap and row[i] >= threshold):
            kept.add(i)
        prefix += int(row[i] * SCALE)
    total = sum(int(row[i] * SCALE) for i in kept)
    divisor = _f32_of_int(total) * 2.0**-60 if renormalize and total else 1.0
    return [_f32(np.float32(row[i]) / np.float32(divisor)) if i in kept else 0.0 for i in range(vocab)]


def _f32_list_bits(values):
    return [struct.unpack("<i", struct.pack("<f", v))[0] for v in values]


# ------------------------------------------------------------------- kernel == reference, bit for bit


@pytest.mark.parametrize(
    "vocab,block,temperature,k_dtype",
    [
        (1000, 256, 1.0, torch.int64),  # several tiles, the last one partial
        (777, 1024, 1.7, torch.int32),  # flat rows, one partial tile
        (2048, 2048, 0.3, torch.int32),  # peaked rows, one full tile
        (1, 16, 1.0, torch.int64),  # V = 1
        (3, 16, 1.0, torch.int32),
    ],
)
@pytest.mark.parametrize("renormalize", [False, True])
def test_kernel_matches_reference_on_the_parameter_grid(vocab, block, temperature, k_dtype, renormalize):
    top_ks, top_ps, min_ps = _param_grid(vocab)
    probs = _softmax_rows(top_ks.shape[0], vocab, temperature, seed=vocab)
    expected = truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=renormalize)
    actual = _kernel(probs, top_ks.to(k_dtype), top_ps, min_ps, renormalize=renormalize, block=block)
    _assert_bits_equal(actual, expected)
    # the truncation really happened: the grid holds rows that keep one element and rows that keep all
    kept = (expected > 0).sum(-1)
    if vocab > 1:
        assert kept.min() == 1 and kept.max() == vocab


def test_small_tiles_compact_the_bracket_several_times():
    # 32 tiles per row: the bisection bracket is compacted into the output row again and again (at a
    # quarter of the source, while the source is more than one tile: 2048 -> 512 -> 128 -> 32), in place
    # it never is
    vocab = 2048
    probs = torch.cat([_softmax_rows(5, vocab, 1.7, seed=41), _quantised_rows(2, vocab, levels=6, seed=42)])
    top_ks = torch.tensor([NO_TOP_K, NO_TOP_K, 50, 300, NO_TOP_K, NO_TOP_K, 700])
    top_ps = torch.tensor([0.9, 0.5, 1.0, 0.95, 0.95, 0.7, 1.0])
    min_ps = torch.tensor([0.0, 0.0, 0.0, 0.01, 0.02, 0.0, 0.0])
    for renormalize in (False, True):
        expected = truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=renormalize)
        _assert_bits_equal(_kernel(probs, top_ks, top_ps, min_ps, renormalize=renormalize, block=64), expected)
    in_place = probs.to(DEV)
    truncate_probs_triton(in_place, top_ks.to(DEV), top_ps.to(DEV), min_ps.to(DEV), renormalize=True,
                          out=in_place, block=256)
    _assert_bits_equal(in_place, expected)
    kept = (expected > 0).sum(-1)
    assert (kept > 100).sum() >= 3 and (kept < vocab).all()


@pytest.mark.parametrize("renormalize", [False, True])
def test_strided_rows_in_place_and_without_min_p(renormalize):
    vocab = 300
    top_ks, top_ps, min_ps = (t[::3] for t in _param_grid(vocab))
    n = top_ks.shape[0]
    storage = _softmax_rows(2 * n, vocab + 5, seed=3)
    probs = storage[::2, :vocab]  # row-strided view (row stride 2 * (vocab + 5))
    expected = truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=renormalize)
    _assert_bits_equal(_kernel(probs, top_ks, top_ps, min_ps, renormalize=renormalize, block=128), expected)

    # out= a separate row-strided view
    out_storage = torch.full((n, vocab + 9), -7.0, device=DEV)
    out = out_storage[:, 2 : vocab + 2]
    _kernel(probs, top_ks, top_ps, min_ps, renormalize=renormalize, out=out, block=128)
    _assert_bits_equal(out, expected)
    assert (out_storage[:, :2] == -7).all() and (out_storage[:, vocab + 2 :] == -7).all()

    # in place (out=probs), on a strided view of a device tensor
    device_storage = storage.clone().to(DEV)
    in_place = device_storage[::2, :vocab]
    result = truncate_probs_triton(
        in_place, top_ks.to(DEV), top_ps.to(DEV), min_ps.to(DEV), renormalize=renormalize, out=in_place, block=128
    )
    assert result.data_ptr() == in_place.data_ptr()
    _assert_bits_equal(in_place, expected)
    _assert_bits_equal(device_storage[1::2], storage[1::2])  # the rows in between are untouched

    # min_ps=None is min-p 0
    expected = truncate_probs_reference(probs, top_ks, top_ps, torch.zeros_like(min_ps), renormalize=renormalize)
    _assert_bits_equal(_kernel(probs, top_ks, top_ps, None, renormalize=renormalize, block=128), expected)
    _assert_bits_equal(truncate_probs_reference(probs, top_ks, top_ps, None, renormalize=renormalize), expected)


# ---------------------------------------------------------------------------------------------- ties


def _tie_rows():
    """Rows with plateaus, zeros, one-hot, uniform and all-zero rows, with parameters on tie boundaries."""
    vocab = 96
    rows, params = [], []
    quantised = _quantised_rows(6, vocab, levels=3, seed=1, zero_share=0.3)
    for row in quantised:
        order = sorted(range(vocab), key=lambda i: (-row[i].item(), i))
        values = [row[i].item() for i in order]
        top_value = values[0]
        n_top = sum(v == top_value for v in values)
        # top-k inside the top plateau and inside the second one
        for k in (max(1, n_top // 2), n_top + 2):
            rows.append(row)
            params.append((k, 1.0, 0.0))
        # top-p thresholds inside the top plateau: after 1, 2 and n_top // 2 ties
        for m in (1, 2, max(1, n_top // 2)):
            rows.append(row)
            params.append((NO_TOP_K, m * top_value + top_value / 2, 0.0))
        rows.append(row)
        params.append((NO_TOP_K, 1.0, 0.5))  # min-p 0.5 against plateau values
        rows.append(row)
        params.append((n_top + 5, 0.9, 0.34))
    # dyadic values: prefix masses and min-p thresholds land exactly on the boundaries (E_i == T is kept,
    # p_i == threshold is kept), ties at 0.125 are split by index
    dyadic = torch.zeros(vocab)
    dyadic[[40, 3, 70, 12, 55, 90, 1]] = torch.tensor([0.25, 0.25, 0.125, 0.125, 0.125, 0.0625, 0.0625])
    for p in ((NO_TOP_K, 0.5, 0.0), (NO_TOP_K, 0.625, 0.0), (NO_TOP_K, 0.75, 0.0), (NO_TOP_K, 0.875, 0.0),
              (NO_TOP_K, 1.0, 0.5), (NO_TOP_K, 1.0, 0.5000001), (4, 1.0, 0.25), (NO_TOP_K, 0.25, 0.0),
              (NO_TOP_K, 1.0, 1.0)):
        rows.append(dyadic)
        params.append(p)
    one_hot = torch.zeros(vocab)
    one_hot[17] = 1.0
    uniform = torch.full((vocab,), 1.0 / vocab)
    zeros = torch.zeros(vocab)
    two_max = torch.full((vocab,), 0.0)
    two_max[[5, 40]] = 0.5
    for row in (one_hot, uniform, zeros, two_max):
        for p in ((1, 1.0, 0.0), (3, 1.0, 0.0), (NO_TOP_K, 0.5, 0.0), (NO_TOP_K, 0.3, 0.1), (10, 0.05, 0.5)):
            rows.append(row)
            params.append(p)
    top_ks, top_ps, min_ps = (torch.tensor(c) for c in zip(*params))
    return torch.stack(rows), top_ks.to(torch.int64), top_ps.float(), min_ps.float()


@pytest.mark.parametrize("renormalize", [False, True])
def test_ties_zeros_one_hot_uniform_rows_match_the_brute_force(renormalize):
    probs, top_ks, top_ps, min_ps = _tie_rows()
    expected = torch.tensor(
        [
            brute_force_row(r.tolist(), k.item(), p.item(), m.item(), renormalize)
            for r, k, p, m in zip(probs, top_ks, top_ps, min_ps)
        ]
    )
    _assert_bits_equal(truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=renormalize), expected)
    for block in (16, 128):
        _assert_bits_equal(_kernel(probs, top_ks, top_ps, min_ps, renormalize=renormalize, block=block), expected)
    # ties were partially kept (some but not all of a plateau), so the tie rule was exercised
    kept = expected > 0
    partial = [
        bool(((probs[i] == v) & kept[i]).any() and ((probs[i] == v) & ~kept[i]).any())
        for i in range(probs.shape[0])
        for v in probs[i][kept[i]].unique()
    ]
    assert sum(partial) >= 10


def test_out_of_contract_parameters_still_keep_rank_0():
    # top_k < 1, top_p <= 0 and min_p > 1 are outside the contract (nothing checks values: that would need a
    # host sync); the rules then keep exactly the first maximum, never an all-zero row
    probs = torch.zeros(6, 64)
    probs[:, [7, 30, 31]] = torch.tensor([0.25, 0.5, 0.25])
    probs[3:, 7] = 0.5  # tied maxima at 7 and 30: index 7 is rank 0
    top_ks = torch.tensor([0, -1, NO_TOP_K, NO_TOP_K, 0, NO_TOP_K])
    top_ps = torch.tensor([1.0, 0.9, 0.0, -0.5, 1.0, 1.0])
    min_ps = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.5])
    expected = torch.zeros_like(probs)
    expected[:3, 30] = 0.5
    expected[3:, 7] = 0.5
    _assert_bits_equal(truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=False), expected)
    _assert_bits_equal(_kernel(probs, top_ks, top_ps, min_ps, renormalize=False, block=16), expected)


def test_top_k_1_is_exactly_one_at_the_first_argmax():
    vocab = 200
    probs = _quantised_rows(8, vocab, levels=3, seed=5)
    probs[3] = 0.0
    probs[3, [9, 150]] = 0.5  # two exact maxima: index 9 wins
    probs[4] = 1.0 / vocab  # uniform: index 0 wins
    first_max = [min(i for i in range(vocab) if row[i] == row.max()) for row in probs]
    top_ks = torch.ones(8, dtype=torch.int32)
    top_ps = torch.tensor([1.0, 0.9, 0.5, 1.0, 1.0, 0.05, 1.0, 1.0])
    min_ps = torch.tensor([0.0, 0.0, 0.3, 0.0, 0.0, 0.9, 0.1, 0.0])
    for block in (32, 256):
        out = _kernel(probs, top_ks, top_ps, min_ps, renormalize=True, block=block)
        expected = torch.zeros_like(probs)
        expected[torch.arange(8), first_max] = 1.0
        _assert_bits_equal(out, expected)
        plain = _kernel(probs, top_ks, top_ps, min_ps, renormalize=False, block=block)
        expected[torch.arange(8), first_max] = probs[torch.arange(8), first_max]
        _assert_bits_equal(plain, expected)
    _assert_bits_equal(truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=False), expected)


@pytest.mark.parametrize("renormalize", [False, True])
def test_untouched_rows_are_bit_identical_beside_truncated_rows(renormalize):
    vocab = 500
    probs = _softmax_rows(8, vocab, seed=9)
    probs[1, :7] = -0.0  # signed zeros and subnormals survive untouched rows bit for bit
    probs[1, 7] = 1e-40
    probs[5] = probs[5] * 1.5  # unnormalised: renormalize=True must still leave the row alone
    top_ks = torch.tensor([1, vocab, NO_TOP_K, 5, 1 << 20, vocab + 1, 50, NO_TOP_K], dtype=torch.int32)
    top_ps = torch.tensor([1.0, 1.0, 1.0, 0.9, 1.0, 1.0, 1.0, 0.5])
    min_ps = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.0])
    untouched = [1, 2, 4, 5]
    for out in (_kernel(probs, top_ks, top_ps, min_ps, renormalize=renormalize, block=128),
                truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=renormalize)):
        _assert_bits_equal(out[untouched], probs[untouched])
        for r in (0, 3, 6, 7):
            assert (out[r] == 0).any()
    # in place: untouched rows are not rewritten at all, truncated rows are
    device_probs = probs.to(DEV)
    truncate_probs_triton(device_probs, top_ks.to(DEV), top_ps.to(DEV), min_ps.to(DEV), renormalize=renormalize,
                          out=device_probs, block=128)
    _assert_bits_equal(device_probs[untouched], probs[untouched])
    _assert_bits_equal(device_probs, truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=renormalize))


# ----------------------------------------------------------------------------------------- batch invariance


def _invariance_batch(vocab):
    targets = torch.cat([_softmax_rows(3, vocab, 0.3, seed=11), _softmax_rows(3, vocab, 1.7, seed=12)])
    params = [(1, 1.0, 0.0), (1, 0.9, 0.0), (5, 1.0, 0.0), (50, 0.9, 0.0), (NO_TOP_K, 0.9, 0.0), (NO_TOP_K, 1.0, 0.1)]
    fillers = torch.cat([_softmax_rows(6, vocab, 0.3, seed=13), _softmax_rows(6, vocab, 1.7, seed=14)])
    filler_params = [(1, 1.0, 0.0), (1, 1.0, 0.0), (5, 1.0, 0.0), (50, 1.0, 0.0), (NO_TOP_K, 0.9, 0.0),
                     (NO_TOP_K, 1.0, 0.1), (NO_TOP_K, 1.0, 0.0), (20, 0.5, 0.05), (1, 0.1, 0.0), (5, 0.9, 0.1),
                     (NO_TOP_K, 0.999, 0.0), (100, 1.0, 0.0)]
    return targets, params, fillers, filler_params


def _run_batch(impl, rows, params, renormalize):
    k, p, m = (torch.tensor(c) for c in zip(*params))
    return impl(torch.stack(list(rows)), k.to(torch.int64), p.float(), m.float(), renormalize=renormalize)


@pytest.mark.parametrize("implementation", ["kernel", "reference"])
def test_batch_invariance_alone_permuted_split_padded(implementation):
    vocab = 640
    impl = (lambda *a, **kw: _kernel(*a, **kw, block=128)) if implementation == "kernel" else truncate_probs_reference
    targets, params, fillers, filler_params = _invariance_batch(vocab)
    for renormalize in (False, True):
        alone = [_run_batch(impl, [targets[i]], [params[i]], renormalize)[0] for i in range(len(params))]
        assert any((a == 0).any() for a in alone)
        perm = torch.randperm(len(params), generator=torch.Generator().manual_seed(0)).tolist()
        permuted = _run_batch(impl, [targets[i] for i in perm], [params[i] for i in perm], renormalize)
        first = _run_batch(impl, targets[:2], params[:2], renormalize)
        second = _run_batch(impl, targets[2:], params[2:], renormalize)
        mixed_rows = list(fillers[:5]) + list(targets) + list(fillers[5:])
        padded = _run_batch(impl, mixed_rows, filler_params[:5] + params + filler_params[5:], renormalize)
        for i in range(len(params)):
            _assert_bits_equal(permuted[perm.index(i)], alone[i])
            _assert_bits_equal((first if i < 2 else second)[i if i < 2 else i - 2], alone[i])
            _assert_bits_equal(padded[5 + i], alone[i])


# ------------------------------------------------------------------------ reference == brute force


def test_reference_matches_the_brute_force_on_small_rows():
    g = torch.Generator().manual_seed(21)
    rows, params = [], []
    for i in range(160):
        vocab = int(torch.randint(1, 40, (1,), generator=g))
        if i % 2:
            row = _quantised_rows(1, vocab, levels=3, seed=i, zero_share=0.2)[0]
        else:
            row = _softmax_rows(1, vocab, temperature=[0.3, 1.0, 1.7][i % 3], seed=i)[0]
        k = int(torch.randint(1, vocab + 2, (1,), generator=g))
        p = [0.05, 0.5, 0.9, 0.999, 1.0, float(torch.rand(1, generator=g))][i % 6]
        m = [0.0, 0.05, 0.5, float(torch.rand(1, generator=g))][i % 4]
        rows.append(row)
        params.append((k, max(p, 1e-3), m))
    for renormalize in (False, True):
        for row, (k, p, m) in zip(rows, params):
            out = truncate_probs_reference(
                row.view(1, -1), torch.tensor([k]), torch.tensor([p]), torch.tensor([m]), renormalize=renormalize
            )
            assert _f32_list_bits(out[0].tolist()) == _f32_list_bits(brute_force_row(row.tolist(), k, p, m, renormalize))


# ------------------------------------------------------------------------- SGLang's own rules agree


def _sglang_formula_kept(probs, top_ks, top_ps, min_ps):
    """The kept mask of SGLang's top_k_top_p_min_p_sampling_from_probs_torch, its formulas verbatim."""
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[torch.arange(0, probs.shape[-1]).view(1, -1) >= top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0
    min_p_thresholds = probs_sort[:, 0] * min_ps
    probs_sort[probs_sort < min_p_thresholds.view(-1, 1)] = 0.0
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(1, probs_idx, probs_sort > 0)


def _rows_without_near_ties(n=90, vocab=400):
    probs = torch.cat([_softmax_rows(n // 2, vocab, 0.5, seed=31), _softmax_rows(n - n // 2, vocab, 1.5, seed=32)])
    g = torch.Generator().manual_seed(33)
    top_ks = torch.tensor([[1, 3, 40, 399, NO_TOP_K][i % 5] for i in range(n)], dtype=torch.int64)
    top_ps = torch.tensor([[0.3, 0.8, 0.95, 1.0][i % 4] for i in range(n)]) * (1 - 0.01 * torch.rand(n, generator=g))
    top_ps[3::4] = 1.0
    min_ps = torch.tensor([[0.0, 0.02, 0.2][i % 3] for i in range(n)])
    # keep rows whose boundaries are far from float32 rounding: no exclusive prefix sum within 1e-4 of
    # top_p, no value within 1e-4 (relative) of the min-p threshold, no equal values
    sorted_p = probs.double().sort(-1, descending=True).values
    prefix = sorted_p.cumsum(-1) - sorted_p
    clear_p = ((prefix - top_ps.double().view(-1, 1)).abs() > 1e-4).all(-1)
    thr = sorted_p[:, :1] * min_ps.double().view(-1, 1)
    clear_m = ((sorted_p - thr).abs() > 1e-4 * thr).all(-1) | (min_ps == 0)
    distinct = (sorted_p[:, 1:] < sorted_p[:, :-1]).all(-1)
    keep = clear_p & clear_m & distinct
    assert keep.sum() >= n // 2
    return probs[keep], top_ks[keep], top_ps[keep], min_ps[keep]


def test_kept_sets_agree_with_sglang_formulas():
    probs, top_ks, top_ps, min_ps = _rows_without_near_ties()
    expected = _sglang_formula_kept(probs.clone(), top_ks, top_ps, min_ps)
    assert (expected.sum(-1) > 1).any() and (expected.sum(-1) < probs.shape[1]).all()
    for out in (truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=False),
                _kernel(probs, top_ks, top_ps, min_ps, renormalize=True, block=128)):
        assert torch.equal(out > 0, expected)


def test_kept_sets_agree_with_the_installed_sglang_sampler(monkeypatch):
    sampler = pytest.importorskip("sglang.srt.layers.sampler", reason="SGLang is not installed")
    probs, top_ks, top_ps, min_ps = _rows_without_near_ties()
    captured = {}

    def capture_multinomial(weights, num_samples):  # SGLang's unseeded path draws from the truncated sort
        captured["probs_sort"] = weights.clone()
        return torch.zeros((weights.shape[0], num_samples), dtype=torch.int64)

    monkeypatch.setattr(torch, "multinomial", capture_multinomial)
    sampler.top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_ks, top_ps, min_ps, True, sampling_seed=None, positions=None
    )
    probs_idx = probs.sort(dim=-1, descending=True).indices  # no ties: the same permutation as SGLang's
    expected = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, probs_idx, captured["probs_sort"] > 0)
    assert torch.equal(truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=False) > 0, expected)
    assert torch.equal(_kernel(probs, top_ks, top_ps, min_ps, renormalize=False, block=128) > 0, expected)


# ------------------------------------------------------------------------------- the entry point


def test_entry_point_dispatches_cpu_tensors_to_the_reference(monkeypatch):
    from sglang_detspec.stream import reference

    probs = _softmax_rows(3, 50)
    args = (probs, torch.tensor([1, 5, NO_TOP_K]), torch.tensor([1.0, 1.0, 0.5]), None)
    seen = []
    real = reference.truncate_probs_reference
    monkeypatch.setattr(reference, "truncate_probs_reference", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    out = truncate_probs(*args, renormalize=True)
    assert seen == [{"renormalize": True, "out": None}]
    _assert_bits_equal(out, real(*args, renormalize=True))


def test_empty_batches_return_empty_outputs():
    args = (torch.zeros(0, 7), torch.zeros(0, dtype=torch.int32), torch.zeros(0), None)
    for impl in (truncate_probs, truncate_probs_reference, truncate_probs_triton):
        assert impl(*args, renormalize=True).shape == (0, 7)


def test_entry_point_module_imports_neither_sglang_nor_the_kernel():
    code = (
        "import sys; import sglang_detspec.integration.sampling.truncation; "
        "bad = [m for m in sys.modules if m == 'sglang' or m.startswith(('sglang.', 'sglang_detspec.kernels', "
        "'triton'))]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _valid_args(n=4, vocab=10):
    return dict(
        probs=_softmax_rows(n, vocab),
        top_ks=torch.full((n,), 3, dtype=torch.int32),
        top_ps=torch.full((n,), 0.9),
        min_ps=torch.zeros(n),
    )


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(probs=torch.ones(10)), "probs must be a 2-D"),
        (dict(probs=torch.ones(4, 10, dtype=torch.float16)), "probs must be float32.*probs.float()"),
        (dict(probs=torch.ones(4, 0)), "at least one column"),
        (dict(top_ks=torch.ones(4, dtype=torch.int16)), "top_ks must be int32 or int64"),
        (dict(top_ks=torch.ones(4, 1, dtype=torch.int64)), r"top_ks must have shape \[4\].*view\(-1\)"),
        (dict(top_ks=torch.ones(8, dtype=torch.int64)), r"top_ks must have shape \[4\].*top_ks\[:4\]"),
        (dict(top_ps=torch.ones(4, dtype=torch.float64)), "top_ps must be float32"),
        (dict(top_ps=[0.9] * 4), "top_ps must be a tensor"),
        (dict(min_ps=torch.zeros(3)), r"min_ps must have shape \[4\]"),
        (dict(top_ps=torch.ones(4, device="meta")), "top_ps is on meta but probs is on cpu.*to\\(probs.device\\)"),
        (dict(probs=torch.ones(4, 10, device="meta")), "runs on CUDA .* or CPU"),
        (dict(renormalize=1), "renormalize must be True or False"),
        (dict(out=torch.zeros(4, 9)), "out must be a float32 tensor of probs' shape"),
        (dict(out=torch.zeros(4, 10, dtype=torch.float64)), "out must be a float32 tensor"),
    ],
)
def test_entry_point_validation_errors_are_actionable(change, message):
    kwargs = dict(_valid_args(), renormalize=False)
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        truncate_probs(kwargs.pop("probs"), kwargs.pop("top_ks"), kwargs.pop("top_ps"), kwargs.pop("min_ps"), **kwargs)


def test_overlapping_out_is_refused_and_the_kernel_checks_its_layout():
    args = _valid_args(vocab=10)
    storage = torch.zeros(4, 11)
    with pytest.raises(ValueError, match="out overlaps probs"):
        truncate_probs(storage[:, :10], args["top_ks"], args["top_ps"], None, renormalize=False, out=storage[:, 1:])
    transposed = torch.ones(10, 4).t()
    with pytest.raises(ValueError, match="contiguous in its last .* .contiguous()"):
        truncate_probs_triton(transposed, args["top_ks"], args["top_ps"], None, renormalize=False)
    with pytest.raises(ValueError, match="block must be a power of two"):
        truncate_probs_triton(args["probs"], args["top_ks"], args["top_ps"], None, renormalize=False, block=100)


# ------------------------------------------------------------------------------------------------ GPU


def _gpu_mix(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    temps = torch.tensor([0.3, 0.7, 1.0, 1.7])[torch.randint(0, 4, (n,), generator=g)]
    probs = torch.softmax(torch.randn(n, vocab, generator=g) * 3 / temps.view(-1, 1), -1)
    probs[::7] = (probs[::7] * 4096).round() / 4096  # plateaus of exactly equal values
    kind = torch.randint(0, 6, (n,), generator=g)
    top_ks = torch.where(kind == 0, 1, torch.where(kind == 1, torch.randint(2, 100, (n,), generator=g), NO_TOP_K))
    top_ps = torch.where(kind == 2, torch.rand(n, generator=g).clamp(0.05, 1.0), 1.0)
    top_ps = torch.where(kind == 4, 0.9, top_ps)
    min_ps = torch.where(kind == 3, torch.rand(n, generator=g) * 0.3, 0.0)
    top_ks[kind == 5] = torch.randint(2, 1000, (int((kind == 5).sum()),), generator=g)
    return probs, top_ks.to(torch.int32), top_ps.float(), min_ps.float()


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [151936, 163840])
def test_gpu_kernel_matches_reference_at_full_vocab(vocab):
    probs, top_ks, top_ps, min_ps = _gpu_mix(512, vocab, seed=vocab)
    for renormalize in (False, True):
        expected = truncate_probs_reference(probs, top_ks, top_ps, min_ps, renormalize=renormalize)
        actual = truncate_probs_triton(
            probs.cuda(), top_ks.cuda(), top_ps.cuda(), min_ps.cuda(), renormalize=renormalize
        )
        _assert_bits_equal(actual, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_cuda_graph_capture_and_replay_with_updated_inputs(in_place):
    vocab, n = 151936, 64
    static = [t.cuda() for t in _gpu_mix(n, vocab, seed=1)]
    source = static[0].clone()
    out_buffer = torch.empty_like(static[0])

    def step():
        static[0].copy_(source)  # in place, the graph itself refills the buffer it truncates
        return truncate_probs_triton(*static, renormalize=True, out=static[0] if in_place else out_buffer)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    for seed in (2, 3):
        fresh = _gpu_mix(n, vocab, seed=seed)
        source.copy_(fresh[0])
        for buffer, value in zip(static[1:], fresh[1:]):
            buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        _assert_bits_equal(result, truncate_probs_reference(*fresh, renormalize=True))
