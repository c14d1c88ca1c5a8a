"""The pure-torch reference vs SGLang 0.5.23's own code, and its contract.

SGLang's ``murmur_hash32`` needs ``sgl_kernel``'s CPU op on CPU tensors, which cannot load on a GPU-less
machine; the tests then run SGLang's own Triton hash kernel (``murmur_hash32_kernel``) under
TRITON_INTERPRET=1 and feed its output through SGLang's own ``fast_sample`` / ``_seeded_verify_coins``
(by substituting the CPU dispatch of ``murmur_hash32`` with that kernel).  They skip, with the reason,
where a module or function does not exist in the installed SGLang (0.5.17 has no seeded draft path).
"""

import importlib

import pytest
import torch

from sglang_detspec.stream import keys, reference


def _sglang_triton_hash():
    """SGLang's Triton MurmurHash3 kernel run on CPU tensors under the interpreter, or a skip reason."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("SGLang's Triton hash needs TRITON_INTERPRET=1 (set by tests/conftest.py without a GPU)")
    try:
        mh = importlib.import_module("sglang.kernels.ops.sampling.murmur_hash")
    except Exception as e:  # pragma: no cover - depends on the installed sglang
        pytest.skip(f"sglang.kernels.ops.sampling.murmur_hash not importable: {type(e).__name__}: {e}")
    import triton

    def murmur_hash32(seed, positions, col_indices):
        try:  # the real CPU op first (works where sgl_kernel loads)
            import sgl_kernel  # noqa: F401

            return torch.ops.sgl_kernel.murmur_hash32_cpu.default(seed, positions, col_indices)
        except Exception:
            pass
        n, m = seed.shape[0], col_indices.shape[0]
        out = torch.empty((n, m), dtype=torch.uint32, device=seed.device)
        mh.murmur_hash32_kernel[(n, triton.cdiv(m, 1024))](seed, positions, col_indices, out, n, m, BLOCK_SIZE=1024)
        return out

    return mh, murmur_hash32


def _as_int64(u32: torch.Tensor) -> torch.Tensor:
    return u32.to(torch.int64) & 0xFFFFFFFF


def test_reference_hash_equals_sglang_hash_kernel():
    _, mh32 = _sglang_triton_hash()
    g = torch.Generator().manual_seed(3)
    seeds = torch.randint(-(2**63), 2**63 - 1, (6,), generator=g)
    seeds[0] = -1
    seeds[1] = 2**63 - 1
    pos = torch.randint(0, 2**40, (6,), generator=g)
    for step, vocab in [(0, 777), (5, 1031)]:
        cols = torch.arange(step * vocab, step * vocab + vocab, dtype=torch.int64)
        want = _as_int64(mh32((seeds + keys.DRAFT_SEED_SALT).to(torch.uint64), pos.to(torch.uint64), cols))
        got = reference.murmur3_draft_hash(seeds, pos, step, vocab)
        assert torch.equal(got, want)


def test_reference_equals_sglang_fast_sample(monkeypatch):
    mh, mh32 = _sglang_triton_hash()
    try:
        spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
    except Exception as e:
        pytest.skip(f"sglang.srt.speculative.spec_utils not importable on this machine: {type(e).__name__}: {e}")
    import inspect

    if "draft_step" not in inspect.signature(spec_utils.fast_sample).parameters:
        pytest.skip("this SGLang's fast_sample has no seeded draft path (added in 0.5.23)")
    assert spec_utils._DRAFT_GUMBEL_SEED_SALT == keys.DRAFT_SEED_SALT
    monkeypatch.setattr(mh, "murmur_hash32", mh32)  # fast_sample imports it from the module at call time
    g = torch.Generator().manual_seed(11)
    for B, V, step, temp in [(5, 997, 0, 1.0), (4, 2048, 3, 0.3), (3, 1500, 1, 3.0)]:
        probs = torch.softmax(torch.randn(B, V, generator=g) * 3 / temp, -1)
        seeds = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
        pos = torch.randint(0, 2**40, (B,), generator=g)
        p_up, i_up = spec_utils.fast_sample(probs, 1, sampling_seed=seeds, positions=pos, draft_step=step)
        p_ref, i_ref = reference.seeded_draft_sample(probs, seeds, pos, step)
        assert torch.equal(i_ref, i_up)
        assert torch.equal(p_ref, p_up)


def test_reference_verify_coins_equal_sglang(monkeypatch):
    mh, mh32 = _sglang_triton_hash()
    try:
        eagle_utils = importlib.import_module("sglang.srt.speculative.eagle_utils")
    except Exception as e:
        pytest.skip(f"sglang.srt.speculative.eagle_utils not importable on this machine: {type(e).__name__}: {e}")
    fn = getattr(eagle_utils, "_seeded_verify_coins", None)
    if fn is None:
        pytest.skip("this SGLang has no _seeded_verify_coins")
    monkeypatch.setattr(mh, "murmur_hash32", mh32)
    seeds = torch.tensor([42, -1, 2**63 - 1, -(2**63), 123456789], dtype=torch.int64)
    seq_lens = torch.tensor([0, 7, 2**32 + 5, 100000, 31], dtype=torch.int64)
    for n in (1, 4, 8):
        want = fn(sampling_seed=seeds, seq_lens=seq_lens, draft_token_num=n, device="cpu")
        got = reference.seeded_verify_coins(seeds, seq_lens, n)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert got[0].dtype == torch.float32 and got[0].shape == (5, n) and got[1].shape == (5,)


def test_verify_coins_clamp_below_one():
    # find a key whose unsalted hash rounds to 1.0 in float32 (top 129 hash values): search columns
    seeds = torch.arange(-2000, 2000, dtype=torch.int64)
    lens = torch.arange(4000, dtype=torch.int64)
    h = reference.murmur3_unsalted_hash(seeds, lens, torch.arange(64))
    assert int(h.max()) > 2**32 - 1 - (1 << 20)  # sanity: the search space reaches the top of the range
    coins, final = reference.seeded_verify_coins(seeds, lens, 63)
    assert float(coins.max()) <= keys.VERIFY_MAX_COIN and float(final.max()) <= keys.VERIFY_MAX_COIN


def test_reference_argmax_semantics_for_degenerate_rows():
    V = 300
    probs = torch.softmax(torch.randn(5, V), -1)
    probs[0].zero_()
    probs[1, 50] = float("nan")
    probs[1, 200] = float("nan")
    probs[2].zero_()
    probs[2, 299] = 1e-45
    seeds = torch.tensor([1, 2, 3, 4, 5])
    pos = torch.tensor([10, 11, 12, 13, 14])
    p, i = reference.seeded_draft_sample(probs, seeds, pos, 0)
    assert i[0, 0] == 0  # all-zero row: token 0
    assert i[1, 0] == 50  # first NaN
    assert i[2, 0] == 299  # the only positive probability
    assert torch.isnan(p[1, 0])
    greedy = torch.tensor([False, False, False, True, True])
    _, ig = reference.seeded_draft_sample(probs, seeds, pos, 0, greedy=greedy)
    assert torch.equal(ig[3:, 0], probs[3:].argmax(-1))
    assert torch.equal(ig[:3], i[:3])


def test_reference_validation_errors():
    probs = torch.rand(2, 10)
    s = torch.tensor([1, 2])
    p = torch.tensor([3, 4])
    with pytest.raises(ValueError, match="matching shapes"):
        reference.seeded_draft_sample(probs, s, p[:1])
    with pytest.raises(ValueError, match="one value per probability row"):
        reference.seeded_draft_sample(probs[:1], s, p)
    with pytest.raises(ValueError, match="int64"):
        reference.seeded_draft_sample(probs, s.int(), p)
    with pytest.raises(ValueError, match="float32"):
        reference.seeded_draft_sample(probs.double(), s, p)
    with pytest.raises(ValueError, match="non-negative"):
        reference.seeded_draft_sample(probs, s, p, -1)
    with pytest.raises(ValueError, match="uint32"):
        reference.seeded_draft_sample(probs, s, p, 2**32 // 10)
