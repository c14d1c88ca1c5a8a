#!/usr/bin/env python3
"""GPU checks of the fused seeded draft sampler and the coupled race (run on a CUDA machine; no SGLang needed).

    python scripts/gpu_kernel_checks.py --out DIR [--rows N] [--draws N] [--quick] [--only coupled]

The checks themselves, and what each must show, are ``sglang_detspec.bench.draft_sampler_checks`` (the
float32 filter bound, parity with upstream's float64 stream on 10**6+ rows, statistics) and
``sglang_detspec.bench.coupled_race_checks`` (the coupled race's screens and its parity with SGLang's own
sampler); ``tests/gpu/`` runs each as a ``gpu`` test. This runner runs them all at full size, prints a summary and
writes ``DIR/kernel_checks.json``; exit status 0 iff every check passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton


def run_checks(rows: int, draws: int, *, only: str = "all", quick: bool = False, log=print) -> list:
    """Every check (``only="coupled"``: the coupled race's alone), ``rows`` random parity rows and ``draws`` draws per
    statistical test (``quick``: a smaller CPU-reference subsample), in the order the JSON lists them; each result is
    logged as it comes."""
    from sglang_detspec.bench import coupled_race_checks as cc
    from sglang_detspec.bench import draft_sampler_checks as dc

    def report(r: dict, *, stats: bool = False) -> dict:
        skip = ("name", "passed") if stats else ("name", "passed", "detail", "per_kind")
        log(f"[{'PASS' if r['passed'] else 'FAIL'}] {r['name']}: " + ", ".join(
            f"{k}={v:.4g}" if stats and isinstance(v, float) else f"{k}={v}" for k, v in r.items() if k not in skip))
        return r

    screens = [cc.check_gumbel_screen, lambda: cc.check_exponential_screen(True),
               lambda: cc.check_exponential_screen(False), lambda: cc.check_ratio_screen(True),
               lambda: cc.check_ratio_screen(False)]
    if only == "coupled":
        return [report(fn()) for fn in (*screens, cc.check_kernel_log, lambda: cc.check_coupled_parity(rows, log))]
    results = [report(fn()) for fn in (dc.check_e2_bound, dc.check_score_bound, dc.check_degenerate, *screens)]
    results += [report(fn()) for fn in (lambda: dc.check_cpu_reference(64 if quick else 256),
                                         lambda: dc.check_near_ties(max(2048, rows // 50), log),
                                         lambda: dc.check_parity(rows, log), cc.check_kernel_log,
                                         lambda: cc.check_coupled_parity(rows, log))]
    results += [report(r, stats=True) for r in dc.check_statistics(draws)]
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/kernel_checks"))
    ap.add_argument("--rows", type=int, default=1_050_000, help="random parity rows (>= 10**6 for the bar)")
    ap.add_argument("--draws", type=int, default=2_000_000, help="draws per statistical test")
    ap.add_argument("--quick", action="store_true", help="10x fewer rows and draws (smoke run)")
    ap.add_argument("--only", choices=("all", "coupled"), default="all",
                    help="coupled: only the coupled race's checks (Gumbel screen, parity with SGLang)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_kernel_checks: no CUDA GPU visible (run scripts/run_gpu_checks.sh on a GPU machine)", file=sys.stderr)
        return 2
    rows, draws = args.rows, args.draws
    if args.quick:
        rows, draws = rows // 10, max(500_000, draws // 10)
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    t0 = time.time()
    results = run_checks(rows, draws, only=args.only, quick=args.quick, log=log)
    ok = all(r["passed"] for r in results)
    summary = dict(passed=ok, device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   seconds=round(time.time() - t0, 1), results=results)
    (args.out / "kernel_checks.json").write_text(json.dumps(summary, indent=1, default=str))
    log(f"{'ALL PASSED' if ok else 'SOME CHECKS FAILED'} in {summary['seconds']}s; wrote {args.out / 'kernel_checks.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
