"""MEDS v0.4 out and in (issue 23, items 1-3): ``forgetful export --format meds`` validated file by
file with the reference package ``meds`` (the ``meds`` extra), ``build-cohort --source meds``
reproducing every observed hourly value of the warehouse it came from (a tiny synthetic
warehouse always, the real MIMIC-IV demo when it is fetched), the MIMIC_IV_MEDS conventions read
exactly as the native MIMIC-IV files, and typed errors on malformed shards with the warehouse
unchanged.

Round-trip figures (count of observed values, worst absolute and relative difference) are
printed with ``-s``; the difference is MEDS's float32 ``numeric_value`` (relative 2⁻²⁴ at most).
"""
from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_cohort_build import materialise_mimic

from cohort.build import build_warehouse, content_hash, read_funnel
from cohort.constants import VITALS
from cohort.errors import (
    BadParameterError,
    ColumnTypeError,
    DemoDataMissing,
    EmptyCohortError,
    InputMissingError,
    MissingColumnsError,
    UnreadableInputError,
)
from cohort.meds import HOURLY_CODES, MEDS_SPLIT, default_code_map, load_code_map
from cohort.meds_export import ADMISSION_CODE, DISCHARGE_CODE, export_meds, observed_hourly
from cohort.synthetic import generate

F32_REL = 2.0 ** -24  # float32 rounding of a float64 value, relative
HOUR_US = 3_600_000_000


def _sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def _build(root, out: Path, source: str = "meds", **kw):
    return build_warehouse(source, root, out, progress=False, memory_limit="512MB", **kw)


@pytest.fixture(scope="module")
def syn(tmp_path_factory):
    """A tiny synthetic warehouse (30 generated stays) and its MEDS export (small shards)."""
    d = tmp_path_factory.mktemp("meds_syn")
    generate(d / "mimic", stays=30, seed=0, fmt="parquet")
    wh = d / "wh.duckdb"
    _build(d / "mimic", wh, "mimic")
    out = export_meds(str(wh), d / "meds", shard_subjects=4)
    return wh, d / "meds", out


def round_trip(a: Path, b: Path) -> dict:
    """Observed hourly values of warehouse ``a`` against ``b`` at (subject, intime, hour, vital)."""
    x, y = observed_hourly(str(a)), observed_hourly(str(b))
    key = ["subject_id", "intime", "hour", "vital"]
    j = x.join(y, on=key, how="full", coalesce=True, suffix="_back")
    missing = j.filter(pl.col("value").is_null() | pl.col("value_back").is_null()).height
    diff = (j["value"] - j["value_back"]).abs()
    rel = diff / j["value"].abs().clip(lower_bound=1e-300)
    return {"count": x.height, "count_back": y.height, "unmatched": missing, "worst_abs": float(diff.max() or 0.0),
            "worst_rel": float(rel.max() or 0.0)}


def validate_with_meds(root: Path) -> int:
    """Every file of a MEDS export against the reference schemas; returns the number of files."""
    meds = pytest.importorskip("meds", reason="the reference package: pip install 'forgetful-attention[meds]'")
    assert meds.__version__.startswith("0.4"), meds.__version__
    n = 0
    for f in sorted((root / "data").rglob("*.parquet")):
        meds.DataSchema.validate(pq.read_table(f))
        n += 1
    meds.CodeMetadataSchema.validate(pq.read_table(root / meds.code_metadata_filepath))
    meds.SubjectSplitSchema.validate(pq.read_table(root / meds.subject_splits_filepath))
    meds.DatasetMetadataSchema.validate(json.loads((root / meds.dataset_metadata_filepath).read_text()))
    return n + 3


