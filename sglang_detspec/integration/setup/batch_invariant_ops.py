"""The plugin's batch-invariant GEMM and residual RMSNorm, installed into SGLang's deterministic mode.

Why
---
``--enable-deterministic-inference`` makes SGLang register batch-invariant kernels for ``aten::mm`` / ``addmm`` /
``mm.dtype`` (``mm.out`` on 0.5.23) through ``torch.library``; all of them call one function,
``batch_invariant_ops.matmul_persistent``, a persistent Triton GEMM with one 128 x 128 x 64 tile for every M. A decode
GEMM of 1 - 32 rows then runs a handful of programs, and its residual RMSNorm falls back to half a dozen unfused
torch ops. The plugin replaces exactly those two places:

* ``matmul_persistent`` -> :func:`sglang_detspec.kernels.batch_invariant_gemm.matmul` for 2-D bf16 / fp16 operands
  (the tile is chosen by M, the reduction over K never is); any other call (fp32, fp8, 3-D) keeps SGLang's kernel,
  decided by dtype and rank only, never by M, so a GEMM's numbers never depend on the batch;
* ``RMSNorm.forward_cuda`` with a residual in deterministic mode -> the fused row-local
  :func:`sglang_detspec.kernels.rms_norm.fused_add_rms_norm`, for the plain case (no variance override, no
  ``cast_x_before_out_mul``, no fp32 residual, no post-residual addition); every other case keeps SGLang's path.

Which servers
-------------
``SGLANG_DETSPEC_OPS`` (read when a model runner enables SGLang's batch-invariant mode, i.e. only with
``--enable-deterministic-inference``): unset or ``auto`` -- the plugin's ops on DETSPEC servers and on the token-id
reference server (``SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1``), so the invariant mode and its reference compute the same
numbers; ``sglang`` -- SGLang's own ops everywhere; ``all`` -- the plugin's ops on every deterministic server of a
process with the plugin installed (e.g. to benchmark built-in deterministic EAGLE on them). Anything else is refused.
With ``--rl-on-policy-target`` SGLang's own ops always run: their numbers are the ones matched to the trainer's.

The speculation-invariant draft on cuBLAS
----------------------------------------
``SGLANG_DETSPEC_FAST_INVARIANT_DRAFT=1`` (opt-in; its GPU check is in docs/kernels.md): on a ``DETSPEC_*_INVARIANT`` server
every forward of the draft model computes its GEMMs with cuBLAS (``aten::addmm.out``, which SGLang's deterministic
mode leaves alone on every release) instead of a batch-invariant kernel. The invariant mode's tokens are the
target's seeded race's, whatever the draft proposed (the draft only changes how many are accepted), so its draft
needs no batch invariance. The draft's attention, norms and sampling are unchanged. ``DETSPEC_EAGLE`` / ``EAGLE3``
keep their draft batch-invariant: their tokens depend on the draft's ``q``.

Start-up self-check
-------------------
After the model loads, every distinct weight shape of its linear layers and LM head runs through the installed
``torch.mm`` at a grid of M (1 - 64 each, every tile boundary +- 1, powers of two) and must give each row bit for bit
the result it has inside the largest batch; otherwise the server refuses to start, naming the shape, M and row.
CUDA graphs: both kernels are plain Triton launches, captured like SGLang's own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from sglang_detspec.integration.setup.env_switch import env_switch
from sglang_detspec.integration.setup.hooks import hook_active, register_once

logger = logging.getLogger(__name__)

__all__ = [
    "ENABLE_HOOK_TARGET",
    "MATMUL_HOOK_TARGET",
    "OPS_ENV",
    "RMS_NORM_HOOK_TARGET",
    "FAST_DRAFT_ENV",
    "GEMM_SPLIT_K_ENV",
    "BatchVarianceError",
    "around_enable_batch_invariant_mode",
    "around_matmul_persistent",
    "around_rms_norm_forward_cuda",
    "fast_draft_wanted",
    "gemm_split_k_wanted",
    "fast_kernels",
    "fast_kernels_active",
    "install_batch_invariant_ops",
    "batch_invariant_ops_hooks_active",
    "linear_weights",
    "ops_choice",
    "plugin_ops_active",
    "plugin_ops_wanted",
    "self_check_gemm",
]

OPS_ENV = "SGLANG_DETSPEC_OPS"
OPS_CHOICES = ("auto", "sglang", "all")
FAST_DRAFT_ENV = "SGLANG_DETSPEC_FAST_INVARIANT_DRAFT"
GEMM_SPLIT_K_ENV = "SGLANG_DETSPEC_GEMM_SPLIT_K"

# The same dotted paths on every release 0.5.17 - 0.5.23 (checked by the CPU tests on each).
MATMUL_HOOK_TARGET = "sglang.srt.batch_invariant_ops.batch_invariant_ops.matmul_persistent"
RMS_NORM_HOOK_TARGET = "sglang.srt.layers.layernorm.RMSNorm.forward_cuda"
ENABLE_HOOK_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode"

# The self-check's output budget per shape: M stops where the [M, N] result would pass this many elements, so a wide
# LM head does not allocate gigabytes at start-up (tests/gpu sweeps M to 8192 on every shape instead).
SELF_CHECK_MAX_OUTPUT_ELEMENTS = 64 * 1024 * 1024
SELF_CHECK_MAX_M = 8192

_active = False  # set once a model runner of this process enabled deterministic mode with the plugin's ops
_fast_depth = 0  # > 0 inside a forward that may compute its GEMMs with cuBLAS (the invariant draft's)


class BatchVarianceError(RuntimeError):
    """A weight shape whose GEMM rows change with the batch size under the installed kernels (refuses start-up)."""


def ops_choice(environ: Optional[Mapping[str, str]] = None) -> str:
    """The value of ``SGLANG_DETSPEC_OPS`` (``auto`` when unset or empty); for anything else the ``ops_choice`` refusal
    (a ``ValueError``)."""
    value = (os.environ if environ is None else environ).get(OPS_ENV, "") or "auto"
    if value not in OPS_CHOICES:
        from sglang_detspec.integration.setup.refusals import refuse

        raise refuse("ops_choice", None, value=value)
    return value


def plugin_ops_wanted(spec_algorithm: Any, token_id_sampler: bool, choice: str) -> bool:
    """Whether a deterministic model runner of this server should compute with the plugin's kernels."""
    if choice == "sglang":
        return False
    if choice == "all" or token_id_sampler:
        return True
    from sglang_detspec.integration.setup.algorithm import DetspecSpecAlgo

    return isinstance(spec_algorithm, DetspecSpecAlgo)


