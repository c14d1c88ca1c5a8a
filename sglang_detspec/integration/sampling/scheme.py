"""Which verify rule this process's DETSPEC worker runs: seeded rejection sampling, or the coupled race.

Two families of algorithms share every worker, graph runner and rebinding of this package:

* ``DETSPEC_EAGLE`` / ``DETSPEC_EAGLE3`` (:data:`REJECTION`): the draft draws ``X ~ q`` from the DETSPEC draft
  stream (salted keys) and the verify runs SGLang's rejection-sampling kernel with seeded coins. Reproducible per
  seed, but the tokens differ from a non-speculative server's.
* ``DETSPEC_EAGLE_INVARIANT`` / ``DETSPEC_EAGLE3_INVARIANT`` (:data:`COUPLED`, issue 18): the draft proposes
  ``argmax(log q + G)`` and the verify computes the target's ``argmax(log p + G)`` with the *same* Gumbel noise
  ``G`` -- SGLang's non-speculative seeded sampler's, keyed by (seed, position, token id) -- and accepts a draft
  while the two agree (Daliri, Musco, Suresh, arXiv 2408.07978). Every emitted token is the one the
  non-speculative sampler would have drawn from those probabilities, whatever the draft proposed.

The two differ in exactly two places: the draft proposal (:mod:`sglang_detspec.integration.sampling.proposal`) and the
verify's accept rule (:mod:`sglang_detspec.integration.sampling.verify`). Both read :func:`current` at call time, which under
CUDA-graph capture means once, at capture: the scheme is fixed when the worker is built (by the algorithm's worker
factory, :func:`sglang_detspec.integration.setup.algorithm.detspec_worker_factory`) and a scheduler process serves one
speculative algorithm for its whole life.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

__all__ = ["COUPLED", "REJECTION", "SCHEMES", "current", "scheme_for_algorithm", "select", "selected"]

REJECTION = "rejection"
COUPLED = "coupled"
SCHEMES = (REJECTION, COUPLED)

#: Algorithm-name suffix of the coupled family.
INVARIANT_SUFFIX = "_INVARIANT"

_selected: Optional[str] = None


def scheme_for_algorithm(name: str) -> str:
    """:data:`COUPLED` for ``DETSPEC_*_INVARIANT`` names, :data:`REJECTION` for the other DETSPEC names."""
    return COUPLED if str(name).upper().endswith(INVARIANT_SUFFIX) else REJECTION


def select(scheme: str) -> None:
    """Fix this process's scheme (called when a DETSPEC worker is built)."""
    global _selected
    if scheme not in SCHEMES:
        raise ValueError(f"unknown DETSPEC verify scheme {scheme!r}; expected one of {SCHEMES}")
    _selected = scheme


def current() -> str:
    """The scheme a proposal or verify must use now: the selected one, :data:`REJECTION` before any selection.

    The default is the scheme of the original ``DETSPEC_EAGLE`` algorithm, whose workers (and their unit tests) were
    built before this module existed; the coupled family always selects explicitly.
    """
    return _selected or REJECTION


@contextlib.contextmanager
def selected(scheme: str) -> Iterator[None]:
    """Run a block under ``scheme`` and restore the previous selection (for tests and in-process tools)."""
    global _selected
    previous = _selected
    select(scheme)
    try:
        yield
    finally:
        _selected = previous
