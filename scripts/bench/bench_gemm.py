#!/usr/bin/env python3
"""Per-op GEMM benchmark (thin wrapper): see sglang_detspec/gemm_bench.py.

    python scripts/bench/bench_gemm.py --out DIR [--quick] [--tune]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the checkout's package

from sglang_detspec.gemm_bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
