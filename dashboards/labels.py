"""Human-readable names for the metric and configuration keys of study results.

:data:`METRIC_NAMES` is the single mapping from a key (one component of a nested metrics/config
path, e.g. ``score_dev_median`` in ``gaussian.score_dev_median``) to the name the report shows.
:func:`metric_label` names a whole dotted path: each component through the mapping, unknown ones
prettified (underscores to spaces, known abbreviations upper-cased, ``diff_a_minus_b`` to
``a − b``), joined with " · ". The report never shows a raw dotted key.
"""
from __future__ import annotations

import re

__all__ = ["METRIC_NAMES", "metric_label", "prettify"]

#: key -> readable name (one path component; nested keys are joined with " · ")
METRIC_NAMES: dict[str, str] = {
    # cohort and counts
    "n_stays": "stays", "n_tokens": "hourly tokens", "n_rows": "rows", "min_hours": "minimum stay (h)",
    "build_seconds": "build time (s)", "n_stays_included": "stays with an event (bootstrap units)",
    "test_stays": "test-split stays", "test_hours": "test-split hours",
    "test_prevalence": "test-split event prevalence",
    "key_dim": "key dimension", "mean_budget_fraction": "mean budget k / n", "stays_per_task": "stays per task",
    "n_boot": "bootstrap resamples", "seeds": "seeds", "seed": "seed", "n_seeds": "seeds",
    # retention
    "retention": "event-hour retention", "sv": "SV gate", "density": "density (H2O-style)", "recency": "recency",
    "random": "random", "mean": "mean", "low": "95 % CI low", "high": "95 % CI high", "sd": "SD",
    # deletion and audit
    "attempted": "attempted", "completed": "completed", "score_dev_median": "median max |Δ score| vs refit",
    "score_dev_worst": "worst max |Δ score| vs refit", "score_dev_p95": "p95 max |Δ score| vs refit",
    "decay_median": "median max |Δ score|, decay", "partition_match_pct": "partition match (%)",
    "kkt_residual_worst": "worst KKT residual", "kkt_residual_max": "max KKT residual",
    "refit_score_dev_max": "max |Δ score| vs refit", "leakage_after_max": "forgotten patient's weight after (max)",
    "decay_leakage_mean": "forgotten patient's weight under decay (mean)",
    "others_readout_change_mean": "others' readout change (mean)",
    "others_self_retrieval_before": "others' self-retrieval before", "others_self_retrieval_after":
        "others' self-retrieval after", "contexts_attempted": "contexts attempted",
    "contexts_completed": "contexts completed", "certified": "certified", "receipts": "receipts",
    "chain_verified": "receipt chain verified", "pending_erasures": "pending erasures",
    "last_deletion_utc": "last deletion (UTC)", "head": "ledger head",
    "decrement_ms_median": "median decrement (ms)", "refit_ms_median": "median refit (ms)",
    "sklearn_ms_median": "median scikit-learn refit (ms)", "refit_over_decrement_median": "median refit / decrement",
    "gaussian": "Gaussian", "clustered": "clustered", "icu_like": "ICU-like", "redundant": "redundant",
    "icu_warehouse": "ICU keys (warehouse)", "learned": "learned keys",
    # deterioration
    "auroc": "AUROC", "auprc": "AUPRC", "auroc_mean": "AUROC (mean over seeds)", "auroc_sd": "AUROC (SD over seeds)",
    "auprc_mean": "AUPRC (mean over seeds)", "auprc_sd": "AUPRC (SD over seeds)", "auroc_low": "AUROC 95 % CI low",
    "auroc_high": "AUROC 95 % CI high", "auprc_low": "AUPRC 95 % CI low", "auprc_high": "AUPRC 95 % CI high",
    "auroc_diff": "ΔAUROC", "auroc_diff_low": "ΔAUROC 95 % CI low", "auroc_diff_high": "ΔAUROC 95 % CI high",
    "auprc_diff": "ΔAUPRC", "auprc_diff_low": "ΔAUPRC 95 % CI low", "auprc_diff_high": "ΔAUPRC 95 % CI high",
    "paired": "paired difference", "label": "label", "mode": "sequence mode", "lstm": "LSTM",
    "softmax": "causal softmax", "sv_attention": "causal SV attention", "max_epochs": "epoch cap",
    "gru": "GRU", "lightgbm": "LightGBM (causal summaries)", "winner": "best model (seed-averaged test AUROC)",
    "headline": "best model and its paired ΔAUROC (95 % stay-clustered)",
    "tabular_windows": "LightGBM training windows",
    # language model / throughput
    "mean_sv_bpb": "SV hybrid, mean best val bits/byte", "mean_swa_bpb": "sliding window, mean best val bits/byte",
    "mean_rel_improvement": "mean relative improvement", "paired_t_p": "paired t-test p",
    "wilcoxon_p": "Wilcoxon signed-rank p", "steps": "training steps", "corpus_bytes": "corpus bytes",
    "protocol": "protocol", "protocol_label": "protocol (what ran)",
    "d_model": "model width d", "n_layers": "layers", "n_heads": "heads", "block": "context block (bytes)",
    "batch": "batch size", "lr": "learning rate", "min_lr": "final learning rate", "warmup_frac": "warm-up fraction",
    "weight_decay": "weight decay", "clip": "gradient clip", "eval_interval": "steps between evals",
    "eval_batches": "batches per eval", "chunk": "chunk", "fista_iters": "FISTA iterations",
    "fista_tol": "FISTA tolerance", "max_bytes": "corpus cap (bytes)", "val_frac": "validation fraction",
    "log_every": "steps between progress lines",
    "softmax_tokens_per_s": "softmax tokens/s", "hybrid_tokens_per_s": "SV hybrid tokens/s", "ratio": "ratio",
    # common configuration
    "nu": "ν", "sigma": "σ", "gamma": "γ", "C": "C", "trials": "trials", "trials_per_regime": "trials per regime",
    "source": "source", "sample": "sample", "content_hash": "content hash",
}

