"""The batch-invariant GEMM (kernels/batch_invariant_gemm.py): values, row invariance, and its self-check.

On CPU the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py), so shapes stay small (K <= 256, N <= 128,
M <= 64).  Values are checked against a float64 product with an error bound (the kernel's fp32 sums run in an
order no torch op reproduces); invariance is checked bit for bit by ``find_row_variance``, which itself is
shown to catch a deliberately M-dependent reduction.  torch and Triton only: never imports SGLang.
"""

import dataclasses

import pytest
import torch

from sglang_detspec.kernels import batch_invariant_gemm as gemm
from sglang_detspec.kernels import launch_checks
from sglang_detspec.kernels.batch_invariant_gemm import (
    BLOCK_K,
    LAUNCH_TABLE,
    GemmConfig,
    config_switch_points,
    default_m_grid,
    find_row_variance,
    launch_config,
    matmul,
    matmul_reference,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ALL_CONFIGS = sorted({c for _, cands in LAUNCH_TABLE for c in cands}, key=lambda c: (c.block_m, c.block_n))


def _operands(m, k, n, dtype=torch.bfloat16, seed=0, weight_layout=True, bias_dtype=None):
    """``a [m, k]`` and ``b [k, n]``: ``b`` is ``weight.t()`` of an ``[n, k]`` weight (SGLang's operand) unless
    ``weight_layout`` is False; ``bias [n]`` in ``bias_dtype`` or None."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, k, generator=g).to(dtype).t() if weight_layout else torch.randn(k, n, generator=g).to(dtype)
    bias = None if bias_dtype is None else torch.randn(n, generator=g).to(bias_dtype)
    return a.to(DEV), b.to(DEV), None if bias is None else bias.to(DEV)


def _assert_within_rounding(got, a, b, bias):
    """|got - exact| <= the fp32 accumulation bound + half an ulp of got's dtype (exact: the float64 product)."""
    a64, b64 = a.cpu().double(), b.cpu().double()
    exact = a64 @ b64
    size = a64.abs() @ b64.abs()
    if bias is not None:
        exact = exact + bias.cpu().double()
        size = size + bias.cpu().double().abs()
    accumulation = (a.shape[1] + 2) * 2.0**-24 * size
    half_ulp = torch.finfo(got.dtype).eps / 2 * (exact.abs() + accumulation)
    err = (got.cpu().double() - exact).abs()
    worst = float((err - accumulation - half_ulp).max()) if err.numel() else 0.0
    assert worst <= 0, f"error beyond fp32 accumulation + rounding by {worst}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "m,k,n,weight_layout,bias_kind",
    [
        (1, 64, 16, True, None),  # one row, one K slice
        (5, 200, 48, True, "same"),  # K tail (200 = 3 * 64 + 8), bias in a's dtype
        (17, 256, 128, True, "float32"),  # M past one 16-row tile, fp32 bias
        (33, 65, 100, False, None),  # contiguous b (not a weight view), K = one slice + 1, ragged N
        (64, 1, 7, True, "same"),  # K = 1: one masked slice; N < 16
        (3, 130, 1, True, None),  # N = 1
    ],
)
def test_matmul_is_the_product_within_rounding(dtype, m, k, n, weight_layout, bias_kind):
    bias_dtype = {None: None, "same": dtype, "float32": torch.float32}[bias_kind]
    a, b, bias = _operands(m, k, n, dtype, seed=m + k + n, weight_layout=weight_layout, bias_dtype=bias_dtype)
    got = matmul(a, b, bias)
    assert got.shape == (m, n) and got.dtype == dtype and got.is_contiguous()
    _assert_within_rounding(got, a, b, bias)
    ref = matmul_reference(a, b, bias)
    assert ref.dtype == dtype
    _assert_within_rounding(ref, a, b, bias)  # the reference obeys the same bound


