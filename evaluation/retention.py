"""Event-hour retention comparison of selection policies at the support-defined budget.

The protocol of seed 001 §5 (real ICU streams and the held-out SpO₂ control): for each stay with at
least one event hour, the budget is the stay's support size ``k = |S∪E|`` (SV policy at fixed
``C = 1/(ν·n)``); every policy keeps exactly ``k`` hours; retention is the fraction of event hours
kept; stays are the bootstrap units. The caller decides which channels the selectors see (for the
held-out control, pass keys without the SpO₂ column and events defined from raw SpO₂).

The query-free peers of :mod:`evaluation.peers` (ridge leverage, kernel leverage in the gate's RBF
space, KeyDiff) run in the same protocol (:data:`PEERS`, part of the default policy list); the
query-stream peers (SnapKV, TOVA) and the oracle need queries, which an ICU stay does not have.
Every SV-minus-policy difference is a paired percentile bootstrap over stays with the same seed, so
every comparison uses the same resampled stays. ``metrics["peer_beats_sv"]`` lists the policies
whose interval lies entirely above SV (``diff_sv_minus_<p>.high < 0``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from evaluation.errors import MetricError
from evaluation.metrics import (
    BootstrapCI,
    PairedTest,
    paired_bootstrap_ci,
    paired_t_test,
    event_hour_retention,
    wilcoxon_test,
)
from evaluation.peers import QUERY_FREE_PEERS
from evaluation.policies import SelectionPolicy, SupportVectorPolicy, get_policy

__all__ = ["RetentionComparison", "compare_retention", "PEERS", "DEFAULT_POLICIES"]

#: the query-free peers, reported beside the seed's baselines
PEERS = QUERY_FREE_PEERS
#: default policy list of :func:`compare_retention`
DEFAULT_POLICIES = ("sv", "density", "recency", "random") + PEERS
#: policies whose constructor takes the gate's bandwidth
_SIGMA_POLICIES = ("density", "h2o", "h2o_density", "kernel_leverage")


@dataclass
class RetentionComparison:
    """Aggregates of one retention comparison (no per-stay values leave via :meth:`to_result_fields`).

    Attributes
    ----------
    per_stay : dict policy -> ndarray (n_included,)
        Per-stay retention, aligned across policies (kept in memory for further analysis).
    means, mean_ci : per-policy mean retention and its bootstrap interval (mean vs 0 resampled).
    diffs : dict policy -> BootstrapCI of ``sv − policy`` (paired over stays).
    tests : dict policy -> {"t": PairedTest, "wilcoxon": PairedTest}
    n_included, n_excluded : stays with / without an event hour.
    mean_budget_fraction : mean ``k/n`` over included stays.
    mean_support_size : mean ``k`` over included stays.
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
    config: dict[str, Any] = field(default_factory=dict)

    def to_result_fields(self) -> dict[str, Any]:
        """``metrics``/``tables``/``figures``/``claims``/``config`` fields for a result file
        (dashboards/SCHEMA.md) — aggregates only."""
        pols = list(self.means)
        metrics: dict[str, Any] = {
            "n_stays_included": self.n_included,
            "n_stays_excluded_no_event": self.n_excluded,
            "mean_budget_fraction": self.mean_budget_fraction,
            "mean_support_size": self.mean_support_size,
            "retention": {p: self.means[p] for p in pols},
            "peer_beats_sv": sorted(p for p, ci in self.diffs.items() if ci.high < 0),
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
        rows = [[p, self.means[p], self.mean_ci[p].low, self.mean_ci[p].high] for p in pols]
        level = next(iter(self.mean_ci.values())).level
        figures = [{
            "kind": "bar", "title": "event-hour retention at k = |S∪E|", "ylabel": "mean retention over stays",
            "categories": pols, "values": [self.means[p] for p in pols],
            "ci_low": [self.mean_ci[p].low for p in pols], "ci_high": [self.mean_ci[p].high for p in pols],
        }]
        claims = [{
            "statement": f"mean event-hour retention, SV minus {p} ({int(level * 100)}% paired bootstrap over stays)",
            "reference": "same per-stay budget k = |S∪E| for every policy",
            "path": "exact fp64 refit at fixed C = 1/(nu*n) (batch-solve path)",
            "value": f"{ci.mean_diff:.3f} [{ci.low:.3f}, {ci.high:.3f}]",
            "holds": bool(ci.low > 0),
        } for p, ci in self.diffs.items()]
        return {
            "metrics": metrics,
            "tables": [{"title": "retention by policy", "columns": ["policy", "mean", "ci low", "ci high"],
                        "rows": rows},
                       {"title": f"SV minus policy, paired bootstrap over stays ({int(level * 100)}% CI, "
                                 "same resampled stays for every policy)",
                        "columns": ["policy", "SV − policy", "ci low", "ci high", "beats SV"],
                        "rows": [[p, ci.mean_diff, ci.low, ci.high, bool(ci.high < 0)]
                                 for p, ci in self.diffs.items()]}],
            "figures": figures,
            "claims": claims,
            "config": dict(self.config),
        }


def compare_retention(
    keys_per_stay: Sequence[Any],
    events_per_stay: Sequence[Any],
    *,
    nu: float = 0.3,
    sigma: float = 3.0,
    policies: Sequence[str] = DEFAULT_POLICIES,
    seed: int = 0,
    n_boot: int = 10_000,
    level: float = 0.95,
    progress: bool = True,
) -> RetentionComparison:
    """Compare policies' event-hour retention at each stay's support-defined budget.

    Parameters
    ----------
    keys_per_stay : sequence of arrays (n_s, d)
        Standardised hourly keys of each stay, in time order (selector input).
    events_per_stay : sequence of bool arrays (n_s,)
        Event hours of each stay (may use channels absent from the keys).
    nu, sigma : SVDD calibration (``C = 1/(ν·n_s)``) and RBF bandwidth, shared by SV and density.
    policies : names for :func:`evaluation.policies.get_policy`; must include ``"sv"``.
        Policies that need queries (``oracle``, ``snapkv``, ``tova``) are not allowed (an ICU stay
        has no query stream). Default: SV, density, recency, random and the peers :data:`PEERS`.
    seed : seeds the random policy (one generator threaded through the stays) and the bootstrap.
    n_boot, level : paired bootstrap settings (units = included stays).
    progress : show a tqdm bar over stays.
    """
    if len(keys_per_stay) != len(events_per_stay):
        raise MetricError(f"{len(keys_per_stay)} key arrays but {len(events_per_stay)} event masks")
    if "sv" not in policies:
        raise MetricError("policies must include 'sv' (it defines the budget)")
    if len(set(policies)) != len(policies):
        raise MetricError(f"duplicate policy names in {list(policies)}")
    built = build_policies(policies, nu=nu, sigma=sigma, seed=seed)
    rng = np.random.default_rng(seed)
    iterator: Any = zip(keys_per_stay, events_per_stay)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, total=len(keys_per_stay), desc="retention (stays)", leave=False)
    rows, n_excluded = [], 0
    for X, ev in iterator:
        row = stay_policy_retention(X, ev, built, rng=rng)
        if row is None:
            n_excluded += 1  # no event hour: excluded before any solve, counted
        else:
            rows.append(row)
    return comparison_from_rows(rows, n_excluded=n_excluded, policies=policies, nu=nu, sigma=sigma, seed=seed,
                                n_boot=n_boot, level=level)


