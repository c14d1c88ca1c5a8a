#!/usr/bin/env python3
"""GPU checks of the fused seeded draft sampler (run on a CUDA machine; no SGLang needed).

    python scripts/gpu_kernel_checks.py --out DIR [--rows N] [--quick]

1. float32 filter bound: the compiled ``-log2(u)`` approximation is evaluated for ALL 2**32 hash values
   and compared with float64 (the exactness proof assumes a relative error below 2**-12.7; checked
   against 2**-12); the full float32 score ``p * rcp(E2)`` is checked on random (p, h) pairs.
2. Parity: >= 10**6 random rows (random int64 seeds, positions up to 2**40, draft steps 0..7,
   temperatures 0.3/1.0/3.0, top-k-truncated, flat and peaked rows, V in {151936, 163840, 32000, 50257,
   4099}, strided views, int32 positions, greedy rows) plus constructed near-tie and exact-tie rows and
   degenerate rows (all-zero, NaN, subnormal-only, inf): kernel indices vs a GPU float64 torch
   implementation of upstream's stream (op for op SGLang 0.5.23 ``fast_sample``), which itself is compared
   with the CPU reference (``sglang_detspec.stream.reference``) on a subsample.  Zero mismatches required.
3. Statistics (>= 10**6 draws each): chi-square goodness of fit on uniform, Zipf and peaked
   distributions (p > 1e-3 required); tail mass of tokens 18 and 20 nats below the top in a many-tail
   race (the vLLM method, PRs 43150/51367: one top token plus T tail tokens at -gap nats; z-score of the
   tail hit count, |z| <= 4 required); independence of draft steps k and k+1 at the same (seed, position)
   (chi-square independence on a 16x16 table, p > 1e-3, and |Pearson r| * sqrt(N) <= 4).
4. Coupled race (issue 18, ``kernels/coupled_race.py``): its float32 Gumbel screen against float64 for all 2**32
   hashes (2**-11 absolute), the ratio screen's float32 ``E = -log u`` in both forms (``lg2.approx``, the GPU
   default, and libdevice's ``logf``; 2**-12.8 relative), the ratio ``p * 2**64 / E32`` in both forms on random
   (p, h) (2**-12.8 + 2**-22 relative), and its tokens vs SGLang's own compiled ``sampling_from_probs_torch`` (the reference
   where SGLang is absent) on >= 10**6 rows incl. constructed near ties and u = 1 / u = 0 hashes, for the race on
   ``torch.log(probs)`` and for ``coupled_race_probs`` (the log taken in the kernel; its ``tl.log`` is also compared
   with ``torch.log`` on every float32 from +0 to +inf).  Zero mismatches.
Prints a summary and writes ``DIR/kernel_checks.json``; exit status 0 iff every check passed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from sglang_detspec.stream import reference  # noqa: E402
from sglang_detspec.bench.sampler_bench import rand_probs, tied_partner_prob  # noqa: E402
from sglang_detspec.bench.upstream_replica import (  # noqa: E402
    upstream_draft_hashes,
    upstream_seeded_fast_sample,
    upstream_seeded_scores,
)
from sglang_detspec.kernels import seeded_draft_sample  # noqa: E402
from sglang_detspec.kernels.seeded_draft_sample import neg_log2_u_f32, race_score_f32  # noqa: E402
from sglang_detspec.stream.coupled_reference import coupled_gumbel_reference, coupled_race_reference_probs, position_with_hash  # noqa: E402
from sglang_detspec.kernels.coupled_race import coupled_race, gumbel_f32  # noqa: E402
from sglang_detspec.kernels.coupled_scoring import exponential_f32  # noqa: E402
from sglang_detspec.kernels.coupled_race_probs import LAUNCH_TABLE, coupled_race_probs, ratio_f32  # noqa: E402

DEV = torch.device("cuda")
# the relative bound the kernel's exactness proof assumes for its float32 E2 and score (2**-12.7; checked
# against 2**-12, the proof's margin leaves room above that)
E2_BOUND = 2.0**-12


# ----------------------------------------------------------------------------------------------- 1
@triton.jit
def _e2_error_kernel(out_ptr, PER_PROG: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    worst = tl.zeros([BLOCK], dtype=tl.float64)
    base = pid.to(tl.int64) * PER_PROG
    for t in range(0, PER_PROG, BLOCK):
        hv = (base + t + tl.arange(0, BLOCK)).to(tl.uint32)
        e32 = neg_log2_u_f32(hv, True).to(tl.float64)
        u = (hv.to(tl.float64) + 0.5) * 2.3283064365386963e-10
        e64 = -tl.log(u) * 1.4426950408889634
        worst = tl.maximum(worst, tl.abs(e32 - e64) / e64)
    tl.store(out_ptr + pid, tl.max(worst, 0))


def check_e2_bound() -> dict:
    per_prog, block = 1 << 16, 1024
    n = (1 << 32) // per_prog
    out = torch.empty(n, dtype=torch.float64, device=DEV)
    t = time.time()
    _e2_error_kernel[(n,)](out, PER_PROG=per_prog, BLOCK=block)
    torch.cuda.synchronize()
    worst = float(out.max())
    arg = int(out.argmax())
    return dict(name="E2 approximation, all 2**32 hashes", max_rel_err=worst,
                log2_max_rel_err=math.log2(worst), worst_program=arg, bound=E2_BOUND, passed=worst < E2_BOUND,
                seconds=round(time.time() - t, 2))


@triton.jit
def _score_error_kernel(p_ptr, h_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    p = tl.load(p_ptr + offs, mask=m, other=1.0)
    h = tl.load(h_ptr + offs, mask=m, other=0).to(tl.uint32)
    s32 = race_score_f32(p, h, True).to(tl.float64)  # the kernel's expression
    u = (h.to(tl.float64) + 0.5) * 2.3283064365386963e-10
    s64 = p.to(tl.float64) / (-tl.log(u) * 1.4426950408889634)
    tl.store(out_ptr + offs, tl.where(m, tl.abs(s32 - s64) / s64, 0.0), mask=m)


def check_score_bound(n: int = 1 << 26) -> dict:
    g = torch.Generator(device=DEV).manual_seed(7)
    # p log-uniform over [2**-120, 1]: the range where the kernel relies on the relative bound
    p = torch.exp2(-120 * torch.rand(n, device=DEV, generator=g)).float()
    h = torch.randint(0, 2**32, (n,), device=DEV, dtype=torch.int64, generator=g)
    # include the hash extremes
    h[:8] = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**32 - 2**24, 2**28], device=DEV)
    out = torch.empty(n, dtype=torch.float64, device=DEV)
    _score_error_kernel[(triton.cdiv(n, 1024),)](p, h, out, n, BLOCK=1024)
    worst = float(out.max())
    return dict(name="float32 score p * rcp(E2) on random (p, h)", samples=n, max_rel_err=worst,
                log2_max_rel_err=math.log2(worst), bound=E2_BOUND, passed=worst < E2_BOUND)


# ----------------------------------------------------------------------------------------------- 2
def _compare(probs, seeds, pos, step, greedy=None) -> int:
    _, ik = seeded_draft_sample(probs, seeds, pos, step, greedy=greedy)
    _, iu = upstream_seeded_fast_sample(probs, seeds, pos.to(torch.int64), step)
    if greedy is not None:
        iu = torch.where(greedy.view(-1, 1), probs.argmax(-1, keepdim=True), iu)
    return int((ik != iu).sum())


def check_parity(total_rows: int, log) -> dict:
    g = torch.Generator(device=DEV).manual_seed(1234)
    vocabs = [151936, 163840, 32000, 50257, 4099]
    kinds = ["dense", "dense", "topk1000", "topk50", "flat", "peaked"]
    temps = [0.3, 1.0, 3.0]
    rows = mism = batches = 0
    per_kind: dict = {}
    t0 = time.time()
    while rows < total_rows:
        V = vocabs[batches % len(vocabs)]
        kind = kinds[(batches // len(vocabs)) % len(kinds)]
        temp = temps[batches % len(temps)]
        B = max(64, min(4096, (600_000_000 // 12) // V))
        step = int(torch.randint(0, 8, (1,), generator=torch.Generator().manual_seed(batches)))
        seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64, generator=g)
        pos = torch.randint(0, 2**40, (B,), device=DEV, dtype=torch.int64, generator=g)
        variant = batches % 4
        if variant == 1:  # int32 positions
            pos = (pos % (2**31)).to(torch.int32)
        if variant == 2:  # strided row view of a [B, S, V] buffer (multi-layer single-CG layout)
            S = 3
            buf = torch.zeros(B, S, V, device=DEV)
            buf[:, 1] = rand_probs(kind, B, V, temp, g)
            probs = buf[:, 1]
        else:
            probs = rand_probs(kind, B, V, temp, g)
        greedy = (torch.rand(B, device=DEV, generator=g) < 0.1) if variant == 3 else None
        mm = _compare(probs, seeds, pos, step, greedy)
        key = f"{kind}/T{temp}"
        a = per_kind.setdefault(key, [0, 0])
        a[0] += B
        a[1] += mm
        rows += B
        mism += mm
        batches += 1
        if batches % 25 == 0:
            log(f"  parity: {rows} rows, {mism} mismatches, {time.time() - t0:.0f}s")
        del probs
    return dict(name="parity vs GPU float64 upstream stream (random rows)", rows=rows, mismatches=mism,
                per_kind=per_kind, passed=mism == 0, seconds=round(time.time() - t0, 1))


def check_near_ties(n_rows: int, log) -> dict:
    """Rows whose top two float64 scores are within a few float32 ulp of p, same tile / chunk or apart.

    (Exact float64 ties between tokens with positive scores essentially never occur: within a row the
    hash is a bijection of the column word, so the reciprocals differ; ``exact_float64_ties`` counts
    any that the construction happens to produce.)"""
    g = torch.Generator(device=DEV).manual_seed(99)
    total = mism = exact_ties = 0
    V = 163840
    B = 1024
    for it in range(max(1, n_rows // B)):
        seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64, generator=g)
        pos = torch.randint(0, 2**32, (B,), device=DEV, dtype=torch.int64, generator=g)
        step = it % 4
        base = torch.rand(B, V, device=DEV, generator=g) * 1e-7
        ones = torch.ones(B, V, device=DEV)
        sc = upstream_seeded_scores(ones, seeds, pos, step)  # 1/E per token, float64
        i = torch.randint(0, V // 2, (B,), device=DEV, generator=g)
        # same lane (distance = multiple of 1024), same chunk, or far apart
        sep = torch.tensor([1024, 2048, 1, 7, 8192 + 3, 70001], device=DEV)[torch.arange(B, device=DEV) % 6]
        j = i + sep
        ri = sc.gather(1, i[:, None]).squeeze(1)
        rj = sc.gather(1, j[:, None]).squeeze(1)
        pi = torch.full((B,), 0.3, device=DEV)
        best_pj = tied_partner_prob(ri, rj, pi)
        probs = base
        probs.scatter_(1, i[:, None], pi[:, None])
        probs.scatter_(1, j[:, None], best_pj[:, None])
        s_full = upstream_seeded_scores(probs, seeds, pos, step)
        top2 = s_full.topk(2, dim=-1).values
        exact_ties += int((top2[:, 0] == top2[:, 1]).sum())
        mism += _compare(probs, seeds, pos, step)
        total += B
        del probs, sc, s_full, base, ones
    log(f"  near-ties: {total} rows, {exact_ties} exact float64 ties, {mism} mismatches")
    return dict(name="constructed near-tie rows", rows=total, exact_float64_ties=exact_ties, mismatches=mism,
                passed=mism == 0)


def check_degenerate() -> dict:
    V = 163840
    B = 16
    probs = torch.softmax(torch.randn(B, V, device=DEV) * 3, -1)
    probs[0].zero_()  # all-zero row -> token 0
    probs[1, 777] = float("nan")
    probs[1, 99999] = float("nan")  # first NaN wins
    probs[2].zero_()
    probs[2, 12345] = 1e-45  # one subnormal, rest zero
    probs[3].zero_()
    probs[3, 5] = 1e-40
    probs[3, 150000] = 2e-40  # subnormals only
    probs[4] = torch.rand(V, device=DEV) * 1e-30  # tiny row ("low" chunks everywhere)
    probs[5, 4321] = float("inf")
    probs[6, :100] = -0.0
    probs[7, 10] = -1.0
    probs[8, :] = 0.0
    probs[8, -1] = 0.5  # only the last token
    probs[9] = 1.0 / V  # flat
    probs[10, 70000:] = 0  # zero tail
    seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64)
    pos = torch.randint(0, 2**40, (B,), device=DEV, dtype=torch.int64)
    res = {}
    for step in (0, 3):
        _, ik = seeded_draft_sample(probs, seeds, pos, step)
        _, iu = upstream_seeded_fast_sample(probs, seeds, pos, step)
        res[step] = dict(kernel=ik.flatten().tolist(), upstream=iu.flatten().tolist())
    mism = sum(int(a != b) for s in res.values() for a, b in zip(s["kernel"], s["upstream"]))
    return dict(name="degenerate rows (zero, NaN, subnormal, tiny, inf, -0.0, negative)", mismatches=mism,
                detail=res, passed=mism == 0)


def check_cpu_reference(n_rows: int) -> dict:
    """The GPU float64 stream (upstream ops) equals the CPU reference (hashes and indices) on a subsample."""
    g = torch.Generator(device=DEV).manual_seed(5)
    mism_h = mism_i = rows = 0
    for V, step, kind in [(151936, 0, "dense"), (163840, 5, "topk1000"), (32000, 2, "flat"), (4099, 7, "dense")]:
        B = max(1, n_rows // 4)
        probs = rand_probs(kind, B, V, 1.0, g)
        seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64, generator=g)
        pos = torch.randint(0, 2**40, (B,), device=DEV, dtype=torch.int64, generator=g)
        hg = upstream_draft_hashes(seeds, pos, step, V)
        hc = reference.murmur3_draft_hash(seeds.cpu(), pos.cpu(), step, V)
        mism_h += int((hg.to(torch.int64).cpu() != hc).sum())
        _, iu = upstream_seeded_fast_sample(probs, seeds, pos, step)
        _, ir = reference.seeded_draft_sample(probs.cpu(), seeds.cpu(), pos.cpu(), step)
        mism_i += int((iu.cpu() != ir).sum())
        rows += B
    return dict(name="GPU float64 stream vs CPU reference", rows=rows, hash_mismatches=mism_h,
                index_mismatches=mism_i, passed=mism_h == 0 and mism_i == 0)


# ----------------------------------------------------------------------------------------------- 3
def _chi2_sf(x: float, k: int) -> float:
    try:
        from scipy.stats import chi2

        return float(chi2.sf(x, k))
    except Exception:  # Wilson-Hilferty (accurate for the dof used here)
        z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
        return 0.5 * math.erfc(z / math.sqrt(2))


def _draw(p: torch.Tensor, n: int, g, step: int = 0, seeds=None, pos=None):
    V = p.numel()
    probs = p.view(1, V).expand(n, V)  # row stride 0: n draws from one distribution, no copies
    if seeds is None:
        seeds = torch.randint(-(2**63), 2**63 - 1, (n,), device=DEV, dtype=torch.int64, generator=g)
        pos = torch.randint(0, 2**40, (n,), device=DEV, dtype=torch.int64, generator=g)
    return seeded_draft_sample(probs, seeds, pos, step)[1].view(-1)


def check_statistics(n: int) -> list:
    g = torch.Generator(device=DEV).manual_seed(2024)
    out = []
    V = 1000
    zipf = 1.0 / torch.arange(1, V + 1, device=DEV, dtype=torch.float64)
    peaked = torch.full((V,), 0.1 / (V - 1), device=DEV, dtype=torch.float64)
    peaked[17] = 0.9
    for name, p in [("uniform", torch.full((V,), 1.0 / V, device=DEV, dtype=torch.float64)), ("zipf", zipf),
                    ("peaked", peaked)]:
        p32 = (p / p.sum()).float()
        counts = torch.zeros(V, dtype=torch.float64, device=DEV)
        for _ in range(n // 500_000):
            counts += torch.bincount(_draw(p32, 500_000, g), minlength=V).double()
        N = counts.sum()
        exp = p32.double() / p32.double().sum() * N
        chi = float(((counts - exp) ** 2 / exp).sum())
        pv = _chi2_sf(chi, V - 1)
        out.append(dict(name=f"chi-square {name}", draws=int(N), chi2=chi, dof=V - 1, p_value=pv, passed=pv > 1e-3))
    # many-tail race: 1 top token + T tail tokens at -gap nats
    T = 262143
    for gap in (18.0, 20.0):
        logits = torch.full((T + 1,), -gap, device=DEV, dtype=torch.float64)
        logits[0] = 0.0
        p = torch.softmax(logits, 0).float()
        m = float(p[1:].double().sum() / p.double().sum())
        hits = 0
        N = 0
        for _ in range(n // 250_000):
            x = _draw(p, 250_000, g)
            hits += int((x != 0).sum())
            N += x.numel()
        z = (hits - N * m) / math.sqrt(N * m * (1 - m))
        out.append(dict(name=f"tail mass {gap:.0f} nats below top (T={T})", draws=N, expected=N * m, hits=hits,
                        z=z, passed=abs(z) <= 4))
    # draft steps k and k+1 at the same (seed, position): independent
    V = 16
    p = torch.full((V,), 1.0 / V, device=DEV)
    table = torch.zeros(V, V, dtype=torch.float64, device=DEV)
    xs_all, ys_all = [], []
    for _ in range(n // 500_000):
        seeds = torch.randint(-(2**63), 2**63 - 1, (500_000,), device=DEV, dtype=torch.int64, generator=g)
        pos = torch.randint(0, 2**40, (500_000,), device=DEV, dtype=torch.int64, generator=g)
        k = int(torch.randint(0, 6, (1,)))
        x = _draw(p, 500_000, g, k, seeds, pos)
        y = _draw(p, 500_000, g, k + 1, seeds, pos)
        table += torch.bincount(x * V + y, minlength=V * V).double().view(V, V)
        xs_all.append(x.double())
        ys_all.append(y.double())
    xs, ys = torch.cat(xs_all), torch.cat(ys_all)
    r = float(torch.corrcoef(torch.stack([xs, ys]))[0, 1])
    N = table.sum()
    exp = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / N
    chi = float(((table - exp) ** 2 / exp).sum())
    dof = (V - 1) ** 2
    pv = _chi2_sf(chi, dof)
    out.append(dict(name="draft step k vs k+1 independence", draws=int(N), chi2=chi, dof=dof, p_value=pv,
                    pearson_r=r, r_sqrt_n=r * math.sqrt(float(N)), passed=pv > 1e-3 and abs(r) * math.sqrt(float(N)) <= 4))
    return out

# ----------------------------------------------------------------------------------------------- 4
# The coupled race (kernels/coupled_race.py, issue 18): its float32 screen over all hashes, and its tokens vs
# SGLang's own compiled sampling_from_probs_torch (token-id keyed) on >= 10**6 rows -- or, without SGLang, vs
# the reference on the GPU (torch's own CUDA division: the reciprocal form).
@triton.jit
def _gumbel_error_kernel(out_ptr, PER_PROG: tl.constexpr, BLOCK: tl.constexpr):
    worst = tl.zeros([BLOCK], dtype=tl.float64)
    base = tl.program_id(0).to(tl.int64) * PER_PROG
    for t in range(0, PER_PROG, BLOCK):
        hv = (base + t + tl.arange(0, BLOCK)).to(tl.uint32)
        a = tl.log(hv.to(tl.float64) * 2.3283064370807974e-10)  # SGLang's float64 g (reciprocal form, capped)
        a = tl.where(a < -1.7976931348623157e308, -1.7976931348623157e308, a)
        a = tl.where(a > -2.3283064365386963e-10, -2.3283064365386963e-10, a)
        worst = tl.maximum(worst, tl.abs(gumbel_f32(hv).to(tl.float64) + tl.log(-a)))
    tl.store(out_ptr + tl.program_id(0), tl.max(worst, 0))


def check_gumbel_screen() -> dict:
    out = torch.empty((1 << 32) >> 16, dtype=torch.float64, device=DEV)
    _gumbel_error_kernel[(out.numel(),)](out, PER_PROG=1 << 16, BLOCK=1024)
    worst = float(out.max())  # the proof assumes 2**-12.8; the candidate margin 2**-8 covers twice 2**-11
    return dict(name="coupled race: float32 Gumbel screen, all 2**32 hashes", max_abs_err=worst,
                log2_max_abs_err=math.log2(worst), bound=2.0**-11, passed=worst < 2.0**-11)


@triton.jit
def _exponential_error_kernel(out_ptr, PER_PROG: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    worst = tl.zeros([BLOCK], dtype=tl.float64)
    base = tl.program_id(0).to(tl.int64) * PER_PROG
    for t in range(0, PER_PROG, BLOCK):
        hv = (base + t + tl.arange(0, BLOCK)).to(tl.uint32)
        a = tl.log(hv.to(tl.float64) * 2.3283064370807974e-10)  # SGLang's float64 log u (reciprocal form, capped)
        a = tl.where(a > -2.3283064365386963e-10, -2.3283064365386963e-10, a)
        rel = tl.abs(exponential_f32(hv, FAST).to(tl.float64) + a) / -a
        worst = tl.maximum(worst, tl.where(hv != 0, rel, 0.0))  # h = 0 gets a stand-in every caller replaces
    tl.store(out_ptr + tl.program_id(0), tl.max(worst, 0))


def check_exponential_screen(fast: bool) -> dict:
    """The ratio screen's float32 ``E = -log u`` (kernels/coupled_race.py::exponential_f32) in the form
    coupled_race_probs runs (``fast``: lg2.approx, its GPU default; else libdevice's logf), all hashes but 0."""
    out = torch.empty((1 << 32) >> 16, dtype=torch.float64, device=DEV)
    _exponential_error_kernel[(out.numel(),)](out, PER_PROG=1 << 16, BLOCK=1024, FAST=fast)
    worst = float(out.max())  # the ratio screen's bound assumes 2**-12.8 (kernels/coupled_race.py docstring)
    return dict(name=f"coupled race: float32 ratio-screen E ({'lg2.approx' if fast else 'logf'}), all 2**32 hashes",
                max_rel_err=worst, log2_max_rel_err=math.log2(worst) if worst > 0 else float("-inf"),
                bound=2.0**-12.8, passed=worst < 2.0**-12.8)


@triton.jit
def _ratio_error_kernel(p_ptr, h_ptr, out_ptr, N, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    p = tl.load(p_ptr + offs, mask=m, other=1.0)
    h = tl.load(h_ptr + offs, mask=m, other=1).to(tl.uint32)
    r32 = ratio_f32(p, h, FAST).to(tl.float64)  # the kernel's expression
    a = tl.log(h.to(tl.float64) * 2.3283064370807974e-10)  # SGLang's float64 log u (reciprocal form, capped)
    a = tl.where(a > -2.3283064365386963e-10, -2.3283064365386963e-10, a)
    r64 = p.to(tl.float64) * 18446744073709551616.0 / -a
    tl.store(out_ptr + offs, tl.where(m, tl.abs(r32 - r64) / r64, 0.0), mask=m)


def check_ratio_screen(fast: bool, n: int = 1 << 26) -> dict:
    """The ratio screen's float32 ``(p * 2**64) / E32`` (kernels/coupled_race_probs.py::ratio_f32) on random
    (p, h) with p log-uniform over [2**-149, 2**16] and the hash extremes, against float64; the bound is the
    proof's 2**-12.8 (E32) + 2**-22 (the division)."""
    g = torch.Generator(device=DEV).manual_seed(8)
    p = torch.exp2(16 - 165 * torch.rand(n, device=DEV, generator=g, dtype=torch.float64)).float()
    p = torch.where(p > 0, p, torch.full_like(p, 2.0**-149))
    h = torch.randint(1, 2**32, (n,), device=DEV, dtype=torch.int64, generator=g)
    h[:8] = torch.tensor([1, 2, 2**31, 2**32 - 2**23 - 1, 2**32 - 2**23, 2**32 - 2, 2**32 - 1, 2**28], device=DEV)
    out = torch.empty(n, dtype=torch.float64, device=DEV)
    _ratio_error_kernel[(triton.cdiv(n, 1024),)](p, h, out, n, BLOCK=1024, FAST=fast)
    worst, bound = float(out.max()), 2.0**-12.8 + 2.0**-22
    return dict(name=f"coupled race: float32 ratio screen ({'lg2.approx + rcp.approx' if fast else 'logf + div.full'})"
                f" on random (p, h)", samples=n, max_rel_err=worst, log2_max_rel_err=math.log2(worst) if worst > 0
                else float("-inf"), bound=bound, passed=worst < bound)


def check_coupled_parity(total_rows: int, log) -> dict:
    try:
        from sglang.srt.layers.sampler import sampling_from_probs_torch as upstream

        from sglang_detspec.integration import compat

        against, cap = "sglang", compat.seeded_race_caps_unit_uniform()  # what the invariant verify itself uses
    except Exception:  # no SGLang here: the reference, whose CUDA ops are SGLang's
        against, cap = "reference", True
        def upstream(probs, sampling_seed, positions):
            return coupled_race_reference_probs(probs, sampling_seed, positions, cap_unit_uniform=True)
    g = torch.Generator(device=DEV).manual_seed(4321)
    vocabs, kinds, temps = [151936, 32000, 4099], ["dense", "topk50", "flat", "peaked", "ties"], [0.3, 1.0, 3.0]
    rows = mism = fused_mism = precise_screen_mism = small_launch_mism = divide_mism = batches = 0
    t0 = time.time()
    while rows < total_rows:
        V, kind, temp = vocabs[batches % 3], kinds[(batches // 3) % 5], temps[(batches // 15) % 3]
        B = max(64, min(8192, int(2.4e9 // (V * (16 if against == "sglang" else 72)))))
        seeds = torch.randint(-(2**63), 2**63 - 1, (B,), device=DEV, dtype=torch.int64, generator=g)
        pos = torch.randint(0, 2**40, (B,), device=DEV, dtype=torch.int64, generator=g)
        if kind == "ties":  # tokens i and j within 0 .. 1e-3 (log space) of a tie, every other token far below
            B = min(B, 512)
            seeds, pos = seeds[:B], pos[:B]
            gum = coupled_gumbel_reference(seeds, pos, V, cap_unit_uniform=cap)
            j = gum.argmax(1)
            i = torch.randint(0, V, (B,), device=DEV, generator=g)
            delta = (torch.rand(B, device=DEV, generator=g) - 0.5) * 2e-3 * (torch.arange(B, device=DEV) % 3 > 0)
            lj = math.log(0.3) + (gum.gather(1, i[:, None]) - gum.gather(1, j[:, None])).squeeze(1) + delta
            probs = torch.full((B, V), 1e-30, device=DEV)
            probs.scatter_(1, i[:, None], 0.3)
            probs.scatter_(1, j[:, None], torch.exp(lj).float()[:, None])
            del gum
        else:
            probs = rand_probs(kind, B, V, temp, g)
        for r in range(0, B, 97):  # hash extremes: a (sometimes zero-probability) token at u = 1 or u = 0
            tok = (r * 7919) % V
            pos[r] = position_with_hash(int(seeds[r]), tok, 0 if r % 3 == 2 else 0xFFFFFFFF)
            if r % 3 == 1:
                probs[r, tok] = 0.0
        want = upstream(probs.clone(), sampling_seed=seeds, positions=pos).to(torch.int64).view(-1)
        logprobs = torch.log(probs)
        mism += int((coupled_race(logprobs, seeds, pos, cap_unit_uniform=cap) != want).sum())
        fused_mism += int((coupled_race_probs(probs, seeds, pos, cap_unit_uniform=cap) != want).sum())  # lg2.approx
        precise_screen_mism += int((coupled_race_probs(probs, seeds, pos, cap_unit_uniform=cap,
                                                       fast_screen=False) != want).sum())
        # the launch the table gives a few rows (kernels/coupled_race_probs.py LAUNCH_TABLE), on these many rows
        small_block, small_warps = LAUNCH_TABLE[0][1]
        small_launch_mism += int((coupled_race_probs(probs, seeds, pos, cap_unit_uniform=cap, block_size=small_block,
                                                     num_warps=small_warps) != want).sum())
        divide_mism += int((coupled_race(logprobs, seeds, pos, cap_unit_uniform=cap, uniform="divide") != want).sum())
        rows, batches = rows + B, batches + 1
        if batches % 50 == 0:
            log(f"  coupled parity: {rows} rows, {mism} mismatches, {time.time() - t0:.0f}s")
        del probs, logprobs, want
    return dict(name=f"coupled race vs {against} (token-id keyed, cap={cap})", rows=rows, mismatches=mism,
                fused_log_mismatches=fused_mism, fused_precise_screen_mismatches=precise_screen_mism,
                fused_small_launch_mismatches=small_launch_mism, divide_form_mismatches=divide_mism,
                passed=mism == 0 and fused_mism == 0 and precise_screen_mism == 0 and small_launch_mism == 0,
                seconds=round(time.time() - t0, 1))


@triton.jit
def _kernel_log(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.log(tl.load(x_ptr + offs, mask=mask)), mask=mask)


def check_kernel_log() -> dict:
    """coupled_race_probs takes float32 ``log`` in the kernel (``tl.log``, kernels/coupled_race.py::_load_logprob);
    it is exact only if that equals CUDA torch's ``torch.log`` bit for bit: checked on every float32 from +0 to
    +inf (the bit patterns 0 .. 0x7F800000; below 0 both give NaN)."""
    mism, chunk, end = 0, 1 << 28, 0x7F800001
    for start in range(0, end, chunk):
        n = min(chunk, end - start)
        x = torch.arange(start, start + n, device=DEV, dtype=torch.int64).to(torch.int32).view(torch.float32)
        y = torch.empty_like(x)
        _kernel_log[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
        mism += int((y.view(torch.int32) != torch.log(x).view(torch.int32)).sum())
        del x, y
    return dict(name="coupled race: in-kernel float32 log vs torch.log, every float32 in [+0, +inf]",
                values=end, mismatches=mism, passed=mism == 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/kernel_checks"))
    ap.add_argument("--rows", type=int, default=1_050_000, help="random parity rows (>= 10**6 for the bar)")
    ap.add_argument("--draws", type=int, default=2_000_000, help="draws per statistical test")
    ap.add_argument("--quick", action="store_true", help="10x fewer rows and draws (smoke run)")
    ap.add_argument("--only", choices=("all", "coupled"), default="all",
                    help="coupled: only the coupled race's checks (Gumbel screen, parity with SGLang)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_kernel_checks: no CUDA GPU visible (run scripts/run_gpu_checks.sh on a GPU machine)", file=sys.stderr)
        return 2
    rows, draws = args.rows, args.draws
    if args.quick:
        rows, draws = rows // 10, max(500_000, draws // 10)
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    results = []
    t0 = time.time()
    if args.only == "coupled":
        for r in (check_gumbel_screen(), check_exponential_screen(True), check_exponential_screen(False),
                  check_ratio_screen(True), check_ratio_screen(False), check_kernel_log(),
                  check_coupled_parity(rows, log)):
            results.append(r)
            log(f"[{'PASS' if r['passed'] else 'FAIL'}] {r['name']}: " + ", ".join(
                f"{k}={v}" for k, v in r.items() if k not in ("name", "passed", "detail", "per_kind")))
    for fn in (() if args.only == "coupled" else (check_e2_bound, check_score_bound, check_degenerate,
                                                   check_gumbel_screen, lambda: check_exponential_screen(True),
                                                   lambda: check_exponential_screen(False),
                                                   lambda: check_ratio_screen(True),
                                                   lambda: check_ratio_screen(False))):
        r = fn()
        results.append(r)
        log(f"[{'PASS' if r['passed'] else 'FAIL'}] {r['name']}: " + ", ".join(
            f"{k}={v}" for k, v in r.items() if k not in ("name", "passed", "detail", "per_kind")))
    for r in ([] if args.only == "coupled" else [
            check_cpu_reference(64 if args.quick else 256), check_near_ties(max(2048, rows // 50), log),
            check_parity(rows, log), check_kernel_log(), check_coupled_parity(rows, log)]):
        results.append(r)
        log(f"[{'PASS' if r['passed'] else 'FAIL'}] {r['name']}: " + ", ".join(
            f"{k}={v}" for k, v in r.items() if k not in ("name", "passed", "detail", "per_kind")))
    for r in ([] if args.only == "coupled" else check_statistics(draws)):
        results.append(r)
        log(f"[{'PASS' if r['passed'] else 'FAIL'}] {r['name']}: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items() if k not in ("name", "passed")))
    ok = all(r["passed"] for r in results)
    summary = dict(passed=ok, device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   seconds=round(time.time() - t0, 1), results=results)
    (args.out / "kernel_checks.json").write_text(json.dumps(summary, indent=1, default=str))
    log(f"{'ALL PASSED' if ok else 'SOME CHECKS FAILED'} in {summary['seconds']}s; wrote {args.out / 'kernel_checks.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
