"""The generator at scale (issue 20, item 4): the same bytes for any number of workers, the
MIMIC-IV layout of every table (itemids pinned as in mimic-code), non-vital rows in MIMIC-IV's
proportion that the build's scan reads and drops, the long-stay tail, and no half-written
output. (The physiology's fidelity: tests/test_cohort_fidelity.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from cohort.build import build_warehouse, read_funnel
from cohort.constants import ITEMIDS
from cohort.errors import BadParameterError
from cohort.synthetic import generate, main
from cohort.synthetic.items import (
    CATALOGUE,
    DEMO_VITAL_ROW_SHARE,
    NON_VITAL_ROWS_PER_ICU_HOUR,
    VENT_SHARE,
    ValueTable,
    fmt_number,
)
from cohort.synthetic.model import LOS_MAX_HOURS, Model, load_params

FILES = ("icu/chartevents", "icu/icustays", "icu/d_items", "hosp/patients", "hosp/admissions")
VITAL_IDS = sorted(ITEMIDS)

#: The MIMIC-IV v3.1 columns of every table the generator writes, with the types the build reads.
LAYOUT = {
    "icu/chartevents": [("subject_id", "int64"), ("hadm_id", "int64"), ("stay_id", "int64"),
                        ("caregiver_id", "int64"), ("charttime", "timestamp[us]"), ("storetime", "timestamp[us]"),
                        ("itemid", "int64"), ("value", "string"), ("valuenum", "double"), ("valueuom", "string"),
                        ("warning", "int64")],
    "icu/icustays": [("subject_id", "int64"), ("hadm_id", "int64"), ("stay_id", "int64"),
                     ("first_careunit", "string"), ("last_careunit", "string"), ("intime", "timestamp[us]"),
                     ("outtime", "timestamp[us]"), ("los", "double")],
    "icu/d_items": [("itemid", "int64"), ("label", "string"), ("abbreviation", "string"), ("linksto", "string"),
                    ("category", "string"), ("unitname", "string"), ("param_type", "string"),
                    ("lownormalvalue", "double"), ("highnormalvalue", "double")],
    "hosp/patients": [("subject_id", "int64"), ("gender", "string"), ("anchor_age", "int64"),
                      ("anchor_year", "int64"), ("anchor_year_group", "string"), ("dod", "date32[day]")],
    "hosp/admissions": [("subject_id", "int64"), ("hadm_id", "int64"), ("admittime", "timestamp[us]"),
                        ("dischtime", "timestamp[us]"), ("deathtime", "timestamp[us]"), ("admission_type", "string"),
                        ("hospital_expire_flag", "int64")],
}

#: Pinned d_items rows (mimic-code style): the nine vital itemids the build reads, and a sample
#: of the non-vital catalogue (label, unit) — real MIMIC-IV itemids.
PINNED = {
    220045: ("Heart Rate", "bpm"), 220050: ("Arterial Blood Pressure systolic", "mmHg"),
    220051: ("Arterial Blood Pressure diastolic", "mmHg"), 220179: ("Non Invasive Blood Pressure systolic", "mmHg"),
    220180: ("Non Invasive Blood Pressure diastolic", "mmHg"), 220210: ("Respiratory Rate", "insp/min"),
    220277: ("O2 saturation pulseoxymetry", "%"), 223761: ("Temperature Fahrenheit", "°F"),
    223762: ("Temperature Celsius", "°C"),
    220052: ("Arterial Blood Pressure mean", "mmHg"), 220181: ("Non Invasive Blood Pressure mean", "mmHg"),
    220739: ("GCS - Eye Opening", None), 223900: ("GCS - Verbal Response", None),
    223901: ("GCS - Motor Response", None), 223835: ("Inspired O2 Fraction", None),
    220339: ("PEEP set", "cmH2O"), 224684: ("Tidal Volume (set)", "mL"), 224687: ("Minute Volume", "L/min"),
    223849: ("Ventilator Mode", None), 223834: ("O2 Flow", "L/min"), 226732: ("O2 Delivery Device(s)", None),
    220048: ("Heart Rhythm", None), 220046: ("Heart rate Alarm - High", "bpm"),
    220224: ("Arterial O2 pressure", "mmHg"), 223830: ("PH (Arterial)", None),
}


def _q(sql: str):
    con = duckdb.connect()
    try:
        return con.execute(sql).fetchone()
    finally:
        con.close()


def _all(sql: str) -> list[tuple]:
    con = duckdb.connect()
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _files(root: Path, fmt: str) -> dict[str, bytes]:
    return {rel: (root / f"{rel}.{fmt}").read_bytes() for rel in FILES}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("scale")
    s = generate(d / "mimic", stays=120, seed=11, fmt="parquet", workers=1)
    return d / "mimic", s


def test_same_bytes_for_any_number_of_workers(tmp_path):
    """Parquet and csv.gz: the in-process path (the reference) and 2 or 3 worker processes
    write byte-identical files; another seed writes other data."""
    for fmt in ("parquet", "csv.gz"):
        out = {}
        for w in (1, 3) if fmt == "parquet" else (1, 2):
            s = generate(tmp_path / f"{fmt}{w}", stays=23, seed=4, fmt=fmt, workers=w, chunk_stays=5)
            assert s.workers == w and s.n_stays == 23
            out[w] = _files(tmp_path / f"{fmt}{w}", fmt)
        a, b = out.values()
        assert a == b, fmt
    generate(tmp_path / "other", stays=23, seed=5, fmt="parquet", workers=1, chunk_stays=5)
    other = pq.read_table(tmp_path / "other" / "icu" / "chartevents.parquet")
    assert not other.equals(pq.read_table(tmp_path / "parquet1" / "icu" / "chartevents.parquet"))


def test_rows_target_stops_at_the_first_sufficient_chunk(tmp_path):
    """--rows: whole chunks until the target is reached, the same for any number of workers."""
    a = generate(tmp_path / "a", target_rows=60_000, seed=2, fmt="parquet", workers=1, chunk_stays=4)
    b = generate(tmp_path / "b", target_rows=60_000, seed=2, fmt="parquet", workers=2, chunk_stays=4)
    assert a.n_chartevents == b.n_chartevents >= 60_000 and a.n_stays == b.n_stays and a.n_stays % 4 == 0
    assert _files(tmp_path / "a", "parquet") == _files(tmp_path / "b", "parquet")
    fewer = generate(tmp_path / "c", stays=a.n_stays - 4, seed=2, fmt="parquet", workers=1, chunk_stays=4)
    assert fewer.n_chartevents < 60_000  # one chunk less would not have been enough


def test_chunks_do_not_depend_on_the_stay_count(tmp_path):
    """A chunk's stays are a function of (seed, chunk): complete chunks are the same rows."""
    generate(tmp_path / "a", stays=13, seed=7, fmt="parquet", workers=1, chunk_stays=5)
    generate(tmp_path / "b", stays=22, seed=7, fmt="parquet", workers=1, chunk_stays=5)
    q = ("SELECT * FROM read_parquet('{}') WHERE stay_id < 30000010 "
         "ORDER BY stay_id, charttime, itemid, value, storetime")
    a = _all(q.format(tmp_path / "a" / "icu" / "chartevents.parquet"))
    b = _all(q.format(tmp_path / "b" / "icu" / "chartevents.parquet"))
    assert a and a == b


