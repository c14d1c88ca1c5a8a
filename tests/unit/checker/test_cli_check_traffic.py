"""``sglang-detspec check --traffic``: each profile sends what it says (read back from the requests the fake server
received), a server whose output changes under one kind of traffic fails exactly that profile, and the argument
errors. The fake server is tests/unit/fake_sglang_server.py; its prompts tokenize into 3-character pieces."""

import json
import os
import subprocess
import sys

import pytest

from sglang_detspec.checker import DEFAULT_PROMPT, parse_server_url, parse_traffic, run_check
from sglang_detspec.command_base import CliError

from fake_sglang_server import DIVERGE_AT, FakeSGLang, fake_tokenize

ALL = ["uniform", "mixed", "long", "prefix"]


def cli(*args, timeout=300):
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_detspec", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def fillers_of(fake, profile):
    return [q for q in fake.generate_requests if q["text"].startswith(f"Request {profile}.")]


def timeline_by_request(fake):
    """request id -> {"arrive": t, "first_chunk": t, "done": t, "text": prompt}"""
    out = {}
    for t, what, rid, text in fake.timeline:
        if rid is not None:
            out.setdefault(rid, {"text": text})[what] = t
    return out


def test_default_traffic_runs_every_profile_and_passes(tmp_path):
    report = tmp_path / "check.json"
    with FakeSGLang("deterministic", delay=0.02) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "3", "--max-fillers", "4", "--report", str(report),
                   "--no-progress")
        probes = [q for q in fake.generate_requests if q["text"] == DEFAULT_PROMPT]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["traffic"] == ALL and data["passed"] is True and data["unique_outputs"] == 1
    assert [p["name"] for p in data["profiles"]] == ALL
    assert [len(p["trials"]) for p in data["profiles"]] == [3, 3, 3, 6]
    assert all(p["passed"] and p["unique_outputs"] == 1 and p["divergence"] is None for p in data["profiles"])
    assert [t["profile"] for t in data["trials"]] == ["uniform"] * 3 + ["mixed"] * 3 + ["long"] * 3 + ["prefix"] * 6
    # The probe is one and the same request in every trial of every profile.
    assert len(probes) == 15 and all(q == probes[0] for q in probes)
    assert probes[0]["sampling_params"] == {"temperature": 1.0, "max_new_tokens": 32, "sampling_seed": 42,
                                            "ignore_eos": True}
    lines = proc.stdout.splitlines()
    for name in ALL:
        assert sum(line.startswith(f"{name}:") for line in lines) == 1, proc.stdout
    assert "1 unique probe output(s) in 15 trials of 4 traffic profiles" in proc.stdout
    verdicts = [line for line in lines if line.startswith(("PASS", "FAIL"))]
    assert verdicts == [lines[-2]] and verdicts[0].startswith("PASS") and lines[-1].startswith("report:")


def test_mixed_sends_every_kind_of_sampling():
    with FakeSGLang("deterministic", delay=0.02) as fake:
        res = run_check(fake.url, traffic="mixed", trials=16, max_fillers=6)
        fillers = fillers_of(fake, "mixed")
    assert res.passed and [p.name for p in res.profiles] == ["mixed"]
    sps = [q["sampling_params"] for q in fillers]
    temps = {sp["temperature"] for sp in sps}
    assert {0.0, 0.3, 1.7} <= temps
    assert {sp.get("top_k") for sp in sps} >= {1, 5, 50}
    assert any(sp.get("top_p") == 0.9 for sp in sps) and any(sp.get("min_p") == 0.1 for sp in sps)
    assert any(q.get("return_logprob") is True and q.get("top_logprobs_num", 0) > 0 for q in fillers)
    assert any(isinstance(sp.get("stop"), list) and sp["stop"] and sp.get("ignore_eos") is False for sp in sps)
    assert any(sp.get("n", 1) > 1 for sp in sps)
    assert len({sp["max_new_tokens"] for sp in sps}) > 10
    assert sorted({t.arrival for t in res.trials}) == ["after", "alone", "before", "during"]


def test_mixed_probe_arrives_before_during_and_after_the_fillers_prefill():
    # A 0.15 s "prefill" before each first token: a probe sent without waiting for it would arrive first.
    with FakeSGLang("deterministic", delay=0.4, prefill_delay=0.15) as fake:
        res = run_check(fake.url, traffic="mixed", trials=7, max_fillers=4)
        events = timeline_by_request(fake)
    probes = sorted((e for e in events.values() if e["text"] == DEFAULT_PROMPT), key=lambda e: e["arrive"])
    assert len(probes) == len(res.trials) == 7
    for trial, probe in zip(res.trials, probes):
        mine = [e for e in events.values() if e["text"].startswith(f"Request mixed.{trial.profile_trial}.")]
        assert len(mine) == trial.fillers
        if trial.arrival == "alone":
            assert not mine
            continue
        assert mine and trial.fillers >= 1
        # Every filler was in flight together with the probe, whatever the order.
        assert all(e["arrive"] < probe["done"] and probe["arrive"] < e["done"] for e in mine), trial.arrival
        if trial.arrival == "before":
            assert all(probe["arrive"] < e["arrive"] for e in mine)
        elif trial.arrival == "after":
            streamed = [e for e in mine if "first_chunk" in e]
            assert streamed, "the probe must wait for some filler's first token"
            assert all(e["first_chunk"] < probe["arrive"] for e in streamed)
        else:
            assert trial.arrival == "during"
    assert {t.arrival for t in res.trials} == {"alone", "before", "during", "after"}


