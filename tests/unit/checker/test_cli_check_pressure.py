"""``sglang-detspec check --traffic pressure`` against the fake server's KV-pool model (tests/unit/fake_sglang_server.py,
``retraction=True``): the load is sized from the server's own limits and really overflows its pool, each trial says
whether the probe or only another request was retracted (``meta_info.num_retractions``, ``/metrics``), a server whose
retracted requests change fails, one that never retracts is inconclusive (exit 3), and ``all`` leaves pressure out."""

import json
import os
import subprocess
import sys

import pytest

from sglang_detspec.checker import DEFAULT_PROMPT, EXIT_INCONCLUSIVE, parse_traffic, run_check
from sglang_detspec.checker import traffic as tr
from sglang_detspec.command_base import CliError

from fake_sglang_server import DIVERGE_AT, FakeSGLang, fake_tokenize

POOL = 1024
PROBE_TOKENS = 64


def cli(*args, timeout=120):
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_detspec", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def pressure_server(**kw):
    return FakeSGLang(max_total_num_tokens=POOL, retraction=True, delay=0.3, **kw)


def fillers_of(fake, trial):
    return [q for q in fake.generate_requests if q["text"].startswith(f"Request pressure.{trial}.")]


def test_all_keeps_its_four_profiles_and_pressure_is_opt_in():
    assert parse_traffic("all") == ("uniform", "mixed", "long", "prefix")
    assert parse_traffic("pressure") == ("pressure",)
    assert parse_traffic("pressure,all") == ("uniform", "mixed", "long", "prefix", "pressure")
    with pytest.raises(ValueError, match="pressure"):
        parse_traffic("presure")  # the error lists the profile names, pressure among them


def test_pressure_overflows_the_pool_and_every_loaded_trial_retracts_the_probe(tmp_path):
    report = tmp_path / "check.json"
    with pressure_server(metrics=True) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "pressure", "--trials", "5", "--max-new-tokens",
                   str(PROBE_TOKENS), "--report", str(report), "--no-progress")
        loads = {t: fillers_of(fake, t) for t in range(1, 5)}
        timeline = list(fake.timeline)
        texts = [q["text"] for q in fake.generate_requests]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    (profile,) = data["profiles"]
    assert profile["name"] == "pressure" and profile["unique_outputs"] == 1 and profile["passed"]
    assert profile["probe_retracted_trials"] == [1, 2, 3, 4] and profile["inconclusive"] is False
    # What was sent asks for at least PRESSURE_MIN_OVERCOMMIT times the pool, counted with the fake's own tokenizer.
    for t, fillers in loads.items():
        demand = sum(len(fake_tokenize(q["text"])) + q["sampling_params"]["max_new_tokens"] for q in fillers)
        assert demand > tr.PRESSURE_MIN_OVERCOMMIT * POOL, (t, demand)
        assert len(fillers) <= 32 - 1  # max_running_requests less the probe's slot
        assert all(PROBE_TOKENS <= q["sampling_params"]["max_new_tokens"] <= PROBE_TOKENS * 9 // 8 for q in fillers)
    # The probe arrives after its trial's fillers (the youngest request); sockets and the fake's accept loop may
    # delay a few of them on a loaded machine, so most of them (the probe sent first would precede them all).
    arrivals = [text for _, what, _, text in timeline if what == "arrive"]
    for t in range(1, 5):
        probe_at = [i for i, x in enumerate(arrivals) if x == DEFAULT_PROMPT][t]
        earlier = sum(arrivals.index(q["text"]) < probe_at for q in loads[t])
        assert earlier >= 0.75 * len(loads[t]), (t, earlier, len(loads[t]))
    assert texts.count(DEFAULT_PROMPT) == 5
    for trial in data["trials"][1:]:
        assert trial["num_retractions"] == 1 and trial["filler_retractions"] > 0
        assert trial["server_retractions"] == trial["filler_retractions"] + 1  # /metrics counts the probe too
    line = next(x for x in proc.stdout.splitlines() if x.startswith("pressure:"))
    assert "probe retracted in 4 of 4 loaded trials (1, 2, 3, 4)" in line, proc.stdout
    assert "PASS" in proc.stdout


def test_a_server_whose_retracted_requests_change_fails_and_names_the_trials():
    def retracted(req, served):
        return served.retractions > 0

    with pressure_server(diverge_if=retracted) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "pressure", "--trials", "3", "--max-new-tokens",
                   str(PROBE_TOKENS), "--no-progress")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("pressure:"))
    assert f"2 of 3 differ from the reference, first at token {DIVERGE_AT}" in line, line
    assert "probe retracted in 2 of 2 loaded trials (1, 2)" in line, line
    assert "FAIL" in proc.stdout


