"""CPU tests of tests/e2e/test_e2e_invariant_pressure.py before it reaches a GPU: its checks run the real
``sglang-detspec check --traffic pressure --against`` subprocess against fake servers with a KV-pool model
(tests/unit/fake_sglang_server.py, ``retraction=True``), and its GPU assertions pass on servers that behave as the
invariant mode must and fail on ones that do not (a retracted probe that changes, a control equal to the reference).
The servers' flags are resolved by SGLang's own parser in test_e2e_invariant_helpers.py."""


import pytest
import test_e2e_invariant_pressure as e2e

import e2e_harness as h
from fake_sglang_server import FakeSGLang

POOL = 1024


class _Served:
    """What the E2E module reads of a server: its URL."""

    def __init__(self, fake):
        self.base_url = fake.url


def _changes_when_retracted(req, served):
    return served.retractions > 0


def _always_other_tokens(req, served):  # seeded and reproducible, but not the reference's stream
    return True


def _pressure_fake(diverge_if=None, algorithm="DETSPEC_EAGLE_INVARIANT"):
    return FakeSGLang(max_total_num_tokens=POOL, retraction=True, delay=0.3, metrics=True, diverge_if=diverge_if,
                      speculative_algorithm=algorithm)


@pytest.fixture
def small_run(monkeypatch, tmp_path):
    monkeypatch.setenv("DETSPEC_E2E_OUT", str(tmp_path))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(e2e, "TRIALS", 3)
    monkeypatch.setattr(e2e, "PROBE_TOKENS", 64)


def _run(fakes: dict) -> dict:
    reference = FakeSGLang(speculative_algorithm=None)
    with reference:
        for fake in fakes.values():
            fake.__enter__()
        try:
            servers = {e2e.REFERENCE: _Served(reference), **{n: _Served(f) for n, f in fakes.items()}}
            return e2e.run_checks(servers)
        finally:
            for fake in fakes.values():
                fake.__exit__(None, None, None)


def test_assertions_pass_on_an_invariant_server_and_fail_where_they_must(small_run):
    results = _run({
        "invariant_forced_retract_graph": _pressure_fake(),
        "invariant_forced_retract_nograph": _pressure_fake(diverge_if=_changes_when_retracted),
        e2e.NO_REPLAY: _pressure_fake(diverge_if=_changes_when_retracted),
        e2e.CONTROL: _pressure_fake(diverge_if=_always_other_tokens, algorithm="DETSPEC_EAGLE"),
    })
    e2e.test_the_probe_was_retracted_on_every_forced_server(results)
    e2e.test_a_retracted_invariant_probe_keeps_its_tokens(results, "invariant_forced_retract_graph")
    e2e.test_the_invariant_probe_is_the_non_speculative_servers(results, "invariant_forced_retract_graph")
    e2e.test_control_rejection_sampling_is_reproducible_but_not_the_reference(results)
    # The retracted probe changed on the second server: both of its tests fail, naming the divergence.
    with pytest.raises(AssertionError, match="differing trials"):
        e2e.test_a_retracted_invariant_probe_keeps_its_tokens(results, "invariant_forced_retract_nograph")
    with pytest.raises(AssertionError, match="exit 1"):
        e2e.test_the_invariant_probe_is_the_non_speculative_servers(results, "invariant_forced_retract_nograph")
    # The measurement-only server is recorded with its retracted trials and where it diverged.
    recorded = h.load_results()
    noreplay = recorded["invariant_pressure_noreplay"]
    assert noreplay["probe_retracted_trials"] and noreplay["divergence"]["position"] == 5  # fake's DIVERGE_AT
    assert recorded["invariant_pressure_invariant_forced_retract_graph"]["against"]["passed"] is True


def test_a_control_equal_to_the_reference_fails_the_control_test(small_run, monkeypatch):
    monkeypatch.setattr(e2e, "CHECKED", (e2e.CONTROL,))
    results = _run({e2e.CONTROL: _pressure_fake(algorithm="DETSPEC_EAGLE")})
    with pytest.raises(AssertionError, match="exit 0"):
        e2e.test_control_rejection_sampling_is_reproducible_but_not_the_reference(results)


def test_a_server_that_never_retracts_the_probe_is_no_evidence(small_run, monkeypatch):
    monkeypatch.setattr(e2e, "CHECKED", ("invariant_forced_retract_graph",))
    monkeypatch.setattr(e2e, "INVARIANT", ("invariant_forced_retract_graph",))
    monkeypatch.setattr(e2e, "CONTROL", "invariant_forced_retract_graph")
    fake = FakeSGLang(max_total_num_tokens=POOL, retraction=False, delay=0.3, metrics=True,
                      speculative_algorithm="DETSPEC_EAGLE_INVARIANT")  # a server that never retracts
    results = _run({"invariant_forced_retract_graph": fake})
    with pytest.raises(AssertionError, match="inconclusive"):
        e2e.test_the_probe_was_retracted_on_every_forced_server(results)