@pytest.mark.parametrize("chunk, context, pool", [(64, 1024, 8192), (-1, 8192, 32768), (None, 8192, 32768)])
def test_long_prompts_exceed_the_chunk_size_within_the_servers_limits(chunk, context, pool):
    with FakeSGLang("deterministic", chunked_prefill_size=chunk, context_length=context,
                    max_total_num_tokens=pool) as fake:
        res = run_check(fake.url, traffic="long", trials=8)
        fillers = fillers_of(fake, "long")
    assert res.passed and not res.warnings, res.warnings
    lengths = [len(fake_tokenize(q["text"])) for q in fillers]
    assert len(set(lengths)) >= 5
    assert all(n + q["sampling_params"]["max_new_tokens"] <= context for n, q in zip(lengths, fillers))
    reference = chunk if chunk and chunk > 0 else 2000  # "a few thousand tokens" where chunked prefill is off
    assert sum(n > reference for n in lengths) >= 2 and max(lengths) > 2 * reference
    assert min(lengths) < reference
    # What the report says matches what the server counted.
    counted = [f.prompt_tokens for t in res.trials for f in t.filler_details]
    assert sorted(counted) == sorted(lengths)


def test_long_profile_warns_when_the_context_is_not_longer_than_the_chunk():
    with FakeSGLang("deterministic", chunked_prefill_size=2048, context_length=1024) as fake:
        res = run_check(fake.url, traffic="long", trials=3)
    assert res.passed
    assert any("no prompt can exceed the chunked-prefill size (2048 tokens)" in w for w in res.warnings), res.warnings


def test_prefix_profile_flushes_and_warms_the_radix_cache():
    with FakeSGLang("deterministic", delay=0.05) as fake:
        res = run_check(fake.url, traffic="prefix")
        events = timeline_by_request(fake)
        flushes = [t for t, what, _, _ in fake.timeline if what == "flush"]
        flush_calls = [e for e in fake.events if e[0] == "/flush_cache"]
    trials = res.trials
    assert res.passed and len(trials) == 6
    assert flush_calls == [("/flush_cache", 200)] * 5 and [t.flushed_cache for t in trials] == [
        True, False, True, True, True, True]
    cached = [t.cached_tokens for t in trials]
    prompt_tokens = len(fake_tokenize(DEFAULT_PROMPT))
    assert cached[0] == 0 and cached[5] == 0  # cold: right after a flush
    assert cached[1] == prompt_tokens - 1 and cached[2] == prompt_tokens - 1  # warm: all but the last token
    assert 0 < cached[3] < cached[2]  # half warm
    # In the warmed trials the prefix-sharing filler had finished before the probe arrived.
    probes = sorted((e for e in events.values() if e["text"] == DEFAULT_PROMPT), key=lambda e: e["arrive"])
    first_word = DEFAULT_PROMPT.split()[0]
    for k in (2, 3):
        sharing = [e for e in events.values() if e["text"] != DEFAULT_PROMPT and e["text"].startswith(first_word)
                   and flushes[k - 1] < e["arrive"] < probes[k]["arrive"]]
        assert len(sharing) == 1 and sharing[0]["done"] < probes[k]["arrive"]
    # Each flush came between the previous trial's end and its own trial (trial 1 runs on trial 0's cache).
    for flush, k in zip(flushes, (0, 2, 3, 4, 5)):
        assert probes[k]["arrive"] > flush and (k == 0 or probes[k - 1]["done"] < flush)


@pytest.mark.parametrize(
    "profile, diverge_if",
    [
        ("mixed", lambda req, s: req["text"] == DEFAULT_PROMPT
         and any(n["sampling_params"].get("temperature") == 0 for n in s.neighbours)),
        ("long", lambda req, s: req["text"] == DEFAULT_PROMPT
         and any(len(fake_tokenize(n["text"])) > 600 for n in s.neighbours)),
        ("prefix", lambda req, s: req["text"] == DEFAULT_PROMPT and s.cache_source == "other"),
    ],
)
def test_only_the_profile_whose_traffic_changes_the_probe_fails(tmp_path, profile, diverge_if):
    # The output changes only next to a greedy filler / a filler longer than 600 tokens / with a cache entry
    # another prompt left; 600 is longer than any uniform, mixed or prefix filler (160 words, 3 pieces each at most).
    report = tmp_path / "check.json"
    with FakeSGLang("deterministic", delay=0.1, chunked_prefill_size=512, context_length=2048,
                    diverge_if=diverge_if) as fake:
        proc = cli("check", "--url", fake.url, "--trials", "4", "--max-fillers", "4", "--report", str(report),
                   "--no-progress")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert {p["name"]: p["passed"] for p in data["profiles"]} == {name: name != profile for name in ALL}
    failed = next(p for p in data["profiles"] if p["name"] == profile)
    assert failed["divergence"]["position"] == DIVERGE_AT and failed["divergence"]["unit"] == "token"
    assert data["divergence"]["position"] == DIVERGE_AT
    assert data["trials"][data["divergence"]["trial"]]["profile"] == profile
    line = next(line for line in proc.stdout.splitlines() if line.startswith(f"{profile}:"))
    assert f"first at token {DIVERGE_AT}" in line
    others = [line for line in proc.stdout.splitlines() if line.startswith(tuple(f"{n}:" for n in ALL if n != profile))]
    assert len(others) == 3 and all("equal to the reference" in line for line in others)
    assert proc.stdout.splitlines()[-2] == f"FAIL: the seeded probe's output changed with the traffic ({profile})"


