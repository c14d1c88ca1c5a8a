"""The DETSPEC target sampler (integration/sampling/target_sampler.py) on SGLang's real ``Sampler._sample_from_probs``.

Upstream, once any row of a seeded batch has top-k, top-p or min-p (a greedy neighbour counts), every row is sampled
by ``top_k_top_p_min_p_sampling_from_probs_torch``, which hashes the Gumbel noise by *rank*: a temperature-only
request draws a different token than it would beside temperature-only neighbours. DETSPEC keys every row by token
id. Checked with SGLang's own functions (its ``multinomial_with_seed`` run eagerly, its hash on CPU): a plain row
draws its simple-path token whatever its neighbours (upstream: mostly not -- the control); each row's truncation
holds; min-p with a seed works (upstream asserts); the class swap is refused for foreign samplers.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_detspec.integration.sampling import target_sampler

import sglang_verify_harness as harness
from sglang_verify_harness import Params

VOCAB = harness.VOCAB


@pytest.fixture
def sampler_on_cpu(monkeypatch):
    """A real ``Sampler`` instance (built without its TP-group constructor) and SGLang's seeded path on CPU."""
    import importlib

    from sglang.srt.layers import sampler as sampler_module
    from sglang.srt.runtime_context import get_context

    harness.sglang_hash_on_cpu(monkeypatch)
    murmur = importlib.import_module("sglang.kernels.ops.sampling.murmur_hash").murmur_hash32
    monkeypatch.setattr(sampler_module, "murmur_hash32", murmur, raising=False)  # imported by name there
    compiled = sampler_module.multinomial_with_seed
    # torch.compile would build a C++ kernel on CPU; the eager function is the same code.
    monkeypatch.setattr(sampler_module, "multinomial_with_seed", getattr(compiled, "_torchdynamo_orig_callable", compiled))
    target_sampler._detspec_sample_from_probs.cache_clear()
    sampler = harness.bare_sampler()
    with get_context().override_server_args(enable_deterministic_inference=True, sampling_backend="pytorch"):
        yield sampler
    target_sampler._detspec_sample_from_probs.cache_clear()


def _probs(count, seed=0, sharp=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(count, VOCAB, generator=g) * sharp, -1)


def _sample(sampler, probs, params, positions):
    info = harness.sampling_info(params)
    simple = not (info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling)
    result = sampler._sample_from_probs(probs.clone(), info, torch.tensor(positions, dtype=torch.int64), simple)
    token_ids = result[0] if isinstance(result, tuple) else result  # 0.5.20+ also return a mask capture
    return token_ids.tolist()


NEIGHBOURS = [Params(seed=3, top_k=5), Params(seed=4, temperature=0.0), Params(seed=5, top_p=0.9)]


def test_a_plain_row_draws_its_simple_path_token_beside_any_neighbour(sampler_on_cpu):
    from sglang.srt.layers.sampler import Sampler

    trials = 24
    upstream_changed = 0
    target_sampler.install_detspec_sampler(types.SimpleNamespace(sampler=sampler_on_cpu))
    for t in range(trials):
        probs = _probs(1 + len(NEIGHBOURS), seed=t)
        probe = Params(seed=1000 + t)
        alone = _sample(sampler_on_cpu, probs[:1], [probe], [t])
        mixed = _sample(sampler_on_cpu, probs, [probe, *NEIGHBOURS], [t, 1, 2, 3])
        assert mixed[0] == alone[0], f"trial {t}"
        upstream_mixed = Sampler._sample_from_probs(
            sampler_on_cpu, probs.clone(), harness.sampling_info([probe, *NEIGHBOURS]),
            torch.tensor([t, 1, 2, 3]), False,
        )
        upstream_mixed = upstream_mixed[0] if isinstance(upstream_mixed, tuple) else upstream_mixed
        upstream_changed += int(upstream_mixed[0]) != alone[0]
    # Control: upstream's rank-keyed path changes the plain row's token in most trials.
    assert upstream_changed > trials // 2


def test_each_row_keeps_its_own_truncation_and_min_p_with_a_seed_works(sampler_on_cpu):
    from sglang.srt.layers.sampler import Sampler

    target_sampler.install_detspec_sampler(types.SimpleNamespace(sampler=sampler_on_cpu))
    params = [Params(seed=s, top_k=3) if s % 2 else Params(seed=s, min_p=0.5) for s in range(16)]
    probs = _probs(16, seed=7, sharp=0.8)
    tokens = _sample(sampler_on_cpu, probs, params, list(range(16)))
    for r, token in enumerate(tokens):
        if params[r].min_p:
            assert probs[r, token] >= 0.5 * probs[r].max()
        else:
            assert token in probs[r].topk(3).indices.tolist()
    with pytest.raises(AssertionError, match="multinomial_with_seed"):  # the control: upstream asserts
        Sampler._sample_from_probs(
            sampler_on_cpu, probs.clone(), harness.sampling_info(params), torch.arange(16), False
        )


def test_mask_capture_form_is_consistent(sampler_on_cpu):
    from sglang.srt.layers.sampler import sampling_from_probs_torch, top_k_top_p_min_p_sampling_from_probs_torch

    probs = _probs(3, seed=2)
    info = harness.sampling_info([Params(seed=1, top_k=4), Params(seed=2), Params(seed=3, top_p=0.5)])
    positions = torch.tensor([4, 5, 6])
    args = (probs, info.top_ks, info.top_ps, info.min_ps, False, info.sampling_seed, positions)
    token_ids, kept, permutation, selected = target_sampler.sample_by_token_id(
        top_k_top_p_min_p_sampling_from_probs_torch, *args, return_filtered_probs=True
    )
    assert torch.equal(token_ids, target_sampler.sample_by_token_id(top_k_top_p_min_p_sampling_from_probs_torch, *args))
    assert torch.equal(permutation[0], torch.arange(VOCAB, dtype=torch.int32))
    assert torch.equal(selected, kept.gather(1, token_ids.long().view(-1, 1)).view(-1))
    assert int((kept[0] > 0).sum()) == 4
    # The untruncated row is sampled exactly as SGLang's simple path samples it.
    assert int(token_ids[1]) == int(sampling_from_probs_torch(probs[1:2], info.sampling_seed[1:2], positions[1:2])[0])


def test_install_swaps_the_class_once_and_refuses_a_foreign_sampler(sampler_on_cpu):
    runner = types.SimpleNamespace(sampler=sampler_on_cpu)
    target_sampler.install_detspec_sampler(runner)
    assert isinstance(runner.sampler, target_sampler.detspec_sampler_class())
    assert runner.sampler is sampler_on_cpu  # same instance: every reference to it sees the DETSPEC sampler
    target_sampler.install_detspec_sampler(runner)  # idempotent

    class CustomSampler(torch.nn.Module):
        pass

    with pytest.raises(RuntimeError, match="custom sampler backend"):
        target_sampler.install_detspec_sampler(types.SimpleNamespace(sampler=CustomSampler()))
