"""The MEDS-DEV path with ACES labels (issue 35): the shipped ACES task of the study's composite
event (docs/meds_aces_deterioration_6h.yaml) labels exactly as the study's observed-only labels;
on the real MIMIC-IV demo, a task this test writes, extracted by es-aces, then every
``docs/meds_dev/*/model.yaml`` run as MEDS-DEV runs it (a ``set -e`` bash script per command,
placeholders substituted, ``split=held_out``), scored by ``meds-evaluation-cli``; under ``-m slow``
the same on a generated MEDS dataset of 10,000 stays, with wall time and peak memory printed.

es-aces needs polars < 2 and this project runs polars 2, so ACES lives in an environment of its
own: set ``FORGETFUL_ACES_CLI`` to its ``aces-cli`` (or put one on the PATH); without it these
tests skip.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from test_meds_dev import ENTRIES, check_entry, task  # noqa: F401  (task: the module fixture)

from cohort.build import build_warehouse
from cohort.constants import VITALS
from cohort.errors import DemoDataMissing
from cohort.meds_export import export_meds

ROOT = Path(__file__).resolve().parents[1]
HOUR_US = 3_600_000_000

#: the test's own task (not shipped): admitted to ICU, still there 24 h later, will a measured hourly
#: heart rate exceed 100 /min during the next 24 h? Predicted at 24 h.
TACHYCARDIA_TASK = """
predicates:
  icu_admission:
    code: {regex: "^ICU_ADMISSION//"}
  icu_discharge:
    code: {regex: "^ICU_DISCHARGE//"}
  tachycardia: {code: "HOURLY_MEAN//HR//bpm", value_min: 100, value_min_inclusive: false}
trigger: icu_admission
windows:
  first_day:
    start: trigger
    end: start + 24h
    start_inclusive: true
    end_inclusive: true
    has:
      icu_discharge: (None, 0)
    index_timestamp: end
  next_day:
    start: first_day.end
    end: start + 24h
    start_inclusive: false
    end_inclusive: true
    has:
      icu_discharge: (None, 0)
    label: tachycardia
