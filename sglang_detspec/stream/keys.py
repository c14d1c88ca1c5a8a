"""The key layout of the seeded draft stream: SGLang 0.5.23's definition, written down once.

Everything in this project that draws, checks or documents a seeded draft token reads its constants
from here (the Triton kernel in :mod:`sglang_detspec.kernels`, the CPU twin in
:mod:`sglang_detspec.stream.reference`, the replica of upstream's sampler in :mod:`sglang_detspec.bench.upstream_replica`
and the tests); what a draw's inputs must be is :mod:`sglang_detspec.stream.draft_contract`.  The definition is upstream's
(``sglang/srt/speculative/spec_utils.py::fast_sample`` with ``sampling_seed=``, 0.5.23); keeping it
token-for-token identical means that switching the plugin on or off never changes a token.

The draft stream
----------------
For row ``r`` with request seed ``s`` (int64), absolute key position ``p``, draft step ``k`` and
vocabulary size ``V``, token ``t`` (``0 <= t < V``) gets the 16-byte key of four little-endian
uint32 words::

    salted = (s + DRAFT_SEED_SALT) mod 2**64      # wrapping int64 addition, as torch does it
    word0  = salted        & 0xFFFFFFFF           # seed, low word
    word1  = (salted >> 32) & 0xFFFFFFFF          # seed, high word
    word2  = p & 0xFFFFFFFF                       # position, truncated to uint32 (two's complement)
    word3  = k * V + t                            # draft step and token share one uint32 column word

hashed with MurmurHash3 x86_32 (seed 0; the length word in the finalizer is 16).  The uniform is
``u = (h + 0.5) / 2**32`` and the score is ``p_t / (-log u)``, both in float64 with exactly this
operation order (add 0.5, divide by 2**32, log, negate, reciprocal, multiply by the float32
probability promoted to float64).  The drawn token is the FIRST index of the maximum score
(``torch.argmax`` semantics), so exact float64 ties go to the lower token id.

Why this layout
---------------
* Domain separation.  The target sampler (``multinomial_with_seed``) hashes ``(seed, position,
  vocab column)`` and the verify coins hash ``(seed, seq_len, 0..N)``, both unsalted.  Adding the
  salt (ASCII ``"DRAFT_\\0\\0"``) to the seed moves every draft key into another part of the key
  space, so a draft draw never reuses the uniform of a verify coin or of a target draw at the same
  position; rejection sampling is unbiased only if the proposal and the coins are independent.  The
  salt is additive, so it separates domains within one request; across requests, seed ``s``'s draft
  keys equal seed ``s + SALT``'s target keys (harmless: different requests).
* The per-step column block ``k*V + t`` separates successive draft steps of one request whose
  position inputs coincide (the multi-layer paths draft several tokens from the same position), and
  keeps step 0 identical to the original unstepped stream.  It must fit in uint32:
  ``k*V + V <= 2**32`` (checked; :func:`check_draft_step`).
* Midpoint binning ``(h + 0.5) / 2**32`` maps the 2**32 hash values to the centres of 2**32 equal
  bins, so ``u`` is strictly inside (0, 1) for every hash (smallest 2**-33, largest 1 - 2**-33; both
  exact in float64).  ``-log u`` is then finite and positive (between about 1.16e-10 and 22.87),
  the score ``p / -log u`` is finite for every finite ``p``, and no hash value (not even
  ``0xFFFFFFFF``) can make a token with ``p = 0`` win or produce an infinite score.
* The exponential race: if ``u ~ U(0,1)`` then ``-log u ~ Exp(1)`` and ``argmax_t p_t / Exp_t`` is a
  sample from ``p / sum(p)`` (Gumbel-max in exponential form); no normalisation is needed.

The verify-coin domain (SGLang 0.5.23 ``eagle_utils._seeded_verify_coins``)
--------------------------------------------------------------------------
Unsalted key ``(seed, seq_len, col)`` with ``col`` in ``0..N`` (``N`` = draft tokens per request);
``u = h / (2**32 - 1)`` in float64 (a CLOSED interval [0, 1]), cast to float32 and clamped to at most
``1 - 2**-24`` (the largest float32 below one).  Columns ``0..N-1`` are the per-draft rejection
coins, column ``N`` the final (bonus) sampling coin.
"""

