"""The key hash every kernel here shares: MurmurHash3 x86_32 on uint32 tensors, and two PTX fast-math helpers.

Both streams hash a 16-byte key of four uint32 words (layout and constants: :mod:`sglang_detspec.stream.keys`).
The first three words (seed low, seed high, position) are the same for every token of a row, so a kernel hashes
them once per program (:func:`draft_row_prefix` for the draft stream's SALTED seed, :func:`race_row_prefix` for
the target race's unsalted one) and mixes in only the column word per element (``fmix32(mix32(prefix, col))``).

:func:`lg2_f32` and :func:`recip_f32` take ``FAST`` (CUDA only): PTX's ``lg2.approx`` / ``rcp.approx`` instead of
libdevice's ``log2`` / an IEEE division.  The interpreter (``TRITON_INTERPRET=1``, NumPy) cannot run inline
assembly, so callers pass ``FAST=False`` there.  Each caller's error bound allows the approximations (the bounds
are in the docstrings of :mod:`.draft_scoring` and :mod:`.coupled_race`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..stream import keys

__all__ = ["mix32", "fmix32", "draft_row_prefix", "race_row_prefix", "lg2_f32", "recip_f32"]

# The key layout's constants, from their one definition (sglang_detspec.stream.keys): the salt is added as its two
# 32-bit halves (explicit carry), the Murmur multipliers and the finalizer's length word as written there.
_SALT_LO = tl.constexpr(keys.DRAFT_SEED_SALT_LO)
_SALT_HI = tl.constexpr(keys.DRAFT_SEED_SALT_HI)
_MURMUR_C1 = tl.constexpr(keys.MURMUR_C1)
_MURMUR_C2 = tl.constexpr(keys.MURMUR_C2)
_MURMUR_N = tl.constexpr(keys.MURMUR_N)
_MURMUR_F1 = tl.constexpr(keys.MURMUR_F1)
_MURMUR_F2 = tl.constexpr(keys.MURMUR_F2)
_KEY_LENGTH_BYTES = tl.constexpr(keys.KEY_LENGTH_BYTES)


@triton.jit
def mix32(h, k):
    # MurmurHash3 x86_32 block mix on uint32 tensors (wrapping multiplies, logical shifts).
    k = k * _MURMUR_C1
    k = (k << 15) | (k >> 17)
    k = k * _MURMUR_C2
    h = h ^ k
    h = (h << 13) | (h >> 19)
    return h * 5 + _MURMUR_N


@triton.jit
def fmix32(h):
    # MurmurHash3 finalizer.  The key length in bytes (16) is xored in first; since (h ^ 16) >> 16 == h >> 16,
    # h ^ 16 ^ (h >> 16) is the same value in one three-input logic op instead of two dependent ones.
    h = h ^ (h >> 16) ^ _KEY_LENGTH_BYTES
    h = h * _MURMUR_F1
    h = h ^ (h >> 13)
    h = h * _MURMUR_F2
    return h ^ (h >> 16)


@triton.jit
def draft_row_prefix(seed_ptr, pos_ptr, row):
    """Murmur state after the three row-constant words of the draft stream's key (salted seed lo, hi; position)."""
    seed = tl.load(seed_ptr + row).to(tl.int64)
    # seed + keys.DRAFT_SEED_SALT with int64 wrap-around, done on 32-bit halves with an explicit carry so that no
    # intermediate overflows (the interpreter's NumPy scalars would warn; the arithmetic is the same).
    lo = (seed & 0xFFFFFFFF) + _SALT_LO
    hi = ((seed >> 32) & 0xFFFFFFFF) + _SALT_HI + (lo >> 32)
    pos = tl.load(pos_ptr + row).to(tl.int64) & 0xFFFFFFFF  # int32 or int64; two's complement low word
    h = tl.zeros([], dtype=tl.uint32)
    h = mix32(h, (lo & 0xFFFFFFFF).to(tl.uint32))
    h = mix32(h, (hi & 0xFFFFFFFF).to(tl.uint32))
    h = mix32(h, pos.to(tl.uint32))
    return h


@triton.jit
def race_row_prefix(seed_ptr, pos_ptr, row):
    """Murmur state after the three row-constant words of the UNSALTED key (seed low, high; position): the key of
    SGLang's non-speculative seeded race, which the coupled kernels reproduce."""
    seed = tl.load(seed_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64) & 0xFFFFFFFF  # int32 or int64: the two's complement low word
    h = tl.zeros([], dtype=tl.uint32)
    h = mix32(h, (seed & 0xFFFFFFFF).to(tl.uint32))
    h = mix32(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))  # arithmetic shift, masked: the high word
    h = mix32(h, pos.to(tl.uint32))
    return h


@triton.jit
def lg2_f32(x, FAST: tl.constexpr):
    """float32 ``log2(x)``: PTX ``lg2.approx.ftz`` (absolute error <= 2**-22) when ``FAST``, else ``tl.log2``."""
    if FAST:
        lg = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        lg = tl.log2(x)
    return lg


@triton.jit
def recip_f32(x, FAST: tl.constexpr):
    """float32 ``1 / x``: PTX ``rcp.approx.ftz`` (<= 1 ulp) when ``FAST``, else an IEEE division."""
    if FAST:
        # rcp.approx: <= 1 ulp; every caller's x is a normal float (no range fix-ups needed)
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        r = 1.0 / x
    return r