_UPPER = {"sv": "SV", "auroc": "AUROC", "auprc": "AUPRC", "kkt": "KKT", "ci": "CI", "icu": "ICU", "lm": "LM",
          "bpb": "bits/byte", "ms": "ms", "sd": "SD", "lstm": "LSTM", "swa": "sliding window", "ocsvm": "OCSVM",
          "spo2": "SpO₂", "mqar": "MQAR", "h2o": "H2O", "utc": "UTC", "id": "ID", "pct": "%", "p95": "p95"}


def prettify(key: str) -> str:
    """A readable name for a key that :data:`METRIC_NAMES` does not know."""
    m = re.fullmatch(r"diff_(.+)_minus_(.+)", key)
    if m:
        return f"{prettify(m.group(1))} − {prettify(m.group(2))}"
    m = re.fullmatch(r"gamma_([0-9.e-]+)", key)
    if m:
        return f"γ = {m.group(1)}"
    m = re.fullmatch(r"n(\d+)", key)
    if m:
        return f"n = {m.group(1)}"
    if key in METRIC_NAMES:
        return METRIC_NAMES[key]
    words = [w for w in re.split(r"[_\s]+", key) if w]
    if not words:
        return key
    if words[0] == "n" and len(words) > 1:  # n_items -> "items"
        words = words[1:]
    out = [_UPPER.get(w.lower(), w) for w in words]
    return " ".join(out)


def metric_label(path: str) -> str:
    """A readable name for a (possibly dotted) metrics/config path: ``retention.sv`` ->
    ``event-hour retention · SV gate``. Numeric-looking components (``0.1``) are kept whole."""
    parts = re.split(r"\.(?![0-9])", path)  # split on dots that do not start a decimal fraction
    return " · ".join(METRIC_NAMES.get(p, prettify(p)) for p in parts)
