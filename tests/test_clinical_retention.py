"""The streaming retention flow: per-stay values and gates in the warehouse, staged then promoted,
a deterministic stay sample, erasure by forget, and a crash that leaves the old state whole."""
from __future__ import annotations

import os
import shutil

import duckdb
import numpy as np
import pytest

from cohort.synthetic import make_small_warehouse
from pipelines.runtime import runner
from pipelines.store import gate_store, stay_results


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_small_warehouse(tmp_path_factory.mktemp("ret") / "src", stays=40, seed=0)


@pytest.fixture
def site(base, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    w = runs / "warehouse.duckdb"
    shutil.copy(base, w)
    return str(w), str(runs)


def _run(flow_obj, runs, warehouse, **kw):
    from pipelines.settings import RetentionSettings

    kw = {"n_boot": 200, "stays_per_task": 5, "audit_stays": 3, "sensitivity_stays": 4, **kw}
    settings = RetentionSettings(heldout=flow_obj.name == "heldout-spo2", **kw)
    with runner.results_context(runs):
        return flow_obj.with_options(task_runner=runner.make_task_runner(None, 2))(
            warehouse=warehouse, runs_dir=runs, settings=settings, progress=False)


def _studies(w):
    con = duckdb.connect(w, read_only=True)
    try:
        return dict(con.execute("SELECT study, count(*) FROM gate_states GROUP BY study").fetchall())
    finally:
        con.close()


def test_streamed_values_and_gates_land_in_the_warehouse(prefect_harness, site):
    from dashboards.schema import validate_result
    from evaluation.clinical.sampling import sample_stays
    from pipelines.flows.clinical_retention import retention_flow
    from pipelines.store import warehouse as wh

    w, runs = site
    res = _run(retention_flow, runs, warehouse=w, stays=12)
    validate_result(res)
    m = res["metrics"]
    n_elig = len(wh.stays(w))
    assert m["n_stays"] == 12 and m["n_stays_eligible"] == n_elig > 12
    assert res["config"]["sample"] == f"12 of {n_elig} eligible stays, seeded hash order (seed 0)"
    con = duckdb.connect(w, read_only=True)
    cols = stay_results.read(con, "icu_retention")
    con.close()
    want = sample_stays([s[0] for s in wh.stays(w)], 12, seed=0)
    assert np.array_equal(cols["stay_id"], want)  # the sample, as stored per stay
    inc = cols["included"] == 1.0
    assert int(inc.sum()) == m["n_stays_included"] == m["gates_persisted"]
    assert np.nanmean(cols["ret_sv"]) == pytest.approx(m["retention"]["sv"], abs=1e-12)
    assert np.isnan(cols["ret_sv"][~inc]).all()
    assert _studies(w) == {"icu_retention": m["gates_persisted"]}  # nothing left under the staging name
    con = duckdb.connect(w, read_only=True)
    assert gate_store.unauthentic_contexts(con) == {}  # promoted contexts carry MACs for their final name
    stays = {int(r[0]) for r in con.execute("SELECT DISTINCT stay_id FROM gate_tokens").fetchall()}
    g = gate_store.load_gate(con, int(con.execute("SELECT min(context_id) FROM gate_states").fetchone()[0]))
    con.close()
    assert stays == set(cols["stay_id"][inc].tolist()) and g.gated
    assert m["solve"]["kkt_max"] < 1e-9 and m["refit_audit"]["stays_audited"] == 3
    assert m["sensitivity"]["stays"] == 4 and len(res["tables"][-1]["rows"]) == 16
    assert m["low_power"] is True and m["low_power_reason"].startswith("low power:")
    # a rerun on the same sample replaces, never appends
    again = _run(retention_flow, runs, warehouse=w, stays=12)
    assert again["metrics"]["retention"] == m["retention"] and _studies(w) == {"icu_retention": m["gates_persisted"]}


def test_a_crash_while_staging_leaves_the_previous_gates_and_values(prefect_harness, site, monkeypatch):
    from pipelines.flows.clinical_retention import retention_flow

    w, runs = site
    first = _run(retention_flow, runs, warehouse=w, stays=10)
    con = duckdb.connect(w, read_only=True)
    before = con.execute("SELECT context_id, state_mac FROM gate_states ORDER BY context_id").fetchall()
    vals = stay_results.read(con, "icu_retention")
    con.close()
    real, calls = gate_store.append_contexts, []

    def dying(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")  # the second staged batch
        return real(*a, **k)
    monkeypatch.setattr(gate_store, "append_contexts", dying)
    monkeypatch.setattr(stay_results, "GROUP_BYTES", 1)  # every chunk's batch its own transaction
    with pytest.raises(OSError):
        _run(retention_flow, runs, warehouse=w, stays=20)
    monkeypatch.undo()
    con = duckdb.connect(w, read_only=True)
    after = con.execute("SELECT context_id, state_mac FROM gate_states WHERE study = 'icu_retention' "
                        "ORDER BY context_id").fetchall()
    staged = con.execute("SELECT count(*) FROM gate_states WHERE study = 'icu_retention.staging'").fetchone()[0]
    assert after == before and staged > 0  # the study untouched; the committed staging batch is ...
    assert gate_store.unauthentic_contexts(con) == {}  # ... authentic (a forget meanwhile decrements it)
    kept = stay_results.read(con, "icu_retention")
    con.close()
    assert np.array_equal(kept["stay_id"], vals["stay_id"]) and np.array_equal(kept["ret_sv"], vals["ret_sv"],
                                                                               equal_nan=True)
    res = _run(retention_flow, runs, warehouse=w, stays=20)  # resumes from the task cache, clears the staging
    assert _studies(w) == {"icu_retention": res["metrics"]["gates_persisted"]}
    assert res["metrics"]["n_stays"] == 20 and first["metrics"]["n_stays"] == 10


def test_a_missing_cache_entry_is_recomputed_while_persisting(prefect_harness, site, monkeypatch):
    import pipelines.flows.clinical_retention as flow_mod
    from pipelines.flows import retention_chunks

    w, runs = site
    ref = _run(flow_mod.retention_flow, runs, warehouse=w, stays=8, audit_stays=0, sensitivity_stays=0)
    con = duckdb.connect(w, read_only=True)
    blobs = con.execute("SELECT state_npz FROM gate_states ORDER BY context_id").fetchall()
    con.close()
    monkeypatch.setattr(retention_chunks.retention_batch_full, "lookup", lambda *a, **k: (False, None))
    res = _run(flow_mod.retention_flow, runs, warehouse=w, stays=8, audit_stays=0, sensitivity_stays=0)
    con = duckdb.connect(w, read_only=True)
    again = con.execute("SELECT state_npz FROM gate_states ORDER BY context_id").fetchall()
    assert gate_store.unauthentic_contexts(con) == {}
    con.close()
    assert res["metrics"]["gates_persisted"] == ref["metrics"]["gates_persisted"] == len(again)
    assert [bytes(b[0]) for b in again] == [bytes(b[0]) for b in blobs]  # the same gates, recomputed


def test_forget_erases_the_patients_per_stay_values(prefect_harness, site):
    from pipelines.flows.clinical_retention import heldout_flow
    from pipelines.store import warehouse as wh
    from pipelines.store.forget import forget_subject

    w, runs = site
    res = _run(heldout_flow, runs, warehouse=w, sensitivity_stays=0, audit_stays=0)
    assert res["metrics"]["gates_persisted"] == 0 and "refit_audit" not in res["metrics"]
    assert not any(t["title"].startswith("sensitivity") for t in res["tables"])
    con = duckdb.connect(w, read_only=True)
    cols = stay_results.read(con, "heldout_spo2")
    con.close()
    n_elig = len(wh.stays(w))
    assert cols["stay_id"].size == n_elig and set(cols["d"].tolist()) == {5.0}
    target = int(cols["subject_id"][0])
    forget_subject(w, subject_id=target)
    con = duckdb.connect(w, read_only=True)
    left = stay_results.read(con, "heldout_spo2")
    n_target = con.execute("SELECT count(*) FROM stay_results WHERE subject_id = ?", [target]).fetchone()[0]
    con.close()
    assert n_target == 0 and 0 < left["stay_id"].size < n_elig


def test_stays_argument_is_checked(prefect_harness, site):
    from pipelines.errors import SettingsError
    from pipelines.flows.clinical_retention import heldout_flow

    w, runs = site
    with pytest.raises(SettingsError, match="stays must be at least 1, got 0"):
        _run(heldout_flow, runs, warehouse=w, stays=0)


def test_stay_results_table_round_trip(tmp_path):
    con = duckdb.connect(str(tmp_path / "x.duckdb"))
    cols = {"stay_id": np.array([3, 1, 2]), "subject_id": np.array([30, 10, 20]),
            "ret_sv": np.array([0.5, np.nan, 1.0]), "n": np.array([40, 50, 60])}
    assert stay_results.replace(con, "s", cols) == 3
    back = stay_results.read(con, "s")
    order = np.argsort(cols["stay_id"])
    assert back["stay_id"].tolist() == [1, 2, 3] and back["subject_id"].tolist() == [10, 20, 30]
    assert np.array_equal(back["ret_sv"], cols["ret_sv"][order], equal_nan=True)
    assert back["n"].tolist() == [50.0, 60.0, 40.0]
    stay_results.replace(con, "s", {k: v[:1] for k, v in cols.items()})  # replace, not append
    assert stay_results.read(con, "s")["stay_id"].tolist() == [3] and stay_results.read(con, "t") == {}
    from pipelines.errors import StudyInputError

    with pytest.raises(StudyInputError):
        stay_results.replace(con, "s", {"stay_id": np.array([1]), "subject_id": np.array([1]), "x": np.zeros(2)})
    con.close()


def test_vectorised_token_digest_equals_the_reference():
    rng = np.random.default_rng(0)
    tok, subj, stay, hour = (rng.integers(0, 50, 300) for _ in range(4))
    rows = list(zip(tok, subj, stay, hour))
    assert gate_store.token_digest_arrays(tok, subj, stay, hour) == gate_store.token_digest(rows)
    perm = rng.permutation(300)
    assert (gate_store.token_digest_arrays(tok[perm], subj[perm], stay[perm], hour[perm])
            == gate_store.token_digest(rows))


def test_one_blas_thread_also_limits_scipys_own_blas():
    """scipy.linalg (the kernel-leverage peer's dtrtri) brings its own OpenBLAS; the study's limit
    must cover it even when scipy.linalg is first used inside a task's limit nested in the flow's
    (a fresh interpreter, so no earlier test has loaded it)."""
    import subprocess
    import sys

    pytest.importorskip("threadpoolctl")
    code = (
        "import threadpoolctl\n"
        "from pipelines.runtime.scaleout import one_blas_thread\n"
        "with one_blas_thread():\n"
        "    with one_blas_thread():\n"
        "        from scipy.linalg.lapack import dtrtri\n"
        "    libs = [x for x in threadpoolctl.threadpool_info() if x['user_api'] == 'blas']\n"
        "    print(len(libs), max(x['num_threads'] for x in libs))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}).stdout.split()
    assert int(out[0]) >= 1 and out[1] == "1"


def test_staged_gate_batches_are_joined_up_to_a_byte_budget():
    """write_study commits the chunks' gate batches in groups of at most GROUP_BYTES of blobs, in order;
    a batch holding a gate not yet serialised (size unknown) is never joined."""
    from pipelines.store.gate_store import StagedState
    from pipelines.store.stay_results import grouped

    def st(nbytes, tag):
        z = np.zeros(1, dtype=np.int64)
        return StagedState(b"x" * nbytes, bytes(32), 0.1, 1.0, z + tag, z, z, z)

    batches = [[st(40, 0), st(30, 1)], [st(20, 2)], [st(50, 3)], [st(200, 4)], [st(10, 5)]]
    out = list(grouped(batches, limit=100))
    assert [[int(x.ids[0]) for x in g] for g in out] == [[0, 1, 2], [3], [4], [5]]
    assert all(sum(len(x.blob) for x in g) <= 100 for g in out if len(g) > 1)
    unsized = [object()]
    mixed = list(grouped([[st(10, 0)], unsized, [st(10, 1)], [st(10, 2)]], limit=100))
    assert [len(g) for g in mixed] == [1, 1, 2] and mixed[1] is not unsized and mixed[1][0] is unsized[0]
