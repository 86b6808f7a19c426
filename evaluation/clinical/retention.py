"""Event-hour retention of selection policies at the support-defined budget (seed 001 §5).

The protocol (ICU retention and the held-out SpO₂ control): for each stay with at least one event
hour, the SV gate is solved at fixed ``C = 1/(ν·n)`` by the certified solve :func:`sv_core.solve`
(:class:`evaluation.policies.SupportVectorPolicy`); the budget is the stay's support size
``k = |S∪E|``; every policy keeps exactly ``k`` hours; retention is the fraction of event hours
kept; stays are the bootstrap units. The caller decides which channels the selectors see
(held-out control: keys without SpO₂, events from raw SpO₂). Policies: SV, H2O-style density,
recency, random (as its expectation, :func:`random_expected_retention`), and the query-free peers
of :mod:`evaluation.peers`; query-stream peers and the oracle need queries, which a stay has not.
Small comparisons are labelled (:func:`low_power`). Per-stay results travel as columns
(:data:`STAY_COLUMNS`), so a study over tens of thousands of stays aggregates in flat memory
(:func:`comparison_from_columns`); :func:`compare_retention` is the serial reference over
in-memory stays, and the streaming flow (``pipelines/flows/clinical_retention.py``) is tested
equal to it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evaluation.errors import MetricError
from evaluation.metrics import (
    BootstrapCI,
    PairedTest,
    event_hour_retention,
    paired_bootstrap_cis,
    paired_t_test,
    wilcoxon_test,
)
from evaluation.peers import QUERY_FREE_PEERS
from evaluation.policies import SelectionPolicy, SupportVectorPolicy, get_policy

__all__ = [
    "PEERS", "DEFAULT_POLICIES", "STAY_COLUMNS", "LOW_POWER_MIN_STAYS", "LOW_POWER_MIN_EVENT_HOURS",
    "SOLVE_PATH", "RetentionComparison", "build_policies", "random_expected_retention",
    "random_expected_retention_reference", "stay_policy_retention", "stay_retention", "rows_to_columns",
    "concat_columns", "comparison_from_columns", "compare_retention", "low_power",
]

#: the query-free peers, reported beside the seed's baselines
PEERS = QUERY_FREE_PEERS
#: default policy list
DEFAULT_POLICIES = ("sv", "density", "recency", "random") + PEERS
#: low-power label below either threshold (module docstring: why these)
LOW_POWER_MIN_STAYS = 100
LOW_POWER_MIN_EVENT_HOURS = 200
#: what computes the SV coefficients (the claims' numerical path)
SOLVE_PATH = ("certified fp64 solve at fixed C = 1/(nu*n) (sv_core.solve: SMO + bordered KKT system, every KKT "
              "condition checked); independent refit on an audit sample")
#: per-stay columns besides ``ret_<policy>`` (all numeric: bool, int or float arrays of one length)
STAY_COLUMNS = ("included", "n", "d", "k", "n_events", "solve_kkt", "solve_fallback", "solve_polished",
                "gate_built", "gate_score_dev", "gate_alpha_dev")
#: policies whose constructor takes the gate's bandwidth
_SIGMA_POLICIES = ("density", "h2o", "h2o_density", "kernel_leverage")


# ------------------------------------------------------------------------------ per stay
def build_policies(policies: Sequence[str], *, nu: float, sigma: float) -> dict[str, SelectionPolicy | None]:
    """The protocol's policies by name, ``"sv"`` first (it defines the budget).

    ``"random"`` maps to ``None``: it is scored by its exact expectation
    (:func:`random_expected_retention`), never drawn. Kernel policies get the gate's ``sigma``;
    peers keep their documented defaults. Raises :class:`MetricError` without ``"sv"``, for
    duplicates, and for policies that need queries (oracle, SnapKV, TOVA).
    """
    if "sv" not in policies:
        raise MetricError("policies must include 'sv' (it defines the budget)")
    if len(set(policies)) != len(policies):
        raise MetricError(f"duplicate policy names in {list(policies)}")
    built: dict[str, SelectionPolicy | None] = {"sv": SupportVectorPolicy(nu=nu, sigma=sigma)}
    for name in policies:
        if name == "sv":
            continue
        if name == "random":
            built[name] = None
            continue
        kw: dict[str, Any] = {"sigma": sigma} if name in _SIGMA_POLICIES or name in ("oracle", "snapkv", "tova") else {}
        pol = get_policy(name, **kw)
        if pol.requires_queries:
            raise MetricError(f"the {name!r} policy needs a query stream; it is not part of this protocol")
        built[name] = pol
    return built


def random_expected_retention(n: int, k: int) -> float:
    """Expected event-hour retention of a uniform random ``k``-subset of ``n`` hours: ``k/n``.

    Each hour is kept with probability ``C(n-1, k-1)/C(n, k) = k/n``, so by linearity the expected
    number of kept event hours is ``(k/n)·|events|`` and the expected fraction ``k/n`` (any
    non-empty event set).

    The subset-enumerating reference :func:`random_expected_retention_reference` checks it. The
    study reports that expectation per stay — no draw — and its interval is the stay bootstrap of
    those expectations, so ``SV − random`` is the difference to the baseline's mean, not to one
    draw of it.
    """
    if isinstance(n, bool) or isinstance(k, bool) or not 0 <= int(k) <= int(n) or int(n) < 1:
        raise MetricError(f"need 0 <= k <= n and n >= 1, got n={n!r}, k={k!r}")
    return int(k) / int(n)


def random_expected_retention_reference(events: Any, k: int) -> float:
    """Slow reference: the mean event-hour retention over every ``k``-subset (small ``n`` only)."""
    import itertools

    ev = np.asarray(events, dtype=bool)
    if not ev.any():
        raise MetricError("the stay has no event hour")
    vals = [event_hour_retention(np.array(c, dtype=np.intp), ev) for c in itertools.combinations(range(ev.size), k)]
    return float(np.mean(vals))


def stay_arrays(X: Any, ev: Any) -> tuple[np.ndarray, np.ndarray]:
    """One stay's keys as a C-contiguous float64 (n, d) array and its event hours as bool (n,);
    :class:`MetricError` when the shapes do not match."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    ev = np.asarray(ev, dtype=bool)
    if X.ndim != 2 or ev.shape != (X.shape[0],):
        raise MetricError(f"stay keys of shape {X.shape} do not match events of shape {ev.shape}")
    return X, ev


