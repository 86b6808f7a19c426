"""The maintained fp64 Cauwenberghs-Poggio (C&P) solver of the fixed-C SVDD dual.

Problem (SPEC §1)::

    min_a  a^T K a - diag(K)^T a    s.t.  sum(a) = 1,  0 <= a_i <= C

State: keys, coefficients ``alpha``, offset ``rho``, gradient ``g_i = rho - K_ii + 2 (K a)_i``,
the partition margin ``S`` (0 < a < C, g = 0), error ``E`` (a = C, g <= 0), reserve ``R``
(a = 0, g >= 0), and ``Rinv = M^{-1}`` for the bordered matrix ``M = [[0, 1^T], [1, 2 K_SS]]``,
kept by rank-one border updates (a key enters S) and Schur downdates (a key leaves S), with a
full refactorisation every ``refactor_every`` updates and whenever a conditioning guard trips.

One event loop, :meth:`MaintainedSVDD._sweep`, moves a single coefficient ``alpha_c`` while all
other keys keep their KKT conditions. It serves:

* admission ("settle"): a new key enters with ``alpha_c = 0``; if ``g_c < 0`` it is increased
  until ``g_c`` reaches 0 (margin) or ``alpha_c`` reaches C (error);
* initialisation: the first keys start *pending* at ``alpha = 1/n`` (feasible) and are settled one
  by one, moving ``alpha_c`` up or down until its own KKT condition holds;
* deletion ("remove"): ``alpha_c`` is driven to 0 whatever ``g_c`` does.

When the margin set is empty no coefficient can move without breaking ``sum(a) = 1``; the loop
then sweeps ``rho`` instead (every ``g`` moves at rate 1) until an error or reserve key reaches
``g = 0`` and joins the margin set. This is what lets a decrement complete when S empties
mid-path (the seed's reference raised there).

Slots are internal positions; the public :class:`sv_core.Gate` maps stable token ids to slots.
"""
from __future__ import annotations

import numpy as np

from .errors import PathError
from .kernels import rbf_kernel

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
_NAMES = {RESERVE: "reserve", MARGIN: "margin", ERROR: "error", PENDING: "pending"}


class _Degenerate(Exception):
    """A key cannot join the margin set: its Schur complement is ~0 (it duplicates margin keys)."""


