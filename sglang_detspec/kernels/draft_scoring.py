"""The draft kernels' scores: stage 1's float32 race score, upstream's exact float64 score, and the bound that
lets the float32 race pick candidates exactly.

:mod:`.seeded_draft_sample` (every vocabulary column) and :mod:`.seeded_hot_draft_sample` (a reduced draft's hot
columns, keyed by target id) race a chunk in float32 with :func:`race_score_f32`, keep as candidates the elements
whose score reaches ``m32 * CAND_REL`` (``m32`` the chunk's float32 maximum), and re-score candidates exactly with
:func:`exact_score_of` -- so the two kernels agree bit for bit with each other and with upstream's float64 torch
code.  :func:`first_max_by_token` is the hot-token kernels' reduction (this one's and
:mod:`.coupled_hot_race_probs`'): ties to the lowest target id, a NaN first.  The bound below is per element and does not depend on which column word was hashed.

Why the float32 filter is exact (the bound)
-------------------------------------------
Write ``s`` for the true real-number score ``p / E`` (``E = -ln u``), ``s64`` for upstream's float64 value
and ``s32`` for the kernel's float32 value, the latter two rescaled by the same constant ``ln 2``.
Claim: for every element with ``2**-120 <= p`` (and ``s32`` finite), ``|s32 - s| <= d*s`` with
``d = 2**-12.7``, and ``|s64 - s| <= e*s`` with ``e = 2**-50``.  ``E2`` (``neg_log2_u_f32``):
``u = float(h) * 2**-32 + 2**-33``, ``lg = lg2.approx(u)`` and ``E2 = -lg``, except where
``lg > L = log2(1 - 2**-9) + 2**-22`` (``_SERIES_LG``, rounded up): there ``E2 = (w + w^2/2) / ln 2`` with
``w`` formed exactly from the float bit pattern of ``2**23 + ~h`` (one FFMA).  ``lg > L`` implies
``h >= 2**32 - 2**23`` (every smaller hash has float32 ``u <= 1 - 2**-9``, and lg2.approx is within 2**-22),
i.e. ``~h < 2**23`` and ``w = 1 - u < 2**-9``.
  * ``h < 2**31`` (``u <= 1/2``): ``u`` carries two roundings (<= 2**-23 relative) and ``|log2 u| >= 1``:
    <= 2**-22.5, plus lg2.approx's absolute 2**-22;
  * ``h >= 2**31`` and ``lg <= L``: ``float(h)`` is off by <= 2**7 and the FFMA rounds in [1/2, 1):
    ``|du| <= 2**-24``, i.e. ``|d log2 u| <= 2**-24 / (u ln 2) <= 2**-22.5``, plus lg2.approx's absolute
    2**-22 (sum 2**-21.2), over ``E2 >= (2**-9 - 2**-21.5) / ln 2 ~ 2**-8.47`` (``lg <= L`` bounds float32
    ``u`` by ``1 - 2**-9 + 2**-21.5``): <= 2**-12.75 relative;
  * the series: ``w`` has one rounding (2**-24), the dropped tail is ``<= w^2/3 < 2**-19.5`` relative;
  * ``s32 = p * rcp.approx(E2)`` (<= 1 ulp each; ``E2`` in [2**-33.6, 33] and ``p >= 2**-120`` keep
    every value normal).
  Sum: ``d <= 2**-12.7``.  ``scripts/gpu_kernel_checks.py`` evaluates the compiled ``E2`` for ALL 2**32
  hash values against float64 (measured maximum 2**-14.6 on an H200) and the full ``s32`` on 2**26
  random ``(p, h)`` pairs (2**-14.6).  The float64 side: the uniform is exact, ``log`` (libdevice)
  <= 1 ulp, reciprocal and product correctly rounded.
Let ``j*`` be the element holding ``m32`` and ``i*`` the true first-index float64 maximum of the chunk.
``j*`` is a candidate, and ``s64(i*) >= s64(j*)``.  Hence ``s32(i*) >= s(i*)(1-d) >= s64(i*)(1-d)/(1+e)
>= s64(j*)(1-d)/(1+e) >= m32 (1-d)(1-e)/((1+e)(1+d)) > m32 (1 - 2**-11.6) > m32 (1 - 2**-10)`` (the
threshold; its own float32 rounding, 2**-24, is inside the margin), so ``i*`` is a candidate -- and when
it is the only one, it is ``j*``, the chunk's exact maximum without any float64 comparison.
Elements with ``p < 2**-120`` have ``s <= 2**-120 * 2**33 = 2**-87`` and cannot reach ``s(j*)`` when
``m32 >= 2**-80`` (``LOW_SCORE``); each kernel resolves chunks below that exactly, in float64.  ``scripts/gpu_kernel_checks.py`` also
compares 10**6+ rows and constructed near-ties with upstream's float64 torch code.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .hashing import fmix32, lg2_f32, mix32, recip_f32

__all__ = ["LOW_SCORE", "CAND_REL", "neg_log2_u_f32", "race_score_f32", "exact_score_of", "first_max_by_token"]

_INT32_MAX = tl.constexpr(2147483647)

# Below this chunk maximum (in the rescaled float32 score), float32 underflow / flush-to-zero could hide
# a subnormal-probability winner; the kernels resolve such chunks exactly, in float64.
LOW_SCORE = tl.constexpr(2.0**-80)
# Relative candidate margin: the float32 error bound is d = 2**-12.7 (measured 2**-14.6), and
# (1-d)(1-e)/((1+e)(1+d)) > 1 - 2**-11.6 stays above the threshold (the bound above).
CAND_REL = tl.constexpr(1.0 - 2.0**-10)


# float32 just above log2(1 - 2**-9) + 2**-22: lg2.approx(u) exceeds it only if h >= 0xFF800000 (lg2.approx is
# within 2**-22 of log2, and every smaller hash has a float32 u <= 1 - 2**-9)
_SERIES_LG = tl.constexpr(-0.0028202806133776903)


@triton.jit
def neg_log2_u_f32(h, FAST: tl.constexpr):
    """float32 -log2((h + 0.5) / 2**32), relative error < 2**-12.7 (the bound above).

    u is formed directly from float(h); only the top hashes (w = 1 - u < 2**-9, where float32's absolute
    error in u would dominate -log u) take a two-term series in w, and w comes exactly from the bit pattern
    of the float 2**23 + ~h (no second int-to-float conversion).  Public for the GPU checks, which measure its
    error over all 2**32 hashes.
    """
    u = h.to(tl.float32) * 2.3283064365386963e-10 + 1.1641532182693481e-10
    lg = lg2_f32(u, FAST)
    if FAST:
        # one LOP3: 2**23 + ~h wherever the series is selected below (it implies ~h < 2**23); other lanes get
        # garbage that the select discards
        kb = (h ^ 0xFFFFFFFF) | 0x4B000000
    else:
        # the interpreter computes the discarded lanes in NumPy too: the masked form keeps them finite
        kb = ((h ^ 0xFFFFFFFF) & 0x7FFFFF) | 0x4B000000
    # (2**23 + k) * 2**-32 + (2**-33 - 2**-9) = (k + 0.5) * 2**-32: the product is exact, one rounding
    w = kb.to(tl.float32, bitcast=True) * 2.3283064365386963e-10 + (1.1641532182693481e-10 - 0.001953125)
    poly = w * (1.4426950408889634 + w * 0.7213475204444817)
    # The series is chosen from lg, which is consumed next to the MUFU that produces it, not from the hash
    # (h >= 0xFF800000 stays live across the tile and is spilled: docs/kernels.md)
    return tl.where(lg > _SERIES_LG, poly, -lg)


@triton.jit
def race_score_f32(p, h, FAST: tl.constexpr):
    """Stage 1's float32 race score ``p * (1 / E2(h))`` of probability ``p`` and hash ``h`` (public, like
    :func:`neg_log2_u_f32`, so that the GPU checks measure this very expression)."""
    return p * recip_f32(neg_log2_u_f32(h, FAST), FAST)


@triton.jit
def exact_score_of(p, h_row, col):
    """Upstream's float64 score ``(1 / -log((h + 0.5) / 2**32)) * p`` of the token(s) at key column(s)
    ``col`` (scalar or vector; every exact score of both draft kernels goes through here, so equal inputs give
    bit-equal scores whichever stage or kernel computes them)."""
    h = fmix32(mix32(h_row, col.to(tl.uint32)))
    u = (h.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # both steps exact in float64
    r = 1.0 / (-tl.log(u))
    return r * p.to(tl.float64)


@triton.jit
def first_max_by_token(s, tok, valid):
    """``(score, target id)`` of the maximum of ``s`` over ``valid`` lanes, ties to the lowest target id; a NaN
    anywhere wins (score NaN, its lowest target id): ``torch.argmax`` over the columns sorted by target id."""
    isn = valid & (s != s)
    nan_tok = tl.min(tl.where(isn, tok, _INT32_MAX), 0)
    ok = valid & (s == s)
    m = tl.max(tl.where(ok, s, float("-inf")), 0)
    max_tok = tl.min(tl.where(ok & (s == m), tok, _INT32_MAX), 0)
    has_nan = nan_tok < _INT32_MAX
    return tl.where(has_nan, float("nan"), m), tl.where(has_nan, nan_tok, max_tok)
