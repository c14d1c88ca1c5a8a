"""Chain-verify cases with a reduced-vocabulary draft, shared by the kernel's parity test (tests/unit/kernels) and its
bit-identity test against the installed SGLang's own chain kernel (tests/unit/integration/sampling, every release).
torch only."""

import torch

from sglang_detspec.stream.hot_chain_verify import EMIT_PAD
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
