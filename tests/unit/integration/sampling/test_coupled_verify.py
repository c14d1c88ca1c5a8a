"""The speculation-invariant scheme (issue 18) end to end on CPU: every token it emits is SGLang's own.

Under ``scheme.COUPLED`` the rebound upstream ``eagle_sample`` (``integration/sampling/verify.py``) hands the verify to
``coupled_chain_verify`` instead of the rejection chain kernel, and ``seeded_draft_proposal`` proposes by
``coupled_draft_proposal``.  The expected tokens here come from SGLang's non-speculative sampler, never from the code
under test: ``sglang.srt.layers.sampler.sampling_from_probs_torch`` (-> ``multinomial_with_seed``, run eagerly as in
test_coupled_reference.py: ``@torch.compile`` would build a C++ kernel on CPU and CPU Inductor keeps the division),
with SGLang's own murmur hash (the harness runs it on CPU).

Why those arguments: a non-speculative decode step runs ``Sampler.forward`` on ``logits.div_(temperatures)`` then
``torch.softmax`` (``_sample_from_probs`` -> ``sampling_from_probs_torch(probs, sampling_seed, positions)``, read in
the installed 0.5.17 and 0.5.23 ``layers/sampler.py``) with ``positions = forward_batch.positions``, which for a
decode batch is ``clamp_position(seq_lens) = seq_lens - 1``: the position of the step's *input* token
(``model_executor/forward_batch_info.py``).  The verify's row ``j`` reads ``candidates[:, j]``, whose position is
``seq_lens + j`` (``build_tree_kernel_efficient``: "prompt length 7 -> positions [7, 8, 8, 9]"; spec v2's
``batch.seq_lens`` is the length before this step's tokens), so a non-speculative server draws the token after row
``j``'s input with the key ``(seed, seq_lens + j)``.

Truncated rows: the plugin's non-speculative sampler (target_sampler.py) zeroes a row's tokens outside its own top-k /
top-p / min-p set and races the rest by token id, not renormalised.  The kept set is computed here independently,
mirroring SGLang's ``top_k_top_p_min_p_sampling_from_probs_torch`` rule: sort descending (ties by the lower index),
keep rank < top_k, keep an exclusive prefix mass <= top_p (float32 cumsum, as SGLang), keep p >= p_max * min_p.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from sglang_detspec.integration import compat
from sglang_detspec.integration.sampling import coupled_verify, scheme, verify
from sglang_detspec.integration.sampling.proposal import seeded_draft_proposal
from sglang_detspec.stream.coupled_reference import position_with_hash

import sglang_verify_harness as harness
from sglang_verify_harness import Params, VerifyRow

S = 3  # drafts per request
N = S + 1  # verified rows per request
V = 1000


@pytest.fixture
def sglang_cpu(monkeypatch):
    """SGLang's sampler module with its seeded path runnable on CPU, inside the harness's CPU ``eagle_sample``."""
    with harness.eagle_sample_on_cpu(monkeypatch) as renorm_calls:
        verify._rebound_eagle_sample.cache_clear()  # rebuilt on the patched eagle_utils
        from sglang.srt.layers import sampler as sampler_module

        murmur = importlib.import_module("sglang.kernels.ops.sampling.murmur_hash").murmur_hash32
        monkeypatch.setattr(sampler_module, "murmur_hash32", murmur, raising=False)  # imported by name there
        compiled = sampler_module.multinomial_with_seed
        monkeypatch.setattr(
            sampler_module, "multinomial_with_seed", getattr(compiled, "_torchdynamo_orig_callable", compiled)
        )
        yield sampler_module, renorm_calls
    verify._rebound_eagle_sample.cache_clear()


def _sglang_draw(sampler_module, probs, seeds, positions):
    """SGLang's non-speculative seeded draw of every row of ``probs`` ``[R, V]`` (int64 ``[R]``)."""
    return sampler_module.sampling_from_probs_torch(
        probs.clone(), sampling_seed=seeds.to(torch.int64), positions=positions.to(torch.int64)
    ).to(torch.int64)


def _effective(p: Params):
    """(temperature, top_k) as SGLang normalises them: temperature 0 means greedy, i.e. temperature 1, top_k 1."""
    return (1.0, 1) if p.temperature == 0.0 else (p.temperature, p.top_k)


