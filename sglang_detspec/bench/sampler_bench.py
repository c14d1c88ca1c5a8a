"""Sampler benchmark: the fused seeded kernel vs SGLang 0.5.23's unfused seeded path vs the unseeded race.

    python scripts/bench/bench_sampler.py --out DIR [--quick]        (or: sglang-detspec bench ...)

Needs a CUDA GPU; SGLang is not needed (both comparison paths are re-implemented here):

* ``upstream_seeded``: SGLang 0.5.23 ``fast_sample(probs, 1, sampling_seed=, positions=, draft_step=)``
  step by step (:func:`sglang_detspec.bench.upstream_replica.upstream_seeded_fast_sample`: upstream's Triton
  ``murmur_hash32`` writing ``[B, V]`` uint32, then float64 torch ops and ``argmax``).
* ``unseeded``: the unseeded exponential race (``empty_like(probs).exponential_(); clamp_min_(tiny);
  probs / q; argmax``; upstream uses its own ``row_argmax`` kernel, here ``torch.argmax``).
* ``fused``: :func:`sglang_detspec.kernels.seeded_draft_sample`.

Each method is captured in a CUDA graph (``--calls-per-graph`` calls back to back) and replayed; the
median per-call time over the replays is reported, with the effective read bandwidth of ``probs``
(``B*V*4`` bytes per call) as a percentage of the device-to-device copy bandwidth measured at start
(read + write bytes of a 1 GiB ``copy_``), the peak extra memory of one eager call, and the ratios to
the other two paths.  The fused kernel's tokens are compared with the upstream path's on the
benchmark inputs (``mismatches`` column; must be 0).  Writes ``sampler_bench.csv`` and, if matplotlib
is importable, ``sampler_bench.png`` to ``--out``.  The numbers include L2 residency effects (small
``B*V`` fits in the 50 MB L2 across back-to-back calls), the same for all three methods.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from sglang_detspec.bench.upstream_replica import upstream_seeded_fast_sample

VOCABS = (151936, 163840)
BATCHES = (1, 8, 32, 128, 256)
METHODS = ("fused", "upstream_seeded", "unseeded")
# Bars from the project issue: (batch, vocab) -> max microseconds, set for an H200, so they gate only a card whose name
# holds BARS_CARD (an H100 SXM ran B = 128 at 40.66 us, 2026-12-06: a 2% clock difference is not a regression); the
# peak extra memory at B = 128 and the token mismatches gate every card.
BARS_US = {(128, 163840): 40.0, (1, 163840): 10.0}
BARS_CARD = "H200"
BAR_PEAK_MIB = {(128, 163840): 1.0}


def unseeded_fast_sample(probs, sampling_seed=None, positions=None, draft_step=0):
    """Upstream's unseeded exponential race (``torch.argmax`` in place of sglang's ``row_argmax``)."""
    q = torch.empty_like(probs, dtype=torch.float32).exponential_(1.0)
    q.clamp_min_(torch.finfo(torch.float32).tiny)
    scores = probs.float() / q
    sample_index = scores.argmax(dim=-1, keepdim=True)
    return probs.gather(1, sample_index), sample_index


def _fused(probs, sampling_seed, positions, draft_step=0):
    from sglang_detspec.kernels import seeded_draft_sample

    return seeded_draft_sample(probs, sampling_seed, positions, draft_step)


def method_fn(name: str) -> Callable:
    return {"fused": _fused, "upstream_seeded": upstream_seeded_fast_sample, "unseeded": unseeded_fast_sample}[name]


def copy_bandwidth_gbs(device, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s, counting read + write bytes."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times) / 1e9


def peak_extra_mib(fn: Callable, args) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn(*args)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def graph_time_us(fn: Callable, args, calls_per_graph: int, replays: int) -> List[float]:
    """Per-call microseconds of CUDA-graph replays (each replay runs ``calls_per_graph`` calls)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up: compile, autotune-free, allocator
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls_per_graph):
            fn(*args)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        per_call.append(a.elapsed_time(b) * 1e3 / calls_per_graph)
    del g
    return per_call


