"""The MEDS-DEV entries (issue 35, items 1, 2 and 5): every ``docs/meds_dev/*/model.yaml`` run as
MEDS-DEV runs it (placeholders substituted, train then predict with ``split=held_out``) on a MEDS
export of a small generated warehouse and a task this test writes (the observed-only composite
event in the next 6 h, asked every 6 hours); the predictions pass meds-evaluation's
``PredictionSchema``, cover exactly the held-out label rows in order, are not constant, repeat
exactly for a seed, and do not change on a copy of the dataset from which every event after each
row's prediction time is deleted. Missing extras and bad inputs are one typed line.

The same on the real MIMIC-IV demo with labels from ACES: tests/test_meds_dev_demo.py.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cohort.build import build_warehouse
from cohort.meds_export import export_meds
from cohort.meds_streams import hourly_streams, read_labels, split_subjects
from cohort.synthetic import generate
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = sorted(p.parent.name for p in (ROOT / "docs" / "meds_dev").glob("*/model.yaml"))
PLACEHOLDERS = {"dataset_dir", "labels_dir", "output_dir", "split", "demo"}
HOUR_US = 3_600_000_000


# ------------------------------------------------------------------------------ the dataset and a task
def observed_event_labels(warehouse: Path) -> pl.DataFrame:
    """The test's own task: at the end of every 6th stay-hour with 6 hours left, will a vital measured
    in the next 6 hours cross a SPEC §2 threshold? (observed values only)."""
    con = duckdb.connect(str(warehouse), read_only=True)
    ev = " OR ".join(["(hr_observed AND (hr < 40 OR hr > 130))", "(sbp_observed AND (sbp < 90 OR sbp > 200))",
                      "(rr_observed AND (rr < 6 OR rr > 30))", "(spo2_observed AND spo2 < 90)",
                      "(temp_c_observed AND (temp_c < 35 OR temp_c > 38.5))"])
    df = pl.from_arrow(con.sql(f"""
        WITH h AS (SELECT stay_id, hour, {ev} AS e, count(*) OVER (PARTITION BY stay_id) AS n FROM vitals_hourly)
        SELECT s.subject_id,
               least(s.intime + to_microseconds((a.hour + 1) * CAST({HOUR_US} AS BIGINT) - 1), s.outtime)
                   AS prediction_time,
               bool_or(b.e) AS boolean_value
        FROM h a JOIN h b ON a.stay_id = b.stay_id AND b.hour BETWEEN a.hour + 1 AND a.hour + 6
        JOIN cohort_stays s ON s.stay_id = a.stay_id
        WHERE a.hour % 6 = 5 AND a.hour + 6 < a.n
        GROUP BY s.subject_id, s.stay_id, s.intime, s.outtime, a.hour
        ORDER BY s.subject_id, prediction_time""").to_arrow_table())
    con.close()
    return df.with_columns(pl.col("prediction_time").cast(pl.Datetime("us")))


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A 60-stay generated warehouse exported as MEDS, and the test's labels (ACES's layout: one
    Parquet file per split folder)."""
    d = tmp_path_factory.mktemp("meds_dev")
    generate(d / "mimic", stays=60, seed=0, fmt="parquet")
    build_warehouse("mimic", d / "mimic", d / "wh.duckdb", progress=False, memory_limit="512MB")
    export_meds(str(d / "wh.duckdb"), d / "meds", shard_subjects=8)
    lab = observed_event_labels(d / "wh.duckdb")
    for split in ("train", "tuning", "held_out"):
        (d / "labels" / split).mkdir(parents=True)
        lab.filter(pl.col("subject_id").is_in(split_subjects(d / "meds", split).tolist())).write_parquet(
            d / "labels" / split / "0.parquet")
    return d


