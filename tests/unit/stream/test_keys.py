"""Known-answer tests of the draft-key layout, written from the spec INDEPENDENTLY of the code under test.

The hash below is a plain-Python MurmurHash3_x86_32 over bytes (Austin Appleby's algorithm, tail handling
included), cross-checked against the published test vectors; the key bytes are built with ``struct``
from the documented layout, not with sglang_detspec's helpers.
"""

import math
import struct

import pytest
import torch

from sglang_detspec.stream import keys, reference

MASK = 0xFFFFFFFF


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """Textbook MurmurHash3_x86_32 (https://github.com/aappleby/smhasher, MurmurHash3.cpp)."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & MASK
    n = len(data)
    rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & MASK  # noqa: E731
    for i in range(0, n - n % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * c1) & MASK
        k = rotl(k, 15)
        k = (k * c2) & MASK
        h ^= k
        h = rotl(h, 13)
        h = (h * 5 + 0xE6546B64) & MASK
    tail = data[n - n % 4:]
    k = 0
    for i, b in enumerate(tail):
        k |= b << (8 * i)
    if tail:
        k = (k * c1) & MASK
        k = rotl(k, 15)
        k = (k * c2) & MASK
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK
    h ^= h >> 16
    return h


# Published MurmurHash3_x86_32 vectors (SMHasher verification values, widely reproduced, e.g. in the
# Wikipedia article and the mmh3 / Guava test suites).
PUBLISHED = [
    (b"", 0, 0x00000000),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
    (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"\x21\x43\x65\x87", 0, 0xF55B516B),
    (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
    (b"Hello, world!", 1234, 0xFAF6CDB3),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
]


@pytest.mark.parametrize("data,seed,expected", PUBLISHED)
def test_plain_python_murmur_matches_published_vectors(data, seed, expected):
    assert murmur3_32(data, seed) == expected


def spec_key_bytes(seed: int, position: int, draft_step: int, vocab: int, token: int) -> bytes:
    """The 16 key bytes exactly as the issue words them, from scratch."""
    salted = (seed + 0x44524146545F0000) % 2**64  # wrapping int64 add == mod 2**64 on the bit pattern
    return struct.pack("<IIII", salted % 2**32, salted // 2**32, position % 2**32, draft_step * vocab + token)


CASES = [
    # seed, position, draft_step, vocab, token
    (0, 0, 0, 151936, 0),
    (42, 17, 0, 151936, 12345),
    (42, 17, 1, 151936, 12345),
    (-1, 5, 3, 163840, 163839),
    (-(2**63), 2**40 + 7, 0, 32000, 1),  # position above 2**32: truncated
    (2**63 - 1, 2**32 - 1, 26213, 163840, 163839),  # largest step for this V, top of the uint32 column
    (2**63 - 0x44524146545F0000, 1, 2, 1000, 999),  # salted seed wraps exactly to 0
    (123456789, -3, 0, 50257, 50000),  # negative position (two's complement low word)
]


@pytest.mark.parametrize("seed,pos,step,vocab,token", CASES)
def test_reference_hash_equals_independent_spec_hash(seed, pos, step, vocab, token):
    want = murmur3_32(spec_key_bytes(seed, pos, step, vocab, token))
    got = reference.murmur3_draft_hash(torch.tensor([seed]), torch.tensor([pos]), step, vocab)[0, token]
    assert int(got) == want


@pytest.mark.parametrize("seed,pos,step,vocab,token", CASES)
def test_keys_helpers_follow_the_layout(seed, pos, step, vocab, token):
    words = keys.draft_key_words(seed, pos, step, vocab, token)
    assert struct.pack("<IIII", *words) == spec_key_bytes(seed, pos, step, vocab, token)


def test_salt_is_ascii_draft():
    assert keys.DRAFT_SEED_SALT.to_bytes(8, "big") == b"DRAFT_\x00\x00"
    assert keys.DRAFT_SEED_SALT_LO | (keys.DRAFT_SEED_SALT_HI << 32) == keys.DRAFT_SEED_SALT


def test_uniform_is_strictly_inside_unit_interval_at_both_ends():
    lo, hi = keys.uniform_from_hash(0), keys.uniform_from_hash(2**32 - 1)
    assert lo == 2.0**-33 and hi == 1.0 - 2.0**-33  # exact in float64
    assert 0.0 < lo and hi < 1.0
    assert math.isfinite(1.0 / -math.log(hi)) and 1.0 / -math.log(hi) > 0


def test_a_key_hashing_to_0xffffffff_gives_u_below_one_and_a_finite_score():
    # A random search would need ~2**32 keys; instead invert the last Murmur round (fmix32 and the block
    # mix are bijections), solving for the column word.  The plain-Python hash then confirms the find.
    seed, pos, token = _find_key_for_hash_by_inversion(0xFFFFFFFF)
    assert murmur3_32(spec_key_bytes(seed, pos, 0, 2**32, token)) == 0xFFFFFFFF
    h = reference.murmur3_words(
        *[torch.tensor([w]) for w in struct.unpack("<IIII", spec_key_bytes(seed, pos, 0, 2**32, token))]
    )
    assert int(h) == 0xFFFFFFFF
    u = (h.double() + 0.5) / 2.0**32
    assert float(u) < 1.0
    score = u.log().neg().reciprocal() * 1.0
    assert torch.isfinite(score).all() and float(score) > 0


def _inv_fmix(h: int) -> int:
    inv1, inv2 = pow(0x85EBCA6B, -1, 2**32), pow(0xC2B2AE35, -1, 2**32)

    def unxorshift(x, s):
        r = x
        for _ in range(32 // s + 1):
            r = x ^ (r >> s)
        return r & MASK

    h = unxorshift(h, 16)
    h = (h * inv2) & MASK
    h = unxorshift(h, 13)
    h = (h * inv1) & MASK
    return unxorshift(h, 16)


def _find_key_for_hash_by_inversion(target: int):
    """Invert the last Murmur round: pick seed/position, solve for the column word (exists for any target)."""
    c1_inv, c2_inv = pow(0xCC9E2D51, -1, 2**32), pow(0x1B873593, -1, 2**32)
    rotr = lambda x, r: ((x >> r) | (x << (32 - r))) & MASK  # noqa: E731
    seed, pos = 987654321, 4242
    b = spec_key_bytes(seed, pos, 0, 2**32, 0)[:12]
    # state after three words
    h = 0
    for i in range(0, 12, 4):
        k = int.from_bytes(b[i:i + 4], "little")
        k = (k * 0xCC9E2D51) & MASK
        k = ((k << 15) | (k >> 17)) & MASK
        k = (k * 0x1B873593) & MASK
        h ^= k
        h = ((h << 13) | (h >> 19)) & MASK
        h = (h * 5 + 0xE6546B64) & MASK
    pre = _inv_fmix(target) ^ 16  # state before "h ^= len; fmix"
    pre = ((pre - 0xE6546B64) * pow(5, -1, 2**32)) & MASK
    pre = rotr(pre, 13)
    k = pre ^ h
    k = (k * c2_inv) & MASK
    k = rotr(k, 15)
    token = (k * c1_inv) & MASK
    return seed, pos, token


def test_check_draft_step_limits():
    keys.check_draft_step(26213, 163840)  # 26213 * 163840 + 163840 == 2**32 - 4... fits
    with pytest.raises(ValueError, match="uint32 hash-key range"):
        keys.check_draft_step(26214, 163840)
    with pytest.raises(ValueError, match="non-negative"):
        keys.check_draft_step(-1, 10)
