#!/usr/bin/env python3
"""Sampler benchmark (thin wrapper): see sglang_detspec/bench/sampler_bench.py.

    python scripts/bench/bench_sampler.py --out DIR [--quick]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the checkout's package

from sglang_detspec.bench.sampler_bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
