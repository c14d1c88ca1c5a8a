"""Two-sample chi-square tests for the lossless check: do two servers' token sequences share one distribution?

numpy and scipy only (no SGLang, no torch), so the statistic is tested on CPU (``tests/unit/checker/test_two_sample.py``)
and the GPU driver (``scripts/lossless_check.py``) only collects tokens.

The test
--------
:func:`chi2_homogeneity` is Pearson's chi-square test of homogeneity on the ``2 x B`` table of two samples' counts
over ``B`` bins: ``X^2 = sum (O - E)^2 / E`` with ``E = row total * column total / n``, ``B - 1`` degrees of freedom,
``p = P(chi2_{B-1} >= X^2)`` (no continuity correction).

Pooling rule (:func:`pool_sparse_bins`): a category keeps a bin of its own when its smallest *expected* count,
``pooled count * min(n_a, n_b) / (n_a + n_b)``, is at least ``min_expected`` (default 5, Cochran's rule); every other
category goes into one "rest" bin; if that rest bin's own smallest expected count is still below ``min_expected`` it
is merged into the kept bin with the smallest pooled count (lowest category first on ties). So every bin of the table
has both expected counts >= ``min_expected``, where the chi-square approximation holds. The rule reads only the
*pooled* counts, never which sample an observation came from, so it is the same for every relabelling of the
observations: the test's conditional null (given the pooled counts) is untouched by the pooling.

Degenerate inputs: an empty sample raises ``ValueError``; when everything lands in one bin (e.g. both samples are
one and the same category) there is nothing to compare and the result is ``statistic 0, dof 0, p 1``.

Clustered observations
----------------------
:func:`chi2_homogeneity_clustered` is the same table and statistic for observations that come in clusters (the
transitions of one sequence). Within a cluster they are dependent, so the counts are not multinomial and ``X^2`` is
not ``chi2_{B-1}``: a "sticky" sequence repeats its pairs and inflates it (two samples of 500 sequences of 24
tokens from one 20-state chain that stays put with probability 0.7: the plain p-value is below 0.05 in about two
thirds of the runs). Under the null the clusters are exchangeable,
so the reference distribution is that of ``X^2`` over all reassignments of whole clusters to the two samples (a
permutation null). Its mean and variance are computed exactly (:func:`_cluster_permutation_moments`; no random
permutations), and the p-value is ``P(scale * chi2_nu >= X^2)`` with ``scale`` and ``nu`` matching them
(Satterthwaite; the second-order Rao-Scott correction with permutation moments). For clusters of one observation
the moments are the multinomial ones up to terms of order ``1/n``, and the two tests agree closely.

Token sequences
---------------
``[N, L]`` arrays of token ids, one row per sequence (one request, one seed), every row ``L`` tokens (``ignore_eos``):

* :func:`position_samples` -- the tokens at position ``t`` of every sequence: ``N`` independent draws of the
  **marginal** distribution of token ``t`` (conditioned only on the prompt). Per-position tests compare these.
* :func:`transition_samples` -- the ``(x[t-1], x[t])`` pairs for ``t >= 1``, pooled over positions, each sequence one
  cluster. The test compares the **joint frequency of adjacent pairs**, averaged over positions (a pair that is more
  frequent at one position and rarer at another can cancel). It sees what the marginals cannot, e.g. a change of
  the transition probabilities that keeps every marginal (a wrong residual or bonus token usually shifts both); it
  does **not** see the position of a pair, nor any dependence beyond adjacent tokens (two processes with equal
  pair frequencies but different three-token statistics pass).

:func:`compare_token_sequences` runs both: the per-position tests from ``first_position`` (default 1: position 0 is
the prefill sample, drawn by the target sampler in both servers, so it is no evidence about speculative decoding),
combined by Bonferroni (``min(1, m * min p)`` over the ``m`` positions), and the clustered pooled-transition test.
Combined p: ``min(1, 2 * min(p_positions, p_transitions))`` (Bonferroni over the two families).

Pass rule (issue 12): a lossless pair needs combined p > :data:`LOSSLESS_P` (1e-3); a deliberately broken control
must be rejected, combined p < :data:`REJECT_P` (1e-6).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence

import numpy as np
from scipy import stats

__all__ = [
    "DEFAULT_MIN_EXPECTED",
    "LOSSLESS_P",
    "REJECT_P",
    "ChiSquareResult",
    "SequenceComparison",
    "bonferroni_min",
    "chi2_homogeneity",
    "chi2_homogeneity_clustered",
    "compare_token_sequences",
    "pool_sparse_bins",
    "position_samples",
    "transition_samples",
]

DEFAULT_MIN_EXPECTED = 5.0
#: A lossless pair passes when the combined p-value is above this.
LOSSLESS_P = 1e-3
#: A broken control counts as rejected when the combined p-value is below this.
REJECT_P = 1e-6
# Pair codes: prev << 31 | next, so token ids must be below 2**31.
_PAIR_SHIFT = 31


@dataclass(frozen=True)
class ChiSquareResult:
    """One chi-square homogeneity test: Pearson's ``statistic`` on ``bins`` bins (``dof = bins - 1``) and its
    ``p_value``. For the clustered test ``p_value`` is ``P(scale * chi2_nu >= statistic)`` with the null moments
    ``null_mean`` / ``null_variance`` (``nu = effective_dof``), and ``naive_p_value`` the uncorrected
    ``P(chi2_dof >= statistic)``; for the plain test the null moments are ``chi2_dof``'s and there is no naive one."""

    statistic: float
    dof: int
    p_value: float
    bins: int  # bins of the table after pooling
    categories: int  # distinct categories observed
    pooled_into_rest: int  # categories below the expected-count threshold (in the rest bin)
    n_a: int  # observations of sample a
    n_b: int
    null_mean: Optional[float] = None
    null_variance: Optional[float] = None
    effective_dof: Optional[float] = None
    naive_p_value: Optional[float] = None

    @property
    def design_effect(self) -> float:
        """Null mean of the statistic per degree of freedom: 1 for independent observations."""
        return self.null_mean / self.dof if self.dof and self.null_mean is not None else 1.0

    def to_dict(self) -> dict:
        return dict(asdict(self), design_effect=self.design_effect)


