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
``B x (steps + 1)`` verify query rows is one decode row. Row ``(b, j)`` attends to request b's prefix slots, then to
the slots of drafts 0..j: the keys a decode of that token reads, in the same order, split into the same tiles
(``get_num_kv_splits`` of that length). The slots come from the verify's own inputs: the prefix from its metadata's
``kv_indptr`` / ``kv_indices``, the drafts from ``out_cache_loc``. ``forward_decode`` writes the verify tokens'
K/V into ``out_cache_loc`` first, as ``forward_extend`` did.

CUDA graphs
-----------
The rows are built at the first attention layer of every forward by device-only torch ops and upstream's
``create_flashinfer_kv_indices_triton`` (:func:`compat.kv_indices_kernel`, used as a plain gather), with shapes fixed
by ``(B, steps + 1)``. Under capture they are recorded into the verify graph, so every replay rebuilds them from that
replay's inputs. Those inputs are the ones upstream fills before the replay; ``req_to_token`` is not read during
the replay (see :func:`build_decode_rows`). The decode kernel's per-split scratch is the backend's own CUDA-graph
decode buffers (``cuda_graph_attn_logits`` / ``_attn_lse``), which a verify graph otherwise leaves unused. The row
index stream (``B x (steps + 1) x context length`` int64 at most) comes from the graph's memory pool. Eager forwards
allocate it at its exact size.

Cost
----
Each verify row reads its prefix once, so the verify attention reads the prefix ``steps + 1`` times instead of
once, and a captured verify graph holds the row index stream above. That cost falls only on the invariant algorithms; ``DETSPEC_EAGLE`` keeps upstream's verify.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from typing import Any, List

import torch

from sglang_detspec.integration import compat

logger = logging.getLogger(__name__)

__all__ = ["DecodeRows", "build_decode_rows", "install_decode_order_verify", "verify_backends"]

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


