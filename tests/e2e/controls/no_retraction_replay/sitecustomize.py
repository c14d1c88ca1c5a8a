"""E2E control only (never installed, never on a user's path): DETSPEC without the retraction replay.

Put on PYTHONPATH by ``tests/e2e/e2e_harness.py`` for the ``detspec_noreplay_forced_retract`` and
``invariant_noreplay_forced_retract`` servers alone. Python
runs ``sitecustomize`` at start-up in every process of that server; this one makes
:func:`sglang_detspec.integration.setup.retraction.enable_replay` (which the scheduler's start-up check calls once it has
verified the DETSPEC workers) do nothing, so a retracted request is re-prefilled over prompt + output as upstream
does and its next token is sampled by the target sampler instead of a verify round. Everything else is the product.
``tests/e2e/test_e2e_pressure.py`` expects this server's retracted probe to *change*: it shows that the pressure
run can see what the replay fixes. ``tests/e2e/test_e2e_invariant_pressure.py`` only records what the invariant
mode's server gives without it (its re-prefill samples with the non-speculative key, so it may keep its tokens).
"""

from sglang_detspec.integration.setup import retraction


def _replay_stays_off() -> None:
    return None


retraction.enable_replay = _replay_stays_off