def _as_codes(sample, name: str) -> np.ndarray:
    arr = np.asarray(sample)
    if arr.ndim != 1:
        raise ValueError(
            f"sample {name} must be one-dimensional (one categorical value per observation), got shape {arr.shape}"
        )
    if arr.size == 0:
        raise ValueError(f"sample {name} is empty: a two-sample test needs at least one observation in each sample")
    return arr


def pool_sparse_bins(
    pooled_counts: np.ndarray, n_a: int, n_b: int, min_expected: float = DEFAULT_MIN_EXPECTED
) -> np.ndarray:
    """The bin of each category under the pooling rule of the module docstring: ``bins[k]`` in ``0..B-1``.

    Kept categories get bins ``0..K-1`` in category order, the rest bin (if any) is ``K`` -- unless it was merged
    into the smallest kept bin. Reads only the pooled counts (label-blind)."""
    counts = np.asarray(pooled_counts, dtype=np.int64)
    if min_expected < 0:
        raise ValueError(f"min_expected must be >= 0, got {min_expected}")
    total = n_a + n_b
    if total != counts.sum():
        raise ValueError(f"pooled counts sum to {counts.sum()}, but n_a + n_b = {total}")
    share = min(n_a, n_b) / total
    keep = counts * share >= min_expected
    bins = np.empty(counts.size, dtype=np.int64)
    kept = np.flatnonzero(keep)
    bins[kept] = np.arange(kept.size)
    rest = ~keep
    if rest.any():
        rest_count = counts[rest].sum()
        if kept.size and rest_count * share < min_expected:
            # A too-small rest bin joins the smallest kept bin (argmin takes the lowest category on ties).
            bins[rest] = bins[kept[np.argmin(counts[kept])]]
        else:
            bins[rest] = kept.size
    return bins


def _table(codes_a: np.ndarray, codes_b: np.ndarray, min_expected: float):
    """``(bin of every observation, a first then b; the 2 x B table; categories seen; categories pooled)``."""
    categories, inverse = np.unique(np.concatenate([codes_a, codes_b]), return_inverse=True)
    inverse = inverse.reshape(-1)
    n_a, n_b = codes_a.size, codes_b.size
    pooled = np.bincount(inverse, minlength=categories.size)
    bin_of_category = pool_sparse_bins(pooled, n_a, n_b, min_expected)
    bin_of_obs = bin_of_category[inverse]
    n_bins = int(bin_of_category.max()) + 1
    table = np.stack([
        np.bincount(bin_of_obs[:n_a], minlength=n_bins),
        np.bincount(bin_of_obs[n_a:], minlength=n_bins),
    ]).astype(np.float64)
    pooled_into_rest = int(np.count_nonzero(pooled * (min(n_a, n_b) / (n_a + n_b)) < min_expected))
    return bin_of_obs, table, categories.size, pooled_into_rest


