"""The unified KV indices of SGLang's deterministic Triton attention, built once per forward instead of per layer.

Why
---
With ``--enable-deterministic-inference`` SGLang's Triton backend runs every extend / verify attention through
``TritonAttnBackend._forward_extend_unified``, which for every layer derives ``extend_seq_lens`` (``torch.full`` when
the forward batch has none, as in TARGET_VERIFY), ``extend_start_loc`` (zeros + cumsum + cat) and then calls
``self.build_unified_kv_indices`` (slice arithmetic, cumsum, cat, a Triton copy kernel). For a layer without a
sliding window all of it reads only forward-level state (``forward_metadata.kv_indptr / kv_indices``, the batch's
``out_cache_loc``, the verify width), so it is the same for every layer: on an H100 profile of DETSPEC_EAGLE's decode
step these ~12 tiny launches per layer were ~0.3 ms of a 2.64 ms step. CUDA graphs capture the launches but keep
their GPU time.

What
----
On by default on a DETSPEC server or the token-id reference server, in deterministic mode;
``SGLANG_DETSPEC_ATTN_INDEX_CACHE=0`` turns it off (``1`` / unset: on; anything else is refused; docs/kernels.md).
Its tokens equal the uncached server's in the E2E modules run with it on (H100, docs/results.md). The plugin re-implements nothing of
SGLang's function; an AROUND hook on ``_forward_extend_unified`` and a per-backend wrapper of its
``build_unified_kv_indices`` memoise SGLang's own results:

* the first window-less layer of a forward runs SGLang's code unchanged; the wrapper records the six inputs SGLang
  passed to ``build_unified_kv_indices`` and its result;
* each later window-less layer of the same forward gets, for the batch fields SGLang would derive because they are
  None (``extend_seq_lens``, ``extend_start_loc``), the very tensors SGLang derived at the first layer (set on the
  forward batch for the call only); SGLang then passes inputs that are the same objects, and the wrapper returns the
  recorded result only when all six are identical (``is``). Anything else recomputes.

A forward is (``backend.forward_metadata``, the forward batch, whether a CUDA graph is being captured), and a layer id
not above the previous one starts a new model pass: SGLang's graph capture runs the same forward batch eagerly
(warm-up) and then under capture, and a captured graph must launch its own index kernels, never read tensors from
an eager run. Each batch size's capture builds its own forward batch and metadata. Sliding-window layers, backends
on a sliding-window KV pool and ``torch.compile`` tracing always run SGLang's code untouched.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from typing import Any, Callable, Mapping, Optional, Tuple

from sglang_detspec.integration.setup.env_switch import env_switch
from sglang_detspec.integration.setup.hooks import hook_active, register_once

logger = logging.getLogger(__name__)

__all__ = [
    "ATTN_INDEX_CACHE_ENV",
    "FORWARD_EXTEND_UNIFIED_TARGET",
    "enable_for_model_runner",
    "around_forward_extend_unified",
    "attention_index_cache_active",
    "attention_index_cache_hooks_active",
    "attention_index_cache_wanted",
    "install_attention_index_cache",
]

ATTN_INDEX_CACHE_ENV = "SGLANG_DETSPEC_ATTN_INDEX_CACHE"

# The same dotted paths on every release 0.5.17 - 0.5.23 (checked by the CPU tests on each).
FORWARD_EXTEND_UNIFIED_TARGET = (
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend._forward_extend_unified"
)

# The forward-batch fields SGLang derives per layer when they are None, and their positions among
# ``build_unified_kv_indices``'s arguments (prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens,
# extend_kv_indices, bs; the same on 0.5.17 - 0.5.23).
DERIVED_FIELDS = (("extend_start_loc", 2), ("extend_seq_lens", 3))
BUILD_ARGUMENTS = 6

_active = False  # set once a model runner of a selected deterministic server enabled the cache
_logged_first_use = False


def attention_index_cache_wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``SGLANG_DETSPEC_ATTN_INDEX_CACHE``: True for ``1`` or unset (the default), False for ``0``; anything else is
    the ``attn_index_cache`` refusal (a ``ValueError``)."""
    return env_switch(ATTN_INDEX_CACHE_ENV, "attn_index_cache", environ, default=True)


