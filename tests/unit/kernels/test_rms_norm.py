"""The fused residual add + RMSNorm kernel (kernels/rms_norm.py) vs its pure-torch reference, SGLang's
``RMSNorm.forward_native`` operations (0.5.17 layernorm.py), and its row invariance.

On CPU the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py).  The new residual is a sum of two or three
values rounded once, so it must match bit for bit; the normalised output goes through a sum of squares whose
order differs from torch's, so it must match within one rounding of the output dtype (and mostly exactly).
torch and Triton only: never imports SGLang.
"""

import pytest
import torch

from sglang_detspec.kernels import launch_checks
from sglang_detspec.kernels import rms_norm as rms_norm_module
from sglang_detspec.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(shape, dtype=torch.bfloat16, residual_dtype=None, weight_dtype=None, with_post=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = shape[-1]
    x = (torch.randn(shape, generator=g) * 2).to(dtype).to(DEV)
    residual = torch.randn(shape, generator=g).to(residual_dtype or dtype).to(DEV)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(weight_dtype or dtype).to(DEV)
    post = torch.randn(shape, generator=g).to(dtype).to(DEV) if with_post else None
    return x, residual, weight, post


def _assert_matches_reference(got, want):
    out, new_residual = got
    want_out, want_residual = want
    assert out.dtype == want_out.dtype and out.shape == want_out.shape
    assert new_residual.dtype == want_residual.dtype and new_residual.shape == want_residual.shape
    assert torch.equal(new_residual.cpu(), want_residual.cpu())
    # one rounding of the output dtype apart at most (the fp32 variance may differ in its last bits)
    eps = torch.finfo(out.dtype).eps
    torch.testing.assert_close(out.cpu().float(), want_out.cpu().float(), rtol=eps, atol=1e-6)
    assert (out.cpu() == want_out.cpu()).float().mean() > 0.98


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "shape,residual_dtype,weight_dtype,with_post,fp32_residual",
    [
        ((1, 64), None, None, False, False),
        ((7, 100), None, None, False, False),  # H not a power of two: a masked tail
        ((5, 256), None, torch.float32, True, False),  # fp32 weight, post_residual_addition
        ((3, 1000), torch.float32, None, False, True),  # fp32 residual in and out (RMSNorm(fp32_residual=True))
        ((2, 3, 48), None, None, False, False),  # leading dimensions
    ],
)
def test_kernel_matches_forward_native(dtype, shape, residual_dtype, weight_dtype, with_post, fp32_residual):
    x, residual, weight, post = _inputs(shape, dtype, residual_dtype, weight_dtype, with_post, seed=sum(shape))
    kwargs = dict(post_residual_addition=post, fp32_residual=fp32_residual)
    x_before, residual_before = x.clone(), residual.clone()
    got = fused_add_rms_norm(x, residual, weight, 1e-6, **kwargs)
    _assert_matches_reference(got, fused_add_rms_norm_reference(x, residual, weight, 1e-6, **kwargs))
    assert got[0].dtype == dtype
    assert got[1].dtype == (torch.float32 if fp32_residual else dtype)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # not in place


def test_reference_is_forward_natives_arithmetic():
    """The reference, written out for one row with explicit float32 scalars (SGLang's forward_native order)."""
    x = torch.tensor([[1.5, -2.0, 0.25, 3.0]], dtype=torch.bfloat16)
    residual = torch.tensor([[0.5, 1.0, -0.25, 1.0]], dtype=torch.bfloat16)
    weight = torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.bfloat16)
    out, new_residual = fused_add_rms_norm_reference(x, residual, weight, 1e-6)
    s = [2.0, -1.0, 0.0, 4.0]
    assert new_residual.tolist() == [s]
    rstd = 1 / ((4 + 1 + 0 + 16) / 4 + 1e-6) ** 0.5
    want = torch.tensor([[v * rstd * w for v, w in zip(s, [1.0, 2.0, 0.5, -1.0])]]).to(torch.bfloat16)
    assert torch.equal(out, want)


def test_cast_before_weight_matches_forward_native():
    # float16 here: the interpreter truncates bfloat16 casts, so the wrapper refuses that one on CPU (next test)
    x, residual, weight, _ = _inputs((6, 96), torch.float16, seed=4)
    got = fused_add_rms_norm(x, residual, weight, 1e-5, cast_x_before_out_mul=True)
    _assert_matches_reference(got, fused_add_rms_norm_reference(x, residual, weight, 1e-5, cast_x_before_out_mul=True))


