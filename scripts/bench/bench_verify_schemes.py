#!/usr/bin/env python3
"""Verify-scheme benchmark (thin wrapper): see sglang_detspec/bench/verify_schemes_bench.py.

    python scripts/bench/bench_verify_schemes.py --out DIR [--quick]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the checkout's package

from sglang_detspec.bench.verify_schemes_bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
