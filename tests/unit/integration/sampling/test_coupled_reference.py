"""The coupled race and verify references (coupled_reference.py) against SGLang's own seeded sampler.

SGLang's ``sampling_from_probs_torch`` -> ``multinomial_with_seed`` (run eagerly: ``@torch.compile`` would build a C++
kernel on CPU; CPU Inductor keeps the division, pytorch#157959) on the plugin's token-id keys is the definition the
speculation-invariant mode (issue 18) must reproduce.  Its hash runs on CPU through the test harness (the Triton
kernel interpreted, or sgl-kernel's CPU op where the release has one).  The 20k-row check feeds SGLang's function
the reference's hash where SGLang's own only runs interpreted (~14 ms per row there); the hash itself is compared
with SGLang's on 64k keys and end to end on 96 rows.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from sglang_detspec.integration import compat
from sglang_detspec.stream import reference
from sglang_detspec.stream.coupled_reference import (
    EMIT_PAD,
    coupled_gumbel_reference,
    coupled_race_reference,
    coupled_race_reference_probs,
    coupled_verify_reference,
    position_with_hash,
)

import sglang_verify_harness as harness


def _release_caps_unit_uniform() -> bool:
    # 0.5.17 clamps log(u) from below only; 0.5.18+ also from above (read in the installed sources; the
    # constructed-row test below checks this table against the installed release's function)
    return compat.parse_version(compat.installed_sglang_version()) >= (0, 5, 18)


@pytest.fixture
def sglang_sampler(monkeypatch):
    """(SGLang's sampler module with its seeded path runnable on CPU, whether its own hash is fast there, monkeypatch)."""
    sampler_module, what = harness.sglang_seeded_sampler(monkeypatch)
    murmur = importlib.import_module("sglang.kernels.ops.sampling.murmur_hash").murmur_hash32
    return sampler_module, what == "sglang murmur_hash32" and _routes_cpu_to_sgl_kernel(murmur), monkeypatch


def _routes_cpu_to_sgl_kernel(murmur) -> bool:
    """True where SGLang's hash runs CPU tensors through sgl-kernel's C++ op (0.5.21+), not the Triton kernel
    (interpreted here: ~14 ms per row)."""
    import inspect

    try:
        return "murmur_hash32_cpu" in inspect.getsource(murmur) and hasattr(torch.ops.sgl_kernel, "murmur_hash32_cpu")
    except (OSError, TypeError, RuntimeError, AttributeError):
        return False


def _probs(R, V, seed):
    """Rows of several kinds: dense at three temperatures, top-k truncated (zeros), peaked, flat."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(R, V, generator=g) * 2.0
    kind = torch.arange(R) % 6
    temps = torch.tensor([1.0, 0.3, 3.0, 1.0, 0.05, 1.0])[kind].view(-1, 1)
    logits = logits / temps
    thr = logits.topk(5, -1).values[:, -1:]
    logits = torch.where((kind == 3).view(-1, 1) & (logits < thr), float("-inf"), logits)
    logits = torch.where((kind == 5).view(-1, 1), torch.zeros_like(logits), logits)
    probs = torch.softmax(logits, -1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (R,), generator=g)
    positions = torch.randint(0, 2**40, (R,), generator=g)
    return probs, seeds, positions


def test_reference_hash_is_sglangs_murmur_hash32(sglang_sampler):
    sampler_module, _, _ = sglang_sampler
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (32,), generator=g)
    seeds[:3] = torch.tensor([0, -1, 2**63 - 1])
    positions = torch.randint(0, 2**40, (32,), generator=g)
    cols = torch.arange(2048)
    theirs = sampler_module.murmur_hash32(seeds.to(torch.uint64), positions, cols)
    ours = reference.murmur3_unsalted_hash(seeds, positions, cols)
    assert torch.equal(theirs.to(torch.int64), ours)


def test_race_is_multinomial_with_seed_end_to_end(sglang_sampler):
    """SGLang's own hash and sampler, 96 rows of V = 1100 (two hash programs per row when interpreted)."""
    sampler_module, _, _ = sglang_sampler
    probs, seeds, positions = _probs(96, 1100, seed=1)
    theirs = sampler_module.sampling_from_probs_torch(probs.clone(), sampling_seed=seeds, positions=positions)
    ours = coupled_race_reference_probs(probs, seeds, positions, cap_unit_uniform=_release_caps_unit_uniform())
    assert torch.equal(theirs.to(torch.int64), ours)


def test_race_is_multinomial_with_seed_on_20k_rows(sglang_sampler):
    sampler_module, fast, monkeypatch = sglang_sampler
    if not fast:  # the interpreted kernel: the reference's hash instead (equal to SGLang's: the test above)
        monkeypatch.setattr(
            sampler_module, "murmur_hash32",
            lambda s, p, c: reference.murmur3_unsalted_hash(s.to(torch.int64), p, c).to(torch.uint32),
        )
    probs, seeds, positions = _probs(20_000, 48, seed=2)
    theirs = sampler_module.sampling_from_probs_torch(probs.clone(), sampling_seed=seeds, positions=positions)
    cap = _release_caps_unit_uniform()
    assert torch.equal(theirs.to(torch.int64), coupled_race_reference_probs(probs, seeds, positions, cap_unit_uniform=cap))
    # multinomial_with_seed takes any float dtype (0.5.x's logprob and Ascend paths pass float64)
    logprobs = torch.log(probs[:2000]).double()
    theirs = sampler_module.multinomial_with_seed(logprobs, seeds[:2000], positions[:2000]).view(-1)
    assert torch.equal(theirs, coupled_race_reference(logprobs, seeds[:2000], positions[:2000], cap_unit_uniform=cap))


def test_the_unit_uniform_clamp_is_the_installed_releases(sglang_sampler):
    """Rows where a chosen token's hash is 2**32 - 1 (u = 1) or 0: on a live token, on a zero-probability one.
    The release's variant matches SGLang on every row, the other one does not (the rows tell them apart)."""
    sampler_module, _, _ = sglang_sampler
    V = 64
    cases = [(11, 40, 0xFFFFFFFF, False), (12, 7, 0xFFFFFFFF, True), (-3, 63, 0xFFFFFFFF, True), (13, 5, 0, False)]
    probs = torch.softmax(torch.randn(len(cases), V, generator=torch.Generator().manual_seed(4)), -1)
    seeds = torch.tensor([c[0] for c in cases], dtype=torch.int64)
    positions = torch.tensor([position_with_hash(s, t, h) for s, t, h, _ in cases], dtype=torch.int64)
    hashes = reference.murmur3_unsalted_hash(seeds, positions, torch.arange(V))
    for r, (_, token, h, zero) in enumerate(cases):
        assert int(hashes[r, token]) == h  # the construction, by the forward hash
        if zero:
            probs[r, token] = 0.0
    theirs = sampler_module.sampling_from_probs_torch(probs.clone(), sampling_seed=seeds, positions=positions).to(torch.int64)
    cap = _release_caps_unit_uniform()
    assert torch.equal(theirs, coupled_race_reference_probs(probs, seeds, positions, cap_unit_uniform=cap))
    other = coupled_race_reference_probs(probs, seeds, positions, cap_unit_uniform=not cap)
    assert not torch.equal(theirs, other)
    if not cap:  # 0.5.17: the zero-probability tokens at u = 1 score +inf + -inf = NaN, which argmax picks
        assert theirs[1:3].tolist() == [7, 63]


def test_the_uniform_forms_differ_and_cpu_torch_divides():
    g = torch.Generator().manual_seed(5)
    seeds = torch.randint(-(2**63), 2**63 - 1, (64,), generator=g)
    positions = torch.randint(0, 2**40, (64,), generator=g)
    divide = coupled_gumbel_reference(seeds, positions, 512, uniform="divide")
    recip = coupled_gumbel_reference(seeds, positions, 512, uniform="reciprocal")
    assert torch.equal(coupled_gumbel_reference(seeds, positions, 512), divide)  # CPU torch: a true division
    differ = int((divide != recip).sum())
    assert 0 < differ < divide.numel() // 4  # the last bit of u, for a minority of hashes
    assert float((divide - recip).abs().max()) < 1e-12


def _verify_inputs(B, S, V, seed):
    probs, seeds, _ = _probs(B * (S + 1), V, seed)
    seq_lens = torch.randint(1, 2**31, (B,), generator=torch.Generator().manual_seed(seed))
    positions = (seq_lens - 1).view(-1, 1) + torch.arange(S + 1)  # step j keys seq_len - 1 + j
    return probs.view(B, S + 1, V), seeds[:B], positions


def _first_mismatch(drafts, target):
    out = []
    for d, t in zip(drafts.tolist(), target.tolist()):
        n = 0
        while n < len(d) and d[n] == t[n]:
            n += 1
        out.append(n)
    return out


def test_verify_emits_sglangs_tokens_whatever_the_draft(sglang_sampler):
    sampler_module, fast, monkeypatch = sglang_sampler
    if not fast:
        monkeypatch.setattr(
            sampler_module, "murmur_hash32",
            lambda s, p, c: reference.murmur3_unsalted_hash(s.to(torch.int64), p, c).to(torch.uint32),
        )
    B, S, V = 256, 4, 40
    probs, seeds, positions = _verify_inputs(B, S, V, seed=6)
    # the non-speculative server's token at every verified position: SGLang's sampler, one row per position
    target = sampler_module.sampling_from_probs_torch(
        probs.reshape(-1, V).clone(), sampling_seed=seeds.repeat_interleave(S + 1), positions=positions.reshape(-1)
    ).to(torch.int64).view(B, S + 1)
    g = torch.Generator().manual_seed(7)
    draft_sets = {
        "random": torch.randint(0, V, (B, S), generator=g),
        "target": target[:, :S].clone(),
        "mixed": torch.where(torch.rand(B, S, generator=g) < 0.7, target[:, :S], torch.randint(0, V, (B, S), generator=g)),
    }
    cap = _release_caps_unit_uniform()
    results = {}
    for name, drafts in draft_sets.items():
        accepted, emitted = coupled_verify_reference(probs, drafts, seeds, positions, cap_unit_uniform=cap)
        assert accepted.tolist() == _first_mismatch(drafts, target), name
        for b in range(B):
            n = int(accepted[b])
            assert emitted[b, : n + 1].tolist() == target[b, : n + 1].tolist(), (name, b)
            assert emitted[b, n + 1:].tolist() == [EMIT_PAD] * (S - n), (name, b)
        results[name] = (accepted, emitted)
    assert results["target"][0].tolist() == [S] * B  # every draft accepted, the bonus emitted
    acc_r, acc_m = results["random"][0], results["mixed"][0]
    assert int((acc_r < acc_m).sum()) > B // 2  # two different draft sets: different lengths, ...
    common = torch.minimum(acc_r, acc_m)
    for b in range(B):  # ... the same tokens wherever both emit
        n = int(common[b]) + 1
        assert results["random"][1][b, :n].tolist() == results["mixed"][1][b, :n].tolist()


def test_a_draft_racing_the_same_keys_is_coupled():
    """A draft that races its own probabilities with the target's keys proposes the target's tokens when the two
    distributions agree (every draft accepted); keyed one position off, it does not (the keys are what couples)."""
    B, S, V = 200, 3, 32
    probs, seeds, positions = _verify_inputs(B, S, V, seed=8)
    rows = dict(seeds=seeds.repeat_interleave(S), positions=positions[:, :S].reshape(-1))
    draft_probs = probs[:, :S].reshape(-1, V)
    coupled = coupled_race_reference_probs(draft_probs, rows["seeds"], rows["positions"]).view(B, S)
    shifted = coupled_race_reference_probs(draft_probs, rows["seeds"], rows["positions"] + 1).view(B, S)
    assert coupled_verify_reference(probs, coupled, seeds, positions)[0].tolist() == [S] * B
    assert coupled_verify_reference(probs, shifted, seeds, positions)[0].float().mean() < S / 2


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(target_probs=torch.zeros(2, 4)), r"\[batch, draft_len \+ 1, vocab\]"),
        (dict(draft_tokens=torch.zeros(2, 2, dtype=torch.int64)), r"\[2, 3\]"),
        (dict(positions=torch.zeros(2, 3, dtype=torch.int64)), "seq_len - 1 \\+ j"),
        (dict(seeds=torch.zeros(3, dtype=torch.int64)), r"seeds must be \[batch\]"),
    ],
)
def test_verify_inputs_are_checked(bad, match):
    args = dict(target_probs=torch.full((2, 4, 8), 0.125), draft_tokens=torch.zeros(2, 3, dtype=torch.int64),
                seeds=torch.zeros(2, dtype=torch.int64), positions=torch.zeros(2, 4, dtype=torch.int64))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        coupled_verify_reference(**args)
