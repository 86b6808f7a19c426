"""Published comparators (seed 001 and SPEC §3) shown beside each study's own figure.

These are the *seed's* numbers, drawn as the seed figure of each report section; they are never
used as this project's results. Flows may copy ``SEED_FIGURES[study]`` into the ``seed_figure``
field of their result file (``seed_figure_for(study)`` returns a copy).

``CONTRACT_CARD`` is seed 001 Table 1: each row names the operation, the certified statement, its
reference state and numerical path, and the explicit boundary of the claim.
"""
from __future__ import annotations

import copy
from typing import Any

__all__ = ["SEED_FIGURES", "SEED_CLAIMS", "CONTRACT_CARD", "SEED_DATA", "REAL_SOURCES", "seed_figure_for", "seed_field",
           "seed_comparability", "seed_line"]

SEED_FIGURES: dict[str, dict[str, Any]] = {
    "cohort": {
        "source": "seed 001 §5; SPEC §2",
        "text": "MIMIC-IV v3.1: 1,500 sampled stays (LOS ≥ 2 d) → 1,465 eligible (≥ 48 h), 222,935 hourly "
        "tokens; 1,329 stays with ≥ 1 threshold event; 718 with ≥ 1 SpO₂ < 90 % hour.",
        "values": {"sampled stays": 1500, "eligible stays": 1465, "hourly tokens": 222935,
                   "stays with event": 1329, "stays with SpO2<90 hour": 718},
        "figure": {"kind": "funnel", "title": "seed cohort funnel (stays)", "stages": [
            {"label": "sampled, LOS ≥ 2 d", "count": 1500},
            {"label": "≥ 48 hourly tokens", "count": 1465},
            {"label": "≥ 1 threshold event", "count": 1329},
            {"label": "≥ 1 SpO₂ < 90 % hour", "count": 718}]},
    },
    "icu_retention": {
        "source": "seed 001 §5 (real ICU streams)",
        "text": "Event-hour retention at the support-defined budget (mean 33 % of each stay), ν = 0.3, σ = 3, "
        "1,329 stays: support set 0.80 vs H2O-style density 0.05. Label shares channels with the input "
        "(mechanistically expected, not clinical prediction).",
        "values": {"sv": 0.80, "density": 0.05},
        "figure": {"kind": "bar", "title": "seed: event-hour retention", "ylabel": "retention",
                   "categories": ["sv", "density"], "values": [0.80, 0.05]},
    },
    "heldout_spo2": {
        "source": "seed 001 §5 (held-out-channel control)",
        "text": "SpO₂ < 90 % events, SpO₂ removed from every selector's input, 718 stays, mean budget 32 %: "
        "SV 0.464, density 0.225, recency 0.409, random 0.333; paired difference SV − density 0.239, "
        "95 % bootstrap interval [0.194, 0.284] (10,000 resamples of stays, seed 0).",
        "values": {"sv": 0.464, "density": 0.225, "recency": 0.409, "random": 0.333,
                   "diff sv-density": 0.239, "ci low": 0.194, "ci high": 0.284},
        "figure": {"kind": "bar", "title": "seed: held-out SpO₂ retention", "ylabel": "retention",
                   "categories": ["sv", "density", "recency", "random"],
                   "values": [0.464, 0.225, 0.409, 0.333]},
    },
    "deletion_audit": {
        "source": "seed 001 §4, Table 2",
        "text": "Decrement vs same-C refit, 4 regimes × 300 trials, ν = 0.4, σ = 2: 1,199/1,200 complete; "
        "median max |Δs| 2.4e-9 (Gaussian), 5.7e-7 (redundant), 1.6e-9 (MIMIC-IV), 4.5e-13 (learned keys); "
        "worst 1.1e-2; decay (γ = 0.01) median 2.2e-2 … 2.4e-1.",
        "values": {"completed": 1199, "attempted": 1200, "median gaussian": 2.4e-9, "median redundant": 5.7e-7,
                   "median mimic": 1.6e-9, "median learned": 4.5e-13, "worst": 1.1e-2,
                   "decay median low": 2.2e-2, "decay median high": 2.4e-1},
        "figure": {"kind": "bar", "title": "seed: median max |Δ gate score|", "ylabel": "|Δs| (log)", "log_y": True,
                   "categories": ["gaussian", "redundant", "mimic", "learned", "decay (lo)", "decay (hi)"],
                   "values": [2.4e-9, 5.7e-7, 1.6e-9, 4.5e-13, 2.2e-2, 2.4e-1]},
    },
    "synthetic_fidelity": {
        "source": "issue 11 (the demo's own figures are the reference)",
        "text": "Demo: event/other distance ratio 1.65, trivial-detector AUROC 0.874 (the seed's synthetic data is "
        "not published).",
        "values": {},
        "figure": None,
    },
    "ledger": {
        "source": "none (a product guarantee, not a seed study)",
        "text": "Neither seed keeps a deletion ledger: the receipt chain, forget registry and physical erasure are "
        "this project's additions (README, Deletion guarantees).",
        "values": {},
        "figure": None,
    },
    "deletion_latency": {
        "source": "seed 001 §4 (deletion cost)",
        "text": "n ∈ {120, 256, 384, 512}, 30 uniform deletions each, d = 6, ν = 0.4: median maintained-deletion "
        "latency 0.30–1.04 ms; refit/decrement time ratio 24–223× (reference CPU; hardware-specific).",
        "values": {"median ms (smallest n)": 0.30, "median ms (largest n)": 1.04,
                   "refit/decrement low": 24, "refit/decrement high": 223},
        "figure": None,
    },
    "patient_deletion": {
        "source": "seed 000 §6; seed 001 §4 (concrete records); SPEC §3",
        "text": "Several patients share a context (SPEC: 5 per context, ≤ 48 h each, ν = 0.5, σ = 2); forgetting one "
        "by the fixed-C decrement leaves zero readout weight on the forgotten patient, against 0.29 and 0.09 under "
        "coefficient decay (the paper does not state the two decay factors; SPEC reads them as γ = 0.1 / 0.01); "
        "KKT residual ~1e-12.",
        "values": {"deleted": 0.0, "decay (first)": 0.29, "decay (second)": 0.09},
        "figure": {"kind": "bar", "title": "seed: leakage (readout weight share)", "ylabel": "weight share",
                   "categories": ["deletion", "decay (first γ)", "decay (second γ)"], "values": [0.0, 0.29, 0.09]},
    },
    "deterioration": {
        "source": "seed 001 §5",
        "text": "Event within the next 6 h, per hour: AUROC SV-attention 0.696, LSTM 0.783, softmax 0.751.",
        "values": {"sv": 0.696, "lstm": 0.783, "softmax": 0.751},
        "figure": {"kind": "bar", "title": "seed: AUROC", "ylabel": "AUROC",
                   "categories": ["sv", "lstm", "softmax"], "values": [0.696, 0.783, 0.751]},
    },
    "planted_secret": {
        "source": "seed 000 §4 (planted secret)",
        "text": "14 ordinary tokens + 1 secret (d = 4, σ = 1.5, ν = 0.5, n₀ = 15), 30 trials: secret retrieved "
        "80 % before, 0 % after the exact decrement; coefficient decay γ = 0.5 / 0.1 / 0.01 still 80 / 40 / 7 %.",
        "values": {"before": 0.8, "after decrement": 0.0, "decay 0.5": 0.8, "decay 0.1": 0.4, "decay 0.01": 0.07},
        "figure": {"kind": "bar", "title": "seed: secret retrieved", "ylabel": "fraction of trials",
                   "categories": ["before", "decrement", "γ=0.5", "γ=0.1", "γ=0.01"],
                   "values": [0.8, 0.0, 0.8, 0.4, 0.07]},
    },
    "streaming_eviction": {
        "source": "seed 000 §5 (streaming bounded budget)",
        "text": "Streaming eviction through the causal layer, deciding before future queries are known: "
        "rare recall 0.93 (SV) vs 0.30 (streaming heavy-hitter eviction).",
        "values": {"sv": 0.93, "streaming h2o": 0.30},
        "figure": {"kind": "bar", "title": "seed: rare recall", "ylabel": "recall",
                   "categories": ["sv", "streaming h2o"], "values": [0.93, 0.30]},
    },
    "skewed_redundancy": {
        "source": "seed 001 §5 (skewed redundancy)",
        "text": "6 singleton + 6 ten-fold near-duplicate groups (n = 66), budget = support size (~56 %), 60 trials: "
        "rare-group recall SV 0.861, oracle H2O 0.319, random 0.472, recency 0.",
        "values": {"sv": 0.861, "oracle": 0.319, "random": 0.472, "recency": 0.0},
        "figure": {"kind": "bar", "title": "seed: rare-group recall", "ylabel": "recall",
                   "categories": ["sv", "oracle", "random", "recency"], "values": [0.861, 0.319, 0.472, 0.0]},
    },
    "selective_copying": {
        "source": "SPEC §3",
        "text": "8 informative tokens + F filler (F 8 → 120): SV recall@1 ≈ 0.99; support 11–14 tokens.",
        "values": {"sv recall@1": 0.99, "support low": 11, "support high": 14},
        "figure": None,
    },
    "capacity": {
        "source": "SPEC §3",
        "text": "Near-orthogonal keys, 20 filler, items 8 → 40: SV 0.95 at 40 items; DeltaNet 0.93 → 0.06.",
        "values": {"sv at 40": 0.95, "deltanet at 8": 0.93, "deltanet at 40": 0.06},
        "figure": None,
    },
    "mqar_control": {
        "source": "seed 001 §5 (negative control)",
        "text": "10-pair distinct-key recall: gated 0.955 vs ungated RBF 0.970; support fraction 1.0 (no selection).",
        "values": {"gated": 0.955, "ungated": 0.970, "support fraction": 1.0},
        "figure": {"kind": "bar", "title": "seed: recall@1", "ylabel": "recall@1",
                   "categories": ["gated", "ungated"], "values": [0.955, 0.970]},
    },
    "learned_keys": {
        "source": "seed 001 §4",
        "text": "Frozen keys of a trained MQAR model: forgotten fact → chance, other seven intact; remove–add "
        "edit residual ~0 vs 1.15 for decay.",
        "values": {"edit residual (decay)": 1.15},
        "figure": None,
    },
    "retrieval_memory": {
        "source": "SPEC §3",
        "text": "MiniLM sentence embeddings as keys: 7/7 answered; deleted fact → 'no record'.",
        "values": {"answered": 7, "asked": 7},
        "figure": None,
    },
    "language_model": {
        "source": "seed 001 §6; SPEC §3",
        "text": "Byte-level 3.22M-parameter LM, 7 seeds: SV hybrid 2.178 vs sliding-window softmax 2.383 BPC "
        "(enwik8), paired t-test p = 0.001.",
        "values": {"sv hybrid": 2.178, "sliding window": 2.383, "p": 0.001},
        "figure": {"kind": "bar", "title": "seed: bits per character", "ylabel": "BPC",
                   "categories": ["sv hybrid", "sliding window"], "values": [2.178, 2.383]},
    },
    "throughput": {
        "source": "seed 001 §6.2",
        "text": "3.22M config, forward+loss+backward, batch 16: hybrid 9,125 tok/s (Apple M3 Ultra, mixed "
        "MLX/PyTorch); 6.1× slower than CPU softmax, 35.8× slower than MPS softmax.",
        "values": {"hybrid tok/s": 9125, "slowdown vs cpu softmax": 6.1, "slowdown vs mps softmax": 35.8},
        "figure": None,
    },
}

