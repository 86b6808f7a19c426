"""A 10,000-hour stay streams through the incremental ingest in bounded time and memory.

The full run is slow-marked; a 1,200-hour version runs in the default suite. The figures
(per-increment seconds, hot/cold/live sizes, RSS, the full-history certificate and a sampled
batch-refit check) come from::

    python tests/test_ingest_long.py --hours 10000 --parts 20 --dir /tmp/long --json runs/ingest_long.json

Sampled refit check: the streamed optimum is supported on the hot tier and satisfies KKT over
every live key, so it is also the (unique-score) optimum over hot ∪ any subset of the cold tier;
an independent :func:`sv_core.refit` over hot ∪ a random cold sample must give the same scores.
"""
from __future__ import annotations

import json
import resource
import shutil
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest

ITEMS = {"hr": (220045, 80, 8), "sbp": (220179, 120, 10), "dbp": (220180, 65, 7), "rr": (220210, 18, 3),
         "spo2": (220277, 96, 1.5), "temp_c": (223762, 37, 0.3)}


def long_stay_root(d: Path, hours: int, parts: int, seed: int = 0) -> tuple[Path, list[Path]]:
    """One ICU stay of ``hours`` hours (hourly vitals as a slow random walk with rare
    excursions) in MIMIC layout; chartevents split by charttime into ``parts`` files (returned)."""
    from cohort.synthetic import generate

    tmp = d / "tiny"
    generate(tmp, stays=2, seed=seed, fmt="parquet")
    root = d / "root"
    (root / "icu").mkdir(parents=True)
    (root / "hosp").mkdir()
    for rel in ("icu/d_items.parquet", "hosp/patients.parquet", "hosp/admissions.parquet", "synthetic_manifest.json"):
        if (tmp / rel).is_file():  # the manifest marks the root as synthetic data (results say so)
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


def _rss_mb() -> float:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # pragma: no cover - not Linux
        return float("nan")


def sampled_refit_check(sg, n_cold: int, seed: int = 0) -> dict:
    """Max |score difference| between the streamed gate and an independent refit over the hot
    tier plus ``n_cold`` random cold keys, probed at every key of that set (and α on the hot tier)."""
    from sv_core import refit

    keys, ids = sg.keys, sg.ids
    hot = np.isin(ids, sg.hot_ids)
    cold_idx = np.flatnonzero(~hot)
    rng = np.random.default_rng(seed)
    pick = np.sort(np.concatenate([np.flatnonzero(hot),
                                   rng.choice(cold_idx, min(n_cold, cold_idx.size), replace=False)]))
    X = keys[pick]
    a, rho = refit(X, C=sg.C, sigma=sg.sigma)
    from sv_core.kernels import rbf_kernel

    s_ref = 2.0 * rbf_kernel(X, X, sg.sigma) @ a - rho
    d_score = float(np.abs(sg.score(X) - s_ref).max())
    d_alpha = float(np.abs(sg.alpha[pick] - a).max())
    return {"n_refit": int(pick.size), "max_abs_score_dev": d_score, "max_abs_alpha_dev": d_alpha}


def run(hours: int, parts: int, d: Path, n_cold_sample: int = 1500) -> dict:
    from pipelines.ingest import ingest
    from pipelines.ingest import state as st
    from pipelines.store.keys import Keys

    root, ps = long_stay_root(d, hours, parts)
    wh = d / "s.duckdb"
    series = []
    for i, p in enumerate(ps):
        shutil.copy(p, root / "icu" / p.name)
        t, c = time.perf_counter(), time.process_time()
        r = ingest(wh, "mimic", root, init=i == 0, final=i == len(ps) - 1)
        series.append({"increment": i + 1, "hours": r["n_tokens"], "seconds": round(time.perf_counter() - t, 3),
                       "cpu_s": round(time.process_time() - c, 3),  # all threads; robust to shared cores
                       "n_hot": r["n_hot"], "n_cold": r["n_cold"], "readmissions": r["readmissions"],
                       "rss_mb": round(_rss_mb(), 1),
                       "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})
    con = duckdb.connect(str(wh), read_only=True)
    toks = st.load_tokens(con, [1])[1]
    frozen = {v: (m, s) for v, m, s in con.execute("SELECT vital, mean, sd FROM standardisation").fetchall()}
    sg = st.load_gate(con, Keys.load(), 1, int(con.execute("SELECT subject_id FROM cohort_stays").fetchone()[0]),
                      {h: t for h, (t, _) in toks.items()})
    con.close()
    cert = sg.certificate(exact=True)
    chk = sampled_refit_check(sg, n_cold_sample)
    secs = [s["seconds"] for s in series[1:]]
    return {"hours": hours, "parts": parts, "n_live": sg.n, "n_hot": sg.n_hot, "n_cold": sg.n_cold,
            "max_hot": max(s["n_hot"] for s in series), "hot_fraction": sg.n_hot / sg.n,
            "future_safe": cert["future_safe"], "kkt_max": cert["kkt_residual"]["max"],
            "readmissions": cert["readmissions"], "fraction_screened": cert["screening"]["fraction_screened"],
            "hot_partition": cert["hot_partition"], "refit_check": chk,
            "seconds_per_increment_max": max(secs), "seconds_per_increment_median": float(np.median(secs)),
            "cpu_s_per_increment_max": max(s["cpu_s"] for s in series[1:]),
            "cpu_s_per_increment_median": float(np.median([s["cpu_s"] for s in series[1:]])),
            "seconds_total": round(sum(s["seconds"] for s in series), 2),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "frozen_sd": {v: round(s, 4) for v, (m, s) in frozen.items()}, "series": series}


def _check(r: dict, hours: int) -> None:
    assert r["n_live"] == hours and r["future_safe"], r
    assert r["kkt_max"] <= 1e-9
    assert r["refit_check"]["max_abs_score_dev"] <= 1e-9, r["refit_check"]
    # the hot tier is the margin set of the full-history optimum: a small share of the stay
    assert r["hot_fraction"] < 0.2, r["hot_fraction"]


def test_long_stay_quick(tmp_path):
    """1,200 hours in 4 increments (default suite)."""
    r = run(1200, 4, tmp_path, n_cold_sample=300)
    _check(r, 1200)


@pytest.mark.slow
def test_long_stay_bounded_memory(tmp_path):
    r = run(10_000, 20, tmp_path)
    _check(r, 10_000)
    assert r["peak_rss_mb"] < 1500, r


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="long-stay streaming ingest figures (JSON)")
    ap.add_argument("--hours", type=int, default=10_000)
    ap.add_argument("--parts", type=int, default=20)
    ap.add_argument("--dir", required=True, help="scratch folder (emptied)")
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    Path(a.dir).mkdir(parents=True)
    out = run(a.hours, a.parts, Path(a.dir))
    txt = json.dumps(out, indent=1)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(txt + "\n")
    print(txt)