def fast_draft_wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``SGLANG_DETSPEC_FAST_INVARIANT_DRAFT``: True for ``1``, False for ``0`` or unset; anything else is the
    ``fast_invariant_draft`` refusal (a ``ValueError``)."""
    return env_switch(FAST_DRAFT_ENV, "fast_invariant_draft", environ)


def gemm_split_k_wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``SGLANG_DETSPEC_GEMM_SPLIT_K``: True for ``1`` or unset (the kernels' ``SPLIT_K_TABLE`` applies), False for
    ``0`` (no weight shape is split: another reduction, so other numbers than the default's, as invariant); anything
    else is the ``gemm_split_k`` refusal (a ``ValueError``)."""
    return env_switch(GEMM_SPLIT_K_ENV, "gemm_split_k", environ, default=True)


def _split_k_in_use() -> str:
    """Apply ``SGLANG_DETSPEC_GEMM_SPLIT_K`` to this process's GEMM (before its first launch) and say what is split."""
    from sglang_detspec.kernels import batch_invariant_gemm as gemm

    if not gemm_split_k_wanted():
        gemm.SPLIT_K_TABLE.clear()
        return f"none ({GEMM_SPLIT_K_ENV}=0)"
    return ", ".join(f"{k}x{n} in {s}" for (k, n), s in sorted(gemm.SPLIT_K_TABLE.items())) or "none"


@contextlib.contextmanager
def fast_kernels():
    """Within the block, ``matmul_persistent`` computes supported GEMMs with cuBLAS instead of a batch-invariant
    kernel. Under CUDA-graph capture the choice is captured with the launch."""
    global _fast_depth
    _fast_depth += 1
    try:
        yield
    finally:
        _fast_depth -= 1


