"""Patient deletion (evaluation.clinical.patient_deletion and its flow): exact deletion is told
from naive removal by the gap to a same-C refit (zero leakage is not enough: any removal gives
0); contexts are a deterministic sample; the flow runs in batches, aggregates in SQL and
publishes its gates in one step."""
from __future__ import annotations

import json
import math
import shutil

import duckdb
import numpy as np
import pytest

from cohort.streams import iter_stays
from cohort.synthetic import make_small_warehouse
from evaluation.clinical import patient_deletion as pdel
from evaluation.clinical import patient_deletion_result as pres
from evaluation.studies.errors import StudyConfigError
from pipelines.store import warehouse as wh


@pytest.fixture(scope="module")
def base_wh(tmp_path_factory):
    return make_small_warehouse(tmp_path_factory.mktemp("wh"), stays=40, seed=0)


def _context(w, group):
    by = {s.stay_id: s for s in iter_stays(str(w), stay_ids=group)}
    return pdel.build_context([by[s] for s in group])


def test_dedupe_indices_match_dedupe():
    from sv_core.audit import dedupe

    X = np.repeat(np.random.default_rng(0).normal(size=(6, 3)), 3, axis=0)
    X[1] += 0.05
    idx = pdel.dedupe_indices(X, 0.1)
    assert np.array_equal(X[idx], dedupe(X, 0.1))
    assert idx.tolist() == [0, 3, 6, 9, 12, 15]


def test_contexts_are_a_deterministic_sample_of_every_eligible_patient(base_wh):
    stays = wh.stays(base_wh)
    every = pdel.plan_contexts(stays, 5, seed=0)
    patients = {s[1] for s in stays}
    assert len(every) == len(patients) // 5
    assert len({s for g in every for s in g}) == 5 * len(every)  # one stay per patient, no repeats
    assert pdel.plan_contexts(stays, 5, seed=0, contexts=2) == every[:2]
    assert pdel.plan_contexts(stays, 5, seed=0, n_stays=12) == every[:2]  # 12 stays -> 2 contexts
    assert pdel.plan_contexts(stays, 5, seed=1) != every
    for bad in ({"contexts": 0}, {"n_stays": -3}, {"contexts": 1.5}):
        with pytest.raises(StudyConfigError):
            pdel.plan_contexts(stays, 5, seed=0, **bad)
    with pytest.raises(StudyConfigError, match="at least 5 patients"):
        pdel.plan_contexts(stays, 5, seed=0, n_stays=4)


def test_naive_removal_renormalises_the_kept_coefficients():
    a = pdel.naive_removal_alpha(np.array([0.2, 0.3, 0.5]), np.array([True, False, True]))
    assert np.allclose(a, [0.2 / 0.7, 0.5 / 0.7]) and math.isclose(a.sum(), 1.0)
    with pytest.raises(StudyConfigError):
        pdel.naive_removal_alpha(np.array([0.0, 1.0]), np.array([True, False]))


def test_exact_deletion_reaches_the_refit_and_naive_removal_does_not(base_wh):
    group = pdel.plan_contexts(wh.stays(base_wh), 5, seed=0)[0]
    r = pdel.forget_patient(_context(base_wh, group), 2)
    # leakage cannot tell them apart: both are exactly 0
    assert r["leakage_after"] == 0.0 and r["leakage_naive"] == 0.0 and r["forgotten_tokens_live_after"] == 0
    assert r["leakage_before"] > r["leak_g0p5"] > r["leak_g0p1"] > r["leak_g0p01"] > 0
    # the gap to the same-C refit does
    assert r["gap_score_exact"] < 1e-9 and r["gap_readout_exact"] < 1e-9
    assert r["gap_score_naive"] > 1e-6 and r["gap_readout_naive"] > 1e-6
    assert r["gap_score_naive"] > 1e6 * max(r["gap_score_exact"], 1e-16)
    for g in ("g0p5", "g0p1", "g0p01"):
        assert r[f"gap_score_{g}"] > 1e-6
        assert 0 < r[f"leak_alpha_{g}"] < 1 and 0 < r[f"leak_allkeys_{g}"] < 1
    # the exact gap agrees with the gate's own verification against an independent refit
    assert r["gap_score_exact"] <= 10 * r["refit_score_dev_max"] + 1e-13
    assert r["kkt_residual"] < 1e-9 and r["n"] <= 5 * 48 and not r["fallback"]
    row = pdel.context_row(r)
    assert "gate_state" not in row and all(isinstance(v, (int, float, bool, np.generic)) for v in row.values())


