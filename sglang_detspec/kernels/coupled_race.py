"""Fused coupled race: SGLang's non-speculative seeded sampler, keyed by token id, without ``[R, V]`` float64.

What it computes (bit for bit): for every row the token ``torch.argmax`` picks from SGLang's float64 scores
``g(h_t) + float64(l_t)`` -- ``multinomial_with_seed`` on the plugin's token-id keys; the definition, its two
release / device variants (``cap_unit_uniform``, ``uniform``) and the input (float32 ``torch.log`` of the
probabilities SGLang's sampler races) are in :mod:`sglang_detspec.stream.coupled_reference`, whose
:func:`~sglang_detspec.stream.coupled_reference.coupled_race_reference` is the CPU twin.  Upstream materialises
``[R, V]`` uint32 hashes and float64 scores (12 bytes per element); this kernel reads ``logprobs`` once and
allocates ``O(R * V / BLOCK)`` bytes.  The speculation-invariant verify and proposal (issue 18) run this race on
the target's and on the draft's probabilities with the same keys, taking the log inside the kernel with a cheaper
screen (the ratio screen below): :mod:`.coupled_race_probs`, which shares this file's exact scoring.

Design (the idea of ``seeded_draft_sample.py``: a float32 screen, exact float64 only where it can matter)
------------------------------------------------------------------------------------------------------
Stage 1, grid ``(R, cdiv(V, BLOCK))``, one BLOCK-column chunk per program:
  * the first three Murmur words (seed low/high, position) are row constants, hashed once per program;
  * a float32 screen score ``s32 = G32(h) + l`` (:func:`gumbel_f32`) and its chunk maximum ``m32``;
  * candidates are the elements with ``s32 >= m32 - (2**-8 + 2**-20 |m32|)`` (the bound below); each is
    re-scored exactly in float64 with upstream's operation order, in increasing index order (strict ``>``
    keeps the first index of an exact tie).  Nearly every chunk has one candidate (one float64 score);
  * a chunk holding a NaN or ``+inf`` log-probability or (0.5.17, no cap) a hash of ``2**32 - 1`` (Gumbel
    ``+inf``; ``+inf + -inf`` is NaN) is scored exactly in float64 as a whole, with ``torch.argmax``'s NaN
    rule (rare: ``V / 2**32`` per row for the hash);
  * a chunk whose scores are all ``-inf`` (every token truncated) reports ``(-inf, first index)``, exactly.
Stage 2, grid ``(R,)``: first NaN, else the first index of the maximum over the chunks' ``(float64, index)``.

:mod:`.coupled_race_probs` (what the verify and the proposal run) reads ``p`` and screens with the ratio
``r = (p * 2**64) / E32`` (``E32`` = :func:`exponential_f32`, ``argmax(log p + g) = argmax(p / E)``): one ``log``
per token instead of three (``log p``, ``log E``, and ``log u`` inside ``E``).  ``p * 2**64`` is exact and lifts
subnormal ``p`` into the normal range, so every ratio of a probability is normal (``p <= 2**16`` is required, larger
values, ``+inf``, NaN and negative ``p`` send the chunk to the exact path).  Candidates are ``r >= m * exp(-delta)``,
``delta = 2**-8 + 2**-20 (|log m - 64 ln 2| + 1) + 2**-20``.  The bound: ``log r32`` is within ``2**-12.8`` (``E32``,
below) ``+ 2**-22`` (float32 division, 2 ulp; on CUDA ``rcp.approx`` and a product, 1.5 ulp) ``+ 2**-23 |lp|`` (``lp`` = the float32 ``log p`` the exact score
uses) of ``s64 + 64 ln 2``, and ``|lp| <= |s64| + 22.2`` (``g`` lies in ``[-3.1, 22.2]`` for ``h != 0``), so twice
that error stays below ``delta`` minus the threshold's float32 rounding by a factor of about 13.  ``h = 0``
(``g = -709.78``) gets ratio 0: it can only beat zero-probability tokens (any ``p > 0`` scores above ``-106.4``),
and a chunk whose ratios are all 0 while some ``p > 0`` is scored exactly; all ``p = 0`` is ``(-inf, lo)``.

Why the screen is exact (the bound)
-----------------------------------
``G32`` approximates SGLang's float64 ``g = -log(-log u)``.  For ``1 <= h < 2**32 - 2**23``: ``u32 =
float(h) * 2**-32`` is within ``2**-23.9`` (relative) of ``u``, ``log`` adds ``<= 2**-22`` absolute (PTX's
``lg2.approx`` bound, looser than libdevice's), so ``E = -log u >= 2**-9`` has relative error ``<= 2**-13``; for
``h >= 2**32 - 2**23`` the series ``w + w^2/2 + w^3/3`` in the exact ``w = ~h * 2**-32`` (relative error
``<= 2**-19.9``).  ``-log E`` then adds ``<= 2**-21``: ``|G32 - g_true| <= 2**-12.9``.  SGLang's own float64
``u`` near 1 carries ``2**-53`` absolute, ``2**-21`` relative in ``E`` at ``~h = 1``: ``|g64 - g_true| <=
2**-21``.  ``h = 0`` (``u = 0``, clamped: ``g = -log(log(DBL_MAX)) = -709.78``) is special-cased.  With the
float32 sum's rounding (``2**-24 |s|``), ``|s32 - s64| <= 2**-12.8 + 2**-24 |s|`` per element, so the true
maximum ``i*`` satisfies ``s32(i*) >= m32 - 2 (2**-12.8 + 2**-24 |s|) > m32 - (2**-8 + 2**-20 |m32|)``: it is
a candidate, with a margin of about 14x.  ``-inf`` scores (``l = -inf``) are exact in both.
``scripts/gpu_kernel_checks.py`` measures ``max |G32 - g64|`` over all 2**32 hashes on the GPU.

CUDA graphs: capturable.  ``seeds`` and ``positions`` are read from device memory at replay time (update
them in place); the shapes, ``cap_unit_uniform``, ``uniform`` and ``block_size`` are baked into the capture.
No host synchronisation and no value-dependent host branching (validation reads shapes and dtypes only);
each call allocates the ``[R]`` output and ``[R, cdiv(V, BLOCK)]`` float64 + int32 partials (from the
graph's private pool under capture).  :mod:`.coupled_race_probs` reads the probabilities and takes the float32
``log`` itself, so neither the verify nor the proposal writes an ``[R, V]`` log-probability temporary (a separate
``torch.log`` pass cost 148 us of 488 us and 297 MiB at R = 512, V = 151936 on the H200); that is exact because
the kernel's ``tl.log`` equals CUDA torch's ``log`` on every non-negative float32 there (measured by
``scripts/gpu_kernel_checks.py``).  The exact scoring both kernels share (:mod:`.coupled_scoring`) takes
``FROM_PROBS`` for that reason.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..stream.coupled_reference import check_coupled_race_inputs, resolve_uniform
from .coupled_scoring import (
    ABS_MARGIN,
    INT32_MAX,
    REL_MARGIN,
    exact_chunk_argmax,
    exponential_f32,
    load_logprob,
    rescore_candidates,
)
from .hashing import fmix32, mix32, race_row_prefix
from .launch_checks import (
    INTERPRETED,
    interpreter_block,
    require_cuda_or_interpreter,
    require_launch,
    require_vocab_contiguous,
)

__all__ = ["coupled_race", "gumbel_f32", "DEFAULT_BLOCK"]

#: Columns per stage-1 program on a GPU (tests raise or lower it through ``block_size``).
DEFAULT_BLOCK = 2048

_G_HASH_ZERO = tl.constexpr(-709.782712893384)  # g at h = 0: -log(log(DBL_MAX)), float32-rounded in the screen


@triton.jit
def gumbel_f32(h):
    """float32 screen value of SGLang's Gumbel noise ``-log(-log(h / (2**32 - 1)))``, within 2**-12.8 of it.

    Every hash gets a finite value (``h = 2**32 - 1`` that of the 0.5.18+ cap; without the cap the kernel
    flags it instead).  Public so that scripts/gpu_kernel_checks.py measures this very expression.
    """
    return tl.where(h == 0, _G_HASH_ZERO, -tl.log(exponential_f32(h, False)))


@triton.jit
def _race_stage1(
    lp_ptr, row_stride, seed_ptr, pos_ptr, part_score_ptr, part_idx_ptr, V, NC,
    CAP: tl.constexpr, RECIP: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = lp_ptr + row.to(tl.int64) * row_stride
    h_row = race_row_prefix(seed_ptr, pos_ptr, row)
    lo = c * BLOCK
    offs = lo + tl.arange(0, BLOCK)
    valid = offs < V
    h = fmix32(mix32(h_row, offs.to(tl.uint32)))
    res_score = tl.full([], float("-inf"), tl.float64)
    res_idx = lo
    lp = load_logprob(row_ptr + offs, valid, False)
    special = valid & ((lp != lp) | (lp == float("inf")))
    if not CAP:
        special = special | (valid & (h == 0xFFFFFFFF))  # Gumbel +inf (NaN at l = -inf)
    if tl.sum(special.to(tl.int32), 0) > 0:
        res_score, res_idx = exact_chunk_argmax(row_ptr, h_row, offs, valid, CAP, RECIP, False, None, False)
    else:
        s = tl.where(valid, gumbel_f32(h) + lp, float("-inf"))
        m = tl.max(s, 0)
        if m > float("-inf"):  # else every score is exactly -inf: (-inf, lo) is the chunk's exact argmax
            cand = s >= m - (ABS_MARGIN + REL_MARGIN * tl.abs(m))
            res_score, res_idx = rescore_candidates(row_ptr, h_row, offs, cand, CAP, RECIP, False, None, False)
    tl.store(part_score_ptr + row * NC + c, res_score)
    tl.store(part_idx_ptr + row * NC + c, res_idx)


@triton.jit
def _race_stage2(part_score_ptr, part_idx_ptr, out_ptr, NC, CB: tl.constexpr):
    """One program per row: the first NaN chunk's index, else the first index of the maximum chunk score."""
    row = tl.program_id(0)
    best_s = tl.full([], float("-inf"), tl.float64)
    best_i = tl.full([], INT32_MAX, tl.int32)
    nan_i = tl.full([], INT32_MAX, tl.int32)
    for start in range(0, NC, CB):
        cidx = start + tl.arange(0, CB)
        valid = cidx < NC
        sc = tl.load(part_score_ptr + row * NC + cidx, mask=valid, other=float("-inf"))
        ix = tl.load(part_idx_ptr + row * NC + cidx, mask=valid, other=INT32_MAX)
        nan_i = tl.minimum(nan_i, tl.min(tl.where(valid & (sc != sc), ix, INT32_MAX), 0))
        ok = valid & (sc == sc)
        m = tl.max(tl.where(ok, sc, float("-inf")), 0)
        bi = tl.min(tl.where(ok & (sc == m), ix, INT32_MAX), 0)
        # blocks come in index order: a later block wins only with a strictly larger score (or if none won yet)
        take = (m > best_s) | (best_i == INT32_MAX)
        best_s = tl.where(take, m, best_s)
        best_i = tl.where(take, bi, best_i)
    tl.store(out_ptr + row, tl.where(nan_i < INT32_MAX, nan_i, best_i).to(tl.int64))