def test_out_dtype_float32_stores_the_accumulator():
    a, b, bias = _operands(9, 192, 40, bias_dtype=torch.bfloat16)
    got = matmul(a, b, bias, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    _assert_within_rounding(got, a, b, bias)
    # rounding the fp32 result gives the default output, bit for bit
    assert torch.equal(got.to(torch.bfloat16), matmul(a, b, bias))
    assert matmul(a, b, out_dtype=torch.float16).dtype == torch.float16


def test_strided_a_and_transposed_b_give_the_contiguous_result():
    a, b, bias = _operands(12, 128, 64, bias_dtype=torch.bfloat16)
    wide = torch.zeros(24, 300, dtype=a.dtype, device=DEV)
    wide[::2, 7:135] = a
    strided_a = wide[::2, 7:135]  # row stride 600, an offset into storage
    assert strided_a.stride() == (600, 1)
    want = matmul(a.contiguous(), b.contiguous(), bias)
    assert torch.equal(matmul(strided_a, b, bias), want)
    assert torch.equal(matmul(a.t().contiguous().t(), b, bias), want)  # column-major a


def test_empty_dimensions():
    a, b, bias = _operands(4, 64, 8, bias_dtype=torch.bfloat16)
    assert matmul(a[:0], b).shape == (0, 8)
    assert matmul(a, b[:, :0]).shape == (4, 0)
    k0 = matmul(a[:, :0], b[:0], bias)  # K = 0: the bias alone
    assert torch.equal(k0, bias.expand(4, 8))


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda c: c.short())
def test_every_table_entry_gives_the_same_bits(config):
    """Every launch of the table on one product: identical fp32 accumulators, hence identical rows."""
    a, b, bias = _operands(40, 200, 72, bias_dtype=torch.bfloat16, seed=3)
    base = matmul(a, b, bias, out_dtype=torch.float32, config=GemmConfig(16, 16, 4, 2))
    got = matmul(a, b, bias, out_dtype=torch.float32, config=config)
    assert torch.equal(got.view(torch.int32), base.view(torch.int32)), config
    _assert_within_rounding(got, a, b, bias)


def test_rows_are_invariant_when_every_m_gets_another_launch():
    """The strongest form of the contract: m rows through a launch picked by m (cycling through the whole table,
    not the table's rule) equal the full batch's rows bit for bit, in fp32 and bf16 output."""
    a, b, bias = _operands(64, 256, 80, bias_dtype=torch.float32, seed=5)

    def cycling(out_dtype):
        def fn(x, w, bias_):
            return matmul(x, w, bias_, out_dtype=out_dtype, config=ALL_CONFIGS[x.shape[0] % len(ALL_CONFIGS)])
        return fn

    ms = [1, 2, 3, 7, 15, 16, 17, 31, 33, 48, 63]
    for out_dtype in (torch.float32, torch.bfloat16):
        assert find_row_variance(cycling(out_dtype), a, b, bias, ms=ms) is None


def test_default_launches_are_row_invariant():
    a, b, _ = _operands(64, 128, 96, dtype=torch.float16, seed=6)
    ms = [m for m in default_m_grid(64) if m in (1, 2, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64)]
    assert find_row_variance(matmul, a, b, None, ms=ms) is None
    assert len({launch_config(m, 128, 96, gemm.INTERPRETER_SMS) for m in ms}) >= 3  # several launches compared


def _block_k_32_below_8_rows(a, b, bias):
    """A deliberately M-dependent reduction: K folded in 32-wide slices when there are fewer than 8 rows."""
    config = launch_config(a.shape[0], a.shape[1], b.shape[1], gemm.INTERPRETER_SMS)
    if a.shape[0] < 8:
        config = dataclasses.replace(config, block_k=32)
    return gemm._launch(a, b, bias, torch.float32, config)


def test_self_check_catches_an_m_dependent_kernel():
    a, b, bias = _operands(24, 256, 48, seed=7, bias_dtype=torch.bfloat16)
    found = find_row_variance(_block_k_32_below_8_rows, a, b, bias, ms=[24, 16, 8, 5, 1])
    assert found is not None and found.m == 5  # 24, 16 and 8 rows fold K in 64-wide slices like the full batch
    full = _block_k_32_below_8_rows(a, b, bias)[:5].view(torch.int32)
    part = _block_k_32_below_8_rows(a[:5], b, bias).view(torch.int32)
    first = (part != full).reshape(-1).nonzero()[0].item()  # row-major first difference, found independently
    assert (found.row, found.col) == divmod(first, 48)
    assert found.value_at_m != found.value_full
    assert f"row {found.row}, column {found.col}" in found.describe() and "5 rows" in found.describe()


def test_self_check_catches_an_m_dependent_torch_reduction():
    """A pure-torch GEMM that sums K in reverse for fewer than 8 rows (an order change, nothing else)."""

    def reverse_k_below_8(a, b, bias):
        if a.shape[0] < 8:
            a, b = a.flip(1), b.flip(0)
        out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
        for k in range(a.shape[1]):  # explicit order: one rank-1 update at a time
            out += a[:, k:k + 1].float() * b[k:k + 1, :].float()
        return out

    a, b, _ = _operands(10, 96, 16, seed=8)
    found = find_row_variance(reverse_k_below_8, a, b, None, ms=[9, 8, 7, 1])
    assert found is not None and found.m == 7


