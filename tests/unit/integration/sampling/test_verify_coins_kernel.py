"""The DETSPEC verify's seeded coins in one launch (integration/sampling/verify.py, kernels/seeded_verify_coins.py):
the same values as SGLang's ``_verify_coins``, its switch, and that the rebound ``eagle_sample`` calls it. On CPU
the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py)."""

from types import SimpleNamespace

import pytest
import torch

from sglang_detspec.integration.sampling import verify
from sglang_detspec.integration.setup.verify_coins_switch import VERIFY_COINS_KERNEL_ENV, verify_coins_kernel_wanted
from sglang_detspec.stream import reference

# The kernel runs on CUDA tensors, and on CPU ones only under the Triton interpreter (the CPU runs of this file).
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _call(wrapper, seed):
    seq_lens = torch.tensor([5, 2**31 - 1, 123], dtype=torch.int64, device=DEV)
    info = SimpleNamespace(sampling_seed=None if seed is None else seed.to(DEV))
    return wrapper(sampling_info=info, seq_lens=seq_lens, draft_token_num=4,
                   candidates=torch.zeros(3, 4, dtype=torch.int64, device=DEV), device=DEV), seq_lens.cpu()


def test_seeded_coins_come_from_the_kernel_with_the_reference_values():
    calls = []
    wrapper = verify._one_launch_coins(lambda **kw: calls.append(kw))
    seed = torch.tensor([42, -7, 2**62], dtype=torch.int64)
    (coins, final), seq_lens = _call(wrapper, seed)
    ref_coins, ref_final = reference.seeded_verify_coins(seed, seq_lens, 4)
    assert calls == []  # SGLang's function was not called
    assert torch.equal(coins.cpu().view(torch.int32), ref_coins.view(torch.int32))
    assert torch.equal(final.cpu().view(torch.int32), ref_final.view(torch.int32))


def test_unseeded_batches_keep_sglangs_function():
    calls = []
    wrapper = verify._one_launch_coins(lambda **kw: calls.append(kw) or "sglang's")
    result, _ = _call(wrapper, None)
    assert result == "sglang's" and len(calls) == 1 and calls[0]["draft_token_num"] == 4


def test_the_switch_is_strict():
    assert verify_coins_kernel_wanted({}) is True
    assert verify_coins_kernel_wanted({VERIFY_COINS_KERNEL_ENV: "0"}) is False
    with pytest.raises(Exception, match=f"{VERIFY_COINS_KERNEL_ENV}='on'.*Use '1' / unset"):
        verify_coins_kernel_wanted({VERIFY_COINS_KERNEL_ENV: "on"})


@pytest.mark.parametrize("value, rebound", [("", True), ("0", False)])
def test_the_rebound_eagle_sample_calls_the_kernel_unless_switched_off(monkeypatch, value, rebound):
    pytest.importorskip("sglang")
    from sglang.srt.speculative import eagle_utils

    monkeypatch.setenv(VERIFY_COINS_KERNEL_ENV, value)
    verify._rebound_eagle_sample.cache_clear()
    try:
        coins = verify._rebound_eagle_sample().__globals__["_verify_coins"]
    finally:
        verify._rebound_eagle_sample.cache_clear()
    assert (coins is not eagle_utils._verify_coins) is rebound
    assert (coins.__name__ == "verify_coins") is rebound


@pytest.mark.skipif(not torch.cuda.is_available(), reason="SGLang's coins on the GPU (on CPU test_single_layer_verify "
                                                          "compares them with the reference)")
@pytest.mark.parametrize("draft_tokens", [1, 2, 4, 8])
def test_on_the_gpu_the_kernel_equals_sglangs_own_coins(draft_tokens):
    pytest.importorskip("sglang")
    from sglang.srt.speculative import eagle_utils

    g = torch.Generator().manual_seed(draft_tokens)
    seeds = torch.cat([torch.randint(-(2**63), 2**63 - 1, (509,), generator=g, dtype=torch.int64),
                       torch.tensor([0, -1, 42, 67_420_212], dtype=torch.int64)]).cuda()
    seq_lens = torch.cat([torch.randint(0, 2**31 - 1, (509,), generator=g, dtype=torch.int64),
                          torch.tensor([1, 2, 3, 7], dtype=torch.int64)]).cuda()
    info = SimpleNamespace(sampling_seed=seeds)
    kwargs = dict(sampling_info=info, seq_lens=seq_lens, draft_token_num=draft_tokens,
                  candidates=torch.zeros(seeds.shape[0], draft_tokens, dtype=torch.int64, device="cuda"),
                  device=seeds.device)
    calls = []
    want = eagle_utils._verify_coins(**kwargs)
    got = verify._one_launch_coins(lambda **kw: calls.append(kw))(**kwargs)
    assert calls == [], "the kernel ran, not SGLang's function"
    for w, x in zip(want, got):
        assert w.shape == x.shape and w.dtype == x.dtype
        assert torch.equal(w.view(torch.int32), x.view(torch.int32))
