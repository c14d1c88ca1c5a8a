"""GPU: the plugin's batch-invariant GEMM and fused RMSNorm are bit-identical row by row for every batch size.

For every weight shape of both benchmark pairs (``sglang_detspec.bench.gemm_bench.PAIRS``: the mid-size pair and the
Llama-3-8B-shaped one, qkv / o / gate_up / down / lm_head and the EAGLE draft's fc with its bias), bfloat16:

* rows of ``matmul(a[:m], w.t())`` equal the first m rows of ``matmul(a, w.t())`` (a of 8192 rows) bit for bit,
  for every m in 1..1024 and a dense grid up to 8192 (every launch switch of the table, +-1);
* the same with ``out_dtype=float32`` (the accumulator itself) over ``default_m_grid`` -- a difference there that
  the bfloat16 rounding hides would still be a rounding difference between tiles;
* the int64-offset variant of the kernel compiles and gives the same bits;
* the small-M launches with ``mask_rows=False`` (row 0 recomputed past M) give the default launch's rows, M 1..64;
* for the long-K weights (down, fc), a 4-way K split (what ``SPLIT_K_TABLE`` gives the mid-size pair's, so the
  default-launch sweep above runs it there too): fp32 accumulators over ``default_m_grid``, across both split modes
  (programs per split with a combine at small M, folded at large M);
* SGLang's deterministic GEMM (``_matmul_persistent_triton``, one 128x128x64 persistent tile) on the same operands,
  where SGLang is importable: reported (equal or not), never a failure -- the contract is the plugin's own
  invariance, equality with SGLang a bonus.
RMSNorm: ``fused_add_rms_norm`` on x[:m] equals the full batch's first m rows for every m in 1..2048, hidden 2048
and 4096, and stays within one bfloat16 rounding of the reference (SGLang's ``forward_native`` arithmetic).

Prints a summary; writes it as JSON to ``$DETSPEC_GPU_OUT`` if set (a ``.json`` path, or a directory that gets
``batch_invariant_gemm.json``).  About a minute on an H100, most of it compiling the table's launches.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from sglang_detspec.bench.gemm_bench import PAIRS
from sglang_detspec.kernels import batch_invariant_gemm as gemm
from sglang_detspec.kernels.batch_invariant_gemm import launch_plan, matmul
from sglang_detspec.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_reference
from sglang_detspec.kernels.row_invariance import config_switch_points, default_m_grid, find_row_variance

pytestmark = [pytest.mark.gpu]  # tests/conftest.py skips these without a GPU, with its GPU_SKIP_REASON

MAX_M = 8192
RMS_ROWS = 2048
DEVICE = torch.device("cuda")
SUMMARY = {"gemm": {}, "rms_norm": {}}
SHAPES = [(pair, shape) for pair, shapes in PAIRS.items() for shape in shapes]


def _ids(item):
    pair, shape = item
    return f"{pair}-{shape.name}"


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _mismatching_ms(fn, a, ms, full):
    """The m in ``ms`` whose ``fn(a[:m])`` differs from ``full[:m]`` in any bit (one host sync at the end)."""
    flags = []
    for m in ms:
        flags.append((_bits(fn(a[:m])) != _bits(full[:m])).any())
    flags = torch.stack(flags).cpu().tolist()
    return [m for m, bad in zip(ms, flags) if bad]


def _sglang_gemm():
    try:
        from sglang.srt.batch_invariant_ops.batch_invariant_ops import _matmul_persistent_triton
    except Exception as e:  # SGLang is optional for this test
        return None, f"{type(e).__name__}: {e}"
    return _matmul_persistent_triton, "sglang.srt.batch_invariant_ops._matmul_persistent_triton"


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    started = time.time()
    yield
    SUMMARY["seconds"] = round(time.time() - started, 1)
    SUMMARY["device"] = torch.cuda.get_device_name() if DEVICE.type == "cuda" else str(DEVICE)
    lines = ["", "batch-invariant ops on " + SUMMARY["device"]]
    for key, r in SUMMARY["gemm"].items():
        lines.append(f"  {key:18s} K={r['k']:6d} N={r['n']:6d} bias={r['bias']!s:5s} "
                     f"bf16 Ms {r['ms_checked']:5d} bad {len(r['bad_ms'])}  fp32 Ms {r['fp32_ms_checked']:4d} "
                     f"bad {len(r['fp32_bad_ms'])}  launches {len(r['launches'])}  vs SGLang: {r['sglang']}")
    for key, r in SUMMARY.get("split_k", {}).items():
        lines.append(f"  split-K {key:18s} S={r['splits']} fp32 Ms {r['ms_checked']:4d} bad {len(r['bad_ms'])}")
    for key, r in SUMMARY.get("masked_rows", {}).items():
        lines.append(f"  masked rows {key:18s} launches {r['launches']} M 1..{MASKED_MAX_M} bad {len(r['bad'])}")
    for key, r in SUMMARY["rms_norm"].items():
        lines.append(f"  rms_norm {key:9s} batches 1..{r['max_rows']} bad {len(r['bad_rows'])}  vs reference: "
                     f"{r['equal_fraction']:.4f} of outputs equal, max diff {r['max_abs_diff']:.3g}")
    lines.append(f"  {SUMMARY['seconds']} s")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print("\n".join(lines))
    else:  # pragma: no cover
        print("\n".join(lines))
    target = os.environ.get("DETSPEC_GPU_OUT")
    if target:
        path = Path(target)
        if path.suffix != ".json":
            path.mkdir(parents=True, exist_ok=True)
            path = path / "batch_invariant_gemm.json"
        path.write_text(json.dumps(SUMMARY, indent=1, default=str))


@pytest.mark.parametrize("item", SHAPES, ids=_ids)
def test_gemm_rows_are_bit_identical_for_every_m(item, monkeypatch):
    pair, shape = item
    device = DEVICE
    g = torch.Generator(device=device).manual_seed(shape.k * 7 + shape.n)
    a = torch.randn(MAX_M, shape.k, device=device, generator=g).to(torch.bfloat16)
    weight = torch.randn(shape.n, shape.k, device=device, generator=g).to(torch.bfloat16)
    b = weight.t()  # SGLang's operand: F.linear -> aten::mm / addmm(bias, x, weight.t())
    bias = torch.randn(shape.n, device=device, generator=g).to(torch.bfloat16) if shape.bias else None
    sms = gemm._num_sms(device)
    switches = config_switch_points(MAX_M, shape.k, shape.n, sms)
    ms = sorted(set(range(1, 1025)) | set(default_m_grid(MAX_M, boundaries=switches)))
    fp32_ms = default_m_grid(MAX_M, boundaries=switches)
    record = dict(pair=pair, k=shape.k, n=shape.n, bias=shape.bias, ms_checked=len(ms),
                  fp32_ms_checked=len(fp32_ms), switch_points=switches,
                  launches=sorted({launch_plan(m, shape.k, shape.n, sms).config.short() for m in ms}))
    SUMMARY["gemm"][f"{pair}-{shape.name}"] = record

    full = matmul(a, b, bias)
    bad = _mismatching_ms(lambda x: matmul(x, b, bias), a, ms, full)
    record["bad_ms"] = bad
    first = None
    if bad:
        first = find_row_variance(matmul, a, b, bias, ms=[bad[0]])
        record["first_difference"] = first.describe() if first else "not reproduced"

    full32 = matmul(a, b, bias, out_dtype=torch.float32)
    bad32 = _mismatching_ms(lambda x: matmul(x, b, bias, out_dtype=torch.float32), a, fp32_ms, full32)
    record["fp32_bad_ms"] = bad32
    del full32

    # the int64-offset variant (compiled only for huge operands otherwise): same bits
    small = a[:300]
    want = matmul(small, b, bias)
    with monkeypatch.context() as patch:
        patch.setattr(gemm, "_int64_flags", lambda *args: (True, True, True))
        got64 = matmul(small, b, bias)
    record["int64_variant_equal"] = bool(torch.equal(_bits(got64), _bits(want)))

    sglang_fn, note = _sglang_gemm()
    if sglang_fn is None:
        record["sglang"] = f"not importable ({note})"
    else:
        verdicts = []
        for m in (1, 7, MAX_M):
            theirs = sglang_fn(a[:m].contiguous(), b, bias)
            equal = (_bits(theirs) == _bits(full[:m])).float().mean().item()
            verdicts.append(f"M={m}: {'equal' if equal == 1.0 else f'{equal:.4f} of elements equal'}")
        record["sglang"] = "; ".join(verdicts)

    assert not bad, f"{pair} {shape.name} ({shape.k} x {shape.n}): rows differ at M = {bad[:10]}: " + (
        first.describe() if first else "")
    assert not bad32, f"{pair} {shape.name}: the fp32 accumulators differ at M = {bad32[:10]} (bf16 outputs agree)"
    assert record["int64_variant_equal"], f"{pair} {shape.name}: the int64-offset kernel gives other bits"


SPLIT_SHAPES = [(pair, shape) for pair, shape in SHAPES if shape.name in ("down", "eagle_fc")]


@pytest.mark.parametrize("item", SPLIT_SHAPES, ids=_ids)
def test_split_k_rows_are_bit_identical_for_every_m(item):
    pair, shape = item
    device = DEVICE
    g = torch.Generator(device=device).manual_seed(shape.k * 11 + shape.n)
    a = torch.randn(MAX_M, shape.k, device=device, generator=g).to(torch.bfloat16)
    b = torch.randn(shape.n, shape.k, device=device, generator=g).to(torch.bfloat16).t()
    bias = torch.randn(shape.n, device=device, generator=g).to(torch.bfloat16) if shape.bias else None
    sms = gemm._num_sms(device)
    ms = default_m_grid(MAX_M, boundaries=config_switch_points(MAX_M, shape.k, shape.n, sms, split_k=4))
    plans = {launch_plan(m, shape.k, shape.n, sms, 4) for m in ms}
    assert {p.fold_splits for p in plans} == {True, False}  # both split modes are compared

    def split(x):
        return matmul(x, b, bias, out_dtype=torch.float32, split_k=4)

    full = split(a)
    bad = _mismatching_ms(split, a, ms, full)
    SUMMARY.setdefault("split_k", {})[f"{pair}-{shape.name}"] = dict(
        splits=plans.pop().splits, ms_checked=len(ms), bad_ms=bad[:20])
    assert not bad, f"{pair} {shape.name} split 4: rows differ at M = {bad[:10]}"


MASKED_MAX_M = 64


@pytest.mark.parametrize("item", SHAPES, ids=_ids)
def test_unmasked_row_launches_give_the_default_rows(item):
    """``GemmConfig.mask_rows=False`` (row 0 recomputed in the rows past M instead of zeros loaded) for every small-M
    launch of the table: each m in 1..64 gives the rows of the default launch on the full batch, bit for bit."""
    import dataclasses

    pair, shape = item
    g = torch.Generator(device=DEVICE).manual_seed(shape.k * 13 + shape.n)
    a = torch.randn(MASKED_MAX_M, shape.k, device=DEVICE, generator=g).to(torch.bfloat16)
    b = torch.randn(shape.n, shape.k, device=DEVICE, generator=g).to(torch.bfloat16).t()
    bias = torch.randn(shape.n, device=DEVICE, generator=g).to(torch.bfloat16) if shape.bias else None
    configs = sorted({dataclasses.replace(c, mask_rows=False) for bound, cands in gemm.LAUNCH_TABLE if bound <= 32
                      for c in cands}, key=lambda c: c.short())
    full = matmul(a, b, bias)
    bad = []
    for config in configs:
        ms = list(range(1, MASKED_MAX_M + 1))
        bad += [f"{config.short()} M={m}" for m in _mismatching_ms(
            lambda x, config=config: matmul(x, b, bias, config=config), a, ms, full)]
    SUMMARY.setdefault("unmasked_rows", {})[f"{pair}-{shape.name}"] = dict(launches=len(configs), bad=bad[:20])
    assert not bad, f"{pair} {shape.name}: unmasked-row launches differ: {bad[:10]}"


@pytest.mark.parametrize("hidden", [2048, 4096])
def test_rms_norm_rows_are_bit_identical_for_every_batch(hidden):
    device = DEVICE
    g = torch.Generator(device=device).manual_seed(hidden)
    rows = RMS_ROWS
    x = (torch.randn(rows, hidden, device=device, generator=g) * 3).to(torch.bfloat16)
    residual = torch.randn(rows, hidden, device=device, generator=g).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, device=device, generator=g)).to(torch.bfloat16)
    full_out, full_res = fused_add_rms_norm(x, residual, weight, 1e-6)
    flags = []
    for m in range(1, rows + 1):
        out, res = fused_add_rms_norm(x[:m], residual[:m], weight, 1e-6)
        flags.append((_bits(out) != _bits(full_out[:m])).any() | (_bits(res) != _bits(full_res[:m])).any())
    bad = [m for m, f in zip(range(1, rows + 1), torch.stack(flags).cpu().tolist()) if f]
    want_out, want_res = fused_add_rms_norm_reference(x, residual, weight, 1e-6)
    diff = (full_out.float() - want_out.float()).abs()
    SUMMARY["rms_norm"][f"h{hidden}"] = dict(max_rows=rows, bad_rows=bad[:20],
                                              equal_fraction=(full_out == want_out).float().mean().item(),
                                              max_abs_diff=diff.max().item(),
                                              residual_equal=bool(torch.equal(full_res, want_res)))
    assert not bad, f"hidden {hidden}: RMSNorm rows differ between batch sizes, first at {bad[:10]}"
    assert torch.equal(full_res, want_res)
    torch.testing.assert_close(full_out.float(), want_out.float(), rtol=torch.finfo(torch.bfloat16).eps, atol=1e-6)
