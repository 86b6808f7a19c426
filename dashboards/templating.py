"""The jinja2 environment of the report templates (``dashboards/templates``).

Autoescaped (every value from a result file is text, never markup); an undefined name is an
error, so a template typo fails loudly instead of printing nothing. Filters: ``fmt`` (a cell
value as text); tests: ``number``.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from dashboards import numbers
from dashboards.labels import metric_label

__all__ = ["TEMPLATES", "environment", "fmt", "is_number"]

TEMPLATES = Path(__file__).with_name("templates")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def fmt(v: Any) -> str:
    """A report cell as text: numbers through :func:`dashboards.numbers.fmt` at 4 significant
    digits; ``—`` for missing, yes/no, a mapping's keys by their labels, at most 12 list items."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if is_number(v):
        return numbers.fmt(v, digits=4)
    if isinstance(v, Mapping):
        return "; ".join(f"{metric_label(str(k))} = {fmt(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        inner = ", ".join(fmt(x) for x in v[:12])
        return f"[{inner}{', …' if len(v) > 12 else ''}]"
    return str(v)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared environment (templates are parsed once per process)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    env.tests["number"] = is_number
    return env