def test_every_table_has_the_mimic_layout(root, tmp_path):
    d, _ = root
    for rel, cols in LAYOUT.items():
        schema = pq.read_schema(d / f"{rel}.parquet")
        assert [(f.name, str(f.type)) for f in schema] == cols, rel
    # csv.gz: the same columns, read with the build's CSV types
    generate(tmp_path / "csv", stays=6, seed=11, fmt="csv.gz", workers=1)
    for rel, cols in LAYOUT.items():
        names = [r[0] for r in _all(
            f"DESCRIBE SELECT * FROM read_csv('{tmp_path / 'csv' / f'{rel}.csv.gz'}', header=true)")]
        assert names == [c for c, _ in cols], rel
    items = {r[0]: (r[1], r[5]) for r in _all(f"SELECT * FROM read_parquet('{d / 'icu' / 'd_items.parquet'}')")}
    for itemid, want in PINNED.items():
        assert items[itemid] == want, itemid
    for itemid, (_, _, unit) in ITEMIDS.items():  # the build's own table of vital units
        assert items[itemid][1] == unit
    charted = {r[0] for r in _all(f"SELECT DISTINCT itemid FROM read_parquet('{d / 'icu' / 'chartevents.parquet'}')")}
    assert charted <= set(items) and set(VITAL_IDS) <= charted and len(charted - set(VITAL_IDS)) >= 30


