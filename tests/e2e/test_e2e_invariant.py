"""End to end: DETSPEC_EAGLE_INVARIANT emits the non-speculative server's tokens (issue 18), on the weighted tiny pair.

Seven servers of the same target, all ``--enable-deterministic-inference`` (``e2e_harness.invariant_specs``):

* ``nonspec_token_id`` -- no speculation, ``SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1`` (its seeded sampler keyed by token id
  on the top-k / top-p path too, as a DETSPEC server's target sampler is): the reference;
* ``invariant_graph`` / ``invariant_nograph`` -- DETSPEC_EAGLE_INVARIANT with CUDA graphs on (decode batches up to
  32, the tiny pair's running-request cap: ``e2e_harness.INVARIANT_ARGS``) / off;
* ``invariant_draft2`` -- DETSPEC_EAGLE_INVARIANT with a second draft (``tiny_models.ensure_second_eagle_draft``: the
  pair's EAGLE recipe under another seed), which proposes differently;
* ``invariant_mtp_graph`` / ``invariant_mtp_nograph`` -- DETSPEC_EAGLE_INVARIANT on multi-layer EAGLE (the pair's
  3-layer MiMo-V2-style MTP draft, ``e2e_harness.multi_layer_args``; per-step draft-extend graphs on / off): a third,
  structurally different draft;
* ``detspec_rs_control`` -- DETSPEC_EAGLE (seeded rejection sampling), the control: reproducible per seed, but it
  spends its randomness differently from plain sampling, so its tokens are not the reference's (0 of 768 24-token
  sequences equal, measured before the invariant algorithm existed).

Measurements, each a test that can fail:

0. Every server's log holds the plugin's start-up line for what it is meant to run (the reference: the token-id
   sampler opt-in; the others: the DETSPEC worker the scheduler check found, under its algorithm's name).
1. Seed sweeps (one configuration per test, sharing one module-scoped fixture): seeds 1..N
   (``DETSPEC_INVARIANT_SEEDS``, default 1000), 32 tokens each (``ignore_eos``), 4 prompts in turn, 64 requests in
   flight per server, all servers at once, for temperature 1.0, 0.7 and temperature 1.0 with top_p 0.9. Recorded per
   server: the fraction of sequences identical to the reference's, a histogram of the first differing index and the
   first 20 divergences in full (``invariant_sweep_<config>`` in e2e_results.json). Asserted: the four invariant servers
   equal the reference in >= 99 % of the sequences (the goal is 100 %; the exact fraction is recorded), the second
   draft's server equals ``invariant_graph`` on the same basis while its per-request verify counts differ somewhere
   (otherwise the drafts would be the same and the comparison no evidence), the control equals the reference in
   < 50 %; the reference itself honours the seeds (distinct sequences) and gives the same tokens when asked again.
   The top_p comparison with the reference needs the reference's token-id sampler: it is skipped (with the reason)
   when no module of ``sglang_detspec`` reads ``SGLANG_DETSPEC_TOKEN_ID_SAMPLER``; its sweep still runs (the second
   draft and the control need no token-id reference) and its numbers are still recorded.
2. Accept length (temperature 1.0 sweep, completion tokens per verify step over all requests): > 1.5 for the
   invariant servers of all three drafts; the control's is recorded beside it. A proposal raced with the wrong key is
   accepted only by chance: a CPU simulation of the chain on the tiny pair's float32 reference
   (``sglang_detspec.models.tiny_reference``, 4 prompts x 32 tokens, T 1.0) gave 2.08 (pair's draft) and 2.32 (second
   draft) with the shared Gumbel noise, 1.14 and 1.13 with independent noise; 1.5 lies between.
3. ``sglang-detspec check --traffic uniform,mixed --trials 12 --against <reference>`` on ``invariant_graph`` and
   ``invariant_mtp_graph``: one
   output under changing batches, and the probe alone on the reference gives the same tokens (exit 0). The control
   gets the same ``--against`` (uniform, 2 trials), which must fail: it shows the comparison can fail.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import e2e_checks as ec
import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=420, suite="detspec-e2e")

REFERENCE = "nonspec_token_id"
#: Multi-layer EAGLE (the pair's 3-layer MTP draft, SGLang's MultiLayerEagleWorkerV2): per-step graphs on / off.
MULTI_LAYER = ("invariant_mtp_graph", "invariant_mtp_nograph")
INVARIANT = ("invariant_graph", "invariant_nograph", *MULTI_LAYER)
DRAFT2 = "invariant_draft2"
CONTROL = "detspec_rs_control"
SERVERS = (REFERENCE, *INVARIANT, DRAFT2, CONTROL)

pytestmark = h.module_marks(*SERVERS)

N_SEEDS = int(os.environ.get("DETSPEC_INVARIANT_SEEDS", "1000"))
SEEDS = list(range(1, N_SEEDS + 1))
MAX_NEW_TOKENS = 32
IN_FLIGHT = 64  # requests in flight per server
BATCH = 8  # requests per /generate POST, so IN_FLIGHT // BATCH POSTs in flight per server
RESEND = 32  # seeds sent to the reference a second time, after the sweep
PROMPTS = (
    h.PROBE_PROMPT,
    "Speculative decoding lets a small draft model propose several tokens that",
    "Once upon a time, in a small town by the sea, there lived",
    "The recipe for bread begins with",
)
#: name -> sampling parameters (besides the seed and the length).
CONFIGS = {
    "t1.0": {"temperature": 1.0, "top_p": 1.0},
    "t0.7": {"temperature": 0.7, "top_p": 1.0},
    "t1.0_top_p0.9": {"temperature": 1.0, "top_p": 0.9},
}
#: Configurations whose rows go through top-k / top-p: they need the reference's token-id sampler.
TRUNCATED = ("t1.0_top_p0.9",)
MIN_IDENTICAL = 0.99  # the goal is 1.0: the exact fraction is recorded, docs/results.md states it
CONTROL_MAX_IDENTICAL = 0.5
MIN_ACCEPT_LENGTH = 1.5  # module docstring: ~2.1-2.3 expected, ~1.14 with the wrong key
MIN_DISTINCT = 0.5  # of the reference's sequences: the seeds are honoured
CHECK_SEED = 1234
CHECK_TRIALS = 12
#: The invariant servers `check --against` runs on (changing batches), beside the control.
CHECKED = ("invariant_graph", "invariant_mtp_graph")


def _token_id_sampler_missing():
    """Why the top_p configuration cannot be compared yet, or None: no module of the package reads the switch."""
    import sglang_detspec

    root = Path(sglang_detspec.__file__).resolve().parent
    if any(h.TOKEN_ID_SAMPLER_ENV in p.read_text(errors="replace") for p in root.rglob("*.py")):
        return None
    return (f"{h.TOKEN_ID_SAMPLER_ENV} is not implemented in this checkout (no module of {root} reads it): the "
            "non-speculative reference would sample top-p rows by rank, not by token id")


_TRUNCATED_SKIP = _token_id_sampler_missing()


def _configs(*, token_id_reference: bool = False):
    """The configurations to parametrize over; with ``token_id_reference`` (the test compares the invariant servers
    with the reference) the truncated ones are skipped while the reference's token-id sampler is missing."""
    return [pytest.param(c, marks=pytest.mark.skip(reason=_TRUNCATED_SKIP))
            if token_id_reference and c in TRUNCATED and _TRUNCATED_SKIP else c for c in CONFIGS]