def run_entry(entry: str, dataset: Path, labels: Path, out: Path, split: str = "held_out", demo: bool = True,
              shell: bool = False) -> Path:
    """Run ``docs/meds_dev/<entry>/model.yaml`` as MEDS-DEV's full mode does: ``{output_dir}`` is
    ``out/train`` for train and ``out/predict`` for predict, each folder made first. ``shell``: as
    MEDS-DEV runs it, the substituted text as a ``set -e`` bash script ``cmd.sh`` in the output
    folder, with this interpreter's ``forgetful`` on the PATH; else each command in this process."""
    spec = yaml.safe_load((ROOT / "docs" / "meds_dev" / entry / "model.yaml").read_text())
    for stage in ("train", "predict"):
        text = spec["commands"]["supervised"][stage].format(dataset_dir=dataset, labels_dir=labels,
                                                           output_dir=out / stage, split=split, demo=demo)
        argv = shlex.split(text)
        assert argv[:3] == ["forgetful", "meds-dev", stage], text
        (out / stage).mkdir(parents=True, exist_ok=True)
        if not shell:
            assert main(argv[1:]) == 0, text
            continue
        script = out / stage / "cmd.sh"
        script.write_text("#!/bin/bash\nset -e\n" + text + "\n")
        env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=3600)
        assert r.returncode == 0, (text, r.stderr[-3000:])
    return out / "predict" / "predictions.parquet"


def deletion_copy(dataset: Path, labels: pl.DataFrame, out: Path) -> tuple[Path, Path, pl.DataFrame]:
    """A copy of ``dataset`` in which row i of ``labels`` belongs to a subject of its own holding
    only its subject's events at or before its prediction time: every later event deleted, for
    every row at once. Returns (dataset, labels folder, the copy's labels in the same row order)."""
    events = pl.concat([pl.read_parquet(f) for f in sorted((dataset / "data").rglob("*.parquet"))])
    base = int(events["subject_id"].max()) + 1
    rows = labels.with_row_index("i").with_columns((pl.col("i").cast(pl.Int64) + base).alias("new_id"))
    kept = (events.join(rows.select("subject_id", "prediction_time", "new_id"), on="subject_id")
            .filter(pl.col("time") <= pl.col("prediction_time"))
            .with_columns(pl.col("new_id").alias("subject_id")).drop("prediction_time", "new_id")
            .sort("subject_id", "time"))
    (out / "data" / "held_out").mkdir(parents=True)
    (out / "metadata").mkdir()
    kept.write_parquet(out / "data" / "held_out" / "0.parquet")
    pl.DataFrame({"subject_id": rows["new_id"], "split": ["held_out"] * rows.height}).write_parquet(
        out / "metadata" / "subject_splits.parquet")
    new = rows.select(pl.col("new_id").alias("subject_id"), "prediction_time", "boolean_value")
    (out / "labels").mkdir()
    new.write_parquet(out / "labels" / "0.parquet")
    return out, out / "labels", new


# ------------------------------------------------------------------------------ the entries
def test_every_entry_has_the_meds_dev_files_and_only_its_placeholders():
    assert ENTRIES == ["gru", "lightgbm", "lstm", "softmax", "sv_attention"]
    import string

    for e in ENTRIES:
        folder = ROOT / "docs" / "meds_dev" / e
        spec = yaml.safe_load((folder / "model.yaml").read_text())
        md = spec["metadata"]
        assert md["description"].strip() and md["links"] and md["contacts"][0]["name"], e
        for stage in ("train", "predict"):
            names = {f for _, f, _, _ in string.Formatter().parse(spec["commands"]["supervised"][stage]) if f}
            assert names <= PLACEHOLDERS and "output_dir" in names and "dataset_dir" in names, (e, stage, names)
        assert "{split}" in spec["commands"]["supervised"]["predict"]
        req = (folder / "requirements.txt").read_text()
        extra = "lightgbm" if e == "lightgbm" else "models"
        assert f"forgetful-attention[{extra}]" in req.splitlines(), e
        assert (folder / "README.md").read_text().startswith("# ") and "@" in (folder / "refs.bib").read_text()


def require_entry(entry: str):
    """Skip without meds-evaluation or the entry's extra; returns ``meds_evaluation.schema``."""
    mev = pytest.importorskip("meds_evaluation.schema", reason="meds-evaluation: pip install "
                              "'forgetful-attention[meds-dev]'")
    if entry == "lightgbm":
        pytest.importorskip("lightgbm", reason="pip install 'forgetful-attention[lightgbm]'")
    else:
        pytest.importorskip("torch", reason="pip install 'forgetful-attention[models]'")
    return mev


