"""Readout-level recall tasks: selective copying, capacity, distinct-key MQAR control.

Each context is a set of (key, value) tokens followed by queries; every mechanism reads the same
context with its own rule (:func:`read_all`) and answers the argmax of its readout over one-hot
classes. The result tables compare only the gate (``sv``) with its gate-off ablation (``rbf``), the
same training-free readout (:data:`ABLATION`); ``references=("softmax", "deltanet")`` adds
training-free readouts as a separately labelled table, never beside a seed figure.

Tasks: ``selective_copying`` (8 informative keys + F near-duplicate filler tokens, F swept 8 → 120;
:func:`selective_copying_context`), ``capacity`` (N near-orthogonal items in d = 16 + 20 filler
tokens, N swept 8 → 40; :func:`capacity_context`), ``mqar_control`` (10 distinct key-value pairs:
gated vs ungated vs softmax and the support fraction; :func:`mqar_context`).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from evaluation.claims import ci, claim, interval, peer_fig
from evaluation.studies.common import check_int, check_pos, envelope, mean_ci, paired_vs_sv
from evaluation.studies.errors import StudyConfigError
from evaluation.studies.readout import kernel_readout
from models.attn_deltanet import deltanet_chunked
from models.attn_linear import linear_attention
from models.multihead import masked_softmax_attention
from sv_core import Gate, calibrate_C

MECHANISMS = ("sv", "rbf", "softmax", "linear", "deltanet")


# --------------------------------------------------------------------------------------------
# readouts
# --------------------------------------------------------------------------------------------
def _last_position(fn, X: np.ndarray, V: np.ndarray, Q: np.ndarray, **kw) -> np.ndarray:
    """Run a causal (B, H, T, d) attention function with the context as keys/values and each
    query in the last position's query slot; return the last-position outputs (m, d_v)."""
    m, n = Q.shape[0], X.shape[0]
    k = torch.as_tensor(X, dtype=torch.float64).expand(m, 1, n, X.shape[1]).contiguous()
    v = torch.as_tensor(V, dtype=torch.float64).expand(m, 1, n, V.shape[1]).contiguous()
    q = torch.as_tensor(Q, dtype=torch.float64)[:, None, None, :].expand(m, 1, n, Q.shape[1]).contiguous()
    with torch.no_grad():
        out = fn(q, k, v, **kw)
    return out[:, 0, -1].numpy()


def softmax_readout(X, V, Q) -> np.ndarray:
    n = X.shape[0]
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))
    return _last_position(lambda q, k, v: masked_softmax_attention(q, k, v, allowed), X, V, Q)


def linear_readout(X, V, Q) -> np.ndarray:
    return _last_position(linear_attention, X, V, Q)


def deltanet_readout(X, V, Q, beta: float = 1.0) -> np.ndarray:
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
    Qn = Q / np.linalg.norm(Q, axis=1, keepdims=True)
    b = torch.full((Q.shape[0], 1, X.shape[0]), float(beta), dtype=torch.float64)
    return _last_position(lambda q, k, v: deltanet_chunked(q, k, v, b, chunk=64), Xn, V, Qn)


def sv_readout(X, V, Q, C: float, sigma: float) -> tuple[np.ndarray, int]:
    """Gated readout and the support size ``|S ∪ E|`` (exact maintained gate)."""
    g = Gate(C=C, sigma=sigma)
    g.admit(X)
    if not g.gated:
        raise StudyConfigError(f"context of {X.shape[0]} keys is below the warm-up size {g.warmup_size}")
    return g.readout(Q, V), int(np.count_nonzero(g.alpha > 0))


