"""Polars frames of the user's own warehouse (cohort.load_hourly / load_stays) and the Parquet
export (``forgetful export``): equal to the warehouse tables, owner-only files, no overwrite."""
from __future__ import annotations

import json
import stat

import duckdb
import polars as pl
import pytest
from test_cohort_build import mimic_fixture_warehouse

import cohort
from cohort.errors import BadParameterError


@pytest.fixture(scope="module")
def wh(tmp_path_factory):
    return mimic_fixture_warehouse(tmp_path_factory.mktemp("frames"))


def test_load_hourly_equals_the_warehouse(wh):
    df = cohort.load_hourly(wh)
    assert isinstance(df, pl.DataFrame)
    con = duckdb.connect(wh, read_only=True)
    n, s = con.execute("SELECT count(*), sum(hr_z) FROM vitals_hourly").fetchone()
    con.close()
    assert df.height == n and df["hr_z"].sum() == pytest.approx(s)
    assert df.columns[:3] == ["stay_id", "hour", "split"] and set(cohort.frames.HOURLY_DEFAULT) <= set(df.columns)
    assert df.sort(["stay_id", "hour"]).equals(df)  # ascending by (stay, hour)
    assert df.schema["event_composite"] == pl.Boolean and df.schema["hr"] == pl.Float64
    # per stay: hours 0..n-1, as many as cohort_stays says
    stays = cohort.load_stays(wh)
    per = df.group_by("stay_id").agg(pl.len().alias("n"), pl.col("hour").max().alias("last")).sort("stay_id")
    assert per["n"].to_list() == stays["n_hours"].to_list() and (per["last"] + 1).to_list() == per["n"].to_list()


def test_filters_and_bad_parameters(wh):
    train = cohort.load_hourly(wh, columns=["hr", "spo2_z"], split="train")
    assert train.columns == ["stay_id", "hour", "split", "hr", "spo2_z"] and set(train["split"]) == {"train"}
    one = cohort.load_stays(wh)["stay_id"][0]
    assert set(cohort.load_hourly(wh, stay_ids=[one])["stay_id"]) == {one}
    with pytest.raises(BadParameterError, match="split"):
        cohort.load_hourly(wh, split="holdout")
    with pytest.raises(BadParameterError, match="column"):
        cohort.load_hourly(wh, columns=["hr; DROP TABLE cohort_stays"])


def test_export_command_writes_private_parquet(wh, tmp_path, capsys):
    from pipelines.cli import main

    out = tmp_path / "export"
    assert main(["export", "--warehouse", wh, "--out", str(out), "--json", str(tmp_path / "e.json")]) == 0
    summary = json.loads((tmp_path / "e.json").read_text())
    hourly, stays = pl.read_parquet(out / "hourly.parquet"), pl.read_parquet(out / "stays.parquet")
    assert hourly.equals(cohort.load_hourly(wh)) and stays.equals(cohort.load_stays(wh))
    assert summary["rows"] == hourly.height and summary["stays"] == stays.height
    for f in ("hourly.parquet", "stays.parquet"):
        assert stat.S_IMODE((out / f).stat().st_mode) == 0o600
    err = capsys.readouterr().err
    assert "record-level" in err and str(stays["subject_id"][0]) not in err  # counts only on the console
    # never overwrites: exit 3, one line, files unchanged
    before = (out / "hourly.parquet").read_bytes()
    assert main(["export", "--warehouse", wh, "--out", str(out)]) == 3
    assert capsys.readouterr().err.strip().startswith("error: BadParameterError:")
    assert (out / "hourly.parquet").read_bytes() == before


def test_an_empty_selection_is_an_empty_frame_with_the_columns(wh, tmp_path):
    """A split without stays (small cohorts; after a forget) exports empty files with the schema."""
    import shutil

    copy = tmp_path / "w.duckdb"  # the module's warehouse stays as it is
    shutil.copy(wh, copy)
    con = duckdb.connect(str(copy))
    empty = cohort.load_hourly(con, columns=["hr"], stay_ids=[-1])
    stays = cohort.load_stays(con)
    assert empty.height == 0 and empty.columns == ["stay_id", "hour", "split", "hr"]
    assert empty.schema["hr"] == pl.Float64 and stays.height > 0
    con.execute("UPDATE cohort_stays SET split = 'train' WHERE split = 'test'")
    out = cohort.frames.export_parquet(con, tmp_path / "x", split="test")
    con.close()
    assert out["stays"] == 0 and out["rows"] == 0
    back = pl.read_parquet(tmp_path / "x" / "stays.parquet")
    assert back.height == 0 and back.columns == list(stays.columns) and back.schema == stays.schema