#: The papers' claims, one headline row each (dashboards.headline): the study that tests it, the claim
#: in a few words, the paper's figure, and what runs it when no result is there.
SEED_CLAIMS: list[dict[str, str]] = [
    {"study": "deletion_audit", "claim": "exact deletion equals a same-C refit (deletion audit)",
     "paper": "1,199/1,200 complete; median max |Δs| 4.5e-13…5.7e-7; worst 1.1e-2", "not_run": "forgetful audit"},
    {"study": "icu_retention", "claim": "ICU event hours kept at budget |S∪E|",
     "paper": "SV 0.80 vs density 0.05", "not_run": "forgetful retention"},
    {"study": "heldout_spo2", "claim": "held-out SpO₂ control (SpO₂ hidden from every selector)",
     "paper": "SV 0.464 vs density 0.225: diff 0.239 [0.194, 0.284]", "not_run": "forgetful heldout-spo2"},
    {"study": "patient_deletion", "claim": "patient deletion: zero leakage, refit-equal",
     "paper": "leakage 0 vs decay 0.29 / 0.09; KKT ~1e-12", "not_run": "forgetful patient-deletion"},
    {"study": "skewed_redundancy", "claim": "rare groups kept under skewed redundancy",
     "paper": "rare recall SV 0.861 vs oracle H2O 0.319", "not_run": "forgetful skewed-redundancy"},
    {"study": "streaming_eviction", "claim": "streaming eviction keeps rare items",
     "paper": "SV 0.93 vs streaming H2O 0.30", "not_run": "forgetful streaming-eviction"},
    {"study": "deterioration", "claim": "deterioration in the next 6 h: SV competitive, LSTM best",
     "paper": "AUROC SV 0.696, LSTM 0.783, softmax 0.751", "not_run": "forgetful deterioration"},
    {"study": "language_model", "claim": "byte-level LM: SV hybrid beats a matched-state sliding window",
     "paper": "2.178 vs 2.383 bits/char, 7 seeds, p = 0.001 (enwik8)",
     "not_run": "forgetful lm --protocol paper (hours; docs/results/studies/)"},
    {"study": "learned_keys", "claim": "learned keys: forget a fact, edit exactly, keep the rare fact",
     "paper": "forgotten → chance; edit residual ~0 vs 1.15 decay; rare fact kept 100 % vs H2O 21 %",
     "not_run": "forgetful learned-keys"},
    {"study": "retrieval_memory", "claim": "forgettable retrieval memory (MiniLM keys)",
     "paper": "7/7 answered; deleted fact → no record", "not_run": "forgetful retrieval-memory"},
]

