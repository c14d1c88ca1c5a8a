#!/usr/bin/env python3
"""Compile the draft samplers' and the batch-invariant GEMM's Triton kernels for an H100 / H200 (sm_90a) on any
machine, and report ptxas' registers and spills per launch.

    python scripts/compile_kernels.py [--json FILE]

No GPU needed: Triton compiles for a CUDA target without a driver, and its wheel ships ``ptxas``.  The interpreter
(the CPU tests) runs the kernels' Python, not the compiler: a kernel can pass every interpreter test and still fail
to compile (a ``tl`` call the compiler types differently, a jit helper it cannot resolve across modules).  This
compiles each launch the package can make of the seeded draft sampler (stage 1 at every ``LAUNCH_TABLE`` block,
fast and precise screen, with and without the greedy mask; stage 2), the reduced-vocabulary sampler, the
reduced-vocabulary coupled race (both clamps, both screens), the GEMM (every launch of its table, rows past M
masked and not, with and without bias) and the split-KV verify attention (the served pairs' row blocks).  Exit 1 when any launch fails to
compile, naming it.  Run it with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import tempfile
from pathlib import Path

from sglang_detspec.bench.hopper_compile import ARCH, compile_for_hopper, interpreted_refusal


def _compile(fn, signature: dict, constexprs: dict, warps: int, workdir: Path, label: str) -> dict:
    kernel = compile_for_hopper(fn, signature, constexprs, warps, workdir, label)
    return dict(kernel=label, registers=kernel.registers, spill_store_bytes=kernel.spill_store_bytes)


def _draft_sampler_launches():
    # by module path: the package exports each kernel function under its module's name
    module = importlib.import_module("sglang_detspec.kernels.seeded_draft_sample")
    hot = importlib.import_module("sglang_detspec.kernels.seeded_hot_draft_sample")
    sds = module
    stage1 = {"probs_ptr": "*fp32", "row_stride": "i32", "seed_ptr": "*i64", "pos_ptr": "*i64", "greedy_ptr": "*i1",
              "part_score_ptr": "*fp64", "part_idx_ptr": "*i32", "V": "i32", "col_base": "i32", "NC": "i32"}
    stage2 = dict(stage1, out_p_ptr="*fp32", out_idx_ptr="*i64")
    hot1 = {"probs_ptr": "*fp32", "row_stride": "i32", "map_ptr": "*i64", "seed_ptr": "*i64", "pos_ptr": "*i64",
            "greedy_ptr": "*i1", "part_score_ptr": "*fp64", "part_tok_ptr": "*i32", "part_idx_ptr": "*i32",
            "VD": "i32", "col_base": "i64", "NC": "i32"}
    hot2 = {"probs_ptr": "*fp32", "row_stride": "i32", "part_score_ptr": "*fp64", "part_tok_ptr": "*i32",
            "part_idx_ptr": "*i32", "out_p_ptr": "*fp32", "out_tok_ptr": "*i64", "out_idx_ptr": "*i64", "NC": "i32"}
    for _, config in sds.LAUNCH_TABLE:
        for greedy in (False, True):
            for fast in (True, False):
                tag = f"b{config.block_size}w{config.num_warps}{'-greedy' if greedy else ''}-{'fast' if fast else 'precise'}"
                yield (f"seeded_draft_sample stage1 {tag}", module._stage1_kernel, dict(stage1),
                       dict(HAS_GREEDY=greedy, BLOCK=config.block_size, FAST=fast), config.num_warps)
                yield (f"seeded_hot_draft_sample stage1 {tag}", hot._hot_stage1, dict(hot1),
                       dict(HAS_GREEDY=greedy, BLOCK=config.block_size, FAST=fast), config.num_warps)
            yield (f"seeded_draft_sample stage2 b{config.block_size}{'-greedy' if greedy else ''}",
                   module._stage2_kernel, dict(stage2),
                   dict(HAS_GREEDY=greedy, NC_POW2=16, BLOCK=config.block_size), 4)
    yield "seeded_hot_draft_sample stage2", hot._hot_stage2, dict(hot2), dict(NC_POW2=16), 4


def _coupled_hot_race_launches():
    # the reduced-vocabulary coupled race (the full race's kernels with KEYED on): stage 1 at every LAUNCH_TABLE
    # launch, both screens and both releases' clamps (the reciprocal uniform: CUDA); stage 2 for both clamps
    race = importlib.import_module("sglang_detspec.kernels.coupled_race_probs")
    stage1 = {"probs_ptr": "*fp32", "row_stride": "i32", "map_ptr": "*i64", "seed_ptr": "*i64", "pos_ptr": "*i64",
              "part_score_ptr": "*fp64", "part_idx_ptr": "*i32", "V": "i32", "NC": "i32"}
    stage2 = dict(stage1, out_ptr="*i64")
    for _, (block, warps) in race.LAUNCH_TABLE:
        for cap in (True, False):
            for fast in (True, False):
                tag = f"b{block}w{warps}{'' if cap else '-uncapped'}-{'fast' if fast else 'precise'}"
                yield (f"coupled_hot_race_probs stage1 {tag}", race._probs_stage1, dict(stage1),
                       dict(CAP=cap, RECIP=True, BLOCK=block, FAST=fast, KEYED=True), warps)
    for cap in (True, False):
        yield (f"coupled_hot_race_probs stage2{'' if cap else ' uncapped'}", race._probs_stage2, dict(stage2),
               dict(CAP=cap, RECIP=True, NC_POW2=16, BLOCK=race.LAUNCH_TABLE[-1][1][0], KEYED=True), 4)


def _gemm_launches():
    gemm = importlib.import_module("sglang_detspec.kernels.batch_invariant_gemm")

    signature = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "bias_ptr": "*bf16", "ws_ptr": "*bf16",
                 "M": "i32", "N": "i32", "K": "i32", "K_PER_SPLIT": "i32", "stride_am": "i32", "stride_ak": "i32",
                 "stride_bk": "i32", "stride_bn": "i32", "stride_cm": "i32", "stride_cn": "i32"}
    configs = sorted({c for _, cands in gemm.LAUNCH_TABLE for c in cands}, key=lambda c: (c.block_m, c.block_n))

    def launch(c, bias, split_k=1, fold=False):
        return dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_SIZE_M=c.group_size_m,
                    SPLIT_K=split_k, FOLD_SPLITS=fold, A_LARGE=False, B_LARGE=False, C_LARGE=False,
                    HAS_BIAS=bias, EVEN_K=True, MASK_ROWS=c.mask_rows, INTERPRETED_FOLD=False)

    for config in configs:
        for masked in (True, False):
            for bias in (False, True):
                c = dataclasses.replace(config, mask_rows=masked)
                yield (f"batch_invariant_gemm {c.short()}{' bias' if bias else ''}",
                       gemm._batch_invariant_matmul_kernel, dict(signature), launch(c, bias), c.num_warps)
    # a split K (SPLIT_K_TABLE's weights): a split per program, and every split folded in one program
    for config in configs:
        if config.block_m * config.block_n <= gemm._FOLD_MAX_TILE:
            for fold in (False, True):
                yield (f"batch_invariant_gemm {config.short()} split 4{' folded' if fold else ''}",
                       gemm._batch_invariant_matmul_kernel, dict(signature), launch(config, False, 4, fold),
                       config.num_warps)


def _verify_attention_launches():
    # the split-KV verify attention (tile and merge kernels) at head dim 128, bfloat16 and float16, for the query-row
    # blocks the served pairs launch: 4 verified tokens x a group of 2 (mid-size), 4 (Llama-3-8B), 8 and 16
    attention = importlib.import_module("sglang_detspec.kernels.split_kv_verify_attention")
    for dtype in ("bf16", "fp16"):
        tile = {"Q": f"*{dtype}", "K_Buffer": f"*{dtype}", "V_Buffer": f"*{dtype}", "qo_indptr": "*i32",
                "kv_indptr": "*i32", "kv_indices": "*i64", "prefix_lens": "*i32", "Part_O": "*fp32",
                "Part_Lse": "*fp32", "sm_scale": "fp32", "logit_cap": "fp32", **{
                    name: "i32" for name in ("stride_qt", "stride_qh", "stride_kbs", "stride_kh", "stride_vbs",
                                             "stride_vh", "stride_pot", "stride_poh", "stride_pos", "stride_plt",
                                             "stride_plh")}}
        for group in (2, 4, 8, 16):
            block_m, row_blocks = attention.launch_shape(group, 4)
            for cap in (False, True):
                yield (f"split_kv_verify_attention tile {dtype} group{group} m{block_m}{' cap' if cap else ''}",
                       attention._tile_kernel, dict(tile),
                       dict(GROUP=group, ROW_BLOCKS=row_blocks, SPLIT=256, BLOCK_M=block_m,
                            BLOCK_N=attention.BLOCK_N, BLOCK_D=128, BLOCK_DV=128, Lk=128, Lv=128, HAS_CAP=cap,
                            FP32_DOTS=False), 4)
        merge = {"Part_O": "*fp32", "Part_Lse": "*fp32", "Out": f"*{dtype}", "qo_indptr": "*i32", "kv_indptr": "*i32",
                 "v_scale": "fp32", **{name: "i32" for name in ("stride_pot", "stride_poh", "stride_pos",
                                                                 "stride_plt", "stride_plh", "stride_ot",
                                                                 "stride_oh")}}
        yield (f"split_kv_verify_attention merge {dtype}", attention._merge_kernel, dict(merge),
               dict(SPLIT=256, BLOCK_DV=128, Lv=128), 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    refusal = interpreted_refusal("compile_kernels")
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    launches = (list(_draft_sampler_launches()) + list(_coupled_hot_race_launches()) + list(_gemm_launches())
                + list(_verify_attention_launches()))
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, fn, signature, constexprs, warps) in enumerate(launches, 1):
            try:
                row = _compile(fn, signature, constexprs, warps, Path(tmp), label)
            except Exception as e:  # report every launch that does not build, then fail
                failed.append(label)
                print(f"[{i}/{len(launches)}] {label}: FAILED to compile: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr, flush=True)
                continue
            rows.append(row)
            print(f"[{i}/{len(launches)}] {label}: {row['registers']} registers, {row['spill_store_bytes']} B "
                  "spilled", flush=True)
    if args.json:
        args.json.write_text(json.dumps(dict(rows=rows, failed=failed), indent=1) + "\n")
    if failed:
        print(f"compile_kernels: {len(failed)} of {len(launches)} launches failed to compile for {ARCH[1]}",
              file=sys.stderr)
        return 1
    print(f"compile_kernels: all {len(launches)} launches compile for {ARCH[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
