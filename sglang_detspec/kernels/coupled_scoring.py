"""The exact scoring both coupled-race kernels share: SGLang's float64 race score, and the float32 exponential
their screens start from.

:mod:`.coupled_race` (log-probabilities in) and :mod:`.coupled_race_probs` (probabilities in, the log taken in the
kernel) screen a chunk in float32 and re-score only the candidates the screen cannot exclude, exactly, with the
functions here -- so the two kernels agree bit for bit wherever their inputs do.  The definition of the score (and
its two release / device variants, ``CAP`` and ``RECIP``) is :mod:`sglang_detspec.stream.coupled_reference`'s; the
screens' error bound, and so the candidate margin (:data:`ABS_MARGIN`, :data:`REL_MARGIN`), is derived in
:mod:`.coupled_race`'s docstring.  ``FROM_PROBS``: the row holds probabilities and the float32 ``log`` is taken
here (exact where the kernel's ``tl.log`` is CUDA torch's, which ``scripts/gpu_kernel_checks.py --only coupled``
measures).  ``KEYED``: each column's hash key is the token id a map gives it (:func:`column_key`; a reduced "hot"
draft vocabulary raced under its target ids, :mod:`.coupled_hot_race_probs`) rather than the column itself, and
exact ties go to the lowest key rather than the first column.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..stream.coupled_reference import LOG_U_CAP, UMAX
from .hashing import fmix32, lg2_f32, mix32

__all__ = [
    "ABS_MARGIN", "INT32_MAX", "REL_MARGIN", "column_key", "exact_chunk_argmax", "exact_score", "exponential_f32", "load_logprob",
    "rescore_candidates", "RESCAN_CODE", "LONE_CODE", "TWO_P64", "LN_TWO_P64", "NEG_REL_MARGIN", "RATIO_SLACK",
    "P_SCREEN_MAX",
]

INT32_MAX = tl.constexpr(2147483647)
#: Stage-1 partial index codes of the probability races (:mod:`.coupled_race_probs`, :mod:`.coupled_hot_race_probs`)
#: below 0; an index >= 0 comes with its exact float64 score.
RESCAN_CODE = tl.constexpr(-1)  # stage 2 rescans the chunk exactly
LONE_CODE = tl.constexpr(-2)  # LONE_CODE - j: the chunk's lone candidate j, unscored
# The ratio screen of the probability races (coupled_race's docstring has its bound)
TWO_P64 = tl.constexpr(2.0**64)  # the ratio screen's exact scaling of p
LN_TWO_P64 = tl.constexpr(64 * 0.6931471805599453)
NEG_REL_MARGIN = tl.constexpr(-(2.0**-20))  # -REL_MARGIN: the threshold's exponent is built without a unary minus
RATIO_SLACK = tl.constexpr(2.0**-20)  # covers the float32 rounding of the threshold m * exp(-delta)
P_SCREEN_MAX = tl.constexpr(2.0**16)  # above it (+inf, or not a probability) a chunk is scored exactly
#: The candidate margin both screens build their thresholds from (absolute, and relative to the screen maximum;
#: coupled_race's docstring: the per-element screen error is <= 2**-12.8 + 2**-24 |s|).
ABS_MARGIN = tl.constexpr(2.0**-8)
REL_MARGIN = tl.constexpr(2.0**-20)
_NEG_DBL_MAX = tl.constexpr(-1.7976931348623157e308)  # torch.finfo(float64).min, SGLang's lower clamp of log(u)
_LOG_U_CAP = tl.constexpr(LOG_U_CAP)  # 0.5.18+'s upper clamp
_UMAX_F64 = tl.constexpr(float(UMAX))  # exact in float64; Python floats meet float64 tensors as float64 constants
_RCP_UMAX = tl.constexpr(1.0 / UMAX)  # fl(1 / (2**32 - 1)) = 2**-32 + 2**-64, CUDA torch's multiplier
_TWO_M32 = tl.constexpr(2.0**-32)
_NEG_LN2 = tl.constexpr(-0.6931471805599453)  # -ln 2: log u = log2(u) * ln 2


@triton.jit
def exponential_f32(h, FAST: tl.constexpr):
    """float32 ``E = -log(u)``, ``u = h / (2**32 - 1)``, within relative 2**-13 of it (:mod:`.coupled_race`'s docstring has the bound); ``h = 0``
    gets a finite stand-in (``u`` clamped to ``2**-32``) that every caller replaces.

    ``FAST`` (CUDA only, not the interpreter) takes ``log u`` as ``lg2.approx(u) * ln 2``: one MUFU instead of
    libdevice's ``logf`` polynomial (12 FFMA per element in scripts/sass_counts.py's count).  The bound above
    already allows ``lg2.approx``'s ``2**-22`` absolute error (``ln 2`` times that in ``log u``, plus the
    product's rounding, ``2**-24 E``), so the screen's margin and exactness are unchanged;
    scripts/gpu_kernel_checks.py measures both forms over all 2**32 hashes.
    """
    k = h ^ 0xFFFFFFFF  # 2**32 - 1 - h
    # near u = 1: E = -log(1 - w) by its series in w = k / (2**32 - 1) ~ k * 2**-32 (exact for k < 2**23);
    # the mask keeps the discarded lanes finite (the interpreter evaluates them too)
    w = (k & 0x7FFFFF).to(tl.float32) * _TWO_M32
    e_series = tl.maximum(w * (1.0 + w * (0.5 + w * 0.3333333333333333)), _TWO_M32)  # k = 0: the cap's 2**-32
    u = tl.maximum(h.to(tl.float32) * _TWO_M32, _TWO_M32)  # h = 0 is replaced by the caller; keep log finite
    if FAST:
        e_log = lg2_f32(u, True) * _NEG_LN2
    else:
        e_log = -tl.log(u)
    return tl.where(k < 0x800000, e_series, e_log)


@triton.jit
def exact_score(lp, h_row, col, CAP: tl.constexpr, RECIP: tl.constexpr):
    """SGLang's float64 score of the token(s) at column(s) ``col`` with float32 log-probability ``lp``, in its
    operation order (coupled_reference's module docstring).  Every exact score of both coupled kernels comes from here."""
    h = fmix32(mix32(h_row, col.to(tl.uint32)))
    if RECIP:
        u = h.to(tl.float64) * _RCP_UMAX
    else:
        u = h.to(tl.float64) / _UMAX_F64  # IEEE division (float64 fdiv is div.rn)
    a = tl.log(u)
    a = tl.where(a < _NEG_DBL_MAX, _NEG_DBL_MAX, a)  # clamp(min=finfo.min): only -inf is below
    if CAP:
        a = tl.where(a > _LOG_U_CAP, _LOG_U_CAP, a)
    g = -tl.log(-a)
    return g + lp.to(tl.float64)


@triton.jit
def load_logprob(ptr, mask, FROM_PROBS: tl.constexpr):
    """The float32 log-probability at ``ptr``: read as given, or ``log`` of the probability stored there.

    ``tl.log`` of float32 on the H200 equals CUDA torch's ``torch.log`` bit for bit on every non-negative float32
    (and both give NaN below 0), which ``scripts/gpu_kernel_checks.py --only coupled`` measures; masked lanes read
    probability 0, whose log is the ``-inf`` a masked log-probability lane reads.
    """
    if FROM_PROBS:
        return tl.log(tl.load(ptr, mask=mask, other=0.0))
    return tl.load(ptr, mask=mask, other=float("-inf"))


@triton.jit
def column_key(map_ptr, cols, mask, KEYED: tl.constexpr):
    """The hash key of columns ``cols``: the column itself, or (``KEYED``) the int64 token id ``map_ptr`` holds for
    it, as int32 (a hot map's target ids are below ``2**31``: ``HotVocab``); ``mask=None`` loads unmasked."""
    if not KEYED:
        key = cols
    elif mask is None:
        key = tl.load(map_ptr + cols).to(tl.int32)
    else:
        key = tl.load(map_ptr + cols, mask=mask, other=0).to(tl.int32)
    return key


@triton.jit
def exact_chunk_argmax(row_ptr, h_row, offs, valid, CAP: tl.constexpr, RECIP: tl.constexpr, FROM_PROBS: tl.constexpr,
                       map_ptr, KEYED: tl.constexpr):
    """Exact float64 argmax of one chunk with torch.argmax semantics over the columns ordered by key: ``(NaN, lowest
    NaN key)`` or ``(max, lowest key of the max)``; the key is the column unless ``KEYED`` (:func:`column_key`)."""
    key = column_key(map_ptr, offs, valid, KEYED)
    lp = load_logprob(row_ptr + offs, valid, FROM_PROBS)
    s = exact_score(lp, h_row, key, CAP, RECIP)
    nan_k = tl.min(tl.where(valid & (s != s), key, INT32_MAX), 0)
    sm = tl.where(valid & (s == s), s, float("-inf"))
    m = tl.max(sm, 0)
    best_k = tl.min(tl.where(valid & (sm == m), key, INT32_MAX), 0)
    has_nan = nan_k < INT32_MAX
    return tl.where(has_nan, float("nan"), m), tl.where(has_nan, nan_k, best_k)


@triton.jit
def rescore_candidates(row_ptr, h_row, offs, cand, CAP: tl.constexpr, RECIP: tl.constexpr, FROM_PROBS: tl.constexpr,
                       map_ptr, KEYED: tl.constexpr):
    """The exact float64 maximum over the screen's candidates (at least one), visited in increasing column order:
    ``(score, column)``, an exact tie to the lowest key (:func:`column_key`: unless ``KEYED``, the first column)."""
    n = tl.sum(cand.to(tl.int32), 0)
    j = tl.min(tl.where(cand, offs, INT32_MAX), 0)
    res_key = column_key(map_ptr, j, None, KEYED)
    res_score = exact_score(load_logprob(row_ptr + j, True, FROM_PROBS), h_row, res_key, CAP, RECIP)
    res_idx = j
    rest = cand & (offs != j)
    k = n - 1
    while k > 0:  # near ties: the other candidates, in increasing column order
        j2 = tl.min(tl.where(rest, offs, INT32_MAX), 0)
        rest = rest & (offs != j2)
        k -= 1
        key2 = column_key(map_ptr, j2, None, KEYED)
        s64 = exact_score(load_logprob(row_ptr + j2, True, FROM_PROBS), h_row, key2, CAP, RECIP)
        if KEYED:
            better = (s64 > res_score) | ((s64 == res_score) & (key2 < res_key))
        else:
            better = s64 > res_score  # strict: the first column of an exact tie (its lowest key) stays
        if better:
            res_score = s64
            res_key = key2
            res_idx = j2
    return res_score, res_idx
