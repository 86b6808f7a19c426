"""Readers (the gate's keys) and the right-to-be-forgotten purge, on the hand fixture."""
from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest

from cohort.build import build_warehouse
from cohort.constants import VITALS
from cohort.errors import BadParameterError, UnknownStayError
from cohort.purge import purge_subject
from cohort.streams import iter_stays, list_stays, load_stay_matrix

FIX = Path(__file__).parent / "fixtures" / "cohort" / "mimic_small"


@pytest.fixture()
def wh(tmp_path) -> Path:
    shutil.copytree(FIX, tmp_path / "src")
    return build_warehouse("mimic", tmp_path / "src", tmp_path / "wh.duckdb", progress=False).warehouse


def test_load_stay_matrix_z_and_raw(wh):
    con = duckdb.connect(str(wh), read_only=True)
    st = {v: (m, s) for v, m, s in con.execute("SELECT vital, mean, sd FROM standardisation").fetchall()}
    con.close()
    hours, X = load_stay_matrix(wh, 301)
    assert X.shape == (50, 6) and X.dtype == np.float64
    np.testing.assert_array_equal(hours, np.arange(50))
    # hour 2 raw values by hand: hr 85, sbp 127.5, dbp 70, rr 16, spo2 95, temp 37.5
    raw2 = dict(zip(VITALS, [85.0, 127.5, 70.0, 16.0, 95.0, 37.5]))
    np.testing.assert_allclose(X[2], [(raw2[v] - st[v][0]) / st[v][1] for v in VITALS], atol=1e-12)
    _, R = load_stay_matrix(wh, 301, columns=["hr", "spo2_observed"])
    np.testing.assert_allclose(R[:3], [[85, 0], [85, 1], [85, 0]])
    with pytest.raises(UnknownStayError):
        load_stay_matrix(wh, 999)
    with pytest.raises(BadParameterError):
        load_stay_matrix(wh, 301, columns=["heart"])


def test_iter_stays_shapes_and_labels(wh):
    streams = list(iter_stays(wh, batch_stays=2))
    assert [s.stay_id for s in streams] == [301, 302, 305] == list_stays(wh)
    s302 = streams[1]
    assert s302.z.shape == (48, 6) and s302.raw.shape == (48, 6) and s302.observed.shape == (48, 6)
    np.testing.assert_array_equal(s302.event_composite, np.arange(48) == 47)
    assert s302.keys(drop=("spo2",)).shape == (48, 5)
    np.testing.assert_array_equal(s302.keys(drop=("spo2",)), s302.z[:, [0, 1, 2, 3, 5]])
    hours, X = load_stay_matrix(wh, 305)
    np.testing.assert_array_equal(streams[2].z, X)
    train = list(iter_stays(wh, split="train"))
    assert train and all(s.split == "train" for s in train)


def test_purge_subject_inside_caller_transaction(wh):
    con = duckdb.connect(str(wh))
    con.execute("BEGIN")
    out = purge_subject(con, 101)
    assert out == {"vitals_hourly": 50, "cohort_stays": 1}
    assert con.execute("SELECT count(*) FROM vitals_hourly WHERE stay_id = 301").fetchone()[0] == 0
    con.execute("ROLLBACK")   # the caller owns the transaction: nothing was committed
    assert con.execute("SELECT count(*) FROM vitals_hourly WHERE stay_id = 301").fetchone()[0] == 50
    con.execute("BEGIN")
    assert purge_subject(con, 105) == {"vitals_hourly": 60, "cohort_stays": 1}
    con.execute("COMMIT")
    con.close()
    assert list_stays(wh) == [301, 302]
    with pytest.raises(UnknownStayError):
        load_stay_matrix(wh, 305)
    con = duckdb.connect(str(wh))
    assert purge_subject(con, 105) == {"vitals_hourly": 0, "cohort_stays": 0}
    con.close()
