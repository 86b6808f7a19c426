"""Patient deletion on shared contexts (seed 000 §6; seed 001 §4 "concrete records"; SPEC §3).

A context holds the first ≤ 48 hourly tokens (z-scored 6 vitals) of one stay of each of 5
patients; each patient's tokens are deduplicated at 0.1 SD (:func:`sv_core.audit.dedupe`) so
every kept token belongs to exactly one patient. The gate is solved at ``C = 1/(ν·n₀)``
(ν = 0.5, σ = 2, n₀ = the context size), fixed for the context's lifetime. One patient is
forgotten by the maintained decremental path (:meth:`sv_core.Gate.forget_many`) and compared with
an independent same-C refit of the retained keys (:func:`sv_core.refit`).

Three removals are put side by side, each against that refit (the reference state):

* **exact** — the C&P decrement (retained coefficients re-solved);
* **naive** — the patient's tokens dropped without re-solving: the other coefficients renormalised
  to Σα = 1, ρ left as it was (:func:`naive_removal_alpha`);
* **decay** — the patient's tokens kept, their coefficients multiplied by γ, no re-solve
  (:func:`evaluation.audit_metrics.decay_alpha`).

**Gap to refit** (the headline): max |gate-score difference| and max |readout difference| (values =
keys) over retained keys, the forgotten patient's keys and jittered retained keys. Exact deletion
reaches the refit to rounding (~1e-15); naive removal and decay do not. **Leakage** (seed 000 §6:
the forgotten patient's "weight into the readout") is the forgotten patient's readout-weight share
at queries = its own keys (:func:`evaluation.audit_metrics.readout_weight_share`): 0 after exact
*and* naive removal (any removal of the tokens gives 0), positive under decay. Alternative
definitions (α-mass share; every context key as query) are reported beside it. The paper does not
state its two decay factors; this module reports γ ∈ {0.5, 0.1, 0.01} (``GAMMAS``) — see
``SEED_GAMMAS`` for the pair that reproduces the paper's 0.29 / 0.09.

Everything returned is an aggregate (no record identifiers) except ``gate_state`` and the token
origins the caller persists for ``forgetful forget``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from evaluation.audit_metrics import decay_alpha, readout_weight_share
from evaluation.studies.errors import StudyConfigError
from evaluation.studies.readout import kernel_readout
from sv_core import Gate, calibrate_C, rbf_kernel, refit
from sv_core.audit import dedupe

#: decay factors reported (the paper's planted-secret study uses 0.5 / 0.1 / 0.01)
GAMMAS = (0.5, 0.1, 0.01)
#: the decay pair read as the paper's "0.29 and 0.09": the paper states no γ for this figure; with the
#: seed's ν = 0.5, σ = 2, γ = 0.5 / 0.1 reproduce both figures and their ratio (≈ 3.2) on the demo,
#: while SPEC's reading γ = 0.1 / 0.01 gives a ratio ≈ 7 (docs: the leakage investigation)
SEED_GAMMAS = (0.5, 0.1)
PAPER_DECAY_LEAKAGE = (0.29, 0.09)
#: the report's low-power threshold (dashboards.report.MIN_STAYS units)
MIN_CONTEXTS = 20
#: jitter of the perturbed probes (as the deletion audit)
PROBE_JITTER = 0.1


class StayLike(Protocol):
    """What :func:`build_context` reads of a stay (e.g. :class:`cohort.streams.StayStream`)."""

    stay_id: int
    subject_id: int
    hours: np.ndarray
    z: np.ndarray


@dataclass
class Context:
    """One shared context. keys (n, d); owner (n,) patient index 0..P-1; subject/stay/hour (n,)."""

    keys: np.ndarray
    owner: np.ndarray
    subject: np.ndarray
    stay: np.ndarray
    hour: np.ndarray


def gkey(gamma: float) -> str:
    """Column-safe name of a decay factor: 0.5 -> ``g0p5``."""
    return "g" + f"{gamma:g}".replace(".", "p").replace("-", "m")


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
                  contexts: int | None = None, n_stays: int | None = None) -> list[list[int]]:
    """Group patients into contexts: one stay (the first) per patient is eligible, patients are
    shuffled with ``seed`` and cut into consecutive groups of ``per_context``. Returns lists of stay
    ids. ``contexts`` / ``n_stays`` take a deterministic sample: the first groups of that shuffle
    (``n_stays`` stays make ``n_stays // per_context`` contexts); default every eligible stay."""
    for name, v in (("contexts", contexts), ("stays", n_stays)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise StudyConfigError(f"{name} must be a positive integer; got {v!r}")
    first: dict[int, int] = {}
    for stay_id, subject_id, _split, _n in sorted(stays):
        first.setdefault(subject_id, stay_id)
    subjects = sorted(first)
    order = np.random.default_rng(seed).permutation(len(subjects))
    groups = [[first[subjects[i]] for i in order[j:j + per_context]]
              for j in range(0, len(order) - per_context + 1, per_context)]
    limit = min(x for x in (contexts, None if n_stays is None else n_stays // per_context, len(groups))
                if x is not None)
    groups = groups[:limit]
    if not groups:
        raise StudyConfigError(f"need at least {per_context} patients for one context, have "
                               f"{len(subjects) if n_stays is None else min(n_stays, len(subjects))}")
    return groups


def build_context(stays: Sequence[StayLike], max_hours: int = 48, dedupe_tol: float = 0.1) -> Context:
    """One context from the patients' stays, in the given order (patient p = ``stays[p]``): the
    first ``max_hours`` z-scored hourly keys of each, deduplicated per patient at ``dedupe_tol``."""
    K, O, S, T, H = [], [], [], [], []
    for p, s in enumerate(stays):
        X = np.asarray(s.z, dtype=np.float64)[:max_hours]
        if X.ndim != 2 or X.shape[0] == 0 or not np.all(np.isfinite(X)):
            raise StudyConfigError(f"patient {p} of the context has no finite hourly keys")
        keep = dedupe_indices(X, dedupe_tol)
        K.append(X[keep])
        O.append(np.full(keep.size, p))
        S.append(np.full(keep.size, int(s.subject_id)))
        T.append(np.full(keep.size, int(s.stay_id)))
        H.append(np.asarray(s.hours)[:max_hours][keep])
    return Context(np.vstack(K), np.concatenate(O), np.concatenate(S), np.concatenate(T), np.concatenate(H))


def naive_removal_alpha(alpha: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Naive removal: drop the removed tokens, renormalise the kept coefficients to Σα = 1, no
    re-solve. alpha (n,), keep (n,) bool -> (n_kept,)."""
    a = np.asarray(alpha, dtype=np.float64)[np.asarray(keep, dtype=bool)]
    tot = a.sum()
    if not tot > 0:
        raise StudyConfigError("naive removal leaves no coefficient mass (every support token removed)")
    return a / tot


def state_outputs(K: np.ndarray, keys: np.ndarray, alpha: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Gate scores (m,) and readouts (m, d) at probes whose kernel rows against ``keys`` are ``K``
    (m, n): ``s = 2 K α − ρ``; ``o = (K α ⊙ keys) / K α`` (values = keys)."""
    W = K * alpha[None, :]
    den = W.sum(axis=1, keepdims=True)
    o = np.divide(W @ keys, den, out=np.zeros((K.shape[0], keys.shape[1])), where=den > 0)
    return 2.0 * den[:, 0] - rho, o


def _gaps(ref: tuple[np.ndarray, np.ndarray], K: np.ndarray, keys: np.ndarray, alpha: np.ndarray,
          rho: float) -> tuple[float, float]:
    """(max |score − refit score|, max |readout − refit readout|) over the probes of ``K`` for the
    state (keys, alpha, rho); ``ref`` = the refit's (scores, readouts) at the same probes."""
    s, o = state_outputs(K, keys, alpha, rho)
    return float(np.abs(s - ref[0]).max()), float(np.abs(o - ref[1]).max())


def decay_leakage_sensitivity(ctx: Context, target: int, *, nu: float, sigmas: Sequence[float],
                              gammas: Sequence[float] = GAMMAS) -> dict[str, float]:
    """Decay leakage (own-key readout-weight share) with the gate solved at other kernel widths σ:
    ``{"s<σ>_<gkey>": share}`` — the σ axis of the leakage investigation."""
    X, gone = ctx.keys, ctx.owner == target
    out = {}
    for sg in sigmas:
        g = Gate(C=calibrate_C(nu, X.shape[0]), sigma=float(sg))
        g.admit(X)
        for gm in gammas:
            out[f"s{sg:g}_{gkey(gm)}".replace(".", "p")] = readout_weight_share(
                X, decay_alpha(g.alpha, np.flatnonzero(gone), gm), X[gone], gone, float(sg))
    return out


def forget_patient(ctx: Context, target: int, *, nu: float = 0.5, sigma: float = 2.0,
                   gammas: Sequence[float] = GAMMAS, probe_seed: int = 0,
                   decay_sigmas: Sequence[float] = ()) -> dict[str, Any]:
    """Solve the context's gate, forget patient ``target`` (owner index) and measure.

    Returns a flat dict of per-context aggregates (:func:`context_row` selects the scalar columns)
    and ``gate_state`` (the full-context gate, before deletion). Raises ``GateError`` when the
    deletion is infeasible (e.g. the patient holds more than (1 − ν) of the context).
    """
    X, own = ctx.keys, ctx.owner
    n = X.shape[0]
    if not (0 <= int(target) <= int(own.max())):
        raise StudyConfigError(f"target patient {target} is not in the context (owners 0..{int(own.max())})")
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    ids = g.admit(X)
    full_state = g.to_state()
    a_full, rho_full = g.alpha.copy(), float(g.rho)
    gone = own == target
    others = ~gone
    Q_gone, Q_oth = X[gone], X[others]
    o_before = kernel_readout(Q_oth, X, a_full, X, sigma)
    W_before = rbf_kernel(Q_oth, X, sigma) * a_full[None, :]
    retr_before = float(np.mean(own[np.argmax(W_before, axis=1)] == own[others]))
    W_g = rbf_kernel(Q_gone, X, sigma) * a_full[None, :]
    retr_gone_before = float(np.mean(own[np.argmax(W_g, axis=1)] == target))
    leak_before = readout_weight_share(X, a_full, Q_gone, gone, sigma)

    recs = g.forget_many([int(i) for i in ids[gone]])
    ver = g.verify_against_refit(removed=X[gone])
    a_after = np.zeros(n)
    a_after[np.isin(ids, g.ids)] = g.alpha
    Xr = X[others]
    a_ref, rho_ref = refit(Xr, C=C, sigma=sigma)
    rng = np.random.default_rng(probe_seed)
    P = np.vstack([Xr, Q_gone, Xr + PROBE_JITTER * rng.standard_normal(Xr.shape)])
    K_P = rbf_kernel(P, X, sigma)  # (m, n): one kernel for every state compared below
    K_Pr = K_P[:, others]
    ref = state_outputs(K_Pr, Xr, a_ref, rho_ref)

    row: dict[str, Any] = {
        "n": int(n), "n_forgotten": int(gone.sum()), "C": C, "sigma": sigma,
        "support_before": int(np.count_nonzero(a_full > 0)),
        "forgotten_active_before": int(np.count_nonzero(a_full[gone] > 0)),
        "leakage_before": float(leak_before),
        "leakage_after": float(readout_weight_share(X, a_after, Q_gone, gone, sigma)),
    }
    # the three removals against the same refit
    row["gap_score_exact"], row["gap_readout_exact"] = _gaps(ref, K_Pr, Xr, g.alpha, g.rho)
    a_naive = naive_removal_alpha(a_full, others)
    row["gap_score_naive"], row["gap_readout_naive"] = _gaps(ref, K_Pr, Xr, a_naive, rho_full)
    a_naive_full = np.zeros(n)
    a_naive_full[others] = a_naive
    row["leakage_naive"] = float(readout_weight_share(X, a_naive_full, Q_gone, gone, sigma))
    for gm in gammas:
        k = gkey(gm)
        a_dec = decay_alpha(a_full, np.flatnonzero(gone), gm)
        row[f"leak_{k}"] = float(readout_weight_share(X, a_dec, Q_gone, gone, sigma))
        row[f"leak_alpha_{k}"] = float(a_dec[gone].sum() / a_dec.sum())
        row[f"leak_allkeys_{k}"] = float(readout_weight_share(X, a_dec, X, gone, sigma))
        row[f"gap_score_{k}"], row[f"gap_readout_{k}"] = _gaps(ref, K_P, X, a_dec, rho_full)
    if decay_sigmas:
        row.update({f"leak_{k}": v for k, v in
                    decay_leakage_sensitivity(ctx, target, nu=nu, sigmas=decay_sigmas, gammas=gammas).items()})
    o_after = kernel_readout(Q_oth, Xr, g.alpha, Xr, sigma)
    W_after = rbf_kernel(Q_oth, Xr, sigma) * g.alpha[None, :]
    W_g_after = rbf_kernel(Q_gone, Xr, sigma) * g.alpha[None, :]
    row.update({
        "forgotten_self_retrieval_before": retr_gone_before,
        "forgotten_tokens_live_after": int(np.isin(g.ids, ids[gone]).sum()),
        "nearest_owner_after_is_forgotten": float(np.mean(own[others][np.argmax(W_g_after, axis=1)] == target)),
        "others_self_retrieval_before": retr_before,
        "others_self_retrieval_after": float(np.mean(own[others][np.argmax(W_after, axis=1)] == own[others])),
        "others_readout_change_max": float(np.abs(o_after - o_before).max()),
        "others_readout_change_mean": float(np.abs(o_after - o_before).mean()),
        "refit_score_dev_max": float(ver["max_abs_score_dev"]),
        "kkt_residual": float(ver["kkt_residual"]),
        "partition_match": bool(ver["partition_match"]),
        "certified": bool(all(r.certified for r in recs)),
        "fallback": bool(any(r.fallback for r in recs)),
        "path_events": int(sum(r.path_events for r in recs)),
        "gate_state": full_state,
    })
    return row


#: keys of a :func:`forget_patient` result that are not per-context scalars
NON_SCALAR = ("gate_state", "token_subject", "token_stay", "token_hour", "completed", "error")


def context_row(result: dict[str, Any]) -> dict[str, float | int | bool]:
    """The scalar per-context columns of a :func:`forget_patient` result (no record ids)."""
    return {k: v for k, v in result.items() if k not in NON_SCALAR and isinstance(v, (int, float, bool, np.generic))}


# ------------------------------------------------------------------------------ aggregates and result
def _q(con, sql: str) -> Any:
    return con.execute(sql).fetchone()


def aggregate(con, table: str, attempted: int, gammas: Sequence[float] = GAMMAS) -> dict[str, Any]:
    """Aggregates over the completed contexts stored as rows of ``table`` (:func:`context_row`
    columns) on the DuckDB connection ``con`` — computed in SQL, so memory does not grow with the
    number of contexts. No record ids."""
    n = int(_q(con, f"SELECT count(*) FROM {table}")[0])
    if n == 0:
        return {"contexts_attempted": int(attempted), "contexts_completed": 0}
    cols = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}

    def one(expr: str) -> float:
        v = _q(con, f"SELECT {expr} FROM {table}")[0]
        return float(v) if v is not None else float("nan")

    def gap(prefix: str) -> dict[str, float]:
        return {f"{w}_{stat}": one(f"{fn}(gap_{w}_{prefix})") for w in ("score", "readout")
                for stat, fn in (("median", "median"), ("max", "max"))}

    m: dict[str, Any] = {
        "contexts_attempted": int(attempted),
        "contexts_completed": n,
        "tokens_per_context_mean": one("avg(n)"),
        "forgotten_tokens_mean": one("avg(n_forgotten)"),
        "leakage_before_mean": one("avg(leakage_before)"),
        "leakage_after_max": one("max(leakage_after)"),
        "leakage_naive_max": one("max(leakage_naive)"),
        "decay_leakage_mean": {f"gamma_{g:g}": one(f"avg(leak_{gkey(g)})") for g in gammas},
        "decay_leakage_alpha_share_mean": {f"gamma_{g:g}": one(f"avg(leak_alpha_{gkey(g)})") for g in gammas},
        "decay_leakage_all_keys_mean": {f"gamma_{g:g}": one(f"avg(leak_allkeys_{gkey(g)})") for g in gammas},
        "gap_to_refit": {"exact": gap("exact"), "naive": gap("naive"),
                         **{f"decay_gamma_{g:g}": gap(gkey(g)) for g in gammas}},
        "forgotten_tokens_live_after": int(one("sum(forgotten_tokens_live_after)")),
        "forgotten_self_retrieval_before": one("avg(forgotten_self_retrieval_before)"),
        "others_self_retrieval_before": one("avg(others_self_retrieval_before)"),
        "others_self_retrieval_after": one("avg(others_self_retrieval_after)"),
        "others_readout_change_mean": one("avg(others_readout_change_mean)"),
        "others_readout_change_max": one("max(others_readout_change_max)"),
        "kkt_residual_max": one("max(kkt_residual)"),
        "kkt_residual_median": one("median(kkt_residual)"),
        "refit_score_dev_max": one("max(refit_score_dev_max)"),
        "partition_match_fraction": one("avg(partition_match::DOUBLE)"),
        "certified": int(one("sum(certified::INTEGER)")),
        "fallbacks": int(one("sum(fallback::INTEGER)")),
    }
    sens = sorted(c for c in cols if c.startswith("leak_s"))
    if sens:
        by: dict[str, dict[str, float]] = {}
        for c in sens:  # leak_s<σ>_g<γ>, "p" for the decimal point
            sg, gm = c[len("leak_s"):].split("_g")
            by.setdefault(f"sigma_{sg.replace('p', '.')}", {})[f"gamma_{gm.replace('p', '.')}"] = one(f"avg({c})")
        m["decay_leakage_by_sigma_mean"] = by
    return m


def power(completed: int) -> dict[str, Any]:
    """Low-power label: fewer than ``MIN_CONTEXTS`` completed contexts."""
    low = completed < MIN_CONTEXTS
    return {"units": "five-patient contexts", "count": int(completed), "reference_count": MIN_CONTEXTS,
            "low_power": bool(low),
            "label": (f"rests on {completed:,} five-patient contexts (fewer than {MIN_CONTEXTS}): the decay figures "
                      "and their comparison with the paper's can move a lot on another cohort") if low else ""}


def _paper_leak(g: float, comparable: bool) -> float | None:
    if not comparable or g not in SEED_GAMMAS:
        return None
    return PAPER_DECAY_LEAKAGE[SEED_GAMMAS.index(g)]


def study_result(m: dict[str, Any], *, data: str, seed_comparable: bool, gammas: Sequence[float] = GAMMAS,
                 config: dict[str, Any] | None = None, runtime_s: float = 0.0) -> dict[str, Any]:
    """The ``dashboards/SCHEMA.md`` result (``seed_figure`` empty and no receipts: the flow adds them).
    ``seed_comparable``: whether the run's data is the seed's kind (real records); the paper's
    figures are put beside this run's only then."""
    pw = power(int(m.get("contexts_completed", 0)))
    m = {**m, "power": pw}
    done = m.get("contexts_completed", 0) > 0
    if not done:
        return {"study": "patient_deletion", "title": f"Patient deletion on shared contexts ({data})", "data": data,
                "runtime_s": float(runtime_s), "seed_figure": {}, "metrics": m, "tables": [], "figures": [],
                "config": config or {},
                "claims": [{"statement": "no context completed", "reference": "fresh retained-key refit at the same C",
                            "path": "maintained fp64 C&P decremental path", "operation": "active deletion",
                            "value": None, "holds": False}]}
    gp = m["gap_to_refit"]
    methods = [("exact C&P deletion", "exact", m["leakage_after_max"]),
               ("naive removal (α renormalised, ρ kept, no re-solve)", "naive", m["leakage_naive_max"])]
    methods += [(f"coefficient decay γ = {g:g} (tokens kept)", f"decay_gamma_{g:g}",
                 m["decay_leakage_mean"][f"gamma_{g:g}"]) for g in gammas]
    gap_rows = [[lab, gp[k]["score_median"], gp[k]["score_max"], gp[k]["readout_median"], gp[k]["readout_max"], leak]
                for lab, k, leak in methods]
    leak_rows = [["exact C&P deletion", m["leakage_after_max"], 0.0, 0.0, 0.0 if seed_comparable else None],
                 ["naive removal", m["leakage_naive_max"], 0.0, 0.0, None]]
    leak_rows += [[f"decay γ = {g:g}", *(m[k][f"gamma_{g:g}"] for k in (
                       "decay_leakage_mean", "decay_leakage_alpha_share_mean", "decay_leakage_all_keys_mean")),
                   _paper_leak(g, seed_comparable)] for g in gammas]
    ex, nv = gp["exact"], gp["naive"]
    dk = gp[f"decay_gamma_{SEED_GAMMAS[1]:g}"]
    seed_pair = " / ".join(f"{m['decay_leakage_mean'][f'gamma_{g:g}']:.3f}" for g in SEED_GAMMAS)
    m["headline"] = (f"gap to the same-C refit (max gate score, median over contexts): exact deletion "
                     f"{ex['score_median']:.1e}, naive removal {nv['score_median']:.1e}, decay γ = {SEED_GAMMAS[1]:g} "
                     f"{dk['score_median']:.1e}; leakage 0 after exact (and naive) removal, decay {seed_pair} "
                     f"(γ = {' / '.join(f'{g:g}' for g in SEED_GAMMAS)}"
                     + ("; paper 0.29 / 0.09)" if seed_comparable else ")"))
    tables = [
        {"title": "gap to a same-C refit of the retained keys: max over retained, forgotten and jittered probes "
                  "(median and max over contexts) — exact deletion reaches the refit, naive removal and decay do not",
         "columns": ["removal", "score gap median", "score gap max", "readout gap median", "readout gap max",
                     "leakage"], "rows": gap_rows},
        {"title": "leakage: the forgotten patient's readout-weight share (mean over contexts) under three definitions"
                  + ("" if seed_comparable else " (paper column empty: this run is not on real records)"),
         "columns": ["removal", "own-key queries (seed's)", "α-mass share", "every key as query", "paper"],
         "rows": leak_rows},
        {"title": "retained patients and the certificate",
         "columns": ["quantity", "value"],
         "rows": [["others' self-retrieval before", m["others_self_retrieval_before"]],
                  ["others' self-retrieval after", m["others_self_retrieval_after"]],
                  ["others' readout change (mean)", m["others_readout_change_mean"]],
                  ["KKT residual (max)", m["kkt_residual_max"]],
                  ["refit score deviation (max, gate's own check)", m["refit_score_dev_max"]],
                  ["partition match (fraction)", m["partition_match_fraction"]],
                  ["deletions by the exact fallback", m["fallbacks"]]]},
    ]
    if "decay_leakage_by_sigma_mean" in m:
        tables.append({"title": "decay leakage (own-key queries, mean over contexts) with the gate solved at other σ "
                                "(the σ axis of the leakage investigation)",
                       "columns": ["σ", "γ", "leakage"],
                       "rows": [[float(sk[len("sigma_"):]), float(gk[len("gamma_"):]), v]
                                for sk, d in m["decay_leakage_by_sigma_mean"].items() for gk, v in d.items()]})
    cats = ["exact", "naive"] + [f"decay γ={g:g}" for g in gammas]
    vals = [max(gp[k]["score_median"], 1e-17) for k in ["exact", "naive"] + [f"decay_gamma_{g:g}" for g in gammas]]
    claims = [
        {"statement": "exact deletion reaches the same-C refit (max gate-score gap over contexts < 1e-9) and naive "
                      "removal without re-solving does not (its median gap > 1e-6): the evidence that tells exact "
                      "deletion from mere removal",
         "reference": "fresh retained-key refit at the same fixed C", "path": "maintained fp64 C&P decremental path",
         "operation": "active deletion", "value": {"exact max": ex["score_max"], "naive median": nv["score_median"]},
         "holds": bool(ex["score_max"] < 1e-9 and nv["score_median"] > 1e-6)},
        {"statement": "forgotten patient's readout weight after the decrement (max over contexts) — zero, as after "
                      "any removal of its tokens (naive removal also gives 0)",
         "reference": "fresh retained-key refit at the same fixed C", "path": "maintained fp64 C&P decremental path",
         "operation": "active deletion", "value": m["leakage_after_max"],
         "holds": bool(m["leakage_after_max"] == 0.0 and m["refit_score_dev_max"] < 1e-6)},
    ]
    notes = ("Leakage follows seed 000 §6 (the forgotten patient's weight in the readout, queries = its own keys). "
             "The paper gives 0.29 and 0.09 under decay without naming the two decay factors; SPEC reads "
             "γ = 0.1 / 0.01. "
             f"With the seed's ν = 0.5, σ = 2, γ = {SEED_GAMMAS[0]:g} / {SEED_GAMMAS[1]:g} give {seed_pair} here, and "
             "the ratio of the paper's two figures (≈ 3.2) is that of γ = 0.5 / 0.1 at this saturation; γ = 0.1 / 0.01 "
             "give a ratio near 7. Zero leakage holds for any removal of the tokens; the gap to a same-C refit "
             "separates exact deletion (rounding) from naive removal and decay.")
    return {"study": "patient_deletion", "title": f"Patient deletion on shared contexts ({data})", "data": data,
            "runtime_s": float(runtime_s), "seed_figure": {}, "metrics": m, "tables": tables,
            "figures": [{"kind": "bar", "title": "max gate-score gap to a same-C refit (median over contexts)",
                         "ylabel": "|Δ score| (log)", "log_y": True, "categories": cats, "values": vals,
                         "caption": ("Exact deletion reaches the same-C refit to rounding; naive removal "
                                     "(α renormalised, no re-solve) and decay do not. Zero leakage, which any "
                                     "removal achieves, cannot tell them apart.")}],
            "claims": claims, "notes": notes, "config": config or {}}
