"""End to end: DETSPEC_EAGLE with its verify attention in the plugin's split-KV verify kernel (issue 32; the default
where the kernel can serve the model, ``SGLANG_DETSPEC_SPLIT_KV_VERIFY=1`` to insist, ``=0`` for SGLang's kernel)
still gives one output per seed.

The kernel replaces SGLang's one-stage extend kernel in every TARGET_VERIFY forward with
kernels/split_kv_verify_attention.py (fixed 256-key tiles merged in order; integration/sampling/split_kv_verify.py).
A request's rows depend only on its own keys, so the probe must give one output under every traffic profile of
``sglang-detspec check`` on the ``=1`` servers, with CUDA graphs on and off, the same tokens on both, and an accept
length inside (1, 4) (the weighted pair rejects drafts, so rejection sampling runs). Each ``=1`` server's log must say
the kernel was installed at its request; the default server's that it was installed by default, and its probe must
give the ``=1`` servers' tokens (the same kernel). Controls that must fail: built-in EAGLE + rejection sampling under
the same uniform traffic gives several outputs (so the check can see a batch-dependent server), and the ``=0``
server's log has no install line but names SGLang's kernel (so a line every server printed cannot pass). Its speed:
``bench-serve --configs eagle_rs,detspec,detspec_one_stage_verify`` and scripts/bench/bench_verify_attention.py.
"""

import verify_kernel_opt_in as vk

import e2e_checks as ec
import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e")

SEED = 1234
TRIALS = 12
SPLIT_KV = ("detspec_eagle_split_kv_verify_graph", "detspec_eagle_split_kv_verify_nograph")
DEFAULT = "detspec_eagle_graph"
ONE_STAGE = "detspec_eagle_one_stage_verify"
CONTROL = "builtin_eagle_rs"
ACCEPT_RANGE = (1.5, 3.5)
INSTALLED = "the verify runs its attention in the split-KV verify kernel"
ASKED_BY = "asked for by SGLANG_DETSPEC_SPLIT_KV_VERIFY=1"
BY_DEFAULT = "the default; SGLANG_DETSPEC_SPLIT_KV_VERIFY=0 turns it off"
NOT_INSTALLED = "the verify runs its attention in SGLang's one-stage extend kernel (SGLANG_DETSPEC_SPLIT_KV_VERIFY=0)"

pytestmark = h.module_marks(*SPLIT_KV, DEFAULT, ONE_STAGE, CONTROL)


globals().update(vk.opt_in_tests(SPLIT_KV, without=ONE_STAGE, control=CONTROL, installed=INSTALLED,
                                 asked_by=ASKED_BY, accept_range=ACCEPT_RANGE, trials=TRIALS, seed=SEED))


def test_the_one_stage_server_names_sglangs_kernel(e2e_pool):
    assert NOT_INSTALLED in e2e_pool.ready(ONE_STAGE).log_text()


def test_the_default_server_runs_the_kernel(checks, e2e_pool):
    """Installed by default, said in the log, and the probe's tokens are the ``=1`` servers' (uniform traffic)."""
    default = e2e_pool.ready(DEFAULT)
    log = default.log_text()
    assert INSTALLED in log and BY_DEFAULT in log and ASKED_BY not in log
    r = ec.run_checks({DEFAULT: default}, {DEFAULT: "uniform"}, trials=4, seed=SEED)[DEFAULT]
    assert r["returncode"] == 0, r["stdout"] + r["stderr"]
    forced = checks[SPLIT_KV[0]]["report"]["trials"][0]["output_ids"]
    assert r["report"]["trials"][0]["output_ids"] == forced


if __name__ == "__main__":
    h.run_module(__file__)
