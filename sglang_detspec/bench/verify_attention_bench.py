"""Verify-attention benchmark (issue 32): the plugin's split-KV verify kernel against SGLang's two verify kernels.

For each pair shape (mid-size: 16 query / 8 KV heads, 16 layers; Llama-3-8B: 32 / 8, 32 layers; head dim 128,
bfloat16), batch and context, one verify of a topk-1 chain of ``steps + 1`` tokens per request runs through:

* ``split_kv``: :func:`sglang_detspec.kernels.split_kv_verify_attention.split_kv_verify_attention` (256-key tiles,
  SGLang's default ``SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE``; what DETSPEC_EAGLE runs by default);
* ``unified``: SGLang's deterministic one-stage extend kernel with the chain's custom mask (DETSPEC_EAGLE with
  ``SGLANG_DETSPEC_SPLIT_KV_VERIFY=0`` or on a model the split-KV kernel cannot serve);
* ``two_stage``: SGLang's non-deterministic extend kernel (what built-in EAGLE + rejection sampling runs).

Times are per model step (all layers), from CUDA-graph replays of one call per layer; the layers cycle over enough
separate caches that the keys of one layer are not still in L2 when it runs again, as in a served step. Each point
also checks the kernel: its rows against a float64 reference, and a request's rows alone against the same request
inside the batch (bit for bit). Needs a CUDA GPU and SGLang (the GPU bundle).

    python scripts/bench/bench_verify_attention.py --out DIR [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
from typing import Dict, List

import torch

from sglang_detspec.bench.sampler_bench import graph_time_us
from sglang_detspec.kernels.split_kv_verify_attention import (
    max_splits_for,
    split_kv_verify_attention,
    split_kv_verify_attention_reference,
)

__all__ = ["main", "PAIRS"]

#: name -> (query heads, KV heads, head dim, layers)
PAIRS = {"midsize": (16, 8, 128, 16), "llama8b": (32, 8, 128, 32)}
BATCHES = (1, 8, 32, 128)
CONTEXTS = (512, 1536, 4096)
SPLIT = 256
L2_BYTES = 128 << 20  # more than an H100's / H200's 50 MiB L2, so cycling caches miss it


class Point:
    """One (pair, batch, context) verify, its caches and the three kernels' launches."""

    def __init__(self, pair: str, batch: int, context: int, steps_plus_one: int, seed: int):
        self.q_heads, self.kv_heads, self.dim, self.layers = PAIRS[pair]
        self.batch, self.context, self.chain = batch, context, steps_plus_one
        dev = torch.device("cuda")
        g = torch.Generator(device=dev).manual_seed(seed)
        keys = batch * (context + steps_plus_one)
        layer_bytes = 2 * keys * self.kv_heads * self.dim * 2
        self.caches = max(2, min(self.layers, math.ceil(L2_BYTES / layer_bytes)))
        slots = keys + 64
        self.k = [torch.randn(slots, self.kv_heads, self.dim, device=dev, generator=g, dtype=torch.bfloat16)
                  for _ in range(self.caches)]
        self.v = [torch.randn(slots, self.kv_heads, self.dim, device=dev, generator=g, dtype=torch.bfloat16)
                  for _ in range(self.caches)]
        order = torch.randperm(slots, device=dev, generator=g)[:keys].view(batch, context + steps_plus_one)
        self.prefix_indices = order[:, :context].reshape(-1).contiguous()
        self.draft_slots = order[:, context:].reshape(-1).contiguous()
        self.unified_indices = order.reshape(-1).contiguous()
        self.q = torch.randn(batch * steps_plus_one, self.q_heads, self.dim, device=dev, generator=g,
                             dtype=torch.bfloat16)
        self.k_new = self.k[0][self.draft_slots].clone()
        self.v_new = self.v[0][self.draft_slots].clone()
        self.o = torch.empty_like(self.q)
        i32 = dict(device=dev, dtype=torch.int32)
        self.qo_indptr = torch.arange(0, (batch + 1) * steps_plus_one, steps_plus_one, **i32)
        self.prefix_indptr = torch.arange(0, (batch + 1) * context, context, **i32)
        self.unified_indptr = torch.arange(0, (batch + 1) * (context + steps_plus_one), context + steps_plus_one,
                                           **i32)
        self.prefix_lens = torch.full((batch,), context, **i32)
        seen = (torch.arange(context + steps_plus_one, device=dev)[None, :]
                < (context + torch.arange(steps_plus_one, device=dev) + 1)[:, None])
        self.mask = seen.reshape(-1).repeat(batch)
        self.mask_indptr = torch.arange(0, (batch + 1) * seen.numel(), seen.numel(), device=dev, dtype=torch.int64)
        self.max_splits = max_splits_for(context + steps_plus_one, SPLIT)
        self.part_o = torch.empty(batch * steps_plus_one, self.q_heads, self.max_splits, self.dim, device=dev)
        self.part_lse = torch.empty(batch * steps_plus_one, self.q_heads, self.max_splits, device=dev)
        self.scale = self.dim ** -0.5

    def split_kv(self, layer: int, q=None, o=None, qo=None, kv=None, idx=None, lens=None, batch=None):
        q = self.q if q is None else q
        return split_kv_verify_attention(
            q, self.o if o is None else o, self.k[layer % self.caches], self.v[layer % self.caches],
            self.qo_indptr if qo is None else qo, self.unified_indptr if kv is None else kv,
            self.unified_indices if idx is None else idx, self.prefix_lens if lens is None else lens,
            max_q_len=self.chain, split=SPLIT, max_splits=self.max_splits, partial_out=self.part_o,
            partial_lse=self.part_lse, sm_scale=self.scale)

    def unified(self, layer: int):
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified

        extend_attention_fwd_unified(
            self.q, self.o, self.k[layer % self.caches], self.v[layer % self.caches], 1.0, 1.0, self.qo_indptr,
            self.unified_indptr, self.unified_indices, self.prefix_lens, self.chain, custom_mask=self.mask,
            mask_indptr=self.mask_indptr, sm_scale=self.scale)

    def two_stage(self, layer: int):
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

        extend_attention_fwd(
            self.q, self.k_new, self.v_new, self.o, self.k[layer % self.caches], self.v[layer % self.caches],
            self.qo_indptr, self.prefix_indptr, self.prefix_indices, self.mask, True, self.mask_indptr, self.chain,
            1.0, 1.0, self.scale)

    def check(self) -> Dict[str, float]:
        """The kernel's largest error against float64, and whether request 0 alone gives the batch's bits."""
        got = self.split_kv(0).clone()
        want = split_kv_verify_attention_reference(
            self.q, self.k[0], self.v[0], self.qo_indptr, self.unified_indptr, self.unified_indices, self.prefix_lens,
            sm_scale=self.scale)
        error = (got.double() - want).abs().max().item()
        rows = slice(0, self.chain)
        alone = torch.empty_like(self.q[rows])
        self.split_kv(0, q=self.q[rows].contiguous(), o=alone, qo=self.qo_indptr[:2], kv=self.unified_indptr[:2],
                      idx=self.unified_indices[: self.context + self.chain], lens=self.prefix_lens[:1])
        return {"max_abs_error": error, "alone_equals_batch": bool(torch.equal(alone, got[rows]))}


