"""Verify-side coins of the DETSPEC workers are 0.5.23's seeded stream on every version.

DetspecEAGLEWorkerV2 inherits ``verify`` unchanged. Its coins come from
``eagle_utils._verify_coins``, which takes ``_seeded_verify_coins`` whenever the
batch carries ``sampling_info.sampling_seed`` (no algorithm-name gate in 0.5.17
or 0.5.23), and ``SamplingBatchInfo.from_schedule_batch`` sets that tensor for
every batch under ``--enable-deterministic-inference`` (42 for unseeded
requests). These tests pin both facts with the installed SGLang and check that
SGLang's own coin function equals ``sglang_detspec.reference.seeded_verify_coins``
bit for bit.

The last test runs SGLang's whole rejection-sampling verify (``eagle_sample``
with its Triton chain kernel, interpreted) and checks each request's outcome
depends only on its own seed and length (batched == alone == reordered), with
the global RNG refused.

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


# ---------------------------------------------------------------------------
# The whole rejection-sampling verify (eagle_sample) on CPU
# ---------------------------------------------------------------------------


def _top_k_renorm_torch(probs, top_ks):
    """Torch stand-in for the sgl_kernel op (first-index tie order)."""
    out = torch.zeros_like(probs)
    for r in range(probs.shape[0]):
        k = min(int(top_ks[r]), probs.shape[1])
        vals, idx = probs[r].topk(k)
        out[r, idx] = vals / vals.sum()
    return out


@pytest.fixture
def eagle_sample_on_cpu(monkeypatch, sglang_murmur_on_cpu):
    """Take the GPU branch of eagle_sample on CPU: the chain rejection kernel is
    Triton (interpreted here); only the sgl_kernel renorm ops and the TP group
    are stood in for."""
    import sys

    from sglang.srt.speculative import eagle_utils

    monkeypatch.setattr(eagle_utils, "_is_cpu", False)
    fake_sgl_kernel = SimpleNamespace(
        top_k_renorm_prob=_top_k_renorm_torch,
        top_p_renorm_prob=lambda p, top_ps: p,
        tree_speculative_sampling_target_only=None,
    )
    monkeypatch.setitem(sys.modules, "sgl_kernel", fake_sgl_kernel)  # 0.5.17 imports it in the branch
    if hasattr(eagle_utils, "top_k_renorm_prob"):  # 0.5.23 imports it at module level
        monkeypatch.setattr(eagle_utils, "top_k_renorm_prob", _top_k_renorm_torch)
    import sglang.srt.distributed as dist

    monkeypatch.setattr(dist, "get_tp_group", lambda: SimpleNamespace(world_size=1), raising=False)
    from sglang.srt.runtime_context import get_parallel

    # 0.5.23 reads the TP group from the runtime context (0.5.17 from the
    # distributed module, patched above); a single rank broadcasts nothing.
    with get_parallel().override(tp_group=SimpleNamespace(world_size=1)):
        yield from _spy_seeded_coins(monkeypatch, eagle_utils)


def _spy_seeded_coins(monkeypatch, eagle_utils):
    seen = []
    real = eagle_utils._seeded_verify_coins

    def spy(**kwargs):
        seen.append(kwargs["seq_lens"].clone())
        return real(**kwargs)

    monkeypatch.setattr(eagle_utils, "_seeded_verify_coins", spy)
    yield seen


def _verify_inputs(rows, n, vocab=32):
    g = torch.Generator().manual_seed(1)
    data = []
    for r in range(rows):
        target_logits = torch.randn(n, vocab, generator=g) * 2
        q = torch.softmax(torch.randn(n, vocab, generator=g), dim=-1)
        draft = torch.multinomial(q, 1, generator=g).view(-1)
        draft[0] = 0  # the root/bonus slot
        data.append((target_logits, q, draft))
    return data


def _run_eagle_sample(rows, seeds, top_ks, seq_lens, n):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_utils import eagle_sample

    bs = len(rows)
    si = _sampling_info_from_params(seeds, top_ks)
    verify_input = SimpleNamespace(
        draft_token=torch.cat([d for _, _, d in rows]),
        draft_token_num=n,
        retrieve_index=torch.arange(bs * n, dtype=torch.int64).view(bs, n),
        retrieve_next_token=torch.tensor([list(range(1, n)) + [-1]] * bs, dtype=torch.int64),
        retrieve_next_sibling=torch.full((bs, n), -1, dtype=torch.int64),
        max_tree_depth=n,
        tree_topk=1,
        draft_probs=torch.stack([q for _, q, _ in rows]),
        custom_mask=None,
        positions=None,
    )
    batch = SimpleNamespace(
        device="cpu",
        forward_mode=ForwardMode.DECODE,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        sampling_info=si,
        return_logprob=False,
        req_pool_indices=torch.arange(bs),
    )
    logits = SimpleNamespace(next_token_logits=torch.cat([t for t, _, _ in rows]).clone())
    predict, accept_lens, accept_index = eagle_sample(verify_input, batch, logits)
    return predict.view(bs, n), accept_lens, accept_index


def _sampling_info_from_params(seeds, top_ks):
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.sampling.sampling_params import SamplingParams

    batch = _schedule_batch(seeds)
    for req, k in zip(batch.reqs, top_ks):
        params = SamplingParams(temperature=0.9 if k != 1 else 0.0, top_k=k, sampling_seed=req.sampling_params.sampling_seed)
        params.normalize(None)
        params.verify(vocab_size=32)
        req.sampling_params = params
    return SamplingBatchInfo.from_schedule_batch(batch, vocab_size=32)


def test_rejection_verify_is_seeded_and_batch_invariant(eagle_sample_on_cpu, no_global_rng):
    """Each request's verify outcome is a function of its own seed and length only."""
    n = 4
    seeds = [3, -11, 2**45 + 1, 77]
    top_ks = [-1, 1, 5, -1]  # -1: whole vocabulary; 1: greedy request in a sampled batch
    seq_lens = [12, 40, 7, 300]
    rows = _verify_inputs(4, n)
    with get_context().override_server_args(
        enable_deterministic_inference=True,
        speculative_use_rejection_sampling=True,
        speculative_eagle_topk=1,
        speculative_num_steps=n - 1,
        speculative_num_draft_tokens=n,
    ):
        batched = _run_eagle_sample(rows, seeds, top_ks, seq_lens, n)
        # Alone, the greedy request is an all-greedy batch, which SGLang verifies
        # by argmax without coins; the sampled ones alone take the seeded path.
        single = [
            None
            if top_ks[r] == 1
            else _run_eagle_sample([rows[r]], [seeds[r]], [top_ks[r]], [seq_lens[r]], n)
            for r in range(4)
        ]
        reordered = _run_eagle_sample(rows[::-1], seeds[::-1], top_ks[::-1], seq_lens[::-1], n)
    # Seeded coins, keyed by the pre-verify seq_lens.
    assert eagle_sample_on_cpu[0].tolist() == seq_lens
    b_pred, b_len, _ = batched
    o_pred, o_len, _ = reordered
    for r in range(4):
        k = b_len[r].item()
        assert 1 <= k <= n
        assert o_len[3 - r].item() == k and torch.equal(o_pred[3 - r, :k], b_pred[r, :k])
        if single[r] is None:
            continue
        s_pred, s_len, _ = single[r]
        assert s_len[0].item() == k
        assert torch.equal(b_pred[r, :k], s_pred[0, :k])
    # The greedy request commits the target argmax at every accepted slot.
    greedy_targets = rows[1][0].argmax(-1)
    assert torch.equal(b_pred[1, : b_len[1].item()], greedy_targets[: b_len[1].item()].to(b_pred.dtype))
    # Not vacuous: seeds matter.
    other = _run_eagle_sample_seeds(rows, [s + 1 for s in seeds], top_ks, seq_lens, n)
    assert not torch.equal(other[1], b_len) or not torch.equal(other[0], b_pred)


def _run_eagle_sample_seeds(rows, seeds, top_ks, seq_lens, n):
    with get_context().override_server_args(
        enable_deterministic_inference=True,
        speculative_use_rejection_sampling=True,
        speculative_eagle_topk=1,
        speculative_num_steps=n - 1,
        speculative_num_draft_tokens=n,
    ):
        return _run_eagle_sample(rows, seeds, top_ks, seq_lens, n)
