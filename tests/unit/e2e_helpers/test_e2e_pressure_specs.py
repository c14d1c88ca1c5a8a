"""CPU test of what the two pressure modules (tests/e2e/test_e2e_pressure.py, test_e2e_invariant_pressure.py) rely on
before a GPU: every server they count as forced runs SGLang's forced retraction aimed at the probe their checks send,
so a run cannot pass without ever retracting the probe. Left to SGLang's own order, the replay's rewound fillers took
every forced retraction (H100, 2026-12-06: 30 - 37 per trial, the probe in none of 11 loaded trials)."""

import os

import pytest
import test_e2e_invariant_pressure as invariant_pressure
import test_e2e_pressure as pressure

import e2e_harness as h
from e2e_spec_resolution import invariant_session_specs, session_specs

CASES = [(pressure, name) for name in pressure.FORCED] + [(invariant_pressure, name)
                                                          for name in invariant_pressure.INVARIANT]


def _specs(monkeypatch):
    invariant = invariant_session_specs(h, monkeypatch)  # first: session_specs stubs the invariant servers out
    return {**session_specs(h, monkeypatch), **invariant}


@pytest.mark.parametrize(("module", "name"), CASES, ids=[name for _, name in CASES])
def test_every_forced_server_retracts_the_probe_its_check_sends(module, name, monkeypatch):
    specs = _specs(monkeypatch)
    env = specs[name].env
    assert env["SGLANG_TEST_RETRACT"] == "1"
    assert str(h.RETRACT_PROBE_CONTROL) in env["PYTHONPATH"].split(os.pathsep)
    assert env["DETSPEC_TEST_RETRACT_PROBE_SEED"] == str(module.SEED)


def test_the_no_replay_controls_keep_sglangs_own_order(monkeypatch):
    """The controls retract the probe under SGLang's order already (the fillers keep their tokens there)."""
    specs = _specs(monkeypatch)
    for name in (pressure.NO_REPLAY, invariant_pressure.NO_REPLAY):
        assert str(h.RETRACT_PROBE_CONTROL) not in specs[name].env["PYTHONPATH"].split(os.pathsep)
        assert str(h.NO_REPLAY_CONTROL) in specs[name].env["PYTHONPATH"].split(os.pathsep)
