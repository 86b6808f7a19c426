"""The Prefect flows on a small synthetic warehouse (one ephemeral Prefect server for the module)."""
from __future__ import annotations

import json
import shutil

import duckdb
import pytest

from cohort.synthetic import make_small_warehouse
from pipelines.runtime import runner


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("flows")
    w = make_small_warehouse(root / "src", stays=40, seed=0)
    runs = root / "runs"
    runs.mkdir()
    dst = runs / "warehouse.duckdb"
    shutil.copy(w, dst)
    return str(dst), str(runs)


def _load(runs, study):
    return json.loads((runs_path(runs) / study / "result.json").read_text())


def runs_path(r):
    from pathlib import Path

    return Path(r)


def _run(flow_obj, runs, **kw):
    with runner.results_context(runs):
        return flow_obj.with_options(task_runner=runner.make_task_runner(None, 2))(**kw)


def test_retention_and_heldout_flows(prefect_harness, small, monkeypatch):
    from pipelines.flows.clinical_retention import heldout_flow, retention_flow

    w, runs = small
    from pipelines.settings import RetentionSettings

    ret = RetentionSettings(n_boot=300, stays_per_task=6)
    res = _run(retention_flow, runs, warehouse=w, runs_dir=runs, settings=ret, progress=False)
    m = res["metrics"]
    assert m["key_dim"] == 6 and m["n_stays_included"] >= 5
    assert all(0.0 <= v <= 1.0 for v in m["retention"].values())
    assert m["retention"]["sv"] > m["retention"]["density"]  # outlier-aware vs density
    assert 0.1 < m["mean_budget_fraction"] < 0.6
    assert m["gate_vs_solve_score_dev_max"] < 1e-6  # C&P gate = certified solve (scores; α may differ on duplicates)
    assert m["refit_audit"]["stays_audited"] >= 5 and m["refit_audit"]["score_dev_max"] < 1e-8  # the oracle agrees
    assert m["gates_persisted"] == m["n_stays_included"]
    stored = _load(runs, "icu_retention")
    assert stored["study"] == "icu_retention" and stored["metrics"]["retention"] == m["retention"]
    con = duckdb.connect(w, read_only=True)
    assert (con.execute("SELECT count(*) FROM gate_states WHERE study='icu_retention'").fetchone()[0]
            == m["gates_persisted"])
    con.close()
    # rerun resumes from the cache: the per-stay computation is not called again
    import pipelines.flows.retention_chunks as flow_mod

    def fail(*a, **k):
        raise AssertionError("cache miss")
    monkeypatch.setattr(flow_mod, "batch_results", fail)
    again = _run(retention_flow, runs, warehouse=w, runs_dir=runs, settings=ret, progress=False)
    assert again["metrics"]["retention"] == m["retention"]
    monkeypatch.undo()
    h = _run(heldout_flow, runs, warehouse=w, runs_dir=runs, settings=RetentionSettings(heldout=True, n_boot=300,
                                                                                         stays_per_task=6),
             progress=False)
    assert h["metrics"]["key_dim"] == 5 and h["metrics"]["label"] == "event_spo2"
    assert all(0.0 <= v <= 1.0 for v in h["metrics"]["retention"].values())


def test_patient_deletion_flow_and_forget(prefect_harness, small):
    from pipelines.flows.clinical_deletion import patient_deletion_flow

    w, runs = small
    res = _run(patient_deletion_flow, runs, warehouse=w, runs_dir=runs, progress=False)
    m = res["metrics"]
    assert m["contexts_completed"] >= 3
    assert m["leakage_after_max"] == 0.0
    assert m["decay_leakage_mean"]["gamma_0.1"] > m["decay_leakage_mean"]["gamma_0.01"] > 0.0
    assert m["kkt_residual_max"] < 1e-9 and m["refit_score_dev_max"] < 1e-8
    assert res["receipts"]["chain_verified"] is True
    # CLI: forget a patient from the stored contexts, then verify and list the receipts
    from pipelines.cli import main

    con = duckdb.connect(w, read_only=True)
    sid = con.execute("SELECT t.subject_id FROM gate_tokens t JOIN gate_states s USING (context_id) "
                      "WHERE s.study = 'patient_deletion' LIMIT 1").fetchone()[0]
    con.close()
    from pipelines.store.warehouse import cache_dir

    assert any(cache_dir(w).iterdir())  # the flow's per-context results are cached beside the warehouse
    assert main(["forget", "--subject-id", str(sid), "--warehouse", w]) == 0
    assert not cache_dir(w).exists()  # derived cache cleared
    assert main(["forget", "--subject-id", str(sid), "--warehouse", w]) == 3  # domain error: already forgotten
    assert main(["receipts", "verify", "--warehouse", w]) == 0
    assert main(["receipts", "list", "--warehouse", w]) == 0
    from pipelines.receipts.ledger import default_dir

    ledger_file = default_dir(w) / "receipts.jsonl"
    good = ledger_file.read_text()
    ledger_file.write_text(good.replace('"certified":true', '"certified":false', 1))
    assert main(["receipts", "verify", "--warehouse", w]) == 1
    from pipelines.errors import LedgerTamperedError
    from pipelines.store.warehouse import Warehouse

    with pytest.raises(LedgerTamperedError):  # a tampered registry stops every command
        with Warehouse.open(w):
            pass
    ledger_file.write_text(good)
    assert main(["receipts", "verify", "--warehouse", w]) == 0


