"""Verify-side coins of the DETSPEC workers are 0.5.23's seeded stream on every version.

DetspecEAGLEWorkerV2 inherits ``verify`` unchanged. Its coins come from
``eagle_utils._verify_coins``, which takes ``_seeded_verify_coins`` whenever the
batch carries ``sampling_info.sampling_seed`` (no algorithm-name gate in 0.5.17
or 0.5.23), and ``SamplingBatchInfo.from_schedule_batch`` sets that tensor for
every batch under ``--enable-deterministic-inference`` (42 for unseeded
requests). These tests pin both facts with the installed SGLang and check that
SGLang's own coin function equals ``sglang_detspec.stream.reference.seeded_verify_coins``
bit for bit.

The last test runs SGLang's whole rejection-sampling verify (``eagle_sample``
with its Triton chain kernel, interpreted; ``sglang_verify_harness``) and checks
each request's outcome depends only on its own seed and length (batched ==
alone == reordered), with the global RNG refused. The DETSPEC verify's row-local
target truncation is tested in test_verify_row_local.py.
"""

from __future__ import annotations

import pytest
import torch

from sglang_detspec.stream import reference

import sglang_verify_harness as harness
from sglang_verify_harness import Params


@pytest.fixture
def sglang_murmur_on_cpu(monkeypatch):
    return harness.sglang_hash_on_cpu(monkeypatch)


CASES = [
    ([0, 1, 42], [0, 1, 17], 4),
    ([-1, -(2**63), 2**63 - 1], [2**31 - 1, 2**32 + 5, 123456789], 1),
    ([987654321987, 5, -42], [4096, 1, 2**40 + 3], 7),
]


@pytest.mark.parametrize("seeds, seq_lens, n", CASES)
def test_sglang_seeded_verify_coins_equal_reference(sglang_murmur_on_cpu, seeds, seq_lens, n):
    from sglang.srt.speculative.eagle_utils import _seeded_verify_coins

    seed_t = torch.tensor(seeds, dtype=torch.int64)
    lens_t = torch.tensor(seq_lens, dtype=torch.int64)
    coins, final = _seeded_verify_coins(
        sampling_seed=seed_t, seq_lens=lens_t, draft_token_num=n, device="cpu"
    )
    ref_coins, ref_final = reference.seeded_verify_coins(seed_t, lens_t, n)
    assert coins.dtype == ref_coins.dtype == torch.float32
    assert torch.equal(coins, ref_coins)
    assert torch.equal(final, ref_final)
    assert bool((coins < 1).all()) and bool((final < 1).all())


@pytest.fixture
def no_global_rng(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("verify coins drew from the global RNG")

    monkeypatch.setattr(torch, "rand", refuse)
    monkeypatch.setattr(torch, "rand_like", refuse)


def test_deterministic_batch_takes_the_seeded_coins(sglang_murmur_on_cpu, no_global_rng):
    from sglang.srt.speculative.eagle_utils import _verify_coins

    n = 4
    params = [Params(7, 0.8, 50), Params(None, 0.8, 50), Params(-9, 0.8, 50)]
    with harness.deterministic_rs(n):
        try:
            si = harness.sampling_info(params, vocab=64)
        except (AttributeError, TypeError) as e:  # pragma: no cover - diagnostic
            pytest.fail(f"from_schedule_batch needs more of ScheduleBatch than faked: {e}")
        # Unseeded requests get 42 (same default as 0.5.23's docs state).
        assert si.sampling_seed.tolist() == [7, 42, -9]
        seq_lens = torch.tensor([10, 20, 30], dtype=torch.int64)
        coins, final = _verify_coins(
            sampling_info=si,
            seq_lens=seq_lens,
            draft_token_num=n,
            candidates=torch.zeros((3, n), dtype=torch.int64),
            device="cpu",
        )
    ref_coins, ref_final = reference.seeded_verify_coins(si.sampling_seed, seq_lens, n)
    assert torch.equal(coins, ref_coins)
    assert torch.equal(final, ref_final)


def test_without_deterministic_mode_batches_carry_no_seed():
    """The other side of the gate: no seed, so upstream would use torch.rand."""
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(enable_deterministic_inference=False):
        si = harness.sampling_info([Params(7, 0.8, 50), Params(None, 0.8, 50)], vocab=64)
    assert si.sampling_seed is None


# ---------------------------------------------------------------------------
# The whole rejection-sampling verify (eagle_sample) on CPU
# ---------------------------------------------------------------------------


@pytest.fixture
def upstream_verify_on_cpu(monkeypatch):
    from sglang.srt.speculative import eagle_utils

    seen = []
    with harness.eagle_sample_on_cpu(monkeypatch):
        real = eagle_utils._seeded_verify_coins

        def spy(**kwargs):
            seen.append(kwargs["seq_lens"].clone())
            return real(**kwargs)

        monkeypatch.setattr(eagle_utils, "_seeded_verify_coins", spy)
        yield eagle_utils.eagle_sample, seen


def _params(seeds, top_ks):
    return [Params(s, 0.0 if k == 1 else 0.9, k) for s, k in zip(seeds, top_ks)]


def test_rejection_verify_is_seeded_and_batch_invariant(upstream_verify_on_cpu, no_global_rng):
    """Each request's verify outcome is a function of its own seed and length only."""
    eagle_sample, seen = upstream_verify_on_cpu
    n = 4
    seeds = [3, -11, 2**45 + 1, 77]
    top_ks = [-1, 1, 5, -1]  # -1: whole vocabulary; 1: greedy request in a sampled batch
    seq_lens = [12, 40, 7, 300]
    rows = harness.verify_rows(4, n)
    with harness.deterministic_rs(n):
        batched = harness.run_eagle_sample(eagle_sample, rows, _params(seeds, top_ks), seq_lens, n)
        # Alone, the greedy request is an all-greedy batch, which SGLang verifies
        # by argmax without coins; the sampled ones alone take the seeded path.
        single = [
            None
            if top_ks[r] == 1
            else harness.run_eagle_sample(eagle_sample, [rows[r]], _params([seeds[r]], [top_ks[r]]), [seq_lens[r]], n)
            for r in range(4)
        ]
        reordered = harness.run_eagle_sample(
            eagle_sample, rows[::-1], _params(seeds[::-1], top_ks[::-1]), seq_lens[::-1], n
        )
        other = harness.run_eagle_sample(eagle_sample, rows, _params([s + 1 for s in seeds], top_ks), seq_lens, n)
    # Seeded coins, keyed by the pre-verify seq_lens.
    assert seen[0].tolist() == seq_lens
    b_pred, b_len = batched
    o_pred, o_len = reordered
    for r in range(4):
        k = b_len[r].item()
        assert 1 <= k <= n
        assert o_len[3 - r].item() == k and torch.equal(o_pred[3 - r, :k], b_pred[r, :k])
        if single[r] is None:
            continue
        s_pred, s_len = single[r]
        assert s_len[0].item() == k
        assert torch.equal(b_pred[r, :k], s_pred[0, :k])
    # The greedy request commits the target argmax at every accepted slot.
    greedy_targets = rows[1].target_logits.argmax(-1)
    assert torch.equal(b_pred[1, : b_len[1].item()], greedy_targets[: b_len[1].item()].to(b_pred.dtype))
    # Not vacuous: seeds matter.
    assert not torch.equal(other[1], b_len) or not torch.equal(other[0], b_pred)
