"""End to end: DETSPEC_EAGLE with its verify attention in the plugin's split-KV verify kernel
(``SGLANG_DETSPEC_SPLIT_KV_VERIFY=1``, issue 32) still gives one output per seed.

The opt-in replaces SGLang's one-stage extend kernel in every TARGET_VERIFY forward with
kernels/split_kv_verify_attention.py (fixed 256-key tiles merged in order; integration/sampling/split_kv_verify.py).
A request's rows depend only on its own keys, so the probe must give one output under every traffic profile of
``sglang-detspec check``, with CUDA graphs on and off, the same tokens on both, and an accept length inside (1, 4)
(the weighted pair rejects drafts, so rejection sampling runs). Each server's log must say the kernel was installed.
Controls that must fail: built-in EAGLE + rejection sampling under the same uniform traffic gives several outputs (so
the check can see a batch-dependent server), and the default DETSPEC_EAGLE server's log has no install line (so a
line every server printed cannot pass). Its speed: ``bench-serve --configs eagle_rs,detspec,detspec_split_kv_verify``
and scripts/bench/bench_verify_attention.py.
"""

import pytest

import e2e_checks as ec
import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e")

SEED = 1234
TRIALS = 12
SPLIT_KV = ("detspec_eagle_split_kv_verify_graph", "detspec_eagle_split_kv_verify_nograph")
DEFAULT = "detspec_eagle_graph"
CONTROL = "builtin_eagle_rs"
ACCEPT_RANGE = (1.5, 3.5)
INSTALLED = "the verify runs its attention in the split-KV verify kernel"
ASKED_BY = "asked for by SGLANG_DETSPEC_SPLIT_KV_VERIFY=1"

pytestmark = h.module_marks(*SPLIT_KV, DEFAULT, CONTROL)


@pytest.fixture(scope="module")
def checks(e2e_pool):
    servers = {name: e2e_pool.ready(name) for name in (*SPLIT_KV, CONTROL)}
    traffic = {name: "uniform" if name == CONTROL else "all" for name in servers}
    return ec.run_checks(servers, traffic, trials=TRIALS, seed=SEED)


@pytest.mark.parametrize("name", SPLIT_KV)
def test_one_output_under_every_profile(checks, name):
    r = checks[name]
    assert r["returncode"] == 0, r["stdout"] + r["stderr"]
    ec.assert_one_output_per_profile(r, profiles=ec.ALL_PROFILES)


@pytest.mark.parametrize("name", SPLIT_KV)
def test_the_accept_length_shows_rejection(checks, name):
    accept = checks[name]["report"]["probe_accept_length"]
    assert accept is not None and ACCEPT_RANGE[0] <= accept <= ACCEPT_RANGE[1], accept


def test_the_control_gives_several_outputs(checks):
    r = checks[CONTROL]
    assert r["returncode"] == 1 and r["report"]["unique_outputs"] > 1, r["stdout"] + r["stderr"]


def test_graphs_on_and_off_give_the_same_tokens(checks):
    first = {name: tuple(checks[name]["report"]["trials"][0]["output_ids"]) for name in SPLIT_KV}
    assert len(set(first.values())) == 1, first


@pytest.mark.parametrize("name", SPLIT_KV)
def test_the_log_says_the_kernel_was_installed(checks, e2e_pool, name):
    log = e2e_pool.get(name).log_text()
    assert INSTALLED in log and ASKED_BY in log


def test_the_default_server_keeps_sglangs_verify_attention(e2e_pool):
    assert INSTALLED not in e2e_pool.ready(DEFAULT).log_text()


if __name__ == "__main__":
    h.run_module(__file__)
