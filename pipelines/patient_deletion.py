"""Patient deletion on shared contexts (seed 000 §6 / SPEC §3 "patient deletion").

A context holds the first ≤ 48 hourly tokens (z-scored 6 vitals) of one stay of each of 5
patients; each patient's tokens are deduplicated at 0.1 SD (:func:`sv_core.audit.dedupe`) so
every kept token belongs to exactly one patient. The gate is solved at ``C = 1/(ν·n₀)``
(ν = 0.5, σ = 2, n₀ = the context size), fixed for the context's lifetime. One patient is
forgotten by the maintained decremental path (:meth:`sv_core.Gate.forget_many`) and verified
against an independent same-C refit. Measured, with the forgotten patient's own keys as queries:

* leakage = the forgotten patient's readout-weight share
  (:func:`evaluation.audit_metrics.readout_weight_share`): exactly 0 after the decrement,
  positive under coefficient decay (γ = 0.1, 0.01; :func:`evaluation.audit_metrics.decay_alpha`);
* the other patients' readout change (values = their keys) and their self-retrieval rate
  (top readout weight on a token of the same patient) before and after;
* KKT residual and the gate-score deviation from the refit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cohort.streams import iter_stays
from evaluation.audit_metrics import decay_alpha, readout_weight_share
from sv_core import Gate, calibrate_C, rbf_kernel
from sv_core.audit import dedupe

from .errors import StudyInputError


@dataclass
class Context:
    """One shared context. keys (n, d); owner (n,) patient index 0..P-1; subject/stay/hour (n,)."""

    keys: np.ndarray
    owner: np.ndarray
    subject: np.ndarray
    stay: np.ndarray
    hour: np.ndarray


def dedupe_indices(X: np.ndarray, tol: float) -> np.ndarray:
    """Indices of the rows :func:`sv_core.audit.dedupe` keeps (it returns rows in order, so they
    are matched back as an ordered subsequence)."""
    kept = dedupe(X, tol)
    idx, j = [], 0
    for row in kept:
        while not np.array_equal(X[j], row):
            j += 1
        idx.append(j)
        j += 1
    return np.asarray(idx, dtype=np.int64)


def plan_contexts(stays: Sequence[tuple[int, int, str, int]], per_context: int = 5, seed: int = 0,
                  max_contexts: int | None = None) -> list[list[int]]:
    """Group patients into contexts: one stay (the first) per patient, patients shuffled with
    ``seed``, consecutive groups of ``per_context``. Returns lists of stay ids."""
    first: dict[int, int] = {}
    for stay_id, subject_id, _split, _n in sorted(stays):
        first.setdefault(subject_id, stay_id)
    subjects = sorted(first)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(subjects))
    groups = [[first[subjects[i]] for i in order[j:j + per_context]]
              for j in range(0, len(order) - per_context + 1, per_context)]
    if max_contexts is not None:
        groups = groups[:max_contexts]
    if not groups:
        raise StudyInputError(f"need at least {per_context} patients for one context, have {len(subjects)}")
    return groups


def build_context(warehouse: str, stay_ids: Sequence[int], max_hours: int = 48, dedupe_tol: float = 0.1) -> Context:
    parts = {s.stay_id: s for s in iter_stays(warehouse, stay_ids=list(stay_ids))}
    K, O, S, T, H = [], [], [], [], []
    for p, sid in enumerate(stay_ids):
        s = parts[int(sid)]
        X = s.z[:max_hours]
        keep = dedupe_indices(X, dedupe_tol)
        K.append(X[keep])
        O.append(np.full(keep.size, p))
        S.append(np.full(keep.size, s.subject_id))
        T.append(np.full(keep.size, s.stay_id))
        H.append(s.hours[:max_hours][keep])
    return Context(np.vstack(K), np.concatenate(O), np.concatenate(S), np.concatenate(T), np.concatenate(H))


def _readout(keys, alpha, Q, V, sigma):
    W = rbf_kernel(Q, keys, sigma) * alpha[None, :]
    return (W @ V) / W.sum(axis=1, keepdims=True), W


def forget_patient(ctx: Context, target: int, *, nu: float = 0.5, sigma: float = 2.0,
                   gammas: Sequence[float] = (0.1, 0.01)) -> dict[str, Any]:
    """Solve the context's gate, forget patient ``target`` (owner index) and measure.

    Returns aggregates (no record ids) and ``gate`` (the full-context gate, before deletion).
    """
    X, own = ctx.keys, ctx.owner
    n = X.shape[0]
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    ids = g.admit(X)
    full_state = g.to_state()
    a_full = g.alpha.copy()
    rho_full = g.rho
    gone = own == target
    others = ~gone
    Q_gone, Q_oth = X[gone], X[others]
    # before: readouts and retrieval
    V = X
    o_before, W_before = _readout(X, a_full, Q_oth, V, sigma)
    retr_before = float(np.mean(own[np.argmax(W_before, axis=1)] == own[others]))
    W_g = rbf_kernel(Q_gone, X, sigma) * a_full[None, :]
    retr_gone_before = float(np.mean(own[np.argmax(W_g, axis=1)] == target))
    leak_before = readout_weight_share(X, a_full, Q_gone, gone, sigma)

    recs = g.forget_many([int(i) for i in ids[gone]])
    ver = g.verify_against_refit(removed=X[gone])
    a_after = np.zeros(n)
    a_after[np.isin(ids, g.ids)] = g.alpha
    leak_after = readout_weight_share(X, a_after, Q_gone, gone, sigma)
    o_after, W_after = _readout(X[others], g.alpha, Q_oth, V[others], sigma)
    retr_after = float(np.mean(own[others][np.argmax(W_after, axis=1)] == own[others]))
    W_g_after = rbf_kernel(Q_gone, X[others], sigma) * g.alpha[None, :]
    # refit agreement on the readout of the retained state
    from sv_core import refit

    a_ref, _ = refit(X[others], C=C, sigma=sigma)
    o_ref, _ = _readout(X[others], a_ref, np.vstack([Q_oth, Q_gone]), V[others], sigma)
    o_dec, _ = _readout(X[others], g.alpha, np.vstack([Q_oth, Q_gone]), V[others], sigma)
    decay = {}
    for gm in gammas:
        a_dec = decay_alpha(a_full, np.flatnonzero(gone), gm)
        decay[f"gamma_{gm:g}"] = readout_weight_share(X, a_dec, Q_gone, gone, sigma)
    return {
        "n": int(n), "n_forgotten": int(gone.sum()), "C": C, "sigma": sigma,
        "support_before": int(np.count_nonzero(a_full > 0)),
        "forgotten_active_before": int(np.count_nonzero(a_full[gone] > 0)),
        "leakage_before": float(leak_before),
        "leakage_after": float(leak_after),
        "decay_leakage": decay,
        "forgotten_self_retrieval_before": retr_gone_before,
        "forgotten_tokens_live_after": int(np.isin(g.ids, ids[gone]).sum()),
        "nearest_owner_after_is_forgotten": float(np.mean(own[others][np.argmax(W_g_after, axis=1)] == target)),
        "others_self_retrieval_before": retr_before,
        "others_self_retrieval_after": retr_after,
        "others_readout_change_max": float(np.abs(o_after - o_before).max()),
        "others_readout_change_mean": float(np.abs(o_after - o_before).mean()),
        "refit_readout_dev_max": float(np.abs(o_dec - o_ref).max()),
        "refit_score_dev_max": float(ver["max_abs_score_dev"]),
        "kkt_residual": float(ver["kkt_residual"]),
        "partition_match": bool(ver["partition_match"]),
        "certified": bool(all(r.certified for r in recs)),
        "path_events": int(sum(r.path_events for r in recs)),
        "rho_before": float(rho_full),
        "gate_state": full_state,
    }


def context_task(warehouse: str, stay_ids: Sequence[int], target: int, *, nu: float = 0.5, sigma: float = 2.0,
                 max_hours: int = 48, dedupe_tol: float = 0.1, gammas: Sequence[float] = (0.1, 0.01)) -> dict:
    """Build one context from the warehouse and run :func:`forget_patient` on it; also returns the
    token origins (subject/stay/hour, aligned with the full gate's ids) for persistence."""
    ctx = build_context(warehouse, stay_ids, max_hours, dedupe_tol)
    r = forget_patient(ctx, target, nu=nu, sigma=sigma, gammas=gammas)
    r.update(token_subject=ctx.subject, token_stay=ctx.stay, token_hour=ctx.hour)
    return r
