"""End to end: a reduced-vocabulary ("hot token") EAGLE3 draft under DETSPEC_EAGLE3 and the invariant mode
(issue 33, item 1), both served without any environment variable.

The ``qwen3_eagle3`` pair (``sglang_detspec.models.family_pairs``: a Qwen3 target of 1024 tokens, an EAGLE3 draft of
256 hot tokens with a ``d2t`` map), CUDA graphs on and off:

* DETSPEC_EAGLE3 as users serve it (its lossless check passed on an H100): ``sglang-detspec check --traffic all``
  (uniform, mixed, long, prefix) gives one probe output per profile, the same tokens with graphs on and off, and an
  accept length above 1 (the verify accepts drafts read through the hot map -- a draft index taken for a target id
  would propose tokens the target rarely emits); its log says it serves a reduced draft, with no warning;
* DETSPEC_EAGLE3_INVARIANT (the race over the hot map; H100, 0.5.17: 100/100 seeds equal to the reference, graphs on
  and off): ``check --traffic all --against`` the non-speculative token-id reference gives one output equal to the
  reference's, and a sweep of :data:`SWEEP_SEEDS` seeds (100; 1,000 with ``DETSPEC_E2E_SLOW=1``) is identical to the
  reference's, graphs on and off, with drafts accepted; its log says it serves a reduced draft, with no warning;
* control: DETSPEC_EAGLE3 (rejection sampling) matches the reference in under half the swept seeds, so the sweep can
  tell the two apart.

Servers come from this module's own pool (the pair is not the session's tiny pair). The lossless chi-square on this
pair is ``scripts/lossless_check.py --pair qwen3_eagle3`` (minutes, not a test).
"""

import os
from pathlib import Path

import pytest

from sglang_detspec import server_process
from sglang_detspec.checker.traffic import PROFILES

import e2e_checks as ec
import e2e_harness as h
import e2e_servers
import family_harness as fh
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=480, suite="detspec-e2e")

pytestmark = h.module_marks()

PAIR = "qwen3_eagle3"
SEED = 1234
TRIALS = 8
TRAFFIC = "all"
SERVING = ("reduced_graph", "reduced_nograph")
INVARIANT = ("reduced_invariant_graph", "reduced_invariant_nograph")
REFERENCE = "reduced_reference"
SWEEP_SEEDS = list(range(1, 1001 if os.environ.get("DETSPEC_E2E_SLOW") == "1" else 101))
SWEEP_TOKENS = 32
PROMPTS = (h.PROBE_PROMPT, "Once upon a time, in a small town by the sea, there lived")


def _specs():
    from sglang_detspec.models.family_pairs import ensure_family_pair

    root = os.environ.get("DETSPEC_TINY_MODELS_ROOT")
    pair = ensure_family_pair(Path(root) if root else None, PAIR)
    base = h.common_args(pair.target, PAIR)
    detspec3 = base + h.eagle_args(pair.draft, "DETSPEC_EAGLE3", deterministic=True)
    invariant3 = base + h.eagle_args(pair.draft, "DETSPEC_EAGLE3_INVARIANT", deterministic=True) + h.INVARIANT_ARGS
    spec = server_process.ServerSpec
    specs = [
        spec("reduced_graph", detspec3),
        spec("reduced_nograph", detspec3 + h.GRAPHS_OFF),
        spec("reduced_invariant_graph", invariant3),
        spec("reduced_invariant_nograph", invariant3 + h.GRAPHS_OFF),
        spec(REFERENCE, base + ["--enable-deterministic-inference"] + h.INVARIANT_ARGS,
             env={h.TOKEN_ID_SAMPLER_ENV: "1"}),
    ]
    return {s.name: s for s in specs}


# Apart from the session pool's ports (31000+) and lossless_check's (32000+).
pool = e2e_servers.module_pool(_specs, port_offset=3000)


def _ready(pool, name):
    return pool.ready(name)


@pytest.fixture(scope="module")
def checks(pool):
    servers = {name: _ready(pool, name) for name in SERVING}
    return ec.run_checks(servers, {name: TRAFFIC for name in SERVING}, trials=TRIALS, seed=SEED)


