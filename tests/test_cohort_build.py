"""Hand-written fixtures (tests/fixtures/cohort) in both layouts, with hand-computed hourly values.

MIMIC fixture (native layout), min 48 h:
  301 (subject 101) intime 10:30, LOS 49.5 h → 50 hours. Quirks: HR before intime (200) and after
      outtime (50) dropped; HR 0 and SpO₂ 29 dropped; duplicate charttime (100 twice at 12:30 +
      70 at 13:00 → hour 2 = mean(100, 70) = 85, not 90); arterial 120 + non-invasive 130, 140 in
      hour 1 → SBP (120 + 135)/2 = 127.5; °F 100.4 → 38.0 °C with 37.0 °C in hour 2 → 37.5;
      98.6 charted as °C in hour 20 → 37.0; RR text "Unable to assess" dropped.
  302 (102) LOS exactly 48 h → 48 hours; HR 140 exactly at outtime → last hour (47); never a
      temperature → training-split cohort median; HR text "Refused" dropped.
  303 (103) no plausible vital (text, HR 400, a non-vital item) → dropped.
  304 (104) LOS 24 h → dropped.   305 (105) LOS 60 h, arterial BP only, temp 36.0 then 39.0.
CLIF fixture: ICU segments of clif_adt; 5001's first ICU segment (49 h) and 5002's (48 h) pass,
5001's second ICU segment (12 h) does not. temp_c 99.0 is plainly °F → 37.222 °C.
"""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest

from cohort.build import build_warehouse, content_hash, read_funnel
from cohort.constants import VITALS
from cohort.selection import assign_splits

FIX = Path(__file__).parent / "fixtures" / "cohort"
F_TO_C = lambda f: (f - 32) * 5 / 9  # noqa: E731


def materialise_mimic(dst: Path, fmt: str) -> Path:
    """Copy the MIMIC fixture into ``dst`` as .csv, .csv.gz or .parquet."""
    for sub in ("icu", "hosp"):
        (dst / sub).mkdir(parents=True, exist_ok=True)
        for f in (FIX / "mimic_small" / sub).glob("*.csv"):
            stem = dst / sub / f.stem
            if fmt == "csv":
                shutil.copy(f, stem.with_suffix(".csv"))
            elif fmt == "csv.gz":
                with open(f, "rb") as i, gzip.open(str(stem) + ".csv.gz", "wb") as o:
                    o.write(i.read())
            else:
                con = duckdb.connect()
                types = ", types={'value': 'VARCHAR'}" if f.stem == "chartevents" else ""
                con.execute(f"COPY (SELECT * FROM read_csv('{f}', header=true{types})) "
                            f"TO '{stem}.parquet' (FORMAT parquet)")
                con.close()
    return dst


def mimic_fixture_warehouse(d: Path) -> str:
    """The hand-written MIMIC fixture (CSV) built into ``d/wh.duckdb``; returns its path."""
    from cohort.build import build_warehouse

    materialise_mimic(d / "src", "csv")
    build_warehouse("mimic", d / "src", d / "wh.duckdb", progress=False, memory_limit="512MB")
    return str(d / "wh.duckdb")


def materialise_clif(dst: Path) -> Path:
    """CLIF fixture as parquet with VARCHAR ids and TIMESTAMPTZ times (as in CLIF 2.1)."""
    dst.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    known = {"hospitalization_id": "VARCHAR", "patient_id": "VARCHAR", "in_dttm": "TIMESTAMPTZ",
             "out_dttm": "TIMESTAMPTZ", "recorded_dttm": "TIMESTAMPTZ", "admission_dttm": "TIMESTAMPTZ",
             "discharge_dttm": "TIMESTAMPTZ"}
    for f in (FIX / "clif_small").glob("*.csv"):
        header = f.read_text().splitlines()[0].split(",")
        types = "{" + ", ".join(f"'{c}': '{t}'" for c, t in known.items() if c in header) + "}"
        con.execute(f"COPY (SELECT * FROM read_csv('{f}', header=true, types={types})) "
                    f"TO '{dst / (f.stem + '.parquet')}' (FORMAT parquet)")
    con.close()
    return dst


def hourly(wh: Path, stay_id: int) -> dict[str, np.ndarray]:
    con = duckdb.connect(str(wh), read_only=True)
    d = con.execute("SELECT * FROM vitals_hourly WHERE stay_id = ? ORDER BY hour", [stay_id]).fetchnumpy()
    con.close()
    return {k: np.asarray(v) for k, v in d.items()}


def piecewise(n: int, *pieces: tuple[int, float]) -> np.ndarray:
    """Values by hour: pieces (start_hour, value), each running to the next start."""
    out = np.empty(n)
    for (s, v), nxt in zip(pieces, list(pieces[1:]) + [(n, None)]):
        out[s:nxt[0]] = v
    return out


