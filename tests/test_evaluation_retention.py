"""Retention comparison at the support-defined budget on stays built so the answer is known."""
from __future__ import annotations

import numpy as np
import pytest

from dashboards.schema import validate_result
from evaluation.clinical.retention import compare_retention
from evaluation.errors import MetricError
from evaluation.policies import SupportVectorPolicy


def _stays(n_stays=5, seed=0):
    """Each stay: 3 atypical event hours first (far from everything), then 40 typical hours."""
    rng = np.random.default_rng(seed)
    keys, events = [], []
    for _ in range(n_stays):
        outliers = rng.normal(size=(3, 4)) * 0.3 + np.array([[6, 0, 0, 0], [0, 6, 0, 0], [0, 0, 6, 0]])
        typical = rng.normal(size=(40, 4)) * 0.5
        keys.append(np.vstack([outliers, typical]))
        events.append(np.r_[np.ones(3, bool), np.zeros(40, bool)])
    keys.append(rng.normal(size=(43, 4)))  # a stay without any event hour
    events.append(np.zeros(43, bool))
    return keys, events


def test_atypical_events_are_kept_by_sv_and_dropped_by_density_and_recency():
    keys, events = _stays()
    res = compare_retention(keys, events, nu=0.3, sigma=3.0, n_boot=300, seed=0, progress=False)
    assert (res.n_included, res.n_excluded) == (5, 1)
    assert res.means["sv"] == 1.0
    assert res.means["density"] == 0.0
    assert res.means["recency"] == 0.0  # events are the first hours; k < 40
    assert res.means["random"] == pytest.approx(res.mean_budget_fraction, abs=1e-15)  # its expectation k/n
    d = res.diffs["density"]
    assert (d.mean_diff, d.low, d.high) == (1.0, 1.0, 1.0)
    assert res.tests["density"]["t"] is None  # constant differences: t undefined, reported as None
    # budget is the SV support size of each stay
    sizes = [SupportVectorPolicy(0.3, 3.0).support_size(X) for X in keys[:5]]
    assert res.mean_support_size == pytest.approx(np.mean(sizes))
    assert res.mean_budget_fraction == pytest.approx(np.mean(np.array(sizes) / 43))
    assert all(len(v) == 5 for v in res.per_stay.values())


def test_result_fields_are_schema_valid_aggregates():
    keys, events = _stays(n_stays=3, seed=1)
    res = compare_retention(keys, events, n_boot=100, progress=False)
    fields = res.to_result_fields()
    result = {"study": "icu_retention", "title": "t", "data": "synthetic", "runtime_s": 0.1, "seed_figure": {},
              **fields}
    validate_result(result)
    assert fields["figures"][0]["categories"] == ["sv", "density", "recency", "random", "leverage", "kernel_leverage",
                                                  "keydiff"]
    assert fields["metrics"]["peer_beats_sv"] == []
    assert fields["metrics"]["retention"]["sv"] == 1.0
    assert all(c["holds"] for c in fields["claims"] if "density" in c["statement"])


def test_compare_retention_input_errors():
    keys, events = _stays(n_stays=1)
    with pytest.raises(MetricError, match="include 'sv'"):
        compare_retention(keys, events, policies=("density",), progress=False)
    with pytest.raises(MetricError, match="oracle"):
        compare_retention(keys, events, policies=("sv", "oracle"), progress=False)
    with pytest.raises(MetricError, match="no stay has an event"):
        compare_retention(keys[1:], events[1:], progress=False)
    with pytest.raises(MetricError, match="do not match"):
        compare_retention([keys[0]], [events[0][:5]], progress=False)


def test_a_policy_that_beats_sv_is_listed_plainly():
    keys, events = _stays(n_stays=4, seed=2)
    events = [~e if e.any() else e for e in events]  # events = the typical hours: density keeps them, SV does not
    res = compare_retention(keys, events, policies=("sv", "density", "kernel_leverage"), n_boot=200, progress=False)
    fields = res.to_result_fields()
    assert "density" in fields["metrics"]["peer_beats_sv"]
    assert res.diffs["density"].high < 0
    beats = {r[0]: r[-1] for r in fields["tables"][1]["rows"]}
    assert beats["density"] is True
    assert not next(c for c in fields["claims"] if "minus density (95% paired bootstrap over stays" in
                    c["statement"])["holds"]


def test_query_policies_are_rejected_by_the_icu_protocol():
    keys, events = _stays(n_stays=1)
    for pol in ("snapkv", "tova"):
        with pytest.raises(MetricError, match="query stream"):
            compare_retention(keys, events, policies=("sv", pol), progress=False)


