"""Deterioration study results: per-model aggregates over seeds, per-seed paired differences,
the comparison pairs and the ROC figure spec (pure functions over the training runs' outputs).

The flow (:mod:`pipelines.flows.clinical_deterioration`) trains the runs and writes the result;
the stay-clustered bootstrap of the seed-averaged predictions is
:func:`evaluation.cluster_bootstrap.paired_cluster_bootstrap`.
"""
from __future__ import annotations

import itertools

import numpy as np

from evaluation.claims import claim, interval, tolerance

PAPER_AUROC = {"sv_attention": 0.696, "lstm": 0.783, "softmax": 0.751}
#: the report's low-power threshold for this study (dashboards/SCHEMA.md: ``test_stays`` below 20)
MIN_TEST_STAYS = 20
#: AUROC / AUPRC of models trained with torch on CPU: their weights depend on the CPU's vector kernels and thread
#: count, so the figures (and the bootstrap bounds) move in the third decimal across machines
TRAINED_TOLERANCE = tolerance("AUROC / AUPRC of models trained with torch on CPU: the weights depend on the CPU's "
                              "vector kernels and thread count", abs=0.02)
LABELS = {"lstm": "LSTM", "gru": "GRU", "softmax": "causal softmax", "sv_attention": "causal SV attention",
          "lightgbm": "LightGBM (causal summaries)", "event_now": "event now (trivial baseline)"}
BASELINE = "event_now"


def aggregate(runs: list[dict], models: list[str]) -> dict:
    """Per model over seeds: mean and seed-level SD of AUROC/AUPRC, and (legacy key) the mean of
    the per-seed CI bounds — not an interval; the real one is ``auroc_seedavg_low/high``."""
    out = {}
    for m in models:
        rs = [r for r in runs if r["model"] == m]
        au = np.array([r["auroc"] for r in rs])
        ap = np.array([r["auprc"] for r in rs])
        sd = (lambda a: float(a.std(ddof=1)) if len(a) > 1 else 0.0)
        out[m] = {"auroc_mean": float(au.mean()), "auroc_sd": sd(au), "auprc_mean": float(ap.mean()),
                  "auprc_sd": sd(ap), "auroc_ci_low_mean": float(np.mean([r["auroc_low"] for r in rs])),
                  "auroc_ci_high_mean": float(np.mean([r["auroc_high"] for r in rs])), "seeds": len(rs),
                  "epochs_mean": float(np.mean([r["epochs"] for r in rs])), "n_params": rs[0]["n_params"],
                  "train_s_mean": float(np.mean([r["train_s"] for r in rs]))}
    return out