class MaintainedSVDD:
    """Slot-based maintained C&P state (fp64). Not thread-safe.

    Parameters
    ----------
    C : float, the fixed box.
    sigma : float, RBF bandwidth.
    dim : int, key dimension.
    refactor_every : int, refactorise ``Rinv`` after this many low-rank updates.
    """

    #: tolerance on rates (beta, gamma) below which a coefficient/gradient is treated as constant
    RATE_EPS = 1e-13
    #: relative Schur-complement size below which a border update is refused as ill-conditioned
    GUARD = 1e-14

    def __init__(self, C: float, sigma: float, dim: int, refactor_every: int = 64):
        self.C = float(C)
        self.sigma = float(sigma)
        self.dim = int(dim)
        self.refactor_every = int(refactor_every)
        cap = 16
        self.X = np.zeros((cap, dim))
        self.K = np.zeros((cap, cap))
        self.kd = np.zeros(cap)
        self.alpha = np.zeros(cap)
        self.g = np.zeros(cap)
        self.status = np.full(cap, DEAD, dtype=np.int8)
        self.n_slots = 0
        self.S: list[int] = []
        self.Rinv = np.zeros((1, 1))
        self.rho = 0.0
        self.solved = False
        self._updates = 0
        self.events = 0  # path events of the current operation
        self.refactorisations = 0
        #: keys are stored (False for ``from_gram``): exact duplicates are then recognised by
        #: equal keys rather than by a feature-space distance at rounding level
        self._keyed = True

    # ------------------------------------------------------------------ storage
    def _grow(self, need: int) -> None:
        cap = self.X.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        X = np.zeros((new, self.dim)); X[:cap] = self.X
        K = np.zeros((new, new)); K[:cap, :cap] = self.K
        kd = np.zeros(new); kd[:cap] = self.kd
        a = np.zeros(new); a[:cap] = self.alpha
        g = np.zeros(new); g[:cap] = self.g
        st = np.full(new, DEAD, dtype=np.int8); st[:cap] = self.status
        self.X, self.K, self.kd, self.alpha, self.g, self.status = X, K, kd, a, g, st

    def append(self, Xnew: np.ndarray) -> np.ndarray:
        """Store new keys as PENDING slots (alpha 0); returns their slots. No solve."""
        m = Xnew.shape[0]
        lo = self.n_slots
        hi = lo + m
        self._grow(hi)
        self.X[lo:hi] = Xnew
        Knew = rbf_kernel(Xnew, self.X[:hi], self.sigma)
        self.K[lo:hi, :hi] = Knew
        self.K[:hi, lo:hi] = Knew.T
        self.kd[lo:hi] = np.diag(self.K)[lo:hi]
        self.alpha[lo:hi] = 0.0
        self.g[lo:hi] = 0.0
        self.status[lo:hi] = PENDING
        self.n_slots = hi
        return np.arange(lo, hi)

    @classmethod
    def from_gram(cls, K: np.ndarray, C: float, refactor_every: int = 64) -> "MaintainedSVDD":
        """A solver over a given symmetric Gram matrix (keys are not stored); call ``initialise``."""
        n = K.shape[0]
        core = cls(C, 1.0, 1, refactor_every)
        core._keyed = False
        core._grow(n)
        core.K[:n, :n] = K
        core.kd[:n] = np.diag(K)
        core.status[:n] = PENDING
        core.n_slots = n
        return core

    def live(self) -> np.ndarray:
        return np.flatnonzero(self.status[: self.n_slots] >= 0)

    def compact(self) -> np.ndarray:
        """Drop dead slots; returns ``old_to_new`` (-1 for dead). Rinv is unaffected (S order kept)."""
        keep = self.live()
        old_to_new = np.full(self.n_slots, -1, dtype=np.int64)
        old_to_new[keep] = np.arange(keep.size)
        n = keep.size
        self.X[:n] = self.X[keep]
        self.K[:n, :n] = self.K[np.ix_(keep, keep)]
        for arr in (self.kd, self.alpha, self.g):
            arr[:n] = arr[keep]
        self.status[:n] = self.status[keep]
        self.status[n : self.n_slots] = DEAD
        self.n_slots = n
        self.S = [int(old_to_new[s]) for s in self.S]
        return old_to_new

    # ------------------------------------------------------------------ linear algebra
    def _cvec(self) -> np.ndarray:
        """Right-hand side ``c`` of ``M u = c`` given all non-margin coefficients."""
        S = np.asarray(self.S, dtype=np.int64)
        n = self.n_slots
        a = self.alpha[:n].copy()
        a[S] = 0.0  # fixed (non-margin) coefficients only; dead slots hold 0
        c = np.empty(S.size + 1)
        c[0] = 1.0 - a.sum()
        c[1:] = self.kd[S] - 2.0 * (self.K[S, :n] @ a)
        return c

    def _bordered(self) -> np.ndarray:
        S = np.asarray(self.S, dtype=np.int64)
        m = S.size
        M = np.zeros((m + 1, m + 1))
        M[0, 1:] = 1.0
        M[1:, 0] = 1.0
        M[1:, 1:] = 2.0 * self.K[np.ix_(S, S)]
        return M

    def refactor(self) -> None:
        """Recompute ``Rinv = M^{-1}`` from scratch."""
        M = self._bordered()
        try:
            self.Rinv = np.linalg.inv(M)
        except np.linalg.LinAlgError as exc:  # pragma: no cover - guarded by callers
            raise PathError(f"bordered KKT matrix is singular with |S|={len(self.S)}") from exc
        self._updates = 0
        self.refactorisations += 1

    def _border_add(self, k: int, near_tol: float = 0.0) -> None:
        """Add slot k to the margin set (rank-one border update of ``Rinv``).

        Raises ``_Degenerate(k, j)`` if k duplicates margin key j (equal keys; else, or without
        stored keys, feature-space squared distance ``<= DUPLICATE_TOL``), ``_Degenerate(k, j,
        "near")`` if it is a distinct near-twin of j (``<= near_tol``; checked first when keys are
        stored), and ``_Degenerate(k)`` if its Schur complement is ~0.
        """
        S = np.asarray(self.S, dtype=np.int64)
        v = np.empty(S.size + 1)
        v[0] = 1.0
        v[1:] = 2.0 * self.K[S, k]
        b = -self.Rinv @ v
        kappa = 2.0 * self.K[k, k] + v @ b
        scale = max(1.0, 2.0 * self.K[k, k])
        if S.size:
            # exact duplicate of a margin key (feature-space distance ~0): M would be singular
            d2 = self.kd[S] + self.K[k, k] - 2.0 * self.K[S, k]
            j = int(np.argmin(d2))
            if self._keyed:
                same = np.flatnonzero((self.X[S] == self.X[k]).all(axis=1))
                if same.size:
                    raise _Degenerate(int(k), int(S[same[0]]))
                if d2[j] <= near_tol:
                    raise _Degenerate(int(k), int(S[j]), "near")
            if d2[j] <= DUPLICATE_TOL:
                raise _Degenerate(int(k), int(S[j]))
            if d2[j] <= near_tol:
                raise _Degenerate(int(k), int(S[j]), "near")
        if S.size and kappa <= 1e-6 * scale and self._updates > 0:
            # conditioning guard: a small Schur complement is computed with a fresh inverse
            self.refactor()
            b = -self.Rinv @ v
            kappa = 2.0 * self.K[k, k] + v @ b
        if S.size and kappa <= self.GUARD * scale:
            raise _Degenerate(int(k))
        self.S.append(int(k))
        self._updates += 1
        if S.size == 0 or self._updates >= self.refactor_every:
            self.refactor()
            return
        m = S.size + 1
        R = np.zeros((m + 1, m + 1))
        R[:m, :m] = self.Rinv
        bb = np.append(b, 1.0)
        R += np.outer(bb, bb) / kappa
        self.Rinv = R

    def _border_remove(self, k: int) -> None:
        p = self.S.index(int(k))
        r = p + 1
        R = self.Rinv
        piv = R[r, r]
        self.S.pop(p)
        self._updates += 1
        if abs(piv) < 1e-14 or self._updates >= self.refactor_every or not self.S:
            if self.S:
                self.refactor()
            else:
                self.Rinv = np.zeros((1, 1))
            return
        keep = np.r_[0:r, r + 1 : R.shape[0]]
        col = R[keep, r]
        self.Rinv = R[np.ix_(keep, keep)] - np.outer(col, R[r, keep]) / piv

    # ------------------------------------------------------------------ gradients
    def recompute_g(self) -> None:
        """``g = rho - diag K + 2 K alpha`` from scratch on live slots."""
        n = self.n_slots
        # dense mat-vec over all slots (dead/pending slots have alpha 0): faster than a gather
        self.g[:n] = self.rho - self.kd[:n] + 2.0 * (self.K[:n, :n] @ self.alpha[:n])

    def polish(self) -> None:
        """Re-solve ``u = Rinv c`` on the margin set and recompute g (end of every operation).

        With S empty, ``rho`` is not unique; it is set to the midpoint of its KKT interval
        (the same convention as :func:`sv_core.refit`).
        """
        tol = SNAP_TOL * self.C
        while self.S:
            cv = self._cvec()
            u = self.Rinv @ cv
            M = self._bordered()
            r = cv - M @ u
            if np.abs(r).max() > INVERSE_GUARD:
                # conditioning guard: the maintained inverse has drifted; refactorise
                self.refactor()
                u = np.linalg.solve(M, cv)
            else:
                u += self.Rinv @ r  # one step of iterative refinement
            S = np.asarray(self.S, dtype=np.int64)
            aS = u[1:]
            low = aS <= tol
            high = aS >= self.C - tol
            if not (low.any() or high.any()):
                self.rho = float(u[0])
                self.alpha[S] = aS
                self.recompute_g()
                return
            # a margin coefficient sitting on its bound: the partition is degenerate and rho
            # is not pinned by it; move it to the bound so rho follows the canonical convention
            for k, lo_, hi_ in zip(S, low, high):
                if lo_ or hi_:
                    self.alpha[k] = 0.0 if lo_ else self.C
                    self.status[k] = RESERVE if lo_ else ERROR
                    self._border_remove(int(k))
                    break
        if not self.S:
            self.rho = 0.0
            self.recompute_g()
            self.rho = rho_midpoint(self.g, self.status, self.live())
            self.recompute_g()

    # ------------------------------------------------------------------ the event loop
    def _rates(self, c: int):
        """beta (margin sensitivities incl. rho) and gamma (gradient sensitivities)."""
        S = np.asarray(self.S, dtype=np.int64)
        v = np.empty(S.size + 1)
        v[0] = 1.0
        v[1:] = 2.0 * self.K[S, c]
        beta = -self.Rinv @ v
        n = self.n_slots
        # contiguous row gather of K[S, :n] (K is symmetric) instead of a column gather
        gam_all = 2.0 * self.K[c, :n] + beta[0] + 2.0 * (beta[1:] @ self.K[S, :n])
        return S, beta, gam_all

    def _sweep(self, c: int, mode: str, max_events: int | None = None) -> int:
        """Move ``alpha_c`` keeping KKT on every other settled key.

        mode ``"settle"``: stop when ``g_c = 0`` (c joins S) or ``alpha_c`` hits its bound.
        mode ``"remove"``: stop when ``alpha_c = 0``.
        Returns the number of path events. Raises :class:`PathError` if it cannot complete.
        """
        C = self.C
        events = 0
        if max_events is None:
            max_events = 20 * max(self.n_slots, 1) + 200
        zero_steps = 0
        pinned: dict[int, int] = {}  # exact duplicates of margin keys: g pinned at 0 with their twin
        while True:
            if events > max_events:
                raise PathError(f"C&P path did not terminate within {max_events} events")
            if mode == "remove":
                s = -1.0
                if self.alpha[c] <= 0.0:
                    self.alpha[c] = 0.0
                    return events
            else:
                gc = self.g[c]
                if gc < 0.0 and self.alpha[c] < C:
                    s = 1.0
                elif gc > 0.0 and self.alpha[c] > 0.0:
                    s = -1.0
                else:
                    self._classify_settled(c)
                    return events

            if not self.S:
                # margin set empty: sweep rho (every g moves at the same rate)
                live = self.live()
                others = live[(self.status[live] != MARGIN) & (live != c)]
                ost = self.status[others]
                cand_t, cand_k = [], []
                if s > 0:  # increase rho: error keys (g <= 0) and c's own g approach 0
                    pool = others[ost == ERROR]
                    if pool.size:
                        j = int(np.argmax(self.g[pool]))
                        cand_t.append(max(0.0, -self.g[pool[j]])); cand_k.append(int(pool[j]))
                    if mode == "settle":
                        cand_t.append(max(0.0, -self.g[c])); cand_k.append(c)
                else:  # decrease rho: reserve keys (g >= 0) approach 0
                    pool = others[ost == RESERVE]
                    if pool.size:
                        j = int(np.argmin(self.g[pool]))
                        cand_t.append(max(0.0, self.g[pool[j]])); cand_k.append(int(pool[j]))
                    if mode == "settle":
                        cand_t.append(max(0.0, self.g[c])); cand_k.append(c)
                if not cand_t and mode == "remove" and self.alpha[c] <= SNAP_TOL * C:
                    # the remaining keys already carry the mass (rounding residue only)
                    self.alpha[c] = 0.0
                    return events
                if not cand_t:
                    raise PathError(
                        "margin set is empty and no error/reserve key can enter it; "
                        "the problem would become infeasible"
                    )
                j = int(np.argmin(cand_t))
                t, k = cand_t[j], cand_k[j]
                delta = s * t
                self.rho += delta
                idx = live
                self.g[idx] += delta
                events += 1
                if k == c:
                    self.g[c] = 0.0
                    self._classify_settled(c, prefer_margin=True)
                    return events
                self.g[k] = 0.0
                self.status[k] = MARGIN
                self._border_add(k)  # S is empty here, so this cannot be degenerate
                continue

            S, beta, gam_all = self._rates(c)
            n = self.n_slots
            eps = self.RATE_EPS
            # c reaches its bound
            best_t = (C - self.alpha[c]) if s > 0 else self.alpha[c]
            best = ("c_bound", c)
            # c's gradient reaches 0 (settle only)
            if mode == "settle":
                rate = gam_all[c] * s
                if (self.g[c] < 0 and rate > eps) or (self.g[c] > 0 and rate < -eps):
                    t = -self.g[c] / rate
                    if t < best_t:
                        best_t, best = t, ("c_g", c)
            # margin keys reach 0 or C
            rS = beta[1:] * s
            aS = self.alpha[S]
            t_S = np.full(S.size, np.inf)
            down = rS < -eps
            up = rS > eps
            t_S[down] = aS[down] / -rS[down]
            t_S[up] = (C - aS[up]) / rS[up]
            if S.size:
                j = int(np.argmin(t_S))
                if t_S[j] < best_t:
                    best_t, best = max(t_S[j], 0.0), ("S_to_R" if down[j] else "S_to_E", int(S[j]))
            # error / reserve keys' gradients reach 0 (status arrays over all slots; c excluded)
            st = self.status[:n]
            ro = gam_all * s
            go = self.g[:n]
            t_o = np.full(n, np.inf)
            e_sel = (st == ERROR) & (ro > eps)
            r_sel = (st == RESERVE) & (ro < -eps)
            e_sel[c] = r_sel[c] = False
            for k_, tw in list(pinned.items()):
                if st[tw] != MARGIN or st[k_] == MARGIN:
                    del pinned[k_]
                else:
                    e_sel[k_] = r_sel[k_] = False
            t_o[e_sel] = np.maximum(-go[e_sel], 0.0) / ro[e_sel]
            t_o[r_sel] = np.maximum(go[r_sel], 0.0) / -ro[r_sel]
            j = int(np.argmin(t_o))
            if t_o[j] < best_t:
                best_t, best = t_o[j], ("E_to_S" if st[j] == ERROR else "R_to_S", j)
            if not np.isfinite(best_t):
                raise PathError("no finite C&P step")
            t = float(best_t)
            zero_steps = zero_steps + 1 if t == 0.0 else 0
            if zero_steps > 2 * len(self.S) + 50:
                raise PathError("C&P path is cycling on degenerate (zero-length) steps")
            d = s * t
            self.alpha[c] += d
            self.alpha[S] += beta[1:] * d
            self.rho += beta[0] * d
            self.g[:n] += gam_all * d  # (dead slots carry meaningless g; never read)
            self.g[S] = 0.0
            for k_ in pinned:
                self.g[k_] = 0.0
            events += 1
            kind, k = best
            if kind == "c_bound":
                self.alpha[c] = C if s > 0 else 0.0
                if mode == "remove":
                    return events
                self._classify_settled(c)
                return events
            if kind == "c_g":
                self.g[c] = 0.0
                self._join_margin_or_yield(c)
                return events
            if kind == "S_to_R":
                self.alpha[k] = 0.0
                self.g[k] = 0.0
                self.status[k] = RESERVE
                self._border_remove(k)
            elif kind == "S_to_E":
                self.alpha[k] = C
                self.g[k] = 0.0
                self.status[k] = ERROR
                self._border_remove(k)
            else:  # E_to_S / R_to_S
                self.g[k] = 0.0
                prev = self.status[k]
                self.status[k] = MARGIN
                try:
                    self._border_add(k, near_tol=NEAR_TWIN_TOL)
                except _Degenerate as exc:
                    self.status[k] = prev
                    if len(exc.args) > 2:
                        self._swap_near_twin(k, exc.args[1], prev)
                        continue
                    if len(exc.args) > 1:
                        # exact duplicate of a margin key: g_k = 0 with its bound is valid KKT;
                        # it stays where it is and its gradient moves with its twin's (0)
                        pinned[k] = exc.args[1]
                        continue
                    raise PathError("a key reaching the margin duplicates the margin set") from exc
            if self._updates == 0 and self.S:
                # just refactorised: re-solve the margin system so drift does not accumulate
                u = self.Rinv @ self._cvec()
                self.rho = float(u[0])
                self.alpha[np.asarray(self.S)] = u[1:]
                self.recompute_g()

    def _swap_near_twin(self, k: int, j: int, prev: int) -> None:
        """Key k (at its bound, status ``prev``) reaches ``g_k = 0`` beside its near-twin j in S.

        Along the exact path the pair's gradient difference changes at first order in their
        distance while moving mass between them changes it only at second order, so the mass
        moves at a rate ~ 1/distance^2 until j reaches the bound k left: a step of length
        ~distance^2. It is taken in one go: k joins S, j takes k's bound (0 from the reserve set,
        C from the error set; total mass is unchanged), and the margin system is re-solved on
        the new partition (which is well conditioned: j has left it).
        """
        self._border_remove(j)
        self.status[j] = prev
        self.alpha[j] = 0.0 if prev == RESERVE else self.C
        self.status[k] = MARGIN
        try:
            self._border_add(k)
        except _Degenerate as exc:
            raise PathError("a near-twin swapped into the margin set duplicates it") from exc
        self.refactor()
        u = self.Rinv @ self._cvec()
        self.rho = float(u[0])
        self.alpha[np.asarray(self.S, dtype=np.int64)] = u[1:]
        self.recompute_g()

    def _classify_settled(self, c: int, prefer_margin: bool = False) -> None:
        a = self.alpha[c]
        if a <= 0.0:
            self.alpha[c] = 0.0
            self.status[c] = RESERVE
        elif a >= self.C:
            self.alpha[c] = self.C
            self.status[c] = ERROR
        else:
            # strictly inside the box: must be a margin key
            self._join_margin_or_yield(c)

    def _join_margin_or_yield(self, c: int) -> None:
        """Put c (g_c = 0, alpha_c inside the box) in S; if it duplicates margin keys, hand its
        coefficient to them instead (drive alpha_c to 0 along the path; g_c stays 0)."""
        try:
            self.status[c] = MARGIN
            self._border_add(c)
        except _Degenerate as exc:
            twin = exc.args[1] if len(exc.args) > 1 else None
            if twin is not None:
                # exact duplicate: K columns are identical, so moving mass between the two keys
                # changes no gradient; the twin takes what fits under C, c keeps the rest
                total = self.alpha[c] + self.alpha[twin]
                if total <= self.C:
                    self.alpha[twin] = total
                    self.alpha[c] = 0.0
                    self.status[c] = RESERVE
                else:
                    self.alpha[twin] = self.C
                    self.alpha[c] = total - self.C
                    self.status[twin] = ERROR
                    self.g[twin] = 0.0
                    self.S[self.S.index(twin)] = int(c)  # same row of M: Rinv is unchanged
                    self.status[c] = MARGIN
                self.g[c] = 0.0
                return
            self.status[c] = ERROR  # fixed while it is swept
            self._sweep(c, "remove")
            self.alpha[c] = 0.0
            self.status[c] = RESERVE

    # ------------------------------------------------------------------ operations
    def settle(self, c: int) -> int:
        """Bring a PENDING slot to KKT (admission or initialisation)."""
        live = self.live()
        settled = live[(self.status[live] != PENDING) & (live != c)]
        if settled.size == 0:
            # first key of the solve: rho is free; choose it so that g_c = 0
            sup = live[self.alpha[live] != 0.0]
            self.rho = float(self.kd[c] - 2.0 * (self.K[c, sup] @ self.alpha[sup]))
            self.g[c] = 0.0
            self.status[c] = RESERVE  # provisional, replaced below
            self._classify_settled(c, prefer_margin=True)
            return 0
        sup = live[self.alpha[live] != 0.0]
        self.g[c] = self.rho - self.kd[c] + 2.0 * (self.K[c, sup] @ self.alpha[sup])
        self.status[c] = RESERVE if self.alpha[c] == 0.0 else ERROR  # outside S while it moves
        return self._sweep(c, "settle")

    def initialise(self) -> int:
        """Solve from scratch by settling every pending key from the feasible start 1/n."""
        live = self.live()
        self.alpha[live] = 1.0 / live.size
        self.S = []
        self.Rinv = np.zeros((1, 1))
        events = 0
        for c in live:
            events += self.settle(int(c))
        self.solved = True
        if self.S:
            self.refactor()
        self.polish()
        return events

    def admit_slot(self, c: int) -> int:
        self.alpha[c] = 0.0
        ev = self.settle(c)
        return ev

    def remove_slot(self, c: int) -> int:
        """Decrement ``alpha_c`` to 0 by the reverse C&P path, then drop the slot."""
        ev = 0
        if self.status[c] == MARGIN:
            self._border_remove(c)
            self.status[c] = ERROR  # treated as a fixed coefficient while it is swept
        if self.alpha[c] > 0.0:
            self.g[c] = 0.0
            ev = self._sweep(c, "remove")
        self.alpha[c] = 0.0
        self.status[c] = DEAD
        return ev

    # ------------------------------------------------------------------ diagnostics
    def kkt_residual(self) -> dict:
        """KKT violations recomputed from scratch (not from the maintained g)."""
        live = self.live()
        a = self.alpha[live]
        st = self.status[live]
        sup = live[a != 0.0]
        g = self.rho - self.kd[live] + 2.0 * (self.K[np.ix_(live, sup)] @ self.alpha[sup])
        out = {
            "sum": float(abs(a.sum() - 1.0)),
            "box": float(max(0.0, -a.min(initial=0.0), (a - self.C).max(initial=0.0))),
            "margin_gradient": float(np.abs(g[st == MARGIN]).max(initial=0.0)),
            "error_gradient": float(np.maximum(g[st == ERROR], 0.0).max(initial=0.0)),
            "reserve_gradient": float(np.maximum(-g[st == RESERVE], 0.0).max(initial=0.0)),
        }
        if self.S:
            M = self._bordered()
            # diagnostic only: ||M Rinv - I|| grows with cond(M) even when the solution is exact
            out["inverse"] = float(np.abs(M @ self.Rinv - np.eye(M.shape[0])).max())
        else:
            out["inverse"] = 0.0
        out["max"] = max(v for k, v in out.items() if k != "inverse")
        return out

    def partition_counts(self) -> dict:
        st = self.status[: self.n_slots]
        counts = np.bincount(st[st >= 0], minlength=4)
        return {"margin": int(counts[MARGIN]), "error": int(counts[ERROR]), "reserve": int(counts[RESERVE])}

    def snapshot(self) -> dict:
        """Everything an operation may change, for bit-for-bit rollback (K/X are append-only)."""
        n = self.n_slots
        return {
            "alpha": self.alpha[:n].copy(),
            "g": self.g[:n].copy(),
            "status": self.status[:n].copy(),
            "n_slots": n,
            "S": list(self.S),
            "Rinv": self.Rinv.copy(),
            "rho": self.rho,
            "solved": self.solved,
            "_updates": self._updates,
        }

    def restore(self, snap: dict) -> None:
        n = snap["n_slots"]
        self.alpha[:n] = snap["alpha"]
        self.g[:n] = snap["g"]
        self.status[:n] = snap["status"]
        self.status[n : self.n_slots] = DEAD
        self.alpha[n : self.n_slots] = 0.0
        self.n_slots = n
        self.S = list(snap["S"])
        self.Rinv = snap["Rinv"].copy()
        self.rho = snap["rho"]
        self.solved = snap["solved"]
        self._updates = snap["_updates"]


def rho_midpoint(g_at_rho0: np.ndarray, status: np.ndarray, idx: np.ndarray) -> float:
    """Midpoint of the KKT interval for rho when the margin set is empty.

    ``g_at_rho0`` holds ``g_i`` evaluated at ``rho = 0``; reserve keys need ``rho >= -g_i``,
    error keys ``rho <= -g_i``.
    """
    st = status[idx]
    g0 = g_at_rho0[idx]
    lo = (-g0[st == RESERVE]).max(initial=-np.inf)
    hi = (-g0[st == ERROR]).min(initial=np.inf)
    if np.isfinite(lo) and np.isfinite(hi):
        return float(0.5 * (lo + hi))
    if np.isfinite(lo):
        return float(lo)
    if np.isfinite(hi):
        return float(hi)
    return 0.0
