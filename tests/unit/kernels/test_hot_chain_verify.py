"""The reduced-draft chain verify kernel vs its CPU twin (the Triton kernel under TRITON_INTERPRET=1, tests/conftest.py).
Its bit-identity with SGLang's own chain kernel is tests/unit/integration/sampling/test_hot_chain_vs_upstream.py,
which runs on every release."""

import pytest
import torch

from sglang_detspec.kernels.hot_chain_verify import hot_chain_speculative_sampling
from sglang_detspec.stream.hot_chain_verify import hot_chain_verify_reference

from hot_chain_cases import DEV, chain_case, run_chain


@pytest.mark.parametrize("B,S,Vd,Vt,seed", [(6, 3, 80, 300, 0), (5, 1, 40, 5000, 1), (4, 2, 300, 300, 2)])
def test_kernel_equals_reference(B, S, Vd, Vt, seed):
    hv, q, target, cand, coins, final = chain_case(B, S, Vd, Vt, seed)
    acc, emitted, _ = run_chain(hot_chain_speculative_sampling, B, S, cand, coins, final, target, q,
                                target_to_draft=hv.target_to_draft.to(DEV))
    want_acc, want_emitted = hot_chain_verify_reference(cand, coins, final, target, q, hv.target_to_draft)
    assert torch.equal(acc, want_acc)
    assert torch.equal(emitted, want_emitted)
    if Vd < Vt:
        assert acc[1] == 0  # the off-hot proposal
    assert 0 < acc.sum() < B * S  # both branches ran


def test_refuses_full_width_draft_probs_with_a_map():
    hv, q, target, cand, coins, final = chain_case(2, 1, 10, 50, 5)
    with pytest.raises(ValueError, match="target_to_draft must be int32"):
        run_chain(hot_chain_speculative_sampling, 2, 1, cand, coins, final, target, q,
                  target_to_draft=hv.hot_to_target.to(DEV))