def _time(point: Point, name: str, replays: int) -> List[float]:
    launch = getattr(point, name)

    def step():
        for layer in range(point.layers):
            launch(layer)

    return graph_time_us(step, (), calls_per_graph=1, replays=replays)


def run(out_dir: str, quick: bool, steps_plus_one: int, replays: int) -> List[dict]:
    os.makedirs(out_dir, exist_ok=True)
    pairs = ["midsize"] if quick else list(PAIRS)
    batches = (1, 32) if quick else BATCHES
    contexts = (1536,) if quick else CONTEXTS
    rows = []
    card = torch.cuda.get_device_name()
    total = len(pairs) * len(batches) * len(contexts)
    for i, (pair, batch, context) in enumerate((p, b, c) for p in pairs for b in batches for c in contexts):
        point = Point(pair, batch, context, steps_plus_one, seed=i)
        row = {"card": card, "pair": pair, "batch": batch, "context": context, "chain": steps_plus_one,
               "layers": point.layers, **point.check()}
        for name in ("split_kv", "unified", "two_stage"):
            times = _time(point, name, replays)
            row[f"{name}_us_median"] = statistics.median(times)
            row[f"{name}_us_min"], row[f"{name}_us_max"] = min(times), max(times)
        row["split_kv_vs_unified"] = row["unified_us_median"] / row["split_kv_us_median"]
        row["split_kv_vs_two_stage"] = row["two_stage_us_median"] / row["split_kv_us_median"]
        rows.append(row)
        _write(out_dir, rows)  # after every point, so a run cut short keeps what it measured
        print(f"[{i + 1}/{total}] {pair} B={batch} ctx={context}: split_kv {row['split_kv_us_median']:.0f} us, "
              f"unified {row['unified_us_median']:.0f}, two_stage {row['two_stage_us_median']:.0f} per step; "
              f"err {row['max_abs_error']:.2e}, alone==batch {row['alone_equals_batch']}", flush=True)
        del point
        torch.cuda.empty_cache()
    return rows


def _write(out_dir: str, rows: List[dict]) -> None:
    with open(os.path.join(out_dir, "verify_attention_bench.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(out_dir, "verify_attention_bench.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for verify_attention_bench.{csv,json}")
    parser.add_argument("--quick", action="store_true", help="mid-size pair, batches 1 and 32, context 1536 only")
    parser.add_argument("--chain", type=int, default=4, help="verified tokens per request (steps + 1; default 4)")
    parser.add_argument("--replays", type=int, default=20, help="timed graph replays per kernel and point")
    args = parser.parse_args(argv)
    if args.chain < 1 or args.replays < 3:
        parser.error("--chain must be >= 1 and --replays >= 3")
    return args


def main(argv=None) -> int:
    args = _args(argv)
    if not torch.cuda.is_available():
        print("bench_verify_attention needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = run(args.out, args.quick, args.chain, args.replays)
    bad = [r for r in rows if not r["alone_equals_batch"] or r["max_abs_error"] > 2e-2]
    if bad:
        print(f"FAILED: {len(bad)} point(s) where the kernel's rows changed with the batch or left the reference",
              file=sys.stderr)
        return 1
    return 0
