"""The speculative-algorithm names the plugin registers, and the builtin algorithm each runs as: written once.

``DETSPEC_EAGLE`` / ``DETSPEC_EAGLE3`` verify by seeded rejection sampling; their ``_INVARIANT`` twins by the coupled
race (:mod:`sglang_detspec.integration.sampling.scheme`). Each runs as its builtin twin ``EAGLE`` / ``EAGLE3`` during
server-argument resolution and answers SGLang's questions like it
(:mod:`sglang_detspec.integration.setup.algorithm`). Standard library only: the commands (``serve``, ``check``), which
must run where SGLang is missing or of another release, read the same names as the integration that registers them.
"""

from __future__ import annotations

from typing import Dict

__all__ = ["DETSPEC_ALGORITHMS", "DETSPEC_TWINS"]

#: Registered name -> the builtin algorithm whose behaviour (and server-argument handling) it reuses.
DETSPEC_TWINS: Dict[str, str] = {
    "DETSPEC_EAGLE": "EAGLE",
    "DETSPEC_EAGLE3": "EAGLE3",
    "DETSPEC_EAGLE_INVARIANT": "EAGLE",
    "DETSPEC_EAGLE3_INVARIANT": "EAGLE3",
}
DETSPEC_ALGORITHMS = tuple(DETSPEC_TWINS)
