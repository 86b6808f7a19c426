"""Typed errors of the cohort package. Every message says what was expected and where."""
from __future__ import annotations

import re


class CohortError(Exception):
    """Base class of every cohort error."""


class InputMissingError(CohortError, FileNotFoundError):
    """An input table is absent. The message names the expected path(s) and the layout."""


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_ ]{0,63}$")


def redact(text: str) -> str:
    """Strip what could be record-level data from a library's error text: quoted values become
    ``'…'`` and runs of 4+ digits (ids, times, values) become ``#``."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", str(text))
    return re.sub(r"\d{4,}", "#", text)


class MissingColumnsError(CohortError, ValueError):
    """An input table lacks required columns. The message names them and the file — and the
    present columns only when they look like a header (a headerless file would otherwise print
    its first data row: ids and times)."""

    def __init__(self, path: str, missing: list[str], present: list[str]):
        self.path = path
        self.missing = list(missing)
        if present and all(_IDENT.match(c) and not c.strip("_ ").isdigit() for c in present):
            seen = f"present: {', '.join(present)}"
        else:
            seen = f"the first line does not look like a header ({len(present)} fields); is the header row missing?"
        super().__init__(f"{path}: missing required column(s) {', '.join(missing)} ({seen})")


class ColumnTypeError(CohortError, ValueError):
    """An input table has a required column of the wrong type (e.g. a MEDS shard whose ``time``
    is text). The message names the file, the column, the type found and the type expected."""


class UnreadableInputError(CohortError, OSError):
    """An input file exists but cannot be read (corrupt gzip, not parquet, ...)."""


class EmptyCohortError(CohortError, RuntimeError):
    """No stay survived the filters. ``funnel`` holds the counts after every step; the message is
    one line with the stay count after each step (:func:`funnel_line`)."""

    def __init__(self, message: str, funnel: list[tuple[str, int, int | None]]):
        self.funnel = list(funnel)
        super().__init__(f"{message}; stays after each step: {funnel_line(self.funnel)}")


class BadParameterError(CohortError, ValueError):
    """A build parameter is out of range (negative sample size, unknown source, ...)."""


class DemoDataMissing(CohortError, FileNotFoundError):
    """The real MIMIC-IV demo (CLIF parquet) is not in the cache; the message gives the
    exact command that fetches it."""


class UnknownStayError(CohortError, KeyError):
    """A reader was asked for a stay the warehouse does not hold."""


def funnel_line(funnel: list[tuple[str, int, int | None]]) -> str:
    """Funnel rows ``(step, n_stays, n_rows)`` as one line of stay counts (counts only)."""
    return " → ".join(f"{step} {n_stays:,}" for step, n_stays, _ in funnel) or "no step ran"


def format_funnel(funnel: list[tuple[str, int, int | None]]) -> str:
    """Render funnel rows ``(step, n_stays, n_rows)`` as an aligned text table (counts only)."""
    lines = [f"{'step':<34}{'n_stays':>10}{'n_rows':>14}"]
    for step, n_stays, n_rows in funnel:
        rows = "" if n_rows is None else f"{n_rows:,}"
        lines.append(f"{step:<34}{n_stays:>10,}{rows:>14}")
    return "\n".join(lines)
