#!/usr/bin/env python3
"""Verify-attention benchmark (thin wrapper): see sglang_detspec/bench/verify_attention_bench.py.

    python scripts/bench/bench_verify_attention.py --out DIR [--quick]
"""

from sglang_detspec.bench.verify_attention_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
