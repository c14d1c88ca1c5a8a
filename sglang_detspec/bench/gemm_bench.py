"""Per-op GEMM benchmark: the plugin's batch-invariant GEMM vs SGLang's deterministic GEMM vs cuBLAS.

    python scripts/bench/bench_gemm.py --out DIR [--quick] [--pairs midsize llama8b] [--ms 1 2 4 ...] [--split-k S]
    python scripts/bench/bench_gemm.py --out DIR --tune [--quick] [--split-k S]

Needs a CUDA GPU; SGLang is optional (without it the ``sglang`` column is empty).  For every weight shape of both
benchmark pairs (:data:`PAIRS`: the mid-size pair of :mod:`sglang_detspec.models.midsize_models` and a Llama-3-8B-shaped
one; qkv, o, gate_up, down, lm_head and the EAGLE draft's ``fc``, which has a bias) and every M in :data:`MS`:

* ``plugin``: :func:`sglang_detspec.kernels.batch_invariant_gemm.matmul` (its default launch table);
* ``sglang``: SGLang's ``_matmul_persistent_triton`` -- what ``matmul_persistent`` runs without DeepGEMM;
* ``cublas``: ``torch.mm`` / ``torch.addmm`` (SGLang's batch-invariant mode is off in this process).

Each case is captured in a CUDA graph and replayed (:func:`sglang_detspec.bench.sampler_bench.graph_time_us`); every call
reads another copy of the weight (at least 160 MB of copies, over three times the 50 MB L2 of an H100 / H200), as
each layer of a real forward reads its own weight, so small weights are timed from HBM, not L2.  Reported: the
median per-call µs over the replays with min and max, the ratios plugin / cuBLAS and SGLang / cuBLAS, whether
the plugin's output equals SGLang's bit for bit, and the bandwidth floor (bytes of ``a``, ``b`` and ``c`` over the
measured copy bandwidth).  Goal (issue 32): plugin within 1.25x of cuBLAS at every M in 1 - 512.
Writes ``gemm_bench.csv``, ``gemm_bench.json`` and, if matplotlib is importable, ``gemm_bench_<pair>.png``.

``--tune``: for each shape and M bucket (:data:`TUNE_BUCKETS`) times a candidate set of launches (all with
``BLOCK_K`` = 64; bias-free, the launch does not depend on it), checks each candidate's output equals the default
launch's bit for bit (the same reduction: it must), and prints the fastest per bucket as a ``SHAPE_LAUNCH_TABLE``
literal to paste into kernels/batch_invariant_gemm.py (also ``gemm_tune_table.py`` and ``gemm_tune.csv``).
``--split-k S`` runs either mode with the plugin's K split forced to S for every shape (a split is a property of
the weight: compare runs, then name the shapes that gain in ``SPLIT_K_TABLE``; tune tiles with the split in use).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from sglang_detspec.bench.sampler_bench import copy_bandwidth_gbs, graph_time_us
from sglang_detspec.kernels import batch_invariant_gemm
from sglang_detspec.kernels.batch_invariant_gemm import BLOCK_K, GemmConfig, launch_plan, matmul
from sglang_detspec.models.midsize_models import MidsizeShape

__all__ = ["GemmShape", "llama_gemm_shapes", "PAIRS", "MS", "TUNE_BUCKETS", "tune_candidates", "goal_check", "ratio_table",
           "format_shape_table", "run", "tune", "main"]


class GemmShape(NamedTuple):
    """One weight of a Llama-shaped model as the GEMM sees it: ``a [M, k] @ weight.t() [k, n] (+ bias [n])``."""

    name: str
    k: int
    n: int
    bias: bool = False


def llama_gemm_shapes(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                      vocab: int) -> Tuple[GemmShape, ...]:
    """The GEMMs of one decode step of a Llama-shaped target and its one-layer EAGLE draft (``fc`` has a bias:
    SGLang's ``LlamaForCausalLMEagle`` builds it with ``torch.nn.Linear``'s default)."""
    return (
        GemmShape("qkv", hidden, (heads + 2 * kv_heads) * head_dim),
        GemmShape("o", heads * head_dim, hidden),
        GemmShape("gate_up", hidden, 2 * intermediate),
        GemmShape("down", intermediate, hidden),
        GemmShape("lm_head", hidden, vocab),
        GemmShape("eagle_fc", 2 * hidden, hidden, bias=True),
    )


_MID = MidsizeShape()
PAIRS: Dict[str, Tuple[GemmShape, ...]] = {
    "midsize": llama_gemm_shapes(_MID.hidden, _MID.heads, _MID.kv_heads, _MID.head_dim, _MID.intermediate,
                                 _MID.vocab),
    "llama8b": llama_gemm_shapes(4096, 32, 8, 128, 14336, 128256),
}
MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
QUICK_MS = (1, 16, 256)
GOAL_RATIO, GOAL_MAX_M = 1.25, 512
TUNE_BUCKETS = (16, 32, 64, 128, 256, 512)
_L2_FLUSH_BYTES = 160 * 2**20
METHODS = ("cublas", "plugin", "sglang")


def load_sglang_gemm() -> Tuple[Optional[Callable], str]:
    """SGLang's deterministic Triton GEMM ``(a, b, bias)`` and a note, or ``(None, why)``."""
    try:
        from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio
    except Exception as e:  # SGLang is optional here
        return None, f"SGLang's batch_invariant_ops is not importable ({type(e).__name__}: {e})"
    if bio.is_batch_invariant_mode_enabled():
        raise RuntimeError("SGLang's batch-invariant mode is on in this process: torch.mm would not be cuBLAS")
    return bio._matmul_persistent_triton, "sglang.srt.batch_invariant_ops._matmul_persistent_triton"