def test_decay_leakage_is_the_readout_weight_share_by_hand():
    """Two keys, the forgotten one at the query: share = γ α₀ / (γ α₀ + α₁ κ)."""
    from evaluation.audit_metrics import decay_alpha, readout_weight_share

    X = np.array([[0.0, 0.0], [1.0, 0.0]])
    a = np.array([0.6, 0.4])
    for gm in (0.5, 0.1):
        share = readout_weight_share(X, decay_alpha(a, [0], gm), X[:1], [0], sigma=2.0)
        k = math.exp(-1.0 / 4.0)
        assert share == pytest.approx(gm * 0.6 / (gm * 0.6 + 0.4 * k), rel=1e-12)


def test_sigma_sensitivity_reproduces_the_main_decay_figures(base_wh):
    group = pdel.plan_contexts(wh.stays(base_wh), 5, seed=0)[1]
    ctx = _context(base_wh, group)
    r = pdel.forget_patient(ctx, 0, decay_sigmas=(2.0, 1.2))
    assert r["leak_s2_g0p1"] == pytest.approx(r["leak_g0p1"], rel=1e-12)
    assert r["leak_s1p2_g0p1"] > r["leak_s2_g0p1"]  # a narrower kernel leaks more weight at own keys


def _rows(w, groups, targets):
    out = []
    for g, t in zip(groups, targets):
        out.append(pdel.context_row(pdel.forget_patient(_context(w, g), int(t))))
    return out


def test_sql_aggregates_match_numpy_and_the_result_labels_low_power(base_wh):
    import pyarrow as pa

    groups = pdel.plan_contexts(wh.stays(base_wh), 5, seed=0, contexts=3)
    rows = _rows(base_wh, groups, [0, 1, 2])
    con = duckdb.connect()
    con.register("t_rows", pa.Table.from_pylist(rows))
    con.execute("CREATE TABLE t AS SELECT * FROM t_rows")
    m = pres.aggregate(con, "t", attempted=4)
    col = lambda k: np.array([r[k] for r in rows], dtype=float)  # noqa: E731
    assert (m["contexts_attempted"], m["contexts_completed"]) == (4, 3)
    assert m["decay_leakage_mean"]["gamma_0.5"] == pytest.approx(col("leak_g0p5").mean(), rel=1e-12)
    assert m["gap_to_refit"]["naive"]["score_median"] == pytest.approx(np.median(col("gap_score_naive")), rel=1e-12)
    assert m["gap_to_refit"]["exact"]["score_max"] == pytest.approx(col("gap_score_exact").max(), rel=1e-12)
    assert m["kkt_residual_median"] == pytest.approx(np.median(col("kkt_residual")), rel=1e-12)
    assert m["certified"] == 3 and m["partition_match_fraction"] == pytest.approx(col("partition_match").mean())
    res = pres.study_result(m, data="synthetic", seed_comparable=False)
    assert res["metrics"]["power"]["low_power"] and "3 five-patient contexts" in res["metrics"]["power"]["label"]
    leak = res["tables"][1]
    assert leak["columns"][-1] == "paper" and all(row[-1] is None for row in leak["rows"])
    assert res["claims"][0]["holds"] is True  # exact < 1e-9 and naive > 1e-6
    real = pres.study_result(m, data="demo", seed_comparable=True)
    paper = {row[0]: row[-1] for row in real["tables"][1]["rows"]}
    assert paper == {"exact C&P deletion": 0.0, "naive removal": None, "decay γ = 0.5": 0.29, "decay γ = 0.1": 0.09,
                     "decay γ = 0.01": None}
    assert "paper 0.29 / 0.09" in real["metrics"]["headline"] and "paper" not in res["metrics"]["headline"]
    from dashboards.schema import validate_result

    validate_result(res)
    validate_result(real)
    # claims on ranges over contexts; the decay pair is stated as fitted to the paper's figure, not "not stated"
    assert m["decay_leakage_min"]["gamma_0.1"] == pytest.approx(col("leak_g0p1").min(), rel=1e-12)
    assert m["gap_to_refit"]["naive"]["score_min"] == pytest.approx(col("gap_score_naive").min(), rel=1e-12)
    assert "fitted to the paper's figure" in real["metrics"]["decay_gamma_source"]
    assert real["metrics"]["decay_gammas"] == [0.5, 0.1] and "fitted to the paper's figure" in real["notes"]
    assert real["metrics"]["decay_gamma_note"] == "fitted to the paper's figure"
    gap, leak_claim = real["claims"]
    assert gap["status"] == "holds" and gap["peer"]["value"] == m["gap_to_refit"]["naive"]["score_min"]
    assert leak_claim["status"] == "holds" and "fitted to the paper's figure" in leak_claim["paper"]["figure"]
    assert leak_claim["low_power"] == {"flag": True, "n": 3, "minimum": 20, "unit": "five-patient contexts",
                                       "label": res["metrics"]["power"]["label"]}
    assert res["claims"][1]["paper"]["figure"] is None  # synthetic run: the paper's real-record figure not shown
    assert any(row[1] == "< 1e-12" for row in res["tables"][0]["rows"])  # the exact gap prints as its bound


