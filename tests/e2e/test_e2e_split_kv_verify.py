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

import verify_kernel_opt_in as vk

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


globals().update(vk.opt_in_tests(SPLIT_KV, default=DEFAULT, control=CONTROL, installed=INSTALLED, asked_by=ASKED_BY,
                                 accept_range=ACCEPT_RANGE, trials=TRIALS, seed=SEED))


if __name__ == "__main__":
    h.run_module(__file__)
