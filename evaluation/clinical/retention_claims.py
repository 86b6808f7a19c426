"""Claims of the retention studies (ICU retention, held-out SpO₂), each decided on its interval.

One claim per compared policy: SV's mean event-hour retention minus the policy's, with the paired
stay bootstrap of :class:`evaluation.clinical.retention.RetentionComparison`; it holds only when that
interval lies above 0 (:mod:`evaluation.claims`). The paper's figure stands beside the policies it
compared (seed 001 §5: density for ICU retention; density, recency and random for the held-out
control); a comparison resting on few stays or event hours carries its low-power flag with the n.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evaluation.claims import ci, claim, peer_fig

#: seed 001 §5, per study: the paper's figure per compared policy
PAPER: dict[str, dict[str, str]] = {
    "icu_retention": {"density": "retention 0.80 (SV) vs 0.05 (H2O-style density) at the support-defined budget "
                                 "(mean 33 %), 1,329 stays"},
    "heldout_spo2": {"density": "retention 0.464 (SV) vs 0.225 (density), difference 0.239 [0.194, 0.284], 718 "
                                "stays", "recency": "0.464 (SV) vs 0.409 (recency), 718 stays",
                     "random": "0.464 (SV) vs 0.333 (random), 718 stays"},
}
SOURCE = "seed 001 §5"


def retention_claims(study: str | None, *, means_ci: Mapping[str, Any], diffs: Mapping[str, Any], n: int,
                     weak: bool, why: str, min_stays: int, level: float, path: str,
                     labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """``means_ci`` / ``diffs``: policy -> BootstrapCI (mean vs 0; SV − policy, paired over stays)."""
    how = f"{int(level * 100)} % paired bootstrap over {n:,} stays"
    power = {"flag": bool(weak), "n": int(n), "minimum": int(min_stays), "unit": "stays with an event",
             "label": why if weak else ""}
    sv = means_ci["sv"]
    run = ci({"mean": sv.mean_diff, "low": sv.low, "high": sv.high},
             how=f"SV mean event-hour retention, {int(level * 100)} % bootstrap over {n:,} stays")
    out = []
    for p, d in diffs.items():
        m = means_ci[p]
        paper_fig = (PAPER.get(study or "") or {}).get(p)
        out.append(claim(
            f"mean event-hour retention, SV minus {labels.get(p, p)} ({int(level * 100)}% paired bootstrap over stays"
            + (f"; {why}" if weak else "") + ")",
            reference="same per-stay budget k = |S∪E| for every policy"
                      + ("; random = its exact expectation k/n per stay" if p == "random" else ""),
            path=path, rule=f"{int(level * 100)} % paired bootstrap interval of SV − {labels.get(p, p)} retention "
                            "above 0",
            passed=bool(d.low > 0), run=run,
            peer=peer_fig(labels.get(p, p), {"mean": m.mean_diff, "low": m.low, "high": m.high}),
            difference=ci({"mean": d.mean_diff, "low": d.low, "high": d.high}, how=how, n=n),
            paper={"figure": paper_fig, "source": SOURCE} if paper_fig else
                  {"figure": None, "source": "the paper does not compare this policy"},
            value=f"{d.mean_diff:.3f} [{d.low:.3f}, {d.high:.3f}]", power=power))
    return out
