"""SGLang integration of sglang-detspec: the DETSPEC_EAGLE / DETSPEC_EAGLE3 speculative algorithms.

Importing this package checks the installed SGLang release first (supported: 0.5.17 to 0.5.23) and refuses
an unsupported one with :class:`~sglang_detspec.integration.compat.UnsupportedSGLangVersion` (an
``ImportError``) that names the supported range. A *missing* SGLang is tolerated here so that
:mod:`sglang_detspec.integration.sampling.proposal` (which only dispatches to the Triton kernel / torch reference)
stays importable on machines without SGLang; the modules that need SGLang fail on their own imports, and
:mod:`sglang_detspec.plugin` requires it.

Layout (each sub-package imports only those listed after it)
------------------------------------------------------------
* :mod:`~sglang_detspec.integration.setup`     what the plugin installs at start-up: the registered algorithms,
  the server-argument hook and its refusals (one table), the scheduler check, the request-level hooks;
* :mod:`~sglang_detspec.integration.workers`   the draft and spec workers and their CUDA-graph runners;
* :mod:`~sglang_detspec.integration.sampling`  the seeded proposal, the verify, the target sampler;
* :mod:`~sglang_detspec.integration.compat`    every difference between the supported SGLang releases (cheap to
  import), and nothing that is the same on all of them;
* :mod:`~sglang_detspec.integration.upstream_code` running SGLang's own method bodies with DETSPEC names in place.
"""

from sglang_detspec.integration.compat import check_sglang_version as _check_sglang_version

_check_sglang_version(required=False)
