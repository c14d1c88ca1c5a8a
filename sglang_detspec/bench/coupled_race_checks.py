"""GPU checks of the coupled race at scale: what the CPU tests, which run the kernels under Triton's interpreter
on small shapes, cannot reach.

The coupled race (issue 18, ``kernels/coupled_race.py``, ``kernels/coupled_race_probs.py``): its float32 Gumbel screen against float64 for all 2**32
hashes (2**-11 absolute), the ratio screen's float32 ``E = -log u`` in both forms (``lg2.approx``, the GPU
default, and libdevice's ``logf``; 2**-12.8 relative), the ratio ``p * 2**64 / E32`` in both forms on random
(p, h) (2**-12.8 + 2**-22 relative), and its tokens vs SGLang's own compiled ``sampling_from_probs_torch`` (the reference
where SGLang is absent) on >= 10**6 rows incl. constructed near ties and u = 1 / u = 0 hashes, for the race on
``torch.log(probs)`` and for ``coupled_race_probs`` (the log taken in the kernel; its ``tl.log`` is also compared
with ``torch.log`` on every float32 from +0 to +inf).  Zero mismatches.

Run as :mod:`.draft_sampler_checks`' are (``tests/gpu/``, ``scripts/gpu_kernel_checks.py``), with the same result dicts.
"""

from __future__ import annotations

import math
import time

import torch
import triton
import triton.language as tl

from sglang_detspec.bench.sampler_bench import rand_probs
from sglang_detspec.kernels.coupled_race import coupled_race, gumbel_f32
from sglang_detspec.kernels.coupled_race_probs import LAUNCH_TABLE, coupled_race_probs, ratio_f32
from sglang_detspec.kernels.coupled_scoring import exponential_f32
from sglang_detspec.stream.coupled_reference import (
    coupled_gumbel_reference,
    coupled_race_reference_probs,
    position_with_hash,
)

DEV = torch.device("cuda")

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
    """The ratio screen's float32 ``E = -log u`` (kernels/coupled_scoring.py::exponential_f32) in the form
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
    """coupled_race_probs takes float32 ``log`` in the kernel (``tl.log``, kernels/coupled_scoring.py::load_logprob);
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
