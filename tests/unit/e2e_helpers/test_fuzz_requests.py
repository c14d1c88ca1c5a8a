"""The fuzz generator and judge of tests/e2e/fuzz_requests.py, and its mix through SGLang's real HTTP server on CPU.

The CPU server (tests/unit/sglang_cpu_http_server.py) is SGLang's own FastAPI app, tokenizer manager and OpenAI
handlers with the plugin loaded by SGLang's loader; only the scheduler is a stand-in that answers at once and records
every request that reached it with a value the real scheduler cannot survive. With the request checks, the E2E
mix gets the outcome each case expects and nothing fatal reaches the scheduler; without them (the E2E control) it
does not -- what the GPU test measures, minus the GPU.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_requests as fz  # noqa: E402

MODEL = fz.Model(vocab_size=1024, hidden_size=256, context_len=8192)


def test_the_same_seed_gives_the_same_cases_and_another_seed_others():
    a, b, c = (fz.generate_cases(s, 300, MODEL) for s in (5, 5, 6))
    assert [(x.kind, x.endpoint, x.body) for x in a] == [(x.kind, x.endpoint, x.body) for x in b]
    assert [x.body for x in a] != [x.body for x in c]


def test_a_2000_case_mix_covers_every_kind_endpoint_and_expectation():
    cases = fz.generate_cases(31, 2000, MODEL)
    assert len(cases) == 2000 and {c.kind for c in cases} == set(fz.MAKERS)
    assert {c.endpoint for c in cases} == {fz.GENERATE, fz.COMPLETIONS, fz.CHAT}
    assert {c.expect for c in cases} == {fz.REJECT, fz.ACCEPT, fz.DISCONNECT}
    assert sum(c.expect == fz.REJECT for c in cases) > 1200
    assert any(c.stream for c in cases) and any(c.content_type != "application/json" for c in cases)
    assert max(len(c.body) for c in cases) > 1_000_000  # oversized bodies


def test_nan_cases_carry_json_nan_tokens_that_only_a_lenient_parser_reads():
    cases = fz.generate_cases(3, 400, MODEL, kinds=["nan_and_infinity"])
    for case in cases:
        text = case.body.decode()
        assert any(t in text for t in ("NaN", "Infinity"))
        json.loads(text)  # Python's json reads them ...
        with pytest.raises(ValueError):
            json.loads(text, parse_constant=lambda t: (_ for _ in ()).throw(ValueError(t)))  # ... a strict one not


def test_every_case_that_must_be_refused_is_malformed_by_construction():
    """Spot checks of the generator's labels: the id-range and batch cases really hold an id outside [0, vocab)."""
    for case in fz.generate_cases(9, 300, MODEL, kinds=["ids_outside_vocab"]):
        body = json.loads(case.body)
        ids = body.get("input_ids") or body.get("prompt")
        assert case.expect == fz.REJECT and any(not 0 <= t < MODEL.vocab_size for t in ids)


def test_judge():
    reject = fz.FuzzCase(0, "k", fz.GENERATE, b"{}", fz.REJECT)
    grammar = fz.FuzzCase(0, "k", fz.GENERATE, b"{}", fz.REJECT, fz.SCHEDULER)
    accept = fz.FuzzCase(0, "k", fz.GENERATE, b"{}", fz.ACCEPT)
    gone = fz.FuzzCase(0, "k", fz.GENERATE, b"{}", fz.DISCONNECT, stream=True)
    assert fz.judge(reject, fz.Outcome(400)) == "ok"
    assert fz.judge(reject, fz.Outcome(422)) == "ok"
    assert fz.judge(reject, fz.Outcome(200)) == "accepted_malformed"
    assert fz.judge(reject, fz.Outcome(500)) == "5xx"
    assert fz.judge(reject, fz.Outcome(None, error="timeout")) == "timeout"
    assert fz.judge(reject, fz.Outcome(None, error="connection: refused")) == "no_answer"
    assert fz.judge(grammar, fz.Outcome(200)) == "accepted_malformed"
    assert fz.judge(grammar, fz.Outcome(200), scheduler_present=False) == "ok"
    assert fz.judge(accept, fz.Outcome(200)) == "ok"
    assert fz.judge(accept, fz.Outcome(400)) == "refused_good"
    assert fz.judge(gone, fz.Outcome(None, 200, error="disconnected")) == "ok"


def test_a_streamed_error_event_counts_as_its_code():
    assert fz._effective_stream_status('data: {"error": {"message": "x", "code": 400}}') == 400
    assert fz._effective_stream_status('data: {"text": "ok"}') is None
    assert fz._effective_stream_status("data: [DONE]") is None


def test_summary_counts():
    cases = [fz.FuzzCase(i, "k", fz.GENERATE, b"{}", e) for i, e in enumerate([fz.REJECT, fz.ACCEPT, fz.REJECT])]
    outs = [fz.Outcome(400), fz.Outcome(200), fz.Outcome(None, error="timeout")]
    s = fz.summarize(cases, outs, [fz.judge(c, o) for c, o in zip(cases, outs)])
    assert (s["requests"], s["4xx"], s["2xx"], s["5xx"], s["timeouts"], s["bad_verdicts"]) == (3, 1, 1, 0, 1, 1)
    assert s["expected_accept_2xx"] == 1


@pytest.fixture(scope="module")
def cpu_runs():
    pytest.importorskip("sglang")
    from sglang_cpu_http_server import CpuServer

    out = {}
    for validation in (True, False):
        srv = CpuServer(validation=validation)
        try:
            rec = srv.record()
            model = fz.Model(rec["vocab_size"], rec["hidden_size"], rec["context_len"])
            # The product gets the E2E mix (its first 600 cases); the control a short one without huge n, which
            # would keep its tokenizer busy for minutes (the E2E control stops at its first loss instead).
            cases = (fz.generate_cases(31, 600, model) if validation
                     else fz.generate_cases(31, 60, model, kinds=["ids_outside_vocab", "wrong_type", "stop_and_bias"]))
            outcomes = fz.run_cases(srv.base_url, cases, workers=4, timeout=120)
            out[validation] = {"cases": cases, "outcomes": outcomes, "record": srv.record()}
        finally:
            srv.close()
    return out


def test_with_the_checks_every_case_gets_its_outcome_and_nothing_fatal_reaches_the_scheduler(cpu_runs):
    run = cpu_runs[True]
    verdicts = [fz.judge(c, o, scheduler_present=False) for c, o in zip(run["cases"], run["outcomes"])]
    bad = [(c.kind, c.body[:200], o.status, o.detail[:200]) for c, o, v in zip(run["cases"], run["outcomes"], verdicts)
           if v != "ok"]
    assert not bad, bad[:10]
    assert run["record"]["fatal"] == []
    assert run["record"]["requests"] > 50  # the acceptable ones did reach it


def test_without_the_checks_the_same_kind_of_mix_reaches_the_scheduler_or_fails_with_5xx(cpu_runs):
    run = cpu_runs[False]
    five_hundreds = sum(1 for o in run["outcomes"] if (o.status or 0) >= 500)
    assert run["record"]["fatal"] and five_hundreds, (len(run["record"]["fatal"]), five_hundreds)
