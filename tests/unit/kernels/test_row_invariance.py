"""The row-invariance self-check (kernels/row_invariance.py): it finds a GEMM whose rows depend on the batch.

``find_row_variance`` must return None for a batch-invariant GEMM (tests/unit/kernels/test_batch_invariant_matmul.py
shows the plugin's is) and the first differing (m, row, column) for one that is not: a kernel folding K in 32-wide
slices below 8 rows and a torch GEMM summing K in reverse below 8 rows are both caught, at the element found
independently.  The M grid covers every launch switch.  Under TRITON_INTERPRET=1 on CPU (tests/conftest.py);
torch and Triton only: never imports SGLang.
"""

import dataclasses

import pytest
import torch

from sglang_detspec.kernels import batch_invariant_gemm as gemm
from sglang_detspec.kernels import row_invariance
from sglang_detspec.kernels.batch_invariant_gemm import BLOCK_K, LAUNCH_TABLE, LaunchPlan, launch_config, matmul
from sglang_detspec.kernels.row_invariance import (
    check_weight_rows,
    config_switch_points,
    default_m_grid,
    find_row_variance,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _operands(m, k, n, seed=0, bias=False):
    """``a [m, k]`` and ``b = weight.t()`` of an ``[n, k]`` weight (SGLang's operand), bfloat16; ``bias [n]``."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEV)
    b = torch.randn(n, k, generator=g).to(torch.bfloat16).t().to(DEV)
    return a, b, (torch.randn(n, generator=g).to(torch.bfloat16).to(DEV) if bias else None)


def _block_k_32_below_8_rows(a, b, bias):
    """A deliberately M-dependent reduction: K folded in 32-wide slices when there are fewer than 8 rows."""
    config = launch_config(a.shape[0], a.shape[1], b.shape[1], gemm.INTERPRETER_SMS)
    if a.shape[0] < 8:
        config = dataclasses.replace(config, block_k=32)
    return gemm._launch(a, b, bias, torch.float32, LaunchPlan(config, 1, a.shape[1], False))


def test_self_check_catches_an_m_dependent_kernel():
    a, b, bias = _operands(24, 256, 48, seed=7, bias=True)
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
    assert check_weight_rows(weight, bias, max_m=24) is None  # default grid: every m in 1..24
    seen = []
    real = row_invariance.find_row_variance

    def spy(fn, a, b, bias_, ms):
        seen.append((fn, a.shape, a.dtype, b.shape, b.stride(), list(ms)))
        return real(fn, a, b, bias_, ms)

    monkeypatch.setattr(row_invariance, "find_row_variance", spy)
    assert check_weight_rows(weight, None, max_m=20, ms=[1, 20]) is None
    assert seen == [(matmul, (20, 96), torch.bfloat16, (96, 40), (1, 96), [1, 20])]
    monkeypatch.setattr(gemm, "matmul", _block_k_32_below_8_rows)  # and it does report a variance
    found = check_weight_rows(weight, bias, max_m=12, ms=[12, 9, 5])
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
