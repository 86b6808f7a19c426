"""Fidelity of a cohort's hourly streams: the statistics that tell a realistic ICU cohort from a
trivially separable one, computed identically on the real demo and on synthetic data.

Every statistic is read from a built warehouse (``vitals_hourly``, LOS ≥ 48 h cohort as built by
:func:`cohort.build.build_warehouse`), so synthetic data go through exactly the build the
studies use (definitions: :func:`fidelity_metrics`; bounds: :data:`DISTANCE_RATIO_BOUNDS`,
:data:`TRIVIAL_AUROC_MAX`, :data:`EVENT_SHARE_FACTOR`). Aggregates only; no record-level value
leaves this module.
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np

from cohort.constants import VITALS
from sv_core.jsonfile import write_json

#: Fidelity bounds the calibrated generator must meet (issue 11).
DISTANCE_RATIO_BOUNDS = (1.2, 2.3)
TRIVIAL_AUROC_MAX = 0.95
EVENT_SHARE_FACTOR = 2.0


def _auroc(score: np.ndarray, positive: np.ndarray) -> float:
    """Mann–Whitney AUROC with midranks for ties."""
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(s.size)
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    mid = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(mid, counts)
    n1 = int(positive.sum())
    n0 = positive.size - n1
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def _runs(flag: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lengths of maximal runs of True within each [start, end) segment."""
    out = []
    for a, b in zip(starts, ends):
        f = np.r_[False, flag[a:b], False].astype(np.int8)
        d = np.diff(f)
        up, down = np.nonzero(d == 1)[0], np.nonzero(d == -1)[0]
        out.append(down - up)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def load_hourly(warehouse: str | Path) -> dict[str, np.ndarray]:
    """The columns fidelity needs, ordered by (stay_id, hour)."""
    cols = (["stay_id"] + list(VITALS) + [f"{v}_z" for v in VITALS] + [f"{v}_observed" for v in VITALS]
            + ["event_composite", "event_spo2"])
    con = duckdb.connect(str(warehouse), read_only=True)
    try:
        d = con.execute(f"SELECT {', '.join(cols)} FROM vitals_hourly ORDER BY stay_id, hour").fetchnumpy()
    finally:
        con.close()
    return {k: np.asarray(v) for k, v in d.items()}


