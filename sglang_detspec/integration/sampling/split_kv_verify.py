"""The target's verify attention (the default where the kernel can serve the model; ``SGLANG_DETSPEC_SPLIT_KV_VERIFY``,
:mod:`..setup.split_kv_verify_switch`) and, opted in, the draft's extend of each verified chain
(``SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1``, :mod:`..setup.split_kv_draft_extend_switch`) in the plugin's split-KV
verify kernel.

Why
---
Under ``--enable-deterministic-inference`` SGLang's Triton backend runs every TARGET_VERIFY attention through its
one-stage extend kernel, one program per (request, query head, query block), each walking the whole context. On the
mid-size pair at c = 1 that was 2.00 ms of a 3.64 ms replayed DETSPEC_EAGLE step on an H100, against 1.03 ms for
built-in EAGLE + rejection sampling's kernel (docs/results.md, 2026-12-07 second run): the whole gap between the two.
:mod:`sglang_detspec.kernels.split_kv_verify_attention` computes the same attention split over fixed key tiles (the
backend's ``split_tile_size``, 256 by default), so a request's numbers still depend on its own keys only.

After each verify the draft model extends its cache over the same chain (``DRAFT_EXTEND_V2``: ``num_draft_tokens``
query tokens per request, causal over its prefix, no custom mask), which under deterministic inference runs the same
one-stage kernel on the draft's one layer (or its MTP layers); its numbers decide the next drafts, so it must be
batch-invariant too, and the same kernel can serve it.

What
----
On each of the target model runner's Triton backends, and on the draft worker's draft-extend backends (instance
attributes, installed before any CUDA graph is captured), two methods are wrapped:

* ``forward_extend`` notes the forward batch while a forward the backend serves runs (TARGET_VERIFY on the target's,
  DRAFT_EXTEND_V2 on the draft's), then runs upstream's body, which writes the new tokens' K / V into the cache and
  builds the unified prefix + chain key indices as in every release;
* ``extend_attention_fwd_unified`` (the kernel upstream's body calls at its end) runs the split-KV verify kernel on
  those indices while such a batch is noted, and upstream's kernel otherwise (prefill, the draft's first extend).

The verified chain is a topk-1 chain (the plugin refuses other topk), so upstream's custom verify mask is causal over
the drafts, which the kernel applies without reading the mask; a draft extend brings no mask (one would be refused).

What it cannot serve (:func:`split_kv_verify_blocker`: a non-Triton or non-deterministic backend, multi-head latent
attention, sliding windows, decode context parallelism, pages > 1, a quantised KV cache) keeps SGLang's kernel by
default, said in the log, and is refused under ``=1`` (the draft extend's opt-in always refuses it). A layer found at
its first verify to use what the kernel does not apply (attention sinks, a score_mod, ...) runs SGLang's kernel by
default (a property of the layer, so the same choice at every verify of any batch) and is refused under ``=1``.

CUDA graphs
-----------
Under capture the kernel's scratch is the backend's own CUDA-graph decode buffers (``cuda_graph_attn_logits`` /
``_attn_lse``, sized ``max_num_tokens x heads x max_kv_splits``), which a verify graph state sizes for every verify
row and otherwise leaves unused, and the grid covers ``max_kv_splits`` tiles; programs past a request's last tile
return at once. Eager forwards size both from the batch's longest sequence.
"""

from __future__ import annotations

import logging
import types
from typing import Any, List, Optional, Tuple

import torch

from sglang_detspec.integration.sampling.verify_attention import verify_backends
from sglang_detspec.kernels.split_kv_verify_attention import max_splits_for, split_kv_verify_attention

logger = logging.getLogger(__name__)

__all__ = [
    "install_split_kv_verify", "install_split_kv_draft_extend", "draft_extend_backends", "split_kv_verify_blocker",
    "INSTALLED_LOG", "NOT_INSTALLED_LOG", "DRAFT_INSTALLED_LOG", "DRAFT_NOT_INSTALLED_LOG",
]

