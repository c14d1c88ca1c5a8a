#!/usr/bin/env python3
"""Compare launch variants of the fused seeded draft sampler in ONE GPU process (no SGLang needed).

    PYTHONPATH=$PWD python scripts/bench/bench_kernel_variants.py --out DIR [--rows 50000] [--configs ...]

For every launch variant (``sglang_detspec.bench.sampler_bench.LAUNCH_VARIANTS``: block size, warps, ptxas register
cap, applied when B >= 32, through ``seeded_draft_sample(..., config=LaunchConfig(...))``) and the committed
launch table ("base"); to compare kernel code paths, give ``launch_variant`` an entry that calls the other
path (the 2026-12-02 code-path comparison that chose the current kernel ran this way; results in the kernel
module's docstring):
1. parity: token indices vs a GPU float64 torch implementation of upstream's stream
   (:func:`sglang_detspec.bench.upstream_replica.upstream_seeded_fast_sample`, op for op SGLang 0.5.23) on random rows
   (dense at three temperatures, top-k truncated, flat, peaked; V = 163840 and 151936; random int64 seeds,
   positions up to 2**40, draft steps 0..7; int32 positions, strided row views, 10% greedy rows), small
   batches (every launch-table row), degenerate rows and constructed near-tie rows; one reference
   computation per input batch is shared by all configurations;
2. CUDA-graph replay timing (``benchmark.graph_time_us``: median per call, 10 calls per graph) at
   B in {1, 8, 32, 128, 256}, V = 163840.
Prints one table and writes ``DIR/variants.json`` (rewritten after every stage, so a time-out keeps
what was measured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import astuple
from pathlib import Path

if "--smoke" in sys.argv:  # CPU dry run of the parity path under the Triton interpreter (small shapes)
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton

from sglang_detspec.bench import sampler_bench as benchmark
from sglang_detspec.bench.sampler_bench import LAUNCH_VARIANTS, launch_variant, rand_probs, tied_partner_prob
from sglang_detspec.bench.upstream_replica import upstream_seeded_fast_sample, upstream_seeded_scores
from sglang_detspec.kernels import LAUNCH_TABLE
from sglang_detspec.stream import reference

SMOKE = "--smoke" in sys.argv
DEV = torch.device("cpu" if SMOKE else "cuda")
PAR_V = (4099, 3001) if SMOKE else (163840, 151936)  # parity vocabularies
PAR_B = 16 if SMOKE else 1024  # parity rows per batch
TIMING_BATCHES = (128, 1, 8, 32, 256)  # B = 128 first: the bar

def _reference(probs, seeds, pos, step, greedy):
    if SMOKE:
        return reference.seeded_draft_sample(probs, seeds, pos, step, greedy=greedy)[1]
    _, iu = upstream_seeded_fast_sample(probs, seeds, pos.to(torch.int64), step)
    if greedy is not None:
        iu = torch.where(greedy.view(-1, 1), probs.argmax(-1, keepdim=True), iu)
    return iu


def _batches(total_rows, g):
    """Yield (tag, probs, seeds, pos, step, greedy) batches."""
    kinds = ["dense", "dense", "topk1000", "topk50", "flat", "peaked"]
    temps = [0.3, 1.0, 3.0]
    rows = n = 0
    while rows < total_rows:
        V = PAR_V[n % 2]
        kind = kinds[(n // 2) % len(kinds)]
        temp = temps[n % 3]
        B = PAR_B
        step = n % 8
        seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64, generator=g)
        pos = torch.randint(0, 2**40, (B,), device=DEV, dtype=torch.int64, generator=g)
        variant = n % 4
        if variant == 1:
            pos = (pos % (2**31)).to(torch.int32)
        if variant == 2:
            buf = torch.zeros(B, 3, V, device=DEV)
            buf[:, 1] = rand_probs(kind, B, V, temp, g, device=DEV)
            probs = buf[:, 1]
        else:
            probs = rand_probs(kind, B, V, temp, g, device=DEV)
        greedy = (torch.rand(B, device=DEV, generator=g) < 0.1) if variant == 3 else None
        yield f"{kind}/T{temp}/V{V}", probs, seeds, pos, step, greedy
        rows += B
        n += 1
    # small batches: every launch-table row (and a partial last chunk for 151936)
    for B in (1, 2, 3, 8, 17, 64):
        for V in PAR_V:
            probs = rand_probs("dense", B, V, 1.0, g, device=DEV)
            seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64, generator=g)
            pos = torch.randint(0, 2**40, (B,), device=DEV, dtype=torch.int64, generator=g)
            yield f"small/B{B}/V{V}", probs, seeds, pos, B % 5, None
    # degenerate rows
    V, B = PAR_V[0], 16
    probs = torch.softmax(torch.randn(B, V, device=DEV, generator=g) * 3, -1)
    probs[0].zero_()
    probs[1, 777] = float("nan")
    probs[1, V // 2] = float("nan")
    probs[2].zero_()
    probs[2, V // 13] = 1e-45
    probs[3].zero_()
    probs[3, 5] = 1e-40
    probs[3, V - 3] = 2e-40
    probs[4] = torch.rand(V, device=DEV, generator=g) * 1e-30
    probs[5, V // 7] = float("inf")
    probs[6, :100] = -0.0
    probs[7, 10] = -1.0
    probs[8, :] = 0.0
    probs[8, -1] = 0.5
    probs[9] = 1.0 / V
    probs[10, V // 2:] = 0
    seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64, generator=g)
    pos = torch.randint(0, 2**40, (B,), device=DEV, dtype=torch.int64, generator=g)
    yield "degenerate", probs, seeds, pos, 3, None
    yield "degenerate/greedy", probs, seeds, pos, 3, torch.arange(B, device=DEV) % 2 == 0


def _upstream_scores(probs, seeds, pos, step):
    if SMOKE:
        return reference.draft_scores(probs, seeds, pos, step)
    return upstream_seeded_scores(probs, seeds, pos, step)


def _near_tie_batches(n_batches, g):
    """Rows whose top two float64 scores are within a few float32 ulp (same tile, same chunk, far apart)."""
    V, B = PAR_V[0], PAR_B
    for it in range(n_batches):
        seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64, generator=g)
        pos = torch.randint(0, 2**32, (B,), device=DEV, dtype=torch.int64, generator=g)
        step = it % 4
        sc = _upstream_scores(torch.ones(B, V, device=DEV), seeds, pos, step)
        i = torch.randint(0, V // 2, (B,), device=DEV, generator=g)
        sep = (torch.tensor([1024, 2048, 1, 7, 8192 + 3, 70001], device=DEV) % (V // 2))[torch.arange(B, device=DEV) % 6]
        j = i + sep
        ri = sc.gather(1, i[:, None]).squeeze(1)
        rj = sc.gather(1, j[:, None]).squeeze(1)
        del sc
        pi = torch.full((B,), 0.3, device=DEV)
        best_pj = tied_partner_prob(ri, rj, pi)
        probs = torch.rand(B, V, device=DEV, generator=g) * 1e-7
        probs.scatter_(1, i[:, None], pi[:, None])
        probs.scatter_(1, j[:, None], best_pj[:, None])
        yield "near-tie", probs, seeds, pos, step, None


def parity(names, total_rows, near_tie_batches, log):
    g = torch.Generator(device=DEV).manual_seed(4321)
    fns = {n: launch_variant(n) for n in names}
    mism = {n: 0 for n in names}
    errors = {}
    detail = {n: {} for n in names}
    rows = 0
    t0 = time.time()
    gens = [_batches(total_rows, g), _near_tie_batches(near_tie_batches, g)]
    for gen in gens:
        for tag, probs, seeds, pos, step, greedy in gen:
            ref = _reference(probs, seeds, pos, step, greedy)
            B = probs.shape[0]
            rows += B
            for n in names:
                if n in errors:
                    continue
                try:
                    _, ik = fns[n](probs, seeds, pos, step, greedy)
                    mm = int((ik != ref).sum())
                except Exception as e:  # a broken candidate must not stop the others
                    errors[n] = f"{type(e).__name__}: {e}"
                    log(f"  {n}: ERROR {errors[n][:300]}")
                    continue
                mism[n] += mm
                if mm:
                    key = tag.split("/")[0]
                    detail[n][key] = detail[n].get(key, 0) + mm
            del probs, ref
    log(f"  parity: {rows} rows in {time.time() - t0:.1f}s")
    return dict(rows=rows, mismatches=mism, errors=errors, detail=detail)


def timing(names, batches, vocab, log, save):
    """Median per-call us under CUDA-graph replay; "base" is timed again at the end of each batch size
    (``base@end``) to show the drift between the first and the last measurement."""
    out = {n: {} for n in list(names) + ["base@end"]}
    for B in batches:
        probs, seeds, pos = benchmark.make_inputs(B, vocab, DEV)
        for n in list(names) + (["base@end"] if "base" in names else []):
            fn = launch_variant(n.split("@")[0])
            try:
                t = benchmark.graph_time_us(fn, (probs, seeds, pos, 1), 10, 60)
                out[n][B] = round(statistics.median(t), 3)
            except Exception as e:
                out[n][B] = f"ERROR {type(e).__name__}: {str(e)[:200]}"
            log(f"  timing B={B} {n}: {out[n][B]}")
        del probs, seeds, pos
        save()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/variants"))
    ap.add_argument("--rows", type=int, default=49152)
    ap.add_argument("--near-tie-batches", type=int, default=4)
    ap.add_argument("--configs", nargs="*", default=list(LAUNCH_VARIANTS), choices=list(LAUNCH_VARIANTS))
    ap.add_argument("--smoke", action="store_true", help="CPU dry run of the parity path (interpreter)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    res = dict(device="cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               launch_table=[(bound, astuple(c)) for bound, c in LAUNCH_TABLE], configs=LAUNCH_VARIANTS)

    def log(m):
        print(m, flush=True)

    def save():
        (args.out / "variants.json").write_text(json.dumps(res, indent=1, default=str))

    t0 = time.time()
    names = args.configs
    if SMOKE:
        res["parity"] = parity(names, args.rows, args.near_tie_batches, log)
        log(json.dumps(res["parity"]))
        save()
        return 0 if all(v == 0 for v in res["parity"]["mismatches"].values()) and not res["parity"]["errors"] else 1
    # timing first (the goal), then parity (the gate)
    res["copy_bw_gbs"] = round(benchmark.copy_bandwidth_gbs(DEV, nbytes=1 << 28), 1)
    res["timing_us"] = {}
    res["timing_us"] = timing(names, TIMING_BATCHES, 163840, log, save)
    save()
    log(f"[{time.time() - t0:.0f}s] timing done")
    res["parity"] = parity(names, args.rows, args.near_tie_batches, log)
    save()
    log(f"[{time.time() - t0:.0f}s] parity done")
    log(f"copy bandwidth {res['copy_bw_gbs']} GB/s; parity rows {res['parity']['rows']}")
    log(f"{'config':<15} " + " ".join(f"{f'B={b} us':>9}" for b in sorted(TIMING_BATCHES)) + f" {'mismatch':>8}  notes")
    for n in list(names) + ["base@end"]:
        t = res["timing_us"].get(n, {})
        cells = [f"{t[b]:>9.2f}" if isinstance(t.get(b), float) else f"{str(t.get(b))[:9]:>9}" for b in sorted(TIMING_BATCHES)]
        mm = res["parity"]["mismatches"].get(n.split("@")[0], "")
        err = res["parity"]["errors"].get(n, "")
        det = res["parity"]["detail"].get(n, "") if n in res["parity"]["detail"] else ""
        log(f"{n:<15} {' '.join(cells)} {mm!s:>8}  {det or ''} {err[:120]}")
    ok = [n for n in names if res["parity"]["mismatches"].get(n) == 0 and n not in res["parity"]["errors"]
          and isinstance(res["timing_us"][n].get(128), float)]
    if ok:
        best = min(ok, key=lambda n: res["timing_us"][n][128])
        res["best_b128"] = best
        log(f"fastest bit-exact at B=128: {best} {res['timing_us'][best]}")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
