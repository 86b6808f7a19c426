"""Report section for the streaming ingest (``study: "ingest"``, ``forgetful ingest``).

The ingest flow stores the warehouse's durable per-step series in ``metrics.stream_series``
(columnar lists, oldest first, at most the last 500 watermark steps; totals over *all* stays
after each step, never per stay or per record): ``step``, ``hours_admitted`` (live tokens),
``new_tokens``, ``n_hot``, ``n_cold``, ``readmissions`` (cumulative cold -> hot re-admissions),
``late_rows``, ``reopened_hours``, ``replaced_tokens``, ``certified_retention`` (hot / live).

:func:`stream_context` gives the report template (``templates/stream.html``) the hot and cold
tier sizes against the hours admitted, the re-admissions and late-row re-opens per step, and a
small table of sampled steps. A result written before the series existed (no ``stream_series``)
gets the run's totals and a note.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dashboards.figures import png_data_uri, render_png
from dashboards.templating import environment, fmt

__all__ = ["STUDY", "SERIES_FIELDS", "series_of", "stream_figures", "stream_table", "stream_context",
           "stream_section_html"]

STUDY = "ingest"
SERIES_FIELDS = ("step", "hours_admitted", "new_tokens", "n_hot", "n_cold", "readmissions", "late_rows",
                 "reopened_hours", "replaced_tokens", "certified_retention")
TABLE_ROWS = 12
_COLS = [("step", "step"), ("hours_admitted", "hours admitted"), ("n_hot", "hot"), ("n_cold", "cold"),
         ("certified_retention", "certified retention"), ("readmissions", "re-admissions (cum.)"),
         ("late_rows", "late rows"), ("reopened_hours", "re-opened hours")]


def series_of(payload: Mapping[str, Any]) -> dict[str, list] | None:
    """The per-step series as columns (None when absent, empty or ragged: an older result)."""
    s = (payload.get("metrics") or {}).get("stream_series")
    if not isinstance(s, Mapping) or not isinstance(s.get("step"), list) or not s["step"]:
        return None
    n = len(s["step"])
    cols = {k: list(s[k]) for k in SERIES_FIELDS if isinstance(s.get(k), list) and len(s[k]) == n}
    need = ("step", "hours_admitted", "n_hot", "n_cold")
    return cols if all(k in cols for k in need) else None


def stream_figures(s: Mapping[str, list]) -> list[dict]:
    """Line-figure specs (dashboards/SCHEMA.md): tier sizes vs hours admitted; re-admissions per
    step; late rows and the hours they re-opened per step."""
    x = [float(v) for v in s["hours_admitted"]]
    figs = [{"kind": "line", "title": "hot and cold tiers over the replay", "xlabel": "hours admitted (live tokens)",
             "ylabel": "tokens (all stays)",
             "series": [{"label": "live", "x": x, "y": x, "style": "line"},
                        {"label": "hot (margin + error sets)", "x": x, "y": [float(v) for v in s["n_hot"]],
                         "style": "both" if len(x) <= 40 else "line"},
                        {"label": "cold (certified inert)", "x": x, "y": [float(v) for v in s["n_cold"]],
                         "style": "both" if len(x) <= 40 else "line"}]}]
    steps = [float(v) for v in s["step"]]
    style = "both" if len(steps) <= 40 else "line"
    if "readmissions" in s:
        r = [float(v) for v in s["readmissions"]]
        ser = [{"label": "re-admissions (cold → hot)", "x": steps, "y": [b - a for a, b in zip([0.0] + r[:-1], r)],
                "style": style}]
        if "replaced_tokens" in s:
            ser.append({"label": "tokens replaced after late rows", "x": steps,
                        "y": [float(v) for v in s["replaced_tokens"]], "style": style})
        figs.append({"kind": "line", "title": "re-admissions per watermark step", "xlabel": "watermark step",
                     "ylabel": "tokens per step", "series": ser})
    late = [{"label": lab, "x": steps, "y": [float(v) for v in s[k]], "style": style}
            for k, lab in (("late_rows", "late rows"), ("reopened_hours", "re-opened hours")) if k in s]
    if late and any(v for ser in late for v in ser["y"]):  # all-zero: said in words instead (see _one)
        figs.append({"kind": "line", "title": "late rows and re-opened hours per step", "xlabel": "watermark step",
                     "ylabel": "per step", "series": late})
    return figs


def stream_table(s: Mapping[str, list], max_rows: int = TABLE_ROWS) -> tuple[list[str], list[list]]:
    """Columns and rows of sampled steps (first, last and evenly spaced between)."""
    n = len(s["step"])
    idx = sorted({round(i * (n - 1) / (max_rows - 1)) for i in range(max_rows)}) if n > max_rows else list(range(n))
    cols = [(k, lab) for k, lab in _COLS if k in s]
    return [lab for _, lab in cols], [[s[k][i] for k, _ in cols] for i in idx]


def _figure(spec: Mapping[str, Any]) -> dict:
    return {"src": png_data_uri(render_png(spec, width_in=5.6, height_in=3.3)), "alt": spec.get("title", "figure")}


def _one(res: Any) -> dict:
    """Template values of one ingest result (LoadedResult or payload dict)."""
    p = res.payload if hasattr(res, "payload") else res
    m = p.get("metrics") or {}
    keys = [("n_stays", "stays"), ("n_tokens", "live tokens"), ("n_hot", "hot"), ("n_cold", "cold"),
            ("certified_retention", "certified retention"), ("readmissions", "re-admissions"),
            ("future_safe_stays", "future-safe stays"), ("gated_stays", "gated stays"),
            ("event_hour_retention_pooled", "event-hour retention (pooled)"), ("step", "watermark steps")]
    have = [(k, lab) for k, lab in keys if k in m]
    out: dict[str, Any] = {
        "title": p.get("title", "ingest"), "data": p.get("data", ""), "path": getattr(res, "path", ""),
        "runtime": fmt(float(p.get("runtime_s", 0.0))),
        "now": {"columns": [lab for _, lab in have], "rows": [[fmt(m[k]) for k, _ in have]]} if have else None,
        "figures": None, "no_late_rows": False, "steps": None, "n_steps": 0}
    s = series_of(p)
    if s is not None:
        figs = stream_figures(s)
        cols, rows = stream_table(s)
        out.update(figures=[_figure(f) for f in figs], no_late_rows=len(figs) < 3 and "late_rows" in s,
                   steps={"columns": cols, "rows": [[fmt(v) for v in r] for r in rows]}, n_steps=len(s["step"]))
    return out


def stream_context(results: Sequence[Any]) -> list[dict]:
    """The report template's values for the "Streaming ingest" section (empty: no section)."""
    return [_one(r) for r in results]


def stream_section_html(results: Sequence[Any]) -> str:
    """The "Streaming ingest" section for the given ingest results (LoadedResult or payload
    dicts), rendered alone from ``templates/stream.html``; an empty string when there are none."""
    if not results:
        return ""
    return environment().get_template("stream.html").render(stream=stream_context(results))
