"""End to end: DETSPEC_EAGLE_INVARIANT with ``SGLANG_DETSPEC_FAST_INVARIANT_DRAFT=1`` (the draft model's GEMMs on
cuBLAS, not batch-invariant; issue 32, item 3) still emits the non-speculative reference's tokens.

The invariant mode's tokens depend only on the target's probabilities and the request's key: the draft only proposes,
so a draft whose numbers move with the batch may change which proposals are accepted, never a token. Measured on the
weighted tiny pair, CUDA graphs on and off:

* a sweep of seeds 1..N (``DETSPEC_INVARIANT_SEEDS``, default 1000), 32 tokens each, 4 prompts in turn, 64 requests
  in flight: every sequence identical to the token-id reference server's (``nonspec_token_id``);
* the draft still proposes acceptable tokens: accept length > 1.5 over the sweep (recorded beside the plain invariant
  server's in docs/results.md);
* each server's log says the draft runs on cuBLAS (so a switch that never engaged cannot pass);
* the control that must fail: DETSPEC_EAGLE's rejection sampling (``detspec_rs_control``) swept the same way matches
  the reference in under half the seeds, so the comparison can tell.

The speed this buys is measured by ``bench-serve --configs detspec_invariant,detspec_invariant_fast_draft``.
"""

import os

import pytest

import e2e_harness as h
import family_harness as fh
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e")

REFERENCE = "nonspec_token_id"
FAST = ("invariant_fast_draft_graph", "invariant_fast_draft_nograph")
CONTROL = "detspec_rs_control"

pytestmark = h.module_marks(REFERENCE, *FAST, CONTROL)

SEEDS = list(range(1, int(os.environ.get("DETSPEC_INVARIANT_SEEDS", "1000")) + 1))
MAX_NEW_TOKENS = 32
PROMPTS = (
    h.PROBE_PROMPT,
    "Speculative decoding lets a small draft model propose several tokens that",
    "Once upon a time, in a small town by the sea, there lived",
    "The recipe for bread begins with",
)
FAST_DRAFT_LINE = "SGLANG_DETSPEC_FAST_INVARIANT_DRAFT=1: the DETSPEC_EAGLE_INVARIANT draft computes its GEMMs with cuBLAS"


@pytest.fixture(scope="module")
def sweeps(e2e_pool):
    servers = {name: e2e_pool.ready(name) for name in (REFERENCE, *FAST, CONTROL)}
    out = {}
    for name, srv in servers.items():
        out[name] = fh.seed_sweep(srv.base_url, SEEDS, PROMPTS, max_new_tokens=MAX_NEW_TOKENS)
    return out


def _ids(responses):
    return [r["output_ids"] for r in responses]


@pytest.mark.parametrize("name", FAST)
def test_fast_draft_sweep_is_identical_to_the_reference(sweeps, name):
    cmp = h.compare_to_reference(_ids(sweeps[REFERENCE]), _ids(sweeps[name]), SEEDS)
    h.record(f"fast_draft_sweep_{name}", cmp)
    assert cmp["identical"] == len(SEEDS), cmp


@pytest.mark.parametrize("name", FAST)
def test_fast_draft_still_proposes_accepted_tokens(sweeps, name):
    accept = h.total_accept_length(sweeps[name])
    h.record(f"fast_draft_accept_{name}", accept)
    assert accept is not None and accept > 1.5, accept


@pytest.mark.parametrize("name", FAST)
def test_the_log_says_the_draft_runs_on_cublas(sweeps, e2e_pool, name):
    assert FAST_DRAFT_LINE in e2e_pool.get(name).log_text(), e2e_pool.get(name).log_tail(40)


def test_control_rejection_sampling_differs_from_the_reference(sweeps):
    cmp = h.compare_to_reference(_ids(sweeps[REFERENCE]), _ids(sweeps[CONTROL]), SEEDS)
    h.record("fast_draft_control_vs_reference", {k: cmp[k] for k in ("n", "identical")})
    assert cmp["identical"] < len(SEEDS) / 2, cmp
    assert len({tuple(x) for x in _ids(sweeps[REFERENCE])}) > len(SEEDS) / 2  # the reference honours the seeds


if __name__ == "__main__":
    h.run_module(__file__)
