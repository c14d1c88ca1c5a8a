"""Pure-torch twin of SGLang 0.5.23's seeded draft stream and seeded verify coins.

Bit-exact and overflow-free: every MurmurHash3 step is done on int64 tensors holding uint32 values,
and every 32x32-bit multiply is split into 16-bit halves so that no intermediate reaches 2**63 (torch
has no wrapping uint32 arithmetic on CPU, and int64 products of two uint32 values would overflow).
It runs on any device, is slow (it materialises ``[B, V]`` int64 and float64 tensors, like upstream)
and is meant for CPU unit tests, audits and the parity checks of the Triton kernel.  The key layout
is documented once, in :mod:`sglang_detspec.stream.keys`, the input contract in :mod:`sglang_detspec.stream.draft_contract`.

Float64 caveat: the score uses ``torch.log`` on float64.  On CUDA this is the same libdevice ``log`` as
upstream's and as the Triton kernel's; on CPU it is the host ``log`` (Sleef/glibc), which can differ by
one ulp on rare inputs.  The hash and the uniform are exact everywhere; a one-ulp log difference can
flip the argmax only between two scores tied to about 1e-16 relative.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import keys
from .draft_contract import check_draft_sample_inputs
from .truncation_contract import TRUNCATION_FIXED_POINT_BITS, validate_truncation_inputs

_M32 = 0xFFFFFFFF


def _mulmod32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for int64 ``a`` in [0, 2**32) and a uint32 constant ``c``, without int64 overflow."""
    lo = a * (c & 0xFFFF)  # < 2**48
    hi = ((a * (c >> 16)) & 0xFFFF) << 16  # only the low 16 bits of a*c_hi survive the shift mod 2**32
    return (lo + hi) & _M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mulmod32(k, keys.MURMUR_C1)
    k = _rotl32(k, 15)
    k = _mulmod32(k, keys.MURMUR_C2)
    h = h ^ k
    h = _rotl32(h, 13)
    return (_mulmod32(h, 5) + keys.MURMUR_N) & _M32


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mulmod32(h, keys.MURMUR_F1)
    h = h ^ (h >> 13)
    h = _mulmod32(h, keys.MURMUR_F2)
    return h ^ (h >> 16)


