"""The audit and the latency bench report what issue 10 asks for (schema, not timings)."""
from __future__ import annotations

import math

import numpy as np


def test_audit_reports_redundant_regime_sweep_fallbacks_and_removal_classes():
    from sv_core.audit import DEFAULT_REGIMES, SWEEP_JITTERS, format_table, run_audit, sweep_name

    assert "redundant" in DEFAULT_REGIMES
    res = run_audit(trials=2, regimes=["redundant", "gaussian"], seed=0, progress=False,
                    jitter_sweep=True, sweep_trials=1)
    for s in list(res["regimes"].values()) + list(res["jitter_sweep"].values()):
        for key in ("attempted", "completed", "partition_match_pct", "score_dev_median", "score_dev_p95",
                    "score_dev_worst", "decay_median", "kkt_residual_worst", "active_removals",
                    "fallbacks", "trials_with_fallback", "cond_K_SS_median", "cond_K_support_median"):
            assert key in s, key
        assert s["completed"] == s["attempted"]
        by = s["by_removal"]
        assert by["active"]["completed"] + by["reserve"]["completed"] == 2 * s["completed"]
        assert s["score_dev_worst"] <= 1e-6 and s["kkt_residual_worst"] <= 1e-9
    assert list(res["jitter_sweep"]) == [sweep_name(j) for j in SWEEP_JITTERS]
    assert res["jitter_sweep"]["jitter_0"]["jitter"] == 0.0
    assert "redundant" in format_table(res) and "jitter_1e-05" in format_table(res)


def test_redundant_regime_is_hard():
    """Its support Gram block is ill-conditioned (the seed's regime had cond ~1e11)."""
    from sv_core import Gate, calibrate_C
    from sv_core.audit import redundant_keys

    rng = np.random.default_rng(0)
    conds = []
    for _ in range(6):
        X = redundant_keys(rng)
        g = Gate(C=calibrate_C(0.4, X.shape[0]), sigma=2.0)
        g.admit(X)
        sup = g.alpha > 0
        K = g._solver.K[: X.shape[0], : X.shape[0]][np.ix_(sup, sup)]
        conds.append(np.linalg.cond(K))
    assert np.median(conds) >= 1e9


def test_bench_one_schema_with_peers():
    from sv_core.bench.delete import bench_one, slope

    r = bench_one(40, deletions=3, seed=0, reserve_deletions=2, admissions=2)
    a = r["active"]
    assert a["count"] == 3 and r["all"] is a
    for key in ("decrement_ms_median", "decrement_ms_iqr", "refit_ms_median", "sklearn_ms_median",
                "refit_over_decrement_median", "sklearn_over_decrement_median", "osqp_ms_median", "fallbacks"):
        assert key in a, key
    assert r["admission"]["count"] == 2 and r["reserve"]["count"] == 2
    assert r["kkt_residual_end"] <= 1e-9
    assert math.isclose(slope([10, 100], [1.0, 10.0]), 1.0)
