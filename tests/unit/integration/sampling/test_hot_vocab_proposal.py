"""Reduced-vocabulary drafts at the proposal entry point, under both schemes, and in the coupled verify.

The rejection scheme: ``seeded_draft_proposal(..., hot_vocab=)`` proposes the draft index of the token the
full-vocabulary proposal of the scattered q proposes.  The coupled scheme (``DETSPEC_*_INVARIANT``) needs only that
proposal, keyed by target id: ``coupled_chain_verify`` reads the candidates (target ids) and the target's
probabilities, never ``draft_probs``, so a reduced draft emits exactly the full draft's tokens and acceptance.
"""

import importlib
import types

import pytest
import torch

from sglang_detspec.integration import compat
from sglang_detspec.integration.sampling import scheme
from sglang_detspec.integration.sampling.coupled_verify import coupled_chain_verify
from sglang_detspec.integration.sampling.proposal import seeded_draft_proposal
from sglang_detspec.stream.coupled_reference import coupled_hot_race_reference, coupled_race_reference
from sglang_detspec.stream.hot_vocab import HotVocab, scatter_to_target

B, VD, VT = 96, 40, 150


def _case(seed):
    g = torch.Generator().manual_seed(seed)
    hv = HotVocab.from_hot_token_id(torch.randperm(VT, generator=g)[:VD], VT)
    q = torch.softmax(torch.randn(B, VD, generator=g) * 2.0, -1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
    pos = torch.randint(0, 2**31, (B,), generator=g)
    top_ks = torch.where(torch.arange(B) % 5 == 0, 1, 50)  # every fifth request greedy
    return hv, q, seeds, pos, top_ks


@pytest.mark.parametrize("which", [scheme.REJECTION, scheme.COUPLED])
def test_reduced_proposal_is_the_full_proposal_of_the_scattered_q(which):
    hv, q, seeds, pos, top_ks = _case(1)
    full_q = scatter_to_target(q, hv.hot_to_target, VT)
    with scheme.selected(which):
        p_hot, idx_hot = seeded_draft_proposal(q, seeds, pos, 2, top_ks, hot_vocab=hv)
        p_full, idx_full = seeded_draft_proposal(full_q, seeds, pos, 2, top_ks)
    assert idx_hot.shape == (B, 1) and idx_hot.max() < VD
    assert torch.equal(hv.hot_to_target[idx_hot], idx_full)  # the draft index of the same target token
    assert torch.equal(p_hot, p_full)
    assert torch.equal(q.gather(1, idx_hot), p_hot)


def test_the_coupled_race_keys_hot_tokens_by_target_id():
    """Control for the test above: racing the reduced log q with its column indices' noise is another race."""
    hv, q, seeds, pos, _ = _case(2)
    cap = compat.seeded_race_caps_unit_uniform()
    by_target = coupled_hot_race_reference(torch.log(q), seeds, pos, hv.hot_to_target, cap_unit_uniform=cap)
    full = coupled_race_reference(torch.log(scatter_to_target(q, hv.hot_to_target, VT)), seeds, pos,
                                  cap_unit_uniform=cap)
    by_column = hv.hot_to_target[coupled_race_reference(torch.log(q), seeds, pos, cap_unit_uniform=cap)]
    assert torch.equal(by_target, full)
    assert (by_column != full).float().mean() > 0.3


def _chain_outputs(target_probs, candidates, draft_probs, seeds, seq_lens):
    bs, n, _ = target_probs.shape
    out = dict(
        predicts=torch.zeros(bs * n, dtype=torch.int32),
        accept_index=torch.full((bs, n), -1, dtype=torch.int32),
        accept_token_num=torch.zeros(bs, dtype=torch.int32),
    )
    info = types.SimpleNamespace(sampling_seed=seeds, need_top_k_sampling=False, need_top_p_sampling=False,
                                 need_min_p_sampling=False)
    coupled_chain_verify(info, seq_lens, candidates=candidates, retrive_index=torch.arange(bs * n).view(bs, n),
                         target_probs=target_probs, draft_probs=draft_probs, **out)
    return out


def test_coupled_verify_needs_nothing_but_the_target_id_proposal():
    """A reduced draft's chain (proposals from its own q, keyed like the verify's rows) through the invariant verify:
    the same outputs as the full draft of the scattered q, though draft_probs has only the hot columns; every
    emitted token is the target's own race token."""
    S, bs = 3, 24
    g = torch.Generator().manual_seed(3)
    hv = HotVocab.from_hot_token_id(torch.randperm(VT, generator=g)[:VD], VT)
    q = torch.softmax(torch.randn(bs, S, VD, generator=g) * 2.0, -1)
    q_full = scatter_to_target(q, hv.hot_to_target, VT)
    target = torch.cat([0.9 * q_full + 0.1 / VT, torch.full((bs, 1, VT), 1.0 / VT)], dim=1)  # close: many accepts
    seeds = torch.randint(-(2**63), 2**63 - 1, (bs,), generator=g)
    seq_lens = torch.randint(10, 1000, (bs,), generator=g)
    keys = dict(sampling_seed=seeds.repeat_interleave(S), positions=(seq_lens.view(-1, 1) + torch.arange(S)).reshape(-1))
    with scheme.selected(scheme.COUPLED):
        _, idx = seeded_draft_proposal(q.reshape(bs * S, VD), keys["sampling_seed"], keys["positions"], 0,
                                       hot_vocab=hv)
        _, idx_full = seeded_draft_proposal(q_full.reshape(bs * S, VT), keys["sampling_seed"], keys["positions"], 0)
    drafts = hv.hot_to_target[idx.view(bs, S)]
    assert torch.equal(drafts, idx_full.view(bs, S))
    root = torch.randint(0, VT, (bs, 1), generator=g)
    reduced = _chain_outputs(target, torch.cat([root, drafts], 1), q, seeds, seq_lens)
    full = _chain_outputs(target, torch.cat([root, idx_full.view(bs, S)], 1), q_full, seeds, seq_lens)
    for name in reduced:
        assert torch.equal(reduced[name], full[name]), name
    accepted = reduced["accept_token_num"].to(torch.int64)
    assert accepted.float().mean() > 1.0
    cap = compat.seeded_race_caps_unit_uniform()
    race = coupled_race_reference(torch.log(target.reshape(-1, VT)), seeds.repeat_interleave(S + 1),
                                  (seq_lens.view(-1, 1) + torch.arange(S + 1)).reshape(-1),
                                  cap_unit_uniform=cap).view(bs, S + 1)
    emitted = reduced["predicts"].view(bs, S + 1).to(torch.int64)
    for b in range(bs):
        n = int(accepted[b]) + 1
        assert emitted[b, :n].tolist() == race[b, :n].tolist()


class _MarkedCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA, so that the proposal takes its GPU branch; the Triton kernel then runs
    under the interpreter (tests/conftest.py), which accepts CPU tensors."""

    is_cuda = True


def test_the_coupled_reduced_race_runs_the_triton_kernel_on_cuda_tensors(monkeypatch):
    """The GPU branch calls kernels/coupled_hot_race_probs.py (spied, not replaced) and proposes what the CPU branch
    (the twin) does; greedy rows take the lowest target id among tied maxima, or among NaNs."""
    kernel_module = importlib.import_module("sglang_detspec.kernels.coupled_hot_race_probs")
    calls = []
    real = kernel_module.coupled_hot_race_probs

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(kernel_module, "coupled_hot_race_probs", spy)
    hv, q, seeds, pos, top_ks = _case(4)
    q[0] = 1.0 / VD  # greedy row, every column tied
    a, b = 3, 30
    q[5, a], q[5, b] = float("nan"), float("nan")  # greedy row, two NaNs
    with scheme.selected(scheme.COUPLED):
        p_gpu, idx_gpu = seeded_draft_proposal(q.as_subclass(_MarkedCuda), seeds, pos, 0, top_ks, hot_vocab=hv)
        assert calls == [(B, VD)]
        p_cpu, idx_cpu = seeded_draft_proposal(q, seeds, pos, 0, top_ks, hot_vocab=hv)
    assert len(calls) == 1  # the CPU branch runs the twin
    idx_gpu = idx_gpu.as_subclass(torch.Tensor)
    assert torch.equal(idx_gpu, idx_cpu)
    assert torch.equal(p_gpu.as_subclass(torch.Tensor).nan_to_num(), p_cpu.nan_to_num())
    hot = hv.hot_to_target
    assert int(hot[idx_gpu[0, 0]]) == int(hot.min()) and int(idx_gpu[0, 0]) != 0
    assert int(hot[idx_gpu[5, 0]]) == min(int(hot[a]), int(hot[b]))
