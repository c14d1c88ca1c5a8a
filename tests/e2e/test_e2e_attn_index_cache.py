"""End to end: DETSPEC_EAGLE with the attention index cache (the deterministic Triton attention's unified KV indices
built once per forward instead of per layer, issue 32; on by default, ``SGLANG_DETSPEC_ATTN_INDEX_CACHE=0`` turns it
off) gives the tokens of the server without it.

The cache only reuses integer indices that SGLang would rebuild identically for every window-less layer, so the
attention numbers, hence the tokens, must be bit-identical: the probe's tokens of the cached servers (CUDA graphs on
and off, ``SGLANG_DETSPEC_ATTN_INDEX_CACHE=1``) must equal those of ``detspec_eagle_no_attn_cache_graph`` /
``_nograph`` (``=0``) under every traffic profile of
``sglang-detspec check`` (one output per profile, seeds check passed), and each cached server's log must say the
cache ran (its first-use line), so a cache that never engaged cannot pass. A stale index under CUDA-graph replay
(a graph reading another capture's or the warm-up's tensors) would attend over wrong KV slots and change tokens.

The control that must fail: ``detspec_eagle_attn_cache_stale_control`` runs the cache with
``tests/e2e/controls/stale_attention_indices`` (the record kept from the eager warm-up into graph capture); its
probe's tokens must differ from the uncached servers', so the token comparison above can see a stale index.

Every other E2E module runs its DETSPEC servers with the cache on, its default. The speed it gains is measured by
``bench-serve --configs detspec_no_attn_cache,detspec`` and ``scripts/bench/profile_ops.py`` (docs/kernels.md).
"""

import pytest

import e2e_checks as ec
import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=400, suite="detspec-e2e")

SEED = 1234
TRIALS = 12
CACHED = ("detspec_eagle_attn_cache_graph", "detspec_eagle_attn_cache_nograph")
UNCACHED = ("detspec_eagle_no_attn_cache_graph", "detspec_eagle_no_attn_cache_nograph")
STALE_CONTROL = "detspec_eagle_attn_cache_stale_control"
FIRST_USE = "attention index cache: the deterministic Triton attention reuses one forward's unified KV indices"

pytestmark = h.module_marks(*CACHED, *UNCACHED, STALE_CONTROL)


@pytest.fixture(scope="module")
def checks(e2e_pool):
    servers = {name: e2e_pool.ready(name) for name in (*CACHED, *UNCACHED, STALE_CONTROL)}
    traffic = {name: "uniform" if name == STALE_CONTROL else "all" for name in servers}
    return ec.run_checks(servers, traffic, trials=TRIALS, seed=SEED)


@pytest.mark.parametrize("name", CACHED)
def test_cached_server_gives_one_output_under_every_profile(checks, name):
    r = checks[name]
    assert r["returncode"] == 0, r["stdout"] + r["stderr"]
    ec.assert_one_output_per_profile(r, profiles=ec.ALL_PROFILES)


def test_cached_servers_give_the_uncached_tokens(checks):
    first = {name: tuple(checks[name]["report"]["trials"][0]["output_ids"]) for name in (*CACHED, *UNCACHED)}
    assert len(set(first.values())) == 1, first


def test_control_with_a_stale_record_changes_the_tokens(checks, e2e_pool):
    control = checks[STALE_CONTROL]
    assert control["report"].get("trials"), control["stdout"] + control["stderr"]  # it served: wrong tokens, no crash
    uncached = tuple(checks[UNCACHED[0]]["report"]["trials"][0]["output_ids"])
    assert tuple(control["report"]["trials"][0]["output_ids"]) != uncached
    assert FIRST_USE in e2e_pool.get(STALE_CONTROL).log_text()


@pytest.mark.parametrize("name", CACHED)
def test_cached_server_log_says_the_cache_ran(checks, e2e_pool, name):
    assert FIRST_USE in e2e_pool.get(name).log_text()


@pytest.mark.parametrize("name", UNCACHED)
def test_uncached_server_log_has_no_cache(checks, e2e_pool, name):
    assert FIRST_USE not in e2e_pool.get(name).log_text()


if __name__ == "__main__":
    h.run_module(__file__)
