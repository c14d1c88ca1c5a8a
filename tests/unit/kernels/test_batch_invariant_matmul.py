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
    LAUNCH_TABLE,
    GemmConfig,
    launch_config,
    launch_plan,
    matmul,
    matmul_reference,
    split_plan,
)
from sglang_detspec.kernels.row_invariance import find_row_variance

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ALL_CONFIGS = sorted({c for _, cands in LAUNCH_TABLE for c in cands}, key=lambda c: (c.block_m, c.block_n))
# The same small launches recomputing row 0 in the rows past M instead of loading zeros: the same bits must come out.
ALL_CONFIGS += [dataclasses.replace(c, mask_rows=False) for c in ALL_CONFIGS if c.block_m <= 32]


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
    ms = [1, 2, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64]
    assert find_row_variance(matmul, a, b, None, ms=ms) is None
    assert len({launch_config(m, 128, 96, gemm.INTERPRETER_SMS) for m in ms}) >= 3  # several launches compared


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
    # masked rows past M still form addresses: a's rows count up to the padded tile. With K = 16448, 130561 rows end
    # at offset 130561 * 16448 - 1 < 2**31; padded to 130576 rows they would pass it.
    near, weight = meta(130561, 16448), meta(4, 16448)
    assert 130561 * 16448 - 1 < 2**31 <= 130576 * 16448 - 1
    assert gemm._int64_flags(near, weight.t(), dataclasses.replace(config, mask_rows=False))[0] is False
    assert gemm._int64_flags(near, weight.t(), dataclasses.replace(config, mask_rows=True))[0] is True
    # the output [M, N], with M padded to whole row tiles
    assert gemm._int64_flags(meta(2**14, k), meta(2**17, k).t(), config) == (False, False, True)
    assert gemm._int64_flags(meta(2**14, k), meta(2**17 - 1, k).t(), config)[2] is False
    assert gemm._int64_flags(meta(2**14 + 1, k), meta(2**17 - 1, k).t(), config)[2] is True


# ---- split-K ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k,split_k,splits", [(200, 2, 2), (256, 4, 4), (100, 8, 2), (1000, 3, 3)])
def test_split_k_is_the_product_within_rounding(k, split_k, splits):
    assert split_plan(k, split_k)[0] == splits
    for dtype in (torch.bfloat16, torch.float16):
        a, b, bias = _operands(6, k, 40, dtype, seed=k, bias_dtype=dtype)
        for out_dtype in (None, torch.float32):
            got = matmul(a, b, bias, split_k=split_k, out_dtype=out_dtype)
            _assert_within_rounding(got, a, b, bias)


def test_split_plan_cuts_k_in_whole_slices_fixed_by_k():
    assert split_plan(5632, 4) == (4, 1408)  # 88 slices: 22 per split
    assert split_plan(14336, 3) == (3, 4800)  # 224 slices: 75, 75, 74
    assert split_plan(100, 8) == (2, 64)  # never an empty split
    assert split_plan(64, 4) == (1, 64) and split_plan(0, 4) == (1, 0) and split_plan(4096, 1) == (1, 4096)


def test_split_k_changes_the_reduction_but_not_with_m(monkeypatch):
    """A split is another sum order (so its bits differ from the unsplit ones), the same for every m: the small-m
    programs-per-split path and the large-m folded path agree bit for bit, whatever tile each m gets."""
    monkeypatch.setattr(gemm, "SPLIT_PROGRAMS_MAX_M", 8)
    a, b, bias = _operands(40, 256, 48, bias_dtype=torch.float32, seed=21)
    assert not launch_plan(8, 256, 48, gemm.INTERPRETER_SMS, 3).fold_splits
    assert launch_plan(9, 256, 48, gemm.INTERPRETER_SMS, 3).fold_splits
    unsplit = matmul(a, b, bias, out_dtype=torch.float32)
    split = matmul(a, b, bias, out_dtype=torch.float32, split_k=3)
    assert not torch.equal(split, unsplit)

    def cycling(x, w, bias_):
        config = ALL_CONFIGS[x.shape[0] % len(ALL_CONFIGS)]
        return matmul(x, w, bias_, out_dtype=torch.float32, split_k=3, config=config)

    assert find_row_variance(cycling, a, b, bias, ms=[1, 3, 7, 8, 9, 16, 17, 33, 39]) is None
    assert find_row_variance(lambda x, w, b_: matmul(x, w, b_, split_k=3), a, b, bias, ms=[1, 8, 9, 40]) is None


