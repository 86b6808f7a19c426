"""Pipelines without Prefect: gate store and the study computations (forget: test_pipelines_forget.py)."""
from __future__ import annotations

import numpy as np
import pytest

from cohort.synthetic import make_small_warehouse
from pipelines import gate_store
from pipelines import retention as ret
from pipelines import warehouse as wh
from pipelines.deterioration import future_event_labels, future_event_labels_reference


@pytest.fixture(scope="module")
def base_wh(tmp_path_factory):
    return make_small_warehouse(tmp_path_factory.mktemp("wh"), stays=40, seed=0)


# ---------------------------------------------------------------------------------------- gate store
def test_gate_store_roundtrip_is_exact(tmp_path):
    from sv_core import Gate, calibrate_C

    X = np.random.default_rng(0).normal(size=(30, 4))
    g = Gate(calibrate_C(0.4, 30), 2.0)
    g.admit(X)
    g2 = gate_store.blob_to_gate(gate_store.gate_to_blob(g))
    assert np.array_equal(g.ids, g2.ids) and np.array_equal(g.alpha, g2.alpha) and g.rho == g2.rho
    P = X + 0.1
    assert np.array_equal(g.score(P), g2.score(P))


# ---------------------------------------------------------------------------------------- studies
def test_planted_retention_sv_beats_recency():
    rng = np.random.default_rng(0)
    n = 80
    X = 0.05 * rng.standard_normal((n, 6))
    events = np.zeros(n, bool)
    events[[3, 10, 17]] = True  # early, atypical hours
    X[events] += np.array([[4, 0, 0, 0, 0, 0], [0, -4, 0, 0, 0, 0], [0, 0, 0, 4, 0, 0]])
    r = ret.stay_retention(X, events, nu=0.3, sigma=3.0, rng=np.random.default_rng(1))
    assert 0 < r["k"] < n
    assert r["retention"]["sv"] == 1.0  # outliers are support vectors
    assert r["retention"]["recency"] == 0.0  # the last k hours hold no event
    assert r["retention"]["density"] == 0.0  # density keeps the dense cluster
    assert all(0.0 <= v <= 1.0 for v in r["retention"].values())


def test_aggregate_matches_serial_reference(base_wh):
    from cohort.streams import iter_stays
    from evaluation.retention import compare_retention

    ids = [s[0] for s in wh.stays(base_wh)][:10]
    pols = ("sv", "density", "recency")
    rows = []
    for batch in (ids[5:], ids[:5]):  # out of order, as tasks may finish
        rows += ret.retention_for_stays(str(base_wh), batch, policies=pols)
    mine = ret.aggregate(rows, policies=pols, nu=0.3, sigma=3.0, n_boot=500)
    ss = list(iter_stays(base_wh, stay_ids=ids))
    ref = compare_retention([s.z for s in ss], [s.event_composite for s in ss], policies=pols, n_boot=500,
                            progress=False)
    for p in pols:
        assert mine.means[p] == pytest.approx(ref.means[p], abs=1e-12)
    for p in ("density", "recency"):
        assert (mine.diffs[p].low, mine.diffs[p].high) == pytest.approx((ref.diffs[p].low, ref.diffs[p].high))
    assert mine.n_included == ref.n_included


def test_heldout_keys_are_5d(base_wh):
    ids = [s[0] for s in wh.stays(base_wh)][:4]
    rows = ret.retention_for_stays(str(base_wh), ids, label="event_spo2", drop=["spo2"])
    assert {r["d"] for r in rows} == {5}


def test_future_event_labels():
    ev = np.array([0, 0, 1, 0, 0, 0, 0, 0, 0, 1], bool)
    y, m = future_event_labels(ev, 6)
    y2, m2 = future_event_labels_reference(ev, 6)
    assert np.array_equal(y, y2) and np.array_equal(m, m2)
    assert y.tolist() == [1, 1, 0, 1, 1, 1, 1, 1, 1, 0]
    assert m.tolist() == [True, True, True, True, False, False, False, False, False, False]


def test_data_kind_badges_say_what_the_data_is(tmp_path):
    from pipelines.flows.clinical_cohort import data_kind_of

    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "synthetic_manifest.json").write_text("{}")
    assert data_kind_of("mimic", str(gen)) == "synthetic"  # the generator's files read by the MIMIC adapter
    assert data_kind_of("mimic", str(tmp_path)) == "mimic" and data_kind_of("clif", str(tmp_path)) == "clif"
    assert data_kind_of("demo", None) == "demo" and data_kind_of("synthetic", None) == "synthetic"
