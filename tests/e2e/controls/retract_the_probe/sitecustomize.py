"""E2E harness only (never installed, never on a user's path): SGLang's retraction aimed at the probe.

Why: SGLang retracts the running request with the fewest output tokens first (``ScheduleBatch.
_get_decode_retraction_order``), and DETSPEC's replay rewinds a retracted request to its prompt (output ids
emptied), so the request retracted last is again the one with the fewest tokens and is retracted next. Under
``SGLANG_TEST_RETRACT`` the forced retractions then keep landing on replaying fillers: on an H100 (sglang 0.5.17,
2026-12-05) ``check --traffic pressure`` on the invariant servers never saw its probe retracted in 11 loaded trials
(graphs on and off), and DETSPEC_EAGLE's probe only in 1, so the pressure test said nothing about retraction.

What it changes: the retraction order only. Once the probe -- the request whose ``sampling_seed`` is
``DETSPEC_TEST_RETRACT_PROBE_SEED`` -- holds at least ``DETSPEC_TEST_RETRACT_PROBE_AFTER`` output tokens and
another request runs beside it, it is moved to the end of SGLang's order, which ``retract_decode`` pops first; at
most ``DETSPEC_TEST_RETRACT_PROBE_TIMES`` times per request. With two, the second retraction lands while the replay
is still regenerating what the client already holds (the replay's "retracted again" path). Everything else --
when SGLang retracts (pool overflow, ``SGLANG_TEST_RETRACT``), how it releases the request, the replay -- is the
product's and SGLang's. Registered with SGLang's own ``HookRegistry``, which applies it with the plugins' hooks in
every process that loads plugins (the scheduler among them).

Put on PYTHONPATH by ``tests/e2e/e2e_harness.py`` (``with_control(RETRACT_PROBE_CONTROL, ...)``) for the servers of
``tests/e2e/test_e2e_invariant_pressure.py`` and the forced servers of ``tests/e2e/test_e2e_pressure.py``;
``tests/unit/e2e_helpers/test_retract_probe_control.py`` checks the hook on CPU against the installed SGLang's own
ordering.
"""

import logging
import os
from collections import Counter

#: The retraction order this control reorders (a staticmethod in sglang 0.5.17 - 0.5.23; HookRegistry keeps it one).
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch._get_decode_retraction_order"
SEED_ENV = "DETSPEC_TEST_RETRACT_PROBE_SEED"
AFTER_ENV = "DETSPEC_TEST_RETRACT_PROBE_AFTER"
TIMES_ENV = "DETSPEC_TEST_RETRACT_PROBE_TIMES"

logger = logging.getLogger("detspec_e2e.retract_the_probe")


def make_hook(seed: int, after: int, times: int):
    """The AROUND hook: SGLang's order, then the eligible probe (if any) moved to the end."""
    retracted = Counter()  # request id -> times this hook put the request last (one scheduler per process)

    def retract_the_probe_first(original, reqs, *args, **kwargs):
        order = original(reqs, *args, **kwargs)
        if len(order) < 2:  # retract_decode always keeps one request: nothing would be retracted
            return order
        for i in order:
            req = reqs[i]
            if (getattr(req.sampling_params, "sampling_seed", None) == seed and len(req.output_ids) >= after
                    and retracted[req.rid] < times):
                order.remove(i)
                order.append(i)
                retracted[req.rid] += 1
                logger.warning("retract_the_probe (E2E control): probe %s retracted after %d output tokens (%d of %d)",
                               req.rid, len(req.output_ids), retracted[req.rid], times)
                break
        return order

    return retract_the_probe_first


def _register_from_env() -> None:
    if SEED_ENV not in os.environ:
        raise RuntimeError(f"retract_the_probe control: {SEED_ENV} is not set (tests/e2e/e2e_harness.py sets it)")
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hook = make_hook(int(os.environ[SEED_ENV]), int(os.environ.get(AFTER_ENV, "32")),
                     int(os.environ.get(TIMES_ENV, "2")))
    HookRegistry.register(TARGET, hook, HookType.AROUND)


if __name__ == "sitecustomize":  # imported by Python at start-up; a unit test imports it under another name
    _register_from_env()
