"""End to end: DETSPEC_EAGLE with its verify attention in the decode kernel's order
(``SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1``, issue 32) still gives one output per seed.

The opt-in replaces the default verify attention kernel in every TARGET_VERIFY forward with the split-KV decode kernel,
one decode row per verified token (integration/sampling/verify_attention.py, the invariant mode's verify). Those
rows depend only on the request's own length, so the probe must give one output under every traffic profile of
``sglang-detspec check``, with CUDA graphs on and off, the same tokens on both, and an accept length inside (1, 4)
(the weighted pair rejects drafts, so rejection sampling runs). Each server's log must say the decode-order verify
was installed at its request. Controls that must fail: built-in EAGLE + rejection sampling under the same uniform
traffic gives several outputs (so the check can see a batch-dependent server), and the default DETSPEC_EAGLE
server's log has no install line (so a line every server printed cannot pass). Its speed is measured by
``bench-serve --configs eagle_rs,detspec,detspec_decode_verify``.
"""

import verify_kernel_opt_in as vk

import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e")

SEED = 1234
TRIALS = 12
DECODE_ORDER = ("detspec_eagle_decode_verify_graph", "detspec_eagle_decode_verify_nograph")
DEFAULT = "detspec_eagle_graph"
CONTROL = "builtin_eagle_rs"
ACCEPT_RANGE = (1.5, 3.5)
INSTALLED = "the verify runs its attention in the decode kernel's order"
ASKED_BY = "asked for by SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1"

pytestmark = h.module_marks(*DECODE_ORDER, DEFAULT, CONTROL)


globals().update(vk.opt_in_tests(DECODE_ORDER, without=DEFAULT, control=CONTROL, installed=INSTALLED, asked_by=ASKED_BY,
                                 accept_range=ACCEPT_RANGE, trials=TRIALS, seed=SEED))


if __name__ == "__main__":
    h.run_module(__file__)
