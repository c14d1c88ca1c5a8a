"""The tests of an E2E module for an opt-in that replaces DETSPEC_EAGLE's verify attention kernel (the decode-order
verify, the split-KV verify kernel): written once, each module names its servers and the install line.

:func:`opt_in_tests` returns a module's fixture and test functions; the module puts them in its namespace
(``globals().update(...)``), where pytest collects them. What they check: one probe output under every traffic
profile of ``sglang-detspec check`` on the opt-in's servers (CUDA graphs on and off), the same tokens on both, an
accept length inside ``accept_range`` (the weighted pair rejects drafts, so rejection sampling runs), and the install
line (``installed`` and ``asked_by``) in each server's log. Controls that must fail: built-in EAGLE + rejection
sampling under the same uniform traffic gives several outputs, and the log of ``without`` (a DETSPEC_EAGLE server
that does not run the kernel) lacks the install line.
"""

from typing import Callable, Dict, Sequence, Tuple

import pytest

import e2e_checks as ec


def opt_in_tests(servers: Sequence[str], *, without: str, control: str, installed: str, asked_by: str,
                 accept_range: Tuple[float, float], trials: int, seed: int) -> Dict[str, Callable]:
    servers = tuple(servers)

    @pytest.fixture(scope="module")
    def checks(e2e_pool):
        ready = {name: e2e_pool.ready(name) for name in (*servers, control)}
        traffic = {name: "uniform" if name == control else "all" for name in ready}
        return ec.run_checks(ready, traffic, trials=trials, seed=seed)

    @pytest.mark.parametrize("name", servers)
    def test_one_output_under_every_profile(checks, name):
        r = checks[name]
        assert r["returncode"] == 0, r["stdout"] + r["stderr"]
        ec.assert_one_output_per_profile(r, profiles=ec.ALL_PROFILES)

    @pytest.mark.parametrize("name", servers)
    def test_the_accept_length_shows_rejection(checks, name):
        accept = checks[name]["report"]["probe_accept_length"]
        assert accept is not None and accept_range[0] <= accept <= accept_range[1], accept

    def test_the_control_gives_several_outputs(checks):
        r = checks[control]
        assert r["returncode"] == 1 and r["report"]["unique_outputs"] > 1, r["stdout"] + r["stderr"]

    def test_graphs_on_and_off_give_the_same_tokens(checks):
        first = {name: tuple(checks[name]["report"]["trials"][0]["output_ids"]) for name in servers}
        assert len(set(first.values())) == 1, first

    @pytest.mark.parametrize("name", servers)
    def test_the_log_says_the_kernel_was_installed(checks, e2e_pool, name):
        log = e2e_pool.get(name).log_text()
        assert installed in log and asked_by in log

    def test_a_server_without_it_has_no_install_line(e2e_pool):
        assert installed not in e2e_pool.ready(without).log_text()

    return {f.__name__: f for f in (
        test_one_output_under_every_profile, test_the_accept_length_shows_rejection,
        test_the_control_gives_several_outputs, test_graphs_on_and_off_give_the_same_tokens,
        test_the_log_says_the_kernel_was_installed, test_a_server_without_it_has_no_install_line,
    )} | {"checks": checks}