# ------------------------------------------------------------------------------ export
def test_export_validates_with_the_reference_package_and_holds_only_observed_values(syn):
    wh, root, out = syn
    n_files = validate_with_meds(root)
    print(f"\nsynthetic export: {n_files} files valid with meds, {out['rows']} events, {out['shards']} shards")
    con = duckdb.connect(str(wh), read_only=True)
    stays = {r[0]: r[1:] for r in con.execute(
        "SELECT stay_id, subject_id, hadm_id, intime, outtime, n_hours, split FROM cohort_stays").fetchall()}
    n_obs = con.execute("SELECT " + " + ".join(f"count(*) FILTER (WHERE {v}_observed)" for v in VITALS)
                        + " FROM vitals_hourly").fetchall()[0][0]
    n_unobs = con.execute("SELECT " + " + ".join(f"count(*) FILTER (WHERE NOT {v}_observed)" for v in VITALS)
                          + " FROM vitals_hourly").fetchall()[0][0]
    con.close()
    assert n_unobs > 0  # the warehouse holds filled hours the export must leave out
    data = [pq.read_table(f) for f in sorted((root / "data").rglob("*.parquet"))]
    ev = pl.concat([pl.from_arrow(t) for t in data])
    assert out["observed_values"] == n_obs == ev.filter(pl.col("code").str.starts_with("HOURLY_MEAN//")).height
    assert out["stays"] == len(stays) and out["subjects"] == len({s[0] for s in stays.values()})
    # every subject in exactly one shard, contiguous and sorted by time; each shard within one split
    splits = pl.from_arrow(pq.read_table(root / "metadata" / "subject_splits.parquet"))
    split_of = dict(zip(splits["subject_id"].to_list(), splits["split"].to_list()))
    seen = set()
    for f, t in zip(sorted((root / "data").rglob("*.parquet")), data):
        sub = t.column("subject_id").to_numpy()
        assert (np.diff(sub) >= 0).all() and not (set(sub.tolist()) & seen)
        seen |= set(sub.tolist())
        assert {split_of[s] for s in sub.tolist()} <= {f.parent.name}
        for s in set(sub.tolist()):
            times = t.filter(pa.compute.equal(t.column("subject_id"), s)).column("time").to_numpy()
            assert (np.diff(times.astype("int64")) >= 0).all()
    assert seen == set(split_of)
    assert {split_of[s] for s, *_ in stays.values()} <= set(MEDS_SPLIT.values())
    assert all(split_of[v[0]] == MEDS_SPLIT[v[5]] for v in stays.values())
    # stay boundaries and the hour of every vital event
    for sid, (subj, hadm, intime, outtime, n_hours, _) in stays.items():
        e = ev.filter(pl.col("icustay_id") == sid)
        assert e.filter(pl.col("code") == ADMISSION_CODE)["time"].to_list() == [intime]
        assert e.filter(pl.col("code") == DISCHARGE_CODE)["time"].to_list() == [outtime]
        assert set(e["subject_id"]) == {subj} and set(e["hadm_id"]) == {hadm}
        t = e.filter(pl.col("code").str.starts_with("HOURLY_MEAN//"))["time"]
        h = (t - intime).dt.total_microseconds() // HOUR_US
        assert (t <= outtime).all() and h.min() >= 0 and h.max() <= n_hours - 1
    # every code is described; the pinned itemids are the parent codes
    codes = pl.from_arrow(pq.read_table(root / "metadata" / "codes.parquet"))
    assert set(ev["code"]) <= set(codes["code"])
    parents = dict(zip(codes["code"].to_list(), codes["parent_codes"].to_list()))
    assert parents[HOURLY_CODES["spo2"]] == ["LAB//220277//%"]
    assert parents[HOURLY_CODES["temp_c"]] == ["LAB//223762//°C", "LAB//223761//°F"]
    assert parents[HOURLY_CODES["sbp"]] == ["LAB//220050//mmHg", "LAB//220179//mmHg"]
    meta = json.loads((root / "metadata" / "dataset.json").read_text())
    assert meta["etl_name"] == "forgetful" and meta["meds_version"].startswith("0.4")
    assert meta["raw_source_id_columns"] == ["hadm_id", "icustay_id"]
    # owner-only files and folders
    for p in root.rglob("*"):
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p