# ------------------------------------------------------------------------------ random as expectation
def test_random_expectation_equals_analytic_k_over_n_on_a_constructed_stay():
    """Every k-subset enumerated (the reference) gives k/n, whatever the events; the policy's draws
    average to it; the per-stay map reports that expectation for "random"."""
    from evaluation.clinical.retention import (
        build_policies,
        random_expected_retention,
        random_expected_retention_reference,
        stay_policy_retention,
    )
    from evaluation.metrics import event_hour_retention
    from evaluation.policies import RandomPolicy

    ev = np.zeros(12, bool)
    ev[[0, 3, 4, 11]] = True
    for k in (1, 3, 5, 12):
        assert random_expected_retention_reference(ev, k) == pytest.approx(k / 12, abs=1e-12)
        assert random_expected_retention(12, k) == k / 12
    draws = [event_hour_retention(RandomPolicy(seed=s).select(np.zeros((12, 2)), 5, rng=np.random.default_rng(s)), ev)
             for s in range(2000)]
    assert abs(np.mean(draws) - 5 / 12) < 4 * np.std(draws) / np.sqrt(len(draws))
    keys, events = _stays(n_stays=1)
    r = stay_policy_retention(keys[0], events[0], build_policies(("sv", "random"), nu=0.3, sigma=3.0))
    assert r["retention"]["random"] == r["k"] / r["n"]
    with pytest.raises(MetricError):
        random_expected_retention(3, 4)


def test_sv_minus_random_uses_the_expectation():
    keys, events = _stays(n_stays=4, seed=3)
    res = compare_retention(keys, events, policies=("sv", "random"), n_boot=200, progress=False)
    budget = np.array([SupportVectorPolicy(0.3, 3.0).support_size(X) / 43 for X in keys[:4]])
    assert res.diffs["random"].mean_diff == pytest.approx(1.0 - budget.mean(), abs=1e-12)
    fields = res.to_result_fields()
    assert fields["config"]["random_policy"].startswith("exact expectation k/n")
    assert "random (expectation k/n)" in [r[0] for r in fields["tables"][0]["rows"]]


# ------------------------------------------------------------------------------ low power
def test_low_power_label_thresholds_and_claims():
    from evaluation.clinical.retention import LOW_POWER_MIN_EVENT_HOURS, LOW_POWER_MIN_STAYS, low_power

    assert low_power(38, 84) == (True, "low power: 38 stays with an event (< 100), 84 event hours (< 200)")
    assert low_power(LOW_POWER_MIN_STAYS, LOW_POWER_MIN_EVENT_HOURS) == (False, "")
    assert low_power(LOW_POWER_MIN_STAYS, LOW_POWER_MIN_EVENT_HOURS - 1)[0]
    keys, events = _stays(n_stays=3, seed=1)
    fields = compare_retention(keys, events, n_boot=50, progress=False).to_result_fields()
    m = fields["metrics"]
    assert m["low_power"] is True and m["event_hours"] == 9 and "3 stays with an event" in m["low_power_reason"]
    assert all("low power: 3 stays" in c["statement"] for c in fields["claims"])


# ------------------------------------------------------------------------------ columns
def test_columns_round_trip_and_batch_order_does_not_matter():
    from evaluation.clinical.retention import (
        build_policies,
        comparison_from_columns,
        concat_columns,
        rows_to_columns,
        stay_policy_retention,
    )

    keys, events = _stays(n_stays=5, seed=4)
    pols = ("sv", "density", "recency", "random")
    built = build_policies(pols, nu=0.3, sigma=3.0)
    rows = [stay_policy_retention(X, e, built) for X, e in zip(keys, events)]
    parts = []
    for lo, hi in ((3, 6), (0, 3)):  # out of order, as tasks may finish
        c = rows_to_columns(rows[lo:hi], pols, d=4)
        c["stay_id"] = np.arange(lo, hi) + 100
        parts.append(c)
    cols = concat_columns(parts)
    assert cols["d"].tolist() == [4] * 6 and cols["included"].sum() == 5
    mine = comparison_from_columns(cols, policies=pols, nu=0.3, sigma=3.0, n_boot=300)
    ref = compare_retention(keys, events, policies=pols, n_boot=300, progress=False)
    for p in pols:
        assert mine.means[p] == ref.means[p]
    assert mine.diffs["density"] == ref.diffs["density"] and mine.n_excluded == 1
    with pytest.raises(MetricError, match="column sets differ"):
        concat_columns([parts[0], {"x": np.zeros(1)}])
    # a part read back from the task cache may list the columns in another order (a resumed run)
    shuffled = [parts[0], {c: parts[1][c] for c in reversed(list(parts[1]))}, *parts[2:]]
    again = concat_columns(shuffled)
    assert list(again) == list(cols)
    for c in cols:
        np.testing.assert_array_equal(again[c], cols[c])  # NaN where NaN
    with pytest.raises(MetricError, match="column sets differ"):
        concat_columns([parts[0], {**parts[1], "extra": np.zeros(len(parts[1]["d"]))}])


