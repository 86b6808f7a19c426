"""Vital-sign conventions (cohort.conventions, docs/VITALS.md): both itemid/range tables pinned
literally, the mimic-code convention admitting rows the seed drops (and the reverse) on a
hand-made fixture, and default builds unchanged (content hashes pinned from the seed code).

Fixture: tests/fixtures/cohort/mimic_small plus six hand-made chartevents rows for stay 305
(intime 2150-03-01 08:00, 60 hours; see test_cohort_build for the original rows):
  hour 12  225309 ART BP Systolic 110, 225310 ART BP Diastolic 60   (mimic_code only)
  hour 18  224690 Respiratory Rate (Total) 18                        (mimic_code only)
  hour 20  220210 Respiratory Rate 75        seed keeps (≤ 80), mimic_code drops (≥ 70)
  hour 40  220045 Heart Rate 5               seed drops (< 10), mimic_code keeps (> 0)
  hour 42  223762 Temperature Celsius 99.0   seed: plainly °F → 37.22 °C; mimic_code drops (≥ 50)
Original rows that the conventions treat differently: 301's SpO₂ 29 (seed drops, mimic_code
keeps) and 301's 98.6 charted as °C (seed converts to 37.0, mimic_code drops).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest

from cohort import constants
from cohort._hourly import SLOTS
from cohort.build import build_warehouse, main, plausible_case_sql, read_funnel, value_sql
from cohort.conventions import (
    CONVENTIONS,
    ITEM_LABELS,
    MIMIC_CODE_CONVENTION,
    SEED_CONVENTION,
    Range,
    get_convention,
    markdown_table,
)
from cohort.errors import BadParameterError

FIX = Path(__file__).parent / "fixtures" / "cohort"
DOC = Path(__file__).parent.parent / "docs" / "VITALS.md"
F_TO_C = lambda f: (f - 32) * 5 / 9  # noqa: E731
A, N, D = constants.SRC_ARTERIAL, constants.SRC_NONINVASIVE, constants.SRC_DEFAULT

# --- the two tables, literally ------------------------------------------------------------
SEED_ITEMIDS = {
    220045: ("hr", D), 220050: ("sbp", A), 220179: ("sbp", N), 220051: ("dbp", A), 220180: ("dbp", N),
    220210: ("rr", D), 220277: ("spo2", D), 223762: ("temp_c", D), 223761: ("temp_c", D),
}
SEED_RANGES = {  # closed at both ends, on the converted value (°C)
    "hr": (10.0, 300.0, True, True), "sbp": (20.0, 300.0, True, True), "dbp": (5.0, 220.0, True, True),
    "rr": (2.0, 80.0, True, True), "spo2": (30.0, 100.0, True, True), "temp_c": (25.0, 45.0, True, True),
}
MIMIC_CODE_ITEMIDS = {
    220045: ("hr", D),
    220050: ("sbp", A), 225309: ("sbp", A), 220179: ("sbp", N),
    220051: ("dbp", A), 225310: ("dbp", A), 220180: ("dbp", N),
    220210: ("rr", D), 224690: ("rr", D),
    220277: ("spo2", D),
    223762: ("temp_c", D), 223761: ("temp_c", D),
}
MIMIC_CODE_RANGES = {  # mimic-code vitalsign: 0 < hr < 300, 0 < sbp < 400, 0 < dbp < 300, 0 < rr < 70,
    "hr": (0.0, 300.0, False, False),  # 0 < spo2 <= 100, 10 < °C < 50; 70 < °F < 120 (raw)
    "sbp": (0.0, 400.0, False, False), "dbp": (0.0, 300.0, False, False), "rr": (0.0, 70.0, False, False),
    "spo2": (0.0, 100.0, False, True), "temp_c": (10.0, 50.0, False, False),
}
LABELS = {
    220045: "Heart Rate", 220050: "Arterial Blood Pressure systolic", 220051: "Arterial Blood Pressure diastolic",
    225309: "ART BP Systolic", 225310: "ART BP Diastolic", 220179: "Non Invasive Blood Pressure systolic",
    220180: "Non Invasive Blood Pressure diastolic", 220210: "Respiratory Rate", 224690: "Respiratory Rate (Total)",
    220277: "O2 saturation pulseoxymetry", 223762: "Temperature Celsius", 223761: "Temperature Fahrenheit",
}
SEED_VALUE_SQL = "CASE WHEN vital = 5 AND (unit_f OR value > 50.0) THEN (value - 32.0) * 5.0 / 9.0 ELSE value END"
SEED_PLAUSIBLE_SQL = (
    "(CASE vs // 4 WHEN 0 THEN value BETWEEN 10.0 AND 300.0 WHEN 1 THEN value BETWEEN 20.0 AND 300.0 "
    "WHEN 2 THEN value BETWEEN 5.0 AND 220.0 WHEN 3 THEN value BETWEEN 2.0 AND 80.0 "
    "WHEN 4 THEN value BETWEEN 30.0 AND 100.0 WHEN 5 THEN value BETWEEN 25.0 AND 45.0 ELSE false END)"
)
#: content hashes of default builds of the unmodified fixtures, computed with the seed code
#: before conventions existed: a default build must keep them.
FIXTURE_MIMIC_HASH = "6b86adf086e72ace9d81ba1176402d46926a3fdb8a669a3808b17af78732e935"
FIXTURE_CLIF_HASH = "3da45435b387eef1ce0e5636a4d84428c42a991a8f7bd679e4745340b609327b"


def _ranges(conv) -> dict:
    return {v: (r.lo, r.hi, r.lo_closed, r.hi_closed) for v, r in conv.plausible.items()}


def test_seed_table_pinned():
    c = get_convention("seed")
    assert c is SEED_CONVENTION
    assert {i: (v, s) for i, (v, s, _) in c.itemids.items()} == SEED_ITEMIDS
    assert {i: (v, s) for i, (v, s, _) in constants.ITEMIDS.items()} == SEED_ITEMIDS
    assert _ranges(c) == SEED_RANGES
    assert {v: (lo, hi, True, True) for v, (lo, hi) in constants.PLAUSIBLE.items()} == SEED_RANGES
    assert c.fahrenheit_raw is None and c.plainly_fahrenheit_above == 50.0
    assert c.clif_categories == constants.CLIF_CATEGORIES


def test_mimic_code_table_pinned():
    c = get_convention("mimic_code")
    assert c is MIMIC_CODE_CONVENTION
    assert {i: (v, s) for i, (v, s, _) in c.itemids.items()} == MIMIC_CODE_ITEMIDS
    assert set(c.itemids) - set(SEED_ITEMIDS) == {225309, 225310, 224690}
    assert set(SEED_ITEMIDS) <= set(c.itemids)
    assert _ranges(c) == MIMIC_CODE_RANGES
    f = c.fahrenheit_raw
    assert (f.lo, f.hi, f.lo_closed, f.hi_closed) == (70.0, 120.0, False, False)
    assert c.plainly_fahrenheit_above is None
    assert c.clif_categories == constants.CLIF_CATEGORIES  # CLIF: same categories, other limits
    assert ITEM_LABELS == LABELS and set(LABELS) == set(c.itemids)
    assert CONVENTIONS == ("seed", "mimic_code")


def test_every_slot_is_known_to_the_hourly_step():
    for conv in (SEED_CONVENTION, MIMIC_CODE_CONVENTION):
        assert {(v, s) for v, s, _ in conv.itemids.values()} <= set(SLOTS)


def test_seed_sql_is_the_seed_build_sql():
    assert value_sql() == SEED_VALUE_SQL == SEED_CONVENTION.value_sql()
    assert plausible_case_sql() == SEED_PLAUSIBLE_SQL == SEED_CONVENTION.plausible_case_sql()
    assert value_sql("seed") == SEED_VALUE_SQL and plausible_case_sql(convention="seed") == SEED_PLAUSIBLE_SQL
    assert "unit_f" in plausible_case_sql(convention="mimic_code")  # °F limits are on the charted value


@pytest.mark.parametrize("itemid, value, seed, mimic_code", [
    (220045, 10.0, True, True), (220045, 9.9, False, True), (220045, 0.0, False, False),
    (220045, 300.0, True, False), (220179, 350.0, False, True), (220180, 250.0, False, True),
    (220210, 1.0, False, True), (220210, 75.0, True, False), (220277, 29.0, False, True),
    (220277, 100.0, True, True), (220277, 100.5, False, False), (225309, 120.0, False, True),
    (224690, 18.0, False, True), (223762, 99.0, True, False), (223762, 20.0, False, True),
    (223762, 50.0, False, False), (223761, 100.4, True, True), (223761, 70.0, False, False),
    (223761, 115.0, False, True), (223761, 120.0, False, False), (220046, 80.0, False, False),
])
def test_keep_rules(itemid, value, seed, mimic_code):
    assert SEED_CONVENTION.keeps(itemid, value) is seed
    assert MIMIC_CODE_CONVENTION.keeps(itemid, value) is mimic_code


def test_range_sql_and_str():
    assert Range(0.0, 100.0, False, True).sql("x") == "(x > 0.0 AND x <= 100.0)"
    assert Range(2.0, 80.0).sql("x") == "x BETWEEN 2.0 AND 80.0"
    assert str(Range(0.0, 100.0, False, True)) == "(0, 100]"


def test_unknown_convention_is_refused(tmp_path):
    with pytest.raises(BadParameterError, match="convention"):
        get_convention("eicu")
    with pytest.raises(BadParameterError, match="convention"):
        build_warehouse("mimic", tmp_path, tmp_path / "wh.duckdb", progress=False, convention="eicu")


# --- builds on the hand-made fixture -------------------------------------------------------
EXTRA_ROWS = [  # stay 305, intime 2150-03-01 08:00
    ("2150-03-01 20:10:00", 225309, 110, "mmHg"),
    ("2150-03-01 20:10:00", 225310, 60, "mmHg"),
    ("2150-03-02 02:10:00", 224690, 18, "insp/min"),
    ("2150-03-02 04:10:00", 220210, 75, "insp/min"),
    ("2150-03-03 00:10:00", 220045, 5, "bpm"),
    ("2150-03-03 02:10:00", 223762, 99.0, "°C"),
]


def _mimic_src(dst: Path, extra: bool) -> Path:
    shutil.copytree(FIX / "mimic_small", dst)
    if extra:
        with open(dst / "icu" / "chartevents.csv", "a") as f:
            for t, item, v, u in EXTRA_ROWS:
                f.write(f"105,205,305,5,{t},{t},{item},{v},{v},{u},0\n")
        with open(dst / "icu" / "d_items.csv", "a") as f:
            for item in (225309, 225310, 224690):
                f.write(f"{item},{LABELS[item]},,chartevents,Routine Vital Signs,,Numeric,,\n")
    return dst


def _hourly(wh: Path, stay_id: int) -> dict[str, np.ndarray]:
    con = duckdb.connect(str(wh), read_only=True)
    d = con.execute("SELECT * FROM vitals_hourly WHERE stay_id = ? ORDER BY hour", [stay_id]).fetchnumpy()
    con.close()
    return {k: np.asarray(v) for k, v in d.items()}


def _params(wh: Path) -> dict:
    con = duckdb.connect(str(wh), read_only=True)
    p = json.loads(con.execute("SELECT value FROM build_info WHERE key = 'params'").fetchone()[0])
    con.close()
    return p


def _steps(start_values: list[tuple[int, float]], n: int) -> np.ndarray:
    out = np.empty(n)
    for (s, v), nxt in zip(start_values, start_values[1:] + [(n, None)]):
        out[s:nxt[0]] = v
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    d = tmp_path_factory.mktemp("conv")
    src = _mimic_src(d / "src", extra=True)
    out = {}
    for conv in CONVENTIONS:
        out[conv] = build_warehouse("mimic", src, d / f"{conv}.duckdb", progress=False, memory_limit="512MB",
                                    convention=conv)
    return out


def test_mimic_code_admits_rows_the_seed_drops(builds):
    seed, mc = builds["seed"], builds["mimic_code"]
    assert read_funnel(seed.warehouse)[4:8] == [
        ("vital_rows", 4, 41), ("numeric_value", 4, 38), ("charttime_within_stay", 4, 36),
        ("plausible_range", 3, 32)]      # 30 of the fixture + RR 75 + 99.0 °C (HR 5 dropped)
    assert read_funnel(mc.warehouse)[4:8] == [
        ("vital_rows", 4, 44), ("numeric_value", 4, 41), ("charttime_within_stay", 4, 39),
        ("plausible_range", 3, 34)]      # 30 (SpO₂ 29 in, 98.6 °C out) + ART BP ×2 + RR total + HR 5
    n = 60
    s, m = _hourly(seed.warehouse, 305), _hourly(mc.warehouse, 305)
    np.testing.assert_allclose(s["sbp"], np.full(n, 85.0))                       # 225309 not read
    np.testing.assert_allclose(m["sbp"], _steps([(0, 85.0), (12, 110.0)], n))   # ART BP Systolic
    np.testing.assert_allclose(s["dbp"], np.full(n, 50.0))
    np.testing.assert_allclose(m["dbp"], _steps([(0, 50.0), (12, 60.0)], n))    # ART BP Diastolic
    np.testing.assert_allclose(s["rr"], _steps([(0, 24.0), (20, 75.0)], n))
    np.testing.assert_allclose(m["rr"], _steps([(0, 24.0), (18, 18.0)], n))     # RR (Total); 75 out
    assert list(np.nonzero(m["rr_observed"])[0]) == [0, 18]
    np.testing.assert_allclose(s["hr"], np.full(n, 135.0))
    np.testing.assert_allclose(m["hr"], _steps([(0, 135.0), (40, 5.0)], n))
    np.testing.assert_allclose(s["temp_c"], _steps([(0, 36.0), (30, 39.0), (42, F_TO_C(99.0))], n))
    np.testing.assert_allclose(m["temp_c"], _steps([(0, 36.0), (30, 39.0)], n))
    # stay 301: SpO₂ 29 (hour 0) is kept by mimic_code (an event hour); 98.6 "°C" is not
    s1, m1 = _hourly(seed.warehouse, 301), _hourly(mc.warehouse, 301)
    assert not s1["spo2_observed"][0] and m1["spo2_observed"][0] and m1["spo2"][0] == 29.0
    assert m1["event_spo2"][0] and not s1["event_spo2"][0]
    assert s1["temp_c_observed"][20] and not m1["temp_c_observed"][20]
    assert _params(seed.warehouse).get("convention") is None
    assert _params(mc.warehouse)["convention"] == "mimic_code"


def test_default_builds_unchanged(tmp_path):
    src = _mimic_src(tmp_path / "src", extra=False)
    a = build_warehouse("mimic", src, tmp_path / "a.duckdb", progress=False, memory_limit="512MB")
    b = build_warehouse("mimic", src, tmp_path / "b.duckdb", progress=False, memory_limit="512MB", convention="seed")
    assert a.content_hash == b.content_hash == FIXTURE_MIMIC_HASH
    assert a.params == b.params and "convention" not in a.params
    c = build_warehouse("mimic", src, tmp_path / "c.duckdb", progress=False, memory_limit="512MB",
                        convention="mimic_code")
    assert c.content_hash != FIXTURE_MIMIC_HASH


def test_clif_convention(tmp_path):
    """CLIF: same categories; mimic_code keeps SpO₂ 29 and drops the 99.0 charted as °C."""
    from test_cohort_build import materialise_clif  # the fixture's parquet with TIMESTAMPTZ columns

    src = materialise_clif(tmp_path / "src")
    s = build_warehouse("clif", src, tmp_path / "s.duckdb", progress=False, memory_limit="512MB")
    m = build_warehouse("clif", src, tmp_path / "m.duckdb", progress=False, memory_limit="512MB",
                        convention="mimic_code")
    assert s.content_hash == FIXTURE_CLIF_HASH
    assert read_funnel(s.warehouse)[4:8] == read_funnel(m.warehouse)[4:8]  # 2 different rows out
    con = duckdb.connect(str(s.warehouse), read_only=True)
    stay = con.execute("SELECT min(stay_id) FROM cohort_stays").fetchone()[0]
    con.close()
    hs, hm = _hourly(s.warehouse, stay), _hourly(m.warehouse, stay)
    assert hm["spo2_observed"].sum() == hs["spo2_observed"].sum() + 1
    assert hs["temp_c_observed"].sum() == hm["temp_c_observed"].sum() + 1
    assert abs(hs["temp_c"][0] - F_TO_C(99.0)) < 1e-9 and hm["temp_c"][0] == 38.9


def test_cli_convention(tmp_path, capsys):
    src = _mimic_src(tmp_path / "src", extra=True)
    rc = main(["--source", "mimic", "--root", str(src), "--warehouse", str(tmp_path / "wh.duckdb"),
               "--memory-limit", "512MB", "--convention", "mimic_code", "--quiet"])
    assert rc == 0
    assert _params(tmp_path / "wh.duckdb")["convention"] == "mimic_code"
    assert "plausible_range" in capsys.readouterr().out


def test_docs_hold_both_tables():
    text = DOC.read_text(encoding="utf-8")
    for conv in CONVENTIONS:
        assert markdown_table(conv) in text, f"docs/VITALS.md: regenerate the {conv} table"


@pytest.mark.demo
def test_demo_under_both_conventions(tmp_path):
    """Real MIMIC-IV demo (CLIF): the conventions differ in the three "°C" values above 50 (read
    as °F by the seed, dropped by mimic_code); labels are the same (docs/VITALS.md)."""
    from cohort.demo_data import ensure_demo
    from cohort.errors import DemoDataMissing

    try:
        ensure_demo()
    except DemoDataMissing as exc:
        pytest.skip(f"real MIMIC-IV demo not available: {exc}")
    out = {}
    for conv in CONVENTIONS:
        s = build_warehouse("demo", None, tmp_path / f"{conv}.duckdb", progress=False, memory_limit="1GB",
                            convention=conv)
        con = duckdb.connect(str(s.warehouse), read_only=True)
        ev = con.execute("SELECT count(*), sum(event_composite::INT), sum(event_spo2::INT), "
                         "sum((event_spo2 AND NOT spo2_observed)::INT), sum(temp_c_observed::INT) "
                         "FROM vitals_hourly").fetchone()
        con.close()
        out[conv] = ({st: nr for st, _, nr in s.funnel}, ev)
    (fs, es), (fm, em) = out["seed"], out["mimic_code"]
    assert fs["charttime_within_stay"] == fm["charttime_within_stay"] == 62592
    assert (fs["plausible_range"], fm["plausible_range"]) == (62558, 62555)
    assert es[:4] == em[:4] == (10476, 1649, 84, 13)
    assert (es[4], em[4]) == (3019, 3016)