def test_synthetic_round_trip_reproduces_every_observed_hourly_value(syn, tmp_path):
    wh, root, _ = syn
    back = tmp_path / "back.duckdb"
    s = _build(root, back)
    r = round_trip(wh, back)
    print(f"\nsynthetic MEDS round trip: {r['count']} observed hourly values, worst |Δ| {r['worst_abs']:.3g}, "
          f"worst relative {r['worst_rel']:.3g} (float32 numeric_value)")
    assert r["count"] == r["count_back"] > 0 and r["unmatched"] == 0
    assert r["worst_rel"] <= F32_REL
    # same stays, ids, times, hours and splits; the same funnel steps
    cols = "stay_id, subject_id, hadm_id, intime, outtime, n_hours, split"
    a = duckdb.connect(str(wh), read_only=True).execute(f"SELECT {cols} FROM cohort_stays ORDER BY 1").fetchall()
    b = duckdb.connect(str(back), read_only=True).execute(f"SELECT {cols} FROM cohort_stays ORDER BY 1").fetchall()
    assert a == b and s.n_rows == sum(x[5] for x in a)
    assert [f[0] for f in read_funnel(str(back))] == [f[0] for f in read_funnel(str(wh))]


def test_export_of_one_split_and_bad_parameters(syn, tmp_path):
    wh, _, _ = syn
    out = export_meds(str(wh), tmp_path / "train", split="train")
    splits = pq.read_table(tmp_path / "train" / "metadata" / "subject_splits.parquet")
    assert set(splits.column("split").to_pylist()) == {"train"} and out["subjects"] == splits.num_rows
    assert [p.name for p in (tmp_path / "train" / "data").iterdir()] == ["train"]
    before = sorted(str(p) for p in (tmp_path / "train").rglob("*"))
    with pytest.raises(BadParameterError, match="already holds"):
        export_meds(str(wh), tmp_path / "train")
    assert sorted(str(p) for p in (tmp_path / "train").rglob("*")) == before
    with pytest.raises(BadParameterError, match="split"):
        export_meds(str(wh), tmp_path / "x", split="tuning")
    with pytest.raises(InputMissingError):
        export_meds(str(tmp_path / "none.duckdb"), tmp_path / "y")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.demo
def test_demo_round_trip(tmp_path):
    """The real MIMIC-IV demo: export, build back, every observed hourly value at the same
    (subject, ICU admission time, hour)."""
    try:
        s = build_warehouse("demo", None, tmp_path / "demo.duckdb", progress=False, memory_limit="1GB")
    except DemoDataMissing as exc:
        pytest.skip(f"the MIMIC-IV demo is not fetched ({str(exc).splitlines()[0][:120]})")
    out = export_meds(str(s.warehouse), tmp_path / "meds")
    n_files = validate_with_meds(tmp_path / "meds")
    _build(tmp_path / "meds", tmp_path / "back.duckdb")
    r = round_trip(s.warehouse, tmp_path / "back.duckdb")
    print(f"\ndemo MEDS export: {out['subjects']} subjects, {out['stays']} stays, {out['rows']} events, "
          f"{n_files} files valid with meds; round trip: {r['count']} observed hourly values, "
          f"worst |Δ| {r['worst_abs']:.3g}, worst relative {r['worst_rel']:.3g}")
    assert r["count"] == r["count_back"] > 1000 and r["unmatched"] == 0 and r["worst_rel"] <= F32_REL


