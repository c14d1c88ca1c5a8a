"""``sglang-detspec check --logprobs`` against the fake SGLang server: the probe asks for its logprobs, and trials
with the reference's tokens must return them bit for bit; a difference is reported with its size and place."""

import json
import math

from sglang_detspec.checker import DEFAULT_PROMPT, run_check
from sglang_detspec.checker.logprobs import compare_logprobs
from sglang_detspec.checker.report import Trial

from fake_sglang_server import LOGPROB_JITTER, LOGPROB_JITTER_AT, FakeSGLang, fake_logprob
from test_cli_check import cli

ARGS = ("--traffic", "uniform", "--trials", "4", "--max-fillers", "3", "--no-progress", "--max-new-tokens", "8")


def test_logprobs_equal_pass_and_the_probe_asks_for_them(tmp_path):
    report = tmp_path / "check.json"
    with FakeSGLang("deterministic", delay=0.02) as fake:
        proc = cli("check", "--url", fake.url, *ARGS, "--logprobs", "--report", str(report))
        probes = [q for q in fake.generate_requests if q["text"] == DEFAULT_PROMPT]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "logprobs: bit-identical to the reference in all 3 trials with its tokens" in proc.stdout
    assert "PASS" in proc.stdout and "with bit-identical logprobs" in proc.stdout
    assert len(probes) == 4 and all(q["return_logprob"] is True and q["top_logprobs_num"] == 5 for q in probes)
    data = json.loads(report.read_text())
    assert data["logprobs_check"]["passed"] is True and data["logprobs_check"]["compared_trials"] == [1, 2, 3]
    t0 = data["trials"][0]
    assert t0["output_logprobs"] == [fake_logprob(42, k, t) for k, t in enumerate(t0["output_ids"])]
    assert len(t0["output_top_logprobs"]) == 8 and all(len(p) == 5 for p in t0["output_top_logprobs"])


def test_a_logprob_that_moves_with_the_batch_fails_and_is_located():
    # Tokens never change; the sampled token's logprob at one position moves by 2**-20 whenever the probe has
    # neighbours (what a batch-variant log-softmax would do).
    with FakeSGLang("deterministic", delay=0.05, logprob_jitter_if=lambda req, served: bool(served.neighbours)) as fake:
        proc = cli("check", "--url", fake.url, *ARGS, "--logprobs")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 unique probe output(s) in 4 trials" in proc.stdout  # tokens agree
    assert f"largest difference {LOGPROB_JITTER:.3g} at token {LOGPROB_JITTER_AT} (trial " in proc.stdout
    assert "FAIL: the probe's logprobs changed with the traffic" in proc.stdout


def test_without_the_flag_logprobs_are_neither_asked_for_nor_compared():
    with FakeSGLang("deterministic", delay=0.05, logprob_jitter_if=lambda req, served: True) as fake:
        proc = cli("check", "--url", fake.url, *ARGS)
        probes = [q for q in fake.generate_requests if q["text"] == DEFAULT_PROMPT]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "logprobs:" not in proc.stdout
    assert not any("return_logprob" in q for q in probes)


def test_a_server_that_returns_no_logprobs_fails():
    with FakeSGLang("deterministic", logprobs=False) as fake:
        result = run_check(fake.url, traffic="uniform", trials=3, max_fillers=2, max_new_tokens=8, logprobs=True)
    assert not result.passed and result.deterministic
    assert result.logprobs_check.missing_trials == [0]


def _trial(index, logprobs, top):
    return Trial(index=index, profile="uniform", profile_trial=index, arrival="alone", label="", seed=1, fillers=0,
                 filler_max_new_tokens=[], filler_prompt_words=[], text="x", output_ids=[1, 2],
                 output_logprobs=logprobs, output_top_logprobs=top)


def test_top_logprob_ids_and_signed_zero_count_as_differences():
    ref = _trial(0, [-0.5, 0.0], [[(-0.5, 1), (-1.0, 7)], [(0.0, 2)]])
    same = _trial(1, [-0.5, 0.0], [[(-0.5, 1), (-1.0, 7)], [(0.0, 2)]])
    swapped = _trial(2, [-0.5, 0.0], [[(-0.5, 1), (-1.0, 8)], [(0.0, 2)]])
    negative_zero = _trial(3, [-0.5, -0.0], [[(-0.5, 1), (-1.0, 7)], [(0.0, 2)]])
    check = compare_logprobs(ref, [ref, same, swapped, negative_zero], lambda t: True)
    assert check.compared_trials == [1, 2, 3]
    assert check.differing_trials == [2, 3]
    assert check.largest.trial == 2 and check.largest.kind == "top" and check.largest.rank == 1
    assert math.isinf(check.largest.difference)
    # trials with other tokens are not compared
    assert compare_logprobs(ref, [swapped], lambda t: False).compared_trials == []