def _explicitly_on() -> bool:
    return os.environ.get(ATTN_INDEX_CACHE_ENV, "") == "1"


def attention_index_cache_active() -> bool:
    """Whether this process's window-less deterministic Triton attention layers share one forward's unified indices."""
    return _active


def _set_active(value: bool) -> None:
    global _active
    _active = value


def _same(ref: Any, obj: Any) -> bool:
    """Whether the recorded reference ``ref`` (a weakref or a strong reference) still names the object ``obj``."""
    held = ref() if isinstance(ref, weakref.ref) else ref
    return held is obj


def _identical(a: Any, b: Any) -> bool:
    """The same object, or (the batch size) the same plain int."""
    return a is b or (type(a) is int and type(b) is int and a == b)


def _reference(obj: Any) -> Any:
    """A weak reference where the type allows one (a forward batch is not kept alive by the memo), else ``obj``."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj


class _UnifiedIndexMemo:
    """One backend instance's record of the current forward's ``build_unified_kv_indices`` call (see module doc)."""

    __slots__ = ("metadata", "batch", "capturing", "last_layer_id", "inputs", "outputs", "armed")

    def __init__(self) -> None:
        self.metadata = self.batch = None
        self.capturing = False
        self.last_layer_id: Optional[int] = None
        self.inputs: Optional[Tuple[Any, ...]] = None
        self.outputs: Any = None
        self.armed = False

    def begin_layer(self, metadata: Any, batch: Any, capturing: bool, layer_id: Optional[int]) -> None:
        """Forget the record unless this layer continues the recorded forward's model pass."""
        same_pass = (
            self.inputs is not None
            and _same(self.metadata, metadata)
            and _same(self.batch, batch)
            and self.capturing == capturing
            and layer_id is not None
            and self.last_layer_id is not None
            and layer_id > self.last_layer_id
        )
        if not same_pass:
            self.metadata, self.batch, self.capturing = _reference(metadata), _reference(batch), capturing
            self.inputs = self.outputs = None
        self.last_layer_id = layer_id

    def build(self, original: Callable, *inputs: Any, **kwargs: Any) -> Any:
        if not self.armed or kwargs or len(inputs) != BUILD_ARGUMENTS:
            return original(*inputs, **kwargs)
        if self.inputs is not None and all(_identical(a, b) for a, b in zip(inputs, self.inputs)):
            return self.outputs
        outputs = original(*inputs)
        self.inputs, self.outputs = inputs, outputs
        return outputs


def _memo_of(backend: Any) -> _UnifiedIndexMemo:
    """The backend's memo, wrapping its ``build_unified_kv_indices`` instance attribute the first time."""
    memo = getattr(backend, "_detspec_unified_index_memo", None)
    if memo is None:
        memo = _UnifiedIndexMemo()
        original = backend.build_unified_kv_indices

        @functools.wraps(original)
        def build_unified_kv_indices(*inputs: Any, **kwargs: Any) -> Any:
            return memo.build(original, *inputs, **kwargs)

        backend.build_unified_kv_indices = build_unified_kv_indices
        backend._detspec_unified_index_memo = memo
    return memo


def _window_less(backend: Any, layer: Any) -> bool:
    """SGLang's own test for the full-attention branch (``sliding_window_size`` None or <= -1), on a backend without a
    sliding-window KV pool."""
    window = getattr(layer, "sliding_window_size", None)
    return (window is None or window <= -1) and not getattr(backend, "use_sliding_window_kv_pool", False)


def _capturing() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _compiling() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