def read_all(X, V, Q, *, C: float, sigma: float, mechanisms=MECHANISMS) -> tuple[dict, int | None]:
    """Readouts ``{mechanism: (m, d_v)}`` and the SV support size.

    * ``sv``      gated RBF readout ``Σ α κ(q,x) v / Σ α κ(q,x)``; α from the exact maintained fp64
                  gate (:class:`sv_core.Gate`) with ``C = 1/(ν n₀)`` calibrated **once** at the
                  declared size ``n₀`` of the smallest context of the sweep and held fixed;
    * ``rbf``     the same readout ungated (α uniform): the gate-off ablation;
    * ``softmax`` ``softmax(q·k/√d)`` over the context (:func:`models.multihead.masked_softmax_attention`);
    * ``linear``  causal linear attention, feature map ``elu+1`` (:func:`models.attn_linear.linear_attention`);
    * ``deltanet`` the delta rule with L2-normalised keys/queries and ``β = 1``
                  (:func:`models.attn_deltanet.deltanet_chunked`): a matched fixed state of ``d_v × d``.

    The recurrences read the context causally: their readout is the output at the last context
    position with the query placed in that position's query slot (state after the whole context).
    """
    out, support = {}, None
    for mech in mechanisms:
        if mech == "sv":
            out[mech], support = sv_readout(X, V, Q, C, sigma)
        elif mech == "rbf":
            out[mech] = kernel_readout(Q, X, np.ones(X.shape[0]), V, sigma)
        elif mech == "softmax":
            out[mech] = softmax_readout(X, V, Q)
        elif mech == "linear":
            out[mech] = linear_readout(X, V, Q)
        elif mech == "deltanet":
            out[mech] = deltanet_readout(X, V, Q)
        else:
            raise StudyConfigError(f"unknown mechanism {mech!r}; choose from {MECHANISMS}")
    return out, support


def recall_at_1(readout: np.ndarray, labels: np.ndarray) -> float:
    """Share of queries whose readout argmax is the true class."""
    return float(np.mean(np.argmax(readout, axis=1) == labels))


# --------------------------------------------------------------------------------------------
# contexts
# --------------------------------------------------------------------------------------------
def selective_copying_context(rng, n_info: int, n_filler: int, d: int = 8, filler_jitter: float = 0.05,
                              query_noise: float = 0.1):
    """Keys (n, d), one-hot values (n, n_info + 1), queries (n_info, d), labels (n_info,)."""
    info = rng.standard_normal((n_info, d))
    f = rng.standard_normal(d)
    filler = f + filler_jitter * rng.standard_normal((n_filler, d))
    X = np.vstack([info, filler])
    y = np.concatenate([np.arange(n_info), np.full(n_filler, n_info)])
    perm = rng.permutation(X.shape[0])
    X, y = X[perm], y[perm]
    Q = info + query_noise * rng.standard_normal(info.shape)
    return X, np.eye(n_info + 1)[y], Q, np.arange(n_info)


def capacity_context(rng, n_items: int, n_filler: int = 20, d: int = 16, key_norm: float = 2.0,
                     filler_jitter: float = 0.05, query_noise: float = 0.05):
    """Near-orthogonal items (random directions, norm ``key_norm``) + near-duplicate filler."""
    D = rng.standard_normal((n_items, d))
    items = key_norm * D / np.linalg.norm(D, axis=1, keepdims=True)
    fd = rng.standard_normal(d)
    f = key_norm * fd / np.linalg.norm(fd)
    filler = f + filler_jitter * rng.standard_normal((n_filler, d))
    X = np.vstack([items, filler])
    y = np.concatenate([np.arange(n_items), np.full(n_filler, n_items)])
    perm = rng.permutation(X.shape[0])
    Q = items + query_noise * rng.standard_normal(items.shape)
    return X[perm], np.eye(n_items + 1)[y[perm]], Q, np.arange(n_items)


def mqar_context(rng, n_pairs: int = 10, d: int = 8, query_noise: float = 0.5):
    """Distinct random keys N(0, I_d), one class each; queries = keys + noise."""
    X = rng.standard_normal((n_pairs, d))
    Q = X + query_noise * rng.standard_normal(X.shape)
    return X, np.eye(n_pairs), Q, np.arange(n_pairs)