def test_split_k_table_applies_per_weight_shape(monkeypatch):
    a, b, _ = _operands(12, 256, 32, seed=22)
    monkeypatch.setitem(gemm.SPLIT_K_TABLE, (256, 32), 4)
    assert torch.equal(matmul(a, b, out_dtype=torch.float32), matmul(a, b, out_dtype=torch.float32, split_k=4))
    assert launch_plan(12, 256, 32, 132).splits == 4 and launch_plan(12, 256, 64, 132).splits == 1
    assert launch_config(600, 4096, 128256, 132) == GemmConfig(128, 256, 8, 3)
    folded = launch_plan(600, 4096, 128256, 132, split_k=2)  # two accumulators: no 128x256 tile
    assert folded.fold_splits and folded.config == GemmConfig(128, 128, 8, 3)
    gemm._check_tables()
    monkeypatch.setitem(gemm.SPLIT_K_TABLE, (256, 32), 0)
    with pytest.raises(RuntimeError, match=r"SPLIT_K_TABLE\[\(256, 32\)\] must be an int >= 1"):
        gemm._check_tables()


def test_split_launch_counts_split_programs_at_small_m():
    # mid-size down at M = 4: 2048 columns in 16-wide tiles are 128 programs; 4 splits make 512, so a wider tile
    # already fills 132 SMs
    unsplit = launch_config(4, 5632, 2048, 132)
    split = launch_plan(4, 5632, 2048, 132, split_k=4)
    assert unsplit.block_n == 16 and split.config.block_n > 16 and split.config.programs(4, 2048) * 4 >= 132


@pytest.mark.parametrize("m", [5, 40])  # programs per split, folded
def test_split_int64_offset_launch_gives_the_int32_launch_bits(monkeypatch, m):
    monkeypatch.setattr(gemm, "SPLIT_PROGRAMS_MAX_M", 8)
    a, b, bias = _operands(m, 200, 40, bias_dtype=torch.bfloat16, seed=23)
    want = matmul(a, b, bias, out_dtype=torch.float32, split_k=2)
    monkeypatch.setattr(gemm, "_int64_flags", lambda *args: (True, True, True))
    assert torch.equal(matmul(a, b, bias, out_dtype=torch.float32, split_k=2), want)


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
        (lambda a, b: matmul(a, b, split_k=0), "split_k must be None"),
        (lambda a, b: matmul(a, b, split_k=2.0), "split_k must be None"),
    ],
)
def test_invalid_inputs_are_refused_with_the_fix(call, message):
    a, b, _ = _operands(4, 64, 16)
    with pytest.raises(ValueError, match=message):
        call(a, b)


@pytest.mark.parametrize("kwargs,message", [
    ({"block_m": 24, "block_n": 16}, "block_m must be a power of two >= 16"),
    ({"block_m": 16, "block_n": 8}, "block_n must be a power of two >= 16"),
    ({"block_m": 16, "block_n": 16, "block_k": 48}, "block_k must be a power of two >= 16"),
    ({"block_m": 16, "block_n": 16, "num_warps": 3}, "num_warps must be a power of two"),
    ({"block_m": 16, "block_n": 16, "group_size_m": 0}, "group_size_m must be >= 1"),
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


def test_up_to_512_rows_wide_weights_take_128x128_and_narrow_ones_keep_their_launch():
    """The 512-row bucket (the verify of 128 requests): 128x128 for gate_up / lm_head, which 128x256 ran 1.35x slower
    on the H200; the mid-size o and qkv keep the launch they had before the bucket."""
    for k, n in ((2048, 11264), (2048, 32000), (4096, 28672)):
        assert launch_config(512, k, n, 132) == GemmConfig(128, 128, 8, 3)
        assert launch_config(513, k, n, 132) == GemmConfig(128, 256, 8, 3)
    for k, n in ((2048, 2048), (2048, 4096)):  # 128x128 gives them < 132 programs; 128x256 fewer still
        assert launch_config(512, k, n, 132) == GemmConfig(64, 128, 4, 4)


def test_split_weights_run_their_splits_as_programs_up_to_256_rows():
    """Folded, the mid-size down and EAGLE fc walked all of K in few programs (about 2x cuBLAS at M = 128 - 256)."""
    for m in (1, 64, 128, 256):
        plan = launch_plan(m, 5632, 2048, 132)
        assert plan.splits == 4 and not plan.fold_splits and plan.config.programs(m, 2048) * 4 >= 132
    assert launch_plan(257, 5632, 2048, 132).fold_splits and launch_plan(257, 4096, 2048, 132).fold_splits