def fast_kernels_active() -> bool:
    return _fast_depth > 0


def _on_fast_kernels(model: Any) -> None:
    """Run every forward of ``model`` (eager and captured; ``model(...)`` and ``model.forward(...)`` both find the
    instance attribute) inside :func:`fast_kernels`."""
    forward = model.forward

    @functools.wraps(forward)
    def fast_forward(*args: Any, **kwargs: Any) -> Any:
        with fast_kernels():
            return forward(*args, **kwargs)

    model.forward = fast_forward


def plugin_ops_active() -> bool:
    """Whether this process computes ``matmul_persistent`` and residual RMSNorm with the plugin's kernels."""
    return _active


def _set_active(value: bool) -> None:
    global _active
    _active = value


# ---------------------------------------------------------------------------------------------------------------
# The two replaced functions
# ---------------------------------------------------------------------------------------------------------------
def _gemm_supported(a: Any, b: Any, bias: Any) -> bool:
    import torch

    return (
        a.dim() == 2
        and b.dim() == 2
        and a.dtype == b.dtype
        and a.dtype in (torch.bfloat16, torch.float16)
        and (bias is None or (bias.dim() == 1 and bias.dtype == a.dtype))
    )


def _cublas_matmul(a: Any, b: Any, bias: Any) -> Any:
    """``a @ b (+ bias)`` through ``aten::addmm.out``, the GEMM SGLang's deterministic mode does not replace."""
    import torch

    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    if bias is None:
        return torch.addmm(out, a, b, beta=0, out=out)
    return torch.addmm(bias, a, b, out=out)


def around_matmul_persistent(original: Callable, a: Any, b: Any, bias: Any = None) -> Any:
    """``HookRegistry`` AROUND hook on SGLang's ``matmul_persistent(a, b, bias=None)`` (every batch-invariant GEMM)."""
    if _fast_depth and _gemm_supported(a, b, bias):
        return _cublas_matmul(a, b, bias)
    if _active and _gemm_supported(a, b, bias):
        from sglang_detspec.kernels.batch_invariant_gemm import matmul

        return matmul(a, b, bias=bias)
    return original(a, b, bias=bias)


def _plain_residual_norm(norm: Any, x: Any, residual: Any, post_residual_addition: Any, extra: Tuple, kw: Dict) -> bool:
    import torch

    return (
        residual is not None
        and post_residual_addition is None
        and all(v is None for v in extra)
        and all(v is None for v in kw.values())
        and x.dtype in (torch.bfloat16, torch.float16)
        and residual.dtype == x.dtype
        and x.numel() > 0
        and getattr(norm, "variance_size_override", None) is None
        and not getattr(norm, "cast_x_before_out_mul", False)
        and not getattr(norm, "fp32_residual", False)
        and getattr(norm, "override_orig_dtype", None) is None
        and x.shape[-1] == norm.hidden_size
    )


def around_rms_norm_forward_cuda(
    original: Callable, norm: Any, x: Any, residual: Any = None, post_residual_addition: Any = None, *extra, **kw
) -> Any:
    """``HookRegistry`` AROUND hook on ``RMSNorm.forward_cuda``: the plain residual case runs the fused kernel."""
    if _active and _plain_residual_norm(norm, x, residual, post_residual_addition, extra, kw):
        from sglang_detspec.kernels.rms_norm import fused_add_rms_norm

        shape = x.shape
        out, new_residual = fused_add_rms_norm(
            x.reshape(-1, shape[-1]), residual.reshape(-1, shape[-1]), norm.weight.data, norm.variance_epsilon
        )
        return out.reshape(shape), new_residual.reshape(shape)
    return original(norm, x, residual, post_residual_addition, *extra, **kw)


