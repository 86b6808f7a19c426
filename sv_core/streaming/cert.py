"""The full-history certificate of :class:`sv_core.StreamingGate`.

``future_safe`` is True when the hot KKT residual (recomputed from the hot keys, or the hot
gate's own guard in the maintained form returned by ``evict_reserve``) and the cold residual
(exact gradients with ``exact=True``, else the screening records' lower bounds) are at most
``KKT_TOL`` and no token was evicted by the uncertified hot budget.
"""
from __future__ import annotations

import numpy as np

from sv_core.streaming.cold import ColdTier
from sv_core.streaming.screen import KKT_TOL, HotView

COVERS = ("the current state after any sequence of admissions, reserve evictions and deletions: "
          "hot alpha extended by zeros satisfies fixed-C KKT over every live token (residual "
          "recomputed), so scores/readout equal the full-history solve at the same C")
DOES_NOT_COVER = ("tokens evicted by the uncertified hot budget (pinned); a changed C or sigma; "
                  "the choice of rho inside its KKT interval when the margin set is empty "
                  "(midpoint of the hot interval, not of the full-history one); alpha itself when "
                  "keys are duplicated (not unique; scores are); forgotten tokens (gone, as in a "
                  "fresh solve without them)")


def build_certificate(sg, hot, view: HotView, cold: ColdTier, budget: float, exact: bool,
                      recompute_hot: bool) -> dict:
    """The certificate of :meth:`StreamingGate.certificate` (``sg``: its public views and
    ``stats``; ``hot``, ``view``, ``cold``, ``budget``: its hot gate, hot view, cold tier and
    screening budget)."""
    scr = sg.stats["screened"] + sg.stats["exact_checks"]
    n_pin = cold.n_pinned
    out = {
        "C": sg.C, "sigma": sg.sigma, "gated": hot.gated,
        "n_live": sg.n, "n_hot": sg.n_hot, "n_cold": sg.n_cold, "n_pinned": n_pin,
        "hot_fraction": sg.n_hot / sg.n if sg.n else 0.0,
        "readmissions": sg.stats["readmissions"],
        "readmission_rounds": sg.stats["readmission_rounds"],
        "uncertified_evictions": sg.stats["uncertified_evictions"],
        "admitted_cold": sg.stats["admitted_cold"],
        "hot_fallbacks": int(getattr(hot, "fallbacks", 0)),
        "screening": {"exact_checks": sg.stats["exact_checks"],
                      "screened": sg.stats["screened"],
                      "fraction_screened": sg.stats["screened"] / scr if scr else 0.0,
                      "enabled": sg.screen},
        "kkt_tol": KKT_TOL,
    }
    if not hot.gated:
        out.update(future_safe=False, kkt_residual=None, margin_empty=None,
                   reason="warm-up: the gate is not solved; no certificate")
        return out
    # without recomputation the hot residual is the hot gate's guard (<= 1e-9 after each op)
    kkt_hot = float(view.kkt(sg.C)["max"]) if recompute_hot else None
    if exact:
        cid = cold.ids("free")
        g_free = view.exact_g(cold.store.get(cid)) if cid.size else np.zeros(0)
        cold_res = float(np.maximum(-g_free, 0.0).max(initial=0.0))
        pid = cold.ids("pinned")
        pin_g = view.exact_g(cold.store.get(pid)) if pid.size else np.zeros(0)
        pin_res = float(np.maximum(-pin_g, 0.0).max(initial=0.0))
    else:
        cold.refresh_min()
        lower = cold.min_tau + view.rho - 2.0 * budget if cold.n_free else np.inf
        cold_res, pin_res = float(max(-lower, 0.0)), None
    part = view.partition_counts(sg.C)
    kkt = max(kkt_hot or 0.0, cold_res)
    safe = kkt <= KKT_TOL and not n_pin
    if n_pin:
        reason = (f"UNCERTIFIED: the hot budget evicted {n_pin} live non-reserve "
                  "token(s) (pinned cold); scores are the optimum over hot + certified cold, "
                  "not over the full history")
    elif kkt > KKT_TOL:
        reason = f"full-history KKT residual {kkt:.3g} exceeds {KKT_TOL:g}"
    else:
        reason = ("hot alpha extended by zeros on the cold tier satisfies the fixed-C KKT "
                  "conditions over every live token: equals the full-history solve")
    out.update(covers=COVERS, does_not_cover=DOES_NOT_COVER)
    out.update(future_safe=bool(safe), reason=reason, margin_empty=part["margin"] == 0,
               hot_partition=part, exact=bool(exact),
               kkt_residual={"hot": kkt_hot, "cold": cold_res, "pinned": pin_res, "max": kkt,
                             "hot_source": "recomputed" if recompute_hot else "hot gate guard"})
    return out
