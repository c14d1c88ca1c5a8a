"""End to end (issue 31): thousands of malformed and hostile requests never take a DETSPEC server down.

Two DETSPEC_EAGLE servers on the weighted tiny pair (``--chat-template chatml`` so ``/v1/chat/completions`` serves),
started 25 s apart with ``--mem-fraction-static 0.15`` on ports of their own (../shared/gpu/README.md sections 4-5):
``detspec_fuzz`` is the product; ``detspec_no_validation`` is the control, the same server with the plugin's request
checks removed (``tests/e2e/controls/no_request_validation``). Both get the same seeded mix of
:mod:`fuzz_requests` (2,000 requests over ``/generate``, ``/v1/completions``, ``/v1/chat/completions``; 8 at a time,
each on its own connection), at the same time. Between every 250 of them a seeded probe (48 tokens, temperature 1,
``sampling_seed`` 1234) goes out, and once before and after.

What is asserted on the product: its process is alive and ``/health`` answers after the run; no 5xx; no request
ran past its 30 s timeout; every case got the outcome it expects (4xx for malformed ones -- a streamed
``/generate`` error event's code counts --, 2xx for acceptable ones, e.g. unknown top-level fields SGLang ignores);
the probe's tokens are the same every time. On the control: the fuzz loses the server (it dies, or answers a 5xx),
as measured on an H100 with sglang 0.5.17 for one ``input_ids`` id outside the vocabulary -- so the run can see
what the checks prevent. The summary of both goes to ``e2e_results.json`` (``fuzz_detspec``, ``fuzz_control``).
"""

import json
import os
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

try:
    from sglang.test.ci.ci_register import register_cuda_ci
except ImportError:  # sglang not installed: the marker is a runtime no-op anyway (read by AST)

    def register_cuda_ci(*args, **kwargs):
        return None


import fuzz_requests as fz

import e2e_harness as h
import e2e_servers

register_cuda_ci(est_time=300, suite="detspec-e2e")

_SKIP = h.e2e_skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]

FUZZ_SEED = 31
REQUESTS = 2000
WORKERS = 8
REQUEST_TIMEOUT_S = 30.0
PROBE_EVERY = 250
PROBE_SEED = 1234
#: A test-harness-only control (tests/e2e/controls/no_request_validation/sitecustomize.py): the plugin without its
#: request checks.
NO_VALIDATION_CONTROL = Path(__file__).resolve().parent / "controls" / "no_request_validation"
PRODUCT, CONTROL = "detspec_fuzz", "detspec_no_validation"
START_GAP_S = 25
CONTROL_CHUNK = 50
CONTROL_DEADLINE_S = 150


def _specs(models):
    pair = h.tiny_pair()
    args = (h.common_args(models.target, pair) + h.eagle_args(models.eagle_draft, "DETSPEC_EAGLE", deterministic=True)
            + ["--mem-fraction-static", "0.15", "--chat-template", "chatml"])
    return [h.ServerSpec(PRODUCT, args, env={}),
            h.ServerSpec(CONTROL, args, env=h.with_control(NO_VALIDATION_CONTROL, {}))]


def _model(models) -> fz.Model:
    config = json.loads((Path(models.target) / "config.json").read_text())
    return fz.Model(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], context_len=h.CONTEXT_LENGTH)


def _healthy(srv) -> bool:
    if not srv.alive():
        return False
    try:
        with urllib.request.urlopen(srv.base_url + "/health", timeout=20) as r:
            return r.status == 200
    except OSError:
        return False


def _probe(srv):
    try:
        return h.generate(srv.base_url, h.PROBE_PROMPT, h.probe_params(PROBE_SEED), timeout=120).get("output_ids")
    except Exception as exc:  # noqa: BLE001 - a lost server answers nothing; recorded, asserted below
        return f"no answer: {type(exc).__name__}: {exc}"[:200]


def _fuzz(srv, cases, *, control: bool):
    """The fuzz against one server, a probe between chunks. The product's run stops only if its server dies; the
    control's as soon as it lost the server (died, a 5xx, a timeout) or after CONTROL_DEADLINE_S -- without the
    checks one ``n = 10**6`` keeps its tokenizer busy for minutes."""
    probes = [_probe(srv)]
    health = []

    def between(sent):
        healthy = _healthy(srv)
        health.append({"after": sent, "healthy": healthy})
        if healthy:
            probes.append(_probe(srv))

    start = time.monotonic()

    def stop(outcomes):
        if not srv.alive():
            return True
        lost = any(o.error == "timeout" or (o.status or 0) >= 500 for o in outcomes)
        return control and (lost or time.monotonic() - start > CONTROL_DEADLINE_S)

    outcomes = fz.run_cases(srv.base_url, cases, workers=WORKERS, timeout=REQUEST_TIMEOUT_S, between=between,
                            every=CONTROL_CHUNK if control else PROBE_EVERY, stop=stop)
    seconds = round(time.monotonic() - start, 1)
    alive_after = _healthy(srv)
    if alive_after:
        probes.append(_probe(srv))
    verdicts = [fz.judge(c, o) for c, o in zip(cases, outcomes)]
    return {"outcomes": outcomes, "verdicts": verdicts, "probes": probes, "health": health,
            "alive_after": alive_after, "seconds": seconds}