@pytest.fixture(scope="module")
def invariant_check(pool):
    srv, ref = _ready(pool, "reduced_invariant_graph"), _ready(pool, REFERENCE)
    (h.out_dir() / "checks").mkdir(exist_ok=True)
    res = ec.run_check(srv, TRAFFIC, h.out_dir() / "checks" / "reduced_invariant_graph.json", trials=TRIALS,
                      seed=SEED, extra=["--against", ref.base_url])
    h.record("check_reduced_invariant_graph", ec.check_summary(TRAFFIC, res))
    return res


@pytest.fixture(scope="module")
def sweeps(pool):
    out = {}
    for name in (REFERENCE, *INVARIANT, "reduced_graph"):
        out[name] = [r["output_ids"] for r in fh.seed_sweep(_ready(pool, name).base_url, SWEEP_SEEDS, PROMPTS,
                                                            max_new_tokens=SWEEP_TOKENS)]
    return out


@pytest.mark.parametrize("name", SERVING)
def test_reduced_draft_probe_is_one_output_under_every_traffic_profile(checks, name):
    r = checks[name]
    assert r["returncode"] == 0, r["stdout"] + r["stderr"]
    profiles = {p["name"]: p for p in r["report"]["profiles"]}
    assert set(profiles) == set(PROFILES)
    for prof in profiles.values():
        assert prof["unique_outputs"] == 1, (name, prof["name"], r["stdout"])
    accept = r["report"].get("probe_accept_length")
    h.record(f"reduced_vocab_accept_{name}", accept)
    assert accept is not None and accept > 1.0, f"{name}: accept length {accept} (drafts never accepted?)"


def test_graphs_on_and_off_give_the_same_tokens(checks):
    first = [checks[n]["report"]["trials"][0]["output_ids"] for n in SERVING]
    assert first[0] == first[1]


@pytest.mark.parametrize("name", ("reduced_graph", "reduced_invariant_graph"))
def test_the_log_says_a_reduced_draft_is_served_without_a_warning(pool, name):
    srv = _ready(pool, name)
    log = srv.log_text()
    algorithm = "DETSPEC_EAGLE3_INVARIANT" if "invariant" in name else "DETSPEC_EAGLE3"
    assert f"{algorithm}: serving a reduced-vocabulary draft (256 of 1024 target tokens)" in log, srv.log_tail(40)
    assert "NOT YET GPU-verified" not in log, srv.log_tail(40)


def test_invariant_probe_is_one_output_equal_to_the_reference(invariant_check):
    rep = invariant_check["report"]
    assert rep, invariant_check["stdout"] + invariant_check["stderr"]
    assert rep["unique_outputs"] == 1, invariant_check["stdout"]
    against = rep.get("against") or {}
    assert against.get("self_consistent") and against.get("passed"), against
    assert invariant_check["returncode"] == 0, invariant_check["stdout"] + invariant_check["stderr"]
    accept = rep.get("probe_accept_length")
    assert accept is not None and accept > 1.0, f"accept length {accept}: the hot race never proposed an accepted token"


@pytest.mark.parametrize("name", INVARIANT)
def test_invariant_sweep_is_identical_to_the_reference(sweeps, name):
    cmp = h.compare_to_reference(sweeps[REFERENCE], sweeps[name], SWEEP_SEEDS)
    h.record(f"reduced_invariant_sweep_{name}", cmp)
    assert cmp["identical"] == len(SWEEP_SEEDS), cmp


def test_control_rejection_sampling_differs_from_the_reference(sweeps):
    cmp = h.compare_to_reference(sweeps[REFERENCE], sweeps["reduced_graph"], SWEEP_SEEDS)
    h.record("reduced_rejection_sampling_vs_reference", {k: cmp[k] for k in ("n", "identical")})
    assert cmp["identical"] < len(SWEEP_SEEDS) / 2, cmp
    assert len({tuple(x) for x in sweeps[REFERENCE]}) > len(SWEEP_SEEDS) / 2  # the reference honours the seeds


if __name__ == "__main__":
    h.run_module(__file__)