# ------------------------------------------------------------------------------ MIMIC_IV_MEDS input
def mimic_to_meds(mimic: Path, out: Path, value_type: str = "FLOAT") -> Path:
    """The MIMIC fixture as the MIMIC-IV ETL of the MEDS project lays it out (its event config:
    ``ICU_ADMISSION//<first_careunit>``, ``ICU_DISCHARGE//<last_careunit>``,
    ``LAB//<itemid>//<valueuom or UNK>`` with ``hadm_id`` and ``icustay_id``, ``MEDS_BIRTH``,
    ``GENDER//<g>``), two shards."""
    (out / "data").mkdir(parents=True)
    (out / "metadata").mkdir()
    con = duckdb.connect()
    def r(t: str) -> str:
        types = ", types={'value': 'VARCHAR'}" if t.endswith("chartevents") else ""
        return f"read_csv('{mimic / t}.csv', header=true{types})"
    sql = f"""
        SELECT CAST(subject_id AS BIGINT) AS subject_id, CAST(time AS TIMESTAMP) AS time, code,
               CAST(numeric_value AS {value_type}) AS numeric_value, text_value,
               CAST(hadm_id AS BIGINT) AS hadm_id, CAST(icustay_id AS BIGINT) AS icustay_id FROM (
          SELECT subject_id, NULL AS time, 'GENDER//' || gender AS code, NULL AS numeric_value, NULL AS text_value,
                 NULL AS hadm_id, NULL AS icustay_id FROM {r('hosp/patients')}
          UNION ALL SELECT subject_id, make_timestamp(anchor_year - anchor_age, 1, 1, 0, 0, 0), 'MEDS_BIRTH', NULL,
                 NULL, NULL, NULL FROM {r('hosp/patients')}
          UNION ALL SELECT subject_id, intime, 'ICU_ADMISSION//' || first_careunit, NULL, NULL, hadm_id, stay_id
                 FROM {r('icu/icustays')}
          UNION ALL SELECT subject_id, outtime, 'ICU_DISCHARGE//' || last_careunit, NULL, NULL, hadm_id, stay_id
                 FROM {r('icu/icustays')}
          UNION ALL SELECT subject_id, charttime, 'LAB//' || itemid || '//' || coalesce(valueuom, 'UNK'), valuenum,
                 value, hadm_id, stay_id FROM {r('icu/chartevents')})
        ORDER BY subject_id, time NULLS FIRST"""
    t = con.sql(sql).to_arrow_table()
    con.close()
    sub = t.column("subject_id").to_numpy()
    cut = int(np.searchsorted(sub, np.median(sub)))
    pq.write_table(t.slice(0, cut), out / "data" / "0.parquet")
    pq.write_table(t.slice(cut), out / "data" / "1.parquet")
    return out


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    d = tmp_path_factory.mktemp("native")
    materialise_mimic(d / "mimic", "csv")
    _build(d / "mimic", d / "native.duckdb", "mimic")
    return d


def _hash(p: Path) -> str:
    con = duckdb.connect(str(p), read_only=True)
    try:
        return content_hash(con)
    finally:
        con.close()


def test_mimic_iv_meds_layout_builds_the_same_warehouse_as_the_native_files(native, tmp_path):
    """The hand-written MIMIC fixture (duplicates, °F, a °C row that is plainly °F, text values,
    rows outside the stay, an implausible value, short stays) as MIMIC_IV_MEDS would write it:
    with float64 values the warehouse is identical (content hash, funnel); with MEDS's float32
    every observed hourly value agrees to float32 rounding."""
    r64 = mimic_to_meds(native / "mimic", tmp_path / "m64", "DOUBLE")
    _build(r64, tmp_path / "m64.duckdb")
    assert _hash(tmp_path / "m64.duckdb") == _hash(native / "native.duckdb")
    assert read_funnel(str(tmp_path / "m64.duckdb")) == read_funnel(str(native / "native.duckdb"))
    r32 = mimic_to_meds(native / "mimic", tmp_path / "m32", "FLOAT")
    _build(r32, tmp_path / "m32.duckdb")
    r = round_trip(native / "native.duckdb", tmp_path / "m32.duckdb")
    assert r["unmatched"] == 0 and r["count"] > 0 and r["worst_rel"] < 1e-6
    # the hand-computed values of tests/test_cohort_build.py, read from MEDS: °F 100.4 with 37.0 °C -> 37.5
    con = duckdb.connect(str(tmp_path / "m64.duckdb"), read_only=True)
    got = con.execute("SELECT temp_c, sbp FROM vitals_hourly WHERE stay_id = 301 AND hour IN (2, 1) ORDER BY hour"
                      ).fetchall()
    con.close()
    assert got[0][1] == pytest.approx(127.5) and got[1][0] == pytest.approx(37.5)


