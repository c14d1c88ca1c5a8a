"""The verify's seeded coins in one launch: SGLang's ``_seeded_verify_coins``, bit for bit.

Why: with request seeds SGLang draws a verify step's rejection coins and its final-sampling coin as
``murmur_hash32(seed, seq_len, column)`` (columns ``0..N``), in torch ops: a column ``arange``, the hash, a float64
division, two float32 casts, two clamps and two copies, about seven kernel launches plus their host overhead. The
verify's sampling runs outside every CUDA graph, so those launches are paid on each decode step. This kernel does
the same arithmetic in one program per request.

What: the key is the unsalted ``(seed low, seed high, seq_len low word, column)`` of :mod:`sglang_detspec.stream.keys`
(the row prefix :func:`~.hashing.race_row_prefix` hashes the first three words once per row), ``u = h / (2**32 -
1)`` in float64, cast to float32 with round-to-nearest and clamped to ``1 - 2**-24``. The pure-torch twin is
:func:`sglang_detspec.stream.reference.seeded_verify_coins`, which the CPU tests check against SGLang's own function.

CUDA graphs: capturable (no host synchronisation; the allocations are the two outputs), though SGLang calls it
eagerly.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from ..stream import keys
from .hashing import fmix32, mix32, race_row_prefix
from .launch_checks import require_cuda_or_interpreter

__all__ = ["seeded_verify_coins"]

_DENOMINATOR = tl.constexpr(float(keys.VERIFY_DENOMINATOR))
_MAX_COIN = tl.constexpr(keys.VERIFY_MAX_COIN)


@triton.jit
def _coins_kernel(seed_ptr, seq_ptr, coins_ptr, final_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    h_row = race_row_prefix(seed_ptr, seq_ptr, row)
    cols = tl.arange(0, BLOCK)
    h = fmix32(mix32(h_row, cols.to(tl.uint32)))
    coin = (h.to(tl.float64) / _DENOMINATOR).to(tl.float32)
    coin = tl.minimum(coin, _MAX_COIN)
    tl.store(coins_ptr + row * N + cols, coin, mask=cols < N)
    tl.store(final_ptr + row + cols * 0, coin, mask=cols == N)


def seeded_verify_coins(sampling_seed: torch.Tensor, seq_lens: torch.Tensor,
                        draft_token_num: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(coins [B, N] float32, final_coins [B] float32)`` for seeds ``[B]`` (int64) and ``seq_lens`` ``[B]`` (int32
    or int64), ``N = draft_token_num``: the values of SGLang's ``_seeded_verify_coins``, in one launch."""
    if sampling_seed.dim() != 1 or sampling_seed.shape != seq_lens.shape:
        raise ValueError(f"sampling_seed and seq_lens must be matching 1-D tensors, got {tuple(sampling_seed.shape)} "
                         f"and {tuple(seq_lens.shape)}")
    if sampling_seed.dtype != torch.int64 or seq_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"sampling_seed must be int64 and seq_lens int32 or int64, got {sampling_seed.dtype} and "
                         f"{seq_lens.dtype}")
    if sampling_seed.device != seq_lens.device:
        raise ValueError(f"sampling_seed and seq_lens must be on one device, got {sampling_seed.device} and "
                         f"{seq_lens.device}")
    if draft_token_num < 0:
        raise ValueError(f"draft_token_num must be non-negative, got {draft_token_num}")
    require_cuda_or_interpreter(sampling_seed, "sglang_detspec.stream.reference.seeded_verify_coins")
    bs = sampling_seed.shape[0]
    coins = torch.empty((bs, draft_token_num), dtype=torch.float32, device=sampling_seed.device)
    final = torch.empty((bs,), dtype=torch.float32, device=sampling_seed.device)
    if bs:
        block = max(16, triton.next_power_of_2(draft_token_num + 1))
        _coins_kernel[(bs,)](sampling_seed.contiguous(), seq_lens.contiguous(), coins, final, draft_token_num,
                             BLOCK=block, num_warps=1)
    return coins, final
