#!/usr/bin/env python3
"""Sampler benchmark (thin wrapper): see sglang_detspec/bench/sampler_bench.py.

    python scripts/bench/bench_sampler.py --out DIR [--quick]
"""


from sglang_detspec.bench.sampler_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