def test_non_vital_rows_in_mimic_proportion(root):
    """Vitals ≈ 11.5 % of rows (the demo's share; documented bounds 9–14 %), non-vital rows ≈ 46
    per ICU hour, ventilator items only in about a third of the stays, units from d_items."""
    d, s = root
    ce = f"read_parquet('{d / 'icu' / 'chartevents.parquet'}')"
    st = f"read_parquet('{d / 'icu' / 'icustays.parquet'}')"
    q = _q
    ids = ", ".join(map(str, VITAL_IDS))
    total, vital = q(f"SELECT count(*), count(*) FILTER (WHERE itemid IN ({ids})) FROM {ce}")
    assert total == s.n_chartevents and vital == s.n_vital_rows
    assert 0.09 <= vital / total <= 0.14
    assert abs(vital / total - DEMO_VITAL_ROW_SHARE) < 0.025
    hours = q(f"SELECT sum(epoch(outtime) - epoch(intime)) / 3600 FROM {st}")[0]
    per_hour = (total - vital) / hours
    assert 0.85 * NON_VITAL_ROWS_PER_ICU_HOUR <= per_hour <= 1.15 * NON_VITAL_ROWS_PER_ICU_HOUR
    vent = q(f"SELECT count(DISTINCT stay_id) FROM {ce} WHERE itemid = 223849")[0] / 120
    assert abs(vent - VENT_SHARE) < 0.15
    # non-vital rows lie inside their stay; valueuom is the item's unit (or null with text)
    outside = q(f"SELECT count(*) FROM {ce} c JOIN {st} s USING (stay_id) WHERE itemid NOT IN ({ids}) "
                "AND (c.charttime < s.intime OR c.charttime > s.outtime)")[0]
    assert outside == 0
    di = f"read_parquet('{d / 'icu' / 'd_items.parquet'}')"
    wrong_unit = q(f"SELECT count(*) FROM {ce} c JOIN {di} i USING (itemid) WHERE c.valuenum IS NOT NULL "
                   "AND c.valueuom IS DISTINCT FROM i.unitname")[0]
    assert wrong_unit == 0


def test_values_text_and_numbers_agree(root):
    """``value`` is the text of ``valuenum`` wherever a number was charted; text items carry text."""
    d, _ = root
    ce = f"read_parquet('{d / 'icu' / 'chartevents.parquet'}')"
    q = _q
    assert q(f"SELECT count(*) FROM {ce} WHERE value IS NULL")[0] == 0
    bad = q(f"SELECT count(*) FROM {ce} WHERE valuenum IS NOT NULL AND TRY_CAST(value AS DOUBLE) IS NOT NULL "
            "AND abs(TRY_CAST(value AS DOUBLE) - valuenum) > 1e-9")[0]
    assert bad == 0
    gcs = dict(_all(f"SELECT value, any_value(valuenum) FROM {ce} WHERE itemid = 223900 GROUP BY 1"))
    assert gcs.get("No Response-ETT") == 1.0 and gcs.get("Oriented") == 5.0
    assert q(f"SELECT count(*) FROM {ce} WHERE itemid = 223849 AND valuenum IS NOT NULL")[0] == 0
    assert q(f"SELECT count(*) FROM {ce} WHERE itemid = 223849")[0] > 0
    # the value dictionary against Python's float formatting (the slow reference)
    vt = ValueTable()
    strings = vt.strings.to_pylist()
    n_numbers = vt.off001 + 2_001  # the two number grids; then texts (GCS texts carry a valuenum too)
    for i in np.random.default_rng(0).integers(0, n_numbers, 500):
        assert float(strings[i]) == vt.valuenum[i] and strings[i] == fmt_number(vt.valuenum[i])
    assert all(np.isnan(vt.valuenum[vt.text_values]))
    idx, dictionary = vt.vital_index(np.array([72.0, 36.8, -3.0, 1234.5, 98.25]))
    assert [dictionary[int(i)].as_py() for i in idx] == ["72", "36.8", "-3", "1234.5", "98.25"]


def test_catalogue_uses_each_itemid_once_with_a_value_model():
    ids = [it.itemid for it in CATALOGUE]
    assert len(ids) == len(set(ids)) and not set(ids) & set(VITAL_IDS)
    for it in CATALOGUE:
        assert it.when in ("all", "vent", "art") and it.rate > 0 and it.values[0] in ("num", "cat")


def test_build_reads_the_root_with_the_expected_funnel(tmp_path):
    """The build scans every non-vital row and drops it: with or without them the warehouse is
    the same (content hash), and the funnel's counts equal those counted on the files."""
    whs = {}
    for nv in (True, False):
        s = generate(tmp_path / f"m{nv}", stays=60, seed=3, fmt="parquet", workers=1, non_vital=nv)
        whs[nv] = (s, build_warehouse("mimic", tmp_path / f"m{nv}", tmp_path / f"w{nv}.duckdb", seed=3,
                                      progress=False, memory_limit="512MB"))
    (s1, b1), (s0, b0) = whs[True], whs[False]
    assert s1.n_chartevents > 5 * s0.n_chartevents and s1.n_vital_rows == s0.n_vital_rows == s0.n_chartevents
    assert b1.content_hash == b0.content_hash
    funnel = {step: (n, rows) for step, n, rows in read_funnel(b1.warehouse)}
    assert funnel == {step: (n, rows) for step, n, rows in read_funnel(b0.warehouse)}
    d = tmp_path / "mTrue"
    st = f"read_parquet('{d / 'icu' / 'icustays.parquet'}')"
    ce = f"read_parquet('{d / 'icu' / 'chartevents.parquet'}')"
    n_long = _q(f"SELECT count(*) FROM {st} WHERE outtime - intime >= INTERVAL 48 HOURS")[0]
    ids = ", ".join(map(str, VITAL_IDS))
    stays_v, rows_v = _q(
        f"SELECT count(DISTINCT c.stay_id), count(*) FROM {ce} c JOIN {st} s USING (stay_id) "
        f"WHERE c.itemid IN ({ids}) AND s.outtime - s.intime >= INTERVAL 48 HOURS")
    assert funnel["icu_stays_in_source"][0] == 60 and funnel["los_ge_48h"][0] == n_long
    assert funnel["vital_rows"] == (stays_v, rows_v)


