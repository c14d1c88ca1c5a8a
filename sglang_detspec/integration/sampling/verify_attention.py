"""Verify attention in the decode kernel's order, so a speculation-invariant verify sees decode's probabilities.

Why
---
``DETSPEC_*_INVARIANT`` emits the non-speculative server's token only if the verify forward's target probabilities
equal, bit for bit, the ones a 1-token decode forward computes for the same prefix: the coupled race flips on a
last-bit difference wherever two tokens nearly tie. Under ``--enable-deterministic-inference`` SGLang's Triton
backend runs the two through different kernels. A TARGET_VERIFY forward goes through ``forward_extend`` and the unified
1-stage extend kernel (one online softmax over the prefix and the drafts). A decode forward goes through
``forward_decode`` and the split-KV decode kernel: tiles of ``SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE`` (256) keys, merged
by log-sum-exp. The summation orders differ, so the logits differ in their last bits. On the H200 (sglang 0.5.17,
weighted tiny pair, 1,000 seeds x 32 tokens) that alone left 906 of 1,000 sequences identical, with first
divergences spread evenly over the positions. Every other op of the forward is batch-invariant in deterministic
mode: the matmuls, the norms, and the logits, whose rows do not depend on how many tokens share the forward.

What
----
On the target model runner's Triton backend (an instance attribute, installed by the invariant worker before any
CUDA graph is captured), a TARGET_VERIFY ``forward_extend`` becomes upstream's own ``forward_decode``. Each of the
``B x (steps + 1)`` verify query rows is one decode row. Row ``(b, j)`` attends to request b's first
``seq_lens[b] + j + 1`` cache slots: the prefix, then drafts 0..j. Those are the keys a decode of that token reads,
in the same order, split into the same tiles (``get_num_kv_splits`` of that length). ``req_to_token`` already holds
the drafts' slots when the verify runs: every release builds the verify's ``out_cache_loc`` by reading them from
there (``assign_extend_cache_locs_uniform_func``). ``forward_decode`` writes the verify tokens' K/V into
``out_cache_loc`` first, as ``forward_extend`` did.

CUDA graphs
-----------
The rows are built at the first attention layer of every forward, from ``forward_batch.seq_lens`` and
``req_pool_indices``, by device-only torch ops and upstream's ``create_flashinfer_kv_indices_triton`` (:func:`compat.kv_indices_kernel`), with shapes
fixed by ``(B, steps + 1)``. Under capture they are recorded into the verify graph, so every replay rebuilds them
from that replay's inputs. The decode kernel's scratch (``cuda_graph_attn_logits`` / ``_attn_lse``) and the split
counts (``cuda_graph_num_kv_splits``) are the backend's own CUDA-graph decode buffers, which a verify graph state sizes
for ``max_bs x (steps + 1)`` rows and otherwise leaves unused. The row index stream has its own buffer
(``B x (steps + 1) x context length`` int64 from the graph's memory pool), because upstream refills
``cuda_graph_kv_indices`` with the next verify's prefix before each replay. Eager forwards allocate everything at the
size upstream's decode metadata would.

Measured (H200, sglang 0.5.17)
------------------------------
With the rows built this way, ``sglang-detspec check --traffic uniform,mixed --against`` a non-speculative server gave
one probe output in 24 trials, equal to that server's, with CUDA graphs on and off and with overlap scheduling off.
The same held for EAGLE3. Until commit 24d8f61 a verify of a single request read wrong slots for rows 1..S (the
per-row request index was a stride-0 view, see :func:`build_decode_rows`), and the probe alone gave other tokens
than the probe next to fillers.

Cost
----
Each verify row reads its prefix once, so the verify attention reads the prefix ``steps + 1`` times instead of
once, and each captured verify graph size holds the row index stream above. In exchange the keys are split into
tiles that run side by side: upstream's one-stage extend kernel runs one program per (request, head, query block),
each walking the whole prefix, 16 programs at batch 1 on the mid-size pair, and took 2.00 ms of a replayed
DETSPEC_EAGLE step on an H100 at ~1,500 tokens of context (docs/results.md, 2026-12-07, second run).
``DETSPEC_EAGLE`` keeps upstream's verify unless ``SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1``
(:mod:`..setup.decode_order_verify_switch`), which this module then serves the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from typing import Any, List, Tuple

import torch

from sglang_detspec.integration import compat

logger = logging.getLogger(__name__)

__all__ = [
    "INVARIANT_REQUEST", "DecodeRows", "build_decode_rows", "install_decode_order_verify", "verify_backends",
]

#: Attribute on a patched backend instance: the rows of the forward now running.
_ROWS_ATTR = "_detspec_decode_rows"
_PATCHED_ATTR = "_detspec_decode_order_verify"


@dataclasses.dataclass
class DecodeRows:
    """Decode-shaped metadata for one verify forward, and what it was built for."""

    metadata: Any
    verify_metadata: Any
    forward_batch_id: int
    last_layer_id: int


#: (what asks for the decode-order verify, the way out a refusal names) for the invariant algorithms.
INVARIANT_REQUEST = ("--speculative-algorithm DETSPEC_EAGLE_INVARIANT / DETSPEC_EAGLE3_INVARIANT",
                     "use --speculative-algorithm DETSPEC_EAGLE")


def _refusal(why: str, fix: str, request: Tuple[str, str]) -> RuntimeError:
    who, way_out = request
    return RuntimeError(
        f"{who} cannot run its verify in the decode kernel's order: {why}. {fix.format(way_out=way_out)}"
    )


def verify_backends(model_runner: Any) -> List[Any]:
    """The distinct attention backend objects the target model runner may run a verify forward on."""
    found: List[Any] = []
    candidates = [getattr(model_runner, "attn_backend", None), getattr(model_runner, "decode_attn_backend", None)]
    candidates += list(getattr(model_runner, "decode_attn_backend_group", None) or [])
    for backend in candidates:
        if backend is not None and all(backend is not seen for seen in found):
            found.append(backend)
    return found


def _check_backend(backend: Any, request: Tuple[str, str]) -> None:
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    if not isinstance(backend, TritonAttnBackend):
        raise _refusal(
            f"the target model runs on {type(backend).__name__}, and only the Triton backend's verify is made "
            "identical to its decode",
            "Pass --attention-backend triton (and no --prefill-attention-backend / --decode-attention-backend, "
            "--enable-two-batch-overlap or --enable-pdmux).",
            request,
        )
    if not getattr(backend, "enable_deterministic", False) or getattr(backend, "split_tile_size", None) is None:
        raise _refusal(
            "the Triton backend is not in deterministic mode (no fixed split-KV tile), so decode rows depend on the "
            "batch",
            "Pass --enable-deterministic-inference.",
            request,
        )
    if (getattr(backend, "sliding_window_size", None) or 0) > 0:
        raise _refusal(
            "the model has sliding-window layers, whose decode windows the verify rows do not rebuild yet",
            "Use a model without sliding-window attention, or {way_out}.",
            request,
        )
    if getattr(backend, "dcp_size", 1) != 1:
        raise _refusal("decode context parallelism shards the keys per rank", "Drop --dcp-size (or set it to 1).",
                       request)
    if compat.attention_reads_translated(backend):
        raise _refusal(
            "the KV pool translates cache locations (unified pool), which the verify rows do not apply",
            "With this KV pool, {way_out}.",
            request,
        )


def build_decode_rows(backend: Any, forward_batch: Any, steps_plus_one: int, capturing: bool) -> Any:
    """Decode-shaped ``ForwardMetadata`` for a verify forward of ``batch_size x steps_plus_one`` query rows.

    Row ``b * steps_plus_one + j`` reads ``req_to_token[req_pool_indices[b], : seq_lens[b] + j + 1]``. Nothing here
    reads a tensor back to the host, so it can be captured into a CUDA graph.
    """
    bs = int(forward_batch.batch_size)
    rows = bs * steps_plus_one
    device = forward_batch.seq_lens.device
    seq_lens = forward_batch.seq_lens[:bs]
    offsets = torch.arange(1, steps_plus_one + 1, device=device, dtype=seq_lens.dtype)
    row_lens = (seq_lens.unsqueeze(1) + offsets).reshape(-1)
    # contiguous(): the index kernel reads row_reqs[row] by pointer offset. For one request, expand(1, S).reshape(-1)
    # is still a stride-0 view of a 1-element tensor, so rows 1..S read past it (H200: zero slots, wrong tokens).
    row_reqs = forward_batch.req_pool_indices[:bs].unsqueeze(1).expand(bs, steps_plus_one).contiguous().view(-1)

    kv_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.cumsum(row_lens, dim=0)

    def graph_buffer(name: str):
        buffer = getattr(backend, name, None) if capturing else None
        return buffer if buffer is not None and buffer.shape[0] >= rows else None

    seq_lens_sum = getattr(forward_batch, "seq_lens_sum", None)
    if seq_lens_sum is None or capturing:
        index_capacity = rows * int(backend.max_context_len)
    else:
        index_capacity = steps_plus_one * int(seq_lens_sum) + bs * steps_plus_one * (steps_plus_one + 1) // 2
    # Its own buffer, not upstream's cuda_graph_kv_indices: upstream refills that one with the next verify's prefix
    # before the next replay.
    kv_indices = torch.empty(index_capacity, dtype=torch.int64, device=device)
    compat.kv_indices_kernel()[(rows,)](
        backend.req_to_token, row_reqs, row_lens, kv_indptr, None, kv_indices, backend.req_to_token.stride(0)
    )

    shape = (rows, backend.num_head, backend.max_kv_splits)
    attn_logits = graph_buffer("cuda_graph_attn_logits")
    if attn_logits is None:
        attn_logits = torch.empty(shape + (backend.v_head_dim,), dtype=torch.float32, device=device)
    attn_lse = graph_buffer("cuda_graph_attn_lse")
    if attn_lse is None:
        attn_lse = torch.empty(shape, dtype=torch.float32, device=device)
    num_kv_splits = graph_buffer("cuda_graph_num_kv_splits")
    num_kv_splits = torch.empty(rows, dtype=torch.int32, device=device) if num_kv_splits is None else num_kv_splits
    backend.get_num_kv_splits(num_kv_splits[:rows], row_lens)

    return dataclasses.replace(
        backend.forward_metadata,
        attn_logits=attn_logits,
        attn_lse=attn_lse,
        num_kv_splits=num_kv_splits,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        swa_attn_logits=None,
    )


def _rows_for(backend: Any, layer: Any, forward_batch: Any, query_rows: int) -> Any:
    bs = int(forward_batch.batch_size)
    if bs <= 0 or query_rows % bs:
        raise RuntimeError(
            f"sglang-detspec: a verify forward with {query_rows} query rows for {bs} requests is not a topk-1 chain; "
            "sglang-detspec needs updating for this SGLang version"
        )
    state = backend.__dict__.get(_ROWS_ATTR)
    layer_id = int(getattr(layer, "layer_id", 0))
    fresh = (
        state is None
        or state.verify_metadata is not backend.forward_metadata
        or state.forward_batch_id != id(forward_batch)
        or layer_id <= state.last_layer_id  # the next forward on the same batch (CUDA-graph warm-up, then capture)
    )
    if fresh:
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        metadata = build_decode_rows(backend, forward_batch, query_rows // bs, capturing)
        state = DecodeRows(metadata, backend.forward_metadata, id(forward_batch), layer_id)
        backend.__dict__[_ROWS_ATTR] = state
    state.last_layer_id = layer_id
    return state.metadata


def _decode_order_forward_extend(self: Any, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    original = self.__dict__[_PATCHED_ATTR]
    if not forward_batch.forward_mode.is_target_verify():
        return original(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    if k is None or v is None:
        raise RuntimeError(
            "sglang-detspec: this model's verify reads keys and values it did not compute (cross-layer KV "
            "sharing), which the decode-order verify (DETSPEC_*_INVARIANT, or SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1) "
            "does not support; use --speculative-algorithm DETSPEC_EAGLE without that variable"
        )
    rows = _rows_for(self, layer, forward_batch, q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim).shape[0])
    verify_metadata = self.forward_metadata
    self.forward_metadata = rows
    try:
        return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
    finally:
        self.forward_metadata = verify_metadata


def install_decode_order_verify(model_runner: Any, request: Tuple[str, str] = INVARIANT_REQUEST) -> List[Any]:
    """Make every verify forward of ``model_runner`` use the decode kernel's order; return the patched backends.

    Call it after the target's attention backends exist and before its CUDA graphs are captured. Idempotent.
    Refuses (``RuntimeError`` naming ``request``: what asked for it, and the way out) a backend whose verify it
    cannot make identical to decode, rather than serving other numbers than the ones asked for.
    """
    backends = verify_backends(model_runner)
    if not backends:
        raise RuntimeError(
            "sglang-detspec: the target model runner has no attention backend yet; the decode-order verify must be "
            "installed after init_attention_backends (sglang-detspec needs updating for this SGLang version)"
        )
    for backend in backends:
        _check_backend(backend, request)
    for backend in backends:
        if _PATCHED_ATTR not in backend.__dict__:
            backend.__dict__[_PATCHED_ATTR] = backend.forward_extend
            backend.forward_extend = types.MethodType(_decode_order_forward_extend, backend)
    logger.info(
        "sglang-detspec: the verify runs its attention in the decode kernel's order on %d Triton backend(s) (split "
        "tile %s; asked for by %s)", len(backends), backends[0].split_tile_size, request[0],
    )
    return backends
