"""Storage, constants and diagnostics of the maintained C&P solver (base of :class:`MaintainedSVDD`).

The solver is split along its seams: this module holds the status codes and tolerances, the
slot storage (keys, Gram matrix, coefficients, gradient, status), the margin set ``S`` with its
cached *bordered rows* ``[1; 2 K[S, :n]]`` (kept by row appends/deletions as keys enter or leave
``S``, so the event loop never gathers ``K[S, :]``), the exact gradient recompute and the KKT
diagnostics, and the *deferred* mode (a loaded solution whose kernel, bordered inverse and
gradient are built by :meth:`SolverState.materialise` the first time a C&P step needs them, so a
batch solve costs O(n d) memory here); :mod:`sv_core._bordered` holds the bordered-inverse algebra,
:mod:`sv_core._degenerate` the handling of (near-)duplicate keys and :mod:`sv_core.solver` the
one C&P event loop and the operations built on it.
"""
from __future__ import annotations

from typing import Any, Self

import numpy as np
from numpy.typing import NDArray

from sv_core.kernels import check_finite_kernel, rbf_kernel

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

RESERVE, MARGIN, ERROR, PENDING, DEAD = 0, 1, 2, 3, -1
#: a margin coefficient within SNAP_TOL * C of a bound is snapped to it at the end of an operation
SNAP_TOL = 1e-10
#: residual of the bordered system above which the maintained inverse is refactorised
INVERSE_GUARD = 1e-11
#: feature-space squared distance below which two keys are treated as exact duplicates (keys
#: that are bit-for-bit equal always are; with stored keys, a distinct key this close to a margin
#: key on the C&P path is handled as a near-twin, see ``NEAR_TWIN_TOL``)
DUPLICATE_TOL = 1e-12
#: feature-space squared distance below which a key reaching the margin set next to a margin key
#: is a *near-twin*: instead of joining S beside it (a near-singular bordered system) it swaps in
NEAR_TWIN_TOL = 1e-9
#: kernel entries per block when new keys' rows are computed into the stored Gram matrix
APPEND_BLOCK = 1 << 20
#: operations between exact recomputes of the gradient (it is updated incrementally in between)
G_REFRESH = 32
#: operations between unconditional re-solves of the margin system (see ``finish``)
POLISH_EVERY = 8
#: margin rates |beta| above this mark an operation as ill-conditioned: its end recomputes g
RISKY_RATE = 1e3
STATUS_NAMES = {RESERVE: "reserve", MARGIN: "margin", ERROR: "error", PENDING: "pending"}
#: ``STATUS_SIGN.take(status, mode="wrap")``: +1 error (g <= 0), -1 reserve (g >= 0), 0 otherwise
#: (margin, pending, and dead = -1, which wraps to the last entry)
STATUS_SIGN = np.array([-1.0, 0.0, 1.0, 0.0, 0.0])


class Degenerate(Exception):
    """A key cannot join the margin set: its Schur complement is ~0 (it duplicates margin keys)."""


