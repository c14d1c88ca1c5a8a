"""The split-KV verify attention kernel (kernels/split_kv_verify_attention.py) vs its float64 reference over a grid of
shapes, and its batch invariance: a request's rows are the same bits alone, in any batch, with any grid.

On CPU the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py), at small head dims. torch and Triton only:
never imports SGLang (tests/unit/integration/sampling/test_split_kv_verify_vs_upstream.py compares it with SGLang's
own deterministic extend kernel).
"""

import pytest
import torch

from sglang_detspec.kernels.split_kv_verify_attention import (
    max_splits_for,
    split_kv_verify_attention,
    split_kv_verify_attention_reference,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


class Batch:
    """A verify batch: per request a prefix of ``prefix_len`` keys and ``q_len`` query tokens whose keys follow it,
    in a shared cache with the slots scattered (as a radix cache leaves them)."""

    def __init__(self, prefix_lens, q_lens, kv_heads=2, group=2, dim=32, dtype=torch.float16, seed=0, slots=None):
        g = torch.Generator().manual_seed(seed)
        total_keys = sum(p + n for p, n in zip(prefix_lens, q_lens))
        slots = slots or total_keys + 37
        self.k = (torch.randn(slots, kv_heads, dim, generator=g)).to(dtype).to(DEV)
        self.v = (torch.randn(slots, kv_heads, dim, generator=g)).to(dtype).to(DEV)
        self.q = (torch.randn(sum(q_lens), kv_heads * group, dim, generator=g) * 1.5).to(dtype).to(DEV)
        order = torch.randperm(slots, generator=g)[:total_keys]
        self.kv_indices = order.to(torch.int64).to(DEV)
        self.prefix_lens = torch.tensor(prefix_lens, dtype=torch.int32, device=DEV)
        self.qo_indptr = _indptr(q_lens)
        self.kv_indptr = _indptr([p + n for p, n in zip(prefix_lens, q_lens)])
        self.max_q_len = max(q_lens)
        self.max_kv = max(p + n for p, n in zip(prefix_lens, q_lens))
        self.sm_scale = dim ** -0.5

    def request(self, b):
        """Request ``b`` alone, reading the same cache."""
        one = Batch.__new__(Batch)
        one.k, one.v, one.sm_scale, one.max_q_len = self.k, self.v, self.sm_scale, self.max_q_len
        q0, q1 = int(self.qo_indptr[b]), int(self.qo_indptr[b + 1])
        k0, k1 = int(self.kv_indptr[b]), int(self.kv_indptr[b + 1])
        one.q = self.q[q0:q1]
        one.kv_indices = self.kv_indices[k0:k1]
        one.prefix_lens = self.prefix_lens[b:b + 1]
        one.qo_indptr = _indptr([q1 - q0])
        one.kv_indptr = _indptr([k1 - k0])
        one.max_kv = k1 - k0
        return one

    def run(self, split, max_splits=None, logit_cap=0.0, extra_splits=0):
        max_splits = (max_splits or max_splits_for(self.max_kv, split)) + extra_splits
        tokens, heads, dv = self.q.shape[0], self.q.shape[1], self.v.shape[2]
        o = torch.full((tokens, heads, dv), float("nan"), dtype=self.q.dtype, device=DEV)
        part_o = torch.full((tokens, heads, max_splits, dv), float("nan"), dtype=torch.float32, device=DEV)
        part_lse = torch.full((tokens, heads, max_splits), float("nan"), dtype=torch.float32, device=DEV)
        return split_kv_verify_attention(
            self.q, o, self.k, self.v, self.qo_indptr, self.kv_indptr, self.kv_indices, self.prefix_lens,
            max_q_len=self.max_q_len, split=split, max_splits=max_splits, partial_out=part_o, partial_lse=part_lse,
            sm_scale=self.sm_scale, logit_cap=logit_cap,
        )

    def reference(self, logit_cap=0.0):
        return split_kv_verify_attention_reference(
            self.q, self.k, self.v, self.qo_indptr, self.kv_indptr, self.kv_indices, self.prefix_lens,
            sm_scale=self.sm_scale, logit_cap=logit_cap)


def _indptr(lengths):
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return out.to(DEV)


def _close(got, want, dtype):
    tol = 4 * torch.finfo(dtype).eps
    torch.testing.assert_close(got.double().cpu(), want.cpu(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "prefix_lens,q_lens,kv_heads,group,split",
    [
        ([5], [4], 2, 2, 16),  # one tile
        ([40], [4], 2, 2, 16),  # drafts straddle a tile boundary (keys 40..43 in tile 2)
        ([47], [4], 1, 4, 16),  # draft 0 ends a tile; drafts 1..3 open a tile that row 0 sees nothing of
        ([0, 13, 64], [1, 3, 2], 2, 1, 32),  # no prefix; a plain decode row; MHA
        ([70, 9], [4, 4], 2, 8, 64),  # 32 query rows per KV head: one row block of 32
        ([130], [5], 1, 16, 64),  # 80 rows per KV head: three row blocks of 32
        ([200, 3, 77], [3, 3, 3], 2, 2, 128),  # tiles wider than BLOCK_N
    ],
)
def test_matches_reference(dtype, prefix_lens, q_lens, kv_heads, group, split):
    batch = Batch(prefix_lens, q_lens, kv_heads=kv_heads, group=group, dtype=dtype, seed=sum(prefix_lens) + split)
    _close(batch.run(split), batch.reference(), dtype)


def test_logit_cap_matches_reference():
    batch = Batch([50, 7], [4, 4], seed=3)
    batch.q = batch.q * 8  # logits well past the cap
    _close(batch.run(16, logit_cap=5.0), batch.reference(logit_cap=5.0), torch.float16)


def test_head_dim_not_a_power_of_two():
    batch = Batch([33], [3], dim=24, seed=5)
    _close(batch.run(16), batch.reference(), torch.float16)


@pytest.mark.parametrize("split", [16, 64])
def test_a_request_gives_the_same_bits_alone_and_in_any_batch(split):
    batch = Batch([90, 3, 150, 41], [4, 4, 4, 4], kv_heads=2, group=4, seed=11)
    together = batch.run(split)
    for b in range(4):
        one = batch.request(b)
        q0, q1 = int(batch.qo_indptr[b]), int(batch.qo_indptr[b + 1])
        assert torch.equal(one.run(split).cpu(), together[q0:q1].cpu()), f"request {b} alone != in the batch"
        # a larger grid (as a CUDA graph sized for the longest context launches) only adds empty programs
        assert torch.equal(one.run(split, extra_splits=5).cpu(), together[q0:q1].cpu())


def test_shorter_chains_beside_longer_ones_keep_their_bits():
    """A request's rows do not depend on the batch's longest chain (``max_q_len``) as long as the launch is the same:
    the server keeps ``max_q_len`` fixed (the draft token count)."""
    batch = Batch([60, 60], [2, 4], seed=13)
    together = batch.run(32)
    one = batch.request(0)
    one.max_q_len = batch.max_q_len
    assert torch.equal(one.run(32).cpu(), together[:2].cpu())


def test_a_padded_request_with_no_keys_gets_zeros_and_leaves_the_others_alone():
    """A CUDA graph pads its batch with requests that may have no keys at all: their rows must be zeros, not NaN
    (0 / 0), and the real request's rows are its bits alone."""
    batch = Batch([40, 0], [3, 3], seed=19)
    batch.kv_indptr = _indptr([43, 0])
    together = batch.run(16)
    assert torch.equal(together[3:].cpu(), torch.zeros_like(together[3:]).cpu())
    one = batch.request(0)
    assert torch.equal(one.run(16).cpu(), together[:3].cpu())


def test_draft_rows_see_only_earlier_drafts():
    """Control for the causal mask: changing draft 3's key and value leaves rows 0..2 as they were, and row 3 not."""
    batch = Batch([20], [4], seed=17)
    before = batch.run(16).clone()
    last_slot = batch.kv_indices[-1]
    batch.k[last_slot] += 3
    batch.v[last_slot] -= 3
    after = batch.run(16)
    assert torch.equal(before[:3].cpu(), after[:3].cpu())
    assert not torch.equal(before[3].cpu(), after[3].cpu())


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda kw: kw.update(partial_out=kw["partial_out"][:, :, :1]), "partial_out must be float32"),
        (lambda kw: kw.update(partial_lse=kw["partial_lse"].double()), "partial_lse must be float32"),
        (lambda kw: kw.update(split=48), "split must be <= 32 or a multiple of 32"),
        (lambda kw: kw.update(q=kw["q"][:, :3], o=kw["o"][:, :3]), "q_heads"),
        (lambda kw: kw.update(kv_indptr=kw["kv_indptr"].float()), "kv_indptr must be a dense 1-D"),
        (lambda kw: kw.update(max_q_len=0), "max_q_len"),
        (lambda kw: kw.update(k_buffer=kw["k_buffer"].float()), "a quantised KV cache is not supported"),
    ],
)
def test_refuses_malformed_launches(change, message):
    batch = Batch([40], [4], seed=19)
    kw = dict(q=batch.q, o=torch.empty_like(batch.q), k_buffer=batch.k, v_buffer=batch.v, qo_indptr=batch.qo_indptr,
              kv_indptr=batch.kv_indptr, kv_indices=batch.kv_indices, prefix_lens=batch.prefix_lens, max_q_len=4,
              split=16, max_splits=3, partial_out=torch.empty(4, 4, 3, 32, device=DEV), partial_lse=torch.empty(4, 4, 3, device=DEV),
              sm_scale=0.1)
    if change is not None:
        change(kw)
    with pytest.raises(ValueError, match=message):
        split_kv_verify_attention(**kw)
