"""The reduced-draft chain verify kernel equals the installed SGLang release's own ``chain_speculative_sampling_triton``
bit for bit on the scattered q (0.5.17 - 0.5.23 differ only where q is not a probability, which no case here
builds): its arithmetic is upstream's, and its only change is reading q through the map. Both Triton kernels run
under TRITON_INTERPRET=1 (tests/conftest.py)."""

import pytest
import torch

from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton

from sglang_detspec.kernels.hot_chain_verify import hot_chain_speculative_sampling
from sglang_detspec.stream.hot_vocab import scatter_to_target

from hot_chain_cases import DEV, chain_case, run_chain


@pytest.mark.parametrize("B,S,Vd,Vt,seed", [(6, 3, 80, 300, 3), (4, 2, 100, 4200, 4)])  # 4200: two CDF tiles
def test_kernel_equals_sglang_chain_kernel_on_the_scattered_q(B, S, Vd, Vt, seed):
    hv, q, target, cand, coins, final = chain_case(B, S, Vd, Vt, seed)
    cand[1, 1] = hv.hot_to_target[0]  # keep every proposal hot: 0.5.17 and 0.5.23 differ on q = 0 proposals

    def upstream(**kw):
        chain_speculative_sampling_triton(retrive_next_token=None, retrive_next_sibling=None, threshold_single=1.0,
                                          threshold_acc=1.0, deterministic=True, **kw)

    got = run_chain(hot_chain_speculative_sampling, B, S, cand, coins, final, target, q,
                    target_to_draft=hv.target_to_draft.to(DEV))
    want = run_chain(upstream, B, S, cand, coins, final, target, scatter_to_target(q, hv.hot_to_target, Vt))
    for g, w in zip(got[2], want[2]):
        assert torch.equal(g, w)
