"""The frozen standardisation of a streaming warehouse is taken over the hours that are closed
when it is created, not over the batch build's forward fill to outtime (issue 13, long stays)."""
from __future__ import annotations

import shutil

import duckdb
import numpy as np

from cohort.constants import VITALS


def _moments(con, where: str = "") -> dict:
    out = {}
    for v in VITALS:
        x = np.asarray([r[0] for r in con.execute(f"SELECT {v} FROM vitals_hourly {where}").fetchall()])
        out[v] = (float(x.mean()), float(x.std(ddof=1)))
    return out


def test_frozen_moments_are_those_of_the_closed_hours(tmp_path):
    from test_ingest_long import long_stay_root

    from pipelines.ingest import ingest

    root, parts = long_stay_root(tmp_path, 800, 4)
    shutil.copy(parts[0], root / "icu" / parts[0].name)
    wh = tmp_path / "s.duckdb"
    r = ingest(wh, "mimic", root, init=True)
    assert 150 < r["n_tokens"] < 250  # the first quarter of the stay is closed
    con = duckdb.connect(str(wh), read_only=True)
    try:
        fz = {v: (m, s) for v, m, s in con.execute("SELECT vital, mean, sd FROM standardisation").fetchall()}
        emitted = _moments(con)  # the hours the first step emitted (the stay's closed hours)
    finally:
        con.close()
    for v in VITALS:
        assert abs(fz[v][0] - emitted[v][0]) <= 1e-9 * max(1.0, abs(emitted[v][0])), v
        assert abs(fz[v][1] - emitted[v][1]) <= 1e-9 * emitted[v][1], v


def test_closed_moments_equal_the_batch_build_when_every_hour_is_closed(tmp_path):
    """With every hour closed the moments are the batch build's own; with the source's own
    watermark (its last row lies inside the last hour) the open last hour is left out."""
    from test_ingest_long import long_stay_root

    from cohort.build import build_warehouse
    from cohort.incremental.frozen import closed_moments, frozen_from_batch

    root, parts = long_stay_root(tmp_path, 300, 1)
    shutil.copy(parts[0], root / "icu" / "chartevents.parquet")
    build_warehouse("mimic", root, tmp_path / "b.duckdb", progress=False, fill="causal")
    con = duckdb.connect(str(tmp_path / "b.duckdb"), read_only=True)
    try:
        ref = {v: (m, s, md) for v, m, s, md in con.execute("SELECT vital, mean, sd, median FROM standardisation")
               .fetchall()}
        allc = closed_moments(con, 1 << 62)
        open_last = _moments(con, "WHERE hour < 299")
    finally:
        con.close()
    fz = frozen_from_batch("mimic", root, tmp_path / "scratch", 48, 0, None)
    for v in VITALS:
        assert np.allclose(allc[v], ref[v][:2], rtol=1e-12, atol=0), v
        assert np.allclose([fz[v]["mean"], fz[v]["sd"]], open_last[v], rtol=1e-12, atol=0), v
        assert fz[v]["median"] == ref[v][2]