@pytest.fixture(scope="module")
def mimic_wh(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mimic")
    materialise_mimic(d / "src", "csv.gz")
    build_warehouse("mimic", d / "src", d / "wh.duckdb", progress=False, memory_limit="512MB")
    return d / "wh.duckdb"


@pytest.fixture(scope="module")
def clif_wh(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("clif")
    materialise_clif(d / "src")
    build_warehouse("clif", d / "src", d / "wh.duckdb", progress=False, memory_limit="512MB")
    return d / "wh.duckdb"


def test_mimic_funnel_counts(mimic_wh):
    assert read_funnel(mimic_wh) == [
        ("icu_stays_in_source", 5, None), ("one_subject_per_stay", 5, None), ("valid_times", 5, None),
        ("los_ge_48h", 4, None),
        ("vital_rows", 4, 38),              # 22 + 7 + 2 + 7 (non-vital 220046 and LOS-excluded 304 not read)
        ("numeric_value", 4, 35),           # 3 text-only rows
        ("charttime_within_stay", 4, 33),   # HR before intime and after outtime of 301
        ("plausible_range", 3, 30),         # HR 0, SpO2 29 (301), HR 400 (303)
        ("stays_with_a_vital", 3, 158),     # 50 + 48 + 60 hours
        ("hourly_tokens", 3, 158),
    ]


def test_mimic_stay_301_every_quirk(mimic_wh):
    d = hourly(mimic_wh, 301)
    n = 50
    np.testing.assert_array_equal(d["hour"], np.arange(n))
    np.testing.assert_allclose(d["hr"], piecewise(n, (0, 85), (2, 85), (4, 95)))  # ffill between
    assert list(np.nonzero(d["hr_observed"])[0]) == [0, 2, 4]
    np.testing.assert_allclose(d["sbp"], np.full(n, 127.5))   # mean of source means, bfill to hour 0
    np.testing.assert_allclose(d["dbp"], np.full(n, 70.0))
    np.testing.assert_allclose(d["rr"], piecewise(n, (0, 16), (10, 20)))
    np.testing.assert_allclose(d["spo2"], piecewise(n, (0, 95), (6, 88)))   # 29 dropped, bfill 95
    assert list(np.nonzero(d["spo2_observed"])[0]) == [1, 6]
    t2 = (F_TO_C(100.4) + 37.0) / 2
    np.testing.assert_allclose(d["temp_c"], piecewise(n, (0, t2), (20, F_TO_C(98.6))))
    assert abs(t2 - 37.5) < 1e-12
    np.testing.assert_array_equal(d["event_spo2"], np.arange(n) >= 6)
    np.testing.assert_array_equal(d["event_composite"], np.arange(n) >= 6)


def test_mimic_stay_302_outtime_row_and_median(mimic_wh):
    d = hourly(mimic_wh, 302)
    n = 48
    np.testing.assert_allclose(d["hr"], piecewise(n, (0, 60), (47, 140)))
    assert d["hr_observed"][47] and d["hr_observed"].sum() == 2
    assert not d["temp_c_observed"].any()
    con = duckdb.connect(str(mimic_wh), read_only=True)
    split = dict(con.execute("SELECT subject_id, split FROM cohort_stays").fetchall())
    con.close()
    assert split == assign_splits([101, 102, 105], seed=0)
    # observed hourly temperatures: 301 → 37.5 (h2), 37.0 (h20); 305 → 36.0 (h0), 39.0 (h30)
    obs = {101: [37.5, F_TO_C(98.6)], 102: [], 105: [36.0, 39.0]}
    train = [x for s, v in obs.items() if split[s] == "train" for x in v]
    np.testing.assert_allclose(d["temp_c"], np.full(n, float(np.median(train))))
    np.testing.assert_array_equal(d["event_composite"], np.arange(n) == 47)   # HR 140 > 130
    assert not d["event_spo2"].any()


def test_mimic_stay_305_and_dropped_stays(mimic_wh):
    d = hourly(mimic_wh, 305)
    n = 60
    np.testing.assert_allclose(d["hr"], np.full(n, 135.0))     # back fill from hour 5
    np.testing.assert_allclose(d["sbp"], np.full(n, 85.0))
    np.testing.assert_allclose(d["temp_c"], piecewise(n, (0, 36.0), (30, 39.0)))
    assert d["event_composite"].all() and not d["event_spo2"].any()
    con = duckdb.connect(str(mimic_wh), read_only=True)
    assert sorted(r[0] for r in con.execute("SELECT stay_id FROM cohort_stays").fetchall()) == [301, 302, 305]
    assert con.execute("SELECT count(*) FROM vitals_hourly WHERE stay_id IN (303, 304)").fetchone()[0] == 0
    con.close()


def test_standardisation_is_train_only_and_z_columns(mimic_wh):
    con = duckdb.connect(str(mimic_wh), read_only=True)
    st = {v: (m, s) for v, m, s in con.execute("SELECT vital, mean, sd FROM standardisation").fetchall()}
    for v in VITALS:
        train = np.array([r[0] for r in con.execute(
            f"SELECT h.{v} FROM vitals_hourly h JOIN cohort_stays c USING (stay_id) "
            "WHERE c.split = 'train'").fetchall()])
        sd = train.std(ddof=1)
        assert st[v][0] == pytest.approx(train.mean(), abs=1e-9)
        assert st[v][1] == pytest.approx(sd if sd > 0 else 1.0, abs=1e-9)
        raw, z = map(np.array, zip(*con.execute(f"SELECT {v}, {v}_z FROM vitals_hourly").fetchall()))
        np.testing.assert_allclose(z, (raw - st[v][0]) / st[v][1], atol=1e-12)
    con.close()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_layout_formats_give_identical_content(tmp_path, mimic_wh, fmt):
    materialise_mimic(tmp_path / "src", fmt)
    s = build_warehouse("mimic", tmp_path / "src", tmp_path / "wh.duckdb", progress=False)
    con = duckdb.connect(str(mimic_wh), read_only=True)
    assert s.content_hash == content_hash(con)
    con.close()


def test_sample_is_deterministic_and_recorded(tmp_path):
    materialise_mimic(tmp_path / "src", "csv")
    a = build_warehouse("mimic", tmp_path / "src", tmp_path / "a.duckdb", sample=3, seed=3, progress=False)
    b = build_warehouse("mimic", tmp_path / "src", tmp_path / "b.duckdb", sample=3, seed=3, progress=False)
    assert a.content_hash == b.content_hash
    assert ("sampled_3_seed_3", 3, None) in a.funnel
    assert a.funnel[-1][1] <= 3


def test_clif_funnel_and_values(clif_wh):
    assert read_funnel(clif_wh) == [
        ("icu_stays_in_source", 3, None), ("one_subject_per_stay", 3, None), ("valid_times", 3, None),
        ("los_ge_48h", 2, None),
        ("vital_rows", 2, 22),            # 14 rows of hospitalization 5001 (map not a vital) + 8 of 5002
        ("numeric_value", 2, 22),
        ("charttime_within_stay", 2, 20),  # HR in the ED before ICU, HR during the later ICU segment
        ("plausible_range", 2, 18),        # HR 0, SpO2 29
        ("stays_with_a_vital", 2, 97),     # 49 + 48 hours
        ("hourly_tokens", 2, 97),
    ]
    con = duckdb.connect(str(clif_wh), read_only=True)
    stays = con.execute("SELECT stay_id, subject_id, hadm_id, n_hours FROM cohort_stays ORDER BY 1").fetchall()
    con.close()
    assert stays == [(500101, 1001, 5001, 49), (500201, 1002, 5002, 48)]
    d = hourly(clif_wh, 500101)
    n = 49
    np.testing.assert_allclose(d["hr"], piecewise(n, (0, 88), (1, 92)))
    np.testing.assert_allclose(d["sbp"], np.full(n, 120.0))    # arterial 110, non-invasive 130
    np.testing.assert_allclose(d["dbp"], np.full(n, 65.0))
    np.testing.assert_allclose(d["spo2"], np.full(n, 96.0))
    np.testing.assert_allclose(d["temp_c"], piecewise(n, (0, F_TO_C(99.0)), (24, 38.9)))
    np.testing.assert_array_equal(d["event_composite"], np.arange(n) >= 24)
    d = hourly(clif_wh, 500201)
    n = 48
    np.testing.assert_allclose(d["hr"], piecewise(n, (0, 70), (5, 75)))
    np.testing.assert_allclose(d["temp_c"], np.full(n, 36.8))
    np.testing.assert_allclose(d["spo2"], piecewise(n, (0, 98), (47, 85)))  # at outtime → last hour
    np.testing.assert_array_equal(d["event_spo2"], np.arange(n) == 47)
    np.testing.assert_array_equal(d["event_composite"], np.arange(n) == 47)


def test_fast_build_matches_reference_on_fixtures(mimic_wh, clif_wh, tmp_path):
    from cohort.reference import reference_build

    materialise_clif(tmp_path / "clif")
    materialise_mimic(tmp_path / "mimic", "csv.gz")
    for src, root, wh in (("mimic", tmp_path / "mimic", mimic_wh), ("clif", tmp_path / "clif", clif_wh)):
        ref = reference_build(src, root)
        assert read_funnel(wh) == ref["funnel"]
        con = duckdb.connect(str(wh), read_only=True)
        rows = con.execute("SELECT * FROM vitals_hourly ORDER BY stay_id, hour").fetchall()
        cols = [c[0] for c in con.description]
        con.close()
        for r in rows:
            got = dict(zip(cols, r))
            exp = ref["hourly"][got["stay_id"]][got["hour"]]
            for c in cols[2:]:
                assert got[c] == pytest.approx(exp[c], abs=1e-9), (src, got["stay_id"], got["hour"], c)