def _cublas(a, b, bias):
    return torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)


def _plugin(config: Optional[GemmConfig] = None, split_k: Optional[int] = None):
    def fn(a, b, bias):
        return matmul(a, b, bias, config=config, split_k=split_k)
    return fn


def _describe(plan) -> str:
    split = f" split {plan.splits}{' folded' if plan.fold_splits else ''}" if plan.splits > 1 else ""
    return plan.config.short() + split


class _Operands:
    """``a [m, k]`` and enough copies of an ``[n, k]`` weight (as ``weight.t()`` views) to flush the L2."""

    def __init__(self, shape: GemmShape, m: int, device, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        weight_bytes = shape.k * shape.n * 2
        copies = max(1, min(16, math.ceil(_L2_FLUSH_BYTES / weight_bytes)))
        self.a = torch.randn(m, shape.k, device=device, generator=g).to(torch.bfloat16)
        self.weights = [(torch.randn(shape.n, shape.k, device=device, generator=g) * shape.k**-0.5)
                        .to(torch.bfloat16).t() for _ in range(copies)]
        self.bias = torch.randn(shape.n, device=device, generator=g).to(torch.bfloat16) if shape.bias else None
        self.calls = copies * math.ceil(8 / copies)  # whole cycles through the copies, at least 8 calls

    def time_us(self, fn: Callable, replays: int) -> List[float]:
        turn = [0]

        def rotating(a):
            b = self.weights[turn[0] % len(self.weights)]
            turn[0] += 1
            return fn(a, b, self.bias)

        return graph_time_us(rotating, (self.a,), calls_per_graph=self.calls, replays=replays)


def _summary(times: Sequence[float]) -> Dict[str, float]:
    return dict(median=statistics.median(times), min=min(times), max=max(times))


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.view(torch.int16), y.view(torch.int16))


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def run(out_dir: Path, pairs: Sequence[str] = tuple(PAIRS), ms: Sequence[int] = MS, replays: int = 20,
        log=print, device: Optional[torch.device] = None, split_k: Optional[int] = None) -> List[Dict]:
    device = device or torch.device("cuda")
    out_dir.mkdir(parents=True, exist_ok=True)
    sglang_fn, sglang_note = load_sglang_gemm()
    log(f"sglang column: {sglang_note}")
    bandwidth = copy_bandwidth_gbs(device)
    sms = batch_invariant_gemm._num_sms(device)
    rows = []
    for pair in pairs:
        for shape in PAIRS[pair]:
            for m in ms:
                ops = _Operands(shape, m, device)
                b0 = ops.weights[0]
                row = dict(pair=pair, shape=shape.name, k=shape.k, n=shape.n, bias=shape.bias, m=m,
                           plugin_config=_describe(launch_plan(m, shape.k, shape.n, sms, split_k)),
                           floor_us=round((shape.k * shape.n + m * shape.k + m * shape.n) * 2 / bandwidth / 1e3, 2))
                methods = {"cublas": _cublas, "plugin": _plugin(split_k=split_k), "sglang": sglang_fn}
                for name, fn in methods.items():
                    stats = _summary(ops.time_us(fn, replays)) if fn is not None else None
                    for key in ("median", "min", "max"):
                        row[f"{name}_{key}_us"] = round(stats[key], 2) if stats else None
                cublas = row["cublas_median_us"]
                row["plugin_over_cublas"] = round(row["plugin_median_us"] / cublas, 3)
                row["sglang_over_cublas"] = round(row["sglang_median_us"] / cublas, 3) if sglang_fn else None
                row["plugin_equals_sglang"] = (_same_bits(matmul(ops.a, b0, ops.bias, split_k=split_k),
                                                          sglang_fn(ops.a, b0, ops.bias)) if sglang_fn else None)
                rows.append(row)
                log(_table_line(row))
                del ops
            torch.cuda.empty_cache()
    for line in ratio_table(rows):
        log(line)
    met, lines = goal_check(rows)
    for line in lines:
        log(line)
    _write(out_dir, rows, _meta(device, dict(bandwidth_gbs=round(bandwidth, 1), sms=sms, sglang=sglang_note,
                                             goal_met=met, goal_lines=lines, replays=replays, split_k=split_k)), log)
    return rows