# --------------------------------------------------------------------------------------------
# studies
# --------------------------------------------------------------------------------------------
#: What the study tables compare: the gate and its gate-off ablation (same RBF readout).
ABLATION = ("sv", "rbf")
#: Training-free readouts that may be added as a separately labelled reference table. ``linear``
#: is refused: its ``elu+1`` weights are all positive, so on one-hot values the readout is a convex
#: average whose argmax is the majority (filler/"blank") class — 0.0 recall by construction.
REFERENCE_MECHANISMS = ("softmax", "deltanet")
REFERENCE_NOTE = ("training-free readouts of the SAME fixed random embeddings (no trained sequence model): not "
                  "comparable with the seed's trained baselines")


def _check_references(refs) -> tuple[str, ...]:
    """The training-free reference mechanisms asked for (typed error otherwise).

    The softmax / linear / DeltaNet readouts here are *training-free* on fixed random embeddings while
    the seed trained its sequence models, and linear attention is 0.0 by construction (positive
    ``elu+1`` weights average one-hot values, so the majority filler class wins); so they are never in
    the main table and ``linear`` is refused.
    """
    refs = tuple(refs or ())
    bad = [r for r in refs if r not in REFERENCE_MECHANISMS]
    if bad:
        raise StudyConfigError(f"training-free references must come from {REFERENCE_MECHANISMS}; got {bad}"
                               + (" (linear attention is degenerate here: 0.0 by construction)" if "linear" in bad
                                  else ""))
    return refs


def _sweep(name, values, make, trials, seed, C, sigma, mechanisms, progress):
    from tqdm.auto import tqdm

    res = {}
    for i, val in enumerate(tqdm(values, desc=name, disable=not progress, leave=False)):
        rec = {m: [] for m in mechanisms}
        sup = []
        for t in range(trials):
            rng = np.random.default_rng([seed, i, t])
            X, V, Q, lab = make(rng, val)
            outs, s = read_all(X, V, Q, C=C, sigma=sigma, mechanisms=mechanisms)
            for m in mechanisms:
                rec[m].append(recall_at_1(outs[m], lab))
            sup.append(s)
        gap = paired_vs_sv({"sv": rec["sv"], "rbf": rec["rbf"]}, metric="recall@1", seed=seed)["diffs"]["rbf"]
        res[val] = {"recall": {m: mean_ci(rec[m]) for m in mechanisms}, "gated_minus_ungated": gap,
                    "support_mean": float(np.mean(sup)), "support_min": int(min(sup)), "support_max": int(max(sup)),
                    "n_tokens": int(X.shape[0])}
    return res