def seed_paired(runs: list[dict], pairs, y: np.ndarray) -> dict:
    """Per-seed paired differences (same seed index, same test hours): mean and seed-level SD."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    by = {(r["model"], r["seed"]): np.asarray(r["p_test"], dtype=np.float64) for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    out = {}
    for a, b in pairs:
        da = [roc_auc_score(y, by[a, s]) - roc_auc_score(y, by[b, s]) for s in seeds if (a, s) in by and (b, s) in by]
        dp = [average_precision_score(y, by[a, s]) - average_precision_score(y, by[b, s])
              for s in seeds if (a, s) in by and (b, s) in by]
        sd = (lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0)
        out[f"{a} - {b}"] = {"auroc_diff_mean": float(np.mean(da)), "auroc_diff_sd": sd(da),
                             "auprc_diff_mean": float(np.mean(dp)), "auprc_diff_sd": sd(dp), "seeds": len(da)}
    return out


def roc_figure(y: np.ndarray, scores: dict[str, np.ndarray], keys: list[str], boot: dict,
               n_points: int = 101) -> dict:
    """Line-figure spec of the test ROC curves of ``keys`` (seed-averaged predictions and the
    baseline), each on a fixed ``n_points`` false-positive-rate grid (an aggregate: no score or
    label of any hour is stored), labelled with its AUROC and stay-clustered 95 % interval."""
    from evaluation.classification import roc_curve_points

    series = []
    for k in keys:
        c = roc_curve_points(y, scores[k], n_points=n_points)
        s = boot["scores"][k]
        series.append({"label": f"{LABELS[k]}: {s['auroc']:.3f} [{s['auroc_low']:.3f}, {s['auroc_high']:.3f}]",
                       "x": c["fpr"], "y": c["tpr"], "style": "line"})
    return {"kind": "line", "title": "test ROC of the seed-averaged predictions (legend: AUROC, 95% stay-clustered "
                                     "interval)", "xlabel": "false-positive rate", "ylabel": "true-positive rate",
            "diagonal": True, "series": series}


def comparison_pairs(models: list[str]) -> list[tuple[str, str]]:
    """Every pair of models (SV attention first, so its differences read "SV − peer"), then each
    model against the baseline."""
    known = ("sv_attention", "softmax", "lstm", "gru", "lightgbm")
    order = [m for m in known if m in models] + [m for m in models if m not in known]
    return list(itertools.combinations(order, 2)) + [(m, BASELINE) for m in order]


def deterioration_claims(boot: dict, models: list[str], test_stays: int) -> list[dict]:
    """The paper's finding (seed 001 §5: SV attention 0.696 below the LSTM's 0.783 and softmax's 0.751), one
    claim per baseline, decided on the stay-clustered paired bootstrap interval of the AUROC difference of the
    seed-averaged predictions (below 0 holds); low power below :data:`MIN_TEST_STAYS` test stays."""
    if "sv_attention" not in models:
        return []
    power = {"flag": test_stays < MIN_TEST_STAYS, "n": int(test_stays), "minimum": MIN_TEST_STAYS,
             "unit": "test stays", "label": f"low power: {test_stays} test stays (fewer than {MIN_TEST_STAYS}); the "
                                           "stay-clustered interval is wide" if test_stays < MIN_TEST_STAYS else ""}
    sv = boot["scores"]["sv_attention"]
    level = int(100 * boot.get("level", 0.95))
    out = []
    for b in ("lstm", "softmax"):
        key = f"sv_attention - {b}"
        if b not in models or key not in boot["pairs"]:
            continue
        d, pb = boot["pairs"][key], boot["scores"][b]
        out.append(claim(
            f"SV attention predicts deterioration within 6 h less well than {LABELS[b]} (competitive, not best)",
            reference=f"{LABELS[b]} trained on the same windows and seeds; seed-averaged predictions",
            path="batched FISTA + 1e-3 ridge (training path); AUROC of the test hours", operation="batched training",
            rule=f"{level} % stay-clustered paired bootstrap interval of SV − {LABELS[b]} AUROC below 0",
            passed=bool(d["auroc_diff_high"] < 0),
            run=interval(sv["auroc"], sv["auroc_low"], sv["auroc_high"],
                         how=f"SV attention AUROC, {level} % stay-clustered bootstrap over {test_stays} test stays"),
            peer={"name": LABELS[b], "value": pb["auroc"], "low": pb["auroc_low"], "high": pb["auroc_high"]},
            difference=interval(d["auroc_diff"], d["auroc_diff_low"], d["auroc_diff_high"],
                                how=f"{level} % stay-clustered paired bootstrap", n=test_stays),
            paper={"figure": f"AUROC {PAPER_AUROC['sv_attention']} (SV attention) vs {PAPER_AUROC[b]} ({LABELS[b]})",
                   "source": "seed 001 §5"},
            value=f"{d['auroc_diff']:.3f} [{d['auroc_diff_low']:.3f}, {d['auroc_diff_high']:.3f}]", power=power,
            fragile=(f"the interval's upper end ({d['auroc_diff_high']:.2g}) lies within the trained models' "
                     f"tolerance ({TRAINED_TOLERANCE['abs']:g}) of 0" if abs(d["auroc_diff_high"])
                     <= TRAINED_TOLERANCE["abs"] else None)))
    return out


def winner(boot: dict, models: list[str]) -> dict | None:
    """The model with the highest AUROC of its seed-averaged predictions, and its paired differences
    (ΔAUROC, ΔAUPRC with their stay-clustered intervals, read from ``boot["pairs"]`` and turned
    to "winner − other") against every other model: ``{"winner", "versus", "headline", "claim"}``;
    None with fewer than two models. The claim (a claim of this project's, beyond the paper) holds
    when the paired interval against the runner-up lies above 0."""
    if len(models) < 2:
        return None
    sc = boot["scores"]
    best = max(models, key=lambda m: (sc[m]["auroc"], -models.index(m)))
    versus = {}
    for m in models:
        if m == best:
            continue
        d, sign = (boot["pairs"][f"{best} - {m}"], 1.0) if f"{best} - {m}" in boot["pairs"] else \
            (boot["pairs"][f"{m} - {best}"], -1.0)
        lo, hi = sorted((sign * d["auroc_diff_low"], sign * d["auroc_diff_high"]))
        plo, phi = sorted((sign * d["auprc_diff_low"], sign * d["auprc_diff_high"]))
        versus[m] = {"auroc_diff": sign * d["auroc_diff"], "auroc_diff_low": lo, "auroc_diff_high": hi,
                     "auprc_diff": sign * d["auprc_diff"], "auprc_diff_low": plo, "auprc_diff_high": phi}
    runner_up = max(versus, key=lambda m: sc[m]["auroc"])
    b, r, name = sc[best], versus[runner_up], LABELS.get(best, best)
    diffs = "; ".join(f"− {LABELS.get(m, m)} {v['auroc_diff']:+.3f} [{v['auroc_diff_low']:+.3f}, "
                      f"{v['auroc_diff_high']:+.3f}]"
                      for m, v in sorted(versus.items(), key=lambda kv: kv[1]["auroc_diff"]))
    headline = (f"best: {name}, AUROC {b['auroc']:.3f} [{b['auroc_low']:.3f}, {b['auroc_high']:.3f}]"
                f"; paired ΔAUROC {diffs}")
    level = int(100 * boot.get("level", 0.95))
    rival = LABELS.get(runner_up, runner_up)
    c = claim(
        f"{name} has the highest test AUROC of the seed-averaged predictions (ahead of the runner-up, {rival})",
        reference="every other model's seed-averaged predictions on the same test hours and stay-clustered resamples",
        path="paired stay-clustered bootstrap of AUROC (evaluation.cluster_bootstrap)",
        rule=f"{level} % stay-clustered paired bootstrap interval of {name} − {rival} AUROC above 0",
        passed=bool(r["auroc_diff_low"] > 0),
        run=interval(b["auroc"], b["auroc_low"], b["auroc_high"],
                     how=f"{name} AUROC, {level} % stay-clustered bootstrap"),
        difference=interval(r["auroc_diff"], r["auroc_diff_low"], r["auroc_diff_high"],
                            how=f"{level} % stay-clustered paired bootstrap, {name} − {rival}"),
        strongest_peer={"name": rival, "value": sc[runner_up]["auroc"], "low": sc[runner_up]["auroc_low"],
                        "high": sc[runner_up]["auroc_high"]},
        value=f"{r['auroc_diff']:+.3f} [{r['auroc_diff_low']:+.3f}, {r['auroc_diff_high']:+.3f}]",
        fragile=(f"the interval's lower end ({r['auroc_diff_low']:.2g}) lies within the trained models' tolerance "
                 f"({TRAINED_TOLERANCE['abs']:g}) of 0" if abs(r["auroc_diff_low"]) <= TRAINED_TOLERANCE["abs"]
                 else None))
    return {"winner": best, "versus": versus, "headline": headline, "claim": c}