#: What the server log says once the kernel is installed (the E2E tests look for it).
INSTALLED_LOG = "the verify runs its attention in the split-KV verify kernel"
#: What it says when the default keeps SGLang's kernel, followed by the reason.
NOT_INSTALLED_LOG = "the verify runs its attention in SGLang's one-stage extend kernel"
#: The same two for the draft's extend of the verified chain.
DRAFT_INSTALLED_LOG = "the draft extend runs its attention in the split-KV verify kernel"
DRAFT_NOT_INSTALLED_LOG = "the draft extend runs its attention in SGLang's one-stage extend kernel"
#: What a patched backend serves: the target's verifies or the draft's extends of the verified chain.
VERIFY = "verify"
DRAFT_EXTEND = "draft extend"
_SERVED_MODE = {VERIFY: "is_target_verify", DRAFT_EXTEND: "is_draft_extend_v2"}
_LOGS = {VERIFY: (INSTALLED_LOG, NOT_INSTALLED_LOG), DRAFT_EXTEND: (DRAFT_INSTALLED_LOG, DRAFT_NOT_INSTALLED_LOG)}
_ORIGINALS_ATTR = "_detspec_split_kv_verify_originals"
_SERVES_ATTR = "_detspec_split_kv_serves"
_VERIFY_BATCH_ATTR = "_detspec_split_kv_verify_batch"
_REQUIRED_ATTR = "_detspec_split_kv_verify_required"
_WARNED_ATTR = "_detspec_split_kv_verify_warned"
#: Per forward served: the switch, the way out of its refusals, and what the install line says of each setting.
_SWITCH = {VERIFY: "SGLANG_DETSPEC_SPLIT_KV_VERIFY", DRAFT_EXTEND: "SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND"}
_FIX = {VERIFY: "unset SGLANG_DETSPEC_SPLIT_KV_VERIFY (SGLang's kernel where the split-KV kernel cannot serve) or set "
                "it to 0",
        DRAFT_EXTEND: "unset SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND (SGLang's kernel for the draft extend)"}
_ASKED_BY = {True: "asked for by {switch}=1", False: "the default; {switch}=0 turns it off"}


def _refusal(why: str, fix: Optional[str], serves: str = VERIFY) -> RuntimeError:
    way_out = f"{fix}, or {_FIX[serves]}" if fix else _FIX[serves][0].upper() + _FIX[serves][1:]
    whose = "this model's verify" if serves == VERIFY else "this draft's extend"
    return RuntimeError(f"{_SWITCH[serves]}=1 cannot serve {whose}: {why}. {way_out}.")