def test_self_check_compares_bits_so_nan_rows_match_themselves():
    a, b, _ = _operands(8, 64, 16, seed=9)
    a[3, 5] = float("nan")
    assert torch.isnan(matmul(a, b)[3]).all()
    assert find_row_variance(matmul, a, b, None, ms=[1, 4, 5, 8]) is None


def test_self_check_reports_a_result_whose_shape_depends_on_m():
    a, b, _ = _operands(8, 64, 16)
    found = find_row_variance(lambda x, w, bias: matmul(x, w)[:, :-1] if x.shape[0] < 4 else matmul(x, w), a, b,
                              None, ms=[8, 2])
    assert found is not None and (found.m, found.row, found.col) == (2, 0, 0)


def test_check_weight_rows_runs_the_self_check_on_a_served_weight(monkeypatch):
    g = torch.Generator().manual_seed(12)
    weight = torch.randn(40, 96, generator=g).to(torch.bfloat16).to(DEV)  # [N, K], as nn.Linear stores it
    bias = torch.randn(40, generator=g).to(torch.bfloat16).to(DEV)
    assert gemm.check_weight_rows(weight, bias, max_m=24) is None  # default grid: every m in 1..24
    seen = []
    real = gemm.find_row_variance

    def spy(fn, a, b, bias_, ms):
        seen.append((fn, a.shape, a.dtype, b.shape, b.stride(), list(ms)))
        return real(fn, a, b, bias_, ms)

    monkeypatch.setattr(gemm, "find_row_variance", spy)
    assert gemm.check_weight_rows(weight, None, max_m=20, ms=[1, 20]) is None
    assert seen == [(matmul, (20, 96), torch.bfloat16, (96, 40), (1, 96), [1, 20])]
    monkeypatch.setattr(gemm, "matmul", _block_k_32_below_8_rows)  # and it does report a variance
    found = gemm.check_weight_rows(weight, bias, max_m=12, ms=[12, 9, 5])
    assert found is not None and found.m == 5


def test_self_check_refuses_m_outside_the_rows():
    a, b, _ = _operands(8, 64, 16)
    with pytest.raises(ValueError, match="every m must be in 1..8"):
        find_row_variance(matmul, a, b, None, ms=[0])
    with pytest.raises(ValueError, match="every m must be in 1..8"):
        find_row_variance(matmul, a, b, None, ms=[9])


def test_default_m_grid_covers_small_m_powers_of_two_and_table_bounds():
    grid = default_m_grid(8192, boundaries=[1000])
    assert grid == sorted(set(grid)) and grid[0] == 1 and grid[-1] == 8192
    assert set(range(1, 65)) <= set(grid)
    for edge in (128, 256, 1024, 4096, 8192, 1000, 16, 32, 64):
        assert {edge - 1, edge} <= set(grid) and (edge + 1 in grid or edge == 8192)
    gaps = [y / x for x, y in zip(grid, grid[1:]) if x > 64]
    assert max(gaps) < 1.13  # dense between the edges too (about 12 values per octave)
    assert any(m % 2 == 1 and m > 1000 for m in grid)
    assert default_m_grid(3) == [1, 2, 3]
    with pytest.raises(ValueError, match="max_m must be >= 1"):
        default_m_grid(0)


@pytest.mark.parametrize("k,n", [(2048, 2048), (14336, 4096), (4096, 128256)])
def test_launch_config_follows_the_table_and_switch_points_are_exact(k, n):
    sms = 132
    previous = None
    points = set(config_switch_points(600, k, n, sms))
    for m in range(1, 601):
        config = launch_config(m, k, n, sms)
        assert config.block_k == BLOCK_K
        bucket = next(cands for bound, cands in LAUNCH_TABLE if m <= bound)
        assert config in bucket
        if config.programs(m, n) < sms:  # too few programs: no candidate of the bucket launches more
            assert all(c.programs(m, n) <= config.programs(m, n) for c in bucket)
        assert (m in points) == (previous is not None and config != previous)
        previous = config


def test_launch_config_gives_small_m_long_k_weights_narrow_tiles():
    # the 8B down projection at decode: 4096 columns / 64 = 64 programs would leave half of 132 SMs idle
    config = launch_config(4, 14336, 4096, 132)
    assert config.block_n < 64 and config.programs(4, 4096) >= 132
    assert launch_config(4096, 4096, 14336, 132).block_m >= 128  # prefill: large tiles


