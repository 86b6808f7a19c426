"""Surgical forgetting and exact editing on the frozen keys of a trained recall model (seed 000 §6).

Model (torch, CPU, a few seconds): a one-layer multi-query associative-recall (MQAR) reader.
A context holds ``P`` facts ``(name_i, city_i)``; each fact is one token with key
``k_i = W_k e(name_i)`` (d_k = 8) and value ``u_i = W_v e'(city_i)``; a question about ``name``
has query ``q = W_q e(name)``; the answer is ``head(Σ_i κ(q, k_i) u_i / Σ_i κ(q, k_i))`` over the
city vocabulary — the uniform-RBF readout of the project's kernel, trained end to end with
cross-entropy until recall@1 ≈ 1.

Frozen evaluation (fp64): the learned keys of a fresh context are admitted to the exact
maintained gate (:class:`sv_core.Gate`, ``C = 1/(ν n₀)``, n₀ = P) and answered with the gated
readout. Then

* **forget** one fact by the C&P decrement: its question's recall@1 vs chance (1 / #cities),
  the other facts' recall@1, and the forgotten token's readout weight (exactly 0);
* **edit** one fact (``name → new city``) by exact forget + admit of the new binding, against a
  fresh same-C refit of the edited context (the "never saw the old binding" reference), and against
  *decay editing* (write the new binding with the old binding's α, keep the old one with its α
  scaled by γ, no re-solve; admitting an exact duplicate key by C&P instead would split the mass
  between two identical keys arbitrarily, since that optimum is not unique).
  Residual = ‖logits(q) − logits_ref(q)‖₂ at the edited question; the old binding's weight share
  is reported beside it.

* **select** at a matched budget ``k = |S∪E|`` (the gate's support size on the frozen keys): SV
  (top-k α), H2O-style density, recency, random and the query-free peers of
  :mod:`evaluation.peers` (ridge leverage, kernel leverage with the model's σ, KeyDiff) each keep
  ``k`` keys; recall@1 of all ``P`` questions under the uniform-RBF readout over the kept keys.
  ``metrics["selection"]["vs_sv"]``: paired SV − policy recall, bootstrap over trials. With
  distinct facts the gate usually keeps every key (``k = P``); then every policy keeps the same
  set and the differences are exactly 0 — the fraction of trials with ``k < P`` is reported.

:func:`learned_key_sampler` turns the trained model into an audit regime (``fn(rng) -> keys``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from evaluation.studies.common import check_int, check_pos, envelope, mean_ci, paired_vs_sv, vs_sv_table
from evaluation.studies.readout import kernel_readout, kernel_weights
from sv_core import Gate, calibrate_C, refit

STUDY = "learned_keys"
SELECTION_POLICIES = ("sv", "density", "recency", "random", "leverage", "kernel_leverage", "keydiff")


class RecallModel(nn.Module):
    """One-layer MQAR reader with learned key/query/value projections and an RBF readout.

    Parameters
    ----------
    n_names, n_cities : vocabulary sizes; d_emb : embedding width; d_k : key width;
    d_v : value width; sigma : RBF bandwidth of the readout.
    """

    def __init__(self, n_names: int = 24, n_cities: int = 24, d_emb: int = 32, d_k: int = 8, d_v: int = 32,
                 sigma: float = 1.0):
        super().__init__()
        self.name_emb = nn.Embedding(n_names, d_emb)
        self.city_emb = nn.Embedding(n_cities, d_emb)
        self.Wk = nn.Linear(d_emb, d_k)
        self.Wq = nn.Linear(d_emb, d_k)
        self.Wv = nn.Linear(d_emb, d_v)
        self.head = nn.Linear(d_v, n_cities)
        self.sigma = float(sigma)
        self.n_names, self.n_cities = n_names, n_cities

    def keys(self, names: torch.Tensor) -> torch.Tensor:
        """(..., P) name ids -> (..., P, d_k) learned keys."""
        return self.Wk(self.name_emb(names))

    def queries(self, names: torch.Tensor) -> torch.Tensor:
        return self.Wq(self.name_emb(names))

    def values(self, cities: torch.Tensor) -> torch.Tensor:
        return self.Wv(self.city_emb(cities))

    def forward(self, names: torch.Tensor, cities: torch.Tensor, q_names: torch.Tensor) -> torch.Tensor:
        """names, cities (B, P); q_names (B, M) -> logits (B, M, n_cities)."""
        from sv_core import torch_kernel

        K, U, Q = self.keys(names), self.values(cities), self.queries(q_names)
        W = torch_kernel(Q, K, self.sigma)
        W = W / W.sum(-1, keepdim=True).clamp_min(1e-30)
        return self.head(W @ U)


def sample_facts(rng: np.random.Generator, n_names: int, n_cities: int, P: int, batch: int):
    """Distinct names and distinct cities per context: (batch, P) each."""
    names = np.stack([rng.choice(n_names, P, replace=False) for _ in range(batch)])
    cities = np.stack([rng.choice(n_cities, P, replace=False) for _ in range(batch)])
    return names, cities


@dataclass
class TrainReport:
    steps: int
    final_loss: float
    recall_at_1: float
    seconds: float


def train_model(seed: int = 0, *, P: int = 8, steps: int = 1500, batch: int = 64, lr: float = 3e-3,
                progress: bool = False, **model_kw) -> tuple[RecallModel, TrainReport]:
    """Train :class:`RecallModel` on random MQAR contexts (CPU, fixed seed)."""
    from tqdm.auto import trange

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = RecallModel(**model_kw).double()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    t0 = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for _ in trange(steps, desc="train MQAR", disable=not progress, leave=False):
        names, cities = sample_facts(rng, model.n_names, model.n_cities, P, batch)
        n_t, c_t = torch.as_tensor(names), torch.as_tensor(cities)
        order = torch.as_tensor(np.stack([rng.permutation(P) for _ in range(batch)]))
        logits = model(n_t, c_t, torch.gather(n_t, 1, order))
        loss = nn.functional.cross_entropy(logits.reshape(-1, model.n_cities), torch.gather(c_t, 1, order).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        names, cities = sample_facts(np.random.default_rng([seed, 1]), model.n_names, model.n_cities, P, 512)
        n_t, c_t = torch.as_tensor(names), torch.as_tensor(cities)
        acc = float((model(n_t, c_t, n_t).argmax(-1) == c_t).double().mean())
    return model, TrainReport(steps, float(loss.detach()), acc, time.perf_counter() - t0)


def frozen(model: RecallModel, names: np.ndarray, cities: np.ndarray, q_names: np.ndarray):
    """fp64 numpy keys (P, d_k), values (P, d_v), queries (M, d_k) of one context."""
    with torch.no_grad():
        return (model.keys(torch.as_tensor(names)).double().numpy(),
                model.values(torch.as_tensor(cities)).double().numpy(),
                model.queries(torch.as_tensor(q_names)).double().numpy())


def logits_of(model: RecallModel, readout: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.head(torch.as_tensor(readout, dtype=torch.float64)).numpy()


def learned_key_sampler(model: RecallModel, n_facts: int = 16):
    """Audit regime from a trained model: ``fn(rng) -> (n_facts, d_k)`` learned keys of a random
    context of distinct names (for :func:`sv_core.audit.register_regime`)."""
    n_facts = check_int("n_facts", n_facts, 3, model.n_names)

    def regime(rng: np.random.Generator) -> np.ndarray:
        names = rng.choice(model.n_names, n_facts, replace=False)
        with torch.no_grad():
            return model.keys(torch.as_tensor(names)).double().numpy()

    return regime


def run_trial(model: RecallModel, rng: np.random.Generator, *, P: int = 8, nu: float = 0.5,
              gammas=(0.1, 0.01)) -> dict:
    """Forget and edit on one frozen context (see module doc)."""
    sigma = model.sigma
    names, cities = sample_facts(rng, model.n_names, model.n_cities, P, 1)
    names, cities = names[0], cities[0]
    K, U, Q = frozen(model, names, cities, names)
    C = calibrate_C(nu, P)
    g = Gate(C=C, sigma=sigma)
    ids = g.admit(K)
    state0 = g.to_state()
    pred = logits_of(model, g.readout(Q, U)).argmax(1)
    recall_before = float(np.mean(pred == cities))

    # ---- forget one fact
    j = int(rng.integers(P))
    rec = g.forget(int(ids[j]), verify=True)
    keep = np.arange(P) != j
    out_f = logits_of(model, g.readout(Q, U[keep]))
    pred_f = out_f.argmax(1)
    a_full = np.zeros(P)
    a_full[keep] = g.alpha
    weight_forgotten = float(kernel_weights(Q[j : j + 1], K, a_full, sigma)[0, j])

    # ---- edit fact j: name_j -> a city not in the context
    new_city = int(rng.choice(np.setdiff1d(np.arange(model.n_cities), cities)))
    _, u_new, _ = frozen(model, names[j : j + 1], np.array([new_city]), names[j : j + 1])
    K_ed = np.vstack([K[keep], K[j : j + 1]])
    U_ed = np.vstack([U[keep], u_new])
    a_ref, _ = refit(K_ed, C=C, sigma=sigma)
    logit_ref = logits_of(model, kernel_readout(Q[j : j + 1], K_ed, a_ref, U_ed, sigma))[0]
    ge = Gate.from_state(state0)
    ge.forget(int(ids[j]))
    ge.admit(K[j])
    logit_exact = logits_of(model, ge.readout(Q[j : j + 1], U_ed))[0]
    edit = {"exact": {"residual": float(np.linalg.norm(logit_exact - logit_ref)), "old_weight": 0.0,
                      "answers_new": bool(logit_exact.argmax() == new_city)}}
    # decay edit: the new binding is written with the old binding's coefficient, the old binding
    # stays with its coefficient scaled by gamma; nothing is re-solved
    a_dd = np.append(np.asarray(state0["alpha"], dtype=np.float64), float(state0["alpha"][j]))
    K_dd = np.vstack([K, K[j : j + 1]])
    U_dd = np.vstack([U, u_new])
    for gm in gammas:
        a = a_dd.copy()
        a[j] *= gm
        logit_dec = logits_of(model, kernel_readout(Q[j : j + 1], K_dd, a, U_dd, sigma))[0]
        edit[f"decay_{gm:g}"] = {
            "residual": float(np.linalg.norm(logit_dec - logit_ref)),
            "old_weight": float(kernel_weights(Q[j : j + 1], K_dd, a, sigma)[0, j]),
            "answers_new": bool(logit_dec.argmax() == new_city)}
    # ---- matched-budget selection (no rng drawn: the trial's numbers above are unchanged)
    from evaluation.policies import get_policy, select_top_k

    alpha0 = np.asarray(state0["alpha"], dtype=np.float64)
    k = int(np.count_nonzero(alpha0 > 0))
    selection = {"k": k}
    for pol in SELECTION_POLICIES:
        if pol == "sv":
            kept = select_top_k(alpha0, k)
        else:
            kw = {"sigma": sigma} if pol in ("density", "kernel_leverage") else ({"seed": 0} if pol == "random" else {})
            kept = get_policy(pol, **kw).select(K, k)
        pred_k = logits_of(model, kernel_readout(Q, K[kept], np.ones(kept.size), U[kept], sigma)).argmax(1)
        selection[pol] = float(np.mean(pred_k == cities))
    return {
        "selection": selection,
        "recall_before": recall_before,
        "forgotten_recall": float(pred_f[j] == cities[j]),
        "others_recall": float(np.mean(pred_f[keep] == cities[keep])),
        "forgotten_weight": weight_forgotten,
        "score_dev_vs_refit": rec.verification["max_abs_score_dev"],
        "support_fraction": float(np.mean(np.asarray(state0["alpha"]) > 0)),
        "edit": edit,
    }


def run(trials: int = 200, seed: int = 0, *, P: int = 8, nu: float = 0.5, steps: int = 1500,
        gammas=(0.1, 0.01), audit_trials: int = 0, model: RecallModel | None = None, progress: bool = False) -> dict:
    """Train (unless ``model`` is given), freeze, forget and edit; optional learned-key audit."""
    from tqdm.auto import tqdm

    trials = check_int("trials", trials, 1)
    nu = check_pos("nu", nu, 1.0)
    t0 = time.perf_counter()
    if model is None:
        model, rep = train_model(seed, P=P, steps=steps, progress=progress)
        train = {"steps": rep.steps, "final_loss": rep.final_loss, "recall_at_1_ungated": rep.recall_at_1,
                 "seconds": rep.seconds}
    else:
        train = {"steps": 0, "note": "model given by the caller"}
    rows = [run_trial(model, np.random.default_rng([seed, 2, t]), P=P, nu=nu, gammas=gammas)
            for t in tqdm(range(trials), desc="learned keys", disable=not progress, leave=False)]
    chance = 1.0 / model.n_cities
    metrics = {
        "train": train,
        "recall_before": mean_ci(r["recall_before"] for r in rows),
        "forgotten_recall": mean_ci(r["forgotten_recall"] for r in rows),
        "chance": chance,
        "others_recall_after_forget": mean_ci(r["others_recall"] for r in rows),
        "forgotten_weight_max": float(max(r["forgotten_weight"] for r in rows)),
        "score_dev_vs_refit_max": float(max(r["score_dev_vs_refit"] for r in rows)),
        "support_fraction_mean": float(np.mean([r["support_fraction"] for r in rows])),
        "edit": {k: {"residual_median": float(np.median([r["edit"][k]["residual"] for r in rows])),
                     "residual_max": float(max(r["edit"][k]["residual"] for r in rows)),
                     "old_weight_mean": float(np.mean([r["edit"][k]["old_weight"] for r in rows])),
                     "answers_new": float(np.mean([r["edit"][k]["answers_new"] for r in rows]))}
                 for k in rows[0]["edit"]},
    }
    if audit_trials:
        from sv_core.audit import REGIMES, register_regime, run_audit

        register_regime("learned", learned_key_sampler(model))
        try:
            aud = run_audit(trials=audit_trials, regimes=["learned"], seed=seed, progress=progress)
        finally:
            REGIMES.pop("learned", None)
        metrics["audit_learned"] = aud["regimes"]["learned"]
        metrics["audit_failures"] = len(aud["failures"])
    sel_vs = paired_vs_sv({p: [r["selection"][p] for r in rows] for p in SELECTION_POLICIES},
                          metric="recall@1 of all P questions", seed=seed)
    metrics["selection"] = {
        "budget_mean": float(np.mean([r["selection"]["k"] for r in rows])),
        "trials_with_budget_below_P": int(sum(r["selection"]["k"] < P for r in rows)),
        "recall": {p: mean_ci(r["selection"][p] for r in rows) for p in SELECTION_POLICIES},
        "vs_sv": sel_vs,
    }
    metrics["peer_beats_sv"] = list(sel_vs["peer_beats_sv"])
    metrics["sv_offers"] = {"forgotten_weight_max": metrics["forgotten_weight_max"],
                            "score_dev_vs_refit_max": metrics["score_dev_vs_refit_max"]}
    rt = time.perf_counter() - t0
    e = metrics["edit"]
    tables = [
        {"title": "forgetting one fact (frozen learned keys, exact fp64 gate)",
         "columns": ["quantity", "this run", "seed"],
         "rows": [["recall@1 before", metrics["recall_before"]["mean"], 1.0],
                  ["forgotten fact recall@1", metrics["forgotten_recall"]["mean"], "chance"],
                  ["chance (1/#cities)", chance, None],
                  ["other facts recall@1", metrics["others_recall_after_forget"]["mean"], "intact (1.0)"],
                  ["forgotten token readout weight (max)", metrics["forgotten_weight_max"], 0.0]]},
        {"title": "editing one fact: old-binding residual ‖Δ logits‖ vs fresh same-C refit",
         "columns": ["edit", "residual median", "residual max", "old binding weight", "answers new city", "seed"],
         "rows": [[k, v["residual_median"], v["residual_max"], v["old_weight_mean"], v["answers_new"],
                   "~0" if k == "exact" else "1.15 (decay)"] for k, v in e.items()]},
    ]
    tables.append(vs_sv_table(
        f"matched budget k = |S∪E| (mean {metrics['selection']['budget_mean']:.2f} of P = {P}; "
        f"k < P in {metrics['selection']['trials_with_budget_below_P']}/{trials} trials)", sel_vs,
        {"sv": f"exact forget: forgotten weight {metrics['forgotten_weight_max']:.0e}, max |Δ score| vs refit "
               f"{metrics['score_dev_vs_refit_max']:.1e}; remove-add edit residual {e['exact']['residual_max']:.1e}"}))
    if "audit_learned" in metrics:
        a = metrics["audit_learned"]
        tables.append({"title": "deletion audit, learned-key regime (ν = 0.4, σ = 2, 2 removals)",
                       "columns": ["completed", "partition match %", "median |Δs|", "worst |Δs|", "decay median", "seed"],
                       "rows": [[f"{a['completed']}/{a['attempted']}", a["partition_match_pct"], a["score_dev_median"],
                                 a["score_dev_worst"], a["decay_median"], "300/300, 100 %, 4.5e-13, 1.1e-11"]]})
    claims = [
        {"statement": "forgetting one fact removes its answer and leaves the others intact",
         "reference": "fresh same-C refit without the fact", "path": "maintained fp64 C&P decrement on frozen keys",
         "operation": "active deletion",
         "value": {"forgotten": metrics["forgotten_recall"]["mean"], "others": metrics["others_recall_after_forget"]["mean"]},
         "holds": bool(metrics["forgotten_weight_max"] == 0.0 and metrics["others_recall_after_forget"]["mean"] >= 0.99)},
        {"statement": "exact remove-add edit leaves no residual of the old binding",
         "reference": "fresh same-C refit of the edited context", "path": "C&P decrement + increment (fp64)",
         "operation": "active deletion", "value": e["exact"]["residual_max"], "holds": bool(e["exact"]["residual_max"] < 1e-8)},
    ]
    return envelope(
        STUDY, "Learned keys: forgetting and exact editing on a trained recall model", runtime_s=rt, metrics=metrics,
        tables=tables, claims=claims,
        config={"trials": trials, "seed": seed, "seeds": f"torch.manual_seed({seed}); contexts default_rng([{seed}, 2, trial])",
                "P": P, "nu": nu, "n0": P, "C": calibrate_C(nu, P), "sigma": model.sigma, "train_steps": steps,
                "gammas": list(gammas), "n_names": model.n_names, "n_cities": model.n_cities, "audit_trials": audit_trials},
        notes="Seed 000 §6 / 001 §4: trained MQAR model recall@1 = 1.0; forgetting one fact drops it to chance with the "
              "others intact; remove–add edit residual ~0 vs 1.15 for decay (the seed does not state its γ or the "
              "residual's units; here ‖Δ logits‖₂ at the edited question).",
    )
