"""Typed errors of the studies."""
from __future__ import annotations

from evaluation.errors import EvaluationError


class StudyError(EvaluationError):
    """Base class: a study was asked for with unusable parameters or inputs."""


class StudyConfigError(StudyError):
    """A study parameter is out of range (e.g. a budget above the context size)."""


class OptionalDependencyMissing(StudyError):
    """An optional extra (e.g. ``forgetful-attention[retrieval]``) is not installed."""