def test_shape_overrides_take_precedence_and_tables_refuse_another_block_k(monkeypatch):
    tuned = GemmConfig(32, 16, 2, 6)
    monkeypatch.setitem(gemm.SHAPE_LAUNCH_TABLE, (2048, 2048), ((8, tuned),))
    assert launch_config(8, 2048, 2048, 132) == tuned
    assert launch_config(9, 2048, 2048, 132) != tuned  # past the override's bound: the general table
    gemm._check_tables()
    monkeypatch.setitem(gemm.SHAPE_LAUNCH_TABLE, (64, 64), ((8, GemmConfig(16, 16, block_k=32)),))
    with pytest.raises(RuntimeError, match="block_k 32: every entry must fold K in slices of BLOCK_K = 64"):
        gemm._check_tables()


def test_int64_offset_launch_gives_the_int32_launch_bits(monkeypatch):
    a, b, bias = _operands(20, 130, 40, bias_dtype=torch.bfloat16, seed=11)
    want = matmul(a, b, bias, out_dtype=torch.float32)
    monkeypatch.setattr(gemm, "_int64_flags", lambda *args: (True, True, True))
    assert torch.equal(matmul(a, b, bias, out_dtype=torch.float32), want)


def test_int64_flags_follow_the_largest_offset():
    """Shapes only (meta tensors): an operand needs int64 offsets once its last element's offset passes 2**31 - 1."""
    k = 2**14

    def meta(rows, cols):
        return torch.empty(rows, cols, device="meta", dtype=torch.bfloat16)

    config = GemmConfig(16, 16)
    fits, over, small = meta(2**17, k), meta(2**17 + 1, k), meta(4, k)  # last offsets 2**31 - 1, 2**31 + k - 1
    assert gemm._int64_flags(fits, small.t(), config) == (False, False, False)
    assert gemm._int64_flags(over, small.t(), config) == (True, False, False)
    assert gemm._int64_flags(small, over.t(), config) == (False, True, False)  # the weight view
    assert gemm._int64_flags(small, fits.t(), config) == (False, False, False)
    column_major = meta(2**17 + 2**15, k).t().contiguous().t()[:4]  # 4 rows, but columns 2**17 + 2**15 apart
    assert gemm._int64_flags(column_major, small.t(), config) == (True, False, False)
    # the output [M, N], with M padded to whole row tiles
    assert gemm._int64_flags(meta(2**14, k), meta(2**17, k).t(), config) == (False, False, True)
    assert gemm._int64_flags(meta(2**14, k), meta(2**17 - 1, k).t(), config)[2] is False
    assert gemm._int64_flags(meta(2**14 + 1, k), meta(2**17 - 1, k).t(), config)[2] is True


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda a, b: matmul(a.float(), b.float()), "bfloat16 or float16 a and b of one dtype"),
        (lambda a, b: matmul(a, b.half()), "bfloat16 or float16 a and b of one dtype"),
        (lambda a, b: matmul(a, b[:-1]), r"a's columns \(64\) must equal b's rows \(63\).*weight.t\(\)"),
        (lambda a, b: matmul(a[0], b), "2-D a"),
        (lambda a, b: matmul(a, b, torch.zeros(3, dtype=a.dtype, device=a.device)), "1-D tensor of N = 16"),
        (lambda a, b: matmul(a, b, torch.zeros(4, 16, dtype=a.dtype, device=a.device)), "broadcast"),
        (lambda a, b: matmul(a, b, torch.zeros(16, dtype=torch.int32, device=a.device)), "bias must be bfloat16"),
        (lambda a, b: matmul(a, b, out_dtype=torch.int8), "out_dtype must be None"),
        (lambda a, b: matmul(a, b, config=GemmConfig(16, 16, block_k=32)), "config.block_k must be BLOCK_K = 64"),
    ],
)
def test_invalid_inputs_are_refused_with_the_fix(call, message):
    a, b, _ = _operands(4, 64, 16)
    with pytest.raises(ValueError, match=message):
        call(a, b)


@pytest.mark.parametrize("kwargs,message", [
    ({"block_m": 24, "block_n": 16}, "block_m must be a power of two >= 16"),
    ({"block_m": 16, "block_n": 8}, "block_n must be a power of two >= 16"),
    ({"block_m": 16, "block_n": 16, "num_warps": 3}, "num_warps must be a power of two"),
    ({"block_m": 16, "block_n": 16, "num_stages": 0}, "num_stages must be >= 1"),
])
def test_gemm_config_refuses_launches_triton_cannot_build(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GemmConfig(**kwargs)


def test_cpu_tensors_outside_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(launch_checks, "INTERPRETED", False)
    a, b, _ = _operands(2, 64, 16)
    with pytest.raises(ValueError, match="needs CUDA tensors.*batch_invariant_gemm.matmul_reference"):
        matmul(a.cpu(), b.cpu())