def test_no_retraction_is_inconclusive_not_a_pass():
    with FakeSGLang(max_total_num_tokens=POOL, retraction=False, delay=0.3) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "pressure", "--trials", "3", "--max-new-tokens",
                   str(PROBE_TOKENS), "--no-progress")
    assert proc.returncode == EXIT_INCONCLUSIVE == 3, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("pressure:"))
    assert "probe retracted in 0 of 2 loaded trials (none); no retraction (no evidence) in trials 1, 2" in line, line
    assert "INCONCLUSIVE" in proc.stdout and "PASS" not in proc.stdout
    assert "no trial retracted the probe" in proc.stderr


def test_only_other_requests_retracted_is_reported_apart_and_still_inconclusive():
    # A server that retracts only the fillers: the probe's own count is zeroed, the other requests' stay.
    with pressure_server(metrics=True) as fake:
        orig = fake._completion

        def _probe_never_retracted(req, rid, sample, served, seen, prompt_tokens):
            if req["text"] == DEFAULT_PROMPT:
                served.retractions = 0
            return orig(req, rid, sample, served, seen, prompt_tokens)

        fake._completion = _probe_never_retracted
        result = run_check(fake.url, traffic="pressure", trials=3, max_new_tokens=PROBE_TOKENS)
    (p,) = result.profiles
    assert p.probe_retracted_trials == [] and p.other_retraction_trials == [1, 2] and p.no_retraction_trials == []
    assert result.inconclusive and not result.passed and result.deterministic


def test_retraction_not_observable_says_so():
    with pressure_server(report_retractions=False) as fake:
        result = run_check(fake.url, traffic="pressure", trials=2, max_new_tokens=PROBE_TOKENS)
    assert result.inconclusive
    assert any("neither meta_info.num_retractions nor /metrics" in w for w in result.warnings), result.warnings


def test_a_pool_too_large_to_overflow_is_refused_naming_the_fix():
    with FakeSGLang(max_total_num_tokens=65536, retraction=True) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "pressure", "--trials", "3", "--no-progress")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--max-total-tokens" in proc.stderr and "--max-new-tokens" in proc.stderr, proc.stderr
    assert "65536" in proc.stderr and "max_running_requests 32" in proc.stderr, proc.stderr


def test_pressure_load_sizing_follows_the_server_limits():
    load = tr.pressure_load(max_total_num_tokens=4096, max_running_requests=32, probe_new_tokens=256,
                            filler_prompt_tokens=20)
    assert load.fillers == 30  # ceil(2 * 4096 / 276), under 32 - 1
    assert load.demand_tokens == 31 * 276
    capped = tr.pressure_load(max_total_num_tokens=4096, max_running_requests=9, probe_new_tokens=600,
                              filler_prompt_tokens=20)
    assert capped.fillers == 8
    # Too short for 8 fillers to overflow 4096 tokens: refused, and each suggested fix is one that is accepted.
    with pytest.raises(ValueError) as refused:
        tr.pressure_load(max_total_num_tokens=4096, max_running_requests=9, probe_new_tokens=512,
                         filler_prompt_tokens=20)
    words = str(refused.value).split()
    pool = int(words[words.index("--max-total-tokens") + 1])
    longer = int(words[words.index("--max-new-tokens") + 1])
    assert pool < 4096 and longer > 512
    assert tr.pressure_load(max_total_num_tokens=pool, max_running_requests=9, probe_new_tokens=512,
                            filler_prompt_tokens=20).fillers == 8
    assert tr.pressure_load(max_total_num_tokens=4096, max_running_requests=9, probe_new_tokens=longer,
                            filler_prompt_tokens=20).fillers == 8
    with pytest.raises(ValueError, match="max_total_num_tokens"):
        tr.pressure_load(max_total_num_tokens=None, max_running_requests=32, probe_new_tokens=256,
                         filler_prompt_tokens=20)
    with pytest.raises(ValueError, match="--max-new-tokens"):
        tr.pressure_load(max_total_num_tokens=4096, max_running_requests=2, probe_new_tokens=256,
                         filler_prompt_tokens=20)


def test_metric_parser_sums_label_sets_and_skips_created():
    from sglang_detspec.checker.client import parse_metric_total

    text = ('# TYPE sglang:num_retracted_requests_total counter\n'
            'sglang:num_retracted_requests_total{tp_rank="0"} 3.0\n'
            'sglang:num_retracted_requests_total{tp_rank="1"} 2.0\n'
            'sglang:num_retracted_requests_created{tp_rank="0"} 1.7e9\n'
            'sglang:num_retracted_requests_total_other 9\n')
    assert parse_metric_total(text, "sglang:num_retracted_requests_total") == 5
    assert parse_metric_total("sglang:num_running_reqs 1.0\n", "sglang:num_retracted_requests_total") is None


def test_run_check_refuses_unknown_profiles_before_sending():
    with pytest.raises(CliError, match="pressure"):
        run_check("http://127.0.0.1:9", traffic=("pressure", "bogus"), trials=2)
