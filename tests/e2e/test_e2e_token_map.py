"""End to end: DETSPEC_EAGLE with a ``--speculative-token-map`` (a reduced draft vocabulary, issue 33, item 1),
opted in with ``SGLANG_DETSPEC_REDUCED_VOCAB=1``.

The weighted tiny pair's EAGLE draft served with the token map of :mod:`sglang_detspec.models.token_map` (the
target's 512 most frequent tokens of 1,024, most frequent first): SGLang loads the file and keeps only those rows of
the draft's LM head, so the draft proposes draft indices that the hot map turns into target ids, and the verify reads
q through the same map. CUDA graphs on and off:

* ``check --traffic uniform,mixed`` gives one probe output per profile, the same tokens with graphs on and off, and
  an accept length above 1 (drafts read through the map are accepted: a draft index taken for a target id would
  propose tokens the target rarely emits); the log says a reduced draft of 512 of 1024 tokens is served;
* controls, refused at start-up: the same server without the opt-in (the message names the flag and the opt-in), and
  DETSPEC_EAGLE_INVARIANT with the token map even opted in (its race over a token map has not run on a GPU).

Upstream built-in EAGLE with ``--speculative-use-rejection-sampling`` does not serve a token map (0.5.17 - 0.5.23:
``EAGLEWorkerV2`` refuses rejection sampling when the draft's vocabulary differs from the target's, "FIXME: support
reduced (hot) draft vocab"), so there is no upstream sampling control giving several outputs here; the last test
checks that refusal, so the note fails loudly once upstream serves it.

Servers come from this module's own pool (a token map no other module serves). The lossless chi-square of this
configuration is ``scripts/lossless_check.py --pair weighted_token_map`` (minutes, not a test).
"""

import os
from pathlib import Path

import pytest

from sglang_detspec import server_process

import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e")

pytestmark = h.module_marks()

PAIR = "weighted"
OPT_IN_ENV = "SGLANG_DETSPEC_REDUCED_VOCAB"
SEED = 1234
TRIALS = 8
TRAFFIC = "uniform,mixed"
SERVING = ("token_map_graph", "token_map_nograph")
REDUCED_LOG = "serving a reduced-vocabulary draft (512 of 1024 target tokens)"
NOT_VERIFIED_LOG = "a --speculative-token-map under DETSPEC_EAGLE is NOT YET GPU-verified"
#: What each refused server's log must say (tests/unit/e2e_helpers/test_e2e_token_map_specs.py checks the first two
#: against the refusals SGLang's resolution raises on CPU).
REFUSAL_NEEDLES = {
    "token_map_no_opt_in": ("--speculative-algorithm DETSPEC_EAGLE cannot be used with --speculative-token-map",
                            f"{OPT_IN_ENV}=1"),
    "token_map_invariant": (
        "--speculative-algorithm DETSPEC_EAGLE_INVARIANT cannot be used with --speculative-token-map",
        f"{OPT_IN_ENV}=1 (not with an _INVARIANT algorithm)"),
    # EAGLEWorkerV2.__init__ after loading the map (0.5.17 - 0.5.23).
    "token_map_builtin_eagle_rs": ("requires the draft and target to share one vocab", "(512) != target vocab (1024)"),
}


def _specs():
    from sglang_detspec.models.tiny_models import ensure_tiny_models
    from sglang_detspec.models.token_map import ensure_weighted_token_map

    env_root = os.environ.get("DETSPEC_TINY_MODELS_ROOT")
    root = Path(env_root) if env_root else None
    models = ensure_tiny_models(root, pair=PAIR)
    token_map = ["--speculative-token-map", str(ensure_weighted_token_map(root))]
    base = h.common_args(models.target, PAIR)
    detspec = base + h.eagle_args(models.eagle_draft, "DETSPEC_EAGLE", deterministic=True) + token_map
    invariant = (base + h.eagle_args(models.eagle_draft, "DETSPEC_EAGLE_INVARIANT", deterministic=True) + token_map
                 + h.INVARIANT_ARGS)
    upstream_rs = base + h.eagle_args(models.eagle_draft, "EAGLE", rejection_sampling=True) + token_map
    opt_in, no_opt_in = {OPT_IN_ENV: "1"}, {OPT_IN_ENV: "0"}  # explicit, whatever the caller's environment holds
    spec = server_process.ServerSpec
    specs = [
        spec("token_map_graph", detspec, env=dict(opt_in)),
        spec("token_map_nograph", detspec + h.GRAPHS_OFF, env=dict(opt_in)),
        spec("token_map_no_opt_in", detspec, expect_exit=True, env=dict(no_opt_in)),
        spec("token_map_invariant", invariant, expect_exit=True, env=dict(opt_in)),
        spec("token_map_builtin_eagle_rs", upstream_rs, expect_exit=True),
    ]
    return {s.name: s for s in specs}