def _block_for(vocab: int, block_size: Optional[int]) -> int:
    if block_size is not None:
        block = int(block_size)
    elif INTERPRETED:
        block = interpreter_block(vocab)
    else:
        block = DEFAULT_BLOCK
    return block


def coupled_race(
    logprobs: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    cap_unit_uniform: bool = True,
    uniform: Optional[str] = None,
    block_size: Optional[int] = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """SGLang's ``multinomial_with_seed(logprobs, seeds, positions)`` keyed by token id: int64 tokens ``[R]``.

    Args:
        logprobs: ``[R, V]`` float32, contiguous in the vocab dimension (a row view of ``[B, S+1, V]`` flattened
            to ``[B*(S+1), V]`` is read in place): ``torch.log`` of the probabilities SGLang races.
        seeds: ``[R]`` int64 request seeds; positions: ``[R]`` int32/int64 key positions (low 32 bits used).
        cap_unit_uniform: SGLang >= 0.5.18's clamp of ``log(u)`` at ``-2**-32``; False reproduces 0.5.17.
        uniform: ``None`` (torch's own division on this device: ``"reciprocal"`` on CUDA, ``"divide"``
            elsewhere), or ``"divide"`` / ``"reciprocal"`` explicitly.
        block_size: columns per stage-1 program, a power of two >= 16 (default 2048; wider under the
            interpreter); num_warps: per stage-1 program.

    Same answer as the reference on every input, degenerate rows included: an all ``-inf`` row returns token
    0, a NaN the first NaN, ``+inf`` the first ``+inf`` (or a NaN before it).  CUDA-graph caveats: module docstring.
    """
    check_coupled_race_inputs(logprobs, seeds, positions, uniform, float32_only=True)
    require_vocab_contiguous("logprobs", logprobs)
    require_cuda_or_interpreter(logprobs, "sglang_detspec.stream.coupled_reference.coupled_race_reference")
    R, V = logprobs.shape
    out = torch.empty(R, dtype=torch.int64, device=logprobs.device)
    if R == 0:
        return out
    block = _block_for(V, block_size)
    require_launch(block, int(num_warps))
    nc = triton.cdiv(V, block)
    part_score = torch.empty((R, nc), dtype=torch.float64, device=logprobs.device)
    part_idx = torch.empty((R, nc), dtype=torch.int32, device=logprobs.device)
    recip = resolve_uniform(uniform, logprobs.device) == "reciprocal"
    seeds, positions = seeds.contiguous(), positions.contiguous()  # views only for 1-D contiguous inputs
    _race_stage1[(R, nc)](
        logprobs, logprobs.stride(0), seeds, positions, part_score, part_idx, V, nc,
        CAP=bool(cap_unit_uniform), RECIP=recip, BLOCK=block, num_warps=int(num_warps),
    )
    _race_stage2[(R,)](part_score, part_idx, out, nc, CB=min(1024, max(16, triton.next_power_of_2(nc))), num_warps=4)
    return out

