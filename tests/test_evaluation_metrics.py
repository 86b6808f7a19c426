"""Retention, paired bootstrap, AUROC/AUPRC and paired tests against hand numbers and slow loops."""
from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.classification import auroc_auprc_with_ci, roc_curve_points
from evaluation.errors import MetricError
from evaluation.metrics import (
    bootstrap_indices,
    event_hour_retention,
    paired_bootstrap_ci,
    paired_bootstrap_ci_reference,
    paired_bootstrap_cis,
    paired_differences,
    paired_t_test,
    retention_over_stays,
    wilcoxon_test,
)


# ---------------------------------------------------------------- retention
def test_event_hour_retention_by_hand():
    assert event_hour_retention([0, 2], [True, False, True, True]) == pytest.approx(2 / 3)
    assert event_hour_retention([], [True, False]) == 0.0
    assert event_hour_retention([0, 1], [False, False]) is None
    assert event_hour_retention(np.array([1]), np.array([0, 1])) == 1.0


def test_event_hour_retention_rejects_bad_input():
    with pytest.raises(MetricError, match="duplicates"):
        event_hour_retention([1, 1], [True, True])
    with pytest.raises(MetricError, match=r"\[0, 2\)"):
        event_hour_retention([2], [True, True])
    with pytest.raises(MetricError, match="boolean"):
        event_hour_retention([0], [0.5, 1.0])


def test_retention_over_stays_excludes_and_counts_eventless_stays():
    kept = [[0, 1], [3], [0], [1, 2, 3]]
    events = [
        [True, False, True, False],  # 1/2
        [False, False, False, False],  # excluded
        [True, True, False, True],  # 1/3
        [False, True, False, False],  # 1/1
    ]
    r = retention_over_stays(kept, events)
    np.testing.assert_allclose(r.per_stay, [0.5, 1 / 3, 1.0])
    assert r.included.tolist() == [True, False, True, True]
    assert (r.n_included, r.n_excluded) == (3, 1)
    assert r.mean == pytest.approx((0.5 + 1 / 3 + 1.0) / 3)
    assert r.mean_budget_fraction == pytest.approx((2 / 4 + 1 / 4 + 3 / 4) / 3)
    assert set(r.to_dict()) == {"mean", "n_included", "n_excluded", "mean_budget_fraction"}
    with pytest.raises(MetricError, match="stays"):
        retention_over_stays(kept[:2], events)


# ---------------------------------------------------------------- paired bootstrap
def test_paired_differences_checks_alignment():
    np.testing.assert_array_equal(paired_differences([3, 2], [1, 1]), [2, 1])
    with pytest.raises(MetricError, match="length"):
        paired_differences([1, 2, 3], [1, 2])
    with pytest.raises(MetricError, match="NaN"):
        paired_differences([1, np.nan], [1, 2])


def test_bootstrap_constant_difference_has_degenerate_interval():
    ci = paired_bootstrap_ci([0.9, 0.8, 0.7], [0.4, 0.3, 0.2], n_boot=500)
    assert (ci.mean_diff, ci.low, ci.high) == pytest.approx((0.5, 0.5, 0.5))


def test_bootstrap_two_units_by_hand():
    # d = (0, 1): a resample mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so the 2.5 %
    # and 97.5 % percentiles of 10,000 resamples are 0 and 1.
    ci = paired_bootstrap_ci([0.0, 1.0], [0.0, 0.0], n_boot=10_000, seed=0)
    assert (ci.mean_diff, ci.low, ci.high) == (0.5, 0.0, 1.0)
    assert (ci.n_units, ci.n_boot, ci.level) == (2, 10_000, 0.95)


