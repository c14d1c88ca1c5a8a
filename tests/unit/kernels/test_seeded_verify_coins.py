"""The one-launch verify coins (kernels/seeded_verify_coins.py) vs their pure-torch twin (stream/reference.py), which
test_single_layer_verify.py checks against SGLang's own ``_seeded_verify_coins``. On CPU the kernel runs under
TRITON_INTERPRET=1 (tests/conftest.py)."""

import pytest
import torch

from sglang_detspec.kernels.seeded_verify_coins import seeded_verify_coins
from sglang_detspec.stream import keys
from sglang_detspec.stream.reference import seeded_verify_coins as reference_coins

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [0, 1, 3, 4, 15, 16])
@pytest.mark.parametrize("lens_dtype", [torch.int32, torch.int64])
def test_coins_equal_the_reference_bit_for_bit(n, lens_dtype):
    g = torch.Generator().manual_seed(n)
    seeds = torch.cat([torch.randint(-(2**63), 2**63 - 1, (29,), generator=g, dtype=torch.int64),
                       torch.tensor([0, -1, 42, 2**63 - 1, -(2**63)], dtype=torch.int64)])
    hi = 2**31 - 1 if lens_dtype == torch.int32 else 2**40
    lens = torch.randint(0, hi, (seeds.shape[0],), generator=g, dtype=torch.int64).to(lens_dtype)
    coins, final = seeded_verify_coins(seeds.to(DEV), lens.to(DEV), n)
    ref_coins, ref_final = reference_coins(seeds, lens.to(torch.int64), n)
    assert coins.shape == (seeds.shape[0], n) and final.shape == (seeds.shape[0],)
    assert torch.equal(coins.cpu().view(torch.int32), ref_coins.view(torch.int32))
    assert torch.equal(final.cpu().view(torch.int32), ref_final.view(torch.int32))


def test_a_hash_near_the_top_is_clamped_below_one():
    # Seed 67,420,212 at seq_len 7 hashes column 0 to 4,294,967,230, one of the top 129 values, which round to 1.0 in
    # float32 (found by a search over seeds; the reference confirms it here), so the clamp is exercised, not assumed.
    from sglang_detspec.stream.reference import murmur3_unsalted_hash

    seed, seq_len = torch.tensor([67_420_212]), torch.tensor([7])
    assert int(murmur3_unsalted_hash(seed, seq_len, torch.zeros(1, dtype=torch.int64))) >= 2**32 - 129
    coins, _ = seeded_verify_coins(seed.to(DEV), seq_len.to(DEV), 1)
    assert coins.item() == keys.VERIFY_MAX_COIN < 1.0


def test_an_empty_batch_and_wrong_inputs():
    coins, final = seeded_verify_coins(torch.empty(0, dtype=torch.int64, device=DEV),
                                       torch.empty(0, dtype=torch.int64, device=DEV), 4)
    assert coins.shape == (0, 4) and final.shape == (0,)
    with pytest.raises(ValueError, match="matching 1-D"):
        seeded_verify_coins(torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="must be int64"):
        seeded_verify_coins(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="non-negative"):
        seeded_verify_coins(torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), -1)