def _sweep_result(study, title, xname, res, config, notes, seed_col=None, rt=0.0, claims=None, references=(),
                  seed_figure=None):
    """Tables and figures compare the gate with its gate-off ablation only; training-free references
    (if any) go to a separate, labelled table and ``metrics[x]["training_free_reference"]``."""
    xs = list(res)
    mechanisms = ABLATION
    rows = []
    for x in xs:
        r = res[x]
        rows.append([x, r["n_tokens"]] + [r["recall"][m]["mean"] for m in mechanisms]
                    + [r["recall"]["sv"]["mean"] - r["recall"]["rbf"]["mean"]]
                    + [r["support_mean"], f"{r['support_min']}–{r['support_max']}"]
                    + ([seed_col(x)] if seed_col else []))
    columns = ([xname, "tokens", "SV (gated) recall@1", "ungated RBF recall@1", "gated − ungated", "SV support mean",
                "SV support range"] + (["seed (SV)"] if seed_col else []))
    metrics = {str(x): {"recall": {m: res[x]["recall"][m]["mean"] for m in mechanisms},
                        "recall_ci": {m: [res[x]["recall"][m]["low"], res[x]["recall"][m]["high"]] for m in mechanisms},
                        "support_mean": res[x]["support_mean"], "support_min": res[x]["support_min"],
                        "support_max": res[x]["support_max"], "n_tokens": res[x]["n_tokens"],
                        "gated_minus_ungated": res[x]["gated_minus_ungated"]} for x in xs}
    tables = [{"title": f"{title}: SV gate vs its gate-off ablation (same RBF readout)", "columns": columns,
               "rows": rows}]
    if references:
        for x in xs:
            metrics[str(x)]["training_free_reference"] = {m: res[x]["recall"][m]["mean"] for m in references}
        tables.append({"title": f"reference only — {REFERENCE_NOTE}",
                       "columns": [xname] + [f"{m} (training-free) recall@1" for m in references],
                       "rows": [[x] + [res[x]["recall"][m]["mean"] for m in references] for x in xs]})
    figures = [
        {"kind": "line", "title": "recall@1: SV gate vs gate-off ablation", "xlabel": xname, "ylabel": "recall@1",
         "series": [{"label": {"sv": "SV (gated)", "rbf": "ungated RBF"}[m], "x": [float(x) for x in xs],
                     "y": [res[x]["recall"][m]["mean"] for x in xs], "style": "both"} for m in mechanisms]},
        {"kind": "line", "title": "SV support size |S ∪ E|", "xlabel": xname, "ylabel": "tokens",
         "series": [{"label": "support", "x": [float(x) for x in xs], "y": [res[x]["support_mean"] for x in xs],
                     "style": "both"},
                    {"label": "context", "x": [float(x) for x in xs], "y": [float(res[x]["n_tokens"]) for x in xs],
                     "style": "line"}]},
    ]
    config = {**config, "compared": "SV gate vs ungated RBF readout (gate-off ablation)",
              "training_free_references": list(references),
              "cross_model_rows": "dropped: the sequence baselines here would be training-free readouts, while the "
                                  "seed trained its sequence models; linear attention is 0.0 by construction"}
    out = envelope(study, title, runtime_s=rt, metrics=metrics, config=config, notes=notes, figures=figures,
                   claims=claims or [], tables=tables)
    if seed_figure:
        out["seed_figure"] = seed_figure
    return out


def run_selective_copying(trials: int = 100, seed: int = 0, *, fillers=(8, 16, 32, 64, 120), n_info: int = 8,
                          d: int = 8, nu: float = 0.5, sigma: float = 2.0, filler_jitter: float = 0.05,
                          query_noise: float = 0.1, references=(), progress: bool = False) -> dict:
    trials = check_int("trials", trials, 1)
    fillers = [check_int("filler", f, 1) for f in fillers]
    refs = _check_references(references)
    n0 = n_info + min(fillers)
    C = calibrate_C(check_pos("nu", nu, 1.0), n0)
    t0 = time.perf_counter()
    res = _sweep("selective copying", fillers,
                 lambda rng, F: selective_copying_context(rng, n_info, F, d, filler_jitter, query_noise),
                 trials, seed, C, sigma, ABLATION + refs, progress)
    rt = time.perf_counter() - t0
    sv = [res[F]["recall"]["sv"]["mean"] for F in fillers]
    gain = [res[F]["recall"]["sv"]["mean"] - res[F]["recall"]["rbf"]["mean"] for F in fillers]
    how = f"95 % normal interval over {trials} trials"
    lows = {F: res[F]["recall"]["sv"]["low"] for F in fillers}
    wF = min(fillers, key=lambda F: (lows[F], F))
    top = fillers[-1]
    gap = res[top]["gated_minus_ungated"]
    claims = [
        claim("the SV support stays small while the filler grows, and SV recall stays high",
              reference="exact fixed-C gate, C calibrated once at the smallest context",
              path="maintained fp64 C&P solve", operation="reserve removal",
              rule="SV recall@1 95 % interval at or above 0.9 at every filler length, support below the context",
              passed=bool(lows[wF] >= 0.9 and all(res[F]["support_max"] < res[F]["n_tokens"] for F in fillers)),
              run=ci(res[wF]["recall"]["sv"], how=f"SV recall@1 at F = {wF} (the lowest interval), {how}"),
              paper={"figure": "SV recall@1 ~0.99 for F 8 → 120; support 11–14 tokens", "source": "SPEC §3 (seed 000)"},
              value={"support_range": [min(res[F]["support_min"] for F in fillers),
                                       max(res[F]["support_max"] for F in fillers)], "sv_recall_min": min(sv)}),
        claim("the gate is load-bearing: gated recall exceeds the ungated readout at the largest filler",
              reference="same RBF readout with uniform α (gate off)", path="maintained fp64 C&P solve",
              rule=f"95 % paired bootstrap interval of gated − ungated recall@1 at F = {top} above 0",
              passed=gap["low"] is not None and gap["low"] > 0,
              run=ci(res[top]["recall"]["sv"], how=f"SV recall@1 at F = {top}, {how}"),
              peer=peer_fig("ungated RBF (gate off)", res[top]["recall"]["rbf"]),
              difference=ci(gap, how=f"95 % paired bootstrap over {trials} trials"),
              value={"gated_minus_ungated_at_max_F": gain[-1]})]
    return _sweep_result(
        "selective_copying", "Selective copying: 8 informative tokens + F filler", "F", res,
        {"trials": trials, "seed": seed, "seeds": f"numpy default_rng([{seed}, F index, trial])", "n_info": n_info,
         "d": d, "nu": nu, "n0": n0, "C": C, "sigma": sigma, "filler_jitter": filler_jitter,
         "query_noise": query_noise, **({"deltanet_beta": 1.0} if "deltanet" in refs else {})},
        "Seed: SV recall@1 ~0.99 for F 8 → 120 with support 11–14 tokens. Compared here: the gate vs its gate-off "
        "ablation (uniform α, same RBF readout); the seed's trained softmax/recurrent baselines are not reproduced "
        "(cross-model rows dropped).",
        seed_col=lambda F: "SV ~0.99, support 11–14", rt=rt, claims=claims, references=refs)


