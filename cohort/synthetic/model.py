"""The synthetic generator's model and its parameters (what :mod:`cohort.synthetic.gen` draws from).

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

The parameters are a small JSON of aggregates (:func:`load_params`; committed default
``cohort/synthetic/synthetic_params.json``), estimated by :mod:`cohort.synthetic.calibration`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.signal import lfilter
from scipy.special import ndtr, ndtri

from cohort.constants import VITALS

DEFAULT_PARAMS = Path(__file__).with_name("synthetic_params.json")
#: Long-stay tail beyond the last calibrated LOS quantile (the demo's 169 stays say nothing
#: about it): Pareto, P(L > x | L > q) = (x/q)^-alpha, cut at LOS_MAX_HOURS. Full MIMIC-IV has
#: stays up to ~10,000 h among ≈ 42,000 stays of ≥ 48 h (SPEC §3b); alpha = 2.3 makes about one
#: such stay reach the cut (5 % of long stays pass the last quantile q ≈ 362 h, and
#: 0.05 · (10,000/362)^-2.3 · 42,000 ≈ 1). Assumption, not a fit.
LOS_TAIL_ALPHA = 2.3
LOS_MAX_HOURS = 10_000.0


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
