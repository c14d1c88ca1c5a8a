"""End to end: DETSPEC_EAGLE with a ``--speculative-token-map`` (a reduced draft vocabulary, issue 33, item 1),
served without any environment variable.

The weighted tiny pair's EAGLE draft served with the token map of :mod:`sglang_detspec.models.token_map` (the
target's 512 most frequent tokens of 1,024, most frequent first): SGLang loads the file and keeps only those rows of
the draft's LM head, so the draft proposes draft indices that the hot map turns into target ids, and the verify reads
q through the same map. CUDA graphs on and off:

* ``check --traffic uniform,mixed`` gives one probe output per profile, the same tokens with graphs on and off, and
  an accept length above 1 (drafts read through the map are accepted: a draft index taken for a target id would
  propose tokens the target rarely emits); the log says a reduced draft of 512 of 1024 tokens is served through the
  token map, with no warning that it is unverified (H100, 0.5.17: 9 passed, accept length 2.46);
* control, refused at start-up: DETSPEC_EAGLE_INVARIANT with the token map (its race over a token map has never run
  on a GPU; the message names DETSPEC_EAGLE with the map, or the invariant mode without it).

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

import e2e_checks as ec
import e2e_harness as h
import e2e_servers
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e")

pytestmark = h.module_marks()

PAIR = "weighted"
SEED = 1234
TRIALS = 8
TRAFFIC = "uniform,mixed"
SERVING = ("token_map_graph", "token_map_nograph")
#: The draft worker's info line (integration/setup/server_args.py ``check_draft_vocab``).
REDUCED_LOG = ("DETSPEC_EAGLE: serving a reduced-vocabulary draft (512 of 1024 target tokens): proposals keyed by "
               "target id through the --speculative-token-map")
#: What each refused server's log must say (tests/unit/e2e_helpers/test_e2e_token_map_specs.py checks the first
#: against the refusal SGLang's resolution raises on CPU).
REFUSAL_NEEDLES = {
    "token_map_invariant": (
        "--speculative-algorithm DETSPEC_EAGLE_INVARIANT cannot be used with --speculative-token-map",
        "with an _INVARIANT algorithm", "Use --speculative-algorithm DETSPEC_EAGLE with the map"),
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
    spec = server_process.ServerSpec
    specs = [
        spec("token_map_graph", detspec),
        spec("token_map_nograph", detspec + h.GRAPHS_OFF),
        spec("token_map_invariant", invariant, expect_exit=True),
        spec("token_map_builtin_eagle_rs", upstream_rs, expect_exit=True),
    ]
    return {s.name: s for s in specs}


# Apart from the session pool's ports (31000+), the reduced-vocabulary module's (+3000) and lossless_check's (32000+).
pool = e2e_servers.module_pool(_specs, port_offset=5000)


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
    servers = {name: pool.ready(name) for name in SERVING}
    return ec.run_checks(servers, {name: TRAFFIC for name in SERVING}, trials=TRIALS, seed=SEED)


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
def test_the_log_says_a_reduced_draft_is_served_without_a_warning(pool, checks, name):
    log = pool.get(name).log_text()
    assert REDUCED_LOG in log, pool.get(name).log_tail(40)
    assert "NOT YET GPU-verified" not in log, pool.get(name).log_tail(40)


def test_the_invariant_mode_with_a_token_map_is_refused(pool):
    _assert_refused(pool, "token_map_invariant")


def test_upstream_rejection_sampling_does_not_serve_a_token_map(pool):
    _assert_refused(pool, "token_map_builtin_eagle_rs")


if __name__ == "__main__":
    h.run_module(__file__)