def run_capacity(trials: int = 100, seed: int = 0, *, items=(8, 16, 24, 32, 40), n_filler: int = 20, d: int = 16,
                 nu: float = 0.5, sigma: float = 2.0, key_norm: float = 3.0, query_noise: float = 0.05,
                 references=(), progress: bool = False) -> dict:
    trials = check_int("trials", trials, 1)
    items = [check_int("items", n, 1) for n in items]
    refs = _check_references(references)
    n0 = min(items) + n_filler
    C = calibrate_C(check_pos("nu", nu, 1.0), n0)
    t0 = time.perf_counter()
    res = _sweep("capacity", items,
                 lambda rng, N: capacity_context(rng, N, n_filler, d, key_norm, 0.05, query_noise),
                 trials, seed, C, sigma, ABLATION + refs, progress)
    rt = time.perf_counter() - t0
    seed_vals = {8: "SV ~1.0", 24: "SV ~1.0", 40: "SV 0.95, support 37"}
    top = items[-1]
    sv_top = res[top]["recall"]["sv"]
    claims = [
        claim(f"SV recall stays high as distinct items grow to {top} with 20 filler (support grows adaptively, below "
              "the context)",
              reference="exact fixed-C gate, C calibrated once at the smallest context",
              path="maintained fp64 C&P solve", operation="reserve removal",
              rule=f"SV recall@1 95 % interval at {top} items at or above 0.9, mean support below the context",
              passed=bool(sv_top["low"] >= 0.9 and res[top]["support_mean"] < res[top]["n_tokens"]),
              run=ci(sv_top, how=f"SV recall@1 at {top} items, 95 % normal interval over {trials} trials"),
              paper={"figure": "SV 0.95 at 40 items, support 9 → 37", "source": "seed 000 §5; SPEC §3"},
              value={"sv_recall_at_max": sv_top["mean"], "support_mean_at_max": res[top]["support_mean"],
                     "tokens_at_max": res[top]["n_tokens"]}),
        claim("an adaptive support set keeps recall where a matched-state DeltaNet recurrence collapses",
              reference="a trained matched-state DeltaNet", path="maintained fp64 C&P solve vs a trained recurrence",
              rule="SV − DeltaNet recall@1 interval at 40 items above 0", passed=None,
              run=ci(sv_top, how=f"SV recall@1 at {top} items, 95 % normal interval over {trials} trials"),
              paper={"figure": "SV 0.95 vs DeltaNet 0.93 → 0.06 (8 → 40 items)", "source": "seed 000 §5"},
              off_protocol="not run at the paper's protocol: the paper's DeltaNet is a trained sequence model; this "
                           "study trains none (only the gate and its gate-off ablation are compared)")]
    return _sweep_result(
        "capacity", "Capacity: near-orthogonal items + 20 filler", "items", res,
        {"trials": trials, "seed": seed, "seeds": f"numpy default_rng([{seed}, N index, trial])", "n_filler": n_filler,
         "d": d, "nu": nu, "n0": n0, "C": C, "sigma": sigma, "key_norm": key_norm, "query_noise": query_noise,
         **({"deltanet_state": f"d_v x {d}", "deltanet_beta": 1.0} if "deltanet" in refs else {})},
        "Seed: SV ~1.0 through 24 items and 0.95 at 40 with support 9 → 37. The seed's matched-state DeltaNet "
        "comparison (0.93 → 0.06) needs a trained DeltaNet and is not reproduced here (cross-model rows dropped); "
        "the table compares the gate with its gate-off ablation.",
        seed_col=lambda N: seed_vals.get(N), rt=rt, claims=claims, references=refs,
        seed_figure={"text": "Near-orthogonal keys, 20 filler, items 8 → 40: SV ~1.0 through 24 items, 0.95 at 40, "
                             "support 9 → 37 (the seed's DeltaNet 0.93 → 0.06 row is a trained-model comparison, "
                             "not reproduced here).",
                     "values": {"sv at 40": 0.95, "support at 40": 37}})


