"""The saved form of :class:`sv_core.StreamingGate` (``to_state`` / ``from_state``).

Format ``sv_core.StreamingGate/1`` (unchanged since the first release, so states in existing
warehouses load): scalars, ``hot/*`` (the hot :class:`~sv_core.Gate`'s own state), the cold
tier (``cold_ids`` ascending, ``cold_keys``, ``cold_pinned``) and one screening record per cold
key, ``(cold_g0, cold_rho0, cold_A0, cold_B0)`` with global ``A``, ``B``: the key's lower bound
on ``g_j`` is ``g0 + rho - rho0 - 2 min(A - A0, B - B0)``. The current code writes its single
budget as ``A = B = A0 = B0`` and ``g0`` = the key's current lower bound, which that formula
(and the first release's reader) reads back exactly. Optional entries: ``direct_cold``,
``stats_admitted_cold`` (absent in older states: defaults).

:func:`parse_state` validates everything before anything is built; :func:`verify_cold` checks
full-history KKT and that every stored bound is a true lower bound. Failures raise
:class:`~sv_core.errors.InvalidStateError` (one line).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sv_core.errors import GateError, InvalidStateError
from sv_core.gate import Gate
from sv_core.streaming.screen import KKT_TOL, HotView
from sv_core.streaming.store import ArrayColdStore, ColdStore  # noqa: F401  (re-exported, as before)
from sv_core.validation import check_params

STATE_FORMAT = "sv_core.StreamingGate/1"
#: the stats saved in ``stats`` (sorted names; the first release's set)
STATS_SAVED = ("evicted", "exact_checks", "readmission_rounds", "readmissions", "screened",
               "uncertified_evictions")
_REQUIRED = ("format", "C", "sigma", "hot_budget", "screen", "next_id", "A", "B", "dim", "forgotten",
             "hot_stream_ids", "cold_ids", "cold_keys", "cold_g0", "cold_rho0", "cold_A0",
             "cold_B0", "cold_pinned", "stats")


@dataclass
class ParsedState:
    C: float
    sigma: float
    hot_budget: int | None
    screen: bool
    direct_cold: bool
    next_id: int
    dim: int | None
    hot: Gate
    hot_sids: np.ndarray
    cold_ids: np.ndarray
    cold_keys: np.ndarray
    cold_lower: np.ndarray   # stored lower bound on g_j at load time (pinned: 0)
    cold_pinned: np.ndarray
    forgotten: np.ndarray
    stats: dict


def _bad(msg: str):
    raise InvalidStateError(f"invalid StreamingGate state: {msg}")


def parse_state(state) -> ParsedState:
    """Validate a ``to_state`` dict (or npz mapping) and build its hot gate."""
    if not isinstance(state, dict) and not hasattr(state, "keys"):
        _bad(f"expected a dict, got {type(state).__name__}")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        _bad(f"missing entries {missing}")
    if str(np.asarray(state["format"])) != STATE_FORMAT:
        _bad(f"format {state['format']!r} is not {STATE_FORMAT!r}")
    try:
        C, sigma = check_params(state["C"], state["sigma"])
        budget = int(state["hot_budget"])
        next_id, dim = int(state["next_id"]), int(state["dim"])
        A, B = float(state["A"]), float(state["B"])
        direct = bool(np.asarray(state["direct_cold"])) if "direct_cold" in state else True
        n_direct = int(state["stats_admitted_cold"]) if "stats_admitted_cold" in state else 0
    except (TypeError, ValueError, GateError) as exc:
        _bad(f"scalar entries: {exc}")
    hot_state = {k[4:]: state[k] for k in state if str(k).startswith("hot/")}
    hsid = np.asarray(state["hot_stream_ids"]).astype(np.int64).ravel()
    cid = np.asarray(state["cold_ids"]).astype(np.int64).ravel()
    ckeys = np.asarray(state["cold_keys"], dtype=np.float64)
    try:
        hot = Gate.from_state(hot_state)
    except Exception as exc:  # malformed hot arrays of any kind
        hot = _rebuild_small_hot(hot_state, ckeys, C, sigma)
        if hot is None:
            _bad(f"hot tier: {type(exc).__name__}: {exc}")
        if hot.n != hsid.size:
            _bad("hot tier could not be rebuilt")
    if hot.C != C or hot.sigma != sigma:
        _bad("hot tier C/sigma differ from the streaming gate's")
    meta = {k: np.asarray(state[k]).ravel() for k in ("cold_g0", "cold_rho0", "cold_A0", "cold_B0",
                                                     "cold_pinned")}
    forgotten = np.asarray(state["forgotten"]).astype(np.int64).ravel()
    if hsid.size != hot.n:
        _bad(f"hot_stream_ids has {hsid.size} entries, hot tier holds {hot.n}")
    if any(v.size != cid.size for v in meta.values()) or ckeys.shape[0] != cid.size:
        _bad("cold arrays are not aligned")
    floats = {k: meta[k].astype(np.float64) for k in ("cold_g0", "cold_rho0", "cold_A0", "cold_B0")}
    if cid.size:
        if ckeys.ndim != 2 or ckeys.shape[1] != dim or (hot.n and hot.dim != dim):
            _bad(f"cold keys have shape {ckeys.shape}, expected (n_cold, {dim})")
        if not np.all(np.isfinite(ckeys)) or not all(np.all(np.isfinite(v)) for v in floats.values()):
            _bad("cold arrays contain NaN or inf")
        if np.any(np.diff(cid) <= 0):
            _bad("cold ids are not strictly ascending")
        if not hot.gated:
            _bad("a cold tier exists but the hot tier is not solved")
    allids = np.concatenate([hsid, cid])
    if np.unique(allids).size != allids.size:
        _bad("a token id is both hot and cold, or repeated")
    if allids.size and (allids.min() < 0 or allids.max() >= next_id):
        _bad("token ids outside [0, next_id)")
    if np.isin(forgotten, allids).any():
        _bad("a forgotten id is live")
    if budget != -1 and budget < hot.warmup_size:
        _bad(f"hot_budget {budget} below ceil(1/C)+2")
    stats = np.asarray(state["stats"]).astype(np.int64).ravel()
    if stats.size != len(STATS_SAVED):
        _bad(f"stats has {stats.size} entries, expected {len(STATS_SAVED)}")
    pinned = meta["cold_pinned"].astype(bool)
    lower = np.zeros(cid.size)
    if cid.size:
        drift = np.minimum(A - floats["cold_A0"], B - floats["cold_B0"])
        lower = floats["cold_g0"] + (hot.rho - floats["cold_rho0"]) - 2.0 * drift
        lower[pinned] = 0.0
    st = {k: int(v) for k, v in zip(STATS_SAVED, stats)}
    st["admitted_cold"] = n_direct
    return ParsedState(C=C, sigma=sigma, hot_budget=None if budget == -1 else budget,
                       screen=bool(np.asarray(state["screen"])), direct_cold=direct, next_id=next_id,
                       dim=None if dim == -1 else dim, hot=hot, hot_sids=hsid, cold_ids=cid,
                       cold_keys=ckeys.reshape(cid.size, -1) if cid.size else ckeys,
                       cold_lower=lower, cold_pinned=pinned, forgotten=forgotten, stats=st)


def verify_cold(p: ParsedState) -> np.ndarray:
    """Full-history KKT of a parsed state (hot residual recomputed, every free cold gradient
    exact) and the stored bounds must be lower bounds; returns the exact free cold gradients."""
    view = HotView(p.hot)
    free = ~p.cold_pinned
    g = view.exact_g(p.cold_keys[free]) if free.any() else np.zeros(0)
    kkt = max(view.kkt(p.C)["max"], float(np.maximum(-g, 0.0).max(initial=0.0)))
    lie = p.cold_lower[free] - g > 1e-9
    if not kkt <= KKT_TOL or lie.any():
        _bad(f"the state does not satisfy full-history KKT (residual {kkt:.3g}) or its screening "
             "bounds are not lower bounds")
    return g


def _rebuild_small_hot(hot_state: dict, cold_keys: np.ndarray, C: float, sigma: float):
    """A solved hot tier below the warm-up size (e.g. after evicting to the support, as in
    Example 3.1) is refused by ``Gate.from_state``. Rebuild it through the public API: admit
    the hot keys plus enough cold keys to reach the warm-up size (solved from scratch; the cold
    keys are reserve at the full-history optimum), then forget those cold keys again. Equal to
    the saved hot state up to rounding; the caller verifies full-history KKT. None if the hot
    state is not of that kind."""
    try:
        keys = np.asarray(hot_state["keys"], dtype=np.float64)
        solved = bool(np.asarray(hot_state["solved"]))
        warm = Gate(C, sigma).warmup_size
    except Exception:
        return None
    if not solved or keys.ndim != 2 or keys.shape[0] >= warm or cold_keys.ndim != 2 \
            or keys.shape[0] + cold_keys.shape[0] < warm or not np.all(np.isfinite(keys)):
        return None
    try:
        g = Gate(C, sigma)
        need = warm - keys.shape[0]
        g.admit(np.vstack([keys, cold_keys[:need]]))
        for t in range(keys.shape[0], warm):
            g.forget(t)
        return g
    except GateError:
        return None
