"""A replayable copy of a source for the incremental ingest's tests and demonstrations: the stays
tables copied and the measurement file split by charttime into part files (optionally re-timed
so every stay spans the parts, and with late rows moved into a later part)."""
from __future__ import annotations

from pathlib import Path

import duckdb

from cohort.incremental import PATTERNS


def make_replay(source: str, src_root: str | Path, out_root: str | Path, parts_dir: str | Path, k: int,
                align: bool = False, late_every: int = 0) -> list[Path]:
    """A replayable copy of a source: the stays tables copied to ``out_root`` and the
    measurement file split by charttime into ``k`` parts in ``parts_dir`` (the caller drops them
    into the root one at a time). ``align`` (mimic) re-times every stay to start within a few days
    of one clock (keeping its length and in-stay offsets), so every stay spans the increments;
    ``late_every`` moves every n-th row of part 1 into part ``min(3, k−1)`` (late rows)."""
    src_root, out_root, parts_dir = Path(src_root), Path(out_root), Path(parts_dir)
    sub, stem = PATTERNS[source]
    (out_root / sub).mkdir(parents=True, exist_ok=True)
    parts_dir.mkdir(parents=True, exist_ok=True)
    if (src_root / "synthetic_manifest.json").is_file():  # the replay of a synthetic root stays "synthetic"
        import shutil

        shutil.copy(src_root / "synthetic_manifest.json", out_root / "synthetic_manifest.json")
    con = duckdb.connect(":memory:")
    try:
        if source == "mimic":
            from cohort.sources import NATIVE_LAYOUT, find_table

            (out_root / "hosp").mkdir(parents=True, exist_ok=True)
            for rel in ("icu/d_items", "hosp/patients", "hosp/admissions"):
                t = find_table(src_root, rel, NATIVE_LAYOUT)
                t.check(con, [])
                con.execute(f"COPY (SELECT * FROM {t.reader}) TO '{out_root / (rel + '.parquet')}' (FORMAT parquet)")
            ic = find_table(src_root, "icu/icustays", NATIVE_LAYOUT)
            ic.check(con, [])
            ce = find_table(src_root, "icu/chartevents", NATIVE_LAYOUT)
            ce.check(con, [])
            if align:
                con.execute(f"CREATE TABLE st AS SELECT *, TIMESTAMP '2150-01-01' + to_minutes(CAST(37 * "
                            f"(row_number() OVER (ORDER BY stay_id)) AS BIGINT)) AS new_in FROM {ic.reader}")
                con.execute("CREATE TABLE st2 AS SELECT * EXCLUDE (new_in, intime, outtime), new_in AS intime, "
                            "new_in + (outtime - intime) AS outtime FROM st")
                con.execute(f"CREATE TABLE ce AS SELECT c.* REPLACE (c.charttime - s.intime + s.new_in AS charttime) "
                            f"FROM {ce.reader} c JOIN st s USING (stay_id)")
                con.execute("DROP TABLE st")
                con.execute("ALTER TABLE st2 RENAME TO st")
            else:
                con.execute(f"CREATE TABLE st AS SELECT * FROM {ic.reader}")
                con.execute(f"CREATE TABLE ce AS SELECT * FROM {ce.reader}")
            con.execute(f"COPY st TO '{out_root / 'icu' / 'icustays.parquet'}' (FORMAT parquet)")
            tcol = "charttime"
        else:
            for rel in ("clif_adt", "clif_hospitalization", "clif_patient"):
                con.execute(f"COPY (SELECT * FROM read_parquet('{src_root / (rel + '.parquet')}')) TO "
                            f"'{out_root / (rel + '.parquet')}' (FORMAT parquet)")
            con.execute(f"CREATE TABLE ce AS SELECT * FROM read_parquet('{src_root / 'clif_vitals.parquet'}')")
            tcol = "recorded_dttm"
        con.execute("CREATE TABLE ce2 AS SELECT *, row_number() OVER () AS _rn FROM ce")
        qrow = con.execute(f"SELECT quantile_disc(epoch_us({tcol}), [{', '.join(str(i / k) for i in range(1, k))}]) "
                           "FROM ce2").fetchone()
        assert qrow is not None  # an aggregate query returns one row
        qs = qrow[0]
        edges = [None] + [int(q) for q in qs] + [None]
        con.execute("ALTER TABLE ce2 ADD COLUMN _part INTEGER")
        for i in range(k):
            cond = ["true"]
            if edges[i] is not None:
                cond.append(f"epoch_us({tcol}) > {edges[i]}")
            if edges[i + 1] is not None:
                cond.append(f"epoch_us({tcol}) <= {edges[i + 1]}")
            con.execute(f"UPDATE ce2 SET _part = {i} WHERE {' AND '.join(cond)}")
        if late_every and k > 2:
            con.execute(f"UPDATE ce2 SET _part = {min(3, k - 1)} WHERE _part = 1 AND _rn % {int(late_every)} = 0")
        paths = []
        for i in range(k):
            p = parts_dir / f"{stem}_part{i:03d}.parquet"
            con.execute(f"COPY (SELECT * EXCLUDE (_rn, _part) FROM ce2 WHERE _part = {i} ORDER BY _rn) TO '{p}' "
                        "(FORMAT parquet)")
            paths.append(p)
        return paths
    finally:
        con.close()


__all__ = ["make_replay"]
