"""Typed errors of the :mod:`dashboards` package."""
from __future__ import annotations


class ReportError(Exception):
    """Base class: the report cannot be rendered (no output file is written)."""


class ResultSchemaError(ReportError, ValueError):
    """A result file does not follow dashboards/SCHEMA.md."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


class AggregateOnlyError(ResultSchemaError):
    """A result file contains something that looks like record-level data (an identifier key such
    as ``subject_id``/``stay_id``/``hadm_id`` or a per-record array/table longer than the limit).
    Reports show aggregates only, so the renderer refuses the whole file."""


class RunsDirectoryError(ReportError, FileNotFoundError):
    """The runs directory is missing or holds no readable result file."""