def check_entry(entry: str, dataset: Path, labels: Path, out: Path, shell: bool = False, demo: bool = True) -> dict:
    """The issue's "done when" for one entry: MEDS-DEV's run (:func:`run_entry`), predictions valid
    under meds-evaluation's ``PredictionSchema`` and scored by it, exactly the held-out label rows in
    order, not constant, owner-only; then the same trained model on the deletion copy gives identical
    probabilities for every row, and the copy did delete what a stream reaching 6 h past each
    prediction time would read. Returns the seconds of the run and the scores."""
    import time

    mev = require_entry(entry)
    t0 = time.perf_counter()
    pred_path = run_entry(entry, dataset, labels, out / entry, shell=shell, demo=demo)
    seconds = time.perf_counter() - t0
    pred = pq.read_table(pred_path)
    mev.PredictionSchema.align(pred)  # raises on a schema or content error
    assert pred.schema.field("predicted_boolean_probability").type == pa.float32()
    want = read_labels(labels, split_subjects(dataset, "held_out"))
    got = pl.from_arrow(pred)
    assert got.select("subject_id", "prediction_time", "boolean_value").equals(want)  # the rows, in order
    p = got["predicted_boolean_probability"].to_numpy()
    assert np.unique(p).size > 1 and np.all((p >= 0) & (p <= 1))
    assert np.array_equal(got["predicted_boolean_value"].to_numpy(), p >= 0.5)
    from meds_evaluation.evaluate import evaluate_binary_classification

    scores = evaluate_binary_classification(got)
    assert 0 <= scores["samples_equally_weighted"]["roc_auc_score"] <= 1
    assert (pred_path.stat().st_mode & 0o077) == 0  # record-level data: owner-only

    # no look-ahead: each row on a copy holding only the events up to its own prediction time
    data, copy_labels, rows = deletion_copy(dataset, want, out / f"{entry}_deleted")
    assert main(["meds-dev", "predict", "--model-dir", str(out / entry / "train"), "--dataset-dir", str(data),
                 "--labels-dir", str(copy_labels), "--output-dir", str(out / f"{entry}_deleted_pred"),
                 "--split", "held_out"]) == 0
    again = pl.read_parquet(out / f"{entry}_deleted_pred" / "predictions.parquet")
    assert again.height == got.height and np.array_equal(again["predicted_boolean_probability"].to_numpy(), p)
    ahead = want.with_columns(pl.col("prediction_time") + pl.duration(hours=6))
    ahead_copy = rows.with_columns(pl.col("prediction_time") + pl.duration(hours=6))
    a, b = hourly_streams(dataset, ahead), hourly_streams(data, ahead_copy)
    assert np.mean(np.isnan(a) != np.isnan(b)) > 0.01
    return {"seconds": seconds, "rows": got.height, "auroc": scores["samples_equally_weighted"]["roc_auc_score"]}


@pytest.mark.parametrize("entry", ENTRIES)
def test_entry_predicts_exactly_the_held_out_rows_valid_not_constant_and_without_look_ahead(task, tmp_path, entry):
    check_entry(entry, task / "meds", task / "labels", tmp_path)


