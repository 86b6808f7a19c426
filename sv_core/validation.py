"""Input validation shared by the gate and the refit oracle (no solver state lives here).

Everything here raises a typed :class:`sv_core.errors.GateError` subclass with a one-line
message and never mutates its inputs. ``gate.py`` and ``refit.py`` both import this module, so
neither imports the other at module level.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from sv_core.errors import InvalidKeysError, InvalidParameterError, InvalidStateError, InvalidTokenIdError

#: sigma must lie in this range so that sigma**2 and 1/sigma**2 are finite normal fp64 numbers
SIGMA_RANGE = (1e-150, 1e150)
#: keys must have Euclidean norm at most this, so that squared norms and distances stay finite
MAX_KEY_NORM = 1e150


def check_params(C, sigma) -> tuple[float, float]:
    """Validate the box C in (0, 1] and the bandwidth sigma in ``SIGMA_RANGE``; returns floats."""
    if isinstance(C, (bool, np.bool_)) or isinstance(sigma, (bool, np.bool_)):
        raise InvalidParameterError(f"C and sigma must be numbers, got C={C!r}, sigma={sigma!r}")
    try:
        C = float(C)
        sigma = float(sigma)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidParameterError(f"C and sigma must be numbers, got C={C!r}, sigma={sigma!r}") from exc
    if not math.isfinite(C) or not (0.0 < C <= 1.0):
        raise InvalidParameterError(f"C must be in (0, 1], got {C!r} (use calibrate_C(nu, n0))")
    lo, hi = SIGMA_RANGE
    if not math.isfinite(sigma) or not (lo <= sigma <= hi):
        raise InvalidParameterError(
            f"sigma must be a finite bandwidth in [{lo:g}, {hi:g}] (sigma**2 must be a normal fp64 "
            f"number), got {sigma!r}"
        )
    return C, sigma


def as_keys(X, dim: int | None = None) -> np.ndarray:
    """Validate keys: finite float array of shape (n, d) (a single (d,) key is promoted).

    Keys whose norm exceeds ``MAX_KEY_NORM`` are rejected: their squared norms overflow and the
    kernel would be NaN.
    """
    try:
        A = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidKeysError(f"keys must be numeric, got {type(X).__name__}") from exc
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2 or A.shape[1] == 0:
        raise InvalidKeysError(f"keys must have shape (n, d) or (d,), got {np.shape(X)}")
    if dim is not None and A.shape[1] != dim:
        raise InvalidKeysError(f"keys must have dimension {dim}, got {A.shape[1]}")
    if not np.all(np.isfinite(A)):
        bad = int((~np.isfinite(A)).any(axis=1).sum())
        raise InvalidKeysError(f"{bad} key(s) contain NaN or inf; nothing was admitted")
    if A.size:
        big = float(np.abs(A).max())
        if big > MAX_KEY_NORM / math.sqrt(A.shape[1]):
            raise InvalidKeysError(
                f"a key entry has magnitude {big:.3g}: squared distances would overflow "
                f"(limit {MAX_KEY_NORM:g} on the key norm); rescale the keys"
            )
    return A


def check_token_id(token_id) -> int:
    """A token id must be a Python or NumPy integer (not bool, float or str); returns an int."""
    if isinstance(token_id, (bool, np.bool_)) or not isinstance(token_id, (numbers.Integral, np.integer)):
        raise InvalidTokenIdError(
            f"token id must be a Python or NumPy integer, got {type(token_id).__name__} {token_id!r}"
        )
    return int(token_id)


_REQUIRED = ("C", "sigma", "keys", "ids", "alpha", "status", "margin_ids", "rho", "solved",
             "next_id", "forgotten")


def _scalar(state: dict, name: str, kind: str):
    v = state[name]
    a = np.asarray(v)
    if a.ndim != 0 and a.size != 1:
        raise InvalidStateError(f"invalid gate state: {name} must be a scalar, got shape {a.shape}")
    a = a.reshape(())
    if kind == "int":
        if a.dtype.kind not in "iu" or a.dtype == np.bool_:
            raise InvalidStateError(f"invalid gate state: {name} must be an integer, got {a.dtype}")
        return int(a)
    if kind == "bool":
        if a.dtype != np.bool_:
            raise InvalidStateError(f"invalid gate state: {name} must be a bool, got {a.dtype}")
        return bool(a)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise InvalidStateError(f"invalid gate state: {name} must be a real number, got {a.dtype}")
    x = float(a)
    if not math.isfinite(x):
        raise InvalidStateError(f"invalid gate state: {name} must be finite, got {x!r}")
    return x


def _int_vector(state: dict, name: str) -> np.ndarray:
    a = np.asarray(state[name])
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise InvalidStateError(f"invalid gate state: {name} must be a 1-d integer array, got "
                                f"{a.dtype} of shape {a.shape}")
    return a.astype(np.int64)


def load_state(state, warmup_size) -> dict:
    """Validate a :meth:`sv_core.Gate.to_state` dict (or npz mapping) structurally.

    Returns normalised fields; raises :class:`InvalidStateError` (or the key/parameter errors,
    which the caller wraps). The KKT residual of a solved state is checked by the caller once the
    kernel exists. ``warmup_size(C)`` is passed in to keep this module free of solver imports.
    """
    from sv_core.solver import ERROR, MARGIN, PENDING, RESERVE

    try:
        missing = [k for k in _REQUIRED if k not in state]
    except TypeError as exc:
        raise InvalidStateError(f"invalid gate state: expected a mapping, got {type(state).__name__}") from exc
    if missing:
        raise InvalidStateError(f"invalid gate state: missing field(s) {missing}")
    C = _scalar(state, "C", "float")
    sigma = _scalar(state, "sigma", "float")
    C, sigma = check_params(C, sigma)
    out: dict = {"C": C, "sigma": sigma}
    out["refactor_every"] = _scalar(state, "refactor_every", "int") if "refactor_every" in state else 64
    if out["refactor_every"] < 1:
        raise InvalidStateError("invalid gate state: refactor_every must be >= 1")
    out["fallbacks"] = _scalar(state, "fallbacks", "int") if "fallbacks" in state else 0
    keys = np.asarray(state["keys"])
    if keys.dtype.kind != "f" or keys.ndim != 2:
        raise InvalidStateError(f"invalid gate state: keys must be a 2-d float array, got {keys.dtype} "
                                f"of shape {keys.shape}")
    n = keys.shape[0]
    if n:
        keys = as_keys(keys)
    out["keys"] = keys.astype(np.float64)
    ids = _int_vector(state, "ids")
    forgotten = _int_vector(state, "forgotten")
    margin_ids = _int_vector(state, "margin_ids")
    next_id = _scalar(state, "next_id", "int")
    if ids.size != n:
        raise InvalidStateError(f"invalid gate state: {ids.size} ids for {n} keys")
    if np.unique(ids).size != n:
        raise InvalidStateError("invalid gate state: ids are not unique")
    if n and (ids.min() < 0 or ids.max() >= next_id):
        raise InvalidStateError(f"invalid gate state: ids must lie in [0, next_id={next_id})")
    if np.intersect1d(ids, forgotten).size:
        raise InvalidStateError("invalid gate state: a live id is also listed as forgotten")
    if np.unique(forgotten).size != forgotten.size or (forgotten.size and
                                                        (forgotten.min() < 0 or forgotten.max() >= next_id)):
        raise InvalidStateError("invalid gate state: forgotten ids must be unique and in [0, next_id)")
    alpha = np.asarray(state["alpha"])
    status = np.asarray(state["status"])
    if alpha.shape != (n,) or alpha.dtype.kind not in "f":
        raise InvalidStateError(f"invalid gate state: alpha must be a float array of shape ({n},), "
                                f"got {alpha.dtype} of shape {alpha.shape}")
    if status.shape != (n,) or status.dtype.kind not in "iu":
        raise InvalidStateError(f"invalid gate state: status must be an integer array of shape ({n},)")
    alpha = alpha.astype(np.float64)
    status = status.astype(np.int8)
    if not np.isfinite(alpha).all():
        raise InvalidStateError("invalid gate state: alpha contains NaN or inf")
    solved = _scalar(state, "solved", "bool")
    rho = _scalar(state, "rho", "float")
    if np.unique(margin_ids).size != margin_ids.size:
        raise InvalidStateError("invalid gate state: margin_ids are not unique")
    if solved:
        if n * C < 1.0 - 1e-12:
            raise InvalidStateError(f"invalid gate state: solved with n*C = {n * C:.6g} < 1 (infeasible)")
        if not np.isin(status, (RESERVE, MARGIN, ERROR)).all():
            raise InvalidStateError("invalid gate state: a solved state has status values outside "
                                    "{reserve, margin, error}")
        tol = 1e-9
        if abs(alpha.sum() - 1.0) > tol:
            raise InvalidStateError(f"invalid gate state: sum(alpha) = {alpha.sum():.12g} != 1")
        if alpha.min() < -tol * C or alpha.max() > C * (1 + tol):
            raise InvalidStateError(f"invalid gate state: alpha outside the box [0, C={C:.6g}]")
        if (alpha[status == RESERVE] != 0.0).any() or (alpha[status == ERROR] != C).any():
            raise InvalidStateError("invalid gate state: reserve keys must have alpha = 0 and error keys alpha = C")
        want = np.sort(ids[status == MARGIN])
        if not np.array_equal(np.sort(margin_ids), want):
            raise InvalidStateError("invalid gate state: margin_ids do not match the keys with margin status")
    else:
        if n >= warmup_size(C) and n:
            raise InvalidStateError(f"invalid gate state: unsolved with n={n} >= warm-up size {warmup_size(C)}")
        if (status != PENDING).any() or (alpha != 0.0).any() or margin_ids.size:
            raise InvalidStateError("invalid gate state: an unsolved (warm-up) state has pending keys with alpha 0")
    out.update(ids=ids, forgotten=[int(i) for i in forgotten], margin_ids=margin_ids, next_id=next_id,
               alpha=alpha, status=status, solved=solved, rho=rho)
    return out
