"""EXPERIMENT (not used by the product): stage 1 of the fused sampler as a loop over chunks, so that the
loads of the next chunks overlap the current chunk's arithmetic.

Why: on the H200 at B=128, V=163840 a stripped stage 1 that only reads ``probs`` takes 20.5 us and the
arithmetic adds about as much again (41.4 us in all), as if each SM alternated between loading and computing
(every one-chunk program loads its tile, then computes; programs of a wave run in step).  Here each program
walks chunks ``pid, pid + P, ...`` with ``tl.range(..., num_stages=S)``, which lets Triton's software
pipeliner issue the loads of the next ``S - 1`` chunks (``cp.async`` into shared memory) while the current
one is scored.  Same per-chunk code as the product (``_tile_scores`` + ``_chunk_partial``) and the product's
stage 2, so the tokens are the same by construction; ``tests/unit/test_stage1_loop_experiment.py`` checks
them against the reference on CPU.

Measure it against the product in one GPU process:
    PYTHONPATH=$PWD python scripts/bench_kernel_variants.py --out DIR --configs base loop_s2 loop_s3 loop_s3_b2k
Adopt it only on a measured win at B=128 with 0 parity mismatches; delete it otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_detspec.kernels.seeded_draft_sample import (
    INTERPRETED,
    _chunk_partial,
    _launch_entry,
    _row_prefix,
    _stage2_kernel,
    _tile_scores,
)


@triton.jit
def _stage1_loop_kernel(
    probs_ptr,
    row_stride,
    seed_ptr,
    pos_ptr,
    greedy_ptr,
    part_score_ptr,
    part_idx_ptr,
    V,
    col_base,
    NC,
    TOTAL,
    HAS_GREEDY: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST: tl.constexpr,
    STAGES: tl.constexpr,
    EVEN: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for t in tl.range(pid, TOTAL, nprog, num_stages=STAGES):
        row = t // NC
        c = t - row * NC
        row_ptr = probs_ptr + row.to(tl.int64) * row_stride
        h_row = _row_prefix(seed_ptr, pos_ptr, row)
        if HAS_GREEDY:
            greedy = tl.load(greedy_ptr + row) != 0
        else:
            greedy = False
        lo = c * BLOCK
        # masked unless every chunk is full (EVEN: V % BLOCK == 0): a load inside a runtime branch would not
        # be pipelined, so the choice is a compile-time one
        p, s = _tile_scores(row_ptr, lo, V, h_row, col_base, greedy, not EVEN, BLOCK, FAST)
        res_score, res_idx = _chunk_partial(row_ptr, h_row, col_base, greedy, lo, V, p, s, BLOCK, FAST)
        tl.store(part_score_ptr + t, res_score)
        tl.store(part_idx_ptr + t, res_idx)


#: (block, warps, stages, even, device index) -> resident programs per SM of the compiled loop kernel
_RESIDENT = {}


def resident_programs_per_sm(kernel, warps, device) -> int:
    """How many programs of a compiled kernel fit on one SM at once (registers, shared memory, threads).

    A persistent grid must not exceed this: a program that only starts when another has finished its whole
    share of chunks would double the kernel's time."""
    kernel._init_handles()
    props = torch.cuda.get_device_properties(device)
    regs_per_warp = -(-kernel.n_regs * 32 // 256) * 256  # allocated per warp in units of 256 registers
    by_regs = props.regs_per_multiprocessor // (regs_per_warp * warps)
    smem = int(kernel.metadata.shared)
    by_smem = props.shared_memory_per_multiprocessor // (smem + 1024) if smem else 32  # 1 KiB reserved per CTA
    by_threads = props.max_threads_per_multi_processor // (32 * warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def launch_loop(probs, sampling_seed, positions, draft_step, greedy=None, *, block=4096, warps=4, stages=2,
                programs_per_sm=None, even=True):
    """``_launch``-compatible (validated inputs): the loop stage 1 + the product's stage 2.

    ``block=None`` takes the product's launch table (1024 / 2048 / 4096 columns by B*V); ``even=False``
    masks every load even when ``V % block == 0`` (to measure what the mask costs); ``programs_per_sm=None``
    launches as many programs as the compiled kernel keeps resident (:func:`resident_programs_per_sm`)."""
    B, V = probs.shape
    out_p = torch.empty((B, 1), dtype=torch.float32, device=probs.device)
    out_idx = torch.empty((B, 1), dtype=torch.int64, device=probs.device)
    if B == 0:
        return out_p, out_idx
    if block is None:
        block = _launch_entry(B, V)[0]
    if INTERPRETED:
        block = max(block, 1024)
    nc = triton.cdiv(V, block)
    total = B * nc
    part_score = torch.empty((B, nc), dtype=torch.float64, device=probs.device)
    part_idx = torch.empty((B, nc), dtype=torch.int32, device=probs.device)
    seeds = sampling_seed.reshape(-1).contiguous()
    pos = positions.reshape(-1).contiguous()
    g = greedy.reshape(-1).contiguous() if greedy is not None else seeds
    col_base = int(draft_step) * V
    fast = probs.device.type == "cuda" and not INTERPRETED
    args = (probs, probs.stride(0), seeds, pos, g, part_score, part_idx, V, col_base, nc, total)
    meta = dict(HAS_GREEDY=greedy is not None, BLOCK=block, FAST=fast, STAGES=stages, EVEN=even and V % block == 0,
                num_warps=warps)
    if probs.device.type == "cuda":
        if programs_per_sm is None:
            key = (block, warps, stages, meta["EVEN"], meta["HAS_GREEDY"], probs.device.index)
            if key not in _RESIDENT:
                compiled = _stage1_loop_kernel.warmup(*args, grid=(1,), **meta)
                _RESIDENT[key] = resident_programs_per_sm(compiled, warps, probs.device)
            programs_per_sm = _RESIDENT[key]
        sms = torch.cuda.get_device_properties(probs.device).multi_processor_count
        nprog = min(total, sms * programs_per_sm)
    else:
        nprog = min(total, 3)  # interpreter: a few programs, each walking several chunks
    _stage1_loop_kernel[(nprog,)](*args, **meta)
    _stage2_kernel[(B,)](
        probs, probs.stride(0), seeds, pos, g, part_score, part_idx, out_p, out_idx, V, col_base, nc,
        HAS_GREEDY=greedy is not None, NC_POW2=max(16, triton.next_power_of_2(nc)), BLOCK=block, num_warps=4,
    )
    return out_p, out_idx
