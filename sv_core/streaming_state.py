"""Cold-tier storage and state loading for :class:`sv_core.streaming.StreamingGate`.

* :class:`ColdStore` -- the pluggable store interface (add / remove / get / ids / iterate) and
  :class:`ArrayColdStore`, the default in-memory implementation (a warehouse-backed store, e.g.
  DuckDB, implements the same five methods).
* :func:`load_state` -- validated loading of ``StreamingGate.to_state()`` output. Every check
  runs before the object is returned; any failure raises ``InvalidStateError`` (from
  :mod:`sv_core.errors`) and nothing stays in the given store.
"""
from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np

from .errors import GateError, UnknownTokenError
from .gate import Gate

try:
    from .validation import check_params as _check_params
except ImportError:  # pragma: no cover
    from .gate import _check_params


# ---------------------------------------------------------------------- cold store
class ColdStore(abc.ABC):
    """Where cold (certified-inert) keys live. Ids are stream token ids (int64)."""

    @abc.abstractmethod
    def add(self, ids: np.ndarray, keys: np.ndarray) -> None:
        """Store keys ``(m, d)`` under new ids ``(m,)``."""

    @abc.abstractmethod
    def remove(self, ids: np.ndarray) -> np.ndarray:
        """Delete ids; returns their keys ``(m, d)`` aligned with ``ids``."""

    @abc.abstractmethod
    def get(self, ids: np.ndarray) -> np.ndarray:
        """Keys ``(m, d)`` aligned with ``ids`` (UnknownTokenError if one is absent)."""

    @abc.abstractmethod
    def ids(self) -> np.ndarray:
        """All stored ids, ascending."""

    def __len__(self) -> int:
        return int(self.ids().size)

    def __contains__(self, tid) -> bool:
        return bool(np.isin(int(tid), self.ids()))

    def iter_batches(self, size: int = 4096) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        ids = self.ids()
        for lo in range(0, ids.size, size):
            yield ids[lo:lo + size], self.get(ids[lo:lo + size])


class ArrayColdStore(ColdStore):
    """Default in-memory store: ids sorted ascending, keys aligned."""

    def __init__(self, dim: int | None = None):
        self._ids = np.zeros(0, dtype=np.int64)
        self._keys = np.zeros((0, dim or 0))

    def _pos(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).ravel()
        pos = np.searchsorted(self._ids, ids)
        ok = (pos < self._ids.size) & (self._ids[np.minimum(pos, max(self._ids.size - 1, 0))] == ids) \
            if self._ids.size else np.zeros(ids.size, bool)
        if not np.all(ok):
            raise UnknownTokenError(f"token(s) {ids[~ok][:5].tolist()} not in the cold store")
        return pos

    def add(self, ids, keys) -> None:
        ids = np.asarray(ids, dtype=np.int64).ravel()
        keys = np.asarray(keys, dtype=np.float64).reshape(ids.size, -1)
        if ids.size == 0:
            return
        if self._keys.shape[0] == 0:
            self._keys = np.zeros((0, keys.shape[1]))
        allids = np.concatenate([self._ids, ids])
        order = np.argsort(allids, kind="stable")
        self._ids = allids[order]
        self._keys = np.concatenate([self._keys, keys])[order]

    def remove(self, ids) -> np.ndarray:
        pos = self._pos(ids)
        out = self._keys[pos].copy()
        keep = np.ones(self._ids.size, bool)
        keep[pos] = False
        self._ids, self._keys = self._ids[keep], self._keys[keep]
        return out

    def get(self, ids) -> np.ndarray:
        return self._keys[self._pos(ids)].copy()

    def ids(self) -> np.ndarray:
        return self._ids.copy()

    def __len__(self) -> int:
        return int(self._ids.size)


_REQUIRED = ("format", "C", "sigma", "hot_budget", "screen", "next_id", "A", "B", "dim", "forgotten",
             "hot_stream_ids", "cold_ids", "cold_keys", "cold_g0", "cold_rho0", "cold_A0",
             "cold_B0", "cold_pinned", "stats")