def stay_policy_retention(X: Any, ev: Any, built: Mapping[str, SelectionPolicy | None]) -> dict[str, Any] | None:
    """Event-hour retention of every policy on one stay at budget ``k = |S∪E|``.

    X : (n, d) selector input in hour order; ev : (n,) bool event hours.
    Returns ``{"n", "d", "k", "n_events", "retention": {policy: fraction}, "certificate"}`` (the
    certificate of the SV solve, :class:`sv_core.SolveCertificate`), or ``None`` when the stay
    has no event hour (excluded before any solve).
    """
    X, ev = stay_arrays(X, ev)
    if not ev.any():
        return None
    sv = built["sv"]
    k = sv.support_size(X)
    n = int(X.shape[0])
    ret = {name: (random_expected_retention(n, k) if pol is None else event_hour_retention(pol.select(X, k), ev))
           for name, pol in built.items()}
    return {"n": n, "d": int(X.shape[1]), "k": int(k), "n_events": int(ev.sum()), "retention": ret,
            "certificate": sv.last_certificate}


def stay_retention(X: Any, ev: Any, built: Mapping[str, SelectionPolicy | None], *,
                   build_gate: bool = False) -> dict[str, Any] | None:
    """:func:`stay_policy_retention`, and with ``build_gate`` the maintained gate of the stay.

    The gate (:meth:`sv_core.Gate.from_solution`) is built from the certified solve's coefficients
    — partition read off, margin system re-solved, KKT guard checked; no second solve — and
    compared with that solve: ``gate_score_dev`` = max |s_gate(x) − s_solve(x)| over the stay's
    keys (duplicate-invariant), ``gate_alpha_dev`` = max |α_gate − α_solve| (non-zero only on exact
    duplicate keys). Extra keys: ``gate`` (the :class:`sv_core.Gate`) or ``gate_error`` (the
    :class:`sv_core.GateError` type name; nothing to persist, counted).
    """
    out = stay_policy_retention(X, ev, built)
    if out is None or not build_gate:
        return out
    from evaluation.clinical.retention_audit import score_gap
    from sv_core import Gate, GateError

    X = np.ascontiguousarray(X, dtype=np.float64)
    sv = built["sv"]
    a = sv.alpha(X)  # cached: the solve of the retention comparison
    C = sv.box_C(X.shape[0])
    try:
        g = Gate.from_solution(X, a, C=C, sigma=sv.sigma)
        if not g.gated:
            raise GateError("the stay is shorter than the gate's warm-up")
        s_gate = g.score(X)
    except GateError as exc:
        out["gate_error"] = type(exc).__name__
        return out
    out["gate"] = g
    out["gate_score_dev"] = score_gap(X, a, C, sv.sigma, s_gate)
    out["gate_alpha_dev"] = float(np.abs(g.alpha - a).max())
    return out


