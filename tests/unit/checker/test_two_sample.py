"""The lossless check's statistic (sglang_detspec/checker/two_sample.py), on CPU.

Checked: the plain test equals scipy's chi2_contingency on a dense table; under the null its p-values are uniform
(KS and the rejection rate at 0.05 within a binomial band); its power matches the noncentral chi-square and a small
known shift is rejected at a size where it must be; the pooling rule keeps a 1024-category Zipf-like case
calibrated (without pooling it is not); the clustered test's permutation moments equal an exhaustive enumeration,
and it is calibrated on a sticky Markov chain where the plain test is not; the pooled-transition test sees a change
that keeps every marginal; degenerate inputs give p = 1 or a clear error.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from sglang_detspec.checker import two_sample as ts

REPS = 400
ALPHA = 0.05
# 400 null runs at alpha 0.05: 20 rejections expected, sd 4.4; +-3.5 sd.
REJECTION_BAND = (5 / REPS, 35 / REPS)


def _null_p_values(draw, reps=REPS):
    return np.array([draw(rep) for rep in range(reps)])


def _assert_uniform(p_values, what):
    rate = float((p_values < ALPHA).mean())
    assert REJECTION_BAND[0] <= rate <= REJECTION_BAND[1], f"{what}: null rejection rate {rate} at alpha {ALPHA}"
    ks = stats.kstest(p_values, "uniform").pvalue
    assert ks > 0.01, f"{what}: null p-values are not uniform (KS p = {ks:.2g})"


def _markov(rng, n, length, states, stay, start=None):
    """Sequences of a chain that keeps its state with probability ``stay``, else draws a uniform state
    (uniform stationary distribution; started uniform unless ``start`` is given)."""
    x = np.empty((n, length), dtype=np.int64)
    x[:, 0] = rng.integers(0, states, n) if start is None else start
    for t in range(1, length):
        keep = rng.random(n) < stay
        x[:, t] = np.where(keep, x[:, t - 1], rng.integers(0, states, n))
    return x


# ---------------------------------------------------------------------------------------------------------------
# The plain test


def test_dense_case_equals_scipy_chi2_contingency():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 6, 500), rng.integers(0, 6, 730)
    result = ts.chi2_homogeneity(a, b)
    table = np.stack([np.bincount(a, minlength=6), np.bincount(b, minlength=6)])
    statistic, p, dof, _ = stats.chi2_contingency(table, correction=False)
    assert result.bins == 6 and result.pooled_into_rest == 0
    assert result.dof == dof == 5
    assert result.statistic == pytest.approx(statistic, rel=1e-12)
    assert result.p_value == pytest.approx(p, rel=1e-10)


def test_categories_may_be_any_sortable_values():
    a = np.array(["x", "y", "y", "z"] * 30)
    b = np.array(["x", "x", "y", "z"] * 30)
    codes = {"x": 0, "y": 1, "z": 2}
    as_ints = ts.chi2_homogeneity([codes[v] for v in a], [codes[v] for v in b])
    assert ts.chi2_homogeneity(a, b).p_value == pytest.approx(as_ints.p_value, rel=1e-12)


def test_null_p_values_are_uniform():
    probs = np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.015, 0.005])
    rng = np.random.default_rng(1)
    p = _null_p_values(lambda _: ts.chi2_homogeneity(rng.choice(10, 400, p=probs), rng.choice(10, 600, p=probs)).p_value)
    _assert_uniform(p, "10 categories, n = 400 / 600")


def test_power_matches_the_noncentral_chi_square():
    """Moving 0.03 of mass between two of 5 categories: the rejection rate at 0.05 is the noncentral chi-square's."""
    p = np.array([0.3, 0.25, 0.2, 0.15, 0.1])
    q = p + np.array([0.03, -0.03, 0, 0, 0])
    n_a = n_b = 1000
    pooled = (n_a * p + n_b * q) / (n_a + n_b)
    noncentrality = n_a * n_b / (n_a + n_b) * float(((p - q) ** 2 / pooled).sum())
    predicted = float(stats.ncx2.sf(stats.chi2.isf(ALPHA, 4), 4, noncentrality))
    rng = np.random.default_rng(2)
    rejected = [ts.chi2_homogeneity(rng.choice(5, n_a, p=p), rng.choice(5, n_b, p=q)).p_value < ALPHA for _ in range(REPS)]
    rate = float(np.mean(rejected))
    sd = (predicted * (1 - predicted) / REPS) ** 0.5
    assert 0.2 < predicted < 0.8, "the shift should be neither invisible nor obvious at this size"
    assert abs(rate - predicted) < 3.5 * sd, f"rejection rate {rate}, noncentral chi-square predicts {predicted:.3f}"


