"""End to end under real traffic: ``sglang-detspec check --traffic ...`` against real servers on the weighted tiny pair.

The weighted pair (``sglang_detspec.models.tiny_models``, real seeded weights) rejects part of the drafts, so wrong
accept / reject decisions, batch-dependent residual samples or renormalisation would show. Every DETSPEC
configuration -- DETSPEC_EAGLE with CUDA graphs, without them, without overlap scheduling, DETSPEC_EAGLE3 -- must give
one probe output under every traffic profile of the check tool (uniform, mixed sampling parameters next to it, long
chunked prompts, warm / flushed radix cache), the same tokens across those configurations, and an accept length in
[1.5, 3.5] of 4. ``--chunked-prefill-size 64`` must be refused at start-up (it would starve the queue),
``--chunked-prefill-size 4096`` must serve prompts of 100 to over 10,000 tokens beside the probe.

Controls that must fail, so the tests above can fail:

* built-in EAGLE with rejection sampling under uniform traffic gives several outputs (``check`` exits 1 and names the
  first diverging token);
* DETSPEC whose target sampler is handed back to SGLang's rank-keyed sorted path (a test-only ``sitecustomize``,
  tests/e2e/controls/) gives several outputs under the mixed profile.

Built-in EAGLE is not run under the mixed profile: on SGLang 0.5.17 a batch mixing greedy and sampled rows makes its
verify JIT-compile FlashInfer's top-k renorm kernel, which fails on the project's GPU bundle (docs/upstream.md, "Known
SGLang behaviour") -- the liveness problem DETSPEC's row-local verify removes. All checks run concurrently, one per server.
"""


import pytest

import e2e_checks as ec
import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=600, suite="detspec-e2e")

SEED = 1234
TRIALS = 12
#: server -> (traffic profiles, exit code the check must end with). 0: one output; 1: several (a control).
CHECKS = {
    "detspec_eagle_graph": ("all", 0),
    "detspec_eagle_nograph": ("all", 0),
    "detspec_eagle_nooverlap": ("all", 0),
    "detspec_eagle3_graph": ("all", 0),
    "detspec_eagle_chunk4096": ("long,uniform", 0),
    "detspec_upstream_sampler_control": ("mixed", 1),
    "builtin_eagle_rs": ("uniform", 1),
}
SAME_TOKENS = ("detspec_eagle_graph", "detspec_eagle_nograph", "detspec_eagle_nooverlap", "detspec_eagle_chunk4096")
ACCEPT_RANGE = (1.5, 3.5)

pytestmark = h.module_marks(*(*CHECKS, "detspec_eagle_chunk64"))


@pytest.fixture(scope="module")
def checks(e2e_pool):
    """Every server's check at once; a summary per server in e2e_results.json (reports beside it)."""
    servers = {name: e2e_pool.ready(name) for name in CHECKS}
    return ec.run_checks(servers, {name: traffic for name, (traffic, _) in CHECKS.items()}, trials=TRIALS, seed=SEED)


@pytest.mark.parametrize("name", [n for n, (_, rc) in CHECKS.items() if rc == 0])
def test_detspec_one_output_under_every_profile(checks, name):
    r = checks[name]
    assert r["returncode"] == 0, r["stdout"] + r["stderr"]
    ec.assert_one_output_per_profile(r, min_trials=min(TRIALS, 6))  # prefix runs 6 trials, the others TRIALS


@pytest.mark.parametrize("name", [n for n, (_, rc) in CHECKS.items() if rc == 0])
def test_detspec_accept_length_shows_rejection(checks, name):
    """The weighted pair really rejects drafts: the probe's accept length lies strictly inside (1, 4)."""
    accept = checks[name]["report"]["probe_accept_length"]
    assert accept is not None, "no spec_verify_ct in meta_info: speculation did not run"
    assert ACCEPT_RANGE[0] <= accept <= ACCEPT_RANGE[1], accept


def test_same_tokens_with_graphs_on_or_off_overlap_on_or_off_and_chunked(checks):
    first = {name: checks[name]["report"]["trials"][0]["output_ids"] for name in SAME_TOKENS}
    assert len({tuple(ids) for ids in first.values()}) == 1, first


def test_long_prompts_up_to_10k_tokens_are_served_with_chunk_4096(checks):
    rep = checks["detspec_eagle_chunk4096"]["report"]
    long_trials = [t for t in rep["trials"] if t["profile"] == "long"]
    prompt_tokens = [f["prompt_tokens"] for t in long_trials for f in t["filler_details"] if f.get("prompt_tokens")]
    h.record("chunk4096_long_prompt_tokens", sorted(prompt_tokens))
    assert prompt_tokens, "the long profile sent no prompt whose length the server reported"
    # The long profile's ladder for a 4096-token chunk runs from 100 to 12,288 tokens (capped by the server).
    assert min(prompt_tokens) <= 200 and max(prompt_tokens) >= 10_000, sorted(prompt_tokens)


@pytest.mark.parametrize("name", [n for n, (_, rc) in CHECKS.items() if rc == 1])
def test_controls_give_several_outputs(checks, name):
    r = checks[name]
    rep = r["report"]
    assert r["returncode"] == 1, r["stdout"] + r["stderr"]
    assert rep["unique_outputs"] > 1
    assert rep["divergence"] is not None and "first at token" in r["stdout"], r["stdout"]


def test_chunk_below_the_alignment_is_refused_at_startup(e2e_pool):
    srv = e2e_pool.get("detspec_eagle_chunk64")
    rc = srv.wait_exit(300)
    assert rc is not None and rc != 0, "the server kept running with --chunked-prefill-size 64"
    log = srv.log_text()
    assert "--chunked-prefill-size 64" in log and "4096" in log and "-1" in log, srv.log_tail(30)


def test_bad_requests_are_refused_and_server_keeps_serving(e2e_pool, checks):
    srv = e2e_pool.ready("detspec_eagle_graph")
    expected = checks["detspec_eagle_graph"]["report"]["trials"][0]["output_ids"]
    probe = {"temperature": 1.0, "max_new_tokens": len(expected), "sampling_seed": SEED, "ignore_eos": True}
    prompt = checks["detspec_eagle_graph"]["report"]["prompt"]
    bad = {
        "seed_above_int64": dict(probe, sampling_seed=2**64),
        "seed_below_int64": dict(probe, sampling_seed=-(2**63) - 1),
        "negative_max_new_tokens": dict(probe, max_new_tokens=-1),
    }
    outcomes = {}
    for name, params in bad.items():
        try:
            resp = h.generate(srv.base_url, prompt, params, timeout=120)
            outcomes[name] = {"status": 200, "error": resp.get("error"), "body": str(resp)[:300]}
        except h.HTTPStatusError as e:
            outcomes[name] = {"status": e.status, "body": e.body[:300]}
        assert srv.alive(), f"server died after the {name} request; log tail:\n{srv.log_tail(60)}"
        good = h.generate(srv.base_url, prompt, probe, timeout=120)
        assert good["output_ids"] == expected, f"output changed after the {name} request"
    h.record("detspec_eagle_graph_bad_requests", outcomes)
    for name, o in outcomes.items():
        assert o["status"] >= 400 or o.get("error"), f"{name} was accepted: {o}"


if __name__ == "__main__":
    h.run_module(__file__)
