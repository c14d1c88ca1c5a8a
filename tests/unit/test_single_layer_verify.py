"""Verify-side coins of the DETSPEC workers are 0.5.23's seeded stream on every version.

DetspecEAGLEWorkerV2 inherits ``verify`` unchanged. Its coins come from
``eagle_utils._verify_coins``, which takes ``_seeded_verify_coins`` whenever the
batch carries ``sampling_info.sampling_seed`` (no algorithm-name gate in 0.5.17
or 0.5.23), and ``SamplingBatchInfo.from_schedule_batch`` sets that tensor for
every batch under ``--enable-deterministic-inference`` (42 for unseeded
requests). These tests pin both facts with the installed SGLang and check that
SGLang's own coin function equals ``sglang_detspec.reference.seeded_verify_coins``
bit for bit.

SGLang's hash on CPU: 0.5.17's ``murmur_hash32`` is a Triton kernel (runs under
the interpreter); 0.5.23 routes CPU tensors to an ``sgl_kernel`` op that does not
load without a GPU, so there the same Triton kernel from SGLang's own module is
launched directly.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.runtime_context import get_context

from sglang_detspec import reference


@pytest.fixture
def sglang_murmur_on_cpu(monkeypatch):
    mh = importlib.import_module("sglang.kernels.ops.sampling.murmur_hash")
    probe = (torch.zeros(1, dtype=torch.int64).to(torch.uint64),) * 2 + (
        torch.zeros(1, dtype=torch.int64),
    )
    try:
        mh.murmur_hash32(*probe)
        return "sglang murmur_hash32"
    except (ImportError, OSError, RuntimeError, AttributeError):
        pass

    def triton_on_cpu(seed, positions, col_indices):
        # The launch SGLang does for device tensors, on CPU via TRITON_INTERPRET.
        import triton

        n, m = seed.shape[0], col_indices.shape[0]
        out = torch.empty((n, m), dtype=torch.uint32)
        mh.murmur_hash32_kernel[(n, triton.cdiv(m, 1024))](
            seed, positions, col_indices, out, n, m, BLOCK_SIZE=1024
        )
        return out

    monkeypatch.setattr(mh, "murmur_hash32", triton_on_cpu)
    return "sglang murmur_hash32_kernel"


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


def _schedule_batch(seeds):
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for s in seeds:
        params = SamplingParams(temperature=0.8, top_k=50, sampling_seed=s)
        params.normalize(None)
        params.verify(vocab_size=64)
        reqs.append(
            SimpleNamespace(
                sampling_params=params,
                custom_logit_processor=None,
                return_sampling_mask=False,
                sampling_logprobs_mode=None,
                from_str=None,
            )
        )
    batch = _FakeScheduleBatch()  # a class, not SimpleNamespace: penalizers keep a weakref
    batch.reqs = reqs
    batch.device = "cpu"
    return batch


class _FakeScheduleBatch:
    pass


@pytest.fixture
def no_global_rng(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("verify coins drew from the global RNG")

    monkeypatch.setattr(torch, "rand", refuse)
    monkeypatch.setattr(torch, "rand_like", refuse)


def test_deterministic_batch_takes_the_seeded_coins(sglang_murmur_on_cpu, no_global_rng):
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.eagle_utils import _verify_coins

    n = 4
    with get_context().override_server_args(
        enable_deterministic_inference=True,
        speculative_use_rejection_sampling=True,
        speculative_eagle_topk=1,
        speculative_num_steps=n - 1,
        speculative_num_draft_tokens=n,
    ):
        try:
            si = SamplingBatchInfo.from_schedule_batch(_schedule_batch([7, None, -9]), vocab_size=64)
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
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    with get_context().override_server_args(enable_deterministic_inference=False):
        si = SamplingBatchInfo.from_schedule_batch(_schedule_batch([7, None]), vocab_size=64)
    assert si.sampling_seed is None
