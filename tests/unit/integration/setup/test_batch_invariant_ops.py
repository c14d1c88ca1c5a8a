"""The plugin's batch-invariant GEMM and residual RMSNorm inside SGLang's deterministic mode, on CPU.

SGLang's own functions run here: ``matmul_persistent``'s callers (``mm_batch_invariant``, ``addmm_batch_invariant``)
and ``RMSNorm.forward_cuda``, with the plugin's hooks applied by ``HookRegistry`` as the plugin loader does; the
plugin's kernels run under the Triton interpreter. What cannot run on CPU is SGLang's ``enable_batch_invariant_mode``
(it registers CUDA kernels): its flag is set by hand, and the GPU E2E tests cover the real start-up.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_detspec.integration.setup import algorithm
from sglang_detspec.integration.setup import batch_invariant_ops as bio
from sglang_detspec.integration.setup.algorithm import DetspecSpecAlgo
from sglang_detspec.kernels.batch_invariant_gemm import matmul, matmul_reference
from sglang_detspec.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_reference


@pytest.fixture(autouse=True)
def detspec_algorithms_registered():
    algorithm.register_algorithms()


@pytest.fixture
def active(hooks_applied):
    bio._set_active(True)
    yield
    bio._set_active(False)


def _operands(m=5, k=96, n=48, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    return a, w


# ---------------------------------------------------------------------------------------------------------------
# Which servers


@pytest.mark.parametrize("value, expected", [(None, "auto"), ("", "auto"), ("auto", "auto"), ("sglang", "sglang"),
                                             ("all", "all")])
def test_ops_choice_values(value, expected):
    env = {} if value is None else {bio.OPS_ENV: value}
    assert bio.ops_choice(env) == expected


@pytest.mark.parametrize("bad", ["1", "on", "SGLANG", "plugin", " auto"])
def test_ops_choice_refuses_anything_else_naming_the_variable(bad):
    with pytest.raises(ValueError, match=f"{bio.OPS_ENV}={bad!r} is not an allowed value.*'sglang'"):
        bio.ops_choice({bio.OPS_ENV: bad})


def test_plugin_ops_are_wanted_on_detspec_and_the_token_id_reference_server_only():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    detspec = SpeculativeAlgorithm.from_string("DETSPEC_EAGLE")
    eagle = SpeculativeAlgorithm.from_string("EAGLE")
    none = SpeculativeAlgorithm.from_string(None)
    assert isinstance(detspec, DetspecSpecAlgo)
    assert bio.plugin_ops_wanted(detspec, False, "auto")
    assert bio.plugin_ops_wanted(none, True, "auto"), "the token-id reference server computes as DETSPEC does"
    assert not bio.plugin_ops_wanted(none, False, "auto") and not bio.plugin_ops_wanted(eagle, False, "auto")
    assert not bio.plugin_ops_wanted(detspec, True, "sglang")
    assert bio.plugin_ops_wanted(eagle, False, "all") and bio.plugin_ops_wanted(none, False, "all")


# ---------------------------------------------------------------------------------------------------------------
# The GEMM: SGLang's batch-invariant aten kernels reach the plugin's matmul


def test_sglang_mm_and_addmm_run_the_plugin_gemm_when_active(active):
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as sgl

    a, w = _operands()
    bias = torch.randn(w.shape[0]).to(torch.bfloat16)
    out = sgl.mm_batch_invariant(a, w.t())
    assert torch.equal(out, matmul(a, w.t()))
    torch.testing.assert_close(out.float(), matmul_reference(a, w.t()).float(), rtol=2e-2, atol=2e-2)
    with_bias = sgl.addmm_batch_invariant(bias, a, w.t())
    assert torch.equal(with_bias, matmul(a, w.t(), bias=bias))


def test_gemm_routing_keeps_sglangs_kernel_where_the_plugin_does_not_apply(hooks_applied):
    calls = []

    def sglang_kernel(a, b, bias=None):
        calls.append((a.dtype, a.dim()))
        return "sglang"

    a, w = _operands()
    assert bio.around_matmul_persistent(sglang_kernel, a, w.t()) == "sglang", "inactive: SGLang's kernel"
    bio._set_active(True)
    try:
        assert bio.around_matmul_persistent(sglang_kernel, a.float(), w.float().t()) == "sglang", "fp32: SGLang's"
        a8, w8 = a.to(torch.float16), w.to(torch.bfloat16)
        assert bio.around_matmul_persistent(sglang_kernel, a8, w8.t()) == "sglang", "mixed dtypes: SGLang's"
        out = bio.around_matmul_persistent(sglang_kernel, a, w.t())
        assert isinstance(out, torch.Tensor) and torch.equal(out, matmul(a, w.t()))
    finally:
        bio._set_active(False)
    assert calls == [(torch.bfloat16, 2), (torch.float32, 2), (torch.float16, 2)]


# ---------------------------------------------------------------------------------------------------------------
# The residual RMSNorm: SGLang's RMSNorm.forward_cuda reaches the fused kernel in the plain case


def _norm(hidden=64, **kw):
    from sglang.srt.layers.layernorm import RMSNorm

    norm = RMSNorm(hidden, eps=1e-6, **kw)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, hidden))
    return norm.to(torch.bfloat16)


def test_sglang_rmsnorm_with_residual_runs_the_fused_kernel_when_active(active):
    norm = _norm()
    g = torch.Generator().manual_seed(1)
    x, res = (torch.randn(3, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    out, new_res = norm.forward_cuda(x, res)
    want_out, want_res = fused_add_rms_norm(x, res, norm.weight.data, norm.variance_epsilon)
    assert torch.equal(out, want_out) and torch.equal(new_res, want_res)
    ref_out, ref_res = fused_add_rms_norm_reference(x, res, norm.weight.data, norm.variance_epsilon)
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(new_res, ref_res), "the residual sum is one rounding of x + residual"
    three_d = norm.forward_cuda(x.view(1, 3, 64), res.view(1, 3, 64))
    assert three_d[0].shape == (1, 3, 64) and torch.equal(three_d[0].view(3, 64), out)


@pytest.mark.parametrize("case", ["no residual", "post residual addition", "cast before weight", "fp32 residual",
                                  "variance override", "fp32 input"])
def test_rmsnorm_routing_keeps_sglangs_path_outside_the_plain_residual_case(case, active):
    kw = {"cast before weight": dict(cast_x_before_out_mul=True), "fp32 residual": dict(fp32_residual=True),
          "variance override": dict(var_hidden_size=32)}.get(case, {})
    norm = _norm(**kw)
    x = res = torch.ones(2, 64, dtype=torch.bfloat16)
    post = None
    if case == "no residual":
        res = None
    elif case == "post residual addition":
        post = torch.ones(2, 64, dtype=torch.bfloat16)
    elif case == "fp32 input":
        x = res = torch.ones(2, 64)
    calls = []
    result = bio.around_rms_norm_forward_cuda(lambda *a, **k: calls.append(a) or "sglang", norm, x, res, post)
    assert result == "sglang" and len(calls) == 1


# ---------------------------------------------------------------------------------------------------------------
# Start-up: the choice, the self-check and the log line


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from sglang.srt.layers.linear import ReplicatedLinear

        self.proj = ReplicatedLinear(32, 48, bias=False, params_dtype=torch.bfloat16)
        self.lm_head = types.SimpleNamespace()  # not a module: skipped
        self.norm = torch.nn.LayerNorm(32)


def test_linear_weights_lists_each_gemm_shape_once():
    model = _Model()
    model.proj2 = type(model.proj)(32, 48, bias=False, params_dtype=torch.bfloat16)  # the same shape again
    weights = bio.linear_weights(model)
    assert len(weights) == 1 and weights[0].shape == (48, 32) and weights[0].dtype == torch.bfloat16


def _runner(spec_algorithm, model):
    return types.SimpleNamespace(spec_algorithm=spec_algorithm, model=model, is_draft_worker=False)


@pytest.fixture
def published():
    """SGLang's runtime config as a scheduler process has it (the hook reads --rl-on-policy-target from it)."""
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import ServerArgs

    def publish_args(**kw):
        publish(ServerArgs(model_path="dummy", device="cpu", **kw), role="scheduler")

    publish_args()
    yield publish_args
    reset_context()