def test_bootstrap_matches_slow_loop_and_is_chunk_invariant():
    rng = np.random.default_rng(2)
    a, b = rng.random(37), rng.random(37) * 0.8
    fast = paired_bootstrap_ci(a, b, n_boot=700, seed=4, level=0.9)
    slow = paired_bootstrap_ci_reference(a, b, n_boot=700, seed=4, level=0.9)
    assert fast.mean_diff == pytest.approx(slow.mean_diff, abs=1e-14)
    assert fast.low == pytest.approx(slow.low, abs=1e-12)
    assert fast.high == pytest.approx(slow.high, abs=1e-12)
    tiny_chunks = paired_bootstrap_ci(a, b, n_boot=700, seed=4, level=0.9, chunk_elems=100)
    assert (tiny_chunks.low, tiny_chunks.high) == (fast.low, fast.high)
    other_seed = paired_bootstrap_ci(a, b, n_boot=700, seed=5, level=0.9)
    assert (other_seed.low, other_seed.high) != (fast.low, fast.high)


def _one_ci_at_a_time(a, b, n_boot, seed, level, chunk_elems=2_000_000):
    """The per-pair loop the shared draw replaced: each interval draws its own resamples."""
    d = np.asarray(a, float) - np.asarray(b, float)
    rng, n = np.random.default_rng(seed), d.size
    rows, means, start = max(1, chunk_elems // n), np.empty(n_boot), 0
    while start < n_boot:
        r = min(rows, n_boot - start)
        means[start:start + r] = d[bootstrap_indices(rng, r, n)].mean(axis=1)
        start += r
    t = (1 - level) / 2 * 100
    return (float(d.mean()), *map(float, np.percentile(means, [t, 100 - t])))


def test_shared_draw_equals_one_bootstrap_per_pair_bit_for_bit():
    rng = np.random.default_rng(3)
    a = rng.random(211)
    pairs = [(a, rng.random(211) * s) for s in (0.5, 0.9, 1.1)] + [(a, np.zeros(211))]
    for chunk in (2_000_000, 1_000):  # several chunks: the draw order must not depend on the pairs
        got = paired_bootstrap_cis(pairs, n_boot=3_001, seed=7, level=0.9, chunk_elems=chunk)
        for (x, y), ci in zip(pairs, got):
            assert (ci.mean_diff, ci.low, ci.high) == _one_ci_at_a_time(x, y, 3_001, 7, 0.9, chunk)
            slow = paired_bootstrap_ci_reference(x, y, n_boot=3_001, seed=7, level=0.9)
            assert ci.low == pytest.approx(slow.low, abs=1e-12) and ci.high == pytest.approx(slow.high, abs=1e-12)
    assert paired_bootstrap_cis([], n_boot=10) == []
    with pytest.raises(MetricError, match="same number of units"):
        paired_bootstrap_cis([(a, a), (a[:5], a[:5])])


def test_bootstrap_interval_covers_normal_theory_width():
    # 400 units, sd 1: the 95 % interval half-width is about 1.96/sqrt(400) = 0.098
    d = np.random.default_rng(9).normal(0.3, 1.0, size=400)
    ci = paired_bootstrap_ci(d, np.zeros_like(d), n_boot=10_000, seed=0)
    half = (ci.high - ci.low) / 2
    assert half == pytest.approx(1.96 * d.std() / math.sqrt(400), rel=0.08)
    assert ci.low < ci.mean_diff < ci.high


def test_bootstrap_rejects_bad_settings():
    with pytest.raises(MetricError, match="n_boot"):
        paired_bootstrap_ci([1.0], [0.0], n_boot=0)
    with pytest.raises(MetricError, match="level"):
        paired_bootstrap_ci([1.0], [0.0], level=95)


# ---------------------------------------------------------------- AUROC / AUPRC
def _auroc_pairs(y, p):
    """Slow reference: Mann-Whitney probability over all positive/negative pairs."""
    pos = [pi for yi, pi in zip(y, p) if yi == 1]
    neg = [pi for yi, pi in zip(y, p) if yi == 0]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def test_auroc_auprc_point_estimates_by_hand():
    # ranked: 0.8 (+), 0.4 (-), 0.35 (+), 0.1 (-): AUROC = 3/4; AP = 1/2*1 + 1/2*2/3 = 5/6
    r = auroc_auprc_with_ci([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8], n_boot=200, seed=0)
    assert r.auroc == pytest.approx(0.75)
    assert r.auprc == pytest.approx(5 / 6)
    assert (r.n, r.n_pos, r.prevalence) == (4, 2, 0.5)
    assert r.n_boot_used + r.n_boot_skipped == 200 and r.n_boot_skipped > 0  # tiny n: 1-class resamples
    assert 0.0 <= r.auroc_low <= r.auroc_high <= 1.0


def test_auroc_bootstrap_matches_pairwise_reference_loop():
    from evaluation.metrics import bootstrap_indices

    rng = np.random.default_rng(0)
    y = (rng.random(60) < 0.3).astype(int)
    p = np.round(y * 0.4 + rng.random(60), 2)  # rounding creates ties
    r = auroc_auprc_with_ci(y, p, n_boot=150, seed=3)
    assert r.auroc == pytest.approx(_auroc_pairs(y, p), abs=1e-12)
    g = np.random.default_rng(3)
    vals = []
    for _ in range(150):
        idx = bootstrap_indices(g, 1, 60)[0]
        if len(set(y[idx])) == 2:
            vals.append(_auroc_pairs(y[idx], p[idx]))
    lo, hi = np.percentile(vals, [2.5, 97.5])
    assert (r.auroc_low, r.auroc_high) == pytest.approx((lo, hi), abs=1e-12)
    assert r.n_boot_used == len(vals)


def test_auroc_cluster_bootstrap_counts_groups_and_widens():
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(40), 10)
    stay_effect = np.repeat(rng.normal(size=40), 10)  # strongly correlated within stays
    y = (stay_effect + 0.3 * rng.normal(size=400) > 0.8).astype(int)
    p = stay_effect + rng.normal(size=400)
    flat = auroc_auprc_with_ci(y, p, n_boot=300, seed=0)
    clus = auroc_auprc_with_ci(y, p, n_boot=300, seed=0, groups=groups)
    assert clus.n_groups == 40 and flat.n_groups is None
    assert clus.auroc == flat.auroc
    assert (clus.auroc_high - clus.auroc_low) > (flat.auroc_high - flat.auroc_low)