def _refusal(why: str, fix: str) -> RuntimeError:
    return RuntimeError(
        "--speculative-algorithm DETSPEC_EAGLE_INVARIANT / DETSPEC_EAGLE3_INVARIANT cannot run its verify in the "
        f"decode kernel's order: {why}. {fix}"
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


def _check_backend(backend: Any) -> None:
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    if not isinstance(backend, TritonAttnBackend):
        raise _refusal(
            f"the target model runs on {type(backend).__name__}, and only the Triton backend's verify is made "
            "identical to its decode",
            "Pass --attention-backend triton (and no --prefill-attention-backend / --decode-attention-backend, "
            "--enable-two-batch-overlap or --enable-pdmux).",
        )
    if not getattr(backend, "enable_deterministic", False) or getattr(backend, "split_tile_size", None) is None:
        raise _refusal(
            "the Triton backend is not in deterministic mode (no fixed split-KV tile), so decode rows depend on the "
            "batch",
            "Pass --enable-deterministic-inference.",
        )
    if (getattr(backend, "sliding_window_size", None) or 0) > 0:
        raise _refusal(
            "the model has sliding-window layers, whose decode windows the verify rows do not rebuild yet",
            "Use a model without sliding-window attention, or --speculative-algorithm DETSPEC_EAGLE.",
        )
    if getattr(backend, "dcp_size", 1) != 1:
        raise _refusal("decode context parallelism shards the keys per rank", "Drop --dcp-size (or set it to 1).")
    if compat.attention_reads_translated(backend):
        raise _refusal(
            "the KV pool translates cache locations (unified pool), which the verify rows do not apply",
            "Use --speculative-algorithm DETSPEC_EAGLE with this KV pool.",
        )


def build_decode_rows(backend: Any, forward_batch: Any, steps_plus_one: int, capturing: bool) -> Any:
    """Decode-shaped ``ForwardMetadata`` for a verify forward of ``batch_size x steps_plus_one`` query rows.

    Row ``b * steps_plus_one + j`` lists request b's prefix slots, copied from the verify metadata's own
    ``kv_indptr`` / ``kv_indices``, then ``out_cache_loc[b * steps_plus_one : b * steps_plus_one + j + 1]``, the
    slots of drafts 0..j. Both are inputs upstream has already snapshotted before the forward, before a CUDA-graph
    replay for graphs. ``req_to_token`` itself is never read here: under overlap scheduling the next batch is
    planned while this graph runs, and SGLang assumes a verify graph has finished reading ``req_to_token`` at the
    pre-replay snapshot. An earlier version that read it during replay changed the probe's tokens with the traffic
    on the H200. Nothing here reads a tensor back to the host, so it can be captured.
    """
    gather = compat.kv_indices_kernel()
    verify = backend.forward_metadata
    bs = int(forward_batch.batch_size)
    rows = bs * steps_plus_one
    device = verify.kv_indptr.device
    prefix_start = verify.kv_indptr[:bs].to(torch.int64)
    prefix_lens = verify.kv_indptr[1 : bs + 1].to(torch.int64) - prefix_start
    draft_counts = torch.arange(1, steps_plus_one + 1, device=device, dtype=torch.int64)

    def per_row(per_request: torch.Tensor) -> torch.Tensor:  # expand, not repeat_interleave: never syncs
        return per_request.unsqueeze(1).expand(bs, steps_plus_one).reshape(-1)

    row_prefix_start = per_row(prefix_start)
    row_prefix_lens = per_row(prefix_lens)
    row_draft_counts = draft_counts.unsqueeze(0).expand(bs, steps_plus_one).reshape(-1)
    row_draft_start = per_row(torch.arange(bs, device=device, dtype=torch.int64) * steps_plus_one)
    row_lens = row_prefix_lens + row_draft_counts

    kv_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.cumsum(row_lens, dim=0)
    # Bounds that hold whatever the batch's host-side bookkeeping says (forward_batch.seq_lens_sum did not match
    # the verify metadata during CUDA-graph warm-up on the H200, and an index stream sized by it was overrun): every
    # prefix slot upstream listed is in ``verify.kv_indices``, and no row is longer than a req_to_token row.
    index_capacity = min(
        steps_plus_one * int(verify.kv_indices.numel()) + bs * steps_plus_one * (steps_plus_one + 1) // 2,
        rows * int(backend.req_to_token.shape[1]),
    )
    kv_indices = torch.empty(index_capacity, dtype=torch.int64, device=device)
    no_request = torch.zeros(rows, dtype=torch.int64, device=device)  # one flat source table, row 0
    gather[(rows,)](verify.kv_indices, no_request, row_prefix_lens, kv_indptr, row_prefix_start, kv_indices, 0)
    draft_offsets = kv_indptr[:rows].to(torch.int64) + row_prefix_lens
    gather[(rows,)](
        forward_batch.out_cache_loc, no_request, row_draft_counts, draft_offsets, row_draft_start, kv_indices, 0
    )

    def graph_buffer(name: str):
        # Per-layer scratch of the decode kernel: the backend's own decode graph buffers, which a verify graph
        # leaves unused, so capture adds no memory.
        buffer = getattr(backend, name, None) if capturing else None
        return buffer if buffer is not None and buffer.shape[0] >= rows else None

    shape = (rows, backend.num_head, backend.max_kv_splits)
    attn_logits = graph_buffer("cuda_graph_attn_logits")
    if attn_logits is None:
        attn_logits = torch.empty(shape + (backend.v_head_dim,), dtype=torch.float32, device=device)
    attn_lse = graph_buffer("cuda_graph_attn_lse")
    if attn_lse is None:
        attn_lse = torch.empty(shape, dtype=torch.float32, device=device)
    num_kv_splits = torch.empty(rows, dtype=torch.int32, device=device)
    backend.get_num_kv_splits(num_kv_splits, row_lens)

    return dataclasses.replace(
        verify,
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
            "sharing), which the decode-order verify of DETSPEC_*_INVARIANT does not support; use "
            "--speculative-algorithm DETSPEC_EAGLE"
        )
    rows = _rows_for(self, layer, forward_batch, q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim).shape[0])
    verify_metadata = self.forward_metadata
    self.forward_metadata = rows
    try:
        return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
    finally:
        self.forward_metadata = verify_metadata


def install_decode_order_verify(model_runner: Any) -> List[Any]:
    """Make every verify forward of ``model_runner`` use the decode kernel's order; return the patched backends.

    Call it after the target's attention backends exist and before its CUDA graphs are captured. Idempotent.
    Refuses (``RuntimeError`` naming the flag) a backend whose verify it cannot make identical to decode, rather
    than serving tokens that would silently differ from a non-speculative server's.
    """
    backends = verify_backends(model_runner)
    if not backends:
        raise RuntimeError(
            "sglang-detspec: the target model runner has no attention backend yet; the decode-order verify must be "
            "installed after init_attention_backends (sglang-detspec needs updating for this SGLang version)"
        )
    for backend in backends:
        _check_backend(backend)
    for backend in backends:
        if _PATCHED_ATTR not in backend.__dict__:
            backend.__dict__[_PATCHED_ATTR] = backend.forward_extend
            backend.forward_extend = types.MethodType(_decode_order_forward_extend, backend)
    logger.info(
        "sglang-detspec: the invariant verify runs its attention in the decode kernel's order on %d Triton "
        "backend(s) (split tile %s)", len(backends), backends[0].split_tile_size,
    )
    return backends