def fidelity_metrics(warehouse: str | Path) -> dict:
    """The fidelity statistics of one warehouse.

    ``event`` = ``event_composite`` unless stated; ``z`` = the warehouse's standardised
    ``<vital>_z`` columns, filled values:

    * ``event_hour_share``: share of all cohort hours that are event hours (also for ``event_spo2``).
    * ``stays_with_event``: share of stays with at least one event hour.
    * ``event_run_mean_h`` / ``event_run_median_h``: lengths of maximal runs of consecutive event hours.
    * ``within_sd.<vital>``: pooled within-stay SD of the *observed* raw hourly values (raw units):
      sqrt(Σ_stays Σ_hours (x − stay mean)² / Σ_stays (n − 1)).
    * ``lag1_acf.<vital>``: lag-1 autocorrelation of within-stay deviations (from the stay mean)
      over pairs of consecutive hours both observed, pooled over stays.
    * ``distance_ratio``: per stay with both event and non-event hours, the mean distance of its
      event hours from the stay median divided by the mean distance of its other hours, distance =
      Euclidean norm of ``z − median_stay(z)`` over the six vitals; median over those stays.
    * ``trivial_auroc``: per such stay, the AUROC of that distance as a score for event hours
      (ties count ½); median over those stays. A value near 1 means "far from the patient's own
      median" alone finds the events.
    * ``abs_change_corr``: mean pairwise correlation of |Δz| (hour-to-hour change, both hours
      observed) between HR, SBP, RR and SpO₂: whether large moves of different vitals coincide.
    * ``spo2_auroc_without_spo2``: the same detector for ``event_spo2`` hours with SpO₂ left out of
      the distance (the held-out-SpO₂ control): near 0.5 when desaturations do not drag HR/RR/BP
      along, near 1 when they do.
    """
    d = load_hourly(warehouse)
    sid = d["stay_id"].astype(np.int64)
    _, starts = np.unique(sid, return_index=True)
    ends = np.r_[starts[1:], sid.size]
    z = np.column_stack([d[f"{v}_z"].astype(float) for v in VITALS])
    out: dict = {"n_stays": int(starts.size), "n_hours": int(sid.size)}
    for lab, key in (("event_composite", ""), ("event_spo2", "spo2_")):
        ev = d[lab].astype(bool)
        runs = _runs(ev, starts, ends)
        out[f"{key}event_hour_share"] = float(ev.mean())
        out[f"{key}stays_with_event"] = float(np.mean([ev[a:b].any() for a, b in zip(starts, ends)]))
        out[f"{key}event_run_mean_h"] = float(runs.mean()) if runs.size else 0.0
        out[f"{key}event_run_median_h"] = float(np.median(runs)) if runs.size else 0.0
    ev = d["event_composite"].astype(bool)
    ratios, aucs = [], []
    for a, b in zip(starts, ends):
        e = ev[a:b]
        if not (0 < e.sum() < e.size):
            continue
        dist = np.linalg.norm(z[a:b] - np.median(z[a:b], axis=0), axis=1)
        other = dist[~e].mean()
        ratios.append(dist[e].mean() / other if other > 0 else np.inf)
        aucs.append(_auroc(dist, e))
    ev2 = d["event_spo2"].astype(bool)
    keep = [i for i, v in enumerate(VITALS) if v != "spo2"]
    aucs2 = []
    for a, b in zip(starts, ends):
        e = ev2[a:b]
        if 0 < e.sum() < e.size:
            zz = z[a:b][:, keep]
            aucs2.append(_auroc(np.linalg.norm(zz - np.median(zz, axis=0), axis=1), e))
    out["spo2_auroc_without_spo2"] = float(np.median(aucs2)) if aucs2 else float("nan")
    same = sid[1:] == sid[:-1]
    chg = {}
    for v in ("hr", "sbp", "rr", "spo2"):
        zv, ov = z[:, VITALS.index(v)], d[f"{v}_observed"].astype(bool)
        chg[v] = (np.abs(zv[1:] - zv[:-1]), ov[1:] & ov[:-1] & same)
    names = list(chg)
    cc = []
    for i in range(len(names)):
        for k in range(i + 1, len(names)):
            m = chg[names[i]][1] & chg[names[k]][1]
            if m.sum() > 2:
                cc.append(np.corrcoef(chg[names[i]][0][m], chg[names[k]][0][m])[0, 1])
    out["abs_change_corr"] = float(np.mean(cc)) if cc else float("nan")
    out["n_stays_mixed"] = len(ratios)
    out["distance_ratio"] = float(np.median(ratios)) if ratios else float("nan")
    out["trivial_auroc"] = float(np.median(aucs)) if aucs else float("nan")
    sd, acf = {}, {}
    for v in VITALS:
        x = d[v].astype(float)
        o = d[f"{v}_observed"].astype(bool)
        ss = dof = num = den = 0.0
        for a, b in zip(starts, ends):
            oo = o[a:b]
            if oo.sum() < 2:
                continue
            dev = np.where(oo, x[a:b] - x[a:b][oo].mean(), 0.0)
            ss += float((dev ** 2).sum())
            dof += oo.sum() - 1
            pair = oo[1:] & oo[:-1]
            num += float((dev[1:] * dev[:-1])[pair].sum())
            den += float(0.5 * ((dev[1:] ** 2)[pair].sum() + (dev[:-1] ** 2)[pair].sum()))
        sd[v] = float(np.sqrt(ss / dof)) if dof else float("nan")
        acf[v] = float(num / den) if den else float("nan")
    out["within_sd"] = sd
    out["lag1_acf"] = acf
    out["observed_share"] = {v: float(d[f"{v}_observed"].astype(bool).mean()) for v in VITALS}
    return out


def check_bounds(syn: dict, demo_event_share: float) -> list[str]:
    """Names of the issue-11 bounds a synthetic metrics dict violates (empty: all met)."""
    bad = []
    lo, hi = DISTANCE_RATIO_BOUNDS
    if not lo <= syn["distance_ratio"] <= hi:
        bad.append(f"distance_ratio {syn['distance_ratio']:.3f} not in [{lo}, {hi}]")
    if not syn["trivial_auroc"] <= TRIVIAL_AUROC_MAX:
        bad.append(f"trivial_auroc {syn['trivial_auroc']:.3f} > {TRIVIAL_AUROC_MAX}")
    r = syn["event_hour_share"] / demo_event_share if demo_event_share > 0 else float("inf")
    if not 1 / EVENT_SHARE_FACTOR <= r <= EVENT_SHARE_FACTOR:
        bad.append(f"event_hour_share {syn['event_hour_share']:.4f} not within {EVENT_SHARE_FACTOR}x of "
                   f"the demo's {demo_event_share:.4f}")
    return bad


def fidelity_rows(m: dict) -> list[tuple[str, float | None]]:
    rows = [(k, m.get(k)) for k in ("event_hour_share", "stays_with_event", "event_run_mean_h", "event_run_median_h",
                                "spo2_event_hour_share", "spo2_stays_with_event", "spo2_event_run_mean_h",
                                "distance_ratio", "trivial_auroc", "spo2_auroc_without_spo2", "abs_change_corr")]
    for group in ("within_sd", "lag1_acf", "observed_share"):
        rows += [(f"{group}.{v}", m.get(group, {}).get(v)) for v in VITALS]
    rows += [("n_stays", m.get("n_stays")), ("n_hours", m.get("n_hours"))]
    return rows