@pytest.mark.skipif(DEV == "cuda", reason="interpreter-only refusal")
def test_cast_before_weight_in_bfloat16_is_refused_under_the_interpreter():
    x, residual, weight, _ = _inputs((2, 32), torch.bfloat16)
    with pytest.raises(ValueError, match="cannot run under TRITON_INTERPRET=1.*fused_add_rms_norm_reference"):
        fused_add_rms_norm(x, residual, weight, 1e-5, cast_x_before_out_mul=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rows_wider_than_one_chunk_loop_in_two_passes(monkeypatch, dtype):
    monkeypatch.setattr(rms_norm_module, "MAX_BLOCK", 32)
    x, residual, weight, post = _inputs((4, 100), dtype, with_post=True, seed=5)
    got = fused_add_rms_norm(x, residual, weight, 1e-6, post_residual_addition=post)
    want = fused_add_rms_norm_reference(x, residual, weight, 1e-6, post_residual_addition=post)
    _assert_matches_reference(got, want)


def test_strided_rows_give_the_contiguous_result():
    x, residual, weight, _ = _inputs((6, 64), seed=6)
    wide_x = torch.zeros(12, 80, dtype=x.dtype, device=DEV)
    wide_x[::2, 8:72] = x
    got = fused_add_rms_norm(wide_x[::2, 8:72], residual, weight, 1e-6)
    want = fused_add_rms_norm(x.contiguous(), residual, weight, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    got_t = fused_add_rms_norm(x.t().contiguous().t(), residual, weight, 1e-6)  # column-major: copied first
    assert torch.equal(got_t[0], want[0])


@pytest.mark.parametrize("hidden", [64, 300])
def test_rows_are_bit_identical_whatever_the_batch(hidden):
    x, residual, weight, _ = _inputs((24, hidden), seed=hidden)
    full_out, full_res = fused_add_rms_norm(x, residual, weight, 1e-6)
    for rows in (1, 2, 5, 16, 23):
        out, res = fused_add_rms_norm(x[:rows], residual[:rows], weight, 1e-6)
        assert torch.equal(out.view(torch.int16), full_out[:rows].view(torch.int16)), rows
        assert torch.equal(res.view(torch.int16), full_res[:rows].view(torch.int16)), rows
    # and a row's result does not depend on its neighbours' values
    shuffled = torch.randperm(24, generator=torch.Generator().manual_seed(0)).to(DEV)
    out, _ = fused_add_rms_norm(x[shuffled], residual[shuffled], weight, 1e-6)
    assert torch.equal(out, full_out[shuffled])


def test_empty_batch():
    x, residual, weight, _ = _inputs((0, 64))
    out, res = fused_add_rms_norm(x, residual, weight, 1e-6)
    assert out.shape == (0, 64) and res.shape == (0, 64)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda x, r, w: (x.float(), r, w, 1e-6), "x must be a bfloat16 or float16 tensor"),
        (lambda x, r, w: (x, r[:, :-1], w, 1e-6), r"residual must have x's shape \(3, 32\)"),
        (lambda x, r, w: (x, r.to(torch.int32), w, 1e-6), "residual must be bfloat16, float16 or float32"),
        (lambda x, r, w: (x, r, w[:-1], 1e-6), "weight must be a 1-D float tensor of H = 32"),
        (lambda x, r, w: (x, r, w, -1.0), "eps must be a non-negative float"),
        (lambda x, r, w: (x, r, w, float("nan")), "eps must be a non-negative float"),
    ],
)
def test_invalid_inputs_are_refused(mutate, message):
    x, residual, weight, _ = _inputs((3, 32))
    with pytest.raises(ValueError, match=message):
        fused_add_rms_norm(*mutate(x, residual, weight))


def test_cast_before_weight_needs_the_weight_in_x_dtype():
    x, residual, weight, _ = _inputs((3, 32), torch.float16, weight_dtype=torch.float32)
    with pytest.raises(ValueError, match="cast_x_before_out_mul needs weight in x's dtype"):
        fused_add_rms_norm(x, residual, weight, 1e-6, cast_x_before_out_mul=True)


def test_post_residual_addition_must_match_x():
    x, residual, weight, _ = _inputs((3, 32))
    with pytest.raises(ValueError, match=r"post_residual_addition must have x's shape"):
        fused_add_rms_norm(x, residual, weight, 1e-6, post_residual_addition=x[:2])


def test_cpu_tensors_outside_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(launch_checks, "INTERPRETED", False)
    x, residual, weight, _ = _inputs((2, 32))
    with pytest.raises(ValueError, match="needs CUDA tensors.*rms_norm.fused_add_rms_norm_reference"):
        fused_add_rms_norm(x.cpu(), residual.cpu(), weight.cpu(), 1e-6)
