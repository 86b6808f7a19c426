"""Issue 19, item 3: a forgotten patient's stay never comes back through a source quirk.

* A stay the source lists under two subjects (a second ``icustays`` row, a hospitalization listed
  under two patients in CLIF) is dropped by every build and counted in the funnel
  (``one_subject_per_stay``) — never assigned to one of them. The issue's scenario: the build used
  to assign it to one subject; forgetting that subject and rebuilding brought it back under the
  other id (384 hourly rows on the demo).
* A stay a forget receipt names (keyed hash) stays out even when a later source extract lists it
  under another subject (the registry used to exclude subjects only).

Run for the MIMIC-native layout (the hand-written fixture, and the synthetic generator's files)
and for CLIF, through the pipelines' build (forget registry applied), no Prefect server.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest

from pipelines.receipts.ledger import Ledger, default_dir
from pipelines.store.forget import forget_subject
from pipelines.store.keys import Keys

FIX = Path(__file__).parent / "fixtures" / "cohort"
NEW_SUBJECT = 1999


def _build(warehouse: Path, source: str, root: Path, min_hours: float) -> dict:
    from pipelines.flows.clinical_cohort import build_task
    from pipelines.settings import CohortSettings

    return build_task.fn(source, str(root), str(warehouse), CohortSettings(min_hours=min_hours, memory_limit="512MB"),
                         runs_dir=str(warehouse.parent))


def _rows(p: Path, stay: int) -> tuple[int, int]:
    con = duckdb.connect(str(p), read_only=True)
    try:
        return (con.execute("SELECT count(*) FROM cohort_stays WHERE stay_id = ?", [stay]).fetchone()[0],
                con.execute("SELECT count(*) FROM vitals_hourly WHERE stay_id = ?", [stay]).fetchone()[0])
    finally:
        con.close()


def _owner(p: Path, stay: int) -> int:
    con = duckdb.connect(str(p), read_only=True)
    try:
        return int(con.execute("SELECT subject_id FROM cohort_stays WHERE stay_id = ?", [stay]).fetchone()[0])
    finally:
        con.close()


class Source:
    """A source root with the two edits the scenario needs, in the source's own layout."""

    def __init__(self, kind: str, tmp: Path):
        self.kind = kind
        if kind == "mimic_fixture":
            self.adapter, self.min_hours, self.stay = "mimic", 48, 302
            self.root = tmp / "mimic"
            shutil.copytree(FIX / "mimic_small", self.root)
            self.table, self.key, self.owner = self.root / "icu" / "icustays.csv", "stay_id", "subject_id"
        elif kind == "mimic_synthetic":
            from cohort.synthetic import generate

            self.adapter, self.min_hours = "mimic", 48
            self.root = tmp / "synthetic"
            generate(self.root, stays=12, seed=3, fmt="parquet")
            self.table, self.key, self.owner = self.root / "icu" / "icustays.parquet", "stay_id", "subject_id"
            self.stay = None  # picked from the first build
        else:
            from test_cohort_build import materialise_clif

            self.adapter, self.min_hours, self.stay = "clif", 0, 500201  # hospitalization 5002, one ICU segment
            self.root = materialise_clif(tmp / "clif")
            self.table = self.root / "clif_hospitalization.parquet"
            self.key, self.owner = "hospitalization_id", "patient_id"

    def _key_of(self, stay: int):
        return stay // 100 if self.kind == "clif" else stay

    def _read(self) -> pl.DataFrame:
        if self.table.suffix == ".csv":
            return pl.read_csv(self.table, infer_schema=False)  # every column as text: written back unchanged
        return pl.read_parquet(self.table)

    def _write(self, df: pl.DataFrame) -> None:
        if self.table.suffix == ".csv":
            df.write_csv(self.table)
        else:
            df.write_parquet(self.table)

    def _match(self, df: pl.DataFrame, stay: int):
        key = self._key_of(stay)
        return pl.col(self.key).cast(pl.Utf8) == str(key)

    def add_second_owner(self, stay: int, subject: int) -> None:
        """A second row for ``stay`` (its hospitalization in CLIF) under a new subject id."""
        df = self._read()
        row = df.filter(self._match(df, stay)).head(1)
        dtype = df.schema[self.owner]
        self._write(pl.concat([df, row.with_columns(pl.lit(str(subject)).cast(dtype).alias(self.owner))]))

    def relabel(self, stay: int, subject: int) -> None:
        """The stay's only row now names another subject (a later extract's id change)."""
        df = self._read()
        dtype = df.schema[self.owner]
        self._write(df.with_columns(pl.when(self._match(df, stay)).then(pl.lit(str(subject)).cast(dtype))
                                    .otherwise(pl.col(self.owner)).alias(self.owner)))


