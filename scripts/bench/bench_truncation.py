#!/usr/bin/env python3
"""Row-local truncation benchmark: the Triton kernel vs a torch sort vs FlashInfer's renorm kernels.

    python scripts/bench/bench_truncation.py --out DIR [--quick] [--launch 2048x8,4096x16]

Needs a CUDA GPU and torch + triton only (FlashInfer is optional, SGLang is not used).  Methods, each
captured in a CUDA graph (``--calls-per-graph`` calls back to back) and replayed; the median per-call time
over ``--replays`` replays is reported:

* ``detspec``: :func:`sglang_detspec.kernels.truncate_probs_triton` (``renormalize=True``), once per
  ``--launch BLOCKxWARPS`` configuration;
* ``torch_sort``: the same rules by a full sort (:func:`sglang_detspec.stream.reference.truncate_probs_reference`
  on the GPU); the kernel's output is compared with it bit for bit (``mismatches``, must be 0);
* ``flashinfer``: ``top_k_renorm_probs`` then ``top_p_renorm_probs`` (what SGLang's EAGLE verify runs for
  the whole batch; no min-p), skipped when flashinfer is not importable;
* ``copy``: ``out.copy_(probs)``, the one-pass floor (``detspec / copy`` ~ the passes the kernel pays).

Scenarios: ``untouched`` (top_k = 1 << 30, top_p = 1, min_p = 0: a copy), ``top_p_0.9``, ``top_k_50`` and
``mix`` (greedy, top-k, top-p, min-p and untouched rows).  Rows are softmax(randn * 3 / T) with T drawn
from {0.3, 0.7, 1.0, 1.7}.  Small ``N * V`` stays in the 50 MB L2 across back-to-back calls, for every
method alike.  Writes ``truncation_bench.csv`` and ``truncation_bench.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import torch

from sglang_detspec.bench.sampler_bench import graph_time_us
from sglang_detspec.kernels import truncate_probs_triton
from sglang_detspec.stream.reference import truncate_probs_reference

VOCABS = (151936, 163840)
BATCHES = (1, 8, 32, 128, 512)
SCENARIOS = ("untouched", "top_p_0.9", "top_k_50", "mix")
NO_TOP_K = 1 << 30


def make_inputs(n: int, vocab: int, scenario: str, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    temps = torch.tensor([0.3, 0.7, 1.0, 1.7], device="cuda")[torch.randint(0, 4, (n,), device="cuda", generator=g)]
    probs = torch.softmax(torch.randn(n, vocab, device="cuda", generator=g) * 3 / temps.view(-1, 1), -1)
    top_ks = torch.full((n,), NO_TOP_K, dtype=torch.int32, device="cuda")
    top_ps = torch.ones(n, device="cuda")
    min_ps = torch.zeros(n, device="cuda")
    if scenario == "top_p_0.9":
        top_ps.fill_(0.9)
    elif scenario == "top_k_50":
        top_ks.fill_(50)
    elif scenario == "mix":
        kind = torch.arange(n, device="cuda") % 5  # greedy, top-k 20, top-p 0.8, min-p 0.05, untouched
        top_ks = torch.where(kind == 0, 1, torch.where(kind == 1, 20, top_ks)).to(torch.int32)
        top_ps = torch.where(kind == 2, 0.8, top_ps)
        min_ps = torch.where(kind == 3, 0.05, min_ps)
    elif scenario != "untouched":
        raise ValueError(f"unknown scenario {scenario!r}; choose from {SCENARIOS}")
    return probs, top_ks, top_ps, min_ps


def flashinfer_renorm():
    try:
        from flashinfer.sampling import top_k_renorm_probs, top_p_renorm_probs
    except Exception as exc:  # ImportError, or a flashinfer that fails to load its kernels
        print(f"flashinfer not usable ({type(exc).__name__}: {exc}); skipping that column", file=sys.stderr)
        return None

    def renorm(probs, top_ks, top_ps, min_ps, out):
        return top_p_renorm_probs(top_k_renorm_probs(probs, top_ks), top_ps)

    return renorm


def methods(launches, with_flashinfer: bool):
    table = {}
    for block, warps in launches:
        def detspec(probs, top_ks, top_ps, min_ps, out, block=block, warps=warps):
            return truncate_probs_triton(
                probs, top_ks, top_ps, min_ps, renormalize=True, out=out, block=block, num_warps=warps
            )

        table[f"detspec_{block}x{warps}"] = detspec
    table["torch_sort"] = lambda probs, top_ks, top_ps, min_ps, out: truncate_probs_reference(
        probs, top_ks, top_ps, min_ps, renormalize=True
    )
    table["copy"] = lambda probs, top_ks, top_ps, min_ps, out: out.copy_(probs)
    renorm = flashinfer_renorm() if with_flashinfer else None
    if renorm is not None:
        table["flashinfer"] = renorm
    return table


def parse_launches(text: str):
    launches = []
    for item in text.split(","):
        block, _, warps = item.partition("x")
        launches.append((int(block), int(warps)))
    return launches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory (CSV + JSON)")
    parser.add_argument("--vocabs", default=",".join(map(str, VOCABS)))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--launch", default="2048x8", help="detspec BLOCKxWARPS configurations, comma-separated")
    parser.add_argument("--calls-per-graph", type=int, default=5)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--no-flashinfer", action="store_true", help="skip the flashinfer column")
    parser.add_argument("--quick", action="store_true", help="V = 151936, N = 1 and 128, 10 replays")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_truncation needs a CUDA GPU", file=sys.stderr)
        return 2
    vocabs = [int(v) for v in args.vocabs.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        vocabs, batches, args.replays = vocabs[:1], [1, 128], 10
    table = methods(parse_launches(args.launch), with_flashinfer=not args.no_flashinfer)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for vocab in vocabs:
        for n in batches:
            for scenario in args.scenarios.split(","):
                inputs = make_inputs(n, vocab, scenario, seed=n)
                out = torch.empty_like(inputs[0])
                expected = truncate_probs_reference(*inputs, renormalize=True)
                record = {"vocab": vocab, "rows": n, "scenario": scenario}
                for name, fn in table.items():
                    per_call = graph_time_us(fn, (*inputs, out), args.calls_per_graph, args.replays)
                    record[f"{name}_us"] = round(statistics.median(per_call), 2)
                    if name.startswith("detspec"):
                        got = fn(*inputs, out)
                        record[f"{name}_mismatches"] = int((got.view(torch.int32) != expected.view(torch.int32)).sum())
                records.append(record)
                print(json.dumps(record), flush=True)
                del inputs, out, expected
                torch.cuda.empty_cache()
    fields = list(dict.fromkeys(k for r in records for k in r))
    with open(out_dir / "truncation_bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}
    (out_dir / "truncation_bench.json").write_text(json.dumps(meta, indent=1))
    detspec_names = [k[:-3] for k in fields if k.startswith("detspec") and k.endswith("_us")]
    others = [name for name in ("copy", "torch_sort", "flashinfer") if f"{name}_us" in fields]
    print(f"\nratios (detspec / other), median us; {torch.cuda.get_device_name()}")
    print("vocab   rows scenario   " + " ".join(f"{d:>18}" for d in detspec_names)
          + " " + " ".join(f"{'/' + o:>12}" for o in others))
    for r in records:
        best = min(detspec_names, key=lambda d: r[f"{d}_us"])
        cells = " ".join(f"{r[f'{d}_us']:>18.2f}" for d in detspec_names)
        ratios = " ".join(f"{r[f'{best}_us'] / r[f'{o}_us']:>12.2f}" for o in others)
        print(f"{r['vocab']:<7} {r['rows']:>4} {r['scenario']:<10} {cells} {ratios}")
    bad = [r for r in records for d in detspec_names if r[f"{d}_mismatches"]]
    if bad:
        print(f"MISMATCHES against the torch reference in {len(bad)} configurations", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