# ---------------------------------------------------------------------------------------------------------------
# Start-up: choose, install, self-check
# ---------------------------------------------------------------------------------------------------------------
def linear_weights(model: Any) -> List[Any]:
    """One weight per distinct ``(K, N, dtype, device)`` among the GEMMs ``model`` runs through ``torch.mm``: the 2-D
    bf16 / fp16 weights of its linear layers (``weight`` is ``[N, K]``, the GEMM is ``x @ weight.t()``) and LM head."""
    import torch

    seen, weights = set(), []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        if weight.dtype not in (torch.bfloat16, torch.float16):
            continue
        kind = type(module).__name__
        if "Linear" not in kind and "LMHead" not in kind and not name.endswith("lm_head"):
            continue
        key = (int(weight.shape[1]), int(weight.shape[0]), weight.dtype, weight.device)
        if key not in seen:
            seen.add(key)
            weights.append(weight.detach())
    return weights


def self_check_gemm(
    weights: Iterable[Any],
    mm: Optional[Callable] = None,
    max_m: int = SELF_CHECK_MAX_M,
    max_output_elements: int = SELF_CHECK_MAX_OUTPUT_ELEMENTS,
) -> int:
    """Raise :class:`BatchVarianceError` unless, for every served weight ``[N, K]``, each row of ``mm(a[:M], w.t())``
    equals the same row of ``mm(a, w.t())`` bit for bit over the M grid (1 - 64, every launch-table switch +- 1,
    powers of two, up to ``max_m`` or the output budget); return the number of (weight, M) pairs checked.

    ``mm`` defaults to ``torch.mm``: what the served model really dispatches to, whichever kernels are installed.
    """
    import torch

    from sglang_detspec.kernels import batch_invariant_gemm
    from sglang_detspec.kernels.row_invariance import check_weight_rows, config_switch_points, default_m_grid

    mm = torch.mm if mm is None else mm
    checked = 0
    for weight in weights:
        n, k = weight.shape
        top = max(1, min(max_m, max_output_elements // max(n, 1)))
        sms = batch_invariant_gemm._num_sms(weight.device)
        ms = default_m_grid(top, boundaries=config_switch_points(top, k, n, sms))
        found = check_weight_rows(weight, max_m=top, ms=ms, matmul_fn=lambda x, b, bias=None: mm(x, b))
        if found is not None:
            raise BatchVarianceError(
                f"sglang-detspec: the batch-invariant GEMM is not batch-invariant on weight shape K={k} x N={n} "
                f"({weight.dtype}): {found.describe()} of {top}. Refusing to serve, since a seeded request's tokens "
                f"would depend on the batch. Start the server with {OPS_ENV}=sglang (SGLang's own deterministic "
                "kernels) and report the shape."
            )
        checked += len(ms)
    return checked


def _rl_on_policy_target() -> Optional[str]:
    """``--rl-on-policy-target`` as SGLang's layers read it (the same accessor on 0.5.17 - 0.5.23)."""
    from sglang.srt.runtime_context import get_exec

    return getattr(get_exec().deterministic, "rl_on_policy_target", None)


def around_enable_batch_invariant_mode(original: Callable, model_runner: Any, *args: Any, **kwargs: Any) -> Any:
    """``HookRegistry`` AROUND hook on ``ModelRunner.maybe_enable_batch_invariant_mode`` (runs after the weights load,
    before memory pools and CUDA graphs, for the target and each draft model runner)."""
    result = original(model_runner, *args, **kwargs)
    from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled

    if not is_batch_invariant_mode_enabled():
        return result
    from sglang_detspec.integration.setup.attention_index_cache import enable_for_model_runner
    from sglang_detspec.integration.setup.token_id_sampler_opt_in import token_id_sampler_requested

    enable_for_model_runner(model_runner)  # the deterministic attention's index cache (its own switch)

    choice = ops_choice()
    _maybe_fast_draft(model_runner)
    wanted = plugin_ops_wanted(getattr(model_runner, "spec_algorithm", None), token_id_sampler_requested(), choice)
    rl_target = _rl_on_policy_target()
    if wanted and rl_target is not None:
        logger.info(
            "sglang-detspec: --rl-on-policy-target %s: SGLang's own batch-invariant kernels run on this server (their "
            "numbers are the ones matched to the trainer's), not the plugin's.", rl_target)
        wanted = False
    if not wanted:
        if not _active:
            logger.info("sglang-detspec: %s=%s: SGLang's own batch-invariant kernels run on this server.", OPS_ENV, choice)
        return result
    if not batch_invariant_ops_hooks_active():
        raise RuntimeError(
            f"sglang-detspec: the batch-invariant op hooks on {MATMUL_HOOK_TARGET} and {RMS_NORM_HOOK_TARGET} are not "
            f"applied in this process (see the HookRegistry error above); set {OPS_ENV}=sglang to serve on SGLang's own "
            "deterministic kernels."
        )
    _set_active(True)
    split_k = _split_k_in_use()
    model = getattr(model_runner, "model", None)
    weights = linear_weights(model) if model is not None else []
    import torch

    checked = self_check_gemm(weights, max_m=SELF_CHECK_MAX_M)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the check's operands are gone before SGLang sizes the KV pool
    logger.info(
        "sglang-detspec: batch-invariant ops (%s=%s): the plugin's GEMM (SGLang's aten::mm / addmm / mm.dtype "
        "kernels for 2-D bf16/fp16) and fused residual RMSNorm; SGLang's own log_softmax, mean, bmm and RMSNorm "
        "without residual. K splits (K x N): %s. Self-check: %d weight shapes of the %s model, %d (shape, M) pairs "
        "bit-identical per row.",
        OPS_ENV,
        choice,
        split_k,
        len(weights),
        "draft" if getattr(model_runner, "is_draft_worker", False) else "target",
        checked,
    )
    return result


def _maybe_fast_draft(model_runner: Any) -> None:
    """Put the draft model of a ``DETSPEC_*_INVARIANT`` server on cuBLAS GEMMs when ``SGLANG_DETSPEC_FAST_INVARIANT_
    DRAFT=1`` (module docstring); say so, or why not, in the log."""
    if not fast_draft_wanted() or not getattr(model_runner, "is_draft_worker", False):
        return
    from sglang_detspec.integration.sampling.scheme import COUPLED, scheme_for_algorithm
    from sglang_detspec.integration.setup.algorithm import DetspecSpecAlgo

    algorithm = getattr(model_runner, "spec_algorithm", None)
    name = getattr(algorithm, "name", None)
    if not isinstance(algorithm, DetspecSpecAlgo) or scheme_for_algorithm(name) != COUPLED:
        logger.warning("sglang-detspec: %s=1 is ignored on this %s server: only a DETSPEC_*_INVARIANT draft may leave "
                       "the batch-invariant kernels (other drafts' probabilities decide the tokens).", FAST_DRAFT_ENV,
                       name or "non-speculative")
        return
    model = getattr(model_runner, "model", None)
    if model is None:
        raise RuntimeError(f"sglang-detspec: {FAST_DRAFT_ENV}=1 but the {name} draft model runner has no model")
    _on_fast_kernels(model)
    logger.info("sglang-detspec: %s=1: the %s draft computes its GEMMs with cuBLAS (its tokens are the target's "
                "seeded race's whatever it proposes).", FAST_DRAFT_ENV, name)


def install_batch_invariant_ops() -> List[str]:
    """Register the three hooks with ``HookRegistry`` (once per process). They do nothing until a deterministic model
    runner of a selected server enables them (``around_enable_batch_invariant_mode``)."""
    ops_choice()  # refuse a bad value in every process, before anything loads
    fast_draft_wanted()
    gemm_split_k_wanted()
    return [
        register_once(MATMUL_HOOK_TARGET, around_matmul_persistent, "AROUND"),
        register_once(RMS_NORM_HOOK_TARGET, around_rms_norm_forward_cuda, "AROUND"),
        register_once(ENABLE_HOOK_TARGET, around_enable_batch_invariant_mode, "AROUND"),
    ]


def batch_invariant_ops_hooks_active() -> bool:
    """Whether all three hooks run where they were registered."""
    return (
        hook_active(MATMUL_HOOK_TARGET, around_matmul_persistent)
        and hook_active(RMS_NORM_HOOK_TARGET, around_rms_norm_forward_cuda)
        and hook_active(ENABLE_HOOK_TARGET, around_enable_batch_invariant_mode)
    )
