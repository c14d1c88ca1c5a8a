"""``sglang-detspec check`` against a local fake SGLang server (tests/unit/fake_sglang_server.py): connecting,
waiting, errors, the uniform profile's verdicts and the report. The other traffic profiles are in
test_cli_check_traffic.py.

The CLI runs as a real subprocess (``python -m sglang_detspec check ...``) so exit codes and stderr are the ones
a user sees; ``run_check`` (the function the GPU end-to-end tests call) is exercised in-process.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from sglang_detspec.checker import DEFAULT_PROMPT, run_check
from sglang_detspec.command_base import CliError

from fake_sglang_server import DIVERGE_AT, ERROR_MESSAGE, FakeSGLang, detokenize, token_ids


def cli(*args, timeout=120):
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_detspec", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_deterministic_server_passes_and_load_really_varies():
    with FakeSGLang("deterministic", delay=0.02) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform", "--trials", "6", "--max-fillers", "5",
                   "--no-progress")
        probes = fake.probe_responses(DEFAULT_PROMPT)
        fillers = [q for q in fake.generate_requests if q["text"] != DEFAULT_PROMPT]
        max_inflight = fake.max_inflight
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 unique probe output(s) in 6 trials" in proc.stdout
    assert "token ids (output_ids)" in proc.stdout
    assert "PASS" in proc.stdout and "FAIL" not in proc.stdout
    assert len(probes) == 6
    # 0+1+2+3+4+5 fillers over the 6 trials (round(t * 5 / 5)), of varied lengths, sent alongside the probe.
    assert len(fillers) == 15
    assert len({q["sampling_params"]["max_new_tokens"] for q in fillers}) > 3
    assert len({len(q["text"]) for q in fillers}) > 3
    assert max_inflight > 1
    # The probe is what the issue specifies: seeded, temperature 1.0, fixed length.
    q = [q for q in fake.generate_requests if q["text"] == DEFAULT_PROMPT][0]
    assert q["sampling_params"] == {"temperature": 1.0, "max_new_tokens": 32, "sampling_seed": 42, "ignore_eos": True}


def test_nondeterministic_server_fails_with_first_diverging_token():
    with FakeSGLang("nondeterministic") as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform", "--trials", "4", "--max-fillers", "3",
                   "--no-progress")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "4 unique probe output(s) in 4 trials" in proc.stdout
    assert "3 of 3 trials differ from trial 0" in proc.stdout
    assert f"first divergence at token {DIVERGE_AT}:" in proc.stdout
    assert "FAIL" in proc.stdout and "PASS" not in proc.stdout


def test_batch_dependent_server_fails():
    # The output depends on how many requests were in flight: the check's changing load must expose it.
    with FakeSGLang("batch_dependent", delay=0.05) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform", "--trials", "4", "--max-fillers", "6",
                   "--no-progress")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"first divergence at token {DIVERGE_AT}:" in proc.stdout


def test_text_only_server_compares_characters():
    with FakeSGLang("nondeterministic", output_ids=False) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform", "--trials", "3", "--max-fillers", "2",
                   "--no-progress")
        texts = [r["text"] for r in fake.probe_responses(DEFAULT_PROMPT)]
    assert proc.returncode == 1
    assert "compared as text" in proc.stdout
    expected = min(len(os.path.commonprefix([texts[0], t])) for t in texts[1:])
    assert f"first divergence at character {expected}:" in proc.stdout


def test_server_error_is_one_clear_line():
    with FakeSGLang("error500") as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--no-progress")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "HTTP 500" in lines[0] and ERROR_MESSAGE in lines[0]


def test_unreachable_server_is_one_clear_line():
    port = free_port()
    proc = cli("check", "--url", f"127.0.0.1:{port}", "--trials", "2", "--no-progress")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"cannot connect to http://127.0.0.1:{port}" in lines[0]
    assert "refused" in lines[0].lower()


@pytest.mark.parametrize("mode", ["html", "not_found"])
def test_non_sglang_endpoint_is_one_clear_line(mode):
    with FakeSGLang(mode) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--no-progress")
        generated = len(fake.generate_requests)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "is not an SGLang server" in lines[0]
    assert generated == 0


def test_timeout_is_one_clear_line():
    with FakeSGLang("deterministic", delay=3.0) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform", "--trials", "2", "--max-fillers", "0",
                   "--timeout", "0.5",
                   "--no-progress")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "did not answer within 0.5 s" in lines[0]


def test_wait_for_a_server_that_is_still_starting():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_detspec", "check", "--url", f"127.0.0.1:{port}", "--trials", "2",
         "--max-fillers", "1", "--wait", "60", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(2.0)
        assert proc.poll() is None, proc.communicate()  # still waiting, not failed
        with FakeSGLang("deterministic", port=port):
            out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert "PASS" in out


def test_waits_for_the_servers_own_warmup_before_probing():
    # SGLang answers /server_info before its warm-up request has finished and /health with 503 until then;
    # probing earlier mixed the probe with the greedy warm-up batch (a multi-minute kernel JIT on the H200).
    with FakeSGLang("deterministic", starting_health_polls=3) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--wait", "30", "--no-progress")
        events = list(fake.events)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    health = [code for path, code in events if path == "/health"]
    assert health[:3] == [503, 503, 503] and 200 in health
    first_generate = next(i for i, (path, _) in enumerate(events) if path == "/generate")
    last_503 = max(i for i, (_, code) in enumerate(events) if code == 503)
    assert first_generate > last_503


def test_starting_server_without_wait_is_one_clear_line():
    with FakeSGLang("deterministic", starting_health_polls=1000) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--no-progress")
        generated = [e for e in fake.events if e[0] == "/generate"]
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "/health answers HTTP 503" in lines[0] and "--wait" in lines[0]
    assert not generated


def test_wait_gives_up_on_a_server_that_never_finishes_warming_up():
    with FakeSGLang("deterministic", starting_health_polls=1000) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--wait", "1", "--no-progress")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "still answers HTTP 503 after --wait 1 s" in lines[0], proc.stderr


def test_a_server_without_a_health_endpoint_is_checked():
    with FakeSGLang("deterministic", health=False) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "PASS" in proc.stdout


def test_warns_when_deterministic_inference_is_off():
    with FakeSGLang("deterministic", deterministic_flag=False, speculative_algorithm=None) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--no-progress")
    assert proc.returncode == 0
    assert "deterministic inference is OFF" in proc.stderr
    assert "speculative algorithm: off" in proc.stdout
    assert "accept:" not in proc.stdout


def test_warns_when_drafts_are_never_accepted():
    with FakeSGLang("deterministic", accept_length=1.0) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--no-progress")
    assert proc.returncode == 0
    assert "accept length is 1.00" in proc.stderr
    assert "1.00 tokens per verify step on the probe" in proc.stdout


def test_old_info_endpoint_and_plugin_absent_note():
    with FakeSGLang("deterministic", info_paths=("/get_server_info",), speculative_algorithm="EAGLE") as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--no-progress")
        info_paths = list(fake.info_requests)
    assert proc.returncode == 0, proc.stderr
    assert info_paths and set(info_paths) == {"/get_server_info"}
    assert "EAGLE (not a DETSPEC algorithm" in proc.stdout


def test_report_json(tmp_path):
    report = tmp_path / "check.json"
    with FakeSGLang("deterministic") as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform", "--trials", "3", "--max-fillers", "4", "--seed", "7",
                   "--temperature", "0.8", "--max-new-tokens", "9", "--seeds", "1,2,3", "--report", str(report),
                   "--no-progress")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    assert data["passed"] is True and data["deterministic"] is True
    assert data["unique_outputs"] == 1 and data["compared"] == "output_ids" and data["divergence"] is None
    assert data["seed"] == 7 and data["temperature"] == 0.8 and data["max_new_tokens"] == 9
    assert data["server"]["version"] == "0.5.23"
    assert data["server"]["speculative_algorithm"] == "DETSPEC_EAGLE"
    assert data["server"]["deterministic_inference"] is True
    assert data["server"]["avg_spec_accept_length"] == 2.5
    assert [t["fillers"] for t in data["trials"]] == [0, 2, 4]
    want = token_ids(DEFAULT_PROMPT, 7, 0.8, n=9)
    for t in data["trials"]:
        assert t["output_ids"] == want and t["text"] == detokenize(want)
        assert t["spec_verify_ct"] == 5 and t["spec_accept_length"] == pytest.approx(9 / 5)
        assert len(t["filler_max_new_tokens"]) == t["fillers"]
    sc = data["seeds_check"]
    assert sc["seeds"] == [1, 2, 3] and sc["collisions"] == [] and sc["passed"] is True
    assert [o["output_ids"] for o in sc["outputs"]] == [token_ids(DEFAULT_PROMPT, s, 0.8, n=9) for s in (1, 2, 3)]


def test_report_json_on_failure(tmp_path):
    report = tmp_path / "check.json"
    with FakeSGLang("nondeterministic") as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform", "--trials", "3", "--max-fillers", "1", "--report",
                   str(report),
                   "--no-progress")
    assert proc.returncode == 1
    data = json.loads(report.read_text())
    assert data["passed"] is False and data["unique_outputs"] == 3
    assert data["differing_trials"] == [1, 2]
    d = data["divergence"]
    assert d["unit"] == "token" and d["position"] == DIVERGE_AT
    trials = data["trials"]
    assert d["expected"] == trials[0]["output_ids"][DIVERGE_AT]
    assert d["got"] == trials[d["trial"]]["output_ids"][DIVERGE_AT]


def test_seeds_identical_outputs_fail():
    with FakeSGLang("seed_ignored") as fake:
        proc = cli("check", "--url", fake.url, "--trials", "2", "--max-fillers", "1", "--seeds", "5,6",
                   "--no-progress")
    assert proc.returncode == 1
    assert "distinct seeds gave identical outputs: 5 = 6" in proc.stdout


def test_seeds_distinct_pass():
    with FakeSGLang("deterministic") as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform", "--trials", "2", "--max-fillers", "1",
                   "--seeds", "5,6,7",
                   "--no-progress")
        seeds_sent = [q["sampling_params"]["sampling_seed"] for q in fake.generate_requests
                      if q["text"] == DEFAULT_PROMPT]
    assert proc.returncode == 0, proc.stdout
    assert "3 seeds gave 3 distinct outputs" in proc.stdout
    assert sorted(seeds_sent) == [5, 6, 7, 42, 42]


@pytest.mark.parametrize("args", [["--trials", "1"], ["--seeds", "3"], ["--seeds", "a,b"], []])
def test_usage_errors(args):
    extra = [] if args == [] else ["--url", "127.0.0.1:9"]
    proc = cli("check", *extra, *args)
    assert proc.returncode == 2
    assert "error" in proc.stderr


@pytest.mark.parametrize("flag,value", [("--timeout", "-1"), ("--timeout", "0"), ("--timeout", "inf"),
                                        ("--wait", "-5"), ("--wait", "nan"), ("--temperature", "nan"),
                                        ("--temperature", "inf"), ("--temperature", "-0.5")])
def test_out_of_range_numbers_are_one_usage_error_naming_the_flag(flag, value):
    # Refused before any connection (port 9 has no server: a late refusal would say "cannot connect" instead).
    proc = cli("check", "--url", "127.0.0.1:9", flag, value, "--no-progress")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sglang-detspec check: error: {flag} must be"), proc.stderr


@pytest.mark.parametrize("kwargs", [{"timeout": 0.0}, {"wait": -1.0}, {"temperature": float("nan")}])
def test_run_check_refuses_out_of_range_numbers(kwargs):
    with pytest.raises(CliError, match=f"--{next(iter(kwargs))} must be"):
        run_check(f"http://127.0.0.1:{free_port()}", trials=2, **kwargs)


def test_run_check_api():
    with FakeSGLang("deterministic", report_accept_length=False) as fake:
        res = run_check(fake.url, traffic="uniform", trials=3, max_fillers=2, max_new_tokens=10, seeds=[1, 2])
    assert res.passed and res.deterministic and res.unique_outputs == 1
    assert res.compared == "output_ids"
    assert res.server.plugin_active and res.server.avg_spec_accept_length is None
    # Without spec_accept_length in meta_info, completion_tokens / spec_verify_ct (SGLang's own definition).
    assert res.probe_accept_length == pytest.approx(10 / 5)
    assert [t.fillers for t in res.trials] == [0, 1, 2]
    assert res.seeds_check is not None and res.seeds_check.passed


def test_run_check_api_raises_cli_error():
    with pytest.raises(CliError, match="cannot connect"):
        run_check(f"http://127.0.0.1:{free_port()}", trials=2)
