#!/usr/bin/env python3
"""Registers and SASS instruction counts of the coupled race's stage 1, compiled for an H200 (sm_90a) on any machine.

    python scripts/sass_counts.py [--json FILE]

No GPU needed: Triton compiles for a CUDA target without a driver, and its wheel ships ``ptxas`` and
``cuobjdump``.  For each launch of ``kernels/coupled_race_probs.py``'s ``LAUNCH_TABLE`` and each screen form
(``fast_screen``: ``lg2.approx`` or libdevice's ``logf``; kernels/coupled_race.py::exponential_f32) it reports
ptxas' registers per thread and spill bytes, the number of SASS instructions and the counts of the classes the
screen changes (MUFU, FFMA).  Static counts of the whole kernel (both the masked and the unmasked tile, the rare
float64 paths included), not times: what it tells is where registers and instructions go before an H200 run
measures the time (scripts/bench/bench_verify_schemes.py --coupled-launches).  Run it with TRITON_INTERPRET unset:
the interpreter's kernels cannot be compiled.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from sglang_detspec.bench.hopper_compile import compile_for_hopper, cuda_tool, interpreted_refusal

_STAGE1_SIGNATURE = {  # the full-vocabulary race: no hot map (map_ptr None, KEYED off)
    "probs_ptr": "*fp32", "row_stride": "i32", "map_ptr": "constexpr", "seed_ptr": "*i64", "pos_ptr": "*i64",
    "part_score_ptr": "*fp64", "part_idx_ptr": "*i32", "V": "i32", "NC": "i32",
}
_SASS_OP = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def compile_stage1(block: int, warps: int, fast: bool, workdir: Path) -> dict:
    """ptxas' report and SASS op counts of ``_probs_stage1`` (cap and reciprocal form: 0.5.18+ on CUDA)."""
    # by module path: the package's own name coupled_race_probs is the kernel function it exports
    race = importlib.import_module("sglang_detspec.kernels.coupled_race_probs")
    kernel = compile_for_hopper(race._probs_stage1, _STAGE1_SIGNATURE,
                                {"map_ptr": None, "CAP": True, "RECIP": True, "BLOCK": block, "FAST": fast,
                                 "KEYED": False}, warps, workdir,
                                f"stage1_{block}x{warps}_{'fast' if fast else 'precise'}")
    sass = subprocess.run([cuda_tool("cuobjdump"), "-sass", str(kernel.cubin)], capture_output=True, text=True,
                          check=True).stdout
    ops = collections.Counter(m.group(1) for m in map(_SASS_OP.match, sass.splitlines()) if m)
    return dict(block=block, warps=warps, screen="lg2.approx" if fast else "logf", registers=kernel.registers,
                spill_store_bytes=kernel.spill_store_bytes, sass_instructions=sum(ops.values()), mufu=ops["MUFU"],
                ffma=ops["FFMA"], ptx_lg2_approx=kernel.ptx.count("lg2.approx"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    refusal = interpreted_refusal("sass_counts")
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    from sglang_detspec.kernels.coupled_race_probs import LAUNCH_TABLE

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _, (block, warps) in LAUNCH_TABLE:
            for fast in (True, False):
                row = compile_stage1(block, warps, fast, Path(tmp))
                rows.append(row)
                print(f"stage 1 {block}x{warps} {row['screen']:<10}: {row['registers']} registers, "
                      f"{row['spill_store_bytes']} B spilled, {row['sass_instructions']} SASS instructions "
                      f"(MUFU {row['mufu']}, FFMA {row['ffma']}), lg2.approx in PTX {row['ptx_lg2_approx']}",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