KINDS = ["mimic_fixture", "mimic_synthetic", "clif"]


def _site(kind: str, tmp_path: Path) -> tuple[Source, Path, dict]:
    src = Source(kind, tmp_path)
    p = tmp_path / "runs" / "warehouse.duckdb"
    s = _build(p, src.adapter, src.root, src.min_hours)
    if src.stay is None:
        con = duckdb.connect(str(p), read_only=True)
        src.stay = int(con.execute("SELECT stay_id FROM cohort_stays ORDER BY n_hours DESC, stay_id LIMIT 1"
                                   ).fetchone()[0])
        con.close()
    return src, p, s


@pytest.mark.parametrize("kind", KINDS)
def test_a_stay_under_two_subjects_is_dropped_and_never_returns(kind, tmp_path):
    src, p, s0 = _site(kind, tmp_path)
    stay = src.stay
    n_stays, n_hours = _rows(p, stay)
    assert n_stays == 1 and n_hours > 0  # the positive control: the stay is there before the quirk
    owner = _owner(p, stay)
    src.add_second_owner(stay, NEW_SUBJECT)
    s1 = _build(p, src.adapter, src.root, src.min_hours)
    assert _rows(p, stay) == (0, 0)  # never silently assigned to either subject
    f = {k: a for k, a, _ in s1["funnel"]}
    assert f["icu_stays_in_source"] == {k: a for k, a, _ in s0["funnel"]}["icu_stays_in_source"] + 1
    assert f["icu_stays_in_source"] - f["one_subject_per_stay"] == 2  # both rows of the stay, counted
    assert s1["n_stays"] == s0["n_stays"] - 1
    # the sequence: forget the new subject (absent from the warehouse: registered anyway), rebuild
    forget_subject(p, subject_id=NEW_SUBJECT, allow_absent=True)
    _build(p, src.adapter, src.root, src.min_hours)
    assert _rows(p, stay) == (0, 0)
    # and the original owner, for completeness (their other stays go too, as a forget must)
    forget_subject(p, subject_id=owner, allow_absent=True)
    _build(p, src.adapter, src.root, src.min_hours)
    assert _rows(p, stay) == (0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_forgotten_stay_relabelled_to_another_subject_stays_out(kind, tmp_path):
    src, p, s0 = _site(kind, tmp_path)
    stay = src.stay
    owner = _owner(p, stay)
    r = forget_subject(p, subject_id=owner)
    keys = Keys.load()
    payload = Ledger(default_dir(p), keys).rows()[r.receipt_seq - 1].payload
    assert keys.stay_hash(stay) in payload["stay_id_hashes"]  # keyed hashes only, no raw id
    # no raw id anywhere in the receipt: matched as a whole number, so a keyed hash (hex, drawn from a
    # fresh key each run) that happens to hold the digits is not a false alarm
    assert not re.search(rf"(?<!\w){stay}(?!\w)", str(payload)), "the receipt names the raw stay id"
    src.relabel(stay, NEW_SUBJECT)  # a later extract lists the forgotten stay under another id
    s1 = _build(p, src.adapter, src.root, src.min_hours)
    assert _rows(p, stay) == (0, 0)
    con = duckdb.connect(str(p), read_only=True)
    assert con.execute("SELECT count(*) FROM cohort_stays WHERE subject_id IN (?, ?)", [owner, NEW_SUBJECT]
                       ).fetchone()[0] == 0
    con.close()
    f = {k: a for k, a, _ in s1["funnel"]}
    assert f["one_subject_per_stay"] > f["not_in_forget_registry"]  # dropped by the registry, counted
    if src.adapter == "mimic":  # the incremental ingest reads stays through the same rule
        from cohort.incremental import STAYS_TABLE, load_stays
        from pipelines.store.warehouse import Warehouse

        with Warehouse.open(p) as w:
            excl = w.exclusion()
        con = duckdb.connect()
        load_stays(con, "mimic", src.root, src.min_hours, excl)
        assert con.execute(f"SELECT count(*) FROM {STAYS_TABLE} WHERE stay_id = ?", [stay]).fetchone()[0] == 0
        assert con.execute(f"SELECT count(*) FROM {STAYS_TABLE}").fetchone()[0] > 0
        con.close()
