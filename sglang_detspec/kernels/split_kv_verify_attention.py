"""Causal attention of a short query chain over its prefix, split over the keys in fixed tiles: batch-invariant and
parallel at batch 1.

What it computes: the same attention as SGLang's deterministic one-stage extend kernel (``_fwd_kernel_unified``)
for a verify of a topk-1 chain. Request ``b`` has ``q_len = qo_indptr[b+1] - qo_indptr[b]`` query tokens and
``kv_len = kv_indptr[b+1] - kv_indptr[b]`` keys: its prefix (``prefix_lens[b]`` keys), then the query tokens' own
keys. Query token ``j`` sees keys ``0 .. prefix_lens[b] + j`` (the prefix and drafts ``0 .. j``). Keys are read
through ``kv_indices`` (one cache slot per key, page size 1), with GQA (``q_heads = kv_heads x group``).

Why
---
The unified kernel runs one program per (request, query head, query block) and walks the whole context in each:
16 programs at batch 1 on a 16-head model, each reading every key, so a verify at ~1,500 tokens of context takes
about twice the non-deterministic two-stage kernel's time (H100, docs/results.md, 2026-12-07 second run). Here one
program per (request, KV head, query-row block, key tile) reads its tile's keys once for all query tokens and all
the heads of its group, and a second launch merges the tiles in their order.

Batch invariance
----------------
A query row's numbers depend only on its request's query and keys, the tile width ``split`` and the launch's
constexprs (``BLOCK_M``, ``BLOCK_N``, the warps), which are fixed by ``(group, max_q_len, split, head dims)``, not by
the batch. Tile ``s`` covers keys ``[s x split, (s+1) x split)``; its partial softmax is kept as (normalised output,
log-sum-exp); the merge folds tiles ``0, 1, ...`` in that order. So a request gives the same bits alone, beside
any other requests, in eager mode and under CUDA-graph replay. Its numbers differ from the unified kernel's (another
summation order), so switching kernels changes a seed's tokens; it does not make one output per seed depend on
anything else.

CUDA graphs
-----------
Capturable: no host synchronisation, the grid is fixed by ``max_splits`` (programs past a request's last tile
return at once). The caller passes the scratch (``partial_out``: ``[tokens, q_heads, >= max_splits, v_dim]``
float32, ``partial_lse``: ``[tokens, q_heads, >= max_splits]`` float32), e.g. a CUDA-graph pool buffer.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .launch_checks import INTERPRETED, require_cuda_or_interpreter

__all__ = ["split_kv_verify_attention", "split_kv_verify_attention_reference", "max_splits_for", "launch_shape"]

#: Keys per inner step of a tile (``split`` must be a multiple, or smaller). With 32 keys and at most 32 query rows
#: a program of head dim 128 takes ~205 registers and spills nothing on sm_90a (scripts/compile_kernels.py); 64 keys
#: spill.
BLOCK_N = 32
#: Most query rows (query tokens x heads of one KV group) one program holds; more rows take more programs.
MAX_BLOCK_M = 32


def max_splits_for(kv_len: int, split: int) -> int:
    """Key tiles of a request with ``kv_len`` keys (the grid's third dimension must cover the longest request)."""
    return max(1, -(-int(kv_len) // int(split)))


def launch_shape(group: int, max_q_len: int) -> "tuple[int, int]":
    """``(BLOCK_M, row blocks)``: query rows per program (a power of two >= 16) and programs per KV head and tile."""
    rows = int(group) * int(max_q_len)
    block_m = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(rows)))
    return block_m, -(-rows // block_m)


@triton.jit
def _tile_kernel(
    Q, K_Buffer, V_Buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, Part_O, Part_Lse,
    sm_scale, logit_cap,
    stride_qt, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh,
    stride_pot, stride_poh, stride_pos, stride_plt, stride_plh,
    GROUP: tl.constexpr, ROW_BLOCKS: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    Lk: tl.constexpr, Lv: tl.constexpr, HAS_CAP: tl.constexpr, FP32_DOTS: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1) // ROW_BLOCKS
    row_block = tl.program_id(1) % ROW_BLOCKS
    split_id = tl.program_id(2)

    q_start = tl.load(qo_indptr + req)
    q_len = tl.load(qo_indptr + req + 1) - q_start
    kv_start = tl.load(kv_indptr + req)
    kv_len = tl.load(kv_indptr + req + 1) - kv_start
    prefix = tl.load(prefix_lens + req)
    tile_start = split_id * SPLIT
    if tile_start < kv_len:
        tile_end = tl.minimum(tile_start + SPLIT, kv_len)
        rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
        token = rows // GROUP
        head = kv_head * GROUP + rows % GROUP
        row_ok = token < q_len
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q_rows = (q_start + token).to(tl.int64)
        q = tl.load(Q + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < Lk), other=0.0)
        # Query token j sees the prefix and drafts 0..j.
        visible_end = prefix + token + 1

        e_max = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        e_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        for start_n in range(tile_start, tile_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            in_tile = offs_n < tile_end
            slots = tl.load(kv_indices + kv_start + offs_n, mask=in_tile, other=0).to(tl.int64)
            k = tl.load(K_Buffer + slots[None, :] * stride_kbs + kv_head * stride_kh + offs_d[:, None],
                        mask=in_tile[None, :] & (offs_d[:, None] < Lk), other=0.0)
            if FP32_DOTS:
                qk = tl.dot(q.to(tl.float32), k.to(tl.float32)) * sm_scale
            else:
                qk = tl.dot(q, k) * sm_scale
            if HAS_CAP:
                qk = logit_cap * (2 * tl.sigmoid(2 * qk / logit_cap) - 1)
            seen = row_ok[:, None] & in_tile[None, :] & (offs_n[None, :] < visible_end[:, None])
            qk = tl.where(seen, qk, float("-inf"))
            v = tl.load(V_Buffer + slots[:, None] * stride_vbs + kv_head * stride_vh + offs_dv[None, :],
                        mask=in_tile[:, None] & (offs_dv[None, :] < Lv), other=0.0)
            new_max = tl.maximum(tl.max(qk, 1), e_max)
            # A row that has seen no key yet keeps max -inf; shift it by 0 so exp gives 0, not NaN.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            rescale = tl.exp(e_max - shift)
            p = tl.exp(qk - shift[:, None])
            if FP32_DOTS:
                acc = acc * rescale[:, None] + tl.dot(p, v.to(tl.float32))
            else:
                acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
            e_sum = e_sum * rescale + tl.sum(p, 1)
            e_max = new_max

        seen_any = e_sum > 0
        out = tl.where(seen_any[:, None], acc / tl.where(seen_any, e_sum, 1.0)[:, None], 0.0)
        lse = tl.where(seen_any, e_max + tl.log(tl.where(seen_any, e_sum, 1.0)), float("-inf"))
        tl.store(Part_O + q_rows[:, None] * stride_pot + head[:, None] * stride_poh + split_id * stride_pos
                 + offs_dv[None, :], out, mask=row_ok[:, None] & (offs_dv[None, :] < Lv))
        tl.store(Part_Lse + q_rows * stride_plt + head * stride_plh + split_id, lse, mask=row_ok)


@triton.jit
def _merge_kernel(
    Part_O, Part_Lse, Out, qo_indptr, kv_indptr, v_scale,
    stride_pot, stride_poh, stride_pos, stride_plt, stride_plh, stride_ot, stride_oh,
    SPLIT: tl.constexpr, BLOCK_DV: tl.constexpr, Lv: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.program_id(2)
    q_start = tl.load(qo_indptr + req)
    q_len = tl.load(qo_indptr + req + 1) - q_start
    if token < q_len:
        kv_len = tl.load(kv_indptr + req + 1) - tl.load(kv_indptr + req)
        tiles = tl.cdiv(kv_len, SPLIT)
        t = (q_start + token).to(tl.int64)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_dv = offs_dv < Lv
        e_max = -float("inf")
        e_sum = 0.0
        acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
        # Tile 0 holds key 0, which every query token sees, so e_max is finite from the first step on (a request
        # with no keys has no tiles).
        for s in range(0, tiles):
            part = tl.load(Part_O + t * stride_pot + head * stride_poh + s * stride_pos + offs_dv, mask=mask_dv,
                           other=0.0)
            lse = tl.load(Part_Lse + t * stride_plt + head * stride_plh + s)
            new_max = tl.maximum(lse, e_max)
            old_scale = tl.exp(e_max - new_max)
            weight = tl.exp(lse - new_max)
            acc = acc * old_scale + weight * part
            e_sum = e_sum * old_scale + weight
            e_max = new_max
        # A padded row of a CUDA-graph batch may have no keys: zeros, not 0 / 0.
        out = tl.where(e_sum > 0, acc / tl.where(e_sum > 0, e_sum, 1.0) * v_scale, 0.0)
        tl.store(Out + t * stride_ot + head * stride_oh + offs_dv, out.to(Out.dtype.element_ty), mask=mask_dv)


def _validate(q, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, partial_out, partial_lse,
              max_q_len, split, max_splits) -> None:
    if q.dim() != 3 or o.dim() != 3 or q.shape[:2] != o.shape[:2]:
        raise ValueError(f"q and o must be [tokens, q_heads, dim] with the same tokens and heads, got {tuple(q.shape)} "
                         f"and {tuple(o.shape)}")
    if k_buffer.dim() != 3 or v_buffer.dim() != 3 or k_buffer.shape[:2] != v_buffer.shape[:2]:
        raise ValueError(f"k_buffer and v_buffer must be [slots, kv_heads, dim] (page size 1), got "
                         f"{tuple(k_buffer.shape)} and {tuple(v_buffer.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16) or k_buffer.dtype != q.dtype or v_buffer.dtype != q.dtype:
        raise ValueError(f"q, k_buffer and v_buffer must share one dtype, float16 or bfloat16, got {q.dtype}, "
                         f"{k_buffer.dtype} and {v_buffer.dtype} (a quantised KV cache is not supported)")
    if q.shape[1] % k_buffer.shape[1]:
        raise ValueError(f"q_heads ({q.shape[1]}) must be a multiple of kv_heads ({k_buffer.shape[1]})")
    if q.shape[2] != k_buffer.shape[2] or o.shape[2] != v_buffer.shape[2]:
        raise ValueError(f"q's head dim must be the keys' ({q.shape[2]} vs {k_buffer.shape[2]}) and o's the values' "
                         f"({o.shape[2]} vs {v_buffer.shape[2]})")
    for name, t in (("q", q), ("o", o), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension, got strides {tuple(t.stride())}")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("prefix_lens", prefix_lens),
                    ("kv_indices", kv_indices)):
        if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64) or (t.numel() > 1 and t.stride(0) != 1):
            raise ValueError(f"{name} must be a dense 1-D int32 / int64 tensor, got {t.dtype} {tuple(t.shape)}")
    batch = prefix_lens.shape[0]
    if qo_indptr.shape[0] < batch + 1 or kv_indptr.shape[0] < batch + 1:
        raise ValueError(f"qo_indptr and kv_indptr need batch + 1 = {batch + 1} entries, got {qo_indptr.shape[0]} "
                         f"and {kv_indptr.shape[0]}")
    want = (q.shape[0], q.shape[1])
    if (partial_out.dim() != 4 or tuple(partial_out.shape[:2]) < want or partial_out.shape[2] < max_splits
            or partial_out.shape[3] < v_buffer.shape[2] or partial_out.dtype != torch.float32
            or partial_out.stride(-1) != 1):
        raise ValueError(f"partial_out must be float32 [>= {want[0]}, >= {want[1]}, >= max_splits = {max_splits}, "
                         f">= {v_buffer.shape[2]}] dense in its last dim, got {partial_out.dtype} "
                         f"{tuple(partial_out.shape)}")
    if (partial_lse.dim() != 3 or tuple(partial_lse.shape[:2]) < want or partial_lse.shape[2] < max_splits
            or partial_lse.dtype != torch.float32 or partial_lse.stride(-1) != 1):
        raise ValueError(f"partial_lse must be float32 [>= {want[0]}, >= {want[1]}, >= max_splits = {max_splits}], "
                         f"got {partial_lse.dtype} {tuple(partial_lse.shape)}")
    if max_q_len < 1 or split < 1 or max_splits < 1:
        raise ValueError(f"max_q_len, split and max_splits must be >= 1, got {max_q_len}, {split}, {max_splits}")
    if split > BLOCK_N and split % BLOCK_N:
        raise ValueError(f"split must be <= {BLOCK_N} or a multiple of {BLOCK_N}, got {split}")
    require_cuda_or_interpreter(q, "sglang_detspec.kernels.split_kv_verify_attention.split_kv_verify_attention_reference")


def split_kv_verify_attention(
    q: torch.Tensor, o: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, prefix_lens: torch.Tensor,
    *, max_q_len: int, split: int, max_splits: int, partial_out: torch.Tensor, partial_lse: torch.Tensor,
    sm_scale: float, logit_cap: float = 0.0, v_scale: float = 1.0, num_warps: Optional[int] = None,
) -> torch.Tensor:
    """Write into ``o`` (``[tokens, q_heads, v_dim]``) the causal chain attention described in the module docstring.

    Args:
        q: ``[tokens, q_heads, dim]``; request b's query tokens are rows ``qo_indptr[b] .. qo_indptr[b+1]``.
        k_buffer, v_buffer: ``[slots, kv_heads, dim]`` caches; key n of request b is slot
            ``kv_indices[kv_indptr[b] + n]``; the last ``q_len`` keys are the query tokens' own.
        prefix_lens: ``[batch]`` keys before the query tokens (``kv_len - q_len``).
        max_q_len: the most query tokens of a request (fixes the launch: keep it constant per server).
        split: keys per tile (fixed per server: the tiling is part of the numbers).
        max_splits: tiles the grid covers, at least ``ceil(max kv_len / split)``; more only costs empty programs.
        sm_scale: the softmax scale (times the key scale); ``logit_cap`` > 0 caps logits as ``cap x tanh(x / cap)``.

    Returns ``o``. Never synchronises with the host.
    """
    _validate(q, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, partial_out, partial_lse,
              max_q_len, split, max_splits)
    batch = prefix_lens.shape[0]
    q_heads, kv_heads = q.shape[1], k_buffer.shape[1]
    group = q_heads // kv_heads
    if batch == 0 or q.shape[0] == 0:
        return o
    block_m, row_blocks = launch_shape(group, max_q_len)
    warps = num_warps if num_warps is not None else 4
    _tile_kernel[(batch, kv_heads * row_blocks, max_splits)](
        q, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, partial_out, partial_lse,
        float(sm_scale), float(logit_cap),
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2), partial_lse.stride(0),
        partial_lse.stride(1),
        GROUP=group, ROW_BLOCKS=row_blocks, SPLIT=int(split), BLOCK_M=block_m, BLOCK_N=min(BLOCK_N, int(split)),
        BLOCK_D=triton.next_power_of_2(q.shape[2]), BLOCK_DV=triton.next_power_of_2(v_buffer.shape[2]),
        Lk=q.shape[2], Lv=v_buffer.shape[2], HAS_CAP=logit_cap > 0,
        # The interpreter casts float32 -> bfloat16 wrongly; there bfloat16 operands meet in float32 dots.
        FP32_DOTS=INTERPRETED and k_buffer.dtype == torch.bfloat16,
        num_warps=warps, num_stages=1 if INTERPRETED else 2,
    )
    # The interpreter (Triton 3.6) stores fp32 -> bfloat16 casts wrongly: there the merge writes fp32, torch rounds.
    merged = torch.empty(o.shape, dtype=torch.float32, device=o.device) if INTERPRETED and o.dtype == torch.bfloat16 \
        else o
    _merge_kernel[(batch, q_heads, max_q_len)](
        partial_out, partial_lse, merged, qo_indptr, kv_indptr, float(v_scale),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2), partial_lse.stride(0),
        partial_lse.stride(1), merged.stride(0), merged.stride(1),
        SPLIT=int(split), BLOCK_DV=triton.next_power_of_2(v_buffer.shape[2]), Lv=v_buffer.shape[2],
        num_warps=4 if INTERPRETED else 2,
    )
    if merged is not o:
        o.copy_(merged)
    return o


def split_kv_verify_attention_reference(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, prefix_lens: torch.Tensor, *, sm_scale: float,
    logit_cap: float = 0.0, v_scale: float = 1.0,
) -> torch.Tensor:
    """Pure torch, float64, one softmax per request (no tiles): the attention the kernel computes, on any device.

    Returns ``[tokens, q_heads, v_dim]`` float64."""
    q_heads, kv_heads = q.shape[1], k_buffer.shape[1]
    group = q_heads // kv_heads
    out = torch.zeros(q.shape[0], q_heads, v_buffer.shape[2], dtype=torch.float64, device=q.device)
    for b in range(prefix_lens.shape[0]):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        slots = kv_indices[k0:k1].long()
        keys = k_buffer[slots].double().repeat_interleave(group, dim=1)  # [kv_len, q_heads, dim]
        values = v_buffer[slots].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,nhd->htn", q[q0:q1].double(), keys) * sm_scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        positions = torch.arange(k1 - k0, device=q.device)
        visible = positions[None, :] < (int(prefix_lens[b]) + torch.arange(q1 - q0, device=q.device) + 1)[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[q0:q1] = torch.einsum("htn,nhd->thd", torch.softmax(scores, dim=-1), values) * v_scale
    return out
