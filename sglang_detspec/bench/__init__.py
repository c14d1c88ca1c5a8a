"""Benchmarks: what the kernels and the serving path cost, measured on a GPU.

* :mod:`.sampler_bench`        the fused seeded draft sampler against SGLang 0.5.23's own (``sglang-detspec bench``);
* :mod:`.verify_schemes_bench` the proposal and verify of the two schemes (rejection sampling, the coupled race);
* :mod:`.upstream_replica`     SGLang 0.5.23's seeded draft sampler re-implemented op for op: the GPU parity oracle
  of the fused kernel and the benchmark's baseline;
* :mod:`.serving_bench`        an end-to-end serving benchmark on a mid-size pair (``sglang-detspec bench-serve``).

Importing this package imports nothing: each benchmark module imports torch / Triton / SGLang itself.
"""
