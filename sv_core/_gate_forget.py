"""Deletion from a gate's state (the work behind :meth:`sv_core.Gate.forget` and ``forget_many``).

:func:`forget_slot` runs the C&P decremental path on the maintained solver under the exact-
completion guard (:class:`sv_core._gate_exact.ExactCompletion`) and writes the
:class:`sv_core.receipts.Receipt`; :func:`verify_or_fallback` compares the result with an
independent :func:`sv_core.refit.refit` (:func:`refit_comparison`) and takes the exact fallback
when it disagrees. The caller (:class:`sv_core.Gate`) restores the state bit for bit on failure.
"""
from __future__ import annotations

import time

import numpy as np

from sv_core._gate_exact import JITTER_SCALE, VERIFY_KKT, VERIFY_SCORE_TOL
from sv_core._gate_state import GateState
from sv_core.errors import InfeasibleError, PathError, RefitError, VerificationError
from sv_core.kernels import rbf_kernel
from sv_core.receipts import Receipt
from sv_core.refit import refit
from sv_core.solver import DEAD, ERROR, MARGIN, RESERVE, STATUS_NAMES


def preflight(state: GateState, k: int, what: str) -> None:
    """Refuse (no state change) a deletion of k keys that would leave ``(n - k) C < 1``."""
    n, C = state.n, state.C
    if state.solved and (n - k) * C < 1.0 - 1e-12:
        if k == 1:
            raise InfeasibleError(
                f"forgetting {what} would leave n={n - 1} keys with C={C:.6g}: "
                f"(n-1)*C = {(n - 1) * C:.6g} < 1 (the fixed-C problem is infeasible)"
            )
        raise InfeasibleError(f"forgetting {k} tokens would leave (n-k)*C = {(n - k) * C:.6g} < 1")


def forget_slot(state: GateState, tid: int, slot: int) -> Receipt:
    """Delete one live token (no compaction, no verification). On error the solver is restored
    and the ids are untouched."""
    core = state.stored()
    gated_before = core.solved
    if gated_before:
        core.materialise()  # a deletion from a solved gate is a C&P step
    n_before = state.n
    status_before = STATUS_NAMES[int(core.status[slot])] if gated_before else "warmup"
    alpha_before = float(core.alpha[slot]) if gated_before else float("nan")
    part_before = core.partition_counts() if gated_before else None
    snap = core.snapshot()
    t0 = time.perf_counter()
    reason = None
    try:
        if gated_before:
            was_reserve = core.status[slot] == RESERVE

            def step() -> int:
                ev = core.remove_slot(slot)
                # a reserve removal changes no coefficient (Proposition 1); only with S
                # empty does it move rho, whose KKT interval (and midpoint) it bounds
                if not was_reserve or not core.S:
                    core.finish()
                return ev

            def on_fail() -> None:
                core.status[slot] = DEAD
                core.alpha[slot] = 0.0

            events, reason = state.exact.guarded(core, "forget", step, on_fail, snap)
        else:
            events = 0
            core.status[slot] = DEAD
    except BaseException:
        core.restore(snap)
        raise
    elapsed = time.perf_counter() - t0
    state.drop(tid)
    return Receipt(
        token_id=tid, C=state.C, sigma=state.sigma, n_before=n_before, n_after=state.n,
        status_before=status_before, alpha_before=alpha_before, partition_before=part_before,
        partition_after=core.partition_counts() if core.solved else None, path_events=int(events),
        elapsed_s=elapsed, certified=bool(gated_before and core.solved), fallback=reason is not None,
        fallback_reason=reason,
    )


def refit_comparison(state: GateState, removed=None, seed: int = 0) -> dict:
    """Max |gate score difference| between the state and an independent :func:`refit` of its
    live keys, on retained, jittered and removed probes; alpha deviation, partition match and
    the recomputed KKT residual (the implementation of :meth:`sv_core.Gate.verify_against_refit`)."""
    core = state.stored()
    slots = state.live_slots()
    X = core.X[slots]
    C, sigma = state.C, state.sigma
    a_ref, rho_ref = refit(X, C=C, sigma=sigma)
    rng = np.random.default_rng(seed)
    probes = {"retained": X, "jittered": X + JITTER_SCALE * rng.standard_normal(X.shape)}
    if removed is not None and len(removed):
        probes["removed"] = np.asarray(removed, dtype=np.float64)
    dev = {}
    for name, P in probes.items():
        s_ref = 2.0 * rbf_kernel(P, X, sigma) @ a_ref - rho_ref
        dev[name] = float(np.abs(state.scores(P) - s_ref).max())
    tol = 1e-9 * C
    part_ref = np.where(a_ref <= tol, RESERVE, np.where(a_ref >= C - tol, ERROR, MARGIN))
    return {
        "max_abs_score_dev": max(dev.values()),
        "score_dev_by_probe": dev,
        "max_abs_alpha_dev": float(np.abs(core.alpha[slots] - a_ref).max()),
        "partition_match": bool(np.array_equal(part_ref, core.status[slots])),
        "kkt_residual": core.kkt_residual()["max"],
    }


def _passes(ver: dict) -> bool:
    return ver["max_abs_score_dev"] <= VERIFY_SCORE_TOL and ver["kkt_residual"] <= VERIFY_KKT


def verify_or_fallback(state: GateState, receipt: Receipt, removed, seed: int) -> None:
    """Attach the verification to ``receipt``; if it fails its tolerances, take the exact
    fallback and verify again; raise :class:`VerificationError` if it still fails (the caller
    rolls back)."""
    try:
        ver = refit_comparison(state, removed, seed)
        if not _passes(ver):
            reason = f"verification: score deviation {ver['max_abs_score_dev']:.3g}, KKT {ver['kkt_residual']:.3g}"
            state.exact.fallback(state.solver(), "forget", reason)
            receipt.fallback, receipt.fallback_reason = True, reason
            ver = refit_comparison(state, removed, seed)
            if not _passes(ver):
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