def build_policies(policies: Sequence[str], *, nu: float, sigma: float, seed: int) -> dict[str, SelectionPolicy]:
    """The protocol's policies by name (``"sv"`` first: it defines the budget).

    Kernel policies (density, kernel leverage) get the gate's ``sigma``; peers keep their documented
    defaults (λ of :mod:`evaluation.peers`). Raises :class:`MetricError` for policies that need
    queries (oracle, SnapKV, TOVA).
    """
    built: dict[str, SelectionPolicy] = {"sv": SupportVectorPolicy(nu=nu, sigma=sigma)}
    for name in policies:
        if name == "sv":
            continue
        kw: dict[str, Any] = {}
        if name in _SIGMA_POLICIES or name in ("oracle", "snapkv", "tova"):
            kw = {"sigma": sigma}
        elif name == "random":
            kw = {"seed": seed}
        pol = get_policy(name, **kw)
        if pol.requires_queries:
            raise MetricError(f"the {name!r} policy needs a query stream; it is not part of this protocol")
        built[name] = pol
    return built


def stay_policy_retention(X: Any, ev: Any, built: dict[str, SelectionPolicy], *,
                          rng: np.random.Generator) -> dict[str, Any] | None:
    """Event-hour retention of every policy on one stay at budget ``k = |S∪E|``.

    X : (n, d) selector input in hour order; ev : (n,) bool event hours.
    Returns ``{"n", "k", "n_events", "retention": {policy: fraction}}``, or ``None`` when the
    stay has no event hour (excluded before any solve).
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    ev = np.asarray(ev, dtype=bool)
    if X.ndim != 2 or ev.shape != (X.shape[0],):
        raise MetricError(f"stay keys of shape {X.shape} do not match events of shape {ev.shape}")
    if not ev.any():
        return None
    k = built["sv"].support_size(X)
    return {"n": int(X.shape[0]), "k": int(k), "n_events": int(ev.sum()),
            "retention": {name: event_hour_retention(pol.select(X, k, rng=rng), ev) for name, pol in built.items()}}


def comparison_from_rows(rows: Sequence[dict[str, Any]], *, n_excluded: int, policies: Sequence[str], nu: float,
                         sigma: float, seed: int = 0, n_boot: int = 10_000, level: float = 0.95
                         ) -> RetentionComparison:
    """Aggregate per-stay rows of :func:`stay_policy_retention` (in a fixed stay order): means,
    bootstrap intervals over stays, paired SV-minus-policy differences and tests."""
    if not rows:
        raise MetricError("no stay has an event hour; nothing to compare")
    per_stay = {p: np.array([r["retention"][p] for r in rows], dtype=np.float64) for p in policies}
    means = {p: float(per_stay[p].mean()) for p in policies}
    mean_ci = {p: paired_bootstrap_ci(per_stay[p], np.zeros(len(rows)), n_boot, seed, level) for p in policies}
    diffs: dict[str, BootstrapCI] = {}
    tests: dict[str, dict[str, PairedTest | None]] = {}
    for name in policies:
        if name == "sv":
            continue
        diffs[name] = paired_bootstrap_ci(per_stay["sv"], per_stay[name], n_boot, seed, level)
        tests[name] = {"t": _maybe(paired_t_test, per_stay["sv"], per_stay[name]),
                       "wilcoxon": _maybe(wilcoxon_test, per_stay["sv"], per_stay[name])}
    return RetentionComparison(
        per_stay=per_stay, means=means, mean_ci=mean_ci, diffs=diffs, tests=tests,
        n_included=len(rows), n_excluded=int(n_excluded),
        mean_budget_fraction=float(np.mean([r["k"] / r["n"] for r in rows])),
        mean_support_size=float(np.mean([r["k"] for r in rows])),
        config={"nu": nu, "sigma": sigma, "policies": list(policies), "seed": seed, "n_boot": n_boot,
                "level": level, "budget": "k = |S∪E| per stay (SV support size)"},
    )


def _maybe(test, a, b) -> PairedTest | None:
    """Run a paired test; ``None`` when it is undefined (e.g. identical samples)."""
    try:
        return test(a, b)
    except MetricError:
        return None
