"""End to end: DETSPEC_EAGLE3 with a reduced-vocabulary ("hot token") EAGLE3 draft (issue 33, item 1).

The ``qwen3_eagle3`` pair (``sglang_detspec.models.family_pairs``: a Qwen3 target of 1024 tokens, an EAGLE3 draft of
256 hot tokens with a ``d2t`` map) as users serve it (no opt-in since its lossless check passed on an H100), CUDA
graphs on and off:

* ``sglang-detspec check --traffic uniform,mixed``: one probe output per profile (the seeded probe is identical
  whatever shares its batches), the same tokens with graphs on and off, and the accept length (recorded; it must
  exceed 1, i.e. the verify accepts drafts read through the hot map -- a draft index taken for a target id would
  propose tokens the target rarely emits);
* the server log says it serves a reduced-vocabulary draft, and carries no "not yet GPU-verified" warning;
* the control that must fail at start-up: DETSPEC_EAGLE3_INVARIANT, even with ``SGLANG_DETSPEC_REDUCED_VOCAB=1``
  (its race over a hot map has not run on a GPU).

Servers come from this module's own pool (the pair is not the session's tiny pair). The lossless chi-square on this
pair is ``scripts/lossless_check.py --pair qwen3_eagle3`` (minutes, not a test).
"""

import os
from pathlib import Path

import pytest

from sglang_detspec import server_process

import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=420, suite="detspec-e2e")

pytestmark = h.module_marks()

PAIR = "qwen3_eagle3"
OPT_IN = {"SGLANG_DETSPEC_REDUCED_VOCAB": "1"}  # lifts the token-map refusal only; the invariant mode stays refused
SEED = 1234
TRIALS = 8
TRAFFIC = "uniform,mixed"
SERVING = ("reduced_graph", "reduced_nograph")


def _specs():
    from sglang_detspec.models.family_pairs import ensure_family_pair

    root = os.environ.get("DETSPEC_TINY_MODELS_ROOT")
    pair = ensure_family_pair(Path(root) if root else None, PAIR)
    base = h.common_args(pair.target, PAIR)
    detspec3 = base + h.eagle_args(pair.draft, "DETSPEC_EAGLE3", deterministic=True)
    invariant3 = base + h.eagle_args(pair.draft, "DETSPEC_EAGLE3_INVARIANT", deterministic=True)
    specs = [
        server_process.ServerSpec("reduced_graph", detspec3),
        server_process.ServerSpec("reduced_nograph", detspec3 + h.GRAPHS_OFF),
        server_process.ServerSpec("reduced_invariant", invariant3, expect_exit=True, env=dict(OPT_IN)),
    ]
    return {s.name: s for s in specs}


@pytest.fixture(scope="module")
def pool():
    reason = h.e2e_skip_reason()
    if reason:
        pytest.skip(reason)
    specs = _specs()
    # Apart from the session pool's ports (31000+) and lossless_check's (32000+).
    p = server_process.ServerPool(
        specs, log_dir=h.out_dir(), make_server=h.Server,
        base_port=int(os.environ.get("DETSPEC_E2E_BASE_PORT", "31000")) + 3000,
        parallel=os.environ.get("DETSPEC_E2E_PARALLEL", "1") != "0",
        timeout=float(os.environ.get("DETSPEC_E2E_START_TIMEOUT", "600")),
    )
    p.prelaunch = list(specs)
    yield p
    p.close()


def _ready(pool, name):
    srv = pool.get(name)
    srv.wait_ready(pool.timeout)
    if not srv.alive():
        pytest.fail(f"server {name} died; log tail:\n{srv.log_tail(80)}")
    return srv


@pytest.fixture(scope="module")
def checks(pool):
    servers = {name: _ready(pool, name) for name in SERVING}
    return h.run_checks(servers, {name: TRAFFIC for name in SERVING}, trials=TRIALS, seed=SEED)


@pytest.mark.parametrize("name", SERVING)
def test_reduced_draft_probe_is_one_output_under_uniform_and_mixed_traffic(checks, name):
    r = checks[name]
    assert r["returncode"] == 0, r["stdout"] + r["stderr"]
    profiles = {p["name"]: p for p in r["report"]["profiles"]}
    assert set(profiles) == {"uniform", "mixed"}
    for prof in profiles.values():
        assert prof["unique_outputs"] == 1, (name, prof["name"], r["stdout"])
    accept = r["report"].get("probe_accept_length")
    h.record(f"reduced_vocab_accept_{name}", accept)
    assert accept is not None and accept > 1.0, f"{name}: accept length {accept} (drafts never accepted?)"


def test_graphs_on_and_off_give_the_same_tokens(checks):
    first = [checks[n]["report"]["trials"][0]["output_ids"] for n in SERVING]
    assert first[0] == first[1]


def test_the_log_says_a_reduced_draft_is_served_without_a_warning(pool, checks):
    log = pool.get("reduced_graph").log_text()
    assert "serving a reduced-vocabulary draft (256 of 1024 target tokens)" in log, pool.get("reduced_graph").log_tail(40)
    assert "NOT YET GPU-verified" not in log


def test_the_invariant_mode_is_refused_at_start_up(pool):
    srv = pool.get("reduced_invariant")
    rc = srv.wait_exit(300)
    assert rc is not None and rc != 0, "reduced_invariant kept running"
    log = srv.log_text()
    assert "a draft vocabulary of 256 tokens (target: 1024)" in log and "hot-token map" in log, srv.log_tail(30)


if __name__ == "__main__":
    h.run_module(__file__)