def test_small_known_shift_is_rejected_at_a_size_where_it_must_be():
    """The same 0.03 shift at n = 20,000 per sample: noncentrality ~ 82, the expected p is far below 1e-6."""
    p = np.array([0.3, 0.25, 0.2, 0.15, 0.1])
    q = p + np.array([0.03, -0.03, 0, 0, 0])
    rng = np.random.default_rng(3)
    result = ts.chi2_homogeneity(rng.choice(5, 20_000, p=p), rng.choice(5, 20_000, p=q))
    assert result.p_value < 1e-6


# ---------------------------------------------------------------------------------------------------------------
# Pooling


def test_pooling_rule_on_hand_counts():
    # Equal samples: expected count = pooled / 2. Kept: 100 and 50; rest 3 + 2 + 1 = 6 -> 3 < 5 joins the smallest
    # kept bin (category 3).
    assert ts.pool_sparse_bins(np.array([100, 3, 2, 50, 1]), 78, 78).tolist() == [0, 1, 1, 1, 1]
    # Rest 8 + 6 = 14 -> 7 >= 5 keeps a bin of its own (the last one).
    assert ts.pool_sparse_bins(np.array([100, 8, 6, 50]), 82, 82).tolist() == [0, 2, 2, 1]
    # The threshold reads the smaller sample: 12 * 100 / 1200 = 1 < 5 although 12 * 1100 / 1200 = 11.
    assert ts.pool_sparse_bins(np.array([1188, 12]), 100, 1100).tolist() == [0, 0]
    # Nothing kept: everything in one bin.
    assert ts.pool_sparse_bins(np.array([2, 3, 1]), 3, 3).tolist() == [0, 0, 0]


def test_pooling_counts_must_match_the_sample_sizes():
    with pytest.raises(ValueError, match="n_a \\+ n_b"):
        ts.pool_sparse_bins(np.array([5, 5]), 5, 6)


def test_pooling_keeps_a_zipf_1024_case_calibrated():
    """1,000 and 1,500 draws over 1,024 categories, p_k ~ k^-1.1: most categories are seen a few times."""
    k = np.arange(1, 1025)
    probs = k**-1.1 / (k**-1.1).sum()
    rng = np.random.default_rng(4)
    samples = [(rng.choice(1024, 1000, p=probs), rng.choice(1024, 1500, p=probs)) for _ in range(REPS)]
    pooled = np.array([ts.chi2_homogeneity(a, b).p_value for a, b in samples])
    _assert_uniform(pooled, "Zipf 1024, pooled")
    example = ts.chi2_homogeneity(*samples[0])
    assert example.pooled_into_rest > 300 and example.bins < 60, "the case is meant to be sparse"
    # Without pooling the chi-square approximation fails on the sparse cells (far too few rejections here).
    unpooled = np.array([ts.chi2_homogeneity(a, b, min_expected=0).p_value for a, b in samples])
    assert float((unpooled < ALPHA).mean()) < REJECTION_BAND[0]


# ---------------------------------------------------------------------------------------------------------------
# Degenerate inputs


def test_one_shared_category_gives_p_one():
    result = ts.chi2_homogeneity([7] * 20, [7] * 30)
    assert (result.statistic, result.dof, result.p_value, result.bins) == (0.0, 0, 1.0, 1)
    clustered = ts.chi2_homogeneity_clustered([7] * 20, np.arange(20), [7] * 30, np.arange(30))
    assert (clustered.dof, clustered.p_value) == (0, 1.0)


