"""One launch check for every Triton wrapper (kernels/launch_checks.py): a bad launch gets the same refusal,
naming the wrapper's own keyword, before anything is allocated or launched; the interpreter's wide default block."""

import pytest
import torch
import triton

from sglang_detspec.kernels.coupled_race import coupled_race
from sglang_detspec.kernels.coupled_race_probs import coupled_race_probs
from sglang_detspec.kernels.launch_checks import interpreter_block, overridden_launch, require_launch
from sglang_detspec.kernels.row_truncation import truncate_probs_triton
from sglang_detspec.kernels.seeded_draft_sample import seeded_draft_sample

DEV = "cuda" if torch.cuda.is_available() else "cpu"
R, V = 2, 64


def _probs():
    return torch.softmax(torch.randn(R, V), -1).to(DEV)


def _keys():
    return torch.tensor([1, 2], device=DEV), torch.tensor([3, 4], device=DEV)


WRAPPERS = {
    "seeded_draft_sample": (lambda **launch: seeded_draft_sample(_probs(), *_keys(), **launch), "block_size"),
    "coupled_race": (lambda **launch: coupled_race(torch.log(_probs()), *_keys(), **launch), "block_size"),
    "coupled_race_probs": (lambda **launch: coupled_race_probs(_probs(), *_keys(), **launch), "block_size"),
    "truncate_probs_triton": (lambda **launch: truncate_probs_triton(
        _probs(), torch.full((R,), 5, dtype=torch.int32, device=DEV), torch.ones(R, device=DEV), None,
        renormalize=False, **launch), "block"),
}


@pytest.mark.parametrize("name", sorted(WRAPPERS))
@pytest.mark.parametrize("columns", [8, 48])
def test_every_wrapper_refuses_columns_that_are_not_a_power_of_two_of_at_least_16(name, columns):
    call, keyword = WRAPPERS[name]
    with pytest.raises(ValueError, match=f"^{keyword} must be a power of two >= 16, got {columns}$"):
        call(**{keyword: columns})


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_every_wrapper_refuses_warps_that_are_not_a_power_of_two(name):
    call, _ = WRAPPERS[name]
    with pytest.raises(ValueError, match="^num_warps must be a power of two >= 1, got 3$"):
        call(num_warps=3)


def test_require_launch_accepts_powers_of_two():
    for block in (16, 1024, 8192):
        for warps in (1, 4, 16):
            require_launch(block, warps)
    require_launch(2048)  # warps not given: not checked


def test_overridden_launch_takes_each_override_where_given_and_checks_the_result():
    assert overridden_launch(1024, 4, None, None) == (1024, 4)
    assert overridden_launch(1024, 4, 256, None) == (256, 4)
    assert overridden_launch(1024, 4, None, 8) == (1024, 8)
    assert overridden_launch(1024, 4, 64, 2) == (64, 2)
    with pytest.raises(ValueError, match="^block_size must be a power of two >= 16, got 24$"):
        overridden_launch(1024, 4, 24, None)
    with pytest.raises(ValueError, match="^num_warps must be a power of two >= 1, got 6$"):
        overridden_launch(1024, 4, None, 6)


@pytest.mark.parametrize("vocab", [1, 5, 1000, 1024, 1025, 4099, 32000, 151936])
def test_interpreter_block_is_the_vocab_rounded_up_within_1024_and_8192(vocab):
    assert interpreter_block(vocab) == max(1024, min(8192, triton.next_power_of_2(vocab)))