def format_table(columns: dict[str, dict | None]) -> str:
    """Plain-text table, one column per named metrics dict (None: not available)."""
    names = list(columns)
    first = next(m for m in columns.values() if m is not None)
    lines = ["metric".ljust(28) + "".join(n.rjust(16) for n in names)]
    for i, (k, _) in enumerate(fidelity_rows(first)):
        cells = []
        for n in names:
            m = columns[n]
            v = None if m is None else fidelity_rows(m)[i][1]
            cells.append("—".rjust(16) if v is None else (f"{v:16d}" if isinstance(v, int) else f"{v:16.4f}"))
        lines.append(k.ljust(28) + "".join(cells))
    return "\n".join(lines)


def synthetic_metrics(stays: int = 1500, seed: int = 0, params=None, short_stay_share: float | None = None,
                      workdir: str | Path | None = None, workers: int | None = 1) -> dict:
    """Generate ``stays`` synthetic stays in a temporary folder, build them with the unchanged
    :func:`cohort.build.build_warehouse` (LOS ≥ 48 h) and return their fidelity metrics.

    ``workers``: generator processes (default 1, in this process: a fidelity cohort is a few
    chunks, and forked workers would each start with a copy-on-write view of a caller that may
    hold gigabytes — a long pipeline's process — which their resident sets then count; the
    generated rows do not depend on it)."""
    import tempfile

    from cohort.build import build_warehouse
    from cohort.synthetic.gen import generate

    with tempfile.TemporaryDirectory(prefix="fidelity-", dir=workdir) as tmp:
        generate(Path(tmp) / "mimic", stays=stays, seed=seed, fmt="parquet", params=params,
                 short_stay_share=short_stay_share, workers=workers)
        b = build_warehouse("mimic", Path(tmp) / "mimic", Path(tmp) / "wh.duckdb", seed=seed, progress=False,
                            memory_limit="1GB")
        return fidelity_metrics(b.warehouse)


def demo_metrics(demo_root: str | Path | None = None, workdir: str | Path | None = None) -> dict:
    """Fidelity metrics of the real demo (raises DemoDataMissing when it has not been fetched)."""
    import tempfile

    from cohort.build import build_warehouse
    from cohort.demo_data import ensure_demo

    root = ensure_demo(demo_root)
    with tempfile.TemporaryDirectory(prefix="fidelity-demo-", dir=workdir) as tmp:
        b = build_warehouse("demo", root, Path(tmp) / "demo.duckdb", progress=False, memory_limit="1GB")
        return fidelity_metrics(b.warehouse)


def run_fidelity(stays: int = 1500, seed: int = 0, params=None, demo_root=None, json_path=None,
                 short_stay_share: float | None = None) -> int:
    """``python -m cohort.synthetic --fidelity``: print the table (and write JSON); exit 1 when a
    bound is violated. Without the demo, the demo column is the calibration's stored aggregate
    (``demo_reference`` in the parameters)."""
    import sys

    from cohort.errors import DemoDataMissing
    from cohort.synthetic.model import load_params

    prm = load_params(params)
    demo: dict | None
    try:
        demo, demo_from = demo_metrics(demo_root), "MIMIC-IV demo, built now"
    except DemoDataMissing:
        demo, demo_from = prm.get("demo_reference"), "MIMIC-IV demo, stored at calibration (demo not fetched)"
    syn = synthetic_metrics(stays, seed, prm, short_stay_share)
    bad = check_bounds(syn, demo["event_hour_share"]) if demo else ["no demo reference"]
    print(f"fidelity: synthetic ({stays} generated stays, seed {seed}) vs {demo_from}")
    print(format_table({"demo (real)": demo, "synthetic": syn}))
    lo, hi = DISTANCE_RATIO_BOUNDS
    print(f"bounds: distance_ratio in [{lo}, {hi}], trivial_auroc <= {TRIVIAL_AUROC_MAX}, "
          f"event_hour_share within {EVENT_SHARE_FACTOR:g}x of the demo's: "
          + ("all met" if not bad else "; ".join(bad)))
    if json_path:
        out = {"kind": "synthetic_fidelity", "source_kind": "synthetic", "demo_source": demo_from,
               "config": {"stays": stays, "seed": seed, "params": "default" if params is None else str(params),
                          "short_stay_share": short_stay_share, "model": prm.get("model")},
               "bounds": {"distance_ratio": list(DISTANCE_RATIO_BOUNDS), "trivial_auroc_max": TRIVIAL_AUROC_MAX,
                          "event_share_factor": EVENT_SHARE_FACTOR},
               "demo": demo, "synthetic": syn, "violations": bad}
        write_json(json_path, out, indent=1)
        print(f"wrote {json_path}", file=sys.stderr)
    return 1 if bad else 0