def test_disjoint_single_categories_are_rejected():
    assert ts.chi2_homogeneity([0] * 50, [1] * 50).p_value < 1e-20


@pytest.mark.parametrize("a, b, which", [([], [1, 2], "a"), ([1, 2], [], "b")])
def test_empty_sample_is_an_error(a, b, which):
    with pytest.raises(ValueError, match=f"sample {which} is empty"):
        ts.chi2_homogeneity(a, b)


def test_two_dimensional_sample_is_an_error():
    with pytest.raises(ValueError, match="one-dimensional"):
        ts.chi2_homogeneity(np.zeros((3, 2)), [1, 2])


# ---------------------------------------------------------------------------------------------------------------
# The clustered test


def _all_assignment_moments(codes, cluster, n_a_clusters):
    """Mean and variance of Pearson's X^2 over every way to give n_a_clusters whole clusters to sample a."""
    n_clusters = int(cluster.max()) + 1
    values = []
    for chosen in itertools.combinations(range(n_clusters), n_a_clusters):
        in_a = np.isin(cluster, chosen)
        table = np.stack([np.bincount(codes[in_a], minlength=4), np.bincount(codes[~in_a], minlength=4)]).astype(float)
        expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
        values.append(float(((table - expected) ** 2 / expected).sum()))
    return np.mean(values), np.var(values)


def test_clustered_null_moments_equal_an_exhaustive_enumeration():
    rng = np.random.default_rng(5)
    cluster = np.repeat(np.arange(10), 6)  # 10 clusters of 6
    codes = np.minimum(rng.geometric(0.45, cluster.size) - 1, 3)  # 4 categories, correlated within clusters below
    codes[cluster % 3 == 0] = np.sort(codes[cluster % 3 == 0])
    in_a = cluster < 4
    result = ts.chi2_homogeneity_clustered(codes[in_a], cluster[in_a], codes[~in_a], cluster[~in_a], min_expected=0)
    mean, var = _all_assignment_moments(codes, cluster, 4)
    assert result.bins == 4
    assert result.null_mean == pytest.approx(mean, rel=1e-9)
    assert result.null_variance == pytest.approx(var, rel=1e-9)


def test_clustered_test_is_calibrated_on_a_sticky_chain_where_the_plain_one_is_not():
    rng = np.random.default_rng(6)
    corrected, naive = [], []
    for _ in range(REPS):
        a, b = _markov(rng, 300, 24, 20, 0.7), _markov(rng, 300, 24, 20, 0.7)
        (ca, cla), (cb, clb) = ts.transition_samples(a), ts.transition_samples(b)
        r = ts.chi2_homogeneity_clustered(ca, cla, cb, clb)
        corrected.append(r.p_value)
        naive.append(r.naive_p_value)
    _assert_uniform(np.array(corrected), "sticky chain, clustered")
    assert r.design_effect > 1.1, "the chain should inflate the plain statistic"
    assert float((np.array(naive) < ALPHA).mean()) > 0.3, "the plain test should be far too liberal here"


def test_clusters_of_one_agree_with_the_plain_test():
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, 30, 3000), rng.integers(0, 30, 2000)
    plain = ts.chi2_homogeneity(a, b)
    clustered = ts.chi2_homogeneity_clustered(a, np.arange(a.size), b, np.arange(b.size))
    assert clustered.statistic == pytest.approx(plain.statistic, rel=1e-12)
    assert clustered.null_mean == pytest.approx(plain.dof, rel=2e-3)
    assert clustered.p_value == pytest.approx(plain.p_value, abs=0.01)


def test_equal_cluster_ids_of_the_two_samples_are_different_clusters():
    rng = np.random.default_rng(8)
    a, b = rng.integers(0, 5, 400), rng.integers(0, 5, 400)
    ids = np.repeat(np.arange(100), 4)
    same_ids = ts.chi2_homogeneity_clustered(a, ids, b, ids)
    offset_ids = ts.chi2_homogeneity_clustered(a, ids, b, ids + 1000)
    assert same_ids.p_value == offset_ids.p_value


