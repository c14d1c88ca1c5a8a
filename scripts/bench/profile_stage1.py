#!/usr/bin/env python3
"""Run the sampler's launch configurations once each at B=128, V=163840 between cudaProfilerStart/Stop, for
Nsight Compute (the stage-1 kernel is where the time goes; no SGLang needed):

    ncu --clock-control none --profile-from-start off --kernel-name regex:stage1 \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --section SchedulerStats --section Occupancy --section InstructionStats \\
        python3 scripts/bench/profile_stage1.py base b2k ...

Add ``--page raw`` and grep ``pipe_.*_cycles_active`` / ``issue_stalled`` for pipe utilisation and stall
reasons.  Config names are those of ``sglang_detspec.bench.sampler_bench.LAUNCH_VARIANTS`` (scripts/bench/bench_kernel_variants.py).
"""

import argparse
import sys

import torch

from sglang_detspec.bench import sampler_bench as benchmark


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", choices=sorted(benchmark.LAUNCH_VARIANTS),
                    help="launch configurations to profile, by name")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_stage1: no CUDA GPU visible; run it under Nsight Compute on a GPU machine", file=sys.stderr)
        return 2
    probs, seeds, pos = benchmark.make_inputs(128, 163840, torch.device("cuda"))
    fns = [(n, benchmark.launch_variant(n)) for n in args.configs]
    for _, fn in fns:  # compile and warm up outside the profiled range
        fn(probs, seeds, pos, 1)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in fns:
        print("profiling", name, flush=True)
        fn(probs, seeds, pos, 1)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
