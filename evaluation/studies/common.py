"""Small helpers shared by the studies: parameter checks, summaries and the result envelope."""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from .errors import StudyConfigError


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
             notes: str = "", data: str = "synthetic", receipts: dict | None = None) -> dict:
    """Result dict in the ``dashboards/SCHEMA.md`` layout (``seed_figure`` left to the built-in)."""
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
    return out


def finite(x: float | None) -> float | None:
    """JSON-safe number: ``None`` for NaN/inf."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None