def test_a_custom_code_map_reads_other_codes(native, tmp_path):
    root = mimic_to_meds(native / "mimic", tmp_path / "m", "DOUBLE")
    for f in (root / "data").glob("*.parquet"):  # rename: heart rate as a site's own code, stays as "ICU_IN/OUT"
        t = pl.from_arrow(pq.read_table(f)).with_columns(
            pl.col("code").str.replace(r"^LAB//220045//.*$", "SITE//HR").str.replace("^ICU_ADMISSION", "ICU_IN")
            .str.replace("^ICU_DISCHARGE", "ICU_OUT"))
        pq.write_table(t.to_arrow(), f)
    spec = {"vitals": {**default_code_map().to_json()["vitals"], "SITE//HR": "hr"},
            "icu_admission": "ICU_IN", "icu_discharge": "ICU_OUT"}
    (tmp_path / "codes.json").write_text(json.dumps(spec))
    _build(root, tmp_path / "w.duckdb", meds_codes=tmp_path / "codes.json")
    assert _hash(tmp_path / "w.duckdb") == _hash(native / "native.duckdb")
    params = json.loads(duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True).execute(
        "SELECT value FROM build_info WHERE key = 'params'").fetchall()[0][0])
    assert params["meds_codes"] == load_code_map(spec).digest()
    with pytest.raises(EmptyCohortError):  # the default map finds no ICU stay in these codes
        _build(root, tmp_path / "w2.duckdb")


@pytest.mark.parametrize("spec,needle", [
    ({"vitals": {"X": "pulse"}}, "not one of"),
    ({"vitals": {"X": {"vital": "hr", "source": "arterial"}}}, "source"),
    ({"vitals": {"X": {"vital": "sbp", "source": "cuff"}}}, "source"),
    ({"vitals": {"X": {"vital": "hr", "fahrenheit": True}}}, "fahrenheit"),
    ({"vitals": {"A*B": "hr"}}, "'*'"),
    ({"vitals": {}}, "non-empty"),
    ({"vitals": {"X": "hr"}, "stay": "x"}, "unknown key"),
    ({"vitals": {"X": "hr"}, "stay_column": ""}, "non-empty"),
])
def test_bad_code_maps_are_one_typed_line(spec, needle):
    with pytest.raises(BadParameterError, match=None) as ei:
        load_code_map(spec)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


# ------------------------------------------------------------------------------ malformed shards
def _tamper(kind: str, root: Path) -> None:
    shard = sorted((root / "data").rglob("*.parquet"))[0]
    t = pq.read_table(shard)
    if kind == "not parquet":
        shard.write_bytes(b"PAR1 this is not a parquet file")
    elif kind == "stray file":
        (root / "data" / "notes.csv").write_text("subject_id,time\n")
    elif kind == "missing column":
        pq.write_table(t.drop(["code"]), shard)
    elif kind == "missing stay column":
        pq.write_table(t.drop(["icustay_id"]), shard)
    elif kind == "time as text":
        pq.write_table(t.set_column(t.column_names.index("time"), "time", pa.compute.cast(t.column("time"),
                                                                                          pa.string())), shard)
    elif kind == "subject as text":
        pq.write_table(t.set_column(0, "subject_id", pa.compute.cast(t.column("subject_id"), pa.string())), shard)
    elif kind == "empty data":
        for f in (root / "data").rglob("*.parquet"):
            f.unlink()
    elif kind == "no data folder":
        import shutil

        shutil.rmtree(root / "data")


