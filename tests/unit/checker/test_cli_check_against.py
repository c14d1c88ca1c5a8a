"""``sglang-detspec check --against URL``: the probe, sent alone to a second server after the trials, must give the
checked server's reference tokens there too (speculation invariance against a non-speculative server, or two
drafts against each other). Fake SGLang servers (tests/unit/fake_sglang_server.py) whose outputs are a function of
prompt, seed and temperature stand in for a speculative and a non-speculative server that agree; the controls are
a second server that changes the continuation, and one that is not deterministic itself.
"""

import json

import pytest

from sglang_detspec.checker import DEFAULT_PROMPT, run_check
from sglang_detspec.command_base import CliError

from fake_sglang_server import DIVERGE_AT, FakeSGLang, token_ids
from test_cli_check import cli

ARGS = ("--traffic", "uniform", "--trials", "3", "--max-fillers", "2", "--no-progress")


def test_a_non_speculative_server_with_the_same_tokens_passes(tmp_path):
    report = tmp_path / "r.json"
    with FakeSGLang("deterministic") as spec, FakeSGLang("deterministic", speculative_algorithm=None) as plain:
        proc = cli("check", "--url", spec.url, "--against", plain.url, *ARGS, "--report", str(report))
        sent = plain.probe_responses(DEFAULT_PROMPT)
        asked = [q for q in plain.generate_requests if q["text"] == DEFAULT_PROMPT]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"against: {plain.url} (SGLang 0.5.23, speculative algorithm: off, deterministic inference: on)" \
        in proc.stdout
    assert "gave trial 0's output in 2 of 2 sends" in proc.stdout and f"the same tokens as {plain.url}" in proc.stdout
    # Only the probe went there, alone, twice, with the checked server's seed and parameters.
    assert len(plain.generate_requests) == 2 == len(asked) and plain.max_inflight == 1
    assert asked[0]["sampling_params"]["sampling_seed"] == 42
    assert [r["output_ids"] for r in sent] == [token_ids(DEFAULT_PROMPT, 42, 1.0, n=32)] * 2
    doc = json.loads(report.read_text())
    assert doc["passed"] and doc["against"]["passed"] and doc["against"]["self_consistent"]


def test_a_server_whose_tokens_differ_fails_at_the_first_differing_token():
    with FakeSGLang("deterministic") as spec, \
            FakeSGLang("deterministic", speculative_algorithm=None, diverge_if=lambda req, served: True) as plain:
        proc = cli("check", "--url", spec.url, "--against", plain.url, *ARGS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 unique probe output(s) in 3 trials" in proc.stdout, "the checked server itself is deterministic"
    assert f"differs from trial 0 from token {DIVERGE_AT} on" in proc.stdout
    assert "its 2 sends agree with each other" in proc.stdout
    assert f"FAIL: the probe's tokens differ on {plain.url}" in proc.stdout


def test_a_second_server_that_is_not_deterministic_itself_is_named_so():
    with FakeSGLang("deterministic") as spec, FakeSGLang("nondeterministic", deterministic_flag=False) as other:
        proc = cli("check", "--url", spec.url, "--against", other.url, *ARGS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "its 2 sends differ from each other as well" in proc.stdout
    assert "(which is not deterministic itself)" in proc.stdout
    assert "deterministic inference is OFF on the --against server" in proc.stderr


def test_against_the_checked_server_itself_or_an_unreachable_one_is_one_clear_error():
    with FakeSGLang("deterministic") as spec:
        with pytest.raises(CliError, match="is the checked server itself"):
            run_check(spec.url + "/", against=spec.url, trials=2, max_fillers=1, traffic="uniform")
        gone = FakeSGLang("deterministic")
        with gone:
            url = gone.url
        proc = cli("check", "--url", spec.url, "--against", url, *ARGS, "--timeout", "5")
        probes = spec.probe_responses(DEFAULT_PROMPT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"sglang-detspec check: error: --against {url}: cannot connect to {url}: Connection refused (is the server "
        "running? `sglang-detspec serve` starts one)"]
    assert probes == [], "an unreachable second server fails the check before any trial"


def test_a_malformed_against_url_is_refused_by_the_parser():
    proc = cli("check", "--url", "127.0.0.1:1", "--against", "not a url")
    assert proc.returncode == 2 and "--against" in proc.stderr


class _CountingClient:
    """Stands in for checker.client.Client inside run_check: the real one, with every instance and close() counted."""

    made: list = []

    def __init__(self, *args, **kwargs):
        from sglang_detspec.checker.client import Client

        self._real = Client(*args, **kwargs)
        self.closed = 0
        _CountingClient.made.append(self)

    def close(self):
        self.closed += 1
        self._real.close()

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.mark.parametrize("against", ["itself", "not a url", "gone"])
def test_every_client_is_closed_when_against_is_refused(monkeypatch, against):
    """The checked server's client is open before --against is looked at: a refusal (the same server, a URL the
    API gets unparsed, an unreachable server) must still close it, and the second one if it was made."""
    import importlib

    monkeypatch.setattr(importlib.import_module("sglang_detspec.checker.run"), "Client", _CountingClient)
    monkeypatch.setattr(_CountingClient, "made", [])
    with FakeSGLang("deterministic") as spec:
        gone = FakeSGLang("deterministic")
        with gone:
            gone_url = gone.url
        url = {"itself": spec.url, "not a url": "not a url", "gone": gone_url}[against]
        with pytest.raises(CliError):
            run_check(spec.url, against=url, trials=2, max_fillers=1, traffic="uniform", timeout=5)
    assert _CountingClient.made, "run_check made no client: the fake did not stand in"
    assert [c.closed for c in _CountingClient.made] == [1] * len(_CountingClient.made)
    assert len(_CountingClient.made) == (2 if against == "gone" else 1)


def test_an_against_server_that_ignores_the_seed_is_named_before_the_first_trial(capsys):
    """With the progress bar on (someone is watching), the warning comes at connect time, before any trial's bar,
    not only in the summary after minutes of trials; the result still carries it once."""
    with FakeSGLang("deterministic") as spec, \
            FakeSGLang("deterministic", speculative_algorithm=None, deterministic_flag=False) as plain:
        res = run_check(spec.url, against=plain.url, trials=2, max_fillers=1, traffic="uniform", progress=True)
    err = capsys.readouterr().err
    warning = f"deterministic inference is OFF on the --against server {plain.url}"
    assert sum(warning in w for w in res.warnings) == 1
    assert warning in err and "check [" in err
    assert err.index(warning) < err.index("check ["), err
