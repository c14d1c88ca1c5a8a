"""sglang-detspec: reproducible per-seed rejection-sampling speculative decoding for SGLang 0.5.17-0.5.23.

Importing this package is cheap on purpose: it imports neither torch nor SGLang.  It is built in wings, each
importing only those listed before it:

* :mod:`sglang_detspec.stream`       the seeded streams written down once: key layout, input contracts, bit-exact
  pure-torch twins (torch only);
* :mod:`sglang_detspec.kernels`      the Triton kernels, one op per file (torch + triton only, no SGLang);
* :mod:`sglang_detspec.integration`  the SGLang side: start-up and refusals, the workers, the sampling;
* :mod:`sglang_detspec.models`       the tiny and mid-size model pairs the tests and benchmarks serve;
* :mod:`sglang_detspec.bench`        the benchmarks and the kernels' GPU checks;
* the commands at the root: :mod:`sglang_detspec.plugin` (the ``sglang.srt.plugins`` entry point that registers the
  DETSPEC algorithms, after checking the installed SGLang version) and :mod:`sglang_detspec.cli` (the
  ``sglang-detspec`` command: serve / check / bench / bench-serve / demo).

The supported SGLang range is defined once, in :mod:`sglang_detspec.integration.compat` (``SUPPORTED_MIN`` /
``SUPPORTED_MAX``); ``tests/unit/project/test_supported_range.py`` checks that pyproject.toml and CI say the same.
"""

__version__ = "0.1.0"