def test_flow_runs_in_batches_and_publishes_its_gates_once(prefect_harness, base_wh, tmp_path):
    from pipelines.flows.clinical_deletion import PENDING, STUDY, patient_deletion_flow
    from pipelines.runtime import runner
    from pipelines.settings import DeletionSettings
    from pipelines.store import gate_store

    runs = tmp_path / "runs"
    runs.mkdir()
    w = runs / "warehouse.duckdb"
    shutil.copy(base_wh, w)
    wh.set_data_kind(w, "synthetic")
    # what a killed run would have left: a pending context (dropped by the next run)
    group = pdel.plan_contexts(wh.stays(w), 5, seed=0)[0]
    ctx = _context(w, group)
    from sv_core import Gate, calibrate_C

    g = Gate(C=calibrate_C(0.5, ctx.keys.shape[0]), sigma=2.0)
    g.admit(ctx.keys)
    with wh.transaction(w) as con:
        gate_store.append_contexts(con, PENDING, [gate_store.StoredContext(g, ctx.subject, ctx.stay, ctx.hour)])
    with runner.results_context(runs):
        res = patient_deletion_flow.with_options(task_runner=runner.make_task_runner(None, 2))(
            warehouse=str(w), runs_dir=str(runs), settings=DeletionSettings(max_contexts=5, batch_contexts=2),
            progress=False)
    m = res["metrics"]
    assert (m["contexts_attempted"], m["gates_persisted"]) == (5, m["contexts_completed"])
    con = duckdb.connect(str(w), read_only=True)
    studies = dict(con.execute("SELECT study, count(*) FROM gate_states GROUP BY study").fetchall())
    con.close()
    assert studies == {STUDY: m["contexts_completed"]}  # published; nothing pending
    con = duckdb.connect(str(w), read_only=True)
    cid = con.execute("SELECT min(context_id) FROM gate_states").fetchone()[0]
    assert gate_store.load_gate(con, cid).n > 0  # MAC re-made under the published name
    con.close()
    # the same figures as a serial computation over the same deterministic sample
    groups = pdel.plan_contexts(wh.stays(w), 5, seed=0, contexts=5)
    targets = np.random.default_rng([0, 1]).integers(0, 5, size=len(groups))
    rows = _rows(w, groups, targets)
    assert m["decay_leakage_mean"]["gamma_0.1"] == pytest.approx(np.mean([r["leak_g0p1"] for r in rows]), rel=1e-9)
    assert m["gap_to_refit"]["exact"]["score_max"] < 1e-9 < m["gap_to_refit"]["naive"]["score_median"]
    stored = json.loads((runs / STUDY / "result.json").read_text())
    assert stored["seed_figure"] == {} and "not comparable" in stored["notes"]  # synthetic run, real-data seed
    assert stored["metrics"]["power"]["low_power"]


def test_state_outputs_match_the_gate_score_and_the_kernel_readout():
    from evaluation.audit_metrics import gate_scores
    from evaluation.studies.readout import kernel_readout_reference
    from sv_core import rbf_kernel

    rng = np.random.default_rng(0)
    X, P = rng.normal(size=(7, 3)), rng.normal(size=(5, 3))
    a = rng.random(7)
    s, o = pdel.state_outputs(rbf_kernel(P, X, 1.5), X, a, 0.3)
    assert np.allclose(s, gate_scores(X, a, 0.3, P, 1.5), rtol=1e-13, atol=1e-15)
    assert np.allclose(o, kernel_readout_reference(P, X, a, X, 1.5), rtol=1e-13, atol=1e-15)


