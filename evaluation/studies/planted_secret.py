"""Removing a planted secret: exact fixed-C decrement vs coefficient decay (seed 000 §4).

Protocol (per trial; 30 trials in the full run)
-----------------------------------------------
* 14 ordinary keys ``x ~ N(0, I_4)`` and one distinctive secret key ``x_s = r·u`` (``u`` a
  uniform random unit vector, ``r = secret_radius``) at a random position; ``n₀ = 15``,
  ``C = 1/(ν n₀) = 2/15`` for ν = 0.5, fixed for the whole trial; σ = 1.5.
* Values: ordinary ``v ~ N(0, I_4)``; the secret's value is ``secret_value · e₁``.
* Probes: one near every key, ``p = x + probe_jitter · N(0, I)``.
* **Retrieval** of the secret at the probe near it (recall@1): the secret is the token with the
  largest readout weight ``α_i κ(p, x_i)`` at that probe. Its normalised weight
  ``α_s κ(p, x_s) / Σ_j α_j κ(p, x_j)`` is reported beside it.
* Exact forgetting: :meth:`sv_core.Gate.forget` (C&P decrement, fp64). Reference ("never saw
  it"): :func:`sv_core.refit` on the 14 ordinary keys at the same C. Readout deviation = max
  over probes and value coordinates of ``|o(p) − o_ref(p)|``.
* Decay: keep the secret, multiply its α by γ ∈ {0.5, 0.1, 0.01}, no re-solve.
"""
from __future__ import annotations

import time

import numpy as np

from evaluation.audit_metrics import decay_alpha, readout_weight_share
from evaluation.claims import bounded, claim, interval
from evaluation.studies.common import check_int, check_pos, envelope, mean_ci
from evaluation.studies.readout import kernel_readout, kernel_weights
from sv_core import Gate, calibrate_C, refit

STUDY = "planted_secret"


def run_trial(rng: np.random.Generator, *, n_ordinary: int = 14, d: int = 4, sigma: float = 1.5,
              nu: float = 0.5, secret_radius: float = 2.5, secret_value: float = 5.0,
              probe_jitter: float = 0.3, gammas=(0.5, 0.1, 0.01)) -> dict:
    """One trial; returns shares, retrieval flags and readout deviations (see module doc)."""
    n0 = n_ordinary + 1
    C = calibrate_C(nu, n0)
    Xo = rng.standard_normal((n_ordinary, d))
    u = rng.standard_normal(d)
    xs = secret_radius * u / np.linalg.norm(u)
    pos = int(rng.integers(0, n0))
    X = np.insert(Xo, pos, xs, axis=0)
    V = rng.standard_normal((n0, d))
    V[pos] = 0.0
    V[pos, 0] = secret_value
    P = X + probe_jitter * rng.standard_normal(X.shape)
    p_secret = P[pos : pos + 1]

    g = Gate(C=C, sigma=sigma)
    ids = g.admit(X)
    alpha0, rho0 = g.alpha.copy(), g.rho
    status = g.status_of(int(ids[pos]))
    share_before = readout_weight_share(X, alpha0, p_secret, [pos], sigma)
    top1 = lambda a: bool(np.argmax(kernel_weights(p_secret, X, a, sigma)[0]) == pos and a[pos] > 0)  # noqa: E731

    # never-saw-it reference at the same C
    keep = np.arange(n0) != pos
    a_ref, _ = refit(X[keep], C=C, sigma=sigma)
    o_ref = kernel_readout(P, X[keep], a_ref, V[keep], sigma)

    receipt = g.forget(int(ids[pos]), verify=True)
    # readout weight of the secret after exact forgetting: alpha over the original index set
    alpha_after = np.zeros(n0)
    live = {int(i): a for i, a in zip(g.ids, g.alpha)}
    for j, i in enumerate(ids):
        alpha_after[j] = live.get(int(i), 0.0)
    share_exact = readout_weight_share(X, alpha_after, p_secret, [pos], sigma)
    o_exact = g.readout(P, V[keep])
    dev_exact = float(np.abs(o_exact - o_ref).max())

    decay = {}
    for gm in gammas:
        a_dec = decay_alpha(alpha0, [pos], gm)
        share = readout_weight_share(X, a_dec, p_secret, [pos], sigma)
        o_dec = kernel_readout(P, X, a_dec, V, sigma)
        decay[str(gm)] = {"share": share, "retrieved": top1(a_dec),
                          "readout_dev": float(np.abs(o_dec - o_ref).max())}
    return {
        "secret_status": status,
        "secret_alpha": float(alpha0[pos]),
        "rho": float(rho0),
        "share_before": share_before,
        "retrieved_before": top1(alpha0),
        "share_exact": share_exact,
        "retrieved_exact": top1(alpha_after),
        "readout_dev_exact": dev_exact,
        "score_dev_vs_refit": receipt.verification["max_abs_score_dev"],
        "kkt_residual": receipt.verification["kkt_residual"],
        "certified": bool(receipt.certified),
        "decay": decay,
    }


