"""SGLang integration of sglang-detspec: the DETSPEC_EAGLE / DETSPEC_EAGLE3 speculative algorithms.

Importing this package checks the installed SGLang release first (supported: 0.5.17 to 0.5.23) and refuses
an unsupported one with :class:`~sglang_detspec.integration.compat.UnsupportedSGLangVersion` (an
``ImportError``) that names the supported range. A *missing* SGLang is tolerated here so that
:mod:`sglang_detspec.integration.sampling.proposal` (which only dispatches to the Triton kernel / torch reference)
stays importable on machines without SGLang; the modules that need SGLang fail on their own imports, and
:mod:`sglang_detspec.plugin` requires it.

Modules
-------
* :mod:`~sglang_detspec.integration.compat`       every 0.5.17 / 0.5.23 difference (cheap to import);
* :mod:`~sglang_detspec.integration.setup.algorithm`    the registered ``CustomSpecAlgo`` classes and worker factory;
* :mod:`~sglang_detspec.integration.setup.server_args`  server-argument handling (defaults and refusals);
* :mod:`~sglang_detspec.integration.sampling.proposal`     the one seeded draft-sampling entry point;
* :mod:`~sglang_detspec.integration.workers.single_layer` / ``multi_layer`` / ``workers``  the draft workers.
"""

from sglang_detspec.integration.compat import check_sglang_version as _check_sglang_version

_check_sglang_version(required=False)
