"""A 10,000-hour stay streams through the incremental ingest in bounded memory (slow).

``python tests/test_ingest_long.py HOURS PARTS DIR`` prints the figures as JSON (peak RSS,
per-increment seconds, hot/cold sizes, the full-history certificate)."""
from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest

ITEMS = {"hr": (220045, 80, 8), "sbp": (220179, 120, 10), "dbp": (220180, 65, 7), "rr": (220210, 18, 3),
         "spo2": (220277, 96, 1.5), "temp_c": (223762, 37, 0.3)}


def long_stay_root(d: Path, hours: int, parts: int, seed: int = 0) -> list[Path]:
    """One ICU stay of ``hours`` hours (hourly vitals as a slow random walk with rare
    excursions) in MIMIC layout; chartevents split by charttime into ``parts`` files (returned)."""
    from cohort.synthetic import generate

    tmp = d / "tiny"
    generate(tmp, stays=2, seed=seed, fmt="parquet")
    root = d / "root"
    (root / "icu").mkdir(parents=True)
    (root / "hosp").mkdir()
    for rel in ("icu/d_items.parquet", "hosp/patients.parquet", "hosp/admissions.parquet"):
        shutil.copy(tmp / rel, root / rel)
    con = duckdb.connect(":memory:")
    subj, hadm = con.execute(f"SELECT subject_id, hadm_id FROM '{tmp / 'hosp/admissions.parquet'}' LIMIT 1").fetchone()
    t0 = np.datetime64("2150-01-01T00:00:00", "us")
    out = t0 + np.timedelta64(hours * 3600, "s")
    con.execute(f"COPY (SELECT {subj}::BIGINT AS subject_id, {hadm}::BIGINT AS hadm_id, 1::BIGINT AS stay_id, "
                f"'MICU' AS first_careunit, 'MICU' AS last_careunit, TIMESTAMP '{t0}' AS intime, "
                f"TIMESTAMP '{out}' AS outtime, {hours / 24.0} AS los) TO '{root / 'icu/icustays.parquet'}' "
                "(FORMAT parquet)")
    rng = np.random.default_rng(seed)
    n = hours
    ts = t0 + (np.arange(n) * 3600 + rng.integers(60, 3000, n)).astype("timedelta64[s]")
    cols = {"subject_id": [], "hadm_id": [], "stay_id": [], "charttime": [], "itemid": [], "valuenum": []}
    for item, mu, sd in ITEMS.values():
        walk = np.cumsum(rng.normal(0, sd * 0.05, n))
        walk -= np.convolve(walk, np.ones(200) / 200, mode="same")
        x = mu + walk + rng.normal(0, sd * 0.3, n) + (rng.random(n) < 0.01) * rng.normal(0, 3 * sd, n)
        keep = rng.random(n) < 0.9
        cols["charttime"].append(ts[keep])
        cols["itemid"].append(np.full(keep.sum(), item))
        cols["valuenum"].append(x[keep])
    import pyarrow as pa

    ct = np.concatenate(cols["charttime"])
    order = np.argsort(ct, kind="stable")
    tab = pa.table({"subject_id": pa.array(np.full(ct.size, subj, np.int64)),
                    "hadm_id": pa.array(np.full(ct.size, hadm, np.int64)),
                    "stay_id": pa.array(np.ones(ct.size, np.int64)), "charttime": pa.array(ct[order]),
                    "itemid": pa.array(np.concatenate(cols["itemid"])[order].astype(np.int64)),
                    "valuenum": pa.array(np.concatenate(cols["valuenum"])[order])})
    edges = np.linspace(0, ct.size, parts + 1).astype(int)
    paths = []
    import pyarrow.parquet as pq

    (d / "parts").mkdir()
    for i in range(parts):
        p = d / "parts" / f"chartevents_part{i:03d}.parquet"
        pq.write_table(tab.slice(edges[i], edges[i + 1] - edges[i]), p)
        paths.append(p)
    return root, paths


def run(hours: int, parts: int, d: Path) -> dict:
    from pipelines import ingest_state as st
    from pipelines.ingest import ingest
    from pipelines.keys import Keys

    root, ps = long_stay_root(d, hours, parts)
    wh = d / "s.duckdb"
    secs, hot = [], []
    for i, p in enumerate(ps):
        shutil.copy(p, root / "icu" / p.name)
        t = time.perf_counter()
        r = ingest(wh, "mimic", root, init=i == 0, final=i == len(ps) - 1)
        secs.append(time.perf_counter() - t)
        hot.append(r["n_hot"])
    con = duckdb.connect(str(wh), read_only=True)
    toks = st.load_tokens(con, [1])[1]
    sg = st.load_gate(con, Keys.load(), 1, int(con.execute("SELECT subject_id FROM cohort_stays").fetchone()[0]),
                      {h: t for h, (t, _) in toks.items()})
    con.close()
    cert = sg.certificate(exact=True)
    return {"hours": hours, "parts": parts, "n_live": sg.n, "n_hot": sg.n_hot, "n_cold": sg.n_cold,
            "max_hot": max(hot), "future_safe": cert["future_safe"], "kkt_max": cert["kkt_residual"]["max"],
            "readmissions": cert["readmissions"], "seconds_per_increment_max": max(secs[1:]),
            "seconds_per_increment_median": float(np.median(secs[1:])), "seconds_total": sum(secs),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


@pytest.mark.slow
def test_long_stay_bounded_memory(tmp_path):
    r = run(10_000, 20, tmp_path)
    assert r["n_live"] == 10_000 and r["future_safe"]
    assert r["peak_rss_mb"] < 1500, r


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))))