def _probs(logits: torch.Tensor, p: Params) -> torch.Tensor:
    """``softmax(logits / T)`` in float32: the Sampler's ``div_`` by the float32 temperature, then its softmax."""
    return torch.softmax(logits / torch.tensor(_effective(p)[0], dtype=torch.float32), dim=-1)


def _sglang_kept(probs: torch.Tensor, p: Params) -> torch.Tensor:
    """``probs`` ``[R, V]`` with the tokens outside the row's top-k / top-p / min-p set zeroed (module docstring)."""
    _, top_k = _effective(p)
    vals, idx = probs.sort(dim=-1, descending=True, stable=True)  # stable: equal values keep the lower index first
    rank = torch.arange(probs.shape[-1]).view(1, -1)
    keep = (rank < (top_k if top_k > 0 else probs.shape[-1])) \
        & ((vals.cumsum(dim=-1) - vals) <= torch.tensor(p.top_p, dtype=torch.float32)) \
        & (vals >= vals[:, :1] * torch.tensor(p.min_p, dtype=torch.float32))
    kept = torch.zeros_like(keep).scatter_(1, idx, keep)
    return torch.where(kept, probs, torch.zeros_like(probs))


def _expected_tokens(sampler_module, logits, params, seq_lens):
    """``[B, N]``: the token a non-speculative server emits after each verified row's input (module docstring)."""
    out = []
    for b, p in enumerate(params):
        probs = _probs(logits[b], p)
        if _effective(p)[1] == 1:
            out.append(probs.argmax(dim=-1))  # greedy: the first maximum of softmax(logits)
            continue
        truncated = _effective(p)[1] > 0 or p.top_p < 1.0 or p.min_p > 0.0
        seeds = torch.full((N,), p.seed, dtype=torch.int64)
        positions = seq_lens[b] + torch.arange(N, dtype=torch.int64)
        out.append(_sglang_draw(sampler_module, _sglang_kept(probs, p) if truncated else probs, seeds, positions))
    return torch.stack(out)


def _plant(expected: torch.Tensor, accept: list, generator) -> torch.Tensor:
    """``[B, N]`` candidates: the root, then ``accept[b]`` of the expected tokens, then a wrong one, then noise."""
    bs = expected.shape[0]
    cand = torch.randint(0, V, (bs, N), generator=generator)
    for b, a in enumerate(accept):
        cand[b, 1: a + 1] = expected[b, :a]
        if a < S:
            cand[b, a + 1] = (expected[b, a] + 1 + torch.randint(0, V - 1, (), generator=generator)) % V
    return cand


def _rows(logits: torch.Tensor, candidates: torch.Tensor, generator):
    # draft_probs must exist with the target's vocabulary (upstream checks it); the coupled verify never reads it
    return [
        VerifyRow(logits[b], torch.softmax(torch.randn(N, V, generator=generator), -1), candidates[b])
        for b in range(logits.shape[0])
    ]


def _verify(params, rows, seq_lens):
    with scheme.selected(scheme.COUPLED), harness.deterministic_rs(N):
        return harness.run_eagle_sample_with_index(verify.detspec_eagle_sample, rows, params, seq_lens.tolist(), N)


def _check_outputs(result, expected, accept):
    """Accept lengths, committed tokens and the chain kernel's output layout (module docstring of coupled_verify)."""
    predict, accept_lens, accept_index = result
    flat = predict.reshape(-1)
    assert (accept_lens - 1).tolist() == accept  # eagle_sample returns the accepted drafts + 1
    for b, a in enumerate(accept):
        taken = accept_index[b, : a + 1].to(torch.int64)
        assert taken.tolist() == [b * N + j for j in range(a + 1)], b  # retrieve_index of the accepted rows
        assert accept_index[b, a + 1:].tolist() == [-1] * (S - a), b
        assert flat[taken].tolist() == expected[b, : a + 1].tolist(), b  # the accepted drafts, then the correction
        assert predict[b, a + 1:].tolist() == [0] * (S - a), b  # un-emitted slots stay 0, as the chain kernel leaves them