def run_mqar_control(trials: int = 200, seed: int = 0, *, n_pairs: int = 10, d: int = 8, nu: float = 0.5,
                     sigma: float = 1.5, query_noise: float = 0.5, references=(), progress: bool = False) -> dict:
    trials = check_int("trials", trials, 1)
    refs = _check_references(references)
    C = calibrate_C(check_pos("nu", nu, 1.0), n_pairs)
    t0 = time.perf_counter()
    res = _sweep("mqar control", [n_pairs], lambda rng, n: mqar_context(rng, n, d, query_noise), trials, seed, C,
                 sigma, ABLATION + refs, progress)
    rt = time.perf_counter() - t0
    r = res[n_pairs]
    frac = r["support_mean"] / n_pairs
    out = _sweep_result(
        "mqar_control", "Distinct-key recall control (10-pair MQAR)", "pairs", res,
        {"trials": trials, "seed": seed, "seeds": f"numpy default_rng([{seed}, 0, trial])", "n_pairs": n_pairs, "d": d,
         "nu": nu, "n0": n_pairs, "C": C, "sigma": sigma, "query_noise": query_noise},
        "Seed 001 §5: gated 0.955 vs ungated RBF 0.970; support fraction 1.00 (the gate selects nothing on distinct "
        "keys, so the gain is the RBF readout, not the gate).", seed_col=lambda n: "gated 0.955, ungated 0.970",
        rt=rt, references=refs,
        claims=[claim("on distinct keys every key is active: the gate performs no selection",
                      reference="exact fixed-C gate on the 10 keys", path="maintained fp64 C&P solve",
                      rule="support fraction 1.0 in every trial (a count over every trial, not an estimate)",
                      passed=bool(r["support_min"] == n_pairs),
                      run=interval(frac, r["support_min"] / n_pairs, r["support_max"] / n_pairs,
                                   how=f"mean; range over {trials} trials", n=trials),
                      paper={"figure": "support fraction 1.0; gated 0.955 vs ungated RBF 0.970",
                             "source": "seed 001 §5"},
                      peer=peer_fig("ungated RBF recall@1", r["recall"]["rbf"]), value=frac)])
    out["metrics"]["support_fraction"] = frac
    out["metrics"]["support_fraction_min"] = r["support_min"] / n_pairs
    return out
