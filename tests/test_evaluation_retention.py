"""Retention comparison at the support-defined budget on stays built so the answer is known."""
from __future__ import annotations

import numpy as np
import pytest

from dashboards.schema import validate_result
from evaluation.errors import MetricError
from evaluation.policies import SupportVectorPolicy
from evaluation.retention import compare_retention


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
    assert 0.0 < res.means["random"] < 1.0
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
    assert not next(c for c in fields["claims"] if c["statement"].endswith("minus density (95% paired bootstrap "
                                                                             "over stays)"))["holds"]


def test_query_policies_are_rejected_by_the_icu_protocol():
    keys, events = _stays(n_stays=1)
    for pol in ("snapkv", "tova"):
        with pytest.raises(MetricError, match="query stream"):
            compare_retention(keys, events, policies=("sv", pol), progress=False)