def test_temperature_only_verify_emits_sglangs_tokens(sglang_cpu):
    sampler_module, renorm_calls = sglang_cpu
    g = torch.Generator().manual_seed(18)
    temperatures = [1.0, 0.7, 1.3, 0.45, 2.0]
    seeds = [3, -(2**63), 2**63 - 1, 987654321987, -42]
    params = [Params(seed=s, temperature=t) for s, t in zip(seeds, temperatures)]
    seq_lens = torch.tensor([7, 130, 4095, 65539, 2**31 - 10], dtype=torch.int64)
    logits = torch.randn(len(params), N, V, generator=g) * 2.0
    expected = _expected_tokens(sampler_module, logits, params, seq_lens)
    accept = [0, 1, 2, 3, 2]
    result = _verify(params, _rows(logits, _plant(expected, accept, g), g), seq_lens)
    _check_outputs(result, expected, accept)
    assert renorm_calls.names == []

    # The same inputs through the rejection scheme (SGLang's chain kernel): the same output types and shapes.
    with harness.deterministic_rs(N):
        chain = harness.run_eagle_sample_with_index(
            verify.detspec_eagle_sample, _rows(logits, _plant(expected, accept, g), g), params, seq_lens.tolist(), N
        )
    for ours, theirs in zip(result, chain):
        assert (ours.dtype, tuple(ours.shape)) == (theirs.dtype, tuple(theirs.shape))


MIXED = [
    Params(seed=11, temperature=0.8),  # temperature only
    Params(seed=12, top_p=0.9),
    Params(seed=13, top_k=1, temperature=0.7),  # greedy
    Params(seed=14, temperature=0.0),  # greedy
    Params(seed=15, top_k=20),
    Params(seed=16, min_p=0.05, temperature=1.2),
    Params(seed=17, temperature=1.3, top_p=0.5),
    Params(seed=18, temperature=1.6),  # temperature only
    Params(seed=19, top_k=50, top_p=0.8, min_p=0.02),
]


def test_mixed_truncation_verify_emits_sglangs_tokens(sglang_cpu):
    sampler_module, renorm_calls = sglang_cpu
    g = torch.Generator().manual_seed(19)
    seq_lens = torch.tensor([5 + 37 * b for b in range(len(MIXED))], dtype=torch.int64)
    logits = torch.randn(len(MIXED), N, V, generator=g) * 2.0
    expected = _expected_tokens(sampler_module, logits, MIXED, seq_lens)
    accept = [b % N for b in range(len(MIXED))][::-1]
    candidates = _plant(expected, accept, g)
    rows = _rows(logits, candidates, g)
    _check_outputs(_verify(MIXED, rows, seq_lens), expected, accept)
    assert renorm_calls.names == []

    # Not vacuous: racing the untruncated probabilities gives other tokens on some truncated rows.
    truncated = [b for b, p in enumerate(MIXED) if p.top_p < 1 or p.min_p > 0 or _effective(p)[1] > 1]
    plain = torch.stack([
        _sglang_draw(sampler_module, _probs(logits[b], MIXED[b]), torch.full((N,), MIXED[b].seed),
                     seq_lens[b] + torch.arange(N))
        for b in truncated
    ])
    assert int((plain != expected[truncated]).sum()) >= 4

    # Neighbour independence: the temperature-only requests alone (no top-k / top-p / min-p in the batch at all).
    alone = [b for b, p in enumerate(MIXED) if p.top_p == 1 and p.min_p == 0 and _effective(p)[1] < 0]
    result = _verify([MIXED[b] for b in alone], [rows[b] for b in alone], seq_lens[alone])
    _check_outputs(result, expected[alone], [accept[b] for b in alone])


def test_coupled_proposal_is_sglangs_draw_and_rejection_is_not(sglang_cpu):
    sampler_module, _ = sglang_cpu
    B = 16
    g = torch.Generator().manual_seed(20)
    probs = torch.softmax(torch.randn(B, V, generator=g) * 2.0, dim=-1)
    seeds = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
    positions = torch.randint(0, 2**31, (B,), generator=g)
    top_ks = torch.full((B,), 1 << 30, dtype=torch.int32)
    top_ks[[2, 9]] = 1  # greedy requests
    greedy = top_ks <= 1
    theirs = torch.where(greedy, probs.argmax(dim=1), _sglang_draw(sampler_module, probs, seeds, positions))

    with scheme.selected(scheme.COUPLED):
        topk_p, index = seeded_draft_proposal(probs, seeds, positions, 0, top_ks=top_ks)
        _, later_step = seeded_draft_proposal(probs, seeds, positions, 2, top_ks=top_ks)
        half_p, half_index = seeded_draft_proposal(probs.bfloat16(), seeds, positions, 0, top_ks=top_ks)
    assert index.shape == (B, 1) and index.dtype == torch.int64
    assert index.view(-1).tolist() == theirs.tolist()
    assert torch.equal(topk_p, probs.gather(1, index))
    assert torch.equal(later_step, index)  # the target's key has no draft step
    up = probs.bfloat16().float()  # what the race reads of a bfloat16 q: the exact up-cast
    half_theirs = torch.where(greedy, up.argmax(dim=1), _sglang_draw(sampler_module, up, seeds, positions))
    assert half_index.view(-1).tolist() == half_theirs.tolist()
    assert torch.equal(half_p, probs.bfloat16().gather(1, half_index))

    # Control: the default (rejection) scheme draws from the DETSPEC draft stream, another stream.
    assert scheme.current() == scheme.REJECTION
    rej_p, rej_index = seeded_draft_proposal(probs, seeds, positions, 0, top_ks=top_ks)
    assert torch.equal(rej_p, probs.gather(1, rej_index))
    assert rej_index.view(-1)[greedy].tolist() == theirs[greedy].tolist()
    assert int((rej_index.view(-1)[~greedy] != theirs[~greedy]).sum()) > (B - 2) * 3 // 4


