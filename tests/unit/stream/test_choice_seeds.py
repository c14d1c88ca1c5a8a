"""The per-choice seed formula against values computed without the module under test.

Two independent references: SplitMix64's published outputs for state 0 (Vigna's ``splitmix64.c``; Java's
``new SplittableRandom(0).nextLong()`` is -2152535657050944081 = 0xE220A8397B1DCDAF), and a stateful SplitMix64
generator written here with NumPy's wrapping uint64 arithmetic (a different implementation from the module's
closed-form Python-int one).
"""

import numpy as np
import pytest

from sglang_detspec.stream.choice_seeds import choice_seed, choice_seeds

# The first four outputs of SplitMix64 started from state 0 (published test vector).
SPLITMIX64_STATE0 = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]


def _numpy_splitmix64(state: int, count: int) -> list[int]:
    """A stateful SplitMix64 stream (``next()`` adds gamma, then mixes) in NumPy uint64 arithmetic."""
    s = np.array([state & (2**64 - 1)], dtype=np.uint64)
    out = []
    with np.errstate(over="ignore"):
        for _ in range(count):
            s = s + np.uint64(0x9E3779B97F4A7C15)
            z = s.copy()
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
            out.append(int(z[0]))
    return out


def test_choice_zero_keeps_the_request_seed():
    for seed in (0, 1, 42, -1, -(2**63), 2**63 - 1, True):
        assert choice_seed(seed, 0) == seed


def test_seed_zero_matches_the_published_splitmix64_outputs_masked_to_63_bits():
    assert choice_seeds(0, 5)[1:] == [v & (2**63 - 1) for v in SPLITMIX64_STATE0]
    # Java's SplittableRandom(0).nextLong(), as a signed value, with the top bit cleared:
    assert choice_seed(0, 1) == (-2152535657050944081) & (2**63 - 1)


@pytest.mark.parametrize("seed", [1, 42, 7, 12345, -1, -42, 2**62 + 3, -(2**63), 2**63 - 1])
def test_choices_follow_an_independent_splitmix64_stream(seed):
    expected = [seed] + [v & (2**63 - 1) for v in _numpy_splitmix64(seed, 15)]
    assert choice_seeds(seed, 16) == expected


def test_derived_seeds_stay_in_int64_and_do_not_collide():
    seen = {}
    for seed in range(64):
        for i, derived in enumerate(choice_seeds(seed, 64)):
            assert -(2**63) <= derived <= 2**63 - 1
            if i:
                assert 0 <= derived < 2**63
                # far away from small user seeds
                assert derived >= 2**32, (seed, i, derived)
                assert derived not in seen, (seed, i, seen.get(derived))
                seen[derived] = (seed, i)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="choice"):
        choice_seed(1, -1)
    with pytest.raises(TypeError, match="seed must be an integer"):
        choice_seed(1.5, 1)