def test_deterioration_and_audit_flows(prefect_harness, small):
    from pipelines.flows.audit_flow import audit_flow
    from pipelines.flows.clinical_deterioration import deterioration_flow

    w, runs = small
    from pipelines.settings import DeteriorationSettings

    res = _run(deterioration_flow, runs, warehouse=w, runs_dir=runs, progress=False,
               settings=DeteriorationSettings(seeds=1, max_epochs=2, n_boot=50,
                                              size={"hidden": 8, "d_model": 8, "heads": 1, "fista_iters": 10}))
    for mdl in ("lstm", "softmax", "sv_attention"):
        a = res["metrics"][mdl]["auroc_mean"]
        assert 0.0 <= a <= 1.0 and a != 0.5
        assert res["metrics"][mdl]["seeds"] == 1
    assert 0 < res["metrics"]["test_positives"] < res["metrics"]["test_hours"]
    au = _run(audit_flow, runs, warehouse=w, runs_dir=runs, trials=4, regimes=("gaussian", "icu_warehouse"),
              progress=False)
    icu = au["metrics"]["icu_warehouse"]
    assert icu["attempted"] == 4 and icu["completed"] == 4
    assert icu["score_dev_median"] < 1e-8 < icu["decay_median"]


def test_dask_runner_matches_threads(prefect_harness, small, tmp_path):
    from distributed import LocalCluster

    from pipelines.flows.clinical_retention import heldout_flow
    from pipelines.settings import RetentionSettings

    w, runs = small
    runs2 = str(tmp_path / "runs_dask")  # separate result cache: no cache hits
    held = RetentionSettings(heldout=True, n_boot=300, stays_per_task=6)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cl:
        with runner.results_context(runs2):
            r = heldout_flow.with_options(task_runner=runner.make_task_runner(cl.scheduler_address))(
                warehouse=w, runs_dir=runs2, settings=held, progress=False)
    ref = _run(heldout_flow, str(tmp_path / "runs_thr"), warehouse=w, runs_dir=str(tmp_path / "runs_thr"),
               settings=held, progress=False)
    assert r["metrics"]["retention"] == ref["metrics"]["retention"]
    from pipelines.store.warehouse import cache_dir

    assert any(cache_dir(w).iterdir())  # task results cached as authenticated JSON, never pickles
    assert not (tmp_path / "runs_dask" / ".prefect-results").exists()


def test_serve_builds_scheduled_deployments():
    from pipelines.flows.serve_cli import build_deployments, describe

    deps = build_deployments(cron="15 2 * * *", runs_dir="r")
    d = {x["name"]: x for x in describe(deps)}
    assert d["forgetful-run-all"]["cron"] == ["15 2 * * *"]
    assert d["forgetful-run-all"]["parameters"]["warehouse"] == "r/warehouse.duckdb"
    assert d["forgetful-retention"]["cron"] == []
    assert len(deps) == 6


def test_cli_help_lists_every_subcommand(capsys):
    from pipelines.cli import build_parser

    text = build_parser().format_help()
    for cmd in ("build-cohort", "retention", "heldout-spo2", "patient-deletion", "deterioration", "audit",
                "run-all", "forget", "receipts", "serve"):
        assert cmd in text
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["retention", "--help"])
    assert e.value.code == 0


def test_missing_warehouse_is_a_typed_error(tmp_path, capsys):
    from pipelines.cli import main

    assert main(["receipts", "verify", "--warehouse", str(tmp_path / "none.duckdb")]) == 3
    assert "WarehouseMissingError" in capsys.readouterr().err


def test_flow_heartbeats_off_on_a_private_server_kept_on_a_shared_one(tmp_path):
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # a command's private server
        assert runner.heartbeat_settings() == {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
        with runner.results_context(tmp_path):
            assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api", PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 60}):
        assert runner.heartbeat_settings() == {}
        with runner.results_context(tmp_path):
            assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() == 60  # the user's shared-server setting is kept
    assert runner.heartbeat_settings(shared=True) == {}