def _table_line(row: Dict) -> str:
    sg = (f"sglang {row['sglang_median_us']:9.2f} ({row['sglang_over_cublas']:5.2f}x)"
          if row["sglang_median_us"] is not None else "sglang        -")
    return (f"{row['pair']:8s} {row['shape']:8s} {row['k']:6d}x{row['n']:<6d} M={row['m']:5d}  "
            f"cublas {row['cublas_median_us']:9.2f}  plugin {row['plugin_median_us']:9.2f} "
            f"({row['plugin_over_cublas']:5.2f}x)  {sg}  floor {row['floor_us']:8.2f}  [{row['plugin_config']}]")


def ratio_table(rows: Sequence[Dict]) -> List[str]:
    """Median-time ratios to cuBLAS, one line per shape and one column per M: plugin, then SGLang."""
    ms = sorted({r["m"] for r in rows})
    shapes = list(dict.fromkeys((r["pair"], r["shape"]) for r in rows))
    cell = {(r["pair"], r["shape"], r["m"]): r for r in rows}
    lines = []
    for key, title in (("plugin_over_cublas", "plugin / cuBLAS"), ("sglang_over_cublas", "SGLang / cuBLAS")):
        lines.append(f"{title:20s}" + "".join(f"{'M=' + str(m):>8s}" for m in ms))
        for pair, shape in shapes:
            values = [cell.get((pair, shape, m), {}).get(key) for m in ms]
            lines.append(f"{pair + ' ' + shape:20s}" + "".join("       -" if v is None else f"{v:8.2f}" for v in values))
    return lines


def goal_check(rows: Sequence[Dict], ratio: float = GOAL_RATIO, max_m: int = GOAL_MAX_M) -> Tuple[bool, List[str]]:
    """Issue 32's GEMM goal on the measured rows: plugin / cuBLAS <= ``ratio`` at every M in 1..``max_m``."""
    judged = [r for r in rows if 1 <= r["m"] <= max_m]
    misses = [r for r in judged if r["plugin_over_cublas"] > ratio]
    lines = [f"goal: plugin within {ratio}x of cuBLAS at every M in 1-{max_m}: "
             + ("no rows in range" if not judged else "MET" if not misses else
                f"MISSED at {len(misses)} of {len(judged)} (shape, M) points")]
    for r in misses:
        lines.append(f"  {r['pair']} {r['shape']} ({r['k']} x {r['n']}) M={r['m']}: {r['plugin_over_cublas']}x "
                     f"[{r['plugin_config']}]")
    return bool(judged) and not misses, lines


def _meta(device: torch.device, extra: Dict) -> Dict:
    import triton

    return dict(device=_device_name(device), torch=torch.__version__, triton=triton.__version__,
                split_programs_max_m=batch_invariant_gemm.SPLIT_PROGRAMS_MAX_M,
                time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra)


