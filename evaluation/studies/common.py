"""Small helpers shared by the studies: parameter checks, summaries and the result envelope."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from evaluation.studies.errors import StudyConfigError


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """Validate an integer parameter in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise StudyConfigError(f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise StudyConfigError(f"{name} must be {rng}, got {value}")
    return int(value)


def check_pos(name: str, value: Any, upper: float | None = None) -> float:
    """Validate a finite positive float (optionally ``<= upper``)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise StudyConfigError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0 or (upper is not None and v > upper):
        bound = f" and <= {upper}" if upper is not None else ""
        raise StudyConfigError(f"{name} must be finite and > 0{bound}, got {value!r}")
    return v


def mean_ci(x: Iterable[float], z: float = 1.96) -> dict:
    """Mean with a normal-approximation 95 % interval over trials: ``{mean, low, high, n}``."""
    a = np.asarray(list(x), dtype=np.float64)
    if a.size == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    m = float(a.mean())
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else 0.0
    return {"mean": m, "low": m - z * se, "high": m + z * se, "n": int(a.size)}


def envelope(study: str, title: str, *, runtime_s: float, metrics: dict, config: dict,
             tables: list | None = None, figures: list | None = None, claims: list | None = None,
             notes: str = "", data: str = "synthetic", receipts: dict | None = None,
             tolerances: dict | None = None) -> dict:
    """Result dict in the ``dashboards/SCHEMA.md`` layout (``seed_figure`` left to the built-in);
    ``tolerances``: figures that may move on another machine (:func:`evaluation.claims.tolerance`)."""
    out = {
        "study": study,
        "title": title,
        "data": data,
        "runtime_s": float(runtime_s),
        "seed_figure": {},
        "metrics": metrics,
        "tables": tables or [],
        "figures": figures or [],
        "claims": claims or [],
        "config": config,
        "notes": notes,
        "schema_version": 1,
    }
    if receipts is not None:
        out["receipts"] = receipts
    if tolerances:
        out["tolerances"] = tolerances
    return out


def finite(x: float | None) -> float | None:
    """JSON-safe number: ``None`` for NaN/inf."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def paired_vs_sv(per_unit: dict, *, metric: str, unit: str = "trial", ref: str = "sv", n_boot: int = 10_000,
                 seed: int = 0, level: float = 0.95) -> dict:
    """Paired bootstrap differences ``ref − policy`` over units (trials/stays), for every policy.

    ``per_unit`` maps policy -> per-unit values aligned across policies (NaN marks a unit where the
    metric is undefined; a pair uses the units finite for both). Every pair is resampled with the
    same seed, so all comparisons with the same units use the same resampled units
    (:func:`evaluation.metrics.paired_bootstrap_ci`, percentile interval).

    Returns ``{"metric", "unit", "level", "n_boot", "diffs": {policy: {"mean", "low", "high",
    "n_units"}}, "peer_beats_sv": [policies whose interval lies entirely above SV]}``.
    """
    from evaluation.metrics import paired_bootstrap_cis

    a_all = np.asarray(per_unit[ref], dtype=np.float64)
    diffs: dict[str, dict[str, Any]] = {}
    pairs: dict[int, list] = {}
    for pol, vals in per_unit.items():
        if pol == ref:
            continue
        b_all = np.asarray(vals, dtype=np.float64)
        ok = np.isfinite(a_all) & np.isfinite(b_all)
        diffs[pol] = {"mean": None, "low": None, "high": None, "n_units": int(ok.sum())}
        if ok.any():  # pairs over the same number of units share one resample draw (bit-identical)
            pairs.setdefault(int(ok.sum()), []).append((pol, a_all[ok], b_all[ok]))
    for group in pairs.values():
        for (pol, _, _), ci in zip(group, paired_bootstrap_cis([(a, b) for _, a, b in group], n_boot, seed, level)):
            diffs[pol].update(mean=ci.mean_diff, low=ci.low, high=ci.high)
    beats = [pol for pol, d in diffs.items() if d["high"] is not None and d["high"] < 0]
    return {"metric": metric, "unit": unit, "level": level, "n_boot": n_boot, "diffs": diffs, "peer_beats_sv": beats}


def vs_sv_table(title: str, vs: dict, offers: dict | None = None) -> dict:
    """A result table of :func:`paired_vs_sv` (one row per policy); ``offers`` maps a policy to what
    it certifies (SV's certificate / exact deletion; peers: none)."""
    offers = offers or {}
    rows = [["sv (reference)", None, None, None, None, offers.get("sv", "")]]
    rows += [[p, d["mean"], d["low"], d["high"], p in vs["peer_beats_sv"], offers.get(p, "none")]
             for p, d in vs["diffs"].items()]
    return {"title": f"{title}: SV − policy ({vs['metric']}), paired bootstrap over {vs['unit']}s "
                     f"({int(vs['level'] * 100)} % CI)",
            "columns": ["policy", "SV − policy", "ci low", "ci high", "beats SV", "certifies"], "rows": rows}
