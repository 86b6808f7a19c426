"""Typed errors of the support-vector gate.

Every error is raised *before* any state changes, or after the state has been restored
bit-for-bit; the message says what was wrong and what would be valid.
"""
from __future__ import annotations


class GateError(Exception):
    """Base class of every error raised by :mod:`sv_core`."""


class InvalidKeysError(GateError, ValueError):
    """Keys are not a finite (n, d) float array of the gate's dimension."""


class InvalidParameterError(GateError, ValueError):
    """C, sigma or nu outside its valid range."""


class InfeasibleError(GateError, ValueError):
    """The fixed-C problem would be infeasible (n * C < 1)."""


class UnknownTokenError(GateError, KeyError):
    """A token id that is not live in the gate (never admitted, or already forgotten)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown token"


class InvalidTokenIdError(UnknownTokenError, TypeError):
    """A token id that is not a Python/NumPy integer (bool, float, str, ... are refused)."""


class InvalidStateError(GateError, ValueError):
    """A state passed to :meth:`sv_core.Gate.from_state` is malformed, inconsistent or not KKT."""


class VerificationError(GateError, RuntimeError):
    """``verify=True`` could not certify an operation; the gate was restored to its prior state."""


class PathError(GateError, RuntimeError):
    """A Cauwenberghs-Poggio path could not complete; the gate was restored to its prior state."""


class RefitError(GateError, RuntimeError):
    """The independent QP refit failed to reach KKT tolerance."""