@pytest.fixture(scope="module")
def pool():
    reason = h.e2e_skip_reason()
    if reason:
        pytest.skip(reason)
    specs = _specs()
    # Apart from the session pool's ports (31000+), the reduced-vocabulary module's (+3000) and lossless_check's
    # (32000+).
    p = server_process.ServerPool(
        specs, log_dir=h.out_dir(), make_server=h.Server,
        base_port=int(os.environ.get("DETSPEC_E2E_BASE_PORT", "31000")) + 5000,
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


def _assert_refused(pool, name):
    """``name`` exits non-zero at start-up and its log holds every one of its :data:`REFUSAL_NEEDLES`."""
    srv = pool.get(name)
    rc = srv.wait_exit(300)
    log = srv.log_text()
    missing = [n for n in REFUSAL_NEEDLES[name] if n not in log]
    h.record(f"token_map_refusal_{name}", {"exit_code": rc, "missing": missing})
    assert rc is not None and rc != 0, f"{name} kept running (or exited 0); log tail:\n{srv.log_tail(30)}"
    assert not missing, f"{name}: the log lacks {missing}; its tail:\n{srv.log_tail(40)}"


@pytest.fixture(scope="module")
def checks(pool):
    servers = {name: _ready(pool, name) for name in SERVING}
    return h.run_checks(servers, {name: TRAFFIC for name in SERVING}, trials=TRIALS, seed=SEED)


@pytest.mark.parametrize("name", SERVING)
def test_token_map_probe_is_one_output_under_uniform_and_mixed_traffic(checks, name):
    r = checks[name]
    assert r["returncode"] == 0, r["stdout"] + r["stderr"]
    profiles = {p["name"]: p for p in r["report"]["profiles"]}
    assert set(profiles) == {"uniform", "mixed"}
    for prof in profiles.values():
        assert prof["unique_outputs"] == 1, (name, prof["name"], r["stdout"])
    accept = r["report"].get("probe_accept_length")
    h.record(f"token_map_accept_{name}", accept)
    assert accept is not None and accept > 1.0, f"{name}: accept length {accept} (drafts never accepted?)"


def test_graphs_on_and_off_give_the_same_tokens(checks):
    first = [checks[n]["report"]["trials"][0]["output_ids"] for n in SERVING]
    assert first[0] == first[1]


@pytest.mark.parametrize("name", SERVING)
def test_the_log_says_a_reduced_draft_is_served(pool, checks, name):
    log = pool.get(name).log_text()
    assert REDUCED_LOG in log, pool.get(name).log_tail(40)


def test_the_opted_in_token_map_warns_it_is_not_gpu_verified(pool, checks):
    # Drop this test when the opt-in is lifted (the warning goes with it).
    log = pool.get("token_map_graph").log_text()
    assert NOT_VERIFIED_LOG in log, pool.get("token_map_graph").log_tail(40)


def test_the_token_map_without_the_opt_in_is_refused_at_start_up(pool):
    _assert_refused(pool, "token_map_no_opt_in")


def test_the_invariant_mode_with_a_token_map_is_refused_even_opted_in(pool):
    _assert_refused(pool, "token_map_invariant")


def test_upstream_rejection_sampling_does_not_serve_a_token_map(pool):
    _assert_refused(pool, "token_map_builtin_eagle_rs")


if __name__ == "__main__":
    h.run_module(__file__)
