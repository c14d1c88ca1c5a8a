"""SGLang 0.5.23's seeded draft sampler, re-implemented op for op: the GPU parity oracle of the fused kernel.

``upstream_seeded_fast_sample`` is ``spec_utils.fast_sample(probs, 1, sampling_seed=, positions=, draft_step=)``
step by step: a Triton MurmurHash3 kernel writing ``[B, V]`` uint32 (a copy of upstream's ``murmur_hash32``:
one program per (row, 1024 columns), 64-bit rotates), then ``.to(float64).add_(0.5).div_(2**32).log_().neg_()
.reciprocal_().mul_(probs)`` and ``argmax``.  SGLang is not needed, so the GPU checks and the benchmark run
wherever torch and Triton do; the key layout is :mod:`sglang_detspec.stream.keys`.  A different computation from
both twins it checks: :mod:`sglang_detspec.stream.reference` (int64 tensors, CPU) and the fused kernel (float32
filter, two stages).  CUDA only (the hash is a compiled Triton kernel); Triton is imported at first use.
"""

from __future__ import annotations

import torch

from sglang_detspec.stream import keys

__all__ = ["upstream_murmur_hash32", "upstream_draft_hashes", "upstream_seeded_scores", "upstream_seeded_fast_sample"]


def _upstream_hash_kernel():
    import triton
    import triton.language as tl

    c1, c2, n = tl.constexpr(keys.MURMUR_C1), tl.constexpr(keys.MURMUR_C2), tl.constexpr(keys.MURMUR_N)
    f1, f2 = tl.constexpr(keys.MURMUR_F1), tl.constexpr(keys.MURMUR_F2)
    key_length = tl.constexpr(keys.KEY_LENGTH_BYTES)

    @triton.jit
    def _rotl32(x, r: tl.constexpr):
        x = x.to(tl.uint64)
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    @triton.jit
    def _fmix32(h):
        h ^= h >> 16
        h = (h * f1) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * f2) & 0xFFFFFFFF
        h ^= h >> 16
        return h

    @triton.jit
    def _mix(h, k):
        k = (k * c1) & 0xFFFFFFFF
        k = _rotl32(k, 15)
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
        h = _rotl32(h, 13)
        h = (h * 5 + n) & 0xFFFFFFFF
        return h

    @triton.jit
    def murmur_hash32_kernel(seed_ptr, positions_ptr, col_indices_ptr, output_ptr, num_rows, num_cols,
                             BLOCK_SIZE: tl.constexpr):
        # A copy of sglang 0.5.23 kernels/ops/sampling/murmur_hash.py (same work per element).
        row_idx = tl.program_id(0)
        col_offsets = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = col_offsets < num_cols
        seed = tl.load(seed_ptr + row_idx).to(tl.uint64)
        pos = tl.load(positions_ptr + row_idx).to(tl.uint32)
        col = tl.load(col_indices_ptr + col_offsets, mask=mask, other=0).to(tl.uint32)
        h: tl.uint32 = 0
        h = _mix(h, (seed & 0xFFFFFFFF).to(tl.uint32))
        h = _mix(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
        h = _mix(h, pos)
        h = _mix(h, col)
        h ^= key_length
        h = _fmix32(h)
        tl.store(output_ptr + row_idx * num_cols + col_offsets, h, mask=mask)

    return murmur_hash32_kernel


_HASH_KERNEL = None


def upstream_murmur_hash32(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """Upstream's ``murmur_hash32`` on CUDA: ``[n, m]`` uint32."""
    import triton

    global _HASH_KERNEL
    if _HASH_KERNEL is None:
        _HASH_KERNEL = _upstream_hash_kernel()
    n, m = seed.shape[0], col_indices.shape[0]
    hashed = torch.empty((n, m), dtype=torch.uint32, device=seed.device)
    _HASH_KERNEL[(n, triton.cdiv(m, 1024))](seed, positions, col_indices, hashed, n, m, BLOCK_SIZE=1024)
    return hashed


def upstream_draft_hashes(sampling_seed, positions, draft_step, vocab_size):
    """The draft stream's hashes ``[B, V]`` uint32 as upstream computes them (salted seed, uint64 casts)."""
    col_offset = draft_step * vocab_size
    cols = torch.arange(col_offset, col_offset + vocab_size, dtype=torch.int64, device=sampling_seed.device)
    return upstream_murmur_hash32((sampling_seed + keys.DRAFT_SEED_SALT).to(torch.uint64), positions.to(torch.uint64), cols)


def upstream_seeded_scores(probs, sampling_seed, positions, draft_step=0):
    """Upstream's float64 race scores ``[B, V]`` (what ``fast_sample`` takes the argmax of).

    Written as upstream's body (which holds ``col_indices`` and frees ``hashed`` before the float64 ops), so
    the benchmark's peak memory of this path is upstream's."""
    vocab_size = probs.shape[1]
    col_offset = draft_step * vocab_size
    salted_seed = sampling_seed + keys.DRAFT_SEED_SALT
    col_indices = torch.arange(col_offset, col_offset + vocab_size, dtype=torch.int64, device=probs.device)
    hashed = upstream_murmur_hash32(salted_seed.to(torch.uint64), positions.to(torch.uint64), col_indices)
    scores = hashed.to(torch.float64)
    del hashed
    scores.add_(0.5).div_(2.0**32).log_().neg_().reciprocal_()
    return scores.mul_(probs)


def upstream_seeded_fast_sample(probs, sampling_seed, positions, draft_step=0):
    """SGLang 0.5.23 seeded ``fast_sample`` (num_samples=1), re-implemented op for op (CUDA only)."""
    scores = upstream_seeded_scores(probs, sampling_seed, positions, draft_step)
    sample_index = scores.argmax(dim=-1, keepdim=True)
    return probs.gather(1, sample_index), sample_index
