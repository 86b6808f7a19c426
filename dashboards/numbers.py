"""How the project prints a number and a Markdown table: one formatter for the report, the generated
documents, the command summaries and the benchmark tables.

:func:`fmt` prints floats at 3 significant digits, integers with separators; :func:`doc_fmt` is
the same for the checked documents, except that a residual at rounding level prints as the decade
it lies below (``< 1e-12``), since its digits depend on BLAS and summation order.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["fmt", "doc_fmt", "md_table", "RESIDUAL_BOUND", "RESIDUAL_CEILING"]

#: residuals below this print as ``< 1e-12``: the bound the certificates are documented against
RESIDUAL_BOUND = 1e-12
#: below this (and above RESIDUAL_BOUND) a figure prints as the decade it lies below
RESIDUAL_CEILING = 1e-6


def fmt(x: Any, digits: int = 3) -> str:
    """3 significant digits for floats (exact zeros stay 0; below 1e-3 or from 1e5 in e-notation),
    integers with thousands separators, ``–`` for None, lists in brackets, mappings as ``k v; …``."""
    if isinstance(x, bool) or x is None:
        return "–" if x is None else str(x).lower()
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x == 0:
            return "0"
        if abs(x) >= 1e5 or abs(x) < 1e-3:
            return f"{x:.{digits - 1}e}"
        return f"{x:.{digits}g}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v, digits) for v in x) + "]"
    if isinstance(x, Mapping):
        return "; ".join(f"{k} {fmt(v, digits)}" for k, v in x.items())
    return str(x).replace("|", "\\|").replace("\n", " ")


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


def md_table(columns: Sequence[Any], rows: Sequence[Sequence[Any]], cell: Callable[[Any], str] = fmt) -> list[str]:
    """A Markdown table as lines: header, separator, one line per row (cells through ``cell``)."""
    out = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    return out + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