# ---------------------------------------------------------------------------------------------------------------
# The sweeps


def _params(config: str, seed: int) -> dict:
    return {**CONFIGS[config], "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True, "sampling_seed": seed}


def _post(url: str, config: str, seeds) -> list:
    """One /generate POST of ``seeds`` (prompt ``(seed - 1) % 4``); refuses anything but one full answer each."""
    body = {"text": [PROMPTS[(s - 1) % len(PROMPTS)] for s in seeds],
            "sampling_params": [_params(config, s) for s in seeds]}
    out = h.post_json(url, "/generate", body, timeout=300)
    if not isinstance(out, list) or len(out) != len(seeds):
        raise RuntimeError(f"/generate of {len(seeds)} requests returned {str(out)[:300]}")
    for s, r in zip(seeds, out):
        ids = r.get("output_ids") if isinstance(r, dict) else None
        if ids is None or len(ids) != MAX_NEW_TOKENS:
            raise RuntimeError(f"seed {s}: expected {MAX_NEW_TOKENS} output ids (ignore_eos), got {str(r)[:300]}")
    return out


def _sweep(url: str, config: str, seeds) -> list:
    """Every seed's response, in seed order, ``IN_FLIGHT`` requests in flight."""
    chunks = [seeds[i:i + BATCH] for i in range(0, len(seeds), BATCH)]
    with ThreadPoolExecutor(max(1, IN_FLIGHT // BATCH)) as pool:
        return [r for part in pool.map(lambda c: _post(url, config, c), chunks) for r in part]


def _tokens(responses) -> list:
    return [list(r["output_ids"]) for r in responses]


def _verify_counts(responses) -> list:
    return [r.get("meta_info", {}).get("spec_verify_ct") for r in responses]


def _measure(servers: dict, config: str) -> dict:
    """The sweep of ``config`` on every server at once, then the resend to the reference; recorded."""

    def run(name):
        t0 = time.monotonic()
        try:
            return {"responses": _sweep(servers[name].base_url, config, SEEDS), "error": None,
                    "seconds": round(time.monotonic() - t0, 1)}
        except Exception as e:  # noqa: BLE001 - one broken server must not hide the others' numbers
            alive = servers[name].alive()
            return {"responses": None, "seconds": round(time.monotonic() - t0, 1),
                    "error": f"{type(e).__name__}: {e}" + ("" if alive else f"\nserver died:\n{servers[name].log_tail(40)}")}

    with ThreadPoolExecutor(len(SERVERS)) as pool:
        got = dict(zip(SERVERS, pool.map(run, SERVERS)))
    summary = {"params": CONFIGS[config], "n": len(SEEDS), "max_new_tokens": MAX_NEW_TOKENS, "prompts": len(PROMPTS),
               "in_flight": IN_FLIGHT, "servers": {}}
    ref = got[REFERENCE]["responses"]
    for name, g in got.items():
        s = {"seconds": g["seconds"], "error": g["error"]}
        if g["responses"] is not None:
            s["accept_length"] = h.total_accept_length(g["responses"])
            s["distinct_outputs"] = len({tuple(t) for t in _tokens(g["responses"])})
            if ref is not None and name != REFERENCE:
                s["vs_reference"] = h.compare_to_reference(_tokens(ref), _tokens(g["responses"]), SEEDS)
        summary["servers"][name] = s
    graph, draft2 = got["invariant_graph"]["responses"], got[DRAFT2]["responses"]
    if graph is not None and draft2 is not None:
        summary["draft2_vs_invariant_graph"] = h.compare_to_reference(_tokens(graph), _tokens(draft2), SEEDS)
        summary["draft2_verify_counts_differ"] = sum(
            a != b for a, b in zip(_verify_counts(graph), _verify_counts(draft2)))
    nograph = got["invariant_nograph"]["responses"]
    if graph is not None and nograph is not None:
        summary["nograph_verify_counts_equal"] = sum(
            a == b for a, b in zip(_verify_counts(graph), _verify_counts(nograph)))
    if ref is not None:
        try:
            again = _sweep(servers[REFERENCE].base_url, config, SEEDS[:RESEND])
            summary["reference_resend"] = h.compare_to_reference(_tokens(ref[:RESEND]), _tokens(again), SEEDS[:RESEND])
        except Exception as e:  # noqa: BLE001
            summary["reference_resend"] = {"error": f"{type(e).__name__}: {e}"}
    h.record(f"invariant_sweep_{config}", summary)
    for name, srv in summary["servers"].items():
        cmp = srv.get("vs_reference")
        print(f"--- {config} {name}: {srv['seconds']} s, accept length {srv.get('accept_length')}, "
              + (f"identical to the reference {cmp['identical']}/{cmp['n']}, first-divergence histogram "
                 f"{cmp['first_divergence_histogram']}" if cmp else f"error {srv['error']}" if srv["error"] else ""))
    return {"summary": summary, "responses": {name: g["responses"] for name, g in got.items()}}


class _Sweeps:
    """Each configuration's sweep, run on first use (a skipped configuration is never sent)."""

    def __init__(self, servers: dict):
        self.servers, self.done = servers, {}

    def get(self, config: str) -> dict:
        if config not in self.done:
            self.done[config] = _measure(self.servers, config)
        return self.done[config]


@pytest.fixture(scope="module")
def sweeps(e2e_pool):
    return _Sweeps({name: e2e_pool.ready(name) for name in SERVERS})


def _server(result: dict, name: str) -> dict:
    s = result["summary"]["servers"][name]
    assert s["error"] is None, f"{name}: {s['error']}"
    return s


def _explain(cmp: dict) -> str:
    return (f"{cmp['identical']}/{cmp['n']} identical ({cmp['fraction_identical']:.4f}); first-divergence index "
            f"histogram {cmp['first_divergence_histogram']}; first divergences {cmp['divergences'][:5]}")


# ---------------------------------------------------------------------------------------------------------------
# 0. Each server runs what its name says (the plugin's own start-up log lines)

#: server -> the line its log must hold. The reference's comes from the token-id sampler opt-in, the others' from the
#: plugin's scheduler check (the worker and the DETSPEC target sampler it found).
LOG_LINES = {
    REFERENCE: f"sglang-detspec: {h.TOKEN_ID_SAMPLER_ENV}=1: the target model runner samples with",
    **{name: "sglang-detspec: DETSPEC_EAGLE_INVARIANT runs DetspecEAGLEWorkerV2" for name in (*INVARIANT, DRAFT2)},
    **{name: "sglang-detspec: DETSPEC_EAGLE_INVARIANT runs DetspecMultiLayerEagleWorkerV2" for name in MULTI_LAYER},
    CONTROL: "sglang-detspec: DETSPEC_EAGLE runs Detspec",
}


@pytest.mark.parametrize("name", [pytest.param(REFERENCE, marks=pytest.mark.skip(reason=_TRUNCATED_SKIP))
                                  if _TRUNCATED_SKIP else REFERENCE, *SERVERS[1:]])
def test_each_server_runs_what_it_is_named(sweeps, name):
    log = sweeps.servers[name].log_text()
    assert LOG_LINES[name] in log, sweeps.servers[name].log_tail(60)
    if name == REFERENCE:
        assert " runs Detspec" not in log, "the reference runs a DETSPEC speculative worker"


# ---------------------------------------------------------------------------------------------------------------
# 1. Same tokens as the non-speculative server


@pytest.mark.parametrize("config", _configs())
def test_reference_honours_the_seeds_and_repeats_itself(sweeps, config):
    """Without this the comparisons below could pass trivially (seeds ignored) or mean nothing (a drifting
    reference): distinct seeds give mostly distinct sequences, the same seeds again give the same tokens, and the
    reference ran no speculative verify."""
    r = sweeps.get(config)
    s = _server(r, REFERENCE)
    assert s["accept_length"] is None, f"the reference reported verify steps: it is speculative ({s})"
    assert s["distinct_outputs"] >= MIN_DISTINCT * len(SEEDS), s
    resend = r["summary"]["reference_resend"]
    assert "error" not in resend, resend
    assert resend["identical"] == resend["n"] == min(RESEND, len(SEEDS)), _explain(resend)


@pytest.mark.parametrize("name", INVARIANT)
@pytest.mark.parametrize("config", _configs(token_id_reference=True))
def test_invariant_emits_the_non_speculative_tokens(sweeps, config, name):
    """Issue 18's goal: every sequence of DETSPEC_EAGLE_INVARIANT is the non-speculative server's (asserted at 99 %,
    the exact fraction recorded)."""
    r = sweeps.get(config)
    _server(r, REFERENCE)
    cmp = _server(r, name)["vs_reference"]
    assert cmp["fraction_identical"] >= MIN_IDENTICAL, f"{name} vs {REFERENCE} at {config}: {_explain(cmp)}"


@pytest.mark.parametrize("config", _configs())
def test_a_second_draft_gives_the_same_tokens(sweeps, config):
    """The draft decides only how many tokens a step emits: another draft, the same tokens."""
    r = sweeps.get(config)
    _server(r, DRAFT2)
    _server(r, "invariant_graph")
    cmp = r["summary"]["draft2_vs_invariant_graph"]
    assert cmp["fraction_identical"] >= MIN_IDENTICAL, f"{DRAFT2} vs invariant_graph at {config}: {_explain(cmp)}"
    differ = r["summary"]["draft2_verify_counts_differ"]
    assert differ > 0, "every request took the same verify steps with both drafts: they propose alike, no evidence"


@pytest.mark.parametrize("config", _configs())
def test_control_rejection_sampling_gives_other_tokens(sweeps, config):
    """DETSPEC_EAGLE's rejection sampling is seeded but spends its randomness differently: it must not match, or the
    comparison above has no power."""
    r = sweeps.get(config)
    _server(r, REFERENCE)
    s = _server(r, CONTROL)
    assert s["accept_length"] is not None, f"the control ran no verify step: {s}"
    cmp = s["vs_reference"]
    assert cmp["fraction_identical"] < CONTROL_MAX_IDENTICAL, f"{CONTROL} vs {REFERENCE} at {config}: {_explain(cmp)}"


# ---------------------------------------------------------------------------------------------------------------
# 2. Accept length


def test_invariant_accept_length_shows_accepted_drafts(sweeps):
    """A draft raced with the verify's own key is accepted often (CPU estimate ~2.1-2.3 of 4 per step); a wrong key
    would leave ~1.14 (module docstring)."""
    r = sweeps.get("t1.0")
    servers = r["summary"]["servers"]
    accept = {name: servers[name].get("accept_length") for name in (*INVARIANT, DRAFT2, CONTROL)}
    h.record("invariant_accept_length_t1.0", accept)
    for name in ("invariant_graph", DRAFT2, *MULTI_LAYER):
        _server(r, name)
        assert accept[name] is not None and accept[name] > MIN_ACCEPT_LENGTH, accept


# ---------------------------------------------------------------------------------------------------------------
# 3. Changing batches, and the probe against the reference (sglang-detspec check)


@pytest.fixture(scope="module")
def checks(e2e_pool):
    """``check --against`` on the invariant server (uniform, mixed) and on the control (uniform, 2 trials), at once.
    Its tests come after the sweep tests in this file, so pytest runs it after the sweeps: nothing else shares the
    check's batches."""
    ref = e2e_pool.ready(REFERENCE)
    out = h.out_dir() / "checks"
    out.mkdir(exist_ok=True)
    plan = {name: ("uniform,mixed", CHECK_TRIALS) for name in CHECKED}
    plan[CONTROL] = ("uniform", 2)
    with ThreadPoolExecutor(len(plan)) as pool:
        futures = {name: pool.submit(ec.run_check, e2e_pool.ready(name), traffic, out / f"invariant_{name}.json",
                                     trials=trials, seed=CHECK_SEED, extra=["--against", ref.base_url])
                   for name, (traffic, trials) in plan.items()}
        results = {name: f.result() for name, f in futures.items()}
    for name, res in results.items():
        against = res["report"].get("against") or {}
        h.record(f"check_invariant_{name}", {
            **ec.check_summary(plan[name][0], res),
            "against": {k: against.get(k) for k in ("url", "passed", "self_consistent", "divergence", "compared")},
        })
        print(f"--- {name} (check --traffic {plan[name][0]} --against {ref.base_url}): exit {res['returncode']}\n"
              f"{res['stdout'][-2500:]}\n{res['stderr'][-800:]}")
    return results


@pytest.mark.parametrize("name", CHECKED)
def test_invariant_check_gives_one_output_under_changing_batches(checks, name):
    ec.assert_one_output_per_profile(checks[name], trials=CHECK_TRIALS)


@pytest.mark.parametrize("name", CHECKED)
def test_invariant_check_against_the_reference_passes(checks, name):
    res = checks[name]
    against = res["report"].get("against")
    assert against, f"no --against result (exit {res['returncode']}):\n{res['stdout']}{res['stderr']}"
    assert against["self_consistent"], against
    assert against["passed"], against["divergence"]
    assert res["returncode"] == 0, res["stdout"] + res["stderr"]


def test_control_check_against_the_reference_fails(checks):
    """The same --against comparison catches rejection sampling, while the control is still reproducible."""
    res = checks[CONTROL]
    rep = res["report"]
    assert rep.get("against"), f"no --against result (exit {res['returncode']}):\n{res['stdout']}{res['stderr']}"
    assert rep["unique_outputs"] == 1, res["stdout"]
    assert rep["against"]["self_consistent"], rep["against"]
    assert not rep["against"]["passed"] and res["returncode"] == 1, res["stdout"]


if __name__ == "__main__":
    h.run_module(__file__)