#: Seed 001 Table 1 — operation, certified statement, reference & numerical path, explicit boundary.
CONTRACT_CARD: list[dict[str, str]] = [
    {
        "operation": "reserve removal",
        "statement": "the solved readout is unchanged when an algebraic zero-weight key is removed without re-solving",
        "reference": "current fixed-C state; algebraic argument with logged fp64 residual",
        "boundary": "no equivalence claim after arbitrary future admissions",
    },
    {
        "operation": "active deletion",
        "statement": "a completed algebraic decrement reaches the retained-key coefficient optimum under uniqueness",
        "reference": "fresh retained-key refit at the same C; maintained fp64 path",
        "boundary": "not a changed-C refit, re-encoding retained keys, or deletion from model weights",
    },
    {
        "operation": "streaming pruning",
        "statement": "each reserve removal has a point-in-time certificate",
        "reference": "empirical bounded-memory trajectory after subsequent admissions",
        "boundary": "not certified equal to a never-pruned full-history trajectory",
    },
    {
        "operation": "batched training",
        "statement": "autograd differentiates the ridged packed KKT system conditional on estimated coefficient groups",
        "reference": "fp32 FISTA groups plus 1e-3-ridged solve",
        "boundary": "no decrement or stored-inverse guarantee; frozen keys require fp64 re-solving",
    },
]