def _write_csv(path: Path, rows: Sequence[Dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


def _write(out_dir: Path, rows: List[Dict], meta: Dict, log) -> None:
    csv_path = out_dir / "gemm_bench.csv"
    _write_csv(csv_path, rows)
    (out_dir / "gemm_bench.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    log(f"wrote {csv_path} and gemm_bench.json")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # matplotlib is an optional extra (pip install sglang-detspec[bench])
        log(f"matplotlib is not importable ({type(e).__name__}: {e}); skipped the PNG plots, the CSV is complete")
        return
    for pair in sorted({r["pair"] for r in rows}):
        shapes = [s.name for s in PAIRS[pair] if any(r["pair"] == pair and r["shape"] == s.name for r in rows)]
        cols = 3
        fig, axes = plt.subplots(math.ceil(len(shapes) / cols), cols, figsize=(5 * cols, 3.8 * math.ceil(len(shapes) / cols)),
                                 squeeze=False)
        for ax, name in zip(axes.flat, shapes):
            sel = sorted((r for r in rows if r["pair"] == pair and r["shape"] == name), key=lambda r: r["m"])
            for method in METHODS:
                pts = [(r["m"], r[f"{method}_median_us"]) for r in sel if r[f"{method}_median_us"] is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
            ax.plot([r["m"] for r in sel], [r["floor_us"] for r in sel], ls="--", color="gray", label="bandwidth floor")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name}: K={sel[0]['k']}, N={sel[0]['n']}")
            ax.set_xlabel("M (rows)")
            ax.set_ylabel("median µs per call")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(shapes):]:
            ax.set_visible(False)
        fig.suptitle(f"GEMM, {pair} pair, {meta['device']} (CUDA-graph replay, weights from HBM)")
        fig.tight_layout()
        png = out_dir / f"gemm_bench_{pair}.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        log(f"wrote {png}")


# ---- tuning ------------------------------------------------------------------------------------------------------


def tune_candidates(bucket: int, quick: bool = False) -> List[GemmConfig]:
    """The launches ``--tune`` times for M up to ``bucket`` (every one with ``BLOCK_K`` = 64)."""
    if bucket <= 16:
        grid = [(16, bn, w, s) for bn in (16, 32, 64, 128) for w in (2, 4) for s in (4, 6)]
    elif bucket <= 32:
        grid = [(bm, bn, 4, s) for bm in (16, 32) for bn in (16, 32, 64, 128) for s in (4, 6)]
    elif bucket <= 64:
        grid = [(bm, bn, 4, s) for bm in (32, 64) for bn in (32, 64, 128) for s in (3, 5)]
    elif bucket <= 128:
        grid = [(bm, bn, w, s) for bm in (64, 128) for bn in (64, 128) for w in (4, 8) for s in (3, 4)]
    else:  # 128x256 with 4 warps is left out: ptxas spills ~1.8 kB per thread there (Triton 3.6, sm_90a)
        grid = [(bm, bn, w, s) for bm in (64, 128) for bn in (64, 128, 256) for w in (4, 8) for s in (3, 4)
                if (bm, bn, w) != (128, 256, 4)]
    if quick:
        grid = grid[::4]
    configs = [GemmConfig(bm, bn, w, s) for bm, bn, w, s in grid]
    if bucket <= 32:  # small M: also the launches that recompute row 0 in the rows past M (GemmConfig.mask_rows)
        configs += [dataclasses.replace(c, mask_rows=False) for c in configs]
    return configs


def format_shape_table(best: Dict[Tuple[int, int], List[Tuple[int, GemmConfig]]]) -> str:
    """``best`` as a ``SHAPE_LAUNCH_TABLE`` literal (the form kernels/batch_invariant_gemm.py declares)."""
    lines = ["SHAPE_LAUNCH_TABLE: Dict[Tuple[int, int], Tuple[Tuple[float, GemmConfig], ...]] = {"]
    for (k, n), entries in sorted(best.items()):
        for _, c in entries:
            if c.block_k != BLOCK_K:
                raise ValueError(f"a tuned launch for ({k}, {n}) has block_k {c.block_k}, not {BLOCK_K}")
        body = ", ".join(f"({bound}, GemmConfig({c.block_m}, {c.block_n}, {c.num_warps}, {c.num_stages}"
                         + (f", group_size_m={c.group_size_m}" if c.group_size_m != 8 else "")
                         + ("" if c.mask_rows else ", mask_rows=False") + "))"
                         for bound, c in entries)
        lines.append(f"    ({k}, {n}): ({body},),")
    lines.append("}")
    return "\n".join(lines)


def tune(out_dir: Path, pairs: Sequence[str] = tuple(PAIRS), quick: bool = False, replays: int = 10,
         log=print, device: Optional[torch.device] = None, split_k: Optional[int] = None,
         buckets: Optional[Sequence[int]] = None) -> str:
    device = device or torch.device("cuda")
    out_dir.mkdir(parents=True, exist_ok=True)
    sms = batch_invariant_gemm._num_sms(device)
    if buckets is None:
        buckets = TUNE_BUCKETS[:2] if quick else TUNE_BUCKETS
    shapes = {(s.k, s.n): s for pair in pairs for s in PAIRS[pair]}  # one entry per weight shape
    rows, best, broken = [], {}, []
    for (k, n), shape in sorted(shapes.items()):
        for bucket in buckets:
            ops = _Operands(shape._replace(bias=False), bucket, device)
            default = launch_plan(bucket, k, n, sms, split_k).config
            want = matmul(ops.a, ops.weights[0], split_k=split_k)
            cublas = statistics.median(ops.time_us(_cublas, replays))
            timed = []
            for config in [default] + [c for c in tune_candidates(bucket, quick) if c != default]:
                try:
                    same = _same_bits(matmul(ops.a, ops.weights[0], config=config, split_k=split_k), want)
                    us = _summary(ops.time_us(_plugin(config, split_k), replays))
                except Exception as e:  # a launch Triton cannot build here (shared memory, registers)
                    log(f"  {shape.name} ({k} x {n}) M={bucket} {config.short()}: skipped ({type(e).__name__})")
                    continue
                if not same:
                    broken.append(f"{shape.name} ({k} x {n}) M={bucket} {config.short()}")
                timed.append((us["median"], config, same))
                rows.append(dict(shape=shape.name, k=k, n=n, bucket=bucket, config=config.short(),
                                 is_default=config == default, median_us=round(us["median"], 2),
                                 min_us=round(us["min"], 2), max_us=round(us["max"], 2), bit_identical=same,
                                 cublas_us=round(cublas, 2)))
            fastest, config, _ = min((t for t in timed if t[2]), key=lambda t: t[0])
            default_us = next(t[0] for t in timed if t[1] == default)
            best.setdefault((k, n), []).append((bucket, config))
            log(f"{shape.name:8s} {k:6d}x{n:<6d} M<={bucket:4d}: best {config.short():24s} {fastest:8.2f} us "
                f"(default {default_us:8.2f}, cuBLAS {cublas:8.2f}: {fastest / cublas:4.2f}x)")
            del ops
        torch.cuda.empty_cache()
        _write_csv(out_dir / "gemm_tune.csv", rows)  # after every shape: a stopped run keeps what it timed
    table = format_shape_table(best)
    meta = _meta(device, dict(sms=sms, replays=replays, broken=broken, split_k=split_k))
    (out_dir / "gemm_tune_table.py").write_text(f"# {json.dumps(meta)}\n{table}\n")
    log(table)
    if broken:
        log("NOT BIT-IDENTICAL to the default launch (left out of the table; the tiles round differently):")
        for line in broken:
            log(f"  {line}")
    log(f"wrote {out_dir / 'gemm_tune.csv'} and gemm_tune_table.py")
    return table


PROBE_MS = (1, 2, 4, 8, 16)


def probe_small_m(out_dir: Path, pairs: Sequence[str] = tuple(PAIRS), replays: int = 20, log=print,
                  device: Optional[torch.device] = None) -> List[Dict]:
    """Where M far below the row tile costs time: for every shape and M in :data:`PROBE_MS`, the default launch
    (rows past M loaded as zeros), the same launch recomputing row 0 there (``mask_rows=False``) and cuBLAS, with
    the two launches' bits compared.  One launch serves M = 1 .. 16, so a time that grows as M falls is the rows
    past M."""
    device = device or torch.device("cuda")
    out_dir.mkdir(parents=True, exist_ok=True)
    sms = batch_invariant_gemm._num_sms(device)
    rows = []
    for pair in pairs:
        for shape in PAIRS[pair]:
            for m in PROBE_MS:
                ops = _Operands(shape, m, device)
                config = launch_plan(m, shape.k, shape.n, sms).config
                masked = dataclasses.replace(config, mask_rows=True)
                unmasked = dataclasses.replace(config, mask_rows=False)
                row = dict(pair=pair, shape=shape.name, k=shape.k, n=shape.n, m=m, config=config.short(),
                           masked_equal=_same_bits(matmul(ops.a, ops.weights[0], ops.bias, config=masked),
                                                   matmul(ops.a, ops.weights[0], ops.bias, config=unmasked)))
                for name, fn in (("cublas", _cublas), ("unmasked", _plugin(unmasked)), ("masked", _plugin(masked))):
                    row[f"{name}_us"] = round(statistics.median(ops.time_us(fn, replays)), 2)
                rows.append(row)
                log(f"{pair:8s} {shape.name:8s} {shape.k:6d}x{shape.n:<6d} M={m:3d} [{row['config']}]  cublas "
                    f"{row['cublas_us']:8.2f}  unmasked {row['unmasked_us']:8.2f}  masked {row['masked_us']:8.2f}  "
                    f"{'same bits' if row['masked_equal'] else 'BITS DIFFER'}")
                del ops
            torch.cuda.empty_cache()
    _write_csv(out_dir / "gemm_probe_small_m.csv", rows)
    (out_dir / "gemm_probe_small_m.json").write_text(json.dumps(dict(meta=_meta(device, dict(sms=sms, replays=replays)),
                                                                     rows=rows), indent=1) + "\n")
    log(f"wrote {out_dir / 'gemm_probe_small_m.csv'}")
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_gemm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory (CSV, JSON, PNG)")
    ap.add_argument("--quick", action="store_true", help=f"M = {list(QUICK_MS)}, 5 replays (with --tune: 2 buckets, "
                                                         "a quarter of the candidates)")
    ap.add_argument("--tune", action="store_true", help="sweep launches per shape and M bucket; print the best table")
    ap.add_argument("--probe-small-m", action="store_true",
                    help=f"M = {list(PROBE_MS)} on one launch each: rows past M masked (the default) vs recomputing row 0 "
                         "vs cuBLAS")
    ap.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=list(PAIRS))
    ap.add_argument("--ms", type=int, nargs="+", default=None,
                    help=f"default {list(MS)}; with --tune, the M buckets to tune (default {list(TUNE_BUCKETS)})")
    ap.add_argument("--replays", type=int, default=None, help="CUDA-graph replays per case (default 20; tune 10)")
    ap.add_argument("--split-k", type=int, default=None, metavar="S",
                    help="force a K split of S for every shape's plugin launch (default: SPLIT_K_TABLE's, none)")
    ap.add_argument("--split-programs-max-m", type=int, default=None, metavar="M",
                    help="A/B knob: run split-K weights as programs of their own up to M rows, folded above "
                         f"(default: the kernel's SPLIT_PROGRAMS_MAX_M, {batch_invariant_gemm.SPLIT_PROGRAMS_MAX_M})")
    args = ap.parse_args(argv)
    if args.split_programs_max_m is not None:
        if args.split_programs_max_m < 0:
            ap.error("--split-programs-max-m: M must be >= 0 (0: always folded)")
        batch_invariant_gemm.SPLIT_PROGRAMS_MAX_M = args.split_programs_max_m
    if args.ms is not None and min(args.ms) < 1:
        ap.error("--ms: every M must be >= 1")
    if args.tune and args.ms is not None and list(args.ms) != sorted(set(args.ms)):
        ap.error("--ms with --tune: the buckets must be increasing, each once (e.g. --ms 64 128 256 512)")
    if args.split_k is not None and args.split_k < 1:
        ap.error("--split-k: S must be >= 1")
    if not torch.cuda.is_available():
        print("bench_gemm: no CUDA GPU visible; the benchmark measures CUDA-graph replays on a GPU "
              "(run scripts/run_gpu_checks.sh on a GPU machine)", file=sys.stderr)
        return 2
    if args.probe_small_m:
        probe_small_m(args.out, pairs=args.pairs, replays=args.replays or 20)
        return 0
    if args.tune:
        tune(args.out, pairs=args.pairs, quick=args.quick, replays=args.replays or (5 if args.quick else 10),
             split_k=args.split_k, buckets=args.ms)
        return 0
    ms = args.ms or (QUICK_MS if args.quick else MS)
    run(args.out, pairs=args.pairs, ms=ms, replays=args.replays or (5 if args.quick else 20), split_k=args.split_k)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
