"""Pipelines without Prefect: gate store and the study computations (forget: test_pipelines_forget.py)."""
from __future__ import annotations

import numpy as np
import pytest

from cohort.synthetic import make_small_warehouse
from pipelines.store import gate_store
from pipelines.store import warehouse as wh


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
    from evaluation.clinical.retention import DEFAULT_POLICIES, build_policies, stay_retention

    rng = np.random.default_rng(0)
    n = 80
    X = 0.05 * rng.standard_normal((n, 6))
    events = np.zeros(n, bool)
    events[[3, 10, 17]] = True  # early, atypical hours
    X[events] += np.array([[4, 0, 0, 0, 0, 0], [0, -4, 0, 0, 0, 0], [0, 0, 0, 4, 0, 0]])
    r = stay_retention(X, events, build_policies(DEFAULT_POLICIES, nu=0.3, sigma=3.0))
    assert 0 < r["k"] < n
    assert r["retention"]["sv"] == 1.0  # outliers are support vectors
    assert r["retention"]["recency"] == 0.0  # the last k hours hold no event
    assert r["retention"]["density"] == 0.0  # density keeps the dense cluster
    assert r["retention"]["random"] == r["k"] / n  # the random baseline's exact expectation
    assert all(0.0 <= v <= 1.0 for v in r["retention"].values())


def test_aggregate_matches_serial_reference(base_wh):
    from cohort.streams import iter_stays
    from evaluation.clinical.retention import compare_retention, comparison_from_columns, concat_columns
    from evaluation.clinical.retention_spec import StaySpec
    from pipelines.flows.retention_chunks import batch_results

    ids = [s[0] for s in wh.stays(base_wh)][:10]
    pols = ["sv", "density", "recency", "random"]
    spec = StaySpec(policies=tuple(pols), build_gate=False)
    parts = []
    for batch in (ids[5:], ids[:5]):  # out of order, as tasks may finish
        parts.append(batch_results(str(base_wh), batch, spec)["columns"])
    mine = comparison_from_columns(concat_columns(parts), policies=pols, nu=0.3, sigma=3.0, n_boot=500)
    ss = list(iter_stays(base_wh, stay_ids=ids))
    ref = compare_retention([s.z for s in ss], [s.event_composite for s in ss], policies=pols, n_boot=500,
                            progress=False)
    for p in pols:
        assert mine.means[p] == pytest.approx(ref.means[p], abs=1e-12)
    for p in ("density", "recency", "random"):
        assert (mine.diffs[p].low, mine.diffs[p].high) == pytest.approx((ref.diffs[p].low, ref.diffs[p].high))
    assert mine.n_included == ref.n_included and mine.n_event_hours == ref.n_event_hours


def test_heldout_keys_are_5d(base_wh):
    from evaluation.clinical.retention_spec import StaySpec
    from pipelines.flows.retention_chunks import batch_results

    ids = [s[0] for s in wh.stays(base_wh)][:4]
    spec = StaySpec(label="event_spo2", drop=("spo2",), policies=("sv", "recency"), build_gate=False)
    cols = batch_results(str(base_wh), ids, spec)["columns"]
    assert set(cols["d"].tolist()) == {5} and cols["stay_id"].tolist() == ids


def test_data_kind_badges_say_what_the_data_is(tmp_path):
    from pipelines.flows.clinical_cohort import data_kind_of

    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "synthetic_manifest.json").write_text("{}")
    assert data_kind_of("mimic", str(gen)) == "synthetic"  # the generator's files read by the MIMIC adapter
    assert data_kind_of("mimic", str(tmp_path)) == "mimic" and data_kind_of("clif", str(tmp_path)) == "clif"
    assert data_kind_of("demo", None) == "demo" and data_kind_of("synthetic", None) == "synthetic"