def test_a_profile_that_agrees_with_itself_but_not_with_the_reference_fails():
    # Output changes once the probe's own prompt is cached: the reference (the very first request) ran cold, the
    # rest of uniform and every mixed trial warm -- mixed agrees with itself, not with the reference.
    with FakeSGLang("deterministic", diverge_if=lambda req, s: req["text"] == DEFAULT_PROMPT
                    and s.cache_source == "self") as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "uniform,mixed", "--trials", "3", "--max-fillers", "2",
                   "--no-progress")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    mixed = next(line for line in proc.stdout.splitlines() if line.startswith("mixed:"))
    assert mixed.startswith("mixed:   3 trials, 1 unique output(s); 3 of 3 differ from the reference, first at token 5")
    assert "2 unique probe output(s) in 6 trials" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "FAIL: the seeded probe's output changed with the traffic (uniform, mixed)"


def test_a_server_that_cannot_flush_its_cache_is_one_clear_line():
    with FakeSGLang("deterministic", flush_cache=False) as fake:
        proc = cli("check", "--url", fake.url, "--traffic", "prefix", "--no-progress")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "prefix traffic" in lines[0] and "/flush_cache answered HTTP 404" in lines[0] and "--traffic" in lines[0]


def test_parse_traffic():
    assert parse_traffic("all") == tuple(ALL)
    assert parse_traffic("prefix, UNIFORM") == ("uniform", "prefix")
    assert parse_traffic("long,all,long") == tuple(ALL)
    for bad in ("", "bogus", "uniform,,mixed", " , "):
        with pytest.raises(ValueError, match="uniform, mixed, long, prefix, pressure, all"):
            parse_traffic(bad)


@pytest.mark.parametrize("value", ["", "bogus", "uniform,,mixed", "uniform,bogus"])
def test_traffic_usage_errors(value):
    proc = cli("check", "--url", "127.0.0.1:9", "--traffic", value)
    assert proc.returncode == 2
    assert "usage: sglang-detspec check" in proc.stderr and "argument --traffic:" in proc.stderr
    assert "uniform, mixed, long, prefix, pressure, all" in proc.stderr


def test_mixed_without_fillers_is_refused():
    with pytest.raises(CliError, match="--max-fillers 0 leaves the mixed profile without fillers"):
        run_check("http://127.0.0.1:9", traffic="mixed", max_fillers=0)


@pytest.mark.parametrize("url, why", [
    ("not-a-url", "neither HOST:PORT nor http://HOST[:PORT]"),
    ("ftp://example.com:21", "scheme 'ftp' is not http or https"),
    ("http://127.0.0.1:99999", "port must be a number in 1-65535"),
    ("http://127.0.0.1:abc", "port must be a number in 1-65535"),
    ("http://:30000", "names no host"),
    ("http://bad_host!:30000", "is not a host name or IP address"),
    ("http://127.0.0.1:30000/?x=1", "query or fragment"),
    ("http://me:secret@127.0.0.1:30000", "--api-key"),
])
def test_bad_urls_are_refused_up_front(url, why):
    proc = cli("check", "--url", url)
    assert proc.returncode == 2
    assert "usage: sglang-detspec check" in proc.stderr and "argument --url:" in proc.stderr
    assert why in proc.stderr and "is the server running" not in proc.stderr


def test_good_urls_are_normalized():
    assert parse_server_url("localhost:30000") == "http://localhost:30000"
    assert parse_server_url(" http://127.0.0.1:30000/ ") == "http://127.0.0.1:30000"
    assert parse_server_url("HTTPS://Example.com/sglang/") == "https://example.com/sglang"
    assert parse_server_url("http://[::1]:8443") == "http://[::1]:8443"


def test_progress_bar_on_stderr_only_when_asked(capsys):
    with FakeSGLang("deterministic") as fake:
        run_check(fake.url, traffic="uniform,prefix", trials=2, max_fillers=1, progress=True)
        err = capsys.readouterr().err
        run_check(fake.url, traffic="uniform", trials=2, max_fillers=1, progress=False)
        quiet = capsys.readouterr()
    assert "check [" in err and "8/8" in err and "prefix trial 5" in err
    assert "check [" not in quiet.err + quiet.out