def load_state(cls, state: dict, store=None, verify: bool = True):
    from .streaming import KKT_TOL, STATE_FORMAT, InvalidStateError

    def bad(msg):
        raise InvalidStateError(f"invalid StreamingGate state: {msg}")

    if not isinstance(state, dict) and not hasattr(state, "keys"):
        bad(f"expected a dict, got {type(state).__name__}")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        bad(f"missing entries {missing}")
    if str(np.asarray(state["format"])) != STATE_FORMAT:
        bad(f"format {state['format']!r} is not {STATE_FORMAT!r}")
    try:
        C, sigma = _check_params(state["C"], state["sigma"])
        budget = int(state["hot_budget"])
        next_id = int(state["next_id"])
        dim = int(state["dim"])
        A = float(state["A"])
        B = float(state["B"])
    except (TypeError, ValueError, GateError) as exc:
        bad(f"scalar entries: {exc}")
    hot_state = {k[4:]: state[k] for k in state if str(k).startswith("hot/")}
    hsid = np.asarray(state["hot_stream_ids"]).astype(np.int64).ravel()
    cid = np.asarray(state["cold_ids"]).astype(np.int64).ravel()
    ckeys = np.asarray(state["cold_keys"], dtype=np.float64)
    try:
        hot = Gate.from_state(hot_state)
        rebuilt = False
    except Exception as exc:  # malformed hot arrays of any kind
        hot = _rebuild_small_hot(hot_state, ckeys, C, sigma, exc)
        rebuilt = hot is not None
        if hot is None:
            bad(f"hot tier: {type(exc).__name__}: {exc}")
    if rebuilt and hot.n != hsid.size:
        bad("hot tier could not be rebuilt")
    if hot.C != C or hot.sigma != sigma:
        bad("hot tier C/sigma differ from the streaming gate's")
    meta = {k: np.asarray(state[k]).ravel() for k in ("cold_g0", "cold_rho0", "cold_A0", "cold_B0",
                                                     "cold_pinned")}
    forgotten = np.asarray(state["forgotten"]).astype(np.int64).ravel()
    if hsid.size != hot.n:
        bad(f"hot_stream_ids has {hsid.size} entries, hot tier holds {hot.n}")
    if any(v.size != cid.size for v in meta.values()) or ckeys.shape[0] != cid.size:
        bad("cold arrays are not aligned")
    if cid.size:
        if ckeys.ndim != 2 or ckeys.shape[1] != dim or (hot.n and hot.dim != dim):
            bad(f"cold keys have shape {ckeys.shape}, expected (n_cold, {dim})")
        if not np.all(np.isfinite(ckeys)) or not all(np.all(np.isfinite(meta[k].astype(float)))
                                                     for k in ("cold_g0", "cold_rho0", "cold_A0", "cold_B0")):
            bad("cold arrays contain NaN or inf")
        if np.any(np.diff(cid) <= 0):
            bad("cold ids are not strictly ascending")
        if not hot.gated:
            bad("a cold tier exists but the hot tier is not solved")
    allids = np.concatenate([hsid, cid])
    if np.unique(allids).size != allids.size:
        bad("a token id is both hot and cold, or repeated")
    if allids.size and (allids.min() < 0 or allids.max() >= next_id):
        bad("token ids outside [0, next_id)")
    if np.isin(forgotten, allids).any():
        bad("a forgotten id is live")
    if budget != -1 and budget < hot.warmup_size:
        bad(f"hot_budget {budget} below ceil(1/C)+2")
    sg = cls(C, sigma, hot_budget=None if budget == -1 else budget, screen=bool(state["screen"]),
             store=store)
    sg._hot = hot
    sg._h2s = {int(h): int(s) for h, s in zip(hot.ids, hsid)}
    sg._s2h = {s: h for h, s in sg._h2s.items()}
    sg._cid = cid
    sg._cg0 = meta["cold_g0"].astype(np.float64)
    sg._crho0 = meta["cold_rho0"].astype(np.float64)
    sg._cA0 = meta["cold_A0"].astype(np.float64)
    sg._cB0 = meta["cold_B0"].astype(np.float64)
    sg._cpin = meta["cold_pinned"].astype(bool)
    sg._A, sg._B = A, B
    sg._next_id = next_id
    sg._forgotten = set(int(i) for i in forgotten)
    sg._dim = None if dim == -1 else dim
    stats = np.asarray(state["stats"]).astype(np.int64).ravel()
    names = sorted(sg.stats)
    if stats.size != len(names):
        bad(f"stats has {stats.size} entries, expected {len(names)}")
    sg.stats = {k: int(v) for k, v in zip(names, stats)}
    if cid.size:
        sg._store.add(cid, ckeys)
    if verify and hot.gated:
        # full-history KKT as in certificate(exact=True) -- hot residual and every unpinned cold
        # gradient, computed once (one cold x hot-support kernel product) -- and the stored
        # screening bounds must be valid lower bounds on those exact gradients
        free = ~sg._cpin
        g = sg._exact_g(ckeys[free]) if free.any() else np.zeros(0)
        kkt = max(float(hot.kkt_residual()["max"]), float(np.maximum(-g, 0.0).max(initial=0.0)))
        lie = (sg._bound(free) - g > 1e-9) if free.any() else np.zeros(0, bool)
        if not kkt <= KKT_TOL or lie.any():
            if cid.size:
                sg._store.remove(cid)
            bad(f"the state does not satisfy full-history KKT (residual "
                f"{kkt:.3g}) or its screening bounds are not lower bounds")
    return sg


def _rebuild_small_hot(hot_state: dict, cold_keys: np.ndarray, C: float, sigma: float, exc):
    """A solved hot tier below the warm-up size (e.g. after evicting to the support, as in
    Example 3.1) may be refused by ``Gate.from_state``. Rebuild it through the public API: admit
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