def run(trials: int = 30, seed: int = 0, *, d: int = 4, sigma: float = 1.5, nu: float = 0.5,
        n_ordinary: int = 14, secret_radius: float = 2.5, secret_value: float = 5.0,
        probe_jitter: float = 0.3, gammas=(0.5, 0.1, 0.01), progress: bool = False) -> dict:
    """Run the planted-secret study; returns a ``dashboards/SCHEMA.md`` result dict."""
    from tqdm.auto import tqdm

    trials = check_int("trials", trials, 1)
    sigma, nu = check_pos("sigma", sigma), check_pos("nu", nu, 1.0)
    gammas = tuple(float(check_pos("gamma", g_, 1.0)) for g_ in gammas)
    t0 = time.perf_counter()
    rows = []
    for t in tqdm(range(trials), desc="planted secret", disable=not progress, leave=False):
        rng = np.random.default_rng([seed, t])
        rows.append(run_trial(rng, n_ordinary=n_ordinary, d=d, sigma=sigma, nu=nu,
                              secret_radius=secret_radius, secret_value=secret_value,
                              probe_jitter=probe_jitter, gammas=gammas))
    rt = time.perf_counter() - t0
    pct = lambda flags: 100.0 * float(np.mean(flags))  # noqa: E731
    metrics = {
        "retrieved_before_pct": pct([r["retrieved_before"] for r in rows]),
        "retrieved_after_exact_pct": pct([r["retrieved_exact"] for r in rows]),
        "secret_weight_after_exact_max": float(max(r["share_exact"] for r in rows)),
        "readout_dev_exact_max": float(max(r["readout_dev_exact"] for r in rows)),
        "readout_dev_exact_median": float(np.median([r["readout_dev_exact"] for r in rows])),
        "score_dev_vs_refit_max": float(max(r["score_dev_vs_refit"] for r in rows)),
        "kkt_residual_max": float(max(r["kkt_residual"] for r in rows)),
        "secret_active_pct": pct([r["secret_status"] != "reserve" for r in rows]),
        "share_before": mean_ci(r["share_before"] for r in rows),
        "decay": {
            str(gm): {
                "retrieved_pct": pct([r["decay"][str(gm)]["retrieved"] for r in rows]),
                "secret_weight_mean": float(np.mean([r["decay"][str(gm)]["share"] for r in rows])),
                "secret_weight_min": float(min(r["decay"][str(gm)]["share"] for r in rows)),
                "readout_dev_max": float(max(r["decay"][str(gm)]["readout_dev"] for r in rows)),
                "readout_dev_median": float(np.median([r["decay"][str(gm)]["readout_dev"] for r in rows])),
            }
            for gm in gammas
        },
    }
    table_rows = [["before forgetting", metrics["retrieved_before_pct"], None, None, 80.0]]
    table_rows.append(["exact decrement", metrics["retrieved_after_exact_pct"],
                       bounded(metrics["readout_dev_exact_max"]), metrics["secret_weight_after_exact_max"], 0.0])
    seed_decay = {0.5: 80.0, 0.1: 40.0, 0.01: 7.0}
    for gm in gammas:
        m = metrics["decay"][str(gm)]
        table_rows.append([f"decay γ={gm:g}", m["retrieved_pct"], m["readout_dev_max"], m["secret_weight_mean"],
                           seed_decay.get(gm)])
    figures = [{
        "kind": "bar", "title": "secret retrieved (% of trials)", "ylabel": "% trials",
        "categories": [r[0] for r in table_rows], "values": [float(r[1]) for r in table_rows],
    }]
    gs = min(gammas)
    dec = metrics["decay"][str(gs)]
    n_ret = int(round(metrics["retrieved_after_exact_pct"] * trials / 100.0))
    claims = [claim(
        "after the exact decrement the secret is never retrieved and carries zero readout weight, unlike "
        "coefficient decay",
        reference="fresh refit on the 14 ordinary keys at the same C (never saw the secret)",
        path="maintained fp64 C&P decrement (sv_core.Gate.forget)", operation="active deletion",
        rule=f"the secret's readout weight after the exact decrement, max over {trials} trials, is 0 and lies below "
             f"decay's (γ = {gs:g}) minimum over them; the secret retrieved in no trial",
        passed=bool(n_ret == 0 and metrics["secret_weight_after_exact_max"] == 0.0 < dec["secret_weight_min"]),
        run=interval(metrics["secret_weight_after_exact_max"], how=f"secret readout weight, max over {trials} trials"),
        peer={"name": f"coefficient decay γ = {gs:g}: secret weight, minimum over trials",
              "value": dec["secret_weight_min"], "low": None, "high": None},
        paper={"figure": "retrieved 80 % before, 0 % after the exact decrement; decay γ = 0.5 / 0.1 / 0.01 still "
                         "80 / 40 / 7 %", "source": "seed 000 §4"},
        value={"retrieved_pct": metrics["retrieved_after_exact_pct"],
               "max_weight": metrics["secret_weight_after_exact_max"],
               "max_readout_dev": bounded(metrics["readout_dev_exact_max"]),
               **{f"decay_{g:g}_retrieved_pct": metrics["decay"][str(g)]["retrieved_pct"] for g in gammas}})]
    return envelope(
        STUDY, "Planted secret: exact decrement vs coefficient decay", runtime_s=rt, metrics=metrics,
        config={"trials": trials, "seed": seed, "seeds": f"numpy default_rng([{seed}, trial])", "d": d,
                "sigma": sigma, "nu": nu, "n0": n_ordinary + 1, "C": calibrate_C(nu, n_ordinary + 1),
                "secret_radius": secret_radius, "secret_value": secret_value, "probe_jitter": probe_jitter,
                "gammas": list(gammas),
                "retrieval": "secret is the top-weighted token of the readout at the probe near it"},
        tables=[{"title": "secret retrieval (this run vs seed 000 §4)",
                 "columns": ["state", "retrieved %", "max readout dev vs never-saw-it", "secret weight",
                             "seed retrieved %"],
                 "rows": table_rows}],
        figures=figures, claims=claims,
        receipts={"count": trials, "certified": int(sum(r["certified"] for r in rows)),
                  "chain_verified": None,  # in-memory receipts per trial: the study keeps no chain
                  "attempted": trials, "completed": trials},
        notes="Seed 000 §4: retrieval 80 % before, 0 % after the exact decrement (max readout deviation "
              "8.9e-5 from a never-saw-it layer); decay γ = 0.5/0.1/0.01 still 80/40/7 % with deviations "
              "0.57/0.34/0.16. The seed does not give the secret's placement or its retrieval rule; they are "
              "fixed here in the module docstring.",
    )