# ------------------------------------------------------------------------------ sampling
def test_seeded_sample_is_deterministic_nested_and_stable_under_rebuilds():
    from evaluation.clinical.sampling import sample_stays, seeded_order

    ids = list(range(1000, 1200))
    a = sample_stays(ids, 20, seed=0)
    assert a.tolist() == sorted(a.tolist()) and len(a) == 20
    assert np.array_equal(a, sample_stays(ids[::-1], 20, seed=0))  # input order is irrelevant
    assert set(sample_stays(ids, 10, seed=0)) <= set(a)  # nested
    assert not np.array_equal(a, sample_stays(ids, 20, seed=1))
    # a rebuild that drops stays outside the sample (a forgotten patient) keeps the sample
    gone = [s for s in ids if s not in set(a.tolist())][:50]
    assert np.array_equal(sample_stays([s for s in ids if s not in gone], 20, seed=0), a)
    assert sample_stays(ids, None).tolist() == ids and sample_stays(ids, 10_000).tolist() == ids
    import hashlib  # the order, recomputed from its definition: SHA-256("seed:stay_id"), first 8 bytes

    by_hash = sorted(ids, key=lambda s: hashlib.sha256(f"0:{s}".encode()).digest()[:8])
    assert seeded_order(ids, 0).tolist() == by_hash and a.tolist() == sorted(by_hash[:20])
    with pytest.raises(MetricError):
        sample_stays([1, 1, 2], 1)
    with pytest.raises(MetricError):
        sample_stays(ids, 0)


# ------------------------------------------------------------------------------ refit audit
def test_refit_audit_agrees_with_the_certified_solve_and_counts():
    from evaluation.clinical.retention_audit import audit_stay, audit_summary, score_gap
    from sv_core import calibrate_C, solve

    keys, _ = _stays(n_stays=2, seed=5)
    X = keys[0]
    C = float(calibrate_C(nu=0.3, n0=X.shape[0]))
    r = audit_stay(X, C, 3.0)
    assert r["score_dev"] < 1e-9 and r["partition_match"] and r["solve_kkt"] < 1e-9 and r["refit_kkt"] < 1e-9
    sol = solve(X, C=C, sigma=3.0)
    from sv_core import rbf_kernel

    s = 2.0 * rbf_kernel(X, X, 3.0) @ sol.alpha - sol.rho
    assert score_gap(X, sol.alpha, C, 3.0, s) < 1e-12  # ρ read off the margin keys = the solve's
    assert score_gap(X, sol.alpha, C, 3.0, s + 0.25) == pytest.approx(0.25, abs=1e-12)  # a gap is seen
    summ = audit_summary([r, dict(r, score_dev=1e-3, partition_match=False, partition_agreement=0.5),
                          {"n": 9, "refit_failed": True, "solve_kkt": 0.0, "solve_fallback": 0}],
                         candidates=5, skipped_long=1)
    assert summ["stays_audited"] == 2 and summ["refit_failures"] == 1 and summ["partition_exact_matches"] == 1
    assert summ["score_dev_max"] == 1e-3 and summ["partition_agreement_min"] == 0.5
    assert summ["stays_skipped_longer_than"]["stays"] == 1


# ------------------------------------------------------------------------------ sensitivity
def test_sensitivity_grid_matches_the_main_comparison_at_the_study_setting():
    from evaluation.clinical.retention_sensitivity import (
        median_distance_sigma,
        sensitivity_table,
        settings,
        stay_sensitivity,
    )

    keys, events = _stays(n_stays=4, seed=6)
    grid = settings(3.0)
    assert len(grid) == 16 and grid[8] == (0.3, "study σ", ("fixed", 3.0))
    per = [r for r in (stay_sensitivity(X, e, grid) for X, e in zip(keys, events)) if r is not None]
    assert len(per) == 4
    table, summary = sensitivity_table(grid, per, n_boot=200, sample_note="test")
    main = compare_retention(keys, events, policies=("sv", "leverage", "kernel_leverage"), n_boot=200,
                             progress=False)
    row = table["rows"][8]
    assert row[:4] == [0.3, "study σ", "3", 4]
    assert row[5:8] == [main.means["sv"], main.means["leverage"], main.means["kernel_leverage"]]
    assert row[8] == main.diffs["leverage"].mean_diff
    assert row[9] == f"[{main.diffs['leverage'].low:.3f}, {main.diffs['leverage'].high:.3f}]"
    assert summary["settings"] == 16 and len(table["rows"]) == 16
    # the median rule is label-free and exact on a hand-checked case
    X = np.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]])  # distances 5, 5, 10
    assert median_distance_sigma(X) == 5.0
    assert median_distance_sigma(np.zeros((4, 2))) == 1.0
    assert median_distance_sigma(np.r_[np.zeros((5, 2)), [[1.0, 0.0]]]) == 1.0  # median 0 -> positive median
    med_rows = [r for r in table["rows"] if r[1].startswith("median")]
    assert all(r[2].startswith("per stay, median") for r in med_rows)
