"""The compiled fast path of the C&P event loop, and the switch between it and the reference.

:meth:`sv_core.solver.MaintainedSVDD._sweep_events` is the reference implementation (NumPy, every
case: empty margin set, zero-length steps, exact and near duplicates, degenerate pivots,
refactorisations). The C extension ``sv_core._cpfast`` (``sv_core/_cpfast.c``, built at install
time; optional) runs the *simple* events of a top-level deletion or admission sweep in place on
the solver's arrays: event search, step, rank-one border update and Schur downdate. At the first
event that is not simple it hands over to the reference loop, which resumes from exactly the
state it would have reached itself (see the C file's header for the hand-over codes). So the
fast path never decides anything the reference does not; it only does the common case without
~30 NumPy calls per event.

Switches: ``FORGETFUL_SOLVER=reference`` in the environment (read at import) or
``MaintainedSVDD.use_fast = False`` on one solver selects the reference loop;
:func:`fast_path_available` says whether the extension is built. Tests run both and compare.
"""
from __future__ import annotations

import os
import types
from typing import Any

import numpy as np

from sv_core._state import DUPLICATE_TOL, NEAR_TWIN_TOL, RISKY_RATE

_cpfast: types.ModuleType | None
try:  # built by setup.py; absent without a C compiler (then the reference loop runs)
    from sv_core import _cpfast
except ImportError:  # pragma: no cover - depends on the build
    _cpfast = None
#: the interface version this module speaks (``CP_ABI`` in the C file); a stale build (an older
#: checkout's extension, not rebuilt) is ignored and the reference loop runs
ABI = 1
if _cpfast is not None and getattr(_cpfast, "ABI", None) != ABI:  # pragma: no cover
    _cpfast = None

#: hand-over codes of ``_cpfast.sweep`` (see sv_core/_cpfast.c)
DONE, RESUME, BAIL = 0, 1, 2
#: event kinds, in the C enum's order
KINDS = ("c_bound", "c_g", "S_to_R", "S_to_E", "E_to_S", "R_to_S")
_MODES = {"remove": 0, "settle": 1}
#: entering keys closer than this (feature-space distance^2) to a margin key are left to the
#: reference loop, which checks for exact duplicates and near-twins (its own screen is 1e-6)
DUP_SCREEN = max(1e-6, NEAR_TWIN_TOL, DUPLICATE_TOL)
#: spare margin-set room allocated before a fast sweep (entries beyond it hand over)
_ROOM = 32

ENABLED = os.environ.get("FORGETFUL_SOLVER", "").strip().lower() not in ("reference", "numpy", "python")


def fast_path_available() -> bool:
    """True when the compiled event loop is built and not switched off by ``FORGETFUL_SOLVER``."""
    return _cpfast is not None and ENABLED


def _in_buffer(Rinv: np.ndarray, R: np.ndarray, m1: int) -> bool:
    """True when ``Rinv`` is the ``(m1, m1)`` top-left block of buffer ``R`` itself (a view, not a copy)."""
    return (Rinv.base is R and Rinv.shape == (m1, m1) and Rinv.strides == R.strides
            and Rinv.__array_interface__["data"][0] == R.__array_interface__["data"][0])


def fast_sweep(core: Any, c: int, mode: str) -> tuple[int, tuple[str, int, float, float, int] | None]:
    """Run the simple events of sweep ``(c, mode)`` in C on ``core``'s arrays.

    Returns ``(events, resume)``: ``resume`` is ``None`` when the sweep is complete (a deletion
    reached alpha_c = 0), else ``(kind, k, t, s, events)`` for the reference loop to take over
    (``kind`` is ``"search"`` when no step of the current event was applied).
    """
    ext = _cpfast
    if ext is None:
        raise RuntimeError("sv_core._cpfast is not built")
    S, _ = core.margin_rows()  # brings the bordered-row cache up to date for n slots
    m = S.size
    n = core.n_slots
    room = m + 1 + _ROOM
    core._ensure_rows(room, n)
    if core._S_buf.size < room:
        buf = np.zeros(2 * room, dtype=np.int64)
        buf[:m] = core._S_buf[:m]
        core._S_buf = buf
    R = core._Rbuf
    if R.shape[0] < room:
        R = core._Rbuf = np.zeros((2 * room, 2 * room))
    if not _in_buffer(core.Rinv, R, m + 1):  # else the last sweep left it there (a view of R)
        R[: m + 1, : m + 1] = core.Rinv
    rows = core._rows
    code, kind, k, t, s, events, m2, updates, rho, risky = ext.sweep(
        _MODES[mode], c, n, core.K, core.kd, core.alpha, core.g, core.status,
        rows, rows.shape[1], rows.shape[0], core._S_buf, core._S_buf.size, R, R.shape[1], R.shape[0],
        core.C, core.RATE_EPS, RISKY_RATE, DUP_SCREEN, core.rho, m, core._updates, core.refactor_every)
    # the margin set, its cached rows and the inverse were edited in step (no cache rebuild)
    core._S = core._S_buf[:m2].tolist()
    core._S_arr = core._S_buf[:m2]
    # a view: the next sweep finds the inverse in place instead of copying (m+1)^2 entries in and
    # out (at a margin set of 4,000 keys, 128 MB each way, per sweep); whoever replaces or copies
    # Rinv (the reference loop, snapshots, deep copies) breaks the view and the next sweep copies once
    core.Rinv = R[: m2 + 1, : m2 + 1]
    core._updates = updates
    core.rho = rho
    if risky:
        core._risky = True
    core.fast_events += events
    if code == DONE:
        return events, None
    if code == BAIL:
        return events, ("search", -1, 0.0, 0.0, events)
    return events, (KINDS[kind], k, t, s, events)