def test_auroc_rejects_single_class_and_bad_labels():
    with pytest.raises(MetricError, match="both classes"):
        auroc_auprc_with_ci([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(MetricError, match="binary"):
        auroc_auprc_with_ci([0, 2, 1], [0.1, 0.2, 0.3])


def test_roc_curve_points_on_a_grid():
    perfect = roc_curve_points([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9], n_points=5)
    assert perfect["fpr"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert perfect["tpr"] == [1.0] * 5
    inverted = roc_curve_points([0, 1], [0.9, 0.1], n_points=3)
    assert inverted["tpr"] == [0.0, 0.0, 1.0]


# ---------------------------------------------------------------- paired tests
def test_paired_t_test_by_hand():
    # d = (1, 2, 3): t = 2 / (1/sqrt 3) = 2 sqrt 3, df = 2; two-sided p = 1 - t/sqrt(2 + t^2)
    r = paired_t_test([2, 4, 6], [1, 2, 3])
    t = 2 * math.sqrt(3)
    assert r.statistic == pytest.approx(t)
    assert r.pvalue == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert (r.n, r.mean_diff) == (3, 2.0)
    with pytest.raises(MetricError, match="constant"):
        paired_t_test([2, 3], [1, 2])


def test_wilcoxon_by_hand():
    # five positive differences: W = 0, exact two-sided p = 2 / 2^5
    r = wilcoxon_test([2, 4, 6, 8, 10], [1, 2, 3, 4, 5])
    assert r.statistic == 0.0
    assert r.pvalue == pytest.approx(2 / 32)
    with pytest.raises(MetricError, match="zero"):
        wilcoxon_test([1, 2], [1, 2])
