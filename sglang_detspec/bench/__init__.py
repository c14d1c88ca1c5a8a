"""Benchmarks and GPU checks: what the kernels and the serving path cost, and whether the compiled kernels hold
at scale, measured on a GPU.

* :mod:`.sampler_bench`        the fused seeded draft sampler against SGLang 0.5.23's own (``sglang-detspec bench``);
* :mod:`.verify_schemes_bench` the proposal and verify of the two schemes (rejection sampling, the coupled race);
* :mod:`.upstream_replica`     SGLang 0.5.23's seeded draft sampler re-implemented op for op: the GPU parity oracle
  of the fused kernel and the benchmark's baseline;
* :mod:`.serving_bench`        an end-to-end serving benchmark on a mid-size pair (``sglang-detspec bench-serve``);
* :mod:`.draft_sampler_checks` / :mod:`.coupled_race_checks` the kernels' GPU checks at scale (all 2**32 hashes,
  10**6+ rows), which ``tests/gpu/`` and ``scripts/gpu_kernel_checks.py`` run.

Importing this package imports nothing: each benchmark module imports torch / Triton / SGLang itself.
"""