# ------------------------------------------------------------------------------ columns
def _row_values(r: Mapping[str, Any] | None, policies: Sequence[str]) -> dict[str, Any]:
    nan = float("nan")
    if r is None:
        return {"included": False, "n": 0, "d": 0, "k": 0, "n_events": 0, "solve_kkt": nan, "solve_fallback": 0,
                "solve_polished": False, "gate_built": False, "gate_score_dev": nan, "gate_alpha_dev": nan,
                **{f"ret_{p}": nan for p in policies}}
    cert = r.get("certificate")
    return {"included": True, "n": r["n"], "d": r["d"], "k": r["k"], "n_events": r["n_events"],
            "solve_kkt": float(cert.kkt_violation) if cert is not None else nan,
            "solve_fallback": int(cert.fallbacks) if cert is not None else 0,
            "solve_polished": bool(cert.polished) if cert is not None else False,
            "gate_built": "gate_score_dev" in r, "gate_score_dev": float(r.get("gate_score_dev", nan)),
            "gate_alpha_dev": float(r.get("gate_alpha_dev", nan)),
            **{f"ret_{p}": float(r["retention"][p]) for p in policies}}


_DTYPES = {"included": bool, "solve_polished": bool, "gate_built": bool, "n": np.int64, "d": np.int64, "k": np.int64,
           "n_events": np.int64, "solve_fallback": np.int64}


def rows_to_columns(rows: Sequence[Mapping[str, Any] | None], policies: Sequence[str],
                    d: int | None = None) -> dict[str, np.ndarray]:
    """Per-stay results (:func:`stay_retention` dicts, ``None`` for a stay without an event) as
    columns of shape (n_stays,): :data:`STAY_COLUMNS` and ``ret_<policy>`` (NaN where excluded).
    ``d`` fills the key dimension of excluded stays."""
    vals = [_row_values(r, policies) for r in rows]
    names = list(STAY_COLUMNS) + [f"ret_{p}" for p in policies]
    cols = {c: np.array([v[c] for v in vals], dtype=_DTYPES.get(c, np.float64)).reshape(-1) for c in names}
    if d is not None:
        cols["d"][~cols["included"]] = int(d)
    return cols