@pytest.mark.parametrize("kind,err", [
    ("not parquet", UnreadableInputError), ("stray file", UnreadableInputError),
    ("missing column", MissingColumnsError), ("missing stay column", MissingColumnsError),
    ("time as text", ColumnTypeError), ("subject as text", ColumnTypeError),
    ("empty data", InputMissingError), ("no data folder", InputMissingError),
])
def test_malformed_shards_are_typed_errors_and_leave_the_warehouse_unchanged(syn, tmp_path, kind, err):
    import shutil

    from pipelines import preflight

    wh, root, _ = syn
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    target = tmp_path / "w" / "warehouse.duckdb"
    _build(root, target)
    before = _sha(target)
    _tamper(kind, bad)
    with pytest.raises(err) as ei:
        _build(bad, target)
    msg = str(ei.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert _sha(target) == before and sorted(p.name for p in target.parent.iterdir()) == ["warehouse.duckdb"]
    # the CLI's preflight says the same in one line, exit 3, before Prefect starts
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        rc = preflight.run("build-cohort", ["--source", "meds", "--root", str(bad)])
    lines = buf.getvalue().strip().splitlines()
    assert rc == 3 and len(lines) == 1 and lines[0].startswith(f"error: {err.__name__}: "), lines


def test_preflight_usage_of_meds_options(syn, tmp_path, capsys):
    from pipelines import preflight

    _, root, _ = syn
    assert preflight.run("build-cohort", ["--source", "meds"]) == 2
    assert "needs --root" in capsys.readouterr().err
    assert preflight.run("run-all", ["--source", "meds"]) == 2
    capsys.readouterr()
    assert preflight.run("build-cohort", ["--source", "mimic", "--root", "x", "--meds-codes", "c.json"]) == 2
    assert "--meds-codes applies only" in capsys.readouterr().err
    (tmp_path / "c.json").write_text("{not json")
    assert preflight.run("build-cohort", ["--source", "meds", "--root", str(root),
                                          "--meds-codes", str(tmp_path / "c.json")]) == 3
    assert capsys.readouterr().err.startswith("error: BadParameterError: --meds-codes")
    assert preflight.run("build-cohort", ["--source", "meds", "--root", str(root)]) is None
    assert preflight.run("run-all", ["--source", "meds", "--root", str(root)]) is None


# ------------------------------------------------------------------------------ forget registry
class _Exclusion:
    """A forget registry as :func:`cohort.build.exclude_stays` reads it (subjects and stays)."""

    def __init__(self, subjects, stays):
        self.s, self.t = set(subjects), set(stays)

    def __call__(self, ids):
        return np.array([int(i) in self.s for i in ids], dtype=bool)

    def stays(self, ids):
        return np.array([int(i) in self.t for i in ids], dtype=bool)


def test_forget_registry_excludes_subjects_and_stays_relabelled_to_another_subject(syn, tmp_path):
    wh, root, _ = syn
    con = duckdb.connect(str(wh), read_only=True)
    (s1, st1), (s2, st2), (s3, _) = con.execute(
        "SELECT subject_id, min(stay_id) FROM cohort_stays GROUP BY 1 ORDER BY 1 LIMIT 3").fetchall()
    con.close()
    import shutil

    shutil.copytree(root, tmp_path / "m")
    for f in (tmp_path / "m" / "data").rglob("*.parquet"):  # a later extract lists stay st2 under subject s3
        t = pl.from_arrow(pq.read_table(f))
        t = t.with_columns(pl.when(pl.col("icustay_id") == st2).then(pl.lit(s3, pl.Int64))
                           .otherwise(pl.col("subject_id")).alias("subject_id"))
        pq.write_table(t.sort("subject_id", "time", maintain_order=True).to_arrow().cast(pq.read_table(f).schema), f)
    _build(tmp_path / "m", tmp_path / "control.duckdb", exclude_subjects=_Exclusion({s1}, set()))
    con = duckdb.connect(str(tmp_path / "control.duckdb"), read_only=True)
    assert con.execute("SELECT subject_id FROM cohort_stays WHERE stay_id = ?", [st2]).fetchall() == [(s3,)]
    con.close()
    s = _build(tmp_path / "m", tmp_path / "w.duckdb", exclude_subjects=_Exclusion({s1}, {st2}))
    con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    kept = {r[0] for r in con.execute("SELECT stay_id FROM cohort_stays").fetchall()}
    subjects = {r[0] for r in con.execute("SELECT subject_id FROM cohort_stays").fetchall()}
    con.close()
    assert st1 not in kept and st2 not in kept and s1 not in subjects
    assert "not_in_forget_registry" in [f[0] for f in s.funnel]


def test_a_measurement_whose_subject_disagrees_with_its_stay_is_not_attached(syn, tmp_path):
    wh, root, _ = syn
    import shutil

    shutil.copytree(root, tmp_path / "m")
    f = sorted((tmp_path / "m" / "data").rglob("*.parquet"))[0]
    t = pl.from_arrow(pq.read_table(f))
    first = t.filter(pl.col("code").str.starts_with("HOURLY_MEAN//")).row(0, named=True)
    moved = t.with_columns(pl.when((pl.col("time") == first["time"]) & (pl.col("code") == first["code"])
                                   & (pl.col("icustay_id") == first["icustay_id"]))
                           .then(pl.lit(first["subject_id"] + 10**9, pl.Int64)).otherwise(pl.col("subject_id"))
                           .alias("subject_id"))
    pq.write_table(moved.to_arrow().cast(pq.read_table(f).schema), f)
    _build(tmp_path / "m", tmp_path / "w.duckdb")
    r = round_trip(wh, tmp_path / "w.duckdb")
    assert r["count"] - r["count_back"] == 1 and r["unmatched"] == 1



# ------------------------------------------------------------------------------ ACES
def test_aces_extracts_the_spo2_below_90_event_from_the_export(syn, tmp_path):
    """ACES (es-aces) on the export with docs/meds_aces_spo2_48h.yaml labels every ICU admission
    exactly as the warehouse says: an observed hourly SpO2 mean < 90 in hours 0-47. es-aces needs
    polars < 2, so it lives in its own environment: set FORGETFUL_ACES_CLI to its ``aces-cli``."""
    import os
    import subprocess

    cli = os.environ.get("FORGETFUL_ACES_CLI")
    if not cli or not Path(cli).is_file():
        pytest.skip("set FORGETFUL_ACES_CLI to the aces-cli of an environment with es-aces (needs polars < 2)")
    wh, root, _ = syn
    cfg = Path(__file__).resolve().parents[1] / "docs" / "meds_aces_spo2_48h.yaml"
    (tmp_path / "task.yaml").write_text(cfg.read_text())
    shards = ",".join(str(f.relative_to(root / "data"))[: -len(".parquet")]
                      for f in sorted((root / "data").rglob("*.parquet")))
    p = subprocess.run([cli, f"cohort_dir={tmp_path}", "cohort_name=task", "data=sharded", "data.standard=meds",
                        f"data.root={root / 'data'}", f"data.shard={shards}", "-m"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    labels = pl.concat([pl.read_parquet(f) for f in sorted((tmp_path / "task").rglob("*.parquet"))])
    con = duckdb.connect(str(wh), read_only=True)
    want = pl.from_arrow(con.sql(
        "SELECT s.subject_id, s.intime AS prediction_time, bool_or(h.spo2_observed AND h.spo2 < 90 AND h.hour < 48) "
        "AS want FROM cohort_stays s JOIN vitals_hourly h USING (stay_id) GROUP BY ALL").to_arrow_table())
    con.close()
    j = want.join(labels, on=["subject_id", "prediction_time"], how="full", coalesce=True)
    print(f"\nACES: {labels.height} ICU admissions labelled, {int(labels['boolean_value'].sum())} with SpO2 < 90 "
          f"in 48 h; {(j['want'] == j['boolean_value']).sum()} agree with the warehouse")
    assert labels.height == want.height and (j["want"] == j["boolean_value"]).all()


def test_the_documented_code_map_is_the_default():
    from cohort.meds import markdown_code_map

    doc = (Path(__file__).resolve().parents[1] / "docs" / "MEDS.md").read_text()
    table = doc.split("<!-- code-map:begin -->\n", 1)[1].split("\n<!-- code-map:end -->", 1)[0]
    assert table == markdown_code_map()


def test_the_report_badge_of_a_meds_build_follows_the_exports_dataset_name(tmp_path):
    from pipelines.flows.clinical_cohort import data_kind_of

    (tmp_path / "metadata").mkdir()
    meta = tmp_path / "metadata" / "dataset.json"
    for name, etl, kind in [("forgetful synthetic cohort", "forgetful", "synthetic"),
                            ("forgetful demo cohort", "forgetful", "demo"),
                            ("forgetful demo cohort", "MIMIC_IV_MEDS", "mimic"),  # another ETL's claim: user data
                            ("MIMIC-IV", "MIMIC_IV_MEDS", "mimic")]:
        meta.write_text(json.dumps({"dataset_name": name, "etl_name": etl}))
        assert data_kind_of("meds", str(tmp_path)) == kind, (name, etl)
    meta.write_text("not json")
    assert data_kind_of("meds", str(tmp_path)) == "mimic"
