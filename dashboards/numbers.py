"""How the project prints a number and a Markdown table: one formatter for the report, the generated
documents, the command summaries and the benchmark tables.

:func:`fmt` prints floats at 3 significant digits (the report asks for 4), or at fixed decimals
(:func:`fixed`, :func:`spread`: the benchmark documents), integers with separators; :func:`doc_fmt` is the same
for the checked documents, except that a residual at rounding level prints as the decade it lies
below (``< 1e-12``), since its digits depend on BLAS and summation order. :func:`md_table` is the
one Markdown table renderer.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["fmt", "fixed", "spread", "duration", "doc_fmt", "md_table", "RESIDUAL_BOUND", "RESIDUAL_CEILING"]

#: residuals below this print as ``< 1e-12``: the bound the certificates are documented against
RESIDUAL_BOUND = 1e-12
#: below this (and above RESIDUAL_BOUND) a figure prints as the decade it lies below
RESIDUAL_CEILING = 1e-6


def fmt(x: Any, digits: int = 3, *, decimals: int | None = None) -> str:
    """``digits`` significant digits for floats (exact zeros stay 0; below 1e-3 or from 1e5 in
    e-notation), or with ``decimals`` fixed decimals and separators (a whole number from 1,000 on
    without them); integers with thousands separators, ``–`` for None, lists in brackets, mappings
    as ``k v; …``; text with ``|`` escaped for a table cell."""
    if isinstance(x, bool) or x is None:
        return "–" if x is None else str(x).lower()
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if decimals is not None:
            return f"{int(x):,}" if x.is_integer() and abs(x) >= 1000 else f"{x:,.{decimals}f}"
        if x == 0:
            return "0"
        if abs(x) >= 1e5 or abs(x) < 1e-3:
            return f"{x:.{digits - 1}e}"
        return f"{x:.{digits}g}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v, digits, decimals=decimals) for v in x) + "]"
    if isinstance(x, Mapping):
        return "; ".join(f"{k} {fmt(v, digits, decimals=decimals)}" for k, v in x.items())
    return str(x).replace("|", "\\|").replace("\n", " ")


def fixed(x: Any, decimals: int = 1) -> str:
    """:func:`fmt` at ``decimals`` fixed decimals (the benchmark documents' figures)."""
    return fmt(x, decimals=decimals)


def spread(x: Mapping[str, Any], decimals: int = 1, unit: str = "") -> str:
    """A median with its range at fixed decimals, ``median{unit} (min–max)`` (keys ``median``,
    ``min``, ``max``): the benchmark tables' repeated measurements."""
    return f"{fixed(x['median'], decimals)}{unit} ({fixed(x['min'], decimals)}–{fixed(x['max'], decimals)})"


def duration(s: float | None) -> str:
    """Seconds as a command reports them: ``42 s`` below 90 s, else ``1.5 min``; ``–`` for None."""
    if s is None:
        return "–"
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


def doc_fmt(x: Any) -> str:
    """:func:`fmt`, except that a float with 0 < |x| < 1e-6 prints as the decade it lies below:
    ``< 1e-12`` for everything under :data:`RESIDUAL_BOUND`, else ``< 1e-k`` (8.4e-12 -> ``< 1e-11``)."""
    if isinstance(x, float) and math.isfinite(x) and 0 < abs(x) < RESIDUAL_CEILING:
        if abs(x) < RESIDUAL_BOUND:
            return "< 1e-12"
        return f"< 1e{math.floor(math.log10(abs(x))) + 1}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(doc_fmt(v) for v in x) + "]"
    if isinstance(x, Mapping):
        return "; ".join(f"{k} {doc_fmt(v)}" for k, v in x.items())
    return fmt(x)


def md_table(columns: Sequence[Any], rows: Sequence[Sequence[Any]], cell: Callable[[Any], str] = fmt,
             align: str = "") -> list[str]:
    """A Markdown table as lines: header, separator, one line per row (cells through ``cell``).
    ``align`` has one letter per column, ``l`` or ``r`` (right-aligned: ``---:``); empty: all left.
    An empty cell prints as ``| |``."""
    if align and (len(align) != len(columns) or set(align) - {"l", "r"}):
        raise ValueError(f"align {align!r} needs one of l/r per column ({len(columns)})")
    sep = "|" + "".join("---:|" if a == "r" else "---|" for a in (align or "l" * len(columns)))
    return [_row([cell(c) for c in columns]), sep] + [_row([cell(c) for c in r]) for r in rows]


def _row(cells: list[str]) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