def _pearson(table: np.ndarray):
    n = table.sum()
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / n
    return float(((table - expected) ** 2 / expected).sum()), expected


def chi2_homogeneity(sample_a, sample_b, *, min_expected: float = DEFAULT_MIN_EXPECTED) -> ChiSquareResult:
    """Pearson's chi-square homogeneity test of two samples of categorical values (any values ``np.unique`` sorts),
    sparse categories pooled by :func:`pool_sparse_bins`. See the module docstring for the degenerate cases."""
    a, b = _as_codes(sample_a, "a"), _as_codes(sample_b, "b")
    _, table, n_categories, rest = _table(a, b, min_expected)
    bins = table.shape[1]
    if bins < 2:
        return ChiSquareResult(0.0, 0, 1.0, bins, n_categories, rest, a.size, b.size, 0.0, 0.0, 0.0)
    statistic, _ = _pearson(table)
    dof = bins - 1
    return ChiSquareResult(
        statistic, dof, float(stats.chi2.sf(statistic, dof)), bins, n_categories, rest, a.size, b.size,
        float(dof), 2.0 * dof, float(dof),
    )


def chi2_homogeneity_clustered(
    sample_a, clusters_a, sample_b, clusters_b, *, min_expected: float = DEFAULT_MIN_EXPECTED
) -> ChiSquareResult:
    """:func:`chi2_homogeneity` for observations grouped in clusters (``clusters_x[i]``: any integer id of
    observation ``i``'s cluster, e.g. its sequence), its p-value from ``X^2 ~ scale * chi2_nu`` with ``scale`` and
    ``nu`` matching the mean and variance of ``X^2`` over reassignments of whole clusters (module docstring).
    Clusters of ``a`` and ``b`` are never the same cluster, even when their ids coincide."""
    a, b = _as_codes(sample_a, "a"), _as_codes(sample_b, "b")
    ca, cb = np.asarray(clusters_a).reshape(-1), np.asarray(clusters_b).reshape(-1)
    if ca.size != a.size or cb.size != b.size:
        raise ValueError(
            f"one cluster id per observation: sample a has {a.size} observations and {ca.size} ids, "
            f"sample b {b.size} and {cb.size}"
        )
    bin_of_obs, table, n_categories, rest = _table(a, b, min_expected)
    bins = table.shape[1]
    if bins < 2:
        return ChiSquareResult(0.0, 0, 1.0, bins, n_categories, rest, a.size, b.size, 0.0, 0.0, 0.0, 1.0)
    statistic, expected = _pearson(table)
    dof = bins - 1
    mean, variance = _cluster_permutation_moments(ca, cb, bin_of_obs, bins, expected)
    if not (mean > 0 and variance > 0):
        raise ValueError("the clustered test found no between-cluster variation: every cluster has the same counts")
    scale, nu = variance / (2 * mean), 2 * mean**2 / variance
    return ChiSquareResult(
        statistic, dof, float(stats.chi2.sf(statistic / scale, nu)), bins, n_categories, rest, a.size, b.size,
        float(mean), float(variance), float(nu), float(stats.chi2.sf(statistic, dof)),
    )


