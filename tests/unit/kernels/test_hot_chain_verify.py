"""The reduced-draft chain verify kernel vs its CPU twin, and vs SGLang's own chain kernel on the scattered q.

CPU: both Triton kernels run under TRITON_INTERPRET=1 (tests/conftest.py).  SGLang's
``chain_speculative_sampling_triton`` is the installed release's own (0.5.17 and 0.5.23 differ only where q is
not a probability, which no case here builds), so the bit-for-bit comparison pins this kernel's arithmetic to
upstream's and its only change to the map.
"""

import pytest
import torch

from sglang_detspec.kernels.hot_chain_verify import hot_chain_speculative_sampling
from sglang_detspec.stream.hot_chain_verify import EMIT_PAD, hot_chain_verify_reference
from sglang_detspec.stream.hot_vocab import HotVocab, scatter_to_target

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def chain_case(B, S, Vd, Vt, seed):
    """A chain verify with a reduced draft whose proposals are often accepted: the target mixes the draft's q with
    noise; drafts are hot tokens (row 1 also proposes one off the hot set, which must be rejected, and the last row's
    first draft has p = 0)."""
    g = torch.Generator().manual_seed(seed)
    hv = HotVocab.from_hot_token_id(torch.randperm(Vt, generator=g)[:Vd], Vt)
    q = torch.softmax(torch.randn(B, S, Vd, generator=g) * 2.0, -1)
    noise = torch.softmax(torch.randn(B, S + 1, Vt, generator=g), -1)
    target = noise.clone()
    target[:, :S] = 0.7 * scatter_to_target(q, hv.hot_to_target, Vt) + 0.3 * noise[:, :S]
    drafts = hv.hot_to_target[torch.multinomial(q.view(B * S, Vd), 1, generator=g).view(B, S)]
    off_hot = (hv.target_to_draft < 0).nonzero().flatten()
    if off_hot.numel():  # (a map onto the whole vocabulary has no such token)
        drafts[1, 0] = off_hot[0]
    candidates = torch.cat([torch.randint(0, Vt, (B, 1), generator=g), drafts], dim=1)
    target[-1, 0, drafts[-1, 0]] = 0.0  # the last row's first draft is rejected: the residual path always runs
    coins = torch.rand(B, S, generator=g)
    final = torch.rand(B, generator=g)
    return hv, q, target, candidates, coins, final


def run_chain(fn, B, S, candidates, coins, final, target, draft, **extra):
    """Call a chain kernel with SGLang's buffers; returns ``(accept_len, emitted, raw outputs)``."""
    n = S + 1
    predicts = torch.zeros(B * n, dtype=torch.int32, device=DEV)
    accept_index = torch.full((B, n), -1, dtype=torch.int32, device=DEV)
    accept_num = torch.zeros(B, dtype=torch.int32, device=DEV)
    retrive = torch.arange(B * n, dtype=torch.int64, device=DEV).view(B, n)
    fn(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates.to(DEV),
       retrive_index=retrive, uniform_samples=coins.to(DEV), uniform_samples_for_final_sampling=final.to(DEV),
       target_probs=target.to(DEV), draft_probs=draft.to(DEV), **extra)
    acc = accept_num.cpu().to(torch.int64)
    emitted = torch.full((B, n), EMIT_PAD, dtype=torch.int64)
    for b in range(B):
        emitted[b, : acc[b] + 1] = predicts.cpu().view(B, n)[b, : acc[b] + 1].to(torch.int64)
    return acc, emitted, (predicts.cpu(), accept_index.cpu(), accept_num.cpu())


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


@pytest.mark.parametrize("B,S,Vd,Vt,seed", [(6, 3, 80, 300, 3), (4, 2, 100, 4200, 4)])  # 4200: two CDF tiles
def test_kernel_equals_sglang_chain_kernel_on_the_scattered_q(B, S, Vd, Vt, seed):
    from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton

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


def test_refuses_full_width_draft_probs_with_a_map():
    hv, q, target, cand, coins, final = chain_case(2, 1, 10, 50, 5)
    with pytest.raises(ValueError, match="target_to_draft must be int32"):
        run_chain(hot_chain_speculative_sampling, 2, 1, cand, coins, final, target, q,
                  target_to_draft=hv.hot_to_target.to(DEV))
