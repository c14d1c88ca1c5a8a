"""Seeds for the choices of a parallel-sampling request (``n > 1``): one formula, written down once.

SGLang expands a request with ``n > 1`` into ``n`` copies that share one ``sampling_seed``, so on a
deterministic server the ``n`` samples are identical (upstream behaviour; users asking for per-choice seeds:
sgl-project/sglang#28805, inclusionAI/AReaL#1524). On a DETSPEC server, choice ``i`` of a request with seed ``s``
samples with ``choice_seed(s, i)`` instead (:mod:`sglang_detspec.integration.setup.parallel_sampling` applies it):

    choice_seed(s, 0) = s                                           # n = 1 output is unchanged
    choice_seed(s, i) = splitmix64_mix((s mod 2**64) + i * GOLDEN_GAMMA mod 2**64) & (2**63 - 1)   for i >= 1

    splitmix64_mix(z):  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 mod 2**64
                        z = (z ^ (z >> 27)) * 0x94D049BB133111EB mod 2**64
                        return z ^ (z >> 31)

i.e. the ``i``-th output of Steele, Lea and Flood's SplitMix64 generator (Java's ``SplittableRandom``, Vigna's
``splitmix64.c``) started from state ``s`` (two's complement), with the top bit cleared. Why this formula:

* it is a bijective 64-bit mix, so distinct ``(s, i)`` with ``i >= 1`` give distinct 64-bit values before masking
  (for a fixed ``s`` the states ``s + i * gamma`` never repeat over 2**64 choices); masking to 63 bits keeps the
  seed inside int64 (every release packs seeds into an int64 tensor) and non-negative;
* the derived seeds are spread over [0, 2**63), so the chance that one lands on a small user seed (say below
  2**32) is about 2**-31 per choice: choice ``i`` of seed ``s`` does not quietly replay another request's seed;
* it needs no state and no randomness, so a rollout can be re-derived offline from (seed, choice index).
"""

from __future__ import annotations

#: SplitMix64's increment (2**64 / golden ratio, odd).
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
#: SplitMix64's (Stafford "Mix13") finalizer multipliers.
MIX_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
MIX_MULTIPLIER_2 = 0x94D049BB133111EB

_U64 = (1 << 64) - 1
#: Derived seeds are masked to 63 bits: non-negative and inside int64.
SEED_MASK = (1 << 63) - 1


def splitmix64_mix(z: int) -> int:
    """SplitMix64's output function of a 64-bit state (Python ints, wrapping multiplication)."""
    z &= _U64
    z = ((z ^ (z >> 30)) * MIX_MULTIPLIER_1) & _U64
    z = ((z ^ (z >> 27)) * MIX_MULTIPLIER_2) & _U64
    return z ^ (z >> 31)


def choice_seed(seed: int, choice: int) -> int:
    """The ``sampling_seed`` of choice ``choice`` (0-based) of a request seeded with ``seed`` (see module doc)."""
    if not isinstance(seed, int):  # bool passes as 0 / 1, as SGLang lets it through
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if isinstance(choice, bool) or not isinstance(choice, int) or choice < 0:
        raise ValueError(f"choice must be a non-negative integer, got {choice!r}")
    if choice == 0:
        return seed
    state = ((seed & _U64) + choice * GOLDEN_GAMMA) & _U64
    return splitmix64_mix(state) & SEED_MASK


def choice_seeds(seed: int, n: int) -> list[int]:
    """``[choice_seed(seed, i) for i in range(n)]``."""
    return [choice_seed(seed, i) for i in range(n)]