def test_a_key_position_error_is_detected(sglang_cpu, monkeypatch):
    """Keyed at ``seq_lens + 1 + j`` the target's tokens are not SGLang's: the checks above can see that error."""
    sampler_module, _ = sglang_cpu
    g = torch.Generator().manual_seed(21)
    params = [Params(seed=100 + b, temperature=0.6 + 0.2 * b) for b in range(5)]
    seq_lens = torch.tensor([9, 300, 1, 77777, 4096], dtype=torch.int64)
    logits = torch.randn(len(params), N, V, generator=g) * 2.0
    expected = _expected_tokens(sampler_module, logits, params, seq_lens)
    with harness.deterministic_rs(N):
        info = harness.sampling_info(params, V)
    target_probs = torch.stack([_probs(logits[b], p) for b, p in enumerate(params)])

    right = coupled_verify.coupled_target_tokens(info, target_probs, coupled_verify.target_race_positions(seq_lens, N))
    shifted = coupled_verify.coupled_target_tokens(
        info, target_probs, coupled_verify.target_race_positions(seq_lens + 1, N)
    )
    assert torch.equal(right, expected)
    assert int((shifted != expected).sum()) > expected.numel() * 3 // 4

    # The same error inside the verify: the planted drafts are no longer accepted as test 1 expects.
    monkeypatch.setattr(
        coupled_verify, "target_race_positions", lambda lens, rows: (lens + 1).view(-1, 1) + torch.arange(rows)
    )
    accept = [S] * len(params)
    _, accept_lens, _ = _verify(params, _rows(logits, _plant(expected, accept, g), g), seq_lens)
    assert int((accept_lens - 1 == S).sum()) <= 1  # SGLang's chains, all accepted when keyed right, mostly cut


def test_unit_uniform_cap_flag_matches_sglangs_sampler(sglang_cpu):
    """A zero-probability token whose hash is 2**32 - 1 (u = 1): without the upper clamp of log(u) its Gumbel noise
    is +inf and +inf + log(0) = NaN wins SGLang's argmax; with the clamp it can never win."""
    sampler_module, _ = sglang_cpu
    murmur = sampler_module.murmur_hash32
    vocab = 64
    cases = [(12, 7), (-3, 63), (2**40 + 1, 0)]  # (seed, token)
    probs = torch.softmax(torch.randn(len(cases), vocab, generator=torch.Generator().manual_seed(22)), -1)
    seeds = torch.tensor([s for s, _ in cases], dtype=torch.int64)
    positions = torch.tensor([position_with_hash(s, t, 2**32 - 1) for s, t in cases], dtype=torch.int64)
    for r, (_, token) in enumerate(cases):
        hashed = murmur(seeds[r: r + 1].to(torch.uint64), positions[r: r + 1], torch.arange(vocab))
        assert int(hashed.to(torch.int64)[0, token]) == 2**32 - 1  # the construction, by SGLang's own hash
        probs[r, token] = 0.0
    drawn = _sglang_draw(sampler_module, probs, seeds, positions).tolist()
    dead = [t for _, t in cases]
    wins = [d == t for d, t in zip(drawn, dead)]
    assert wins in ([True] * len(cases), [False] * len(cases)), drawn  # every row tells the same story
    assert compat.seeded_race_caps_unit_uniform() is (not wins[0])
