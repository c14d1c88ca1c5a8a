#!/usr/bin/env python3
"""Per-op GEMM benchmark (thin wrapper): see sglang_detspec/bench/gemm_bench.py.

    python scripts/bench/bench_gemm.py --out DIR [--quick] [--tune]
"""

from sglang_detspec.bench.gemm_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