class SolverState:
    """Slot storage, the margin set and its bordered-row cache, gradients and KKT diagnostics."""

    #: tolerance on rates (beta, gamma) below which a coefficient/gradient is treated as constant
    RATE_EPS = 1e-13
    #: relative Schur-complement size below which a border update is refused as ill-conditioned
    GUARD = 1e-14

    def __init__(self, C: float, sigma: float, dim: int, refactor_every: int = 64, deferred: bool = False):
        self.C = float(C)
        self.sigma = float(sigma)
        self.dim = int(dim)
        self.refactor_every = int(refactor_every)
        cap = 16
        self.X: FloatArray = np.zeros((cap, dim))
        #: the Gram matrix of the first ``_kn`` slots (allocated at the key capacity once built)
        self.K: FloatArray = np.zeros((0, 0))
        self._kn = 0
        #: the kernel, bordered inverse and gradient are not built: keys are stored and a solution
        #: loaded (``load_deferred``) without them; ``materialise`` builds them (:mod:`sv_core._degenerate`)
        self.deferred = bool(deferred)
        self.kd: FloatArray = np.zeros(cap)
        self.alpha: FloatArray = np.zeros(cap)
        self.g: FloatArray = np.zeros(cap)
        self.status: NDArray[np.int8] = np.full(cap, DEAD, dtype=np.int8)
        self.n_slots = 0
        self._S: list[int] = []
        self._S_gen = 0  # bumped whenever S is replaced or edited outside the border updates
        # bordered rows [1; 2 K[S, :n]] for the margin set S as of (_rows_gen, _rows_n)
        self._rows: FloatArray = np.zeros((8, cap))
        self._rows_gen = -1
        self._rows_n = 0
        self._S_buf: IntArray = np.zeros(8, dtype=np.int64)
        self._S_arr: IntArray = self._S_buf[:0]  # a view of _S_buf: S as an array
        self.Rinv: FloatArray = np.zeros((1, 1))
        self.rho = 0.0
        self.solved = False
        self._updates = 0
        self.events = 0  # path events of the current operation
        self.refactorisations = 0
        self._ops = 0  # operations since the last exact gradient recompute
        self._since_polish = 0
        #: set by degenerate handling (near-twin swap, twin hand-over, pivot, snaps) in an
        #: operation: its end recomputes g exactly before the KKT guard reads it
        self._risky = False
        #: keys are stored (False for ``from_gram``): exact duplicates are then recognised by
        #: equal keys rather than by a feature-space distance at rounding level
        self._keyed = True
        #: the compiled fast path's Rinv buffer (capacity-sized) and its event count (diagnostics)
        self._Rbuf: FloatArray = np.zeros((0, 0))
        self.fast_events = 0

    # ------------------------------------------------------------------ the margin set
    @property
    def S(self) -> list[int]:
        """Margin slots in the order of ``Rinv``'s rows (after the leading rho row)."""
        return self._S

    @S.setter
    def S(self, value: list[int]) -> None:
        self._S = [int(s) for s in value]
        self._S_gen += 1

    def _s_changed(self) -> None:
        """Call after editing ``S`` in place (other than by the border updates)."""
        self._S_gen += 1

    def margin_rows(self) -> tuple[IntArray, FloatArray]:
        """``(S, B)`` with ``B = [1; 2 K[S, :n]]`` (a view of the cache, ``(|S|+1, n)``).

        Rebuilt by one gather when ``S`` was replaced or edited outside the border updates (the
        border updates append or delete a row), extended column-wise when slots were appended.
        """
        n = self.n_slots
        m = len(self._S)
        if self._rows_gen != self._S_gen:
            self._ensure_rows(m + 1, n)
            if self._S_buf.size < m + 1:
                self._S_buf = np.zeros(2 * (m + 1), dtype=np.int64)
            S = self._S_buf[:m]
            S[:] = self._S
            self._rows[0, :n] = 1.0
            np.multiply(self.K[S, :n], 2.0, out=self._rows[1 : m + 1, :n])
            self._rows_gen = self._S_gen
            self._rows_n = n
            self._S_arr = S
        elif self._rows_n != n:
            lo = self._rows_n
            self._ensure_rows(m + 1, n)
            if lo < n:
                self._rows[0, lo:n] = 1.0
                np.multiply(self.K[self._S_arr, lo:n], 2.0, out=self._rows[1 : m + 1, lo:n])
            self._rows_n = n
        return self._S_arr, self._rows[: m + 1, :n]

    def _ensure_rows(self, rows: int, cols: int) -> None:
        r0, c0 = self._rows.shape
        if rows <= r0 and cols <= c0:
            return
        new = np.zeros((max(rows, 2 * r0), max(cols, self.K.shape[0])))
        new[:r0, :c0] = self._rows
        self._rows = new

    def _rows_append(self, k: int) -> None:
        """``k`` was appended to S: append its bordered row (if the cache is current)."""
        if self._rows_gen != self._S_gen or self._rows_n != self.n_slots:
            self._rows_gen = -1
            return
        m = len(self._S)  # after the append
        n = self.n_slots
        self._ensure_rows(m + 1, n)
        np.multiply(self.K[k, :n], 2.0, out=self._rows[m, :n])
        if self._S_buf.size < m:
            buf = np.zeros(2 * m, dtype=np.int64)
            buf[: m - 1] = self._S_buf[: m - 1]
            self._S_buf = buf
        self._S_buf[m - 1] = k
        self._S_arr = self._S_buf[:m]

    def _rows_delete(self, p: int) -> None:
        """The margin key at position ``p`` of S was removed: delete its bordered row."""
        if self._rows_gen != self._S_gen or self._rows_n != self.n_slots:
            self._rows_gen = -1
            return
        m = len(self._S)  # after the removal
        n = self.n_slots
        if p < m:
            self._rows[p + 1 : m + 1, :n] = self._rows[p + 2 : m + 2, :n]
            self._S_buf[p:m] = self._S_buf[p + 1 : m + 1]
        self._S_arr = self._S_buf[:m]

    # ------------------------------------------------------------------ storage
    def _grow(self, need: int) -> None:
        cap = self.X.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        X = np.zeros((new, self.dim)); X[:cap] = self.X
        kd = np.zeros(new); kd[:cap] = self.kd
        a = np.zeros(new); a[:cap] = self.alpha
        g = np.zeros(new); g[:cap] = self.g
        st = np.full(new, DEAD, dtype=np.int8); st[:cap] = self.status
        self.X, self.kd, self.alpha, self.g, self.status = X, kd, a, g, st
        if self.K.size:
            K = np.zeros((new, new)); K[: self._kn, : self._kn] = self.K[: self._kn, : self._kn]
            self.K = K

    def append(self, Xnew: FloatArray) -> IntArray:
        """Store new keys as PENDING slots (alpha 0); returns their slots. No solve. Their kernel
        rows are computed now, or (deferred) by :meth:`materialise`."""
        m = Xnew.shape[0]
        lo = self.n_slots
        hi = lo + m
        self._grow(hi)
        self.X[lo:hi] = Xnew
        self.alpha[lo:hi] = 0.0
        self.g[lo:hi] = 0.0
        self.status[lo:hi] = PENDING
        self.n_slots = hi
        if not self.deferred:
            self._build_kernel()
        return np.arange(lo, hi)

    def build_kernel(self) -> None:
        """Build the kernel of every stored key now (a small first solve reads it, as the C&P
        steps after it will: one kernel, the same bits)."""
        self._build_kernel()

    def _build_kernel(self) -> None:
        """Kernel rows and columns of the slots ``_kn..n_slots`` into ``K``, in blocks (the
        kernel's temporaries stay O(block), not O(m n)); every new entry checked finite."""
        lo, hi = self._kn, self.n_slots
        if lo >= hi:
            return
        cap = self.X.shape[0]
        if self.K.shape[0] < cap:
            K = np.zeros((cap, cap)); K[:lo, :lo] = self.K[:lo, :lo]
            self.K = K
        step = max(1, APPEND_BLOCK // hi)
        for r in range(lo, hi, step):
            e = min(hi, r + step)
            Kb = rbf_kernel(self.X[r:e], self.X[:hi], self.sigma)
            check_finite_kernel(Kb)
            self.K[r:e, :hi] = Kb
            self.K[:hi, r:e] = Kb.T
        self.kd[lo:hi] = self.K.diagonal()[lo:hi]
        self._kn = hi

    def defer(self) -> None:
        """Drop the kernel, the bordered inverse and the gradient of a solved keyed state (memory
        O(n d) again); ``materialise`` rebuilds them from the keys and the solution."""
        if not self._keyed or not self.solved:
            return
        self.K = np.zeros((0, 0))
        self._kn = 0
        self.Rinv = np.zeros((1, 1))
        self._rows = np.zeros((8, 0))
        self._rows_gen = -1
        self.deferred = True

    @classmethod
    def from_gram(cls, K: FloatArray, C: float, refactor_every: int = 64) -> Self:
        """A solver over a given symmetric Gram matrix (keys are not stored); call ``initialise``."""
        n = K.shape[0]
        core = cls(C, 1.0, 1, refactor_every)
        core._keyed = False
        core._grow(n)
        cap = core.X.shape[0]
        core.K = np.zeros((cap, cap))
        core.K[:n, :n] = K
        core.kd[:n] = np.diag(K)
        core.status[:n] = PENDING
        core.n_slots = core._kn = n
        return core

    def live(self) -> IntArray:
        return np.flatnonzero(self.status[: self.n_slots] >= 0)

    def compact(self) -> IntArray:
        """Drop dead slots; returns ``old_to_new`` (-1 for dead). Rinv is unaffected (S order kept)."""
        keep = self.live()
        old_to_new = np.full(self.n_slots, -1, dtype=np.int64)
        old_to_new[keep] = np.arange(keep.size)
        n = keep.size
        self.X[:n] = self.X[keep]
        if self._kn == self.n_slots:
            self.K[:n, :n] = self.K[np.ix_(keep, keep)]
            self._kn = n
        else:  # a partly built kernel (deferred): rebuilt whole by the next materialise
            self._kn = 0
        for arr in (self.kd, self.alpha, self.g):
            arr[:n] = arr[keep]
        self.status[:n] = self.status[keep]
        self.status[n : self.n_slots] = DEAD
        self.n_slots = n
        self.S = [int(old_to_new[s]) for s in self._S]
        return old_to_new

    # ------------------------------------------------------------------ gradients
    def recompute_g(self) -> None:
        """``g = rho - diag K + 2 K alpha`` from scratch on live slots."""
        self._ops = 0
        n = self.n_slots
        # dense mat-vec over all slots (dead/pending slots have alpha 0): faster than a gather
        self.g[:n] = self.rho - self.kd[:n] + 2.0 * (self.K[:n, :n] @ self.alpha[:n])

    def end_operation(self) -> None:
        """Bookkeeping at the end of a maintained operation: periodic exact gradient refresh."""
        self._ops += 1
        if self._ops >= G_REFRESH or self._risky:
            self.recompute_g()
        self._risky = False

    # ------------------------------------------------------------------ diagnostics
    def maintained_violation(self) -> float:
        """Largest KKT violation read from the maintained gradient (O(n); no kernel products)."""
        return self._violation(exact_margin=False)

    def margin_residual(self) -> float:
        """Exact ``max |g_S|`` (O(|S| n)): the path sets the maintained ``g_S`` to 0 at every
        event, which would hide an inaccurate margin solve from :meth:`maintained_violation`."""
        if not self._S:
            return 0.0
        S, B = self.margin_rows()
        gS = B[1:] @ self.alpha[: self.n_slots]  # 2 (K alpha)_S
        gS += self.rho
        gS -= self.kd[S]
        np.abs(gS, out=gS)
        return float(gS[gS.argmax()])

    def guard_residual(self) -> float:
        """``max(maintained_violation(), margin_residual())``: what the gate's KKT guard reads
        (one pass; the exact margin gradient and the sum come from one mat-vec)."""
        return self._violation(exact_margin=True)

    def _violation(self, exact_margin: bool) -> float:
        n = self.n_slots
        if n == 0:
            return 0.0
        st = self.status[:n]
        if st[st.argmax()] == PENDING:  # PENDING is the largest status code
            return float("inf")
        a = self.alpha[:n]  # dead slots hold alpha 0
        # error: g <= 0, reserve: g >= 0 (argmax/argmin + a read beat numpy's reductions)
        x = STATUS_SIGN.take(st, mode="wrap")
        x *= self.g[:n]
        v = max(-float(a[a.argmin()]), float(a[a.argmax()]) - self.C, float(x[x.argmax()]))
        if self._S:
            S, B = self.margin_rows()
            gm = np.abs(self.g[S])
            v = max(v, float(gm[gm.argmax()]))
            if exact_margin:
                u = B @ a  # (sum alpha, 2 (K alpha)_S)
                v = max(v, abs(float(u[0]) - 1.0))
                gS = u[1:]
                gS += self.rho
                gS -= self.kd[S]
                np.abs(gS, out=gS)
                return max(v, float(gS[gS.argmax()]))
        return max(v, abs(float(a.sum()) - 1.0))

    def partition_counts(self) -> dict[str, int]:
        # one bincount over the codes as bytes (dead = -1 counts as 255)
        cnt = np.bincount(self.status[: self.n_slots].view(np.uint8), minlength=3).tolist()
        return {"margin": cnt[MARGIN], "error": cnt[ERROR], "reserve": cnt[RESERVE]}

    def snapshot(self) -> dict[str, Any]:
        """Everything an operation may change, for bit-for-bit rollback (K/X are append-only;
        a kernel built since is kept, a bordered inverse or gradient built since is dropped
        with ``deferred``)."""
        n = self.n_slots
        return {
            "deferred": self.deferred,
            "alpha": self.alpha[:n].copy(),
            "g": self.g[:n].copy(),
            "status": self.status[:n].copy(),
            "n_slots": n,
            "S": list(self._S),
            "Rinv": self.Rinv.copy(),
            "rho": self.rho,
            "solved": self.solved,
            "_updates": self._updates,
        }

    def restore(self, snap: dict[str, Any]) -> None:
        n = snap["n_slots"]
        self.alpha[:n] = snap["alpha"]
        self.g[:n] = snap["g"]
        self.status[:n] = snap["status"]
        self.status[n : self.n_slots] = DEAD
        self.alpha[n : self.n_slots] = 0.0
        self.n_slots = n
        self._kn = min(self._kn, n)
        self.deferred = snap["deferred"]
        if not self.deferred:
            self._build_kernel()  # (only if the kernel was dropped since: keys already checked)
        self.S = list(snap["S"])
        self.Rinv = snap["Rinv"].copy()
        self.rho = snap["rho"]
        self.solved = snap["solved"]
        self._updates = snap["_updates"]