def test_long_stay_tail_reaches_ten_thousand_hours():
    """≈ 45 % of stays last ≥ 48 h (≈ 42,000 of MIMIC-IV's 94,458); beyond the last calibrated
    quantile a Pareto tail (alpha 2.3) reaches the 10,000-hour cut."""
    m = Model()
    los = m.los_hours(np.random.default_rng(0), 400_000)
    long = los[los >= 48]
    assert 0.42 <= long.size / los.size <= 0.49
    assert los.max() <= LOS_MAX_HOURS and long.max() > 3_000
    q_top = np.exp(m.los_long[-1])
    for x in (720.0, 2_000.0):  # P(L > x | long) = 0.05 (x / q_top)^-2.3
        want = 0.05 * (x / q_top) ** -m.los_tail_alpha
        assert abs((long > x).mean() / want - 1) < 0.15, x


def test_a_ten_thousand_hour_stay_is_generated_and_built(tmp_path):
    p = load_params()
    p["los"] = {**p["los"], "short_share": 0.0, "log_hours_long": [float(np.log(9_800))] * len(p["los"]["p"])}
    s = generate(tmp_path / "m", stays=2, seed=1, fmt="parquet", params=p, workers=1)
    assert s.n_chartevents > 2 * 9_800 * 20
    b = build_warehouse("mimic", tmp_path / "m", tmp_path / "w.duckdb", seed=1, progress=False, memory_limit="1GB")
    con = duckdb.connect(str(b.warehouse), read_only=True)
    hours = [r[0] for r in con.execute("SELECT count(*) FROM vitals_hourly GROUP BY stay_id").fetchall()]
    con.close()
    assert hours and all(9_700 <= h <= 9_801 for h in hours)


def test_bad_arguments_and_crashes_leave_files_as_they_were(tmp_path, monkeypatch):
    out = tmp_path / "m"
    generate(out, stays=4, seed=0, fmt="parquet", workers=1)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for kw in ({"workers": 0}, {"chunk_stays": 0}, {"stays": 0}, {"fmt": "csv"}, {"short_stay_share": 1.0}):
        args = {"stays": 4, "seed": 1, "fmt": "parquet", **kw}
        with pytest.raises(BadParameterError):
            generate(out, **args)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    import cohort.synthetic.gen as syn

    real = syn.chunk_table

    def boom(seed, chunk, *a, **k):
        if chunk == 2:
            raise RuntimeError("disk full")
        return real(seed, chunk, *a, **k)

    monkeypatch.setattr(syn, "chunk_table", boom)
    with pytest.raises(RuntimeError):
        generate(tmp_path / "x", stays=20, seed=0, fmt="parquet", workers=1, chunk_stays=4)
    assert not [p for p in (tmp_path / "x").rglob("*") if p.is_file()]  # no half-written chartevents
    monkeypatch.setattr(syn, "chunk_table", real)

    def late(*a, **k):  # the run fails after chartevents is complete, while writing the small tables
        raise OSError("disk full")

    monkeypatch.setattr(syn, "small_tables", late)
    with pytest.raises(OSError):
        generate(tmp_path / "y", stays=8, seed=0, fmt="csv.gz", workers=1, chunk_stays=4)
    assert not [p for p in (tmp_path / "y").rglob("*") if p.is_file()]


def test_cli_reports_speed_and_progress(tmp_path, capsys):
    rc = main(["--out", str(tmp_path / "x"), "--stays", "9", "--seed", "2", "--format", "parquet",
               "--workers", "2", "--chunk-stays", "3"])
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert rc == 0 and out["stays"] == 9 and out["workers"] == 2 and out["rows_per_s"] > 0
    assert "rows/s" in cap.err and out["peak_rss_mb"]["worker_max"] > 0
    man = json.loads((tmp_path / "x" / "synthetic_manifest.json").read_text())
    assert man["chunk_stays"] == 3 and man["non_vital"] is True and "workers" not in man
    assert main(["--out", str(tmp_path / "y"), "--stays", "3", "--workers", "0", "--quiet"]) == 2