def concat_columns(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Column-wise concatenation of per-batch columns (same names in every part, in any order: a
    part read back from the task cache may list them in another order than a fresh one)."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    names = list(parts[0])
    for p in parts[1:]:
        if set(p) != set(names) or len(p) != len(names):
            raise MetricError(f"per-stay column sets differ: {sorted(names)} vs {sorted(p)}")
    return {c: np.concatenate([np.asarray(p[c]) for p in parts]) for c in names}


# ------------------------------------------------------------------------------ aggregation
def low_power(n_stays: int, n_event_hours: int) -> tuple[bool, str]:
    """``(True, reason)`` when the comparison rests on fewer than :data:`LOW_POWER_MIN_STAYS`
    stays or :data:`LOW_POWER_MIN_EVENT_HOURS` event hours; ``(False, "")`` otherwise.

    The label goes into the result (``metrics.low_power`` with its reason, and every claim). The
    thresholds are fixed in advance: below about 100 units a stay-bootstrap interval of a mean
    retention difference is typically as wide as the differences being compared, and one unusual
    stay moves the estimate visibly.
    """
    why = []
    if n_stays < LOW_POWER_MIN_STAYS:
        why.append(f"{n_stays} stays with an event (< {LOW_POWER_MIN_STAYS})")
    if n_event_hours < LOW_POWER_MIN_EVENT_HOURS:
        why.append(f"{n_event_hours} event hours (< {LOW_POWER_MIN_EVENT_HOURS})")
    return (True, "low power: " + ", ".join(why)) if why else (False, "")


def _maybe(test, a, b) -> PairedTest | None:
    """Run a paired test; ``None`` when it is undefined (e.g. identical samples)."""
    try:
        return test(a, b)
    except MetricError:
        return None


def comparison_from_columns(cols: Mapping[str, np.ndarray], *, policies: Sequence[str], nu: float, sigma: float,
                            seed: int = 0, n_boot: int = 10_000, level: float = 0.95) -> RetentionComparison:
    """Aggregate per-stay columns (:func:`rows_to_columns`, any number of batches concatenated):
    means, bootstrap intervals over the included stays, paired SV-minus-policy differences and
    tests. With a ``stay_id`` column the stays are put in id order first, so the result does not
    depend on the order in which batches finished."""
    if "stay_id" in cols:
        order = np.argsort(np.asarray(cols["stay_id"]), kind="stable")
        cols = {c: np.asarray(v)[order] for c, v in cols.items()}
    inc = np.asarray(cols.get("included", np.zeros(0, bool)), dtype=bool)
    if not inc.any():
        raise MetricError("no stay has an event hour; nothing to compare")
    per_stay = {p: np.asarray(cols[f"ret_{p}"], dtype=np.float64)[inc] for p in policies}
    n_inc = int(inc.sum())
    means = {p: float(per_stay[p].mean()) for p in policies}
    others = [p for p in policies if p != "sv"]
    # every interval resamples the same stays: one shared draw (bit-identical to one call per interval)
    cis = paired_bootstrap_cis([(per_stay[p], np.zeros(n_inc)) for p in policies]
                               + [(per_stay["sv"], per_stay[p]) for p in others], n_boot, seed, level)
    mean_ci = dict(zip(policies, cis[:len(policies)]))
    diffs: dict[str, BootstrapCI] = dict(zip(others, cis[len(policies):]))
    tests: dict[str, dict[str, PairedTest | None]] = {}
    for name in others:
        tests[name] = {"t": _maybe(paired_t_test, per_stay["sv"], per_stay[name]),
                       "wilcoxon": _maybe(wilcoxon_test, per_stay["sv"], per_stay[name])}
    n, k, ev = (np.asarray(cols[c])[inc] for c in ("n", "k", "n_events"))
    return RetentionComparison(
        per_stay=per_stay, means=means, mean_ci=mean_ci, diffs=diffs, tests=tests, n_included=n_inc,
        n_excluded=int(inc.size - n_inc), mean_budget_fraction=float(np.mean(k / n)),
        mean_support_size=float(np.mean(k)), n_event_hours=int(ev.sum()),
        config={"nu": nu, "sigma": sigma, "policies": list(policies), "seed": seed, "n_boot": n_boot,
                "level": level, "budget": "k = |S∪E| per stay (SV support size)",
                "random_policy": "exact expectation k/n per stay (uniform k-subset), no draw"},
    )


def compare_retention(keys_per_stay: Sequence[Any], events_per_stay: Sequence[Any], *, nu: float = 0.3,
                      sigma: float = 3.0, policies: Sequence[str] = DEFAULT_POLICIES, seed: int = 0,
                      n_boot: int = 10_000, level: float = 0.95, progress: bool = True) -> RetentionComparison:
    """Serial reference: compare policies' event-hour retention over in-memory stays.

    Parameters
    ----------
    keys_per_stay : sequence of arrays (n_s, d) — standardised hourly keys, in time order.
    events_per_stay : sequence of bool arrays (n_s,) — event hours (may use channels absent from the keys).
    nu, sigma : SVDD calibration (``C = 1/(ν·n_s)``) and RBF bandwidth, shared by SV and the kernel policies.
    policies : names for :func:`evaluation.policies.get_policy`; must include ``"sv"``; default
        SV, density, recency, random (its expectation) and :data:`PEERS`.
    seed, n_boot, level : the paired stay bootstrap.
    progress : show a tqdm bar over stays.
    """
    if len(keys_per_stay) != len(events_per_stay):
        raise MetricError(f"{len(keys_per_stay)} key arrays but {len(events_per_stay)} event masks")
    built = build_policies(policies, nu=nu, sigma=sigma)
    iterator: Any = zip(keys_per_stay, events_per_stay)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, total=len(keys_per_stay), desc="retention (stays)", leave=False)
    rows = [stay_policy_retention(X, ev, built) for X, ev in iterator]
    return comparison_from_columns(rows_to_columns(rows, list(built)), policies=list(built), nu=nu, sigma=sigma,
                                   seed=seed, n_boot=n_boot, level=level)


