"""Bad input: typed errors that name what is wrong, and a failed build never touches an
existing warehouse."""
from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest

from cohort.build import build_warehouse
from cohort.errors import (
    BadParameterError,
    EmptyCohortError,
    InputMissingError,
    MissingColumnsError,
    UnreadableInputError,
)

FIX = Path(__file__).parent / "fixtures" / "cohort" / "mimic_small"


def _copy(dst: Path) -> Path:
    shutil.copytree(FIX, dst)
    return dst


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_missing_file_names_path_and_layout(tmp_path):
    root = _copy(tmp_path / "src")
    (root / "icu" / "chartevents.csv").unlink()
    with pytest.raises(InputMissingError) as e:
        build_warehouse("mimic", root, tmp_path / "wh.duckdb", progress=False)
    msg = str(e.value)
    assert str(root / "icu" / "chartevents.csv.gz") in msg and "native layout" in msg


def test_missing_clif_table(tmp_path):
    (tmp_path / "clif").mkdir()
    with pytest.raises(InputMissingError, match="clif_adt.parquet"):
        build_warehouse("clif", tmp_path / "clif", tmp_path / "wh.duckdb", progress=False)


def test_missing_columns_are_named(tmp_path):
    root = _copy(tmp_path / "src")
    p = root / "icu" / "icustays.csv"
    lines = p.read_text().splitlines()
    p.write_text("\n".join(",".join(c for i, c in enumerate(l.split(",")) if i != 6) for l in lines) + "\n")
    with pytest.raises(MissingColumnsError) as e:
        build_warehouse("mimic", root, tmp_path / "wh.duckdb", progress=False)
    assert e.value.missing == ["outtime"] and "icustays.csv" in str(e.value)


def test_unreadable_gzip_and_parquet(tmp_path):
    root = _copy(tmp_path / "src")
    (root / "icu" / "chartevents.csv").unlink()
    (root / "icu" / "chartevents.csv.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-not-gzip" * 10)
    with pytest.raises(UnreadableInputError, match="chartevents.csv.gz"):
        build_warehouse("mimic", root, tmp_path / "wh.duckdb", progress=False)
    (root / "icu" / "chartevents.csv.gz").unlink()
    (root / "icu" / "chartevents.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(UnreadableInputError, match="chartevents.parquet"):
        build_warehouse("mimic", root, tmp_path / "wh.duckdb", progress=False)


def test_truncated_gzip_fails_during_scan(tmp_path):
    root = _copy(tmp_path / "src")
    src = root / "icu" / "chartevents.csv"
    data = gzip.compress(src.read_bytes() * 200)
    src.unlink()
    (root / "icu" / "chartevents.csv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(UnreadableInputError, match="chartevents.csv.gz"):
        build_warehouse("mimic", root, tmp_path / "wh.duckdb", progress=False)


def test_empty_cohort_shows_funnel(tmp_path):
    root = _copy(tmp_path / "src")
    with pytest.raises(EmptyCohortError) as e:
        build_warehouse("mimic", root, tmp_path / "wh.duckdb", min_hours=1000, progress=False)
    assert "los_ge_1000h" in str(e.value) and e.value.funnel[-1] == ("los_ge_1000h", 0, None)
    assert "\n" not in str(e.value)  # one line: the stay count after each step
    assert not (tmp_path / "wh.duckdb").exists()


def test_failed_build_leaves_existing_warehouse_untouched(tmp_path):
    root = _copy(tmp_path / "src")
    wh = tmp_path / "wh.duckdb"
    build_warehouse("mimic", root, wh, progress=False)
    before = _sha(wh)
    with pytest.raises(EmptyCohortError):
        build_warehouse("mimic", root, wh, min_hours=1000, progress=False)
    (root / "icu" / "chartevents.csv").write_text("not,the,right,header\n1,2,3,4\n")
    with pytest.raises(MissingColumnsError):
        build_warehouse("mimic", root, wh, progress=False)
    assert _sha(wh) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "wh.duckdb"]  # no temp files left


def test_bad_parameters(tmp_path):
    with pytest.raises(BadParameterError):
        build_warehouse("eicu", tmp_path, tmp_path / "wh.duckdb", progress=False)
    with pytest.raises(BadParameterError):
        build_warehouse("mimic", tmp_path, tmp_path / "wh.duckdb", sample=0, progress=False)
    with pytest.raises(BadParameterError):
        build_warehouse("mimic", tmp_path, tmp_path / "wh.duckdb", memory_limit="lots", progress=False)
