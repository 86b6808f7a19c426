"""Serialisation of :class:`sv_core.Gate`: ``to_state``, the validating ``from_state``, and
``from_solution`` (a solved gate from a given fixed-C solution, without solving again).

The gate (``gate``, ``cls``) is passed in, never imported: this module sits below :mod:`sv_core.gate`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sv_core._blas import single_thread
from sv_core._gate_exact import KKT_GUARD, consolidate_repeats
from sv_core._state import ERROR, MARGIN, RESERVE
from sv_core.calibrate import warmup_size
from sv_core.errors import InfeasibleError, InvalidKeysError, InvalidParameterError, InvalidStateError, PathError
from sv_core.solver import MaintainedSVDD
from sv_core.validation import as_keys

#: ``from_state`` accepts a solved state whose recomputed KKT residual is at most this
STATE_KKT_TOL = 1e-8


def to_state(gate: Any) -> dict[str, Any]:
    """Implementation of :meth:`sv_core.Gate.to_state` (see its docstring)."""
    slots = gate._live_slots()
    core = gate._core
    return {
        "C": gate.C,
        "sigma": gate.sigma,
        "refactor_every": gate.refactor_every,
        "keys": core.X[slots].copy() if core is not None else np.zeros((0, 0)),
        "ids": gate.ids,
        "alpha": core.alpha[slots].copy() if core is not None else np.zeros(0),
        "status": core.status[slots].copy() if core is not None else np.zeros(0, np.int8),
        "margin_ids": np.asarray([gate._id_of_slot[s] for s in core.S], dtype=np.int64)
        if core is not None else np.zeros(0, np.int64),
        "rho": float(core.rho) if core is not None else 0.0,
        "solved": bool(core.solved) if core is not None else False,
        "next_id": gate._next_id,
        "forgotten": np.asarray(sorted(gate._forgotten), dtype=np.int64),
        "fallbacks": int(gate.fallbacks),
    }

def from_state(cls: Any, state: dict) -> Any:
    """Implementation of :meth:`sv_core.Gate.from_state` (see its docstring)."""
    from sv_core.validation import load_state

    try:
        st = load_state(state, warmup_size)
    except (InvalidKeysError, InvalidParameterError) as exc:
        raise InvalidStateError(f"invalid gate state: {exc}") from exc
    g = cls(st["C"], st["sigma"], st["refactor_every"])
    g._next_id = st["next_id"]
    g._forgotten = set(st["forgotten"])
    g.fallbacks = st["fallbacks"]
    keys, ids = st["keys"], st["ids"]
    if keys.shape[0] == 0:
        if keys.shape[1]:
            g._core = MaintainedSVDD(g.C, g.sigma, keys.shape[1], g.refactor_every)
        return g
    core = MaintainedSVDD(g.C, g.sigma, keys.shape[1], g.refactor_every)
    try:
        slots = core.append(keys)  # the kernel is built and checked finite
    except InvalidKeysError as exc:
        raise InvalidStateError(f"invalid gate state: {exc}") from exc
    core.alpha[slots] = st["alpha"]
    core.status[slots] = st["status"]
    core.rho = st["rho"]
    core.solved = st["solved"]
    g._core = core
    g._id_of_slot = [int(i) for i in ids]
    g._slot_of = {int(i): s for s, i in enumerate(ids)}
    core.S = [g._slot_of[int(i)] for i in st["margin_ids"]]
    if core.solved:
        try:
            if core.S:
                core.refactor()
        except PathError as exc:
            raise InvalidStateError(f"invalid gate state: {exc}") from exc
        core.recompute_g()
        v = core.kkt_residual()["max"]
        if not v <= STATE_KKT_TOL:
            raise InvalidStateError(
                f"invalid gate state: KKT residual {v:.3g} > {STATE_KKT_TOL:g} (alpha, rho or "
                "partition do not solve the fixed-C problem for these keys, C and sigma)"
            )
    return g

def from_solution(cls: Any, X, alpha, C: float, sigma: float, refactor_every: int = 64) -> Any:
    """Implementation of :meth:`sv_core.Gate.from_solution` (see its docstring)."""
    g = cls(C, sigma, refactor_every)
    A = as_keys(X)
    n = A.shape[0]
    a = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if a.shape != (n,) or not np.isfinite(a).all():
        raise InvalidKeysError(f"alpha must be a finite array of shape ({n},), got {a.shape}")
    if n < g.warmup_size:
        g.admit(A)
        return g
    if n * g.C < 1.0 - 1e-12:
        raise InfeasibleError(f"n*C = {n * g.C:.6g} < 1: the fixed-C problem is infeasible")
    core = MaintainedSVDD(g.C, g.sigma, A.shape[1], g.refactor_every)
    slots = core.append(A)  # the kernel is built and checked finite
    a = np.clip(a, 0.0, g.C)
    status = np.where(a <= 0.0, RESERVE, np.where(a >= g.C, ERROR, MARGIN)).astype(np.int8)
    a, status = consolidate_repeats(A, a, status, g.C)
    f = 2.0 * (core.K[:n, :n] @ a)  # a dense mat-vec: no (n, |support|) copy
    mar = status == MARGIN
    rho = float(np.mean(core.kd[:n][mar] - f[mar])) if mar.any() else 0.0
    try:
        with single_thread(n):
            core.load_solution(slots, a, status, rho)
            core.polish()
            core.recompute_g()
        ok = core.guard_residual() <= KKT_GUARD
    except PathError:
        ok = False
    if not ok:  # not a solution to the guard: solve by the maintained path
        g = cls(C, sigma, refactor_every)
        g.admit(A)
        return g
    g._core = core
    g._next_id = n
    g._id_of_slot = list(range(n))
    g._slot_of = {i: i for i in range(n)}
    return g