def _backend_blocker(backend: Any) -> Optional[Tuple[str, Optional[str]]]:
    """Why the kernel cannot serve ``backend``'s chain attention and a flag that would let it (or None), or None."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    if not isinstance(backend, TritonAttnBackend):
        return (f"the model runs its attention on {type(backend).__name__}, and the kernel replaces the Triton "
                "backend's one-stage extend kernel", "Pass --attention-backend triton")
    if not getattr(backend, "enable_deterministic", False) or getattr(backend, "split_tile_size", None) is None:
        return ("the Triton backend is not in deterministic mode (no fixed key tile)",
                "Pass --enable-deterministic-inference")
    if not callable(getattr(backend, "extend_attention_fwd_unified", None)):
        raise RuntimeError("sglang-detspec: this SGLang's Triton backend has no extend_attention_fwd_unified, which "
                           f"the split-KV verify replaces; {_FIX[VERIFY]} (sglang-detspec needs updating)")
    if getattr(backend, "use_mla", False):
        return ("the model uses multi-head latent attention, whose 576-wide keys the kernel is not tuned or tested "
                "for", None)
    if (getattr(backend, "sliding_window_size", None) or 0) > 0:
        return "the model has sliding-window layers", None
    if getattr(backend, "dcp_size", 1) != 1:
        return "decode context parallelism shards the keys per rank", "Drop --dcp-size"
    if int(getattr(backend, "page_size", 1) or 1) != 1:
        return (f"the KV cache has pages of {backend.page_size} tokens, and the kernel reads token slots",
                "Pass --page-size 1")
    return None


def split_kv_verify_blocker(model_runner: Any, backends: List[Any]) -> Optional[Tuple[str, Optional[str]]]:
    """Why the split-KV verify kernel cannot serve ``model_runner``'s chain attention on ``backends`` (its attention
    backends) and a flag that would let it (or None), or None when it can."""
    kv_dtype = getattr(model_runner, "kv_cache_dtype", None)
    if isinstance(kv_dtype, torch.dtype) and kv_dtype not in (torch.float16, torch.bfloat16):
        return (f"the KV cache holds {kv_dtype}, and the kernel reads float16 / bfloat16 keys and values",
                "Drop --kv-cache-dtype")
    for backend in backends:
        blocker = _backend_blocker(backend)
        if blocker is not None:
            return blocker
    return None


def _forward_extend(self: Any, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    original = self.__dict__[_ORIGINALS_ATTR][0]
    if not getattr(forward_batch.forward_mode, _SERVED_MODE[self.__dict__[_SERVES_ATTR]])():
        return original(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    self.__dict__[_VERIFY_BATCH_ATTR] = forward_batch
    try:
        return original(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    finally:
        self.__dict__.pop(_VERIFY_BATCH_ATTR, None)


def _scratch(backend: Any, tokens: int, heads: int, v_dim: int, max_splits: int, capturing: bool, device):
    if capturing:
        logits = getattr(backend, "cuda_graph_attn_logits", None)
        lse = getattr(backend, "cuda_graph_attn_lse", None)
        if (logits is not None and lse is not None and logits.shape[0] >= tokens and logits.shape[1] >= heads
                and logits.shape[2] >= max_splits and logits.shape[3] >= v_dim):
            return logits, lse
    return (torch.empty(tokens, heads, max_splits, v_dim, dtype=torch.float32, device=device),
            torch.empty(tokens, heads, max_splits, dtype=torch.float32, device=device))


def _keeps_sglangs_kernel(backend: Any, unsupported: List[str]) -> bool:
    """Whether a verify layer using ``unsupported`` (what the kernel does not apply) runs SGLang's kernel: no when the
    list is empty; yes by default, warned once; refused under ``=1``. What is unsupported is the layer's own (its
    window, sinks, mask kind), the same at every verify whatever the batch, so the choice never changes its numbers."""
    if not unsupported:
        return False
    serves = backend.__dict__[_SERVES_ATTR]
    why = f"a {serves} layer uses {', '.join(unsupported)}, which the kernel does not apply"
    if backend.__dict__[_REQUIRED_ATTR]:
        raise _refusal(why, None, serves)
    if why not in backend.__dict__.setdefault(_WARNED_ATTR, set()):
        backend.__dict__[_WARNED_ATTR].add(why)
        logger.warning("sglang-detspec: %s for every layer where %s", _LOGS[serves][1], why)
    return True


def _unified(self: Any, q, o, k_buffer, v_buffer, k_scale, v_scale, qo_indptr, kv_indptr, kv_indices, prefix_lens,
             max_len_extend, custom_mask=None, mask_indptr=None, sm_scale=None, logit_cap=0.0, is_causal=True,
             sliding_window_size=-1, sinks=None, window_start_pos=None, xai_temperature_len=-1, page_size=1,
             score_mod=None, aux_tensors=None):
    forward_batch = self.__dict__.get(_VERIFY_BATCH_ATTR)
    if forward_batch is None or _keeps_sglangs_kernel(self, [name for name, used in (
        ("a sliding window", sliding_window_size is not None and sliding_window_size > 0),
        ("attention sinks", sinks is not None), ("a score_mod", score_mod is not None),
        ("an xai temperature", (xai_temperature_len or 0) > 0), ("pages", int(page_size or 1) != 1),
        ("non-causal attention", not is_causal),
        ("a custom mask", custom_mask is not None and self.__dict__[_SERVES_ATTR] == DRAFT_EXTEND),
    ) if used]):
        return self.__dict__[_ORIGINALS_ATTR][1](
            q, o, k_buffer, v_buffer, k_scale, v_scale, qo_indptr, kv_indptr, kv_indices, prefix_lens, max_len_extend,
            custom_mask=custom_mask, mask_indptr=mask_indptr, sm_scale=sm_scale, logit_cap=logit_cap,
            is_causal=is_causal, sliding_window_size=sliding_window_size, sinks=sinks,
            window_start_pos=window_start_pos, xai_temperature_len=xai_temperature_len, page_size=page_size,
            score_mod=score_mod, aux_tensors=aux_tensors)
    batch = prefix_lens.shape[0]
    tokens, heads, v_dim = q.shape[0], q.shape[1], v_buffer.shape[-1]
    split = int(self.split_tile_size)
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    if capturing:
        max_splits = int(self.max_kv_splits)
    else:
        seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
        longest = (int(seq_lens_cpu[:batch].max()) if seq_lens_cpu is not None
                   else int(forward_batch.seq_lens[:batch].max()))
        max_splits = max_splits_for(longest + int(max_len_extend), split)
    partial_out, partial_lse = _scratch(self, tokens, heads, v_dim, max_splits, capturing, q.device)
    split_kv_verify_attention(
        q, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens,
        max_q_len=int(max_len_extend), split=split, max_splits=max_splits, partial_out=partial_out,
        partial_lse=partial_lse, sm_scale=(sm_scale or q.shape[-1] ** -0.5) * k_scale, logit_cap=logit_cap or 0.0,
        v_scale=v_scale,
    )
    return o


def _install(model_runner: Any, backends: List[Any], required: bool, serves: str) -> List[Any]:
    installed_log, not_installed_log = _LOGS[serves]
    blocker = split_kv_verify_blocker(model_runner, backends)
    if blocker is not None:
        if required:
            raise _refusal(*blocker, serves)
        logger.info("sglang-detspec: %s: %s (the split-KV verify kernel cannot serve it)", not_installed_log,
                    blocker[0])
        return []
    for backend in backends:
        if backend.__dict__.get(_SERVES_ATTR, serves) != serves:
            raise RuntimeError(f"sglang-detspec: one attention backend serves both the target's verify and the "
                               f"draft's extend, which the split-KV verify cannot tell apart; {_FIX[serves]} "
                               "(sglang-detspec needs updating)")
        if _ORIGINALS_ATTR not in backend.__dict__:
            backend.__dict__[_ORIGINALS_ATTR] = (backend.forward_extend, backend.extend_attention_fwd_unified)
            backend.forward_extend = types.MethodType(_forward_extend, backend)
            backend.extend_attention_fwd_unified = types.MethodType(_unified, backend)
        backend.__dict__[_SERVES_ATTR] = serves
        backend.__dict__[_REQUIRED_ATTR] = required
    logger.info("sglang-detspec: %s on %d Triton backend(s) (key tile %s; %s)", installed_log, len(backends),
                backends[0].split_tile_size, _ASKED_BY[required].format(switch=_SWITCH[serves]))
    return backends


def install_split_kv_verify(model_runner: Any, required: bool) -> List[Any]:
    """Run every verify attention of ``model_runner`` in the split-KV verify kernel; return the patched backends.

    Call it after the target's attention backends exist and before its CUDA graphs are captured. Idempotent. A model
    the kernel cannot serve (:func:`split_kv_verify_blocker`) is refused (``RuntimeError`` naming the variable and
    the way out) when ``required`` (``=1``), and otherwise keeps SGLang's kernel, said in the log (returns ``[]``).
    """
    backends = verify_backends(model_runner)
    if not backends:
        raise RuntimeError("sglang-detspec: the target model runner has no attention backend yet; the split-KV verify "
                           "must be installed after init_attention_backends (sglang-detspec needs updating)")
    return _install(model_runner, backends, required, VERIFY)


def draft_extend_backends(draft_worker: Any) -> Tuple[Any, List[Any]]:
    """The draft's model runner (the first, for a multi-layer draft) and the distinct attention backends its extends of
    the verified chain may run on: ``draft_extend_attn_backend`` (single-layer) or each of
    ``draft_extend_attn_backend_list`` (multi-layer), and the draft runners' own ``attn_backend`` (which upstream sets
    to those, or keeps when there are none), the same names in every supported release."""
    runners = [getattr(draft_worker, "draft_runner", None), *(getattr(draft_worker, "draft_runner_list", None) or [])]
    runners = [runner for runner in runners if runner is not None]
    candidates = [getattr(draft_worker, "draft_extend_attn_backend", None)]
    candidates += list(getattr(draft_worker, "draft_extend_attn_backend_list", None) or [])
    candidates += [getattr(runner, "attn_backend", None) for runner in runners]
    found: List[Any] = []
    for backend in candidates:
        if backend is not None and all(backend is not seen for seen in found):
            found.append(backend)
    return (runners[0] if runners else None), found


def install_split_kv_draft_extend(draft_worker: Any) -> List[Any]:
    """Run the draft's extends of the verified chain (``DRAFT_EXTEND_V2``) in the split-KV verify kernel; return the
    patched backends (``SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1``).

    Call it once the draft worker's attention backends exist and before its CUDA graphs are captured. Idempotent.
    A draft the kernel cannot serve is refused (``RuntimeError`` naming the variable and the way out).
    """
    runner, backends = draft_extend_backends(draft_worker)
    if not backends:
        raise RuntimeError("sglang-detspec: the draft worker has no attention backend yet; the split-KV draft extend "
                           "must be installed after init_attention_backends (sglang-detspec needs updating)")
    return _install(runner, backends, True, DRAFT_EXTEND)