def _enable(monkeypatch):
    """What SGLang's enable_batch_invariant_mode does that matters here (the CUDA registration cannot run on CPU)."""
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as sgl

    def original(model_runner):
        monkeypatch.setattr(sgl, "_batch_invariant_MODE", True)

    return original


def test_enable_hook_activates_the_plugin_ops_and_logs_the_self_check(hooks_applied, published, monkeypatch, caplog):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    monkeypatch.setattr(bio, "SELF_CHECK_MAX_M", 24)
    monkeypatch.setattr(torch, "mm", lambda a, b: matmul(a, b))  # aten::mm as SGLang's deterministic mode routes it
    monkeypatch.delenv(bio.OPS_ENV, raising=False)
    caplog.set_level("INFO")
    bio.around_enable_batch_invariant_mode(_enable(monkeypatch),
                                           _runner(SpeculativeAlgorithm.from_string("DETSPEC_EAGLE"), _Model()))
    assert bio.plugin_ops_active()
    assert "batch-invariant ops (SGLANG_DETSPEC_OPS=auto)" in caplog.text and "1 weight shapes" in caplog.text


@pytest.mark.parametrize("env, split", [(None, True), ("1", True), ("0", False)])
def test_enable_hook_applies_the_split_k_switch_and_logs_the_splits(hooks_applied, published, monkeypatch, caplog,
                                                                     env, split):
    """SGLANG_DETSPEC_GEMM_SPLIT_K=0 empties the kernels' SPLIT_K_TABLE in the server process (another reduction, so it
    must happen before the first launch: here, before the self-check); 1 / unset keeps the table."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_detspec.kernels import batch_invariant_gemm as gemm

    monkeypatch.setattr(gemm, "SPLIT_K_TABLE", {(96, 48): 2})
    monkeypatch.setattr(bio, "SELF_CHECK_MAX_M", 24)
    monkeypatch.setattr(torch, "mm", lambda a, b: matmul(a, b))  # aten::mm as SGLang's deterministic mode routes it
    monkeypatch.delenv(bio.OPS_ENV, raising=False)
    if env is None:
        monkeypatch.delenv(bio.GEMM_SPLIT_K_ENV, raising=False)
    else:
        monkeypatch.setenv(bio.GEMM_SPLIT_K_ENV, env)
    seen = []
    real_check = bio.self_check_gemm
    monkeypatch.setattr(bio, "self_check_gemm", lambda *a, **kw: (seen.append(dict(gemm.SPLIT_K_TABLE)),
                                                                  real_check(*a, **kw))[1])
    caplog.set_level("INFO")
    bio.around_enable_batch_invariant_mode(_enable(monkeypatch),
                                           _runner(SpeculativeAlgorithm.from_string("DETSPEC_EAGLE"), _Model()))
    assert seen == [{(96, 48): 2} if split else {}]
    assert ("K splits (K x N): 96x48 in 2." if split else
            f"K splits (K x N): none ({bio.GEMM_SPLIT_K_ENV}=0).") in caplog.text


def test_enable_hook_leaves_sglangs_ops_on_other_servers(hooks_applied, published, monkeypatch, caplog):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    monkeypatch.delenv(bio.OPS_ENV, raising=False)
    monkeypatch.delenv("SGLANG_DETSPEC_TOKEN_ID_SAMPLER", raising=False)
    caplog.set_level("INFO")
    bio.around_enable_batch_invariant_mode(_enable(monkeypatch),
                                           _runner(SpeculativeAlgorithm.from_string("EAGLE"), _Model()))
    assert not bio.plugin_ops_active() and "SGLang's own batch-invariant kernels" in caplog.text
    monkeypatch.setenv(bio.OPS_ENV, "sglang")
    bio.around_enable_batch_invariant_mode(_enable(monkeypatch),
                                           _runner(SpeculativeAlgorithm.from_string("DETSPEC_EAGLE"), _Model()))
    assert not bio.plugin_ops_active(), "SGLANG_DETSPEC_OPS=sglang turns the plugin's kernels off"


def test_enable_hook_keeps_sglangs_ops_for_an_rl_on_policy_target(hooks_applied, published, monkeypatch, caplog):
    """--rl-on-policy-target matches SGLang's deterministic numbers to a trainer's: the plugin must not change them."""
    from sglang.srt.runtime_context import reset_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    monkeypatch.delenv(bio.OPS_ENV, raising=False)
    reset_context()
    published(rl_on_policy_target="fsdp")
    caplog.set_level("INFO")
    bio.around_enable_batch_invariant_mode(_enable(monkeypatch),
                                           _runner(SpeculativeAlgorithm.from_string("DETSPEC_EAGLE"), _Model()))
    assert not bio.plugin_ops_active() and "--rl-on-policy-target fsdp" in caplog.text


def test_enable_hook_does_nothing_outside_deterministic_mode(hooks_applied):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bio.around_enable_batch_invariant_mode(lambda mr: None,
                                           _runner(SpeculativeAlgorithm.from_string("DETSPEC_EAGLE"), _Model()))
    assert not bio.plugin_ops_active()


def test_self_check_passes_the_plugin_gemm():
    weights = [_operands(k=96, n=48)[1], _operands(k=64, n=16)[1]]
    assert bio.self_check_gemm(weights, mm=matmul, max_m=20) > 0


def test_self_check_refuses_a_gemm_whose_reduction_depends_on_m():
    """A deliberately M-dependent reduction (below 8 rows, K folded in 32-wide slices whose partial sums are rounded
    to bfloat16, as a split-K chosen by M might) must stop the server."""

    def m_dependent(a, b):
        if a.shape[0] >= 8:
            return (a.float() @ b.float()).to(a.dtype)
        acc = torch.zeros(a.shape[0], b.shape[1])
        for k0 in range(0, a.shape[1], 32):
            acc = (acc + a[:, k0:k0 + 32].float() @ b[k0:k0 + 32].float()).to(a.dtype).float()
        return acc.to(a.dtype)

    weights = [_operands(k=96, n=48)[1]]
    with pytest.raises(bio.BatchVarianceError, match=r"weight shape K=96 x N=48 .*SGLANG_DETSPEC_OPS=sglang"):
        bio.self_check_gemm(weights, mm=m_dependent, max_m=20)


# ---------------------------------------------------------------------------------------------------------------
# The speculation-invariant draft on cuBLAS (SGLANG_DETSPEC_FAST_INVARIANT_DRAFT)


def test_sglang_gemms_inside_fast_kernels_skip_every_batch_invariant_kernel(active, monkeypatch):
    """Even with the plugin's ops active, SGLang's mm / addmm compute with aten::addmm.out inside the region; the
    plugin's GEMM runs again after it."""
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as sgl

    from sglang_detspec.kernels import batch_invariant_gemm

    a, w = _operands()
    bias = torch.randn(w.shape[0]).to(torch.bfloat16)

    def must_not_run(*args, **kwargs):
        raise AssertionError("a batch-invariant GEMM ran inside fast_kernels()")

    with monkeypatch.context() as patch:
        patch.setattr(batch_invariant_gemm, "matmul", must_not_run)
        with bio.fast_kernels():
            assert bio.fast_kernels_active()
            out = sgl.mm_batch_invariant(a, w.t())
            with_bias = sgl.addmm_batch_invariant(bias, a, w.t())
    assert not bio.fast_kernels_active()
    reference = matmul_reference(a, w.t()).float()
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(with_bias.float(), reference + bias.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(sgl.mm_batch_invariant(a, w.t()), matmul(a, w.t())), "after the region: the plugin's GEMM"


class _ForwardProbe(torch.nn.Module):
    """Records, at each forward, whether it ran inside fast_kernels()."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(bio.fast_kernels_active())
        return x


def _draft_runner(name, model, is_draft=True):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return types.SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.from_string(name), model=model,
                                 is_draft_worker=is_draft)


def test_the_invariant_draft_runs_every_forward_on_fast_kernels(hooks_applied, published, monkeypatch, caplog):
    monkeypatch.setenv(bio.FAST_DRAFT_ENV, "1")
    caplog.set_level("INFO")
    draft = _ForwardProbe()
    bio.around_enable_batch_invariant_mode(_enable(monkeypatch), _draft_runner("DETSPEC_EAGLE_INVARIANT", draft))
    draft(torch.zeros(1))
    draft.forward(torch.zeros(1))  # SGLang's runners and graph capture call model.forward directly
    assert draft.seen == [True, True] and not bio.fast_kernels_active()
    assert "DETSPEC_EAGLE_INVARIANT draft computes its GEMMs with cuBLAS" in caplog.text


@pytest.mark.parametrize("name, is_draft, env", [
    ("DETSPEC_EAGLE", True, "1"),  # its draft's q decides the tokens: stays batch-invariant, with a warning
    ("DETSPEC_EAGLE_INVARIANT", False, "1"),  # the target never leaves the batch-invariant kernels
    ("DETSPEC_EAGLE_INVARIANT", True, None),  # opt-in only
])
def test_every_other_model_keeps_the_batch_invariant_kernels(hooks_applied, published, monkeypatch, caplog, name,
                                                             is_draft, env):
    if env is None:
        monkeypatch.delenv(bio.FAST_DRAFT_ENV, raising=False)
    else:
        monkeypatch.setenv(bio.FAST_DRAFT_ENV, env)
    caplog.set_level("INFO")
    model = _ForwardProbe()
    bio.around_enable_batch_invariant_mode(_enable(monkeypatch), _draft_runner(name, model, is_draft))
    model(torch.zeros(1))
    assert model.seen == [False]
    if name == "DETSPEC_EAGLE":
        assert f"{bio.FAST_DRAFT_ENV}=1 is ignored on this DETSPEC_EAGLE server" in caplog.text
