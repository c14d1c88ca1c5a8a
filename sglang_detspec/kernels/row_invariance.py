"""The row-invariance self-check: does a GEMM give every row the same bits whatever the number of rows?

:func:`find_row_variance` compares ``matmul_fn(a[:m], b, bias)`` with the first ``m`` rows of the full batch's
result, bit for bit, for each ``m`` of a grid; :func:`check_weight_rows` runs it for one served weight with the
plugin's :func:`~sglang_detspec.kernels.batch_invariant_gemm.matmul` (the server's start-up check, which refuses to
serve naming the shape if a row differs); :func:`default_m_grid` and :func:`config_switch_points` choose the m so
that every launch the table can pick is compared with the full batch's.  torch only, plus the GEMM's launch table.
"""

from __future__ import annotations

from typing import Callable, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from . import batch_invariant_gemm as gemm
from .batch_invariant_gemm import LAUNCH_TABLE, launch_plan

__all__ = ["RowVariance", "find_row_variance", "check_weight_rows", "default_m_grid", "config_switch_points"]

class RowVariance(NamedTuple):
    """The first element whose bits at ``m`` rows differ from the full batch's: ``(m, row, col)`` and both values."""

    m: int
    row: int
    col: int
    value_at_m: float
    value_full: float

    def describe(self) -> str:
        return (f"row {self.row}, column {self.col} differs between a batch of {self.m} rows "
                f"({self.value_at_m!r}) and the full batch ({self.value_full!r})")


_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _first_difference(part: torch.Tensor, full: torch.Tensor) -> Optional[Tuple[int, int]]:
    """The first (row, col), in row-major order, where the bit patterns differ (NaN-safe), else None."""
    if part.shape != full.shape or part.dtype != full.dtype:
        return (0, 0)
    bits = _BITS[part.element_size()]
    differs = part.contiguous().view(bits) != full.contiguous().view(bits)
    if not bool(differs.any()):
        return None
    flat = int(torch.argmax(differs.reshape(-1).to(torch.int8)))  # the first True
    return flat // part.shape[1], flat % part.shape[1]


def find_row_variance(matmul_fn: Callable, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      ms: Optional[Iterable[int]] = None) -> Optional[RowVariance]:
    """Compare ``matmul_fn(a[:m], b, bias)`` with the first ``m`` rows of ``matmul_fn(a, b, bias)`` bit for bit,
    for every ``m`` in ``ms`` (default :func:`default_m_grid` up to ``a``'s rows); the first difference, else None.

    ``matmul_fn(a, b, bias)`` is any GEMM (the plugin's ``matmul``, SGLang's deterministic kernel, a
    deliberately M-dependent one in the tests).  One host synchronisation per ``m``: a start-up check, not
    something to capture in a CUDA graph.  A result whose shape or dtype changes with ``m`` is reported at row 0.
    """
    total = a.shape[0]
    if ms is None:
        ms = default_m_grid(total)
    full = matmul_fn(a, b, bias)
    for m in ms:
        if not 1 <= m <= total:
            raise ValueError(f"every m must be in 1..{total} (the rows of a), got {m}")
        part = matmul_fn(a[:m], b, bias)
        where = _first_difference(part, full[:m])
        if where is not None:
            row, col = where
            at_m = float(part[row, col]) if part.shape == full[:m].shape else float("nan")
            return RowVariance(int(m), row, col, at_m, float(full[row, col]))
    return None


def check_weight_rows(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *, max_m: int,
                      ms: Optional[Sequence[int]] = None, seed: int = 0,
                      matmul_fn: Optional[Callable] = None) -> Optional[RowVariance]:
    """The start-up self-check for one served weight ``[N, K]`` (``F.linear``'s layout, passed as ``weight.t()``):
    :func:`find_row_variance` of ``matmul_fn`` (default: the plugin's ``matmul``; the server passes the installed
    ``torch.mm``, i.e. whatever its deterministic mode dispatches to) on ``max_m`` random rows of the weight's
    dtype, over ``ms`` (default: :func:`default_m_grid` with every launch switch up to ``max_m``).  It costs about
    ``sum(ms) * 2 * K * N`` FLOP plus one weight read per m: keep ``max_m`` to the largest batch served."""
    n, k = weight.shape
    g = torch.Generator(device=weight.device).manual_seed(seed)
    a = torch.randn(max_m, k, generator=g, device=weight.device).to(weight.dtype)
    if ms is None:
        ms = default_m_grid(max_m, boundaries=config_switch_points(max_m, k, n, gemm._num_sms(weight.device)))
    return find_row_variance(matmul_fn or gemm.matmul, a, weight.t(), bias, ms)


def default_m_grid(max_m: int, *, dense_up_to: int = 64, boundaries: Sequence[int] = ()) -> List[int]:
    """Row counts that cover every launch ``matmul`` can choose up to ``max_m``: every m in
    ``1..dense_up_to``, every power of two and its neighbours, every bound of :data:`LAUNCH_TABLE` and of
    ``boundaries`` (e.g. :func:`config_switch_points`) with its neighbours, odd values between (about 12 per
    octave), and ``max_m``."""
    if max_m < 1:
        raise ValueError(f"max_m must be >= 1, got {max_m}")
    ms = set(range(1, min(dense_up_to, max_m) + 1))
    edges = [bound for bound, _ in LAUNCH_TABLE if bound != float("inf")] + list(boundaries)
    power = 1
    while power <= max_m:
        edges.append(power)
        power *= 2
    for edge in edges:
        ms.update((int(edge) - 1, int(edge), int(edge) + 1))
    m = dense_up_to + 1
    while m <= max_m:
        ms.add(m | 1)
        m = int(m * 1.06) + 1
    ms.add(max_m)
    return sorted(x for x in ms if 1 <= x <= max_m)


def config_switch_points(max_m: int, k: int, n: int, num_sms: int, split_k: Optional[int] = None) -> List[int]:
    """Every m in ``2..max_m`` at which ``matmul`` launches differently than at ``m - 1`` (another tile or split
    mode; :func:`~sglang_detspec.kernels.batch_invariant_gemm.launch_plan`), for :func:`default_m_grid`: the
    launches at both sides of each switch get checked."""
    points, previous = [], launch_plan(1, k, n, num_sms, split_k)
    for m in range(2, max_m + 1):
        plan = launch_plan(m, k, n, num_sms, split_k)
        if plan != previous:
            points.append(m)
            previous = plan
    return points