"""


def aces_cli() -> str:
    cli = os.environ.get("FORGETFUL_ACES_CLI") or shutil.which("aces-cli")
    if not cli or not Path(cli).is_file():
        pytest.skip("set FORGETFUL_ACES_CLI to the aces-cli of an environment with es-aces (needs polars < 2)")
    return cli


def run_aces(config: str, dataset: Path, out: Path, name: str = "task") -> Path:
    """Labels of the ACES ``config`` (YAML text) on the MEDS ``dataset``: ``out/name/<shard>.parquet``."""
    cli = aces_cli()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.yaml").write_text(config)
    shards = ",".join(str(f.relative_to(dataset / "data"))[: -len(".parquet")]
                      for f in sorted((dataset / "data").rglob("*.parquet")))
    r = subprocess.run([cli, f"cohort_dir={out}", f"cohort_name={name}", "data=sharded", "data.standard=meds",
                        f"data.root={dataset / 'data'}", f"data.shard={shards}", "-m"],
                       capture_output=True, text=True, timeout=3600, cwd=out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / name


# ------------------------------------------------------------------------------ the shipped task
def study_observed_labels(warehouse: Path) -> pl.DataFrame:
    """The deterioration study's observed-only labels (evaluation.clinical.deterioration) of every
    scored hour of every split, keyed by (subject, end of the hour as the export stamps it)."""
    from evaluation.clinical import deterioration_reader as rd

    con = duckdb.connect(str(warehouse), read_only=True)
    stays = con.execute("SELECT stay_id, subject_id, intime, outtime, split FROM cohort_stays").fetchall()
    con.close()
    by_split = {sp: sorted(s for s in stays if s[4] == sp) for sp in ("train", "val", "test")}
    rows = []
    for sp, ss in by_split.items():
        for (_, sid, intime, outtime, _), f in zip(ss, rd.stay_features(warehouse, sp, label="observed")):
            for t in np.flatnonzero(f.m):
                stamp = min(intime + np.timedelta64(int(t + 1) * HOUR_US - 1, "us").item(), outtime)
                rows.append((sid, stamp, bool(f.y[t]), bool(f.x[t, len(VITALS):].any())))
    return pl.DataFrame(rows, schema={"subject_id": pl.Int64, "prediction_time": pl.Datetime("us"),
                                      "study": pl.Boolean, "observed": pl.Boolean}, orient="row")


def test_the_shipped_deterioration_task_labels_as_the_study_does(task, tmp_path):  # noqa: F811
    """Every ACES row of docs/meds_aces_deterioration_6h.yaml is a scored hour of the study with the
    study's observed-only label; and it asks at nearly every scored hour with a measured vital
    (not at the last one when the stay's final hour is partial)."""
    cfg = (ROOT / "docs" / "meds_aces_deterioration_6h.yaml").read_text()
    labels = pl.read_parquet(run_aces(cfg, task / "meds", tmp_path) / "**" / "*.parquet")
    want = study_observed_labels(task / "wh.duckdb")
    j = labels.join(want, on=["subject_id", "prediction_time"], how="left")
    assert j["study"].null_count() == 0, "an ACES prediction time that the study does not score"
    assert (j["boolean_value"] == j["study"]).all()
    asked = want.filter("observed").height
    print(f"\nACES deterioration task: {labels.height} prediction times ({asked} scored hours with a measured vital), "
          f"prevalence {labels['boolean_value'].mean():.3f}, all labels equal the study's")
    assert labels.height >= 0.95 * asked and labels["boolean_value"].n_unique() == 2


# ------------------------------------------------------------------------------ the demo, end to end
@pytest.mark.demo
def test_demo_aces_labels_then_every_entry_as_meds_dev_runs_it(tmp_path):
    aces_cli()
    try:
        s = build_warehouse("demo", None, tmp_path / "demo.duckdb", progress=False, memory_limit="1GB")
    except DemoDataMissing as exc:
        pytest.skip(f"the MIMIC-IV demo is not fetched ({str(exc).splitlines()[0][:120]})")
    export_meds(str(s.warehouse), tmp_path / "meds")
    labels = run_aces(TACHYCARDIA_TASK, tmp_path / "meds", tmp_path / "aces")
    for entry in ENTRIES:
        r = check_entry(entry, tmp_path / "meds", labels, tmp_path / "runs", shell=True, demo=True)
        scored = _meds_evaluation_cli(tmp_path / "runs" / entry / "predict" / "predictions.parquet", tmp_path)
        print(f"\ndemo, {entry}: {r['rows']} held-out rows, AUROC {r['auroc']:.3f} (meds-evaluation-cli: "
              f"{scored:.3f}), train + predict {r['seconds']:.0f} s")


def _meds_evaluation_cli(predictions: Path, tmp: Path) -> float:
    """The held-out AUROC as ``meds-evaluation-cli`` writes it."""
    cli = Path(sys.executable).parent / "meds-evaluation-cli"
    if not cli.is_file():
        pytest.skip("meds-evaluation-cli not installed: pip install 'forgetful-attention[meds-dev]'")
    out = tmp / f"eval_{predictions.parent.parent.name}.json"
    r = subprocess.run([str(cli), f"predictions_path={predictions}", f"output_file={out}"], capture_output=True,
                       text=True, timeout=600, cwd=tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    return float(json.loads(out.read_text())["samples_equally_weighted"]["roc_auc_score"])


# ------------------------------------------------------------------------------ at 10,000 stays
@pytest.mark.slow
def test_ten_thousand_stays_aces_labels_then_every_entry(tmp_path):
    """A generated MIMIC-IV root of 10,300 stays of at least 48 h (vital rows only; at least 10,000
    enter the cohort), built, exported as MEDS, labelled by ACES, then every entry as MEDS-DEV runs it
    (not in demo mode). Prints each entry's wall time and the peak RSS of the largest command process."""
    from cohort.synthetic import generate

    aces_cli()
    t0 = time.perf_counter()
    generate(tmp_path / "mimic", stays=10_300, seed=0, fmt="parquet", short_stay_share=0.0, non_vital=False)
    b = build_warehouse("mimic", tmp_path / "mimic", tmp_path / "wh.duckdb", progress=False, memory_limit="2GB")
    out = export_meds(str(b.warehouse), tmp_path / "meds")
    assert out["stays"] >= 10_000, out
    labels = run_aces(TACHYCARDIA_TASK, tmp_path / "meds", tmp_path / "aces")
    n = pl.read_parquet(labels / "**" / "*.parquet").height
    print(f"\n{out['stays']:,} stays, {out['rows']:,} MEDS events, {n:,} ACES label rows; data ready in "
          f"{time.perf_counter() - t0:.0f} s")
    for entry in ENTRIES:
        r = check_entry(entry, tmp_path / "meds", labels, tmp_path / "runs", shell=True, demo=False)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"{entry}: {r['rows']:,} held-out rows, AUROC {r['auroc']:.3f}, train + predict {r['seconds']:.0f} s "
              f"wall, peak RSS of the largest command so far {peak:.0f} MB")