@dataclass
class RetentionComparison:
    """Aggregates of one retention comparison (no per-stay value leaves via :meth:`to_result_fields`).

    Attributes
    ----------
    per_stay : dict policy -> ndarray (n_included,) — per-stay retention, aligned across policies.
    means, mean_ci : per-policy mean retention and its bootstrap interval (mean vs 0 resampled).
    diffs : dict policy -> BootstrapCI of ``sv − policy`` (paired over stays, same resamples).
    tests : dict policy -> {"t": PairedTest, "wilcoxon": PairedTest}
    n_included, n_excluded : stays with / without an event hour.
    mean_budget_fraction, mean_support_size : mean ``k/n`` and ``k`` over included stays.
    n_event_hours : event hours over included stays.
    """

    per_stay: dict[str, np.ndarray]
    means: dict[str, float]
    mean_ci: dict[str, BootstrapCI]
    diffs: dict[str, BootstrapCI]
    tests: dict[str, dict[str, PairedTest | None]]
    n_included: int
    n_excluded: int
    mean_budget_fraction: float
    mean_support_size: float
    n_event_hours: int = 0
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def low_power(self) -> tuple[bool, str]:
        return low_power(self.n_included, self.n_event_hours)

    def to_result_fields(self, study: str | None = None) -> dict[str, Any]:
        """``metrics``/``tables``/``figures``/``claims``/``config`` fields for a result file
        (dashboards/SCHEMA.md) — aggregates only; ``study`` (``icu_retention`` / ``heldout_spo2``)
        puts the paper's figures beside the claims (:mod:`evaluation.clinical.retention_claims`)."""
        pols = list(self.means)
        weak, why = self.low_power
        metrics: dict[str, Any] = {
            "n_stays_included": self.n_included,
            "n_stays_excluded_no_event": self.n_excluded,
            "event_hours": self.n_event_hours,
            "mean_budget_fraction": self.mean_budget_fraction,
            "mean_support_size": self.mean_support_size,
            "retention": {p: self.means[p] for p in pols},
            "peer_beats_sv": sorted(p for p, ci in self.diffs.items() if ci.high < 0),
            "low_power": weak,
            "low_power_reason": why or (f"not low power: >= {LOW_POWER_MIN_STAYS} stays and >= "
                                        f"{LOW_POWER_MIN_EVENT_HOURS} event hours"),
            # what SV offers that the peers do not (none of them has a certificate or a deletion path)
            "sv_offers": {"evicted_hours_certified_inert": "every evicted hour has α = 0 at k = |S∪E|: the gated "
                                                           "readout and gate score are unchanged by its removal",
                          "exact_deletion": "C&P decrement equal to a same-C refit (forgetful forget; deletion audit)"},
        }
        for p, ci in self.diffs.items():
            metrics[f"diff_sv_minus_{p}"] = {"mean": ci.mean_diff, "low": ci.low, "high": ci.high}
            for name, t in self.tests[p].items():
                if t is not None:
                    metrics[f"diff_sv_minus_{p}"][f"{name}_p"] = t.pvalue
        label = {p: ("random (expectation k/n)" if p == "random" else p) for p in pols}
        level = next(iter(self.mean_ci.values())).level
        figures = [{
            "kind": "bar", "title": "event-hour retention at k = |S∪E|", "ylabel": "mean retention over stays",
            "categories": pols, "values": [self.means[p] for p in pols],
            "ci_low": [self.mean_ci[p].low for p in pols], "ci_high": [self.mean_ci[p].high for p in pols],
        }]
        from evaluation.clinical.retention_claims import retention_claims

        claims = retention_claims(study, means_ci=self.mean_ci, diffs=self.diffs, n=self.n_included, weak=weak,
                                  why=why, min_stays=LOW_POWER_MIN_STAYS, level=level, path=SOLVE_PATH, labels=label)
        return {
            "metrics": metrics,
            "tables": [{"title": "retention by policy" + (f" ({why})" if weak else ""),
                        "columns": ["policy", "mean", "ci low", "ci high"],
                        "rows": [[label[p], self.means[p], self.mean_ci[p].low, self.mean_ci[p].high] for p in pols]},
                       {"title": f"SV minus policy, paired bootstrap over stays ({int(level * 100)}% CI, "
                                 "same resampled stays for every policy)",
                        "columns": ["policy", "SV − policy", "ci low", "ci high", "beats SV"],
                        "rows": [[label[p], ci.mean_diff, ci.low, ci.high, bool(ci.high < 0)]
                                 for p, ci in self.diffs.items()]}],
            "figures": figures,
            "claims": claims,
            "config": dict(self.config),
        }
