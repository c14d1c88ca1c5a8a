"""EXPERIMENT (not used by the product): stage 1 of the fused sampler with fewer ALU-pipe instructions per element.

Why: the sm_90 SASS of the product's stage 1 (one 4096-column chunk per program) spends ~42 instructions per
element, ~25 of them on the ALU pipe (LOP3, SHF, SEL, ISETP, FMNMX, FSETP, LEA), which is 16 lanes wide on an
H100/H200 SM sub-partition: at B=128, V=163840 that alone is ~31 us at 1.98 GHz, against 20.5 us to read
``probs`` -- the measured 40.6 us fits an ALU-bound kernel, and a loop-over-chunks stage 1 with cp.async
pipelining (which would help a latency-bound one) measured 49-54 us.  Switches (compile-time):

* ``MUL_SHIFT``: the finalizer's three ``x >> n`` as ``umulhi(x, 2**(32-n))`` (IMAD.HI on the FMA pipe).
* ``KB1``: the series' float bits ``~h | 0x4B000000`` (one LOP3; the product masks ``~h`` to 23 bits first,
  two LOP3).  Equal wherever the series is selected (``h >= 0xFF800000`` means ``~h < 2**23``).
* ``SEL_LG``: the series chosen by a float compare of ``lg2(u)`` (after the MUFU) instead of ``h >= 0xFF800000``
  (right after the hash): the product's predicate lives across the tile and ptxas spills it bit by bit.
* ``PREFETCH``: an L2 prefetch of the tile's lines before the hash (ptxas issues the real loads late).
* ``CAND``: 0 = the product's candidate pass (an i1 candidate mask kept live across the block reductions,
  which ptxas packs bit by bit into a register, an integer count and an integer first index); 1 = a float
  indicator ``sat(s*K - thr'*K)`` (exactly 1.0 iff ``s >= thr``, FMA pipe), its sum (the count) and the
  sum of ``indicator * (2**23 + i)`` (the lone candidate's index when the count is 1); the rare branches
  (near ties, all-zero / low chunks) re-read ``p`` and re-hash from fresh row words (volatile loads, so
  that the compiler cannot keep the hot path's registers alive for them).

Same stage 2 and the same exact float64 scoring as the product; ``tests/unit/test_stage1_lean_experiment.py``
checks the tokens against the reference on CPU.  Measure with
``PYTHONPATH=$PWD python scripts/bench_kernel_variants.py --out DIR --configs base lean_...``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_detspec.kernels.seeded_draft_sample import (
    _CAND_REL,
    _INT_MAX,
    _LOW_SCORE,
    _UNSCORED,
    INTERPRETED,
    _launch_entry,
    _lg2_f32,
    _max_nan,
    _mix32,
    _recip_f32,
    _resolve_candidates,
    _stage2_kernel,
)


@triton.jit
def _shr(x, n: tl.constexpr, MUL: tl.constexpr):
    if MUL:
        return tl.umulhi(x, 1 << (32 - n))  # the high word of x * 2**(32-n) is x >> n
    else:
        return x >> n


@triton.jit
def _fmix32_v(h, MUL: tl.constexpr):
    h = h ^ _shr(h, 16, MUL) ^ 16  # (h ^ 16) >> 16 == h >> 16: the length word folds into the first xor
    h = h * 0x85EBCA6B
    h = h ^ _shr(h, 13, MUL)
    h = h * 0xC2B2AE35
    return h ^ _shr(h, 16, MUL)


# float32 just above log2(1 - 2**-9) + 2**-22: lg2.approx(u) > this only if h >= 0xFF800000 (lg2.approx is
# within 2**-22 of log2, and every smaller hash has a float32 u <= 1 - 2**-9)
_SERIES_LG = tl.constexpr(-0.0028202806133776903)


@triton.jit
def _neg_log2_u_v(h, FAST: tl.constexpr, KB1: tl.constexpr, SEL_LG: tl.constexpr):
    """The product's ``_neg_log2_u_f32`` with the series' float bits formed by one LOP3 when KB1, and the
    series chosen by ``lg > _SERIES_LG`` when SEL_LG (a predicate computed after the MUFU, so that it is not
    live across the whole tile and spilled bit by bit into registers)."""
    u = h.to(tl.float32) * 2.3283064365386963e-10 + 1.1641532182693481e-10
    lg = _lg2_f32(u, FAST)
    if KB1:
        kb = (h ^ 0xFFFFFFFF) | 0x4B000000  # 2**23 + ~h wherever the series is selected (~h < 2**23)
    else:
        kb = ((h ^ 0xFFFFFFFF) & 0x7FFFFF) | 0x4B000000
    w = kb.to(tl.float32, bitcast=True) * 2.3283064365386963e-10 + (1.1641532182693481e-10 - 0.001953125)
    poly = w * (1.4426950408889634 + w * 0.7213475204444817)
    if SEL_LG:
        # a top hash with lg <= _SERIES_LG has w >= 2**-9 - 2**-21.5: -lg is as accurate there as at w = 2**-9
        e2 = tl.where(lg > _SERIES_LG, poly, -lg)
    else:
        e2 = tl.where(h >= 0xFF800000, poly, -lg)
    return e2


@triton.jit
def _scores(p, h_row, cols, greedy, FAST: tl.constexpr, MUL_SHIFT: tl.constexpr, KB1: tl.constexpr,
            SEL_LG: tl.constexpr):
    if greedy:
        s = p
    else:
        h = _fmix32_v(_mix32(h_row, cols.to(tl.uint32)), MUL_SHIFT)
        s = p * _recip_f32(_neg_log2_u_v(h, FAST, KB1, SEL_LG), FAST)
    return s


@triton.jit
def _row_words(seed_ptr, pos_ptr, row, VOLATILE: tl.constexpr):
    seed = tl.load(seed_ptr + row, volatile=VOLATILE).to(tl.int64)
    lo = (seed & 0xFFFFFFFF) + 0x545F0000
    hi = ((seed >> 32) & 0xFFFFFFFF) + 0x44524146 + (lo >> 32)
    pos = tl.load(pos_ptr + row, volatile=VOLATILE).to(tl.int64) & 0xFFFFFFFF
    h = tl.zeros([], dtype=tl.uint32)
    h = _mix32(h, (lo & 0xFFFFFFFF).to(tl.uint32))
    h = _mix32(h, (hi & 0xFFFFFFFF).to(tl.uint32))
    h = _mix32(h, pos.to(tl.uint32))
    return h


@triton.jit
def _sat_fma(a, b, c, FAST: tl.constexpr):
    if FAST:
        r = tl.inline_asm_elementwise("fma.rn.sat.f32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        r = tl.minimum(tl.maximum(a * b + c, 0.0), 1.0)
    return r


@triton.jit
def _stage1_lean_kernel(
    probs_ptr, row_stride, seed_ptr, pos_ptr, greedy_ptr, part_score_ptr, part_idx_ptr, V, col_base, NC,
    HAS_GREEDY: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
    MUL_SHIFT: tl.constexpr, KB1: tl.constexpr, CAND: tl.constexpr, SEL_LG: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = probs_ptr + row.to(tl.int64) * row_stride
    h_row = _row_words(seed_ptr, pos_ptr, row, False)
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + row) != 0
    else:
        greedy = False
    lo = c * BLOCK
    offs = lo + tl.arange(0, BLOCK)
    valid = offs < V
    if PREFETCH:
        # ptxas sinks the tile's loads below the hash (their first use), so their latency is not hidden by this
        # program's own work: ask for the tile's 128-byte lines into L2 first (one prefetch per thread)
        line = lo + tl.arange(0, BLOCK // 32) * 32
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                  [row_ptr + tl.minimum(line, V - 1)], dtype=tl.int32, is_pure=False, pack=1)
    if lo + BLOCK <= V:
        p = tl.load(row_ptr + offs)
        s = _scores(p, h_row, col_base + offs, greedy, FAST, MUL_SHIFT, KB1, SEL_LG)
    else:
        p = tl.load(row_ptr + offs, mask=valid, other=0.0)
        s = tl.where(valid, _scores(p, h_row, col_base + offs, greedy, FAST, MUL_SHIFT, KB1, SEL_LG), float("-inf"))
    if FAST:
        m = tl.reduce(s, 0, _max_nan)
    else:
        m = tl.where(tl.max((s != s).to(tl.int32), 0) > 0, float("nan"), tl.max(s, 0))

    res_score = tl.zeros([], dtype=tl.float64)
    res_idx = lo
    if greedy:
        first_nan = tl.min(tl.where(s != s, offs, _INT_MAX), 0)
        first_max = tl.min(tl.where(s == m, offs, _INT_MAX), 0)
        res_score = m.to(tl.float64)
        res_idx = tl.where(m != m, first_nan, first_max)
    elif (m >= _LOW_SCORE) & (m < float("inf")):
        thr = m * _CAND_REL
        if CAND == 0:
            cand = s >= thr
            n = tl.sum(cand.to(tl.int32), 0)
            j = tl.min(tl.where(cand, offs, _INT_MAX), 0)
            if n == 1:
                res_idx = _UNSCORED - j
            else:
                res_score, res_idx = _resolve_candidates(row_ptr, cand, n, j, offs, h_row, col_base)
        else:
            # ind = 1.0 exactly iff s >= thr: with thr_lo the float below thr and K = 1 / (thr - thr_lo) (a
            # power of two), s >= thr gives s*K - thr_lo*K >= 1 and s <= thr_lo gives <= 0, and the fused
            # multiply-add rounds once, so saturation to [0, 1] leaves exactly 1.0 or 0.0.
            thr_lo = (thr.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)
            # 1 / (thr - thr_lo) from the exponent bits (the gap is a normal power of two, >= 2**-104)
            k_scale = ((254 << 23) - (thr - thr_lo).to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
            ind = _sat_fma(s, k_scale, -(thr_lo * k_scale), FAST)
            n = tl.sum(ind, 0)
            # sum of ind * (2**23 + i): 2**23 + j exactly when j is the lone candidate (all terms < 2**24)
            tag = (tl.arange(0, BLOCK) | 0x4B000000).to(tl.float32, bitcast=True)
            jf = tl.sum(ind * tag, 0)
            if n < 1.5:
                res_idx = _UNSCORED - (lo + (jf - 8388608.0).to(tl.int32))
            else:
                # near ties: the candidates again, from a fresh read and fresh row words (same operations, so
                # the same float32 scores; the exactness argument holds for any computation within the bound)
                h2 = _row_words(seed_ptr, pos_ptr, row, True)
                p2 = tl.load(row_ptr + offs, mask=valid, other=0.0, volatile=True)
                s2 = tl.where(valid, _scores(p2, h2, col_base + offs, greedy, FAST, MUL_SHIFT, KB1, SEL_LG), float("-inf"))
                cand = s2 >= thr
                n2 = tl.sum(cand.to(tl.int32), 0)
                j = tl.min(tl.where(cand, offs, _INT_MAX), 0)
                res_score, res_idx = _resolve_candidates(row_ptr, cand, n2, j, offs, h2, col_base)
    else:
        if CAND == 0:
            pv = p
        else:
            pv = tl.load(row_ptr + offs, mask=valid, other=0.0, volatile=True)
        pmax = tl.max(tl.where(valid, pv, float("-inf")), 0)
        if m == 0:
            if pmax == 0:
                res_score = tl.zeros([], dtype=tl.float64)
                res_idx = tl.min(tl.where(valid & (pv == 0.0), offs, _INT_MAX), 0)
            elif pmax > 0:
                res_score = pmax.to(tl.float64) * 17179869184.0
                res_idx = -1
            else:
                res_idx = -2
        elif (m > 0) & (m < _LOW_SCORE):
            res_score = pmax.to(tl.float64) * 17179869184.0
            res_idx = -1
        else:
            res_idx = -2
    out = row * NC + c
    tl.store(part_score_ptr + out, res_score)
    tl.store(part_idx_ptr + out, res_idx)


def launch_lean(probs, sampling_seed, positions, draft_step, greedy=None, *, mul_shift=True, kb1=True, cand=1,
                sel_lg=True, prefetch=False, block=None, warps=None, maxnreg=None):
    """``_launch``-compatible (validated inputs): the lean stage 1 + the product's stage 2."""
    B, V = probs.shape
    out_p = torch.empty((B, 1), dtype=torch.float32, device=probs.device)
    out_idx = torch.empty((B, 1), dtype=torch.int64, device=probs.device)
    if B == 0:
        return out_p, out_idx
    tb, tw, _ = _launch_entry(B, V)
    if INTERPRETED and block is None:
        tb = max(1024, min(8192, triton.next_power_of_2(V)))  # the interpreter is much faster with wide programs
    block = block or tb
    warps = warps or tw
    nc = triton.cdiv(V, block)
    part_score = torch.empty((B, nc), dtype=torch.float64, device=probs.device)
    part_idx = torch.empty((B, nc), dtype=torch.int32, device=probs.device)
    seeds = sampling_seed.reshape(-1).contiguous()
    pos = positions.reshape(-1).contiguous()
    g = greedy.reshape(-1).contiguous() if greedy is not None else seeds
    col_base = int(draft_step) * V
    fast = probs.device.type == "cuda" and not INTERPRETED
    opts = {"maxnreg": maxnreg} if maxnreg and not INTERPRETED else {}
    _stage1_lean_kernel[(B, nc)](
        probs, probs.stride(0), seeds, pos, g, part_score, part_idx, V, col_base, nc,
        HAS_GREEDY=greedy is not None, BLOCK=block, FAST=fast, MUL_SHIFT=mul_shift, KB1=kb1, CAND=cand, SEL_LG=sel_lg,
        PREFETCH=prefetch and fast,
        num_warps=warps, **opts,
    )
    _stage2_kernel[(B,)](
        probs, probs.stride(0), seeds, pos, g, part_score, part_idx, out_p, out_idx, V, col_base, nc,
        HAS_GREEDY=greedy is not None, NC_POW2=max(16, triton.next_power_of_2(nc)), BLOCK=block, num_warps=4,
    )
    return out_p, out_idx