def _cluster_permutation_moments(clusters_a, clusters_b, bin_of_obs, bins: int, expected: np.ndarray):
    """Exact mean and variance of ``X^2`` when ``m`` of the ``n`` clusters (``m`` = a's count) are drawn without
    replacement as sample a. Exact when every cluster has one size (every sequence has ``L`` tokens); otherwise
    those of ``X^2`` with the expected counts held at their observed values (checked within 1% on a small case).

    With ``r_ik = c_ik - s_i C_k / N`` (``c_ik``: count of bin ``k`` in cluster ``i``, ``s_i`` the cluster's size,
    ``C_k`` the pooled count of bin ``k``, ``N`` all observations) and ``w_k = 1/E_ak + 1/E_bk``,
    ``X^2 = z^T Q z`` for the 0/1 vector ``z`` of a's clusters and ``Q = R W R^T``; ``Q 1 = 0``. With
    ``p_r = m (m-1) ... (m-r+1) / (n (n-1) ... (n-r+1))`` (the chance that ``r`` given clusters all go to a), only
    three index patterns of ``E[(z^T Q z)^2]`` survive ``Q 1 = 0``:
    ``E[X^2] = tr(Q) (p1 - p2)`` and
    ``E[X^4] = (tr(Q)^2 + 2 tr(Q^2)) (p2 - 2 p3 + p4) + sum_i Q_ii^2 (p1 - 7 p2 + 12 p3 - 6 p4)``.
    ``tr(Q^2) = ||W^1/2 G W^1/2||_F^2`` for the ``B x B`` matrix ``G = R^T R``, a sparse part (bins that share a
    cluster) plus a rank-2 part, so nothing ``n x n`` or dense ``B x B`` is built."""
    from scipy import sparse

    _, cl_a = np.unique(clusters_a, return_inverse=True)
    _, cl_b = np.unique(clusters_b, return_inverse=True)
    m = int(cl_a.max()) + 1
    cluster = np.concatenate([cl_a.reshape(-1), cl_b.reshape(-1) + m])
    n = m + int(cl_b.max()) + 1
    if n < 4:
        raise ValueError(f"the clustered test needs at least 4 clusters in all, got {n}")
    size = np.bincount(cluster, minlength=n).astype(np.float64)
    share = np.bincount(bin_of_obs, minlength=bins) / size.sum()  # pi_k = C_k / N
    weight = 1.0 / expected[0] + 1.0 / expected[1]  # w_k
    counts = sparse.csr_matrix((np.ones(bin_of_obs.size), (cluster, bin_of_obs)), shape=(n, bins))
    counts.sum_duplicates()  # c_ik
    size_weighted = counts.T @ size  # T_k = sum_i s_i c_ik
    sum_sq_size = float((size**2).sum())  # S2
    # G = P - T pi^T - pi T^T + S2 pi pi^T with P = C^T C; W-scaled: P~ = C~^T C~, u = W^1/2 T, v = W^1/2 pi.
    root = np.sqrt(weight)
    scaled = (counts @ sparse.diags(root)).tocsr()  # C~ = C W^1/2
    u, v = root * size_weighted, root * share
    squares = scaled.multiply(scaled)
    trace = float(squares.sum()) - 2 * float(u @ v) + sum_sq_size * float(v @ v)  # tr(Q) = sum_k w_k G_kk
    p_tilde = (scaled.T @ scaled).tocoo()
    p_v = scaled.T @ (scaled @ v)
    uu, uv, vv = float(u @ u), float(u @ v), float(v @ v)
    trace_sq = (  # ||P~ + D~||_F^2, D~ = -u v^T - v u^T + S2 v v^T
        float((p_tilde.data**2).sum())
        + 2 * (-2 * float(u @ p_v) + sum_sq_size * float(v @ p_v))
        + 2 * uu * vv + 2 * uv**2 + sum_sq_size**2 * vv**2 - 4 * sum_sq_size * uv * vv
    )
    # Q_ii = sum_k w_k r_ik^2 = sum_k c~_ik^2 - 2 s_i sum_k c~_ik v_k + s_i^2 v.v
    q_diag = np.asarray(squares.sum(axis=1)).reshape(-1) - 2 * size * (scaled @ v) + size**2 * vv
    p1, p2, p3, p4 = np.cumprod([(m - t) / (n - t) for t in range(4)])
    mean = trace * (p1 - p2)
    second = (trace**2 + 2 * trace_sq) * (p2 - 2 * p3 + p4) + float((q_diag**2).sum()) * (p1 - 7 * p2 + 12 * p3 - 6 * p4)
    return mean, second - mean**2


# ---------------------------------------------------------------------------------------------------------------
# Token sequences


def _as_sequences(sequences, name: str) -> np.ndarray:
    arr = np.asarray(sequences)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected an [N, L] array of token ids (one row per sequence), got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: token ids must be integers, got dtype {arr.dtype}")
    if arr.min() < 0 or arr.max() >= 2**_PAIR_SHIFT:
        raise ValueError(f"{name}: token ids must lie in [0, 2**{_PAIR_SHIFT}), got {arr.min()} .. {arr.max()}")
    return arr.astype(np.int64)