def make_inputs(batch: int, vocab: int, device, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(batch, vocab, device=device, generator=gen) * 3.0
    probs = torch.softmax(logits, dim=-1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (batch,), device=device, dtype=torch.int64, generator=gen)
    positions = torch.randint(0, 2**31 - 1, (batch,), device=device, dtype=torch.int64, generator=gen)
    return probs, seeds, positions


def run(out_dir: Path, quick: bool = False, calls_per_graph: int = 10, replays: Optional[int] = None,
        vocabs=VOCABS, batches=BATCHES, log=print) -> List[Dict]:
    if not torch.cuda.is_available():
        raise RuntimeError("the sampler benchmark needs a CUDA GPU")
    device = torch.device("cuda")
    replays = replays or (20 if quick else 100)
    out_dir.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth_gbs(device, nbytes=(1 << 28) if quick else (1 << 30))
    log(f"device: {torch.cuda.get_device_name()}  copy bandwidth (read+write): {bw:.0f} GB/s")
    log(f"{'V':>7} {'B':>4} {'method':<16} {'median_us':>10} {'%copyBW':>8} {'peakMiB':>9} "
        f"{'x_up_seeded':>11} {'x_unseeded':>10} {'mismatch':>8}")
    rows: List[Dict] = []
    for vocab in vocabs:
        for batch in batches:
            probs, seeds, positions = make_inputs(batch, vocab, device)
            args = (probs, seeds, positions, 1)
            res = {}
            for m in METHODS:
                fn = method_fn(m)
                t = graph_time_us(fn, args, calls_per_graph, replays)
                res[m] = dict(median_us=statistics.median(t), p10_us=sorted(t)[len(t) // 10],
                              p90_us=sorted(t)[(9 * len(t)) // 10], peak=peak_extra_mib(fn, args))
            up_idx = upstream_seeded_fast_sample(*args)[1]
            fu_idx = _fused(*args)[1]
            mism = int((up_idx != fu_idx).sum())
            for m in METHODS:
                r = res[m]
                gbs = batch * vocab * 4 / (r["median_us"] * 1e-6) / 1e9
                row = dict(vocab=vocab, batch=batch, method=m, median_us=round(r["median_us"], 3),
                           p10_us=round(r["p10_us"], 3), p90_us=round(r["p90_us"], 3),
                           pct_copy_bw=round(100 * gbs / bw, 2), peak_extra_mib=round(r["peak"], 3),
                           ratio_vs_upstream_seeded=round(r["median_us"] / res["upstream_seeded"]["median_us"], 4),
                           ratio_vs_unseeded=round(r["median_us"] / res["unseeded"]["median_us"], 4),
                           mismatches_vs_upstream=mism if m == "fused" else "")
                rows.append(row)
                log(f"{vocab:>7} {batch:>4} {m:<16} {row['median_us']:>10.2f} {row['pct_copy_bw']:>8.1f} "
                    f"{row['peak_extra_mib']:>9.2f} {row['ratio_vs_upstream_seeded']:>11.3f} "
                    f"{row['ratio_vs_unseeded']:>10.3f} {row['mismatches_vs_upstream']!s:>8}")
                sys.stdout.flush()
            del probs, seeds, positions
            torch.cuda.empty_cache()
    _write(out_dir, rows, bw, log)
    return rows


# ------------------------------------------------------------------------------ shared by the GPU checks
# Launch variants compared by scripts/bench/bench_kernel_variants.py (and profiled by scripts/bench/profile_stage1.py):
# name -> the LaunchConfig used when B >= 32, or None: the committed launch table.
LAUNCH_VARIANTS = {
    "base": None,
    "b2k": (2048, 4, 0),
    "r128": (4096, 4, 128),
    "b2k_r96": (2048, 4, 96),
    "w8": (4096, 8, 0),
}


def launch_variant(name: str) -> Callable:
    """A sampler call ``fn(probs, seeds, pos, step, greedy=None)`` with the launch of ``LAUNCH_VARIANTS[name]``."""
    from sglang_detspec.kernels import LaunchConfig, seeded_draft_sample

    over = LAUNCH_VARIANTS[name]
    config = LaunchConfig(*over) if over is not None else None

    def fn(probs, seeds, pos, step, greedy=None):
        if config is not None and probs.shape[0] >= 32:
            return seeded_draft_sample(probs, seeds, pos, step, greedy=greedy, config=config)
        return seeded_draft_sample(probs, seeds, pos, step, greedy=greedy)

    return fn


def rand_probs(kind: str, B: int, V: int, temp: float, g, device=torch.device("cuda")) -> torch.Tensor:
    """``[B, V]`` probability rows of one kind: "flat", "dense" (softmax of randn * 4 / temp), "peaked" (token 0
    25 nats up) or "topkK" (the K largest logits kept)."""
    if kind == "flat":
        return torch.full((B, V), 1.0 / V, device=device)
    logits = torch.randn(B, V, device=device, generator=g) * 4.0
    if kind == "peaked":
        logits[:, 0] += 25.0
    if kind.startswith("topk"):
        k = int(kind[4:])
        thr = logits.topk(k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < thr, float("-inf"))
    return torch.softmax(logits / temp, dim=-1)


def tied_partner_prob(ri: torch.Tensor, rj: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """float32 p_j whose float64 score rj * p_j ties token i's score ri * p_i as closely as float32 allows (the
    best of the 9 ulps around the exact ratio), then nudged one ulp down in a third of the rows and one ulp up in
    another third, so the winner flips around the tie. ``ri``/``rj`` are the 1/-log(u) factors of the two tokens."""
    target = (pi.double() * ri / rj).float()  # p_j making the scores (nearly) equal
    best_pj = target.clone()
    best_gap = torch.full_like(ri, float("inf"), dtype=torch.float64)
    s_i = ri * pi.double()
    cand = target.clone()
    for _ in range(4):
        cand = torch.nextafter(cand, torch.zeros_like(cand))
    for _ in range(9):
        gap = (rj * cand.double() - s_i).abs()
        better = gap < best_gap
        best_pj = torch.where(better, cand, best_pj)
        best_gap = torch.where(better, gap, best_gap)
        cand = torch.nextafter(cand, torch.full_like(cand, 2.0))
    nudge = torch.arange(ri.shape[0], device=ri.device) % 3
    best_pj = torch.where(nudge == 1, torch.nextafter(best_pj, torch.zeros_like(best_pj)), best_pj)
    return torch.where(nudge == 2, torch.nextafter(best_pj, torch.full_like(best_pj, 2.0)), best_pj)


def check_bars(rows: List[Dict], device_name: str) -> List[str]:
    """Human-readable PASS / FAIL / INFO lines for the issue's bars (fused rows only); the time bars are INFO on a
    card other than the one they were set for (:data:`BARS_CARD`)."""
    out = []
    gated = BARS_CARD in device_name
    for (b, v), lim in BARS_US.items():
        for r in rows:
            if r["method"] == "fused" and r["batch"] == b and r["vocab"] == v:
                verdict = ("PASS" if r["median_us"] <= lim else "FAIL") if gated else "INFO"
                where = "" if gated else f" (bar set for an {BARS_CARD}; not gated on {device_name})"
                out.append(f"{verdict} fused B={b} V={v}: {r['median_us']:.2f} us <= {lim} us{where}")
    for (b, v), lim in BAR_PEAK_MIB.items():
        for r in rows:
            if r["method"] == "fused" and r["batch"] == b and r["vocab"] == v:
                ok = r["peak_extra_mib"] <= lim
                out.append(f"{'PASS' if ok else 'FAIL'} fused B={b} V={v}: peak extra {r['peak_extra_mib']:.3f} MiB <= {lim} MiB")
    for r in rows:
        if r["method"] == "fused" and r["mismatches_vs_upstream"] not in ("", 0):
            out.append(f"FAIL fused B={r['batch']} V={r['vocab']}: {r['mismatches_vs_upstream']} token mismatches vs upstream")
    return out


def _write(out_dir: Path, rows: List[Dict], bw: float, log) -> None:
    csv_path = out_dir / "sampler_bench.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    meta = dict(device=torch.cuda.get_device_name(), copy_bandwidth_gbs=round(bw, 1), torch=torch.__version__,
                bars=check_bars(rows, torch.cuda.get_device_name()), time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:  # pragma: no cover
        pass
    (out_dir / "sampler_bench.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    log(f"wrote {csv_path}")
    for line in meta["bars"]:
        log(line)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # matplotlib is an optional extra (pip install sglang-detspec[bench])
        log(f"matplotlib is not importable ({type(e).__name__}: {e}); skipped the PNG plot, the CSV is complete")
        return
    vocabs = sorted({r["vocab"] for r in rows})
    fig, axes = plt.subplots(1, len(vocabs), figsize=(6 * len(vocabs), 4.5), squeeze=False)
    for ax, v in zip(axes[0], vocabs):
        for m in METHODS:
            pts = sorted((r["batch"], r["median_us"]) for r in rows if r["vocab"] == v and r["method"] == m)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("median us per call (CUDA-graph replay)")
        ax.set_title(f"V = {v}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"seeded draft sampler, {torch.cuda.get_device_name()}")
    fig.tight_layout()
    png = out_dir / "sampler_bench.png"
    fig.savefig(png, dpi=120)
    log(f"wrote {png}")


def main(argv: Optional[List[str]] = None, prog: str = "bench_sampler") -> int:
    """Run the benchmark; ``prog`` names the command in usage and error lines (``sglang-detspec bench`` from the
    CLI, ``bench_sampler`` from scripts/bench/bench_sampler.py)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory (CSV, JSON, PNG)")
    ap.add_argument("--quick", action="store_true", help="fewer replays (about 20 s in total)")
    ap.add_argument("--calls-per-graph", type=int, default=10)
    ap.add_argument("--replays", type=int, default=None)
    ap.add_argument("--vocab", type=int, nargs="*", default=list(VOCABS))
    ap.add_argument("--batch", type=int, nargs="*", default=list(BATCHES))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{prog}: error: no CUDA GPU visible; the benchmark measures CUDA-graph replays on a GPU "
              "(run scripts/run_gpu_checks.sh OUTDIR --only bench on a GPU machine)", file=sys.stderr)
        return 2
    rows = run(args.out, quick=args.quick, calls_per_graph=args.calls_per_graph, replays=args.replays,
               vocabs=args.vocab, batches=args.batch)
    return 1 if any(line.startswith("FAIL") for line in check_bars(rows, torch.cuda.get_device_name())) else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
