#!/usr/bin/env python3
"""Verify-scheme benchmark (thin wrapper): see sglang_detspec/bench/verify_schemes_bench.py.

    python scripts/bench/bench_verify_schemes.py --out DIR [--quick]
"""


from sglang_detspec.bench.verify_schemes_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