def position_samples(sequences) -> List[np.ndarray]:
    """``[tokens at position 0, tokens at position 1, ...]`` of an ``[N, L]`` array: one draw per sequence each."""
    seqs = _as_sequences(sequences, "sequences")
    return [seqs[:, t].copy() for t in range(seqs.shape[1])]


def transition_samples(sequences, first_position: int = 1):
    """``(pair_codes, cluster_ids)``: the pairs ``(x[t-1], x[t])`` for ``t = first_position .. L-1`` of every
    sequence, coded ``x[t-1] * 2**31 + x[t]``, and the sequence index each pair belongs to."""
    seqs = _as_sequences(sequences, "sequences")
    if not 1 <= first_position < seqs.shape[1]:
        raise ValueError(f"first_position must be in 1..{seqs.shape[1] - 1} for sequences of {seqs.shape[1]} tokens")
    prev, nxt = seqs[:, first_position - 1 : -1], seqs[:, first_position:]
    codes = (prev << _PAIR_SHIFT) | nxt
    clusters = np.repeat(np.arange(seqs.shape[0]), codes.shape[1])
    return codes.reshape(-1), clusters


def bonferroni_min(p_values: Sequence[float]) -> float:
    """``min(1, m * min p)`` over ``m`` p-values: a valid p-value for "every one of the m nulls holds"."""
    if len(p_values) == 0:
        raise ValueError("no p-values to combine")
    return float(min(1.0, len(p_values) * min(p_values)))


@dataclass
class SequenceComparison:
    """Per-position and pooled-transition tests of two ``[N, L]`` samples (see the module docstring)."""

    n_a: int
    n_b: int
    length: int
    first_position: int
    positions: List[ChiSquareResult]  # positions first_position .. L-1, in order
    transitions: ChiSquareResult
    excluded_positions_identical: List[Optional[bool]] = field(default_factory=list)

    @property
    def positions_p(self) -> float:
        """Bonferroni-adjusted minimum of the per-position p-values."""
        return bonferroni_min([r.p_value for r in self.positions])

    @property
    def transitions_p(self) -> float:
        return self.transitions.p_value

    @property
    def combined_p(self) -> float:
        return float(min(1.0, 2 * min(self.positions_p, self.transitions_p)))

    def lossless(self, threshold: float = LOSSLESS_P) -> bool:
        return self.combined_p > threshold

    def rejected(self, threshold: float = REJECT_P) -> bool:
        return self.combined_p < threshold

    def to_dict(self) -> dict:
        return {
            "n_a": self.n_a,
            "n_b": self.n_b,
            "length": self.length,
            "first_position": self.first_position,
            "positions_p_bonferroni": self.positions_p,
            "transitions_p": self.transitions_p,
            "combined_p": self.combined_p,
            "per_position": [dict(r.to_dict(), position=self.first_position + i) for i, r in enumerate(self.positions)],
            "transitions": self.transitions.to_dict(),
            "excluded_positions_identical": self.excluded_positions_identical,
        }


def compare_token_sequences(
    sequences_a, sequences_b, *, first_position: int = 1, min_expected: float = DEFAULT_MIN_EXPECTED
) -> SequenceComparison:
    """Per-position tests at ``first_position .. L-1`` and the clustered pooled-transition test of pairs ending
    there. For each excluded position ``t < first_position`` it records whether the two samples are row-for-row
    identical there (``None`` when their sizes differ): with equal seeds, position 0 is the same prefill sample."""
    a, b = _as_sequences(sequences_a, "sequences_a"), _as_sequences(sequences_b, "sequences_b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"both samples need sequences of one length, got {a.shape[1]} and {b.shape[1]} tokens")
    length = a.shape[1]
    if not 1 <= first_position < length:
        raise ValueError(f"first_position must be in 1..{length - 1} for sequences of {length} tokens")
    positions = [chi2_homogeneity(a[:, t], b[:, t], min_expected=min_expected) for t in range(first_position, length)]
    codes_a, clusters_a = transition_samples(a, first_position)
    codes_b, clusters_b = transition_samples(b, first_position)
    transitions = chi2_homogeneity_clustered(codes_a, clusters_a, codes_b, clusters_b, min_expected=min_expected)
    identical = [bool((a[:, t] == b[:, t]).all()) if a.shape[0] == b.shape[0] else None for t in range(first_position)]
    return SequenceComparison(a.shape[0], b.shape[0], length, first_position, positions, transitions, identical)
