"""End to end: DETSPEC_EAGLE with the draft's extend of each verified chain in the plugin's split-KV verify kernel
(``SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1``, issue 32; opt-in until this module has passed on a GPU) still gives one
output per seed, on a single-layer EAGLE draft and on a multi-layer (MTP) draft.

After every verify the draft re-reads the verified chain (DRAFT_EXTEND_V2: 4 rows per request, causal over its prefix);
under deterministic inference SGLang runs that in its one-stage extend kernel, and the opt-in runs it in
kernels/split_kv_verify_attention.py instead (integration/sampling/split_kv_verify.py, the verify's wrapper on the
draft's backends). The draft's numbers decide the next drafts, so its rows must not depend on the batch: the probe must
give one output under every traffic profile of ``sglang-detspec check``, with CUDA graphs on and off, the same tokens
on both, an accept length inside (1, 4), and each log must say the kernel was installed at the opt-in's request (the
MTP server on all 3 of its layers' backends). Controls that must fail: built-in EAGLE + rejection sampling under the
same uniform traffic gives several outputs, and the default DETSPEC_EAGLE server's log has no install line but names
SGLang's kernel for the draft extend. Its speed:
``bench-serve --configs eagle_rs,detspec,detspec_split_kv_draft_extend``.
"""

import pytest
import verify_kernel_opt_in as vk

import e2e_checks as ec
import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=360, suite="detspec-e2e")

SEED = 1234
TRIALS = 12
DRAFT_EXTEND = ("detspec_eagle_split_kv_draft_extend_graph", "detspec_eagle_split_kv_draft_extend_nograph")
MTP = "detspec_mtp_split_kv_draft_extend_graph"
DEFAULT = "detspec_eagle_graph"
CONTROL = "builtin_eagle_rs"
ACCEPT_RANGE = (1.5, 3.5)
INSTALLED = "the draft extend runs its attention in the split-KV verify kernel"
ASKED_BY = "asked for by SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1"
NOT_INSTALLED = ("the draft extend runs its attention in SGLang's one-stage extend kernel (the default; "
                 "SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1 runs it in the split-KV verify kernel)")
#: The MTP draft of the multi-layer pair has one layer per draft step (3), each with its own draft-extend backend.
MTP_INSTALLED = f"{INSTALLED} on 3 Triton backend(s)"

pytestmark = h.module_marks(*DRAFT_EXTEND, MTP, DEFAULT, CONTROL)


globals().update(vk.opt_in_tests(DRAFT_EXTEND, without=DEFAULT, control=CONTROL, installed=INSTALLED,
                                 asked_by=ASKED_BY, accept_range=ACCEPT_RANGE, trials=TRIALS, seed=SEED))


def test_the_default_server_names_sglangs_kernel_for_the_draft_extend(e2e_pool):
    assert NOT_INSTALLED in e2e_pool.ready(DEFAULT).log_text()


@pytest.fixture(scope="module")
def mtp_check(e2e_pool):
    return ec.run_checks({MTP: e2e_pool.ready(MTP)}, {MTP: "all"}, trials=TRIALS, seed=SEED)[MTP]


def test_the_mtp_draft_runs_the_kernel_on_every_layer_and_gives_one_output(mtp_check, e2e_pool):
    log = e2e_pool.get(MTP).log_text()
    assert MTP_INSTALLED in log and ASKED_BY in log, e2e_pool.get(MTP).log_tail(60)
    assert mtp_check["returncode"] == 0, mtp_check["stdout"] + mtp_check["stderr"]
    ec.assert_one_output_per_profile(mtp_check, min_trials=6, profiles=ec.ALL_PROFILES)


if __name__ == "__main__":
    h.run_module(__file__)