def test_streams_end_at_each_prediction_time_and_equal_the_warehouse_hours(task):
    """Each stream's hour L−1−k holds the warehouse's observed hourly mean k hours before the
    prediction hour (float32 rounding), and nothing of a later hour."""
    lab = read_labels(task / "labels")
    raw = hourly_streams(task / "meds", lab, lookback=12)
    con = duckdb.connect(str(task / "wh.duckdb"), read_only=True)
    from cohort.constants import VITALS

    obs = pl.from_arrow(con.sql(
        "SELECT s.subject_id, s.intime, h.hour, " + ", ".join(f"CASE WHEN h.{v}_observed THEN h.{v} END AS {v}"
                                                          for v in VITALS)
        + f", least(s.intime + to_microseconds((h.hour + 1) * CAST({HOUR_US} AS BIGINT) - 1), s.outtime) AS t "
        "FROM vitals_hourly h JOIN cohort_stays s USING (stay_id)").to_arrow_table())
    con.close()
    checked = 0
    for i in range(0, lab.height, 7):
        sid, T = lab["subject_id"][i], lab["prediction_time"][i]
        mine = obs.filter((pl.col("subject_id") == sid) & (pl.col("t") <= T)
                          & (pl.col("t") > T - pl.duration(hours=12)))
        want = np.full((12, len(VITALS)), np.nan)
        for r in mine.iter_rows(named=True):
            k = int((T - r["t"]).total_seconds() // 3600)
            want[11 - k] = [np.nan if r[v] is None else r[v] for v in VITALS]
        np.testing.assert_allclose(raw[i], want, rtol=2.0 ** -23)
        checked += 1
    assert checked > 10


def _recode(dataset: Path, out: Path, codes: dict[str, str]) -> Path:
    """A copy of ``dataset`` whose event codes are renamed by ``codes`` (others kept)."""
    (out / "data").mkdir(parents=True)
    shutil.copytree(dataset / "metadata", out / "metadata")
    for f in sorted((dataset / "data").rglob("*.parquet")):
        dst = out / "data" / f.relative_to(dataset / "data")
        dst.parent.mkdir(parents=True, exist_ok=True)
        pl.read_parquet(f).with_columns(pl.col("code").replace(codes)).write_parquet(dst)
    return out


def test_mimic_iv_meds_codes_and_a_custom_code_map_read_the_same_streams(task, tmp_path):
    """The same values under MIMIC_IV_MEDS' chartevents codes (``LAB//<itemid>//<unit>``, read by the
    default map) and under site codes named by a ``--meds-codes`` map give the same streams."""
    from cohort.meds import HOURLY_CODES

    lab = read_labels(task / "labels")
    want = hourly_streams(task / "meds", lab)
    itemid = {"hr": 220045, "sbp": 220179, "dbp": 220180, "rr": 220210, "spo2": 220277, "temp_c": 223762}
    mimic = _recode(task / "meds", tmp_path / "mimic_meds",
                    {HOURLY_CODES[v]: f"LAB//{i}//{HOURLY_CODES[v].rsplit('//', 1)[1]}" for v, i in itemid.items()})
    np.testing.assert_array_equal(hourly_streams(mimic, lab), want)
    site = _recode(task / "meds", tmp_path / "site_meds", {c: f"SITE//{v.upper()}" for v, c in HOURLY_CODES.items()})
    assert np.isnan(hourly_streams(site, lab)).all()  # codes the default map does not read
    cmap = {"vitals": {f"SITE//{v.upper()}": ({"vital": v, "source": "non-invasive"} if v in ("sbp", "dbp") else v)
                       for v in HOURLY_CODES}}
    (tmp_path / "codes.json").write_text(json.dumps(cmap))
    np.testing.assert_array_equal(hourly_streams(site, lab, codes=tmp_path / "codes.json"), want)


def test_training_repeats_exactly_for_a_seed_and_differs_across_seeds(task, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("lightgbm")
    for model in ("gru", "lightgbm"):
        files = []
        for run, seed in (("a", 0), ("b", 0), ("c", 1)):
            out = tmp_path / model / run
            assert main(["meds-dev", "train", "--model", model, "--dataset-dir", str(task / "meds"), "--labels-dir",
                         str(task / "labels"), "--output-dir", str(out), "--seed", str(seed), "--max-epochs", "2"]) == 0
            weights = next(f for f in out.iterdir() if f.name != "model.json")
            files.append(weights.read_bytes())
        assert files[0] == files[1] and files[0] != files[2], model


# ------------------------------------------------------------------------------ bad input, missing extras
def _cli(args, env_extra=None, cwd=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def _blocker(tmp_path: Path, module: str) -> str:
    """A PYTHONPATH folder whose sitecustomize makes ``import <module>`` fail (an install without it)."""
    d = tmp_path / f"no_{module}"
    d.mkdir()
    (d / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r} or name.startswith({module + '.'!r}):\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, _Block())\n")
    return os.pathsep.join([str(d), str(ROOT)])


@pytest.mark.parametrize("model,module,extra", [("lightgbm", "lightgbm", "lightgbm"), ("gru", "torch", "models")])
def test_a_missing_extra_is_one_line_exit_3_and_writes_nothing(task, tmp_path, model, module, extra):
    out = tmp_path / "out"
    r = _cli(["meds-dev", "train", "--model", model, "--dataset-dir", str(task / "meds"), "--labels-dir",
              str(task / "labels"), "--output-dir", str(out)], {"PYTHONPATH": _blocker(tmp_path, module)})
    assert r.returncode == 3, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'forgetful-attention[{extra}]'" in lines[0], lines
    assert not out.exists()


def test_deterioration_without_lightgbm_names_the_extra_and_how_to_leave_it_out(tmp_path):
    w = tmp_path / "w.duckdb"
    w.write_bytes(b"")
    r = _cli(["deterioration", "--warehouse", str(w)], {"PYTHONPATH": _blocker(tmp_path, "lightgbm")})
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "forgetful-attention[lightgbm]" in r.stderr and "--models lstm gru softmax sv_attention" in r.stderr


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """``forgetful <argv>`` in this process (preflight included): exit code and stderr."""
    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_bad_inputs_are_typed_one_line_errors_and_leave_files_as_they_were(task, tmp_path, capsys):
    pytest.importorskip("lightgbm")
    base = ["--dataset-dir", str(task / "meds"), "--labels-dir", str(task / "labels")]
    out = tmp_path / "m"
    assert main(["meds-dev", "train", "--model", "lightgbm", *base, "--output-dir", str(out)]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    predict = ["meds-dev", "predict", "--model-dir", str(out), *base, "--output-dir", str(tmp_path / "p")]
    errors = []
    # a trained folder is not overwritten
    rc, err = _run(["meds-dev", "train", "--model", "lightgbm", *base, "--output-dir", str(out)], capsys)
    assert rc == 3 and "already holds a trained model" in err
    errors.append(err)
    # usage (exit 2): train without a model, predict without a split, an epoch cap below 1
    assert _run(["meds-dev", "train", *base, "--output-dir", str(tmp_path / "x")], capsys)[0] == 2
    assert _run(predict, capsys)[0] == 2 and not (tmp_path / "p").exists()
    assert _run(["meds-dev", "train", "--model", "lightgbm", *base, "--output-dir", str(tmp_path / "e"),
                 "--max-epochs", "0"], capsys)[0] == 2
    # labels without a label file, a missing dataset: refused by the preflight, nothing written
    (tmp_path / "empty").mkdir()
    for data, labels in ((task / "meds", tmp_path / "empty"), (tmp_path / "nope", task / "labels")):
        rc, err = _run(["meds-dev", "train", "--model", "lightgbm", "--dataset-dir", str(data), "--labels-dir",
                        str(labels), "--output-dir", str(tmp_path / "y")], capsys)
        assert rc == 3 and "InputMissingError" in err and not (tmp_path / "y").exists()
        errors.append(err)
    # a task with one class in train
    one = tmp_path / "one"
    one.mkdir()
    read_labels(task / "labels").with_columns(pl.lit(False).alias("boolean_value")).write_parquet(one / "0.parquet")
    rc, err = _run(["meds-dev", "train", "--model", "lightgbm", "--dataset-dir", str(task / "meds"), "--labels-dir",
                    str(one), "--output-dir", str(tmp_path / "z")], capsys)
    assert rc == 3 and "one class" in err and not (tmp_path / "z" / "model.json").exists()
    errors.append(err)
    # a split without label rows
    only_train = tmp_path / "train_labels"
    shutil.copytree(task / "labels" / "train", only_train)
    rc, err = _run(["meds-dev", "predict", "--model-dir", str(out), "--dataset-dir", str(task / "meds"),
                    "--labels-dir", str(only_train), "--output-dir", str(tmp_path / "p"), "--split", "held_out"],
                   capsys)
    assert rc == 3 and "no row of a held_out subject" in err
    errors.append(err)
    # broken model folders: changed weights, a model.json that is not one, missing weights
    meta = (out / "model.json").read_text()
    (out / "booster.txt").write_text(before["booster.txt"].decode() + "\n")
    for broken, needle in ((meta, "does not match"), ("[1, 2]", "lists no weights"), ("{not json", "not readable JSON"),
                           (meta.replace('"lightgbm"', '"nope"', 1), "no known model")):
        (out / "model.json").write_text(broken)
        if needle != "does not match":
            (out / "booster.txt").write_bytes(before["booster.txt"])
        rc, err = _run([*predict, "--split", "held_out"], capsys)
        assert rc == 3 and needle in err, err
        errors.append(err)
    (out / "model.json").write_text(meta)
    (out / "booster.txt").unlink()
    rc, err = _run([*predict, "--split", "held_out"], capsys)
    assert rc == 3 and "booster.txt is missing" in err
    errors.append(err)
    assert not (tmp_path / "p" / "predictions.parquet").exists()
    (out / "booster.txt").write_bytes(before["booster.txt"])
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    # each one line, and no subject id in any message
    subjects = {str(s) for s in read_labels(task / "labels")["subject_id"].unique().to_list()}
    for err in errors:
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
        assert not any(s in err for s in subjects), err
