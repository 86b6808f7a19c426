"""Deletion of :class:`sv_core.Gate` (:class:`ForgetMixin`, one of its bases): ``forget``,
``forget_many`` and ``verify_against_refit``.

A deletion runs the C&P decremental path on the maintained solver under the exact-completion
guard (:class:`sv_core._gate_exact.ExactCompletionMixin`), writes a :class:`sv_core.receipts.Receipt`
and, on request, compares the result with an independent :func:`sv_core.refit.refit`; any failure
restores the gate bit for bit.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from sv_core._gate_exact import JITTER_SCALE, VERIFY_KKT, VERIFY_SCORE_TOL, ExactCompletionMixin
from sv_core.errors import InfeasibleError, PathError, RefitError, UnknownTokenError, VerificationError
from sv_core.kernels import rbf_kernel
from sv_core.receipts import Receipt
from sv_core.refit import refit
from sv_core.solver import DEAD, ERROR, MARGIN, RESERVE, MaintainedSVDD
from sv_core.validation import check_token_id

_STATUS_NAMES = {MARGIN: "margin", ERROR: "error", RESERVE: "reserve"}


class ForgetMixin(ExactCompletionMixin):
    """Deletion methods of :class:`sv_core.Gate` (they use its id maps and maintained solver).

    The attributes and the stubs below are what these methods read of the gate; :class:`sv_core.Gate`
    defines every one of them (the stubs are never called)."""

    _core: MaintainedSVDD | None
    _slot_of: dict[int, int]
    _id_of_slot: list[int]
    _forgotten: set[int]

    @property
    def n(self) -> int:
        raise NotImplementedError  # sv_core.gate.Gate

    @property
    def gated(self) -> bool:
        raise NotImplementedError  # sv_core.gate.Gate

    @property
    def keys(self) -> np.ndarray:
        raise NotImplementedError  # sv_core.gate.Gate

    @property
    def alpha(self) -> np.ndarray:
        raise NotImplementedError  # sv_core.gate.Gate

    def _live_slots(self) -> np.ndarray:
        raise NotImplementedError  # sv_core.gate.Gate

    def _maybe_compact(self) -> None:
        raise NotImplementedError  # sv_core.gate.Gate

    def score(self, P) -> np.ndarray:
        raise NotImplementedError  # sv_core.gate.Gate

    def kkt_residual(self) -> dict:
        raise NotImplementedError  # sv_core.gate.Gate

    def _keys_of(self, slots) -> np.ndarray:
        assert self._core is not None
        return self._core.X[slots].copy()

    def _slot(self, token_id) -> int:
        tid = check_token_id(token_id)
        if tid in self._forgotten:
            raise UnknownTokenError(f"token {tid} was already forgotten")
        if tid not in self._slot_of:
            raise UnknownTokenError(f"token {tid} is not in the gate (live ids: {self.n})")
        return self._slot_of[tid]

    def _preflight(self, k: int, what: str) -> None:
        if self.gated and (self.n - k) * self.C < 1.0 - 1e-12:
            if k == 1:
                raise InfeasibleError(
                    f"forgetting {what} would leave n={self.n - 1} keys with C={self.C:.6g}: "
                    f"(n-1)*C = {(self.n - 1) * self.C:.6g} < 1 (the fixed-C problem is infeasible)"
                )
            raise InfeasibleError(
                f"forgetting {k} tokens would leave (n-k)*C = {(self.n - k) * self.C:.6g} < 1"
            )

    def _forget_slot(self, tid: int, slot: int) -> Receipt:
        """Delete one live token (no compaction, no verification). On error the core is restored
        and the id maps are untouched."""
        core = self._core
        assert core is not None
        if core.solved:
            core.materialise()  # a deletion from a solved gate is a C&P step
        n_before = self.n
        gated_before = core.solved
        status_before = _STATUS_NAMES[int(core.status[slot])] if gated_before else "warmup"
        alpha_before = float(core.alpha[slot]) if gated_before else float("nan")
        part_before = core.partition_counts() if gated_before else None
        snap = core.snapshot()
        t0 = time.perf_counter()
        reason = None
        try:
            if core.solved:
                was_reserve = core.status[slot] == RESERVE

                def step():
                    ev = core.remove_slot(slot)
                    # a reserve removal changes no coefficient (Proposition 1); only with S
                    # empty does it move rho, whose KKT interval (and midpoint) it bounds
                    if not was_reserve or not core.S:
                        core.finish()
                    return ev

                def on_fail():
                    core.status[slot] = DEAD
                    core.alpha[slot] = 0.0

                events, reason = self._guarded("forget", step, on_fail, snap)
            else:
                events = 0
                core.status[slot] = DEAD
        except BaseException:
            core.restore(snap)
            raise
        elapsed = time.perf_counter() - t0
        del self._slot_of[tid]
        self._forgotten.add(tid)
        return Receipt(
            token_id=tid,
            C=self.C,
            sigma=self.sigma,
            n_before=n_before,
            n_after=self.n,
            status_before=status_before,
            alpha_before=alpha_before,
            partition_before=part_before,
            partition_after=core.partition_counts() if core.solved else None,
            path_events=int(events),
            elapsed_s=elapsed,
            certified=bool(gated_before and core.solved),
            fallback=reason is not None,
            fallback_reason=reason,
        )

    def _save(self) -> tuple:
        core = self._core
        return (core.snapshot() if core is not None else None, dict(self._slot_of),
                set(self._forgotten), self.fallbacks, len(self.fallback_log))

    def _rollback(self, saved: tuple) -> None:
        snap, slot_of, forgotten, fallbacks, n_log = saved
        if snap is not None and self._core is not None:
            self._core.restore(snap)
        self._slot_of, self._forgotten, self.fallbacks = slot_of, forgotten, fallbacks
        del self.fallback_log[n_log:]

    def _verify_or_fallback(self, receipt: Receipt, removed, seed: int) -> None:
        """Attach the verification; if it fails its tolerances, take the exact fallback and
        verify again; raise :class:`VerificationError` if it still fails (caller rolls back)."""
        try:
            ver = self.verify_against_refit(removed=removed, seed=seed)
            if not (ver["max_abs_score_dev"] <= VERIFY_SCORE_TOL and ver["kkt_residual"] <= VERIFY_KKT):
                reason = (f"verification: score deviation {ver['max_abs_score_dev']:.3g}, "
                          f"KKT {ver['kkt_residual']:.3g}")
                self._exact_fallback("forget", reason)
                receipt.fallback, receipt.fallback_reason = True, reason
                ver = self.verify_against_refit(removed=removed, seed=seed)
                if not (ver["max_abs_score_dev"] <= VERIFY_SCORE_TOL and ver["kkt_residual"] <= VERIFY_KKT):
                    raise VerificationError(
                        f"deletion of token {receipt.token_id} could not be verified: score deviation "
                        f"{ver['max_abs_score_dev']:.3g}, KKT {ver['kkt_residual']:.3g}; gate restored"
                    )
        except (RefitError, PathError) as exc:
            raise VerificationError(
                f"deletion of token {receipt.token_id} could not be verified ({type(exc).__name__}: "
                f"{exc}); gate restored"
            ) from exc
        receipt.verification = ver

    def forget(self, token_id: int, verify: bool = False, probe_seed: int = 0) -> Receipt:
        """Delete a token by the C&P decremental path; returns a JSON-serialisable receipt.

        Preflight (no state change on failure): the id must be a live integer id, and
        ``(n-1) C >= 1``. If the maintained path cannot complete, or its KKT residual guard trips,
        the deletion completes by the exact fallback (fresh refit of the retained keys, state
        rebuilt from it) and ``receipt.fallback`` is True. ``verify=True`` compares the result
        with an independent :func:`refit` on retained, removed and jittered probes; if that
        comparison cannot be made or fails its tolerances after the fallback, a
        :class:`VerificationError` is raised and the gate is restored bit-for-bit.
        """
        slot = self._slot(token_id)
        tid = int(token_id)
        self._preflight(1, f"token {tid}")
        removed_key = self._keys_of([slot]) if verify else None
        saved = self._save() if verify else None
        receipt = self._forget_slot(tid, slot)
        if verify and self.gated:
            try:
                self._verify_or_fallback(receipt, removed_key, probe_seed)
            except BaseException:
                assert saved is not None
                self._rollback(saved)
                raise
        self._maybe_compact()
        return receipt

    def forget_many(self, token_ids: Iterable[int], verify: bool = False) -> list[Receipt]:
        """Forget several tokens; all-or-nothing (the gate is restored if any deletion fails).

        ``verify=True`` compares the state after the last deletion with one independent same-C
        :func:`refit` of the retained keys (probes: retained, removed and jittered keys). That one
        comparison verifies every deletion of the call, so each receipt carries it, with
        ``verification["batch_tokens"]`` naming the tokens it covers; the intermediate states
        (after some but not all of the deletions) are not refit. ``fallback`` is set on the last
        receipt when the verification took the exact fallback.
        """
        try:
            token_ids = list(token_ids)
        except TypeError as exc:
            raise UnknownTokenError(f"token ids must be an iterable of integers, got {token_ids!r}") from exc
        tids = [check_token_id(t) for t in token_ids]
        if len(set(tids)) != len(tids):
            raise UnknownTokenError("token ids to forget contain repeats")
        if not tids:
            return []
        slots = [self._slot(t) for t in tids]
        self._preflight(len(tids), f"{len(tids)} tokens")
        removed = self._keys_of(slots) if verify else None
        saved = self._save()
        try:
            out = [self._forget_slot(t, s) for t, s in zip(tids, slots)]
            if verify and self.gated:
                self._verify_or_fallback(out[-1], removed, 0)
                ver = out[-1].verification or {}
                for r in out:
                    r.verification = {**ver, "batch_tokens": list(tids)}
        except BaseException:
            self._rollback(saved)
            raise
        self._maybe_compact()
        return out

    def verify_against_refit(self, removed=None, seed: int = 0) -> dict:
        """Max |gate score difference| between this state and an independent :func:`refit`."""
        X = self.keys
        a_ref, rho_ref = refit(X, C=self.C, sigma=self.sigma)
        rng = np.random.default_rng(seed)
        probes = {"retained": X, "jittered": X + JITTER_SCALE * rng.standard_normal(X.shape)}
        if removed is not None and len(removed):
            probes["removed"] = np.asarray(removed, dtype=np.float64)
        dev = {}
        for name, P in probes.items():
            s_ref = 2.0 * rbf_kernel(P, X, self.sigma) @ a_ref - rho_ref
            dev[name] = float(np.abs(self.score(P) - s_ref).max())
        tol = 1e-9 * self.C
        part_ref = np.where(a_ref <= tol, RESERVE, np.where(a_ref >= self.C - tol, ERROR, MARGIN))
        assert self._core is not None
        part_here = self._core.status[self._live_slots()]
        return {
            "max_abs_score_dev": max(dev.values()),
            "score_dev_by_probe": dev,
            "max_abs_alpha_dev": float(np.abs(self.alpha - a_ref).max()),
            "partition_match": bool(np.array_equal(part_ref, part_here)),
            "kkt_residual": self.kkt_residual()["max"],
        }