from __future__ import annotations

#: Added (wrapping int64) to the request seed before hashing a draft key: ASCII "DRAFT_\0\0".
#: Equal to ``sglang.srt.speculative.spec_utils._DRAFT_GUMBEL_SEED_SALT`` in 0.5.23.
DRAFT_SEED_SALT = 0x44524146545F0000

#: Low and high 32-bit words of the salt (the kernel adds them with an explicit carry, overflow-free).
DRAFT_SEED_SALT_LO = DRAFT_SEED_SALT & 0xFFFFFFFF
DRAFT_SEED_SALT_HI = DRAFT_SEED_SALT >> 32

#: MurmurHash3 x86_32 constants (Austin Appleby's reference implementation).
MURMUR_C1 = 0xCC9E2D51
MURMUR_C2 = 0x1B873593
MURMUR_N = 0xE6546B64
MURMUR_F1 = 0x85EBCA6B
MURMUR_F2 = 0xC2B2AE35
#: Key length in bytes, xor-ed into the state before the finalizer (four uint32 words).
KEY_LENGTH_BYTES = 16

#: 2**32: the column word is a uint32, so ``draft_step * V + V`` must not exceed it.
COLUMN_SPACE = 1 << 32

#: Verify coins: ``h / VERIFY_DENOMINATOR`` in float64, then float32 clamped to ``VERIFY_MAX_COIN``.
VERIFY_DENOMINATOR = (1 << 32) - 1
VERIFY_MAX_COIN = 1.0 - 2.0**-24

_U64 = (1 << 64) - 1


def salted_seed_words(seed: int) -> tuple[int, int]:
    """(low, high) uint32 words of ``seed + DRAFT_SEED_SALT`` with int64 wrap-around (Python ints)."""
    salted = (int(seed) + DRAFT_SEED_SALT) & _U64
    return salted & 0xFFFFFFFF, salted >> 32


def seed_words(seed: int) -> tuple[int, int]:
    """(low, high) uint32 words of an unsalted int64 seed (two's complement), as the verify coins use."""
    s = int(seed) & _U64
    return s & 0xFFFFFFFF, s >> 32


def position_word(position: int) -> int:
    """The uint32 position word: the low 32 bits of the (two's complement) position."""
    return int(position) & 0xFFFFFFFF


def check_draft_step(draft_step: int, vocab_size: int) -> None:
    """Raise ``ValueError`` unless ``draft_step * vocab_size + token`` fits the uint32 column word."""
    if int(draft_step) != draft_step or draft_step < 0:
        raise ValueError(f"draft_step must be a non-negative integer, got {draft_step!r}")
    if vocab_size <= 0:
        raise ValueError(f"the vocabulary (last) dimension must be non-empty, got {vocab_size}")
    if draft_step * vocab_size + vocab_size > COLUMN_SPACE:
        raise ValueError(
            "draft_step and vocabulary size exceed the uint32 hash-key range "
            f"(draft_step * V + V = {draft_step * vocab_size + vocab_size} > 2**32): "
            f"draft_step={draft_step}, vocab_size={vocab_size}; the largest allowed draft_step for this "
            f"vocabulary is {COLUMN_SPACE // vocab_size - 1}"
        )


def column_word(draft_step: int, vocab_size: int, token: int) -> int:
    """The uint32 column word ``draft_step * V + token`` (validated)."""
    check_draft_step(draft_step, vocab_size)
    if not 0 <= token < vocab_size:
        raise ValueError(f"token {token} outside [0, {vocab_size})")
    return draft_step * vocab_size + token


def draft_key_words(seed: int, position: int, draft_step: int, vocab_size: int, token: int) -> tuple[int, int, int, int]:
    """The four uint32 words hashed for one draft token (see the module docstring)."""
    lo, hi = salted_seed_words(seed)
    return lo, hi, position_word(position), column_word(draft_step, vocab_size, token)


def uniform_from_hash(h: int) -> float:
    """Midpoint-binned uniform ``(h + 0.5) / 2**32`` (exact in float64, strictly inside (0, 1))."""
    return (float(h) + 0.5) / 4294967296.0