def around_forward_extend_unified(
    original: Callable, backend: Any, q: Any, o: Any, layer: Any, forward_batch: Any, *args: Any, **kwargs: Any
) -> Any:
    """``HookRegistry`` AROUND hook on ``TritonAttnBackend._forward_extend_unified`` (module docstring)."""
    if not _active or not _window_less(backend, layer) or _compiling():
        return original(backend, q, o, layer, forward_batch, *args, **kwargs)
    memo = _memo_of(backend)
    memo.begin_layer(backend.forward_metadata, forward_batch, _capturing(), getattr(layer, "layer_id", None))
    injected = []
    if memo.inputs is not None:
        for field, position in DERIVED_FIELDS:
            if getattr(forward_batch, field, None) is None:
                setattr(forward_batch, field, memo.inputs[position])
                injected.append(field)
    _log_first_use()
    memo.armed = True
    try:
        return original(backend, q, o, layer, forward_batch, *args, **kwargs)
    finally:
        memo.armed = False
        for field in injected:
            setattr(forward_batch, field, None)


def _log_first_use() -> None:
    global _logged_first_use
    if not _logged_first_use:
        _logged_first_use = True
        logger.info("sglang-detspec: attention index cache: the deterministic Triton attention reuses one forward's "
                    "unified KV indices across its window-less layers (first use in this process).")


def enable_for_model_runner(model_runner: Any) -> None:
    """Turn the cache on for a deterministic DETSPEC or token-id reference server unless ``SGLANG_DETSPEC_ATTN_INDEX_
    CACHE=0``, and log it. Called by the batch-invariant ops' hook on ``ModelRunner.maybe_enable_batch_invariant_mode``
    once SGLang's deterministic mode is on (one hook per SGLang function: two AROUND hooks registered on one target
    by different modules would leave one unapplied whenever the other is applied first)."""
    if not attention_index_cache_wanted():
        return
    from sglang_detspec.integration.setup.algorithm import DetspecSpecAlgo
    from sglang_detspec.integration.setup.token_id_sampler_opt_in import token_id_sampler_requested

    algorithm = getattr(model_runner, "spec_algorithm", None)
    if not isinstance(algorithm, DetspecSpecAlgo) and not token_id_sampler_requested():
        if not _active and _explicitly_on():
            logger.warning("sglang-detspec: %s=1 is ignored on this %s server: the index cache serves DETSPEC servers "
                           "and the token-id reference server only.", ATTN_INDEX_CACHE_ENV,
                           getattr(algorithm, "name", None) or "non-speculative")
        return
    if not attention_index_cache_hooks_active():
        raise RuntimeError(
            f"sglang-detspec: the attention index cache is on ({ATTN_INDEX_CACHE_ENV} is 1 or unset) but the hook on "
            f"{FORWARD_EXTEND_UNIFIED_TARGET} is not applied in this process (see the HookRegistry error above); set "
            f"{ATTN_INDEX_CACHE_ENV}=0 to serve without it."
        )
    if not _active:
        logger.info("sglang-detspec: attention index cache on: SGLang's deterministic Triton attention builds its "
                    "unified KV indices once per forward for layers without a sliding window (other attention "
                    "backends are unaffected; %s=0 turns it off).", ATTN_INDEX_CACHE_ENV)
    _set_active(True)


def install_attention_index_cache() -> list:
    """Register the hook with ``HookRegistry`` (once per process); refuse a bad env value before anything loads. It
    does nothing unless :func:`enable_for_model_runner` turned the cache on."""
    attention_index_cache_wanted()
    return [register_once(FORWARD_EXTEND_UNIFIED_TARGET, around_forward_extend_unified, "AROUND")]


def attention_index_cache_hooks_active() -> bool:
    """Whether the hook runs where it was registered."""
    return hook_active(FORWARD_EXTEND_UNIFIED_TARGET, around_forward_extend_unified)