def test_without_the_refit_check_every_other_figure_is_the_same_and_the_refit_columns_are_empty(base_wh):
    group = pdel.plan_contexts(wh.stays(base_wh), 5, seed=0)[1]
    full = pdel.context_row(pdel.forget_patient(_context(base_wh, group), 3))
    lean = pdel.context_row(pdel.forget_patient(_context(base_wh, group), 3, refit_check=False))
    refit_cols = set(pdel.refit_columns())
    assert set(full) == set(lean) and refit_cols <= set(full)
    assert all(lean[k] is None for k in refit_cols) and all(full[k] is not None for k in refit_cols)
    assert full["refit_checked"] is True and lean["refit_checked"] is False
    same = sorted(set(full) - refit_cols - {"refit_checked"})
    assert "kkt_residual" in same and "leak_g0p1" in same
    assert {k: lean[k] for k in same} == {k: full[k] for k in same}  # bit for bit


def test_gap_figures_are_over_the_refit_sample_and_say_so(base_wh):
    import pyarrow as pa

    groups = pdel.plan_contexts(wh.stays(base_wh), 5, seed=0, contexts=4)
    rows = [pdel.context_row(pdel.forget_patient(_context(base_wh, g), 1, refit_check=i < 2))
            for i, g in enumerate(groups)]
    con = duckdb.connect()
    con.register("t_rows", pa.Table.from_pylist(rows))
    con.execute("CREATE TABLE t AS SELECT * FROM t_rows")
    m = pres.aggregate(con, "t", attempted=4)
    assert (m["contexts_completed"], m["refit_contexts"]) == (4, 2)
    sampled = [r for r in rows if r["refit_checked"]]
    assert m["gap_to_refit"]["naive"]["score_median"] == pytest.approx(
        np.median([r["gap_score_naive"] for r in sampled]), rel=1e-12)
    assert m["partition_match_fraction"] == pytest.approx(np.mean([r["partition_match"] for r in sampled]))
    assert m["kkt_residual_max"] == pytest.approx(max(r["kkt_residual"] for r in rows), rel=1e-12)  # every context
    res = pres.study_result(m, data="synthetic", seed_comparable=False)
    assert "the refit sample: 2 of 4 completed contexts" in res["tables"][0]["title"]
    assert "the refit sample: 2 of 4" in res["metrics"]["headline"] and "2 of 4" in res["claims"][0]["statement"]
    every = pres.study_result({**m, "refit_contexts": 4}, data="synthetic", seed_comparable=False)
    assert "refit sample" not in every["tables"][0]["title"]  # every context refit: the title as before


def test_flow_refits_a_deterministic_sample_and_rejects_a_bad_size(prefect_harness, base_wh, tmp_path):
    from pipelines.errors import SettingsError
    from pipelines.flows.clinical_deletion import patient_deletion_flow
    from pipelines.runtime import runner
    from pipelines.settings import DeletionSettings

    runs = tmp_path / "runs"
    runs.mkdir()
    w = runs / "warehouse.duckdb"
    shutil.copy(base_wh, w)
    tr = runner.make_task_runner(None, 2)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(SettingsError, match="refit_sample must be"):
            DeletionSettings(max_contexts=3, refit_sample=bad)
    with runner.results_context(runs):
        res = patient_deletion_flow.with_options(task_runner=tr)(
            warehouse=str(w), runs_dir=str(runs), progress=False,
            settings=DeletionSettings(max_contexts=5, batch_contexts=2, refit_sample=3, persist_gates=False))
    m = res["metrics"]
    assert res["config"]["refit_sample"]["contexts"] == 3 and m["refit_contexts"] <= 3
    # the sample is the first contexts of the seeded shuffle: the same gaps as those contexts alone
    groups = pdel.plan_contexts(wh.stays(w), 5, seed=0, contexts=5)
    targets = np.random.default_rng([0, 1]).integers(0, 5, size=len(groups))
    rows = [pdel.forget_patient(_context(w, g), int(t), refit_check=i < 3)
            for i, (g, t) in enumerate(zip(groups, targets))]
    assert m["refit_contexts"] == sum(r["refit_checked"] for r in rows)
    assert m["gap_to_refit"]["exact"]["score_max"] == pytest.approx(
        max(r["gap_score_exact"] for r in rows if r["refit_checked"]), rel=1e-9, abs=1e-16)
    assert m["leakage_before_mean"] == pytest.approx(np.mean([r["leakage_before"] for r in rows]), rel=1e-9)
