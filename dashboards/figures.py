"""Figure specs (SCHEMA.md) -> PNG bytes, with matplotlib's Agg canvas.

Figures are drawn on a :class:`matplotlib.figure.Figure` attached to a ``FigureCanvasAgg``
directly (no pyplot global state, no GUI backend). Seed figures use a muted palette so that a
reader never mistakes the published comparator for this run's result.
"""
from __future__ import annotations

import base64
import io
import textwrap
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless; harmless if already selected

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

__all__ = ["draw_figure", "render_png", "png_data_uri", "wrap_title"]

RUN_COLORS = ["#1f6fb2", "#d9822b", "#3a9d5d", "#b23a48", "#7b5ea7", "#5c6b73", "#c2a83e"]
SEED_COLORS = ["#8c8c8c", "#b0b0b0", "#6e6e6e", "#a3a3a3", "#7d7d7d", "#c4c4c4", "#5a5a5a"]


def wrap_title(title: str, width_in: float, fontsize: float = 10.0) -> str:
    """``title`` broken into lines that fit a figure ``width_in`` inches wide (never clipped)."""
    per_line = max(12, int(width_in * 72 * 0.85 / (0.6 * fontsize)))  # glyph ≈ 0.6 em; axes ≈ 85 % of the width
    return "\n".join(textwrap.wrap(title, per_line, break_long_words=True)) if title else ""


def draw_figure(spec: Mapping[str, Any], *, seed: bool = False, width_in: float = 5.0, height_in: float = 3.2,
                dpi: int = 100) -> Figure:
    """Draw one validated figure spec on a new Agg-backed :class:`~matplotlib.figure.Figure`.

    Parameters
    ----------
    spec : mapping
        A figure spec that passed :func:`dashboards.schema.validate_result`.
    seed : bool
        Draw in the muted seed palette, marked "seed 001" in the bottom-right corner.
    """
    fig = Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = SEED_COLORS if seed else RUN_COLORS
    kind = spec["kind"]
    if kind == "bar":
        _bar(ax, spec, colors)
    elif kind == "line":
        _line(ax, spec, colors)
    elif kind == "funnel":
        _funnel(ax, spec, colors)
    elif kind == "histogram":
        _histogram(ax, spec, colors)
    else:  # validated upstream; keep a clear message for direct callers
        raise ValueError(f"unknown figure kind {kind!r}")
    ax.set_title(wrap_title(spec.get("title", ""), width_in), fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if seed:  # outside the axes: never on top of a bar or a curve
        fig.text(0.995, 0.005, "seed 001", ha="right", va="bottom", fontsize=7.5, color="#777777", style="italic")
    return fig


def render_png(spec: Mapping[str, Any], *, seed: bool = False, width_in: float = 5.0, height_in: float = 3.2,
               dpi: int = 100) -> bytes:
    """Draw one validated figure spec (:func:`draw_figure`) and return PNG bytes."""
    fig = draw_figure(spec, seed=seed, width_in=width_in, height_in=height_in, dpi=dpi)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for inline embedding."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _bar(ax, spec, colors) -> None:
    cats = list(spec["categories"])
    vals = [float(v) for v in spec["values"]]
    x = list(range(len(cats)))
    yerr = None
    if "ci_low" in spec:
        lo = [max(0.0, v - float(a)) for v, a in zip(vals, spec["ci_low"])]
        hi = [max(0.0, float(b) - v) for v, b in zip(vals, spec["ci_high"])]
        yerr = [lo, hi]
    ax.bar(x, vals, color=[colors[i % len(colors)] for i in x], yerr=yerr, capsize=4 if yerr else 0,
           error_kw={"elinewidth": 1.2, "ecolor": "#222222"})
    # long or many labels: rotate further and anchor each at its bar's right edge so they never overlap
    crowd = max(len(c) for c in cats) * len(cats)
    if crowd > 60:
        ax.set_xticks(x, cats, fontsize=7 if crowd > 150 else 8, rotation=55, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticks(x, cats, fontsize=8, rotation=20 if max(len(c) for c in cats) > 9 else 0)
    if spec.get("log_y"):
        ax.set_yscale("log")
    if "reference_line" in spec:
        ax.axhline(float(spec["reference_line"]), color="#444444", lw=0.8, ls="--")
    ax.set_ylabel(spec.get("ylabel", ""), fontsize=9)
    if not spec.get("log_y"):
        tops = [float(b) for b in spec["ci_high"]] if "ci_high" in spec else vals
        tops = [max(v, t) for v, t in zip(vals, tops)]
        for xi, v, t in zip(x, vals, tops):  # label above the bar and its error bar
            ax.annotate(f"{v:.3g}", (xi, t), textcoords="offset points", xytext=(0, 3), ha="center",
                        fontsize=7, color="#333333")
        lows = [min(v, float(a)) for v, a in zip(vals, spec["ci_low"])] if "ci_low" in spec else vals
        lo, hi = min(0.0, min(lows) * 1.15), max(0.0, max(tops) * 1.15)
        if hi > lo:
            ax.set_ylim(lo, hi)


def _line(ax, spec, colors) -> None:
    for i, s in enumerate(spec["series"]):
        style = s.get("style", "line")
        marker = "o" if style in ("markers", "both") else None
        ls = "none" if style == "markers" else "-"
        ax.plot(s["x"], s["y"], label=s["label"], color=colors[i % len(colors)], marker=marker, ls=ls,
                ms=3.5, lw=1.5)
    if spec.get("diagonal"):
        ax.plot([0, 1], [0, 1], color="#999999", lw=0.8, ls="--")
    if spec.get("log_x"):
        ax.set_xscale("log")
    if spec.get("log_y"):
        ax.set_yscale("log")
    ax.set_xlabel(spec.get("xlabel", ""), fontsize=9)
    ax.set_ylabel(spec.get("ylabel", ""), fontsize=9)
    ax.legend(fontsize=7.5 if len(spec["series"]) > 3 else 8, frameon=False,
              loc="lower right" if spec.get("diagonal") else "best")


def _funnel(ax, spec, colors) -> None:
    stages = spec["stages"]
    labels = [st["label"] for st in stages][::-1]
    counts = [float(st["count"]) for st in stages][::-1]
    y = list(range(len(stages)))
    ax.barh(y, counts, color=colors[0], height=0.6)
    ax.set_yticks(y, labels, fontsize=8)
    top = max(counts) if max(counts) > 0 else 1.0
    for yi, c in zip(y, counts):
        ax.text(c + 0.01 * top, yi, f"{int(c):,}" if float(c).is_integer() else f"{c:.3g}", va="center",
                fontsize=8)
    ax.set_xlim(0, top * 1.18)
    ax.set_xlabel(spec.get("xlabel", "count"), fontsize=9)


def _histogram(ax, spec, colors) -> None:
    edges = [float(e) for e in spec["bin_edges"]]
    counts = [float(c) for c in spec["counts"]]
    widths = [b - a for a, b in zip(edges, edges[1:])]
    ax.bar(edges[:-1], counts, width=widths, align="edge", color=colors[0], edgecolor="white", lw=0.5)
    if spec.get("log_x"):
        ax.set_xscale("log")
    ax.set_xlabel(spec.get("xlabel", ""), fontsize=9)
    ax.set_ylabel(spec.get("ylabel", "count"), fontsize=9)