def seed_figure_for(study: str) -> dict[str, Any]:
    """A deep copy of the seed figure for ``study`` (``{}`` for studies without one)."""
    return copy.deepcopy(SEED_FIGURES.get(study, {}))


def seed_field(study: str) -> dict[str, str]:
    """The ``seed_figure`` field a flow writes into its result file: the seed's text and where it
    is from (``{}`` for a study without one)."""
    fig = SEED_FIGURES.get(study)
    return {"text": fig["text"], "source": fig["source"]} if fig else {}


#: the data each study's seed figure was measured on: "real" (MIMIC-IV records), "mixed" (the deletion
#: audit: three synthetic or learned-key regimes and one MIMIC-IV regime); every other study's seed
#: figure is from synthetic data (or, for the language model, a text corpus) and so is comparable with
#: a run of the same kind
SEED_DATA: dict[str, str] = {"cohort": "real", "icu_retention": "real", "heldout_spo2": "real",
                             "patient_deletion": "real", "deterioration": "real", "deletion_audit": "mixed"}
#: result ``data`` kinds that are real patient records
REAL_SOURCES = ("demo", "mimic", "clif")


def seed_comparability(study: str, data: str) -> dict[str, Any]:
    """Whether a run of ``study`` on ``data`` may stand beside the seed's figure — the one place this
    is decided (flows, the CLI lines, the report and the generated docs all ask here).

    Returns ``{"comparable": bool, "reason": str | None, "partial": str | None}``: ``reason`` says why
    a figure is not comparable (a real-data seed figure beside a run on synthetic data); ``partial``
    names the part of a mixed seed figure that is not comparable (the audit's MIMIC-IV row).
    Synthetic studies whose seed figures are also synthetic are always comparable.
    """
    kind = SEED_DATA.get(study, "synthetic")
    real_run = data in REAL_SOURCES
    if kind == "real" and not real_run:
        return {"comparable": False, "partial": None,
                "reason": f"this run used {data} data; the seed figure is from real MIMIC-IV records"}
    if kind == "mixed" and not real_run:
        return {"comparable": True, "reason": None,
                "partial": f"the seed's MIMIC-IV row is from real records; this run's ICU regime used {data} data, "
                           "so that row is not comparable (the other regimes are)"}
    return {"comparable": True, "reason": None, "partial": None}


def seed_line(study: str, data: str, text: str | None = None) -> str:
    """The CLI's closing line: ``seed figure: …`` (``text``, by default the study's seed text)
    where comparable, else why it is not shown."""
    if text is None:
        text = seed_field(study).get("text", "")
    c = seed_comparability(study, data)
    if not c["comparable"]:
        return f"seed figure not shown, not comparable: {c['reason']}"
    return f"seed figure: {text}" + (f" ({c['partial']})" if c["partial"] else "")
