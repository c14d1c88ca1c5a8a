"""sglang-detspec: reproducible per-seed rejection-sampling speculative decoding for SGLang 0.5.17-0.5.23.

Importing this package is cheap on purpose: it imports neither torch nor SGLang.  The pieces are

* :mod:`sglang_detspec.stream.keys`       the key layout of the seeded draft stream (SGLang 0.5.23's definition);
* :mod:`sglang_detspec.stream.reference`  a bit-exact pure-torch twin of the stream, for CPU tests and audits;
* :mod:`sglang_detspec.kernels`    the fused Triton sampler (torch + triton only, no SGLang);
* :mod:`sglang_detspec.plugin`     the ``sglang.srt.plugins`` entry point that registers ``DETSPEC_EAGLE`` and
  ``DETSPEC_EAGLE3`` (checks the installed SGLang version first);
* :mod:`sglang_detspec.cli`        the ``sglang-detspec`` command (serve / check / bench / demo).

The supported SGLang range is defined once, in :mod:`sglang_detspec.integration.compat` (``SUPPORTED_MIN`` /
``SUPPORTED_MAX``); ``tests/unit/test_supported_range.py`` checks that pyproject.toml and CI say the same.
"""

__version__ = "0.1.0"

