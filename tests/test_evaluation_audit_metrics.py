"""Audit metrics: gate scores, score gaps, decay baseline, readout leakage."""
from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.audit_metrics import (
    decay_alpha,
    gate_scores,
    max_abs_score_gap,
    readout_weight_share,
    readout_weight_share_reference,
)
from evaluation.errors import MetricError

E = math.e


def test_decay_alpha_scales_targets_only_and_copies():
    a = np.array([0.5, 0.3, 0.2])
    out = decay_alpha(a, [1], 0.01)
    np.testing.assert_allclose(out, [0.5, 0.003, 0.2])
    np.testing.assert_array_equal(a, [0.5, 0.3, 0.2])  # input untouched
    np.testing.assert_allclose(decay_alpha(a, [0, 0, 2], 0.1), [0.05, 0.3, 0.02])  # repeats scale once
    np.testing.assert_allclose(decay_alpha(a, 2, 0.0), [0.5, 0.3, 0.0])
    with pytest.raises(MetricError, match="gamma"):
        decay_alpha(a, [0], 1.5)
    with pytest.raises(MetricError, match="range"):
        decay_alpha(a, [3], 0.1)


def test_max_abs_score_gap_per_set_and_overall():
    f = lambda P: P[:, 0]  # noqa: E731
    g = lambda P: P[:, 0] + P[:, 1]  # noqa: E731
    gaps = max_abs_score_gap(f, g, {"retained": [[1.0, 0.5], [0.0, -2.0]], "removed": [[3.0, 0.25]],
                                    "none": np.zeros((0, 2))})
    assert gaps == {"retained": 2.0, "removed": 0.25, "all": 2.0}
    with pytest.raises(MetricError, match="empty"):
        max_abs_score_gap(f, g, {})


def test_gate_scores_and_leakage_by_hand():
    X = np.array([[0.0], [1.0]])
    a = np.array([0.5, 0.5])
    # s(0) = 2 (0.5*1 + 0.5*e^-1) - 0.2
    np.testing.assert_allclose(gate_scores(X, a, 0.2, [[0.0]], 1.0), [1 + E**-1 - 0.2], rtol=1e-12)
    share = readout_weight_share(X, a, [[0.0]], [1], sigma=1.0)
    assert share == pytest.approx(E**-1 / (1 + E**-1), rel=1e-12)
    # after a completed deletion the forgotten key has alpha 0: zero leakage
    assert readout_weight_share(X, np.array([1.0, 0.0]), [[0.0], [1.0]], [1], sigma=1.0) == 0.0
    # mask and index forms agree
    assert (readout_weight_share(X, a, [[0.3]], np.array([False, True]), 1.0)
            == readout_weight_share(X, a, [[0.3]], [1], 1.0))


def test_leakage_matches_reference_loop():
    rng = np.random.default_rng(0)
    X, Q = rng.normal(size=(20, 3)), rng.normal(size=(6, 3))
    a = rng.random(20)
    a /= a.sum()
    sub = [2, 5, 11]
    assert readout_weight_share(X, a, Q, sub, 2.0) == pytest.approx(readout_weight_share_reference(X, a, Q, sub, 2.0),
                                                                    rel=1e-12)
    with pytest.raises(MetricError, match="zero total"):
        readout_weight_share(X, np.zeros(20), Q, sub, 2.0)
    with pytest.raises(MetricError, match="alpha"):
        readout_weight_share(X, a[:5], Q, sub, 2.0)


def test_example_3_1_full_history_vs_pruned_gap():
    """SPEC Example 3.1 acceptance numbers through refit + gate_scores + max_abs_score_gap."""
    import sv_core

    X = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 0.9], [0.0, -10.0]])
    a_full, r_full = sv_core.refit(X, C=1.0, sigma=5.0)
    assert a_full[2] == pytest.approx(0.03327001, abs=1e-7)
    keep = [0, 1, 3]  # key 3 was evicted as reserve before (0, -10) arrived
    a_pr, r_pr = sv_core.refit(X[keep], C=1.0, sigma=5.0)
    gaps = max_abs_score_gap(
        lambda P: gate_scores(X, a_full, r_full, P, 5.0),
        lambda P: gate_scores(X[keep], a_pr, r_pr, P, 5.0),
        {"keys": X},
    )
    assert gaps["all"] == pytest.approx(4.07857e-3, rel=1e-5)
