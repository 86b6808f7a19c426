"""Typed errors raised by the :mod:`evaluation` package.

Every function in this package validates its input before computing anything and raises one of
these classes with a readable message; no function mutates its arguments.
"""
from __future__ import annotations


class EvaluationError(ValueError):
    """Base class for bad input to an evaluation routine."""


class PolicyError(EvaluationError):
    """A selection policy was misconfigured or given unusable keys/queries."""


class UnknownPolicyError(PolicyError, KeyError):
    """``get_policy`` was asked for a name that is not registered."""

    def __str__(self) -> str:  # KeyError would otherwise print the message quoted
        return str(self.args[0]) if self.args else "unknown policy"


class MetricError(EvaluationError):
    """A metric was asked for with mismatched, empty or degenerate input."""