def murmur3_words(w0: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 x86_32 (seed 0) of the 16 bytes formed by four little-endian uint32 words.

    Inputs are int64 tensors holding values in [0, 2**32), broadcastable; returns int64 in [0, 2**32).
    """
    h = torch.zeros_like(torch.broadcast_tensors(w0, w1, w2, w3)[0])
    for w in (w0, w1, w2, w3):
        h = _mix(h, w & _M32)
    h = h ^ keys.KEY_LENGTH_BYTES
    return _fmix(h)


def _seed_words(seed: torch.Tensor, salt: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(low, high) uint32 words of ``seed + salt`` with int64 wrap-around, computed overflow-free."""
    s = seed.to(torch.int64)
    lo = (s & _M32) + (salt & _M32)  # < 2**33
    carry = lo >> 32
    hi = ((s >> 32) & _M32) + (salt >> 32) + carry  # arithmetic shift, masked: the two's complement high word
    return lo & _M32, hi & _M32


def murmur3_draft_hash(
    sampling_seed: torch.Tensor, positions: torch.Tensor, draft_step: int, vocab_size: int
) -> torch.Tensor:
    """The draft-stream hashes ``[B, V]`` (int64 holding uint32) for seeds ``[B]``, positions ``[B]``."""
    keys.check_draft_step(draft_step, vocab_size)
    cols = torch.arange(vocab_size, dtype=torch.int64, device=sampling_seed.device) + draft_step * vocab_size
    return murmur3_salted_hash(sampling_seed, positions, cols)


def murmur3_salted_hash(sampling_seed: torch.Tensor, positions: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The draft (salted) key space for arbitrary column words ``cols`` (``draft_step * V + token``, uint32
    values in int64): hashes ``[B, len(cols)]`` as int64.  A reduced-vocabulary draft hashes its hot tokens'
    TARGET columns this way (:mod:`sglang_detspec.stream.hot_vocab`)."""
    lo, hi = _seed_words(sampling_seed.reshape(-1), keys.DRAFT_SEED_SALT)
    pos = positions.reshape(-1).to(torch.int64) & _M32
    c = cols.reshape(-1).to(torch.int64) & _M32
    return murmur3_words(lo[:, None], hi[:, None], pos[:, None], c[None, :])


def murmur3_unsalted_hash(seed: torch.Tensor, positions: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The unsalted key space (target sampler, verify coins): hashes ``[B, len(cols)]`` as int64."""
    lo, hi = _seed_words(seed.reshape(-1), 0)
    pos = positions.reshape(-1).to(torch.int64) & _M32
    c = cols.reshape(-1).to(torch.int64) & _M32
    return murmur3_words(lo[:, None], hi[:, None], pos[:, None], c[None, :])


def draft_scores(
    probs: torch.Tensor, sampling_seed: torch.Tensor, positions: torch.Tensor, draft_step: int = 0
) -> torch.Tensor:
    """Float64 race scores ``p / -log((h + 0.5) / 2**32)`` in upstream's exact operation order, ``[B, V]``."""
    return race_scores(murmur3_draft_hash(sampling_seed, positions, draft_step, probs.shape[-1]), probs)


def race_scores(hashes: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Float64 ``probs / -log((h + 0.5) / 2**32)`` of hashes and probabilities of one shape, upstream's order."""
    scores = hashes.to(torch.float64)
    scores.add_(0.5).div_(2.0**32).log_().neg_().reciprocal_()
    return scores.mul_(probs)


def seeded_draft_sample(
    probs: torch.Tensor,
    sampling_seed: torch.Tensor,
    positions: torch.Tensor,
    draft_step: int = 0,
    *,
    greedy: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference seeded draft draw: ``(probs.gather(1, idx), idx)`` with ``idx`` int64 ``[B, 1]``.

    Same contract as SGLang 0.5.23 ``fast_sample(probs, 1, sampling_seed=, positions=, draft_step=)``;
    rows where ``greedy`` is True return ``probs.argmax(-1)`` (upstream's ``top_ks <= 1`` override).
    Rows with NaN return the first NaN index and all-zero rows return token 0 (``torch.argmax``).
    """
    check_draft_sample_inputs(probs, sampling_seed, positions, draft_step, greedy)
    scores = draft_scores(probs, sampling_seed, positions, draft_step)
    idx = scores.argmax(dim=-1, keepdim=True)
    if greedy is not None:
        idx = torch.where(greedy.reshape(-1, 1).to(probs.device), probs.argmax(dim=-1, keepdim=True), idx)
    return probs.gather(1, idx), idx


def seeded_verify_coins(
    sampling_seed: torch.Tensor, seq_lens: torch.Tensor, draft_token_num: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Bit-identical twin of SGLang 0.5.23 ``eagle_utils._seeded_verify_coins``.

    Returns ``(coins [B, N] float32, final_coins [B] float32)``: unsalted ``(seed, seq_len, col)`` keys,
    ``u = h / (2**32 - 1)`` in float64, cast to float32 and clamped to ``1 - 2**-24``.
    """
    if sampling_seed.shape != seq_lens.shape or sampling_seed.dim() != 1:
        raise ValueError(
            f"sampling_seed and seq_lens must be matching 1-D tensors, got {tuple(sampling_seed.shape)} and "
            f"{tuple(seq_lens.shape)}"
        )
    if draft_token_num < 0:
        raise ValueError(f"draft_token_num must be non-negative, got {draft_token_num}")
    cols = torch.arange(draft_token_num + 1, dtype=torch.int64, device=sampling_seed.device)
    hashed = murmur3_unsalted_hash(sampling_seed, seq_lens, cols)
    uniforms = hashed.to(torch.float64) / keys.VERIFY_DENOMINATOR
    coins = uniforms[:, :draft_token_num].to(torch.float32).clamp_(max=keys.VERIFY_MAX_COIN).contiguous()
    final = uniforms[:, draft_token_num].to(torch.float32).clamp_(max=keys.VERIFY_MAX_COIN).contiguous()
    return coins, final


# ---------------------------------------------------------------------------------------------------------
# Row-local top-k / top-p / min-p truncation (reference for kernels/row_truncation.py)
# ---------------------------------------------------------------------------------------------------------
#
# The rules (one definition, shared by this reference, the Triton kernel and their tests):
#   * a row needs truncation iff top_k < V or top_p < 1 or min_p > 0; any other row is returned bit for bit;
#   * order: value descending, ties by the LOWER index first; r(i) = rank of i in that order;
#   * fixed-point masses q_i = int64(p_i * 2**60) (truncation), T = int64(top_p * 2**60), and the exclusive
#     prefix mass E_i = sum of q_j over r(j) < r(i) -- integers, so exact in any summation order;
#   * kept_i = r(i) == 0 or (r(i) < top_k and E_i <= T and p_i >= float32(p_max * min_p));
#   * renormalize: S = sum of q over kept, d = float32(S) * 2**-60, kept values become p_i / d (IEEE float32
#     division), unless S == 0; dropped values become 0.0.
# "r(i) == 0" only matters for out-of-contract parameters (top_k < 1, top_p <= 0, min_p > 1): a truncated
# row is never all zero.  Fixed-point masses assume a row sum below 8 (2**63 / 2**60), true for
# probabilities; larger rows wrap around in int64.

_ABS_BITS = 0x7FFFFFFF  # float32 bits without the sign: -0.0 ranks as +0.0 (probabilities are >= 0)


def truncate_probs_reference(
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: Optional[torch.Tensor],
    *,
    renormalize: bool,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Row-local top-k / top-p / min-p truncation by one full sort (the rules are in the comment above).

    A different algorithm from the Triton kernel (which bisects over float bit patterns without sorting):
    each row is sorted by the unique int64 key ``(0x7FFFFFFF - bits) << 32 | index`` (value descending,
    lower index first), the exclusive prefix masses are an int64 cumsum of the fixed-point masses, and the
    kept mask is scattered back.  Runs on any device; materialises several ``[N, V]`` int64 tensors, so it
    is meant for CPU, tests and audits.  ``out`` may be ``probs`` itself (in place) or a separate tensor.
    """
    validate_truncation_inputs(probs, top_ks, top_ps, min_ps, renormalize, out)
    rows, vocab = probs.shape
    if rows == 0:
        result = probs.clone()
    else:
        top_k = top_ks.to(torch.int64).view(-1, 1)
        top_p = top_ps.view(-1, 1)
        min_p = torch.zeros_like(top_ps) if min_ps is None else min_ps
        min_p = min_p.view(-1, 1)
        needs = ((top_k < vocab) | (top_p < 1) | (min_p > 0)).view(-1)

        scale = float(2**TRUNCATION_FIXED_POINT_BITS)
        bits = probs.view(torch.int32).to(torch.int64) & _ABS_BITS
        index = torch.arange(vocab, dtype=torch.int64, device=probs.device).expand(rows, vocab)
        order_key, _ = torch.sort(((_ABS_BITS - bits) << 32) | index, dim=1)
        order = order_key & 0xFFFFFFFF  # column index of each rank
        sorted_p = probs.gather(1, order)
        sorted_q = (sorted_p * scale).to(torch.int64)  # float32 times 2**60 is exact; the cast truncates
        exclusive_mass = torch.cumsum(sorted_q, dim=1) - sorted_q
        ranks = torch.arange(vocab, device=probs.device).view(1, -1)
        threshold = sorted_p[:, :1] * min_p  # float32 product of the row maximum and min_p
        kept_sorted = (
            (ranks < top_k) & (exclusive_mass <= (top_p * scale).to(torch.int64)) & (sorted_p >= threshold)
        ) | (ranks == 0)
        kept = torch.zeros_like(kept_sorted).scatter_(1, order, kept_sorted)

        truncated = torch.where(kept, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
        if renormalize:
            kept_mass = (sorted_q * kept_sorted).sum(dim=1, keepdim=True)
            divisor = kept_mass.to(torch.float32) * 2.0**-TRUNCATION_FIXED_POINT_BITS
            divisor = torch.where(kept_mass > 0, divisor, torch.ones_like(divisor))  # S == 0: no division
            truncated = torch.where(kept, probs / divisor, truncated)
        result = torch.where(needs.view(-1, 1), truncated, probs)
    if out is None:
        return result
    out.copy_(result)
    return out
