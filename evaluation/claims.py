"""Claims that hold only on intervals: the one builder every study's result ``claims`` use.

A claim states the paper's figure, this run's figure with its interval, the peer it is measured
against (and the strongest peer, where another one does better), the decision rule and a status
in :data:`STATUSES`:

* ``"holds"`` — the rule is met *on the interval* (a paired bootstrap / cluster bootstrap / t
  interval of the difference excludes the peer, or a range over every unit lies past a bound); a
  point gap never suffices;
* ``"does not hold"`` — the rule is not met (the reason quotes the interval);
* ``"not run at the paper's protocol"`` — the run departs from the protocol the paper's figure
  rests on (fewer trials or seeds, a shorter training budget); the reason says how, and what the
  interval showed.

``holds`` (the legacy boolean) is ``status == "holds"``. A claim resting on few units (stays,
contexts, seeds, questions) carries ``low_power`` with its ``n`` whatever its status. The layout is
validated by ``dashboards.schema.Claim`` (dashboards/SCHEMA.md, "Claims").

Residuals at fp64 rounding level print as the bound they lie below (:func:`bounded`: ``"< 1e-12"``),
never as digits that depend on BLAS summation order; :func:`tolerance` states how far a figure that
legitimately varies across machines may move, for ``dashboards.reproduce --check`` to enforce.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

STATUSES = ("holds", "does not hold", "not run at the paper's protocol")
#: a residual below this prints as ``"< 1e-12"`` (the bound the project documents for its certificates)
RESIDUAL_BOUND = 1e-12
LEVEL = 0.95


def bounded(x: float | None, bound: float = RESIDUAL_BOUND) -> float | str | None:
    """A residual as printed: ``"< 1e-12"`` below ``bound`` (its digits are rounding noise that moves
    with BLAS order and thread count), else the number itself (exact zeros stay 0)."""
    if x is None or not math.isfinite(float(x)):
        return None
    x = float(x)
    if x == 0.0:
        return 0.0
    return f"< {bound:.0e}" if abs(x) < bound else x


def bounded_text(x: float | None, bound: float = RESIDUAL_BOUND) -> str:
    """:func:`bounded` inside a sentence: ``"< 1e-12"`` or the number at 2 significant digits."""
    b = bounded(x, bound)
    return "–" if b is None else b if isinstance(b, str) else f"{b:.1e}"


def tolerance(why: str, *, abs: float | None = None, rel: float | None = None, decades: float | None = None,
              bound: float | None = None) -> dict[str, Any]:
    """How far a printed figure may move on another machine (for ``reproduce --check``): ``abs`` /
    ``rel`` difference, ``decades`` (|Δ log10|), or ``bound`` (any two values below it agree), with why."""
    out: dict[str, Any] = {k: float(v) for k, v in (("abs", abs), ("rel", rel), ("decades", decades),
                                                    ("bound", bound)) if v is not None}
    if not out:
        raise ValueError("a tolerance needs abs, rel, decades or bound")
    out["why"] = str(why)
    return out


def interval(value: Any, low: float | None = None, high: float | None = None, *, how: str,
             n: int | None = None) -> dict[str, Any]:
    """A figure with its interval: ``{"value", "low", "high", "interval": how, "n"}`` (``how`` says
    what the interval is, e.g. "95 % paired bootstrap over 60 trials", "range over 69 stays")."""
    out: dict[str, Any] = {"value": _num(value), "low": _num(low), "high": _num(high), "interval": str(how)}
    if n is not None:
        out["n"] = int(n)
    return out


def ci(d: Mapping[str, Any] | None, *, how: str, n: int | None = None, value_key: str = "mean") -> dict[str, Any]:
    """:func:`interval` from a ``{"mean"/"mean_diff", "low", "high"}`` mapping (``None`` -> empty)."""
    d = d or {}
    v = d.get(value_key, d.get("mean_diff", d.get("value")))
    return interval(v, d.get("low"), d.get("high"), how=how, n=n if n is not None else d.get("n", d.get("n_units")))


def proportion(k: int, n: int, level: float = LEVEL) -> dict[str, Any]:
    """``k`` of ``n`` as a fraction with its exact (Clopper–Pearson) interval."""
    from scipy.stats import binomtest

    if n <= 0:
        return interval(None, how="no units")
    c = binomtest(int(k), int(n)).proportion_ci(level, method="exact")
    return interval(k / n, c.low, c.high, how=f"{int(level * 100)} % Clopper–Pearson over {n:,}", n=n)


def low_power(n: int, minimum: int, unit: str, label: str = "") -> dict[str, Any]:
    """``{"flag", "n", "minimum", "unit", "label"}``: ``flag`` when ``n < minimum``."""
    flag = int(n) < int(minimum)
    return {"flag": bool(flag), "n": int(n), "minimum": int(minimum), "unit": str(unit),
            "label": (label or f"low power: {int(n):,} {unit} (fewer than {int(minimum):,})") if flag else ""}


def _num(x: Any) -> Any:
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _txt(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "–"
    v, lo, hi = d.get("value"), d.get("low"), d.get("high")

    def f(x: Any) -> str:  # residuals print as their bound: the reason text is machine-independent
        b = bounded(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x
        return b if isinstance(b, str) else "–" if b is None else f"{b:.3g}"

    return f"{f(v)} [{f(lo)}, {f(hi)}]" if lo is not None or hi is not None else f(v)


def claim(statement: str, *, reference: str, path: str, rule: str, passed: bool | None,
          run: Mapping[str, Any], paper: Mapping[str, Any] | None = None, peer: Mapping[str, Any] | None = None,
          difference: Mapping[str, Any] | None = None, strongest_peer: Mapping[str, Any] | None = None,
          operation: str | None = None, value: Any = None, off_protocol: str | None = None,
          power: Mapping[str, Any] | None = None, notes: str = "", fragile: str | None = None) -> dict[str, Any]:
    """One result claim (see the module doc).

    Parameters
    ----------
    rule : the decision rule on the interval, e.g. "95 % paired bootstrap interval of SV − H2O above 0".
    passed : whether ``rule`` is met on this run's interval (``None``: it could not be evaluated).
    run : this run's figure, :func:`interval`.
    paper : ``{"figure": str, "source": str, "values": {...}}``, or ``None`` for a claim of this
        project's beyond the paper (stated as such).
    peer, strongest_peer : ``{"name", "value", "low", "high"}``; ``difference``: the interval the
        rule reads (``run − peer``), :func:`interval`.
    off_protocol : why the run is not at the paper's protocol (status "not run at the paper's protocol").
    power : :func:`low_power`.
    fragile : why the status may differ on another machine (the deciding end of the interval lies within
        the figure's stated tolerance of the threshold); sets ``status_stable: false``.
    """
    if difference:
        evidence = _txt(difference) + (f" (peer: {peer['name']})" if peer else "")
    else:
        evidence = _txt(run) + (f" vs {peer['name']} {_txt(peer)}" if peer else "")
    if off_protocol:
        status = STATUSES[2]
        met = "met" if passed else ("not evaluable" if passed is None else "not met")
        reason = f"{off_protocol}; on this run the rule ({rule}) is {met}: {evidence}"
    elif passed:
        status, reason = STATUSES[0], f"{rule}: {evidence}"
    else:
        status = STATUSES[1]
        reason = f"{rule} — not met: {evidence}" if passed is not None else f"{rule} — not evaluable on this run"
    if power and power.get("flag"):
        reason += f" ({power['label']})"
    if fragile:
        reason += f"; the status may differ on another machine: {fragile}"
    out: dict[str, Any] = {
        "statement": statement, "reference": reference, "path": path,
        "value": value if value is not None else run.get("value"),
        "holds": status == STATUSES[0], "status": status, "reason": reason, "rule": rule,
        "paper": dict(paper) if paper else {"figure": None, "source": "none: a claim of this project's beyond the "
                                                                     "paper"},
        "run": dict(run), "peer": dict(peer) if peer else None,
    }
    if difference is not None:
        out["difference"] = dict(difference)
    if strongest_peer is not None:
        out["strongest_peer"] = dict(strongest_peer)
    if operation:
        out["operation"] = operation
    if power is not None:
        out["low_power"] = dict(power)
    if notes:
        out["notes"] = notes
    if fragile:
        out["status_stable"] = False
    return out


def peer_fig(name: str, d: Mapping[str, Any] | float | None) -> dict[str, Any]:
    """``{"name", "value", "low", "high"}`` of a peer from a mean-CI mapping or a bare number."""
    if isinstance(d, Mapping):
        return {"name": name, **{k: v for k, v in ci(d, how="").items() if k in ("value", "low", "high")}}
    return {"name": name, "value": _num(d), "low": None, "high": None}


def strongest(per_policy: Mapping[str, Mapping[str, Any]], exclude: tuple[str, ...] = ("sv",)) -> str | None:
    """The policy with the highest mean among ``per_policy`` (``{policy: {"mean", ...}}``), ties by name."""
    best = sorted((-v["mean"], p) for p, v in per_policy.items() if p not in exclude and v.get("mean") is not None)
    return best[0][1] if best else None


def weakest(diffs: Mapping[str, Mapping[str, Any]], names: tuple[str, ...] | list[str]) -> tuple[str, bool]:
    """Of ``SV − policy`` intervals (``{policy: {"low", ...}}``), the policy with the lowest lower bound
    (the one a "better than every peer" claim is decided on) and whether every interval lies above 0."""
    low = {p: diffs[p].get("low") for p in names}
    worst = min(names, key=lambda p: (low[p] if low[p] is not None else -math.inf, p))
    return worst, all(v is not None and v > 0 for v in low.values())