def test_one_cluster_id_per_observation():
    with pytest.raises(ValueError, match="one cluster id per observation"):
        ts.chi2_homogeneity_clustered([1, 2, 3], [0, 0], [1, 2], [0, 1])


# ---------------------------------------------------------------------------------------------------------------
# Token sequences


def test_position_and_transition_samples_on_a_hand_example():
    seqs = np.array([[5, 6, 7], [8, 9, 10]])
    assert [p.tolist() for p in ts.position_samples(seqs)] == [[5, 8], [6, 9], [7, 10]]
    codes, clusters = ts.transition_samples(seqs)
    pairs = [(int(c) >> 31, int(c) & (2**31 - 1)) for c in codes]
    assert pairs == [(5, 6), (6, 7), (8, 9), (9, 10)]
    assert clusters.tolist() == [0, 0, 1, 1]
    codes2, _ = ts.transition_samples(seqs, first_position=2)
    assert [(int(c) >> 31, int(c) & (2**31 - 1)) for c in codes2] == [(6, 7), (9, 10)]


@pytest.mark.parametrize("bad, match", [
    (np.array([[1, -1]]), "token ids must lie"),
    (np.array([1, 2]), "\\[N, L\\] array"),
    (np.zeros((0, 3), dtype=np.int64), "empty"),
    (np.array([[0.5, 1.0]]), "integers"),
])
def test_bad_sequences_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        ts.transition_samples(bad)


def test_transition_test_sees_a_change_that_keeps_every_marginal():
    """Two chains with the uniform marginal at every position, one stickier: the per-position tests cannot tell
    them apart, the pooled pairs can."""
    rng = np.random.default_rng(9)
    a, b = _markov(rng, 2000, 12, 8, 0.3), _markov(rng, 2000, 12, 8, 0.15)
    cmp = ts.compare_token_sequences(a, b)
    assert len(cmp.positions) == 11 and cmp.first_position == 1
    assert cmp.positions_p > 0.01
    assert cmp.transitions_p < 1e-6
    assert cmp.rejected() and not cmp.lossless()


def test_same_chain_passes_and_position_zero_is_reported_not_tested():
    rng = np.random.default_rng(10)
    start = rng.integers(0, 8, 2000)
    a, b = _markov(rng, 2000, 12, 8, 0.3, start=start), _markov(rng, 2000, 12, 8, 0.3, start=start)
    cmp = ts.compare_token_sequences(a, b)
    assert cmp.excluded_positions_identical == [True]
    assert cmp.lossless()
    other = ts.compare_token_sequences(a, _markov(rng, 2000, 12, 8, 0.3))
    assert other.excluded_positions_identical == [False]
    assert ts.compare_token_sequences(a, b[:1500]).excluded_positions_identical == [None]


def test_combined_p_is_bonferroni_over_positions_and_transitions():
    def result(p):
        return ts.ChiSquareResult(1.0, 3, p, 4, 4, 0, 10, 10)

    cmp = ts.SequenceComparison(10, 10, 4, 1, [result(0.2), result(0.01), result(0.5)], result(0.3))
    assert cmp.positions_p == pytest.approx(0.03)
    assert cmp.combined_p == pytest.approx(0.06)
    cmp.transitions = result(1e-4)
    assert cmp.combined_p == pytest.approx(2e-4)
    assert not cmp.lossless() and not cmp.rejected()
    cmp.transitions = result(1e-8)
    assert cmp.rejected()
    assert ts.bonferroni_min([0.4, 0.5]) == 0.8 and ts.bonferroni_min([0.9, 0.6]) == 1.0


def test_sequences_of_different_lengths_are_an_error():
    with pytest.raises(ValueError, match="one length"):
        ts.compare_token_sequences(np.zeros((3, 4), dtype=np.int64), np.zeros((3, 5), dtype=np.int64))