@pytest.fixture(scope="module")
def runs(tiny_models):
    model = _model(tiny_models)
    cases = fz.generate_cases(FUZZ_SEED, REQUESTS, model)
    servers = {}
    port = int(os.environ.get("DETSPEC_E2E_FUZZ_PORT", "33000"))
    try:
        for i, spec in enumerate(_specs(tiny_models)):
            if i:
                time.sleep(START_GAP_S)  # SGLang sizes its KV pool from the memory free after its own load
            port = h.free_port(port)
            servers[spec.name] = e2e_servers.Server(spec, port, h.out_dir() / f"server-{spec.name}.log")
            servers[spec.name].start()
            port += 200
        for srv in servers.values():
            srv.wait_ready(float(os.environ.get("DETSPEC_E2E_START_TIMEOUT", "600")))
        with ThreadPoolExecutor(2) as pool:
            futures = {name: pool.submit(_fuzz, srv, cases, control=name == CONTROL) for name, srv in servers.items()}
            results = {name: f.result() for name, f in futures.items()}
        for name, r in results.items():
            summary = fz.summarize(cases, r["outcomes"], r["verdicts"])
            probe_ids = [p for p in r["probes"]]
            r["summary"] = {**summary, "server_deaths": 0 if r["alive_after"] else 1, "seconds": r["seconds"],
                            "probes": len(probe_ids), "probe_identical": len({json.dumps(p) for p in probe_ids}) == 1
                            and isinstance(probe_ids[0], list), "health": r["health"],
                            "first_bad": [{"kind": c.kind, "endpoint": c.endpoint, "body": c.body[:300].decode(
                                errors="replace"), "status": o.status, "error": o.error, "detail": o.detail[:300],
                                "verdict": v} for c, o, v in zip(cases, r["outcomes"], r["verdicts"])
                                if v != "ok"][:20],
                            "log_tail": "" if r["alive_after"] else servers[name].log_tail(40)}
            h.record(f"fuzz_{'detspec' if name == PRODUCT else 'control'}", r["summary"])
            s = r["summary"]
            print(f"--- {name}: requests tried {s['requests']}, 4xx {s['4xx']}, 2xx {s['2xx']} (acceptable cases "
                  f"answered 2xx: {s['expected_accept_2xx']}), 5xx {s['5xx']}, timeouts {s['timeouts']}, "
                  f"no answer {s['no_answer']}, disconnects {s['disconnects']}, server deaths {s['server_deaths']}, "
                  f"probe identical {s['probe_identical']} ({s['probes']} probes), {s['seconds']} s", flush=True)
        yield results
    finally:
        for srv in servers.values():
            srv.stop()


def test_the_fuzz_never_kills_the_server_and_every_malformed_request_is_refused(runs):
    s = runs[PRODUCT]["summary"]
    assert s["requests"] >= 2000
    assert s["server_deaths"] == 0, s["log_tail"]
    assert all(entry["healthy"] for entry in s["health"]), s["health"]
    assert s["5xx"] == 0 and s["timeouts"] == 0 and s["no_answer"] == 0 and s["not_sent"] == 0, s["first_bad"]
    assert s["bad_verdicts"] == 0, s["first_bad"]


def test_the_probe_is_identical_before_during_and_after_the_fuzz(runs):
    r = runs[PRODUCT]
    assert len(r["probes"]) >= 2 + REQUESTS // PROBE_EVERY - 1, r["probes"]
    assert r["summary"]["probe_identical"], r["probes"]


def test_control_without_the_checks_loses_the_server(runs):
    """The same fuzz without the request checks: the server dies (or answers 5xx, or hangs) -- the checks are what
    saves it."""
    s = runs[CONTROL]["summary"]
    assert s["server_deaths"] == 1 or s["5xx"] > 0 or s["timeouts"] > 0, {
        k: s[k] for k in ("requests", "2xx", "4xx", "5xx", "timeouts", "no_answer", "not_sent")}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
