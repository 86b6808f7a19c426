"""Online bounded-budget eviction on a streamed redundant context (seed 000 §5).

The skewed-redundancy context (:func:`evaluation.studies.skewed_redundancy.make_context`) is
streamed in a random token order, ``chunk`` tokens at a time, into a cache of at most ``budget``
tokens. Each policy decides what to evict at every chunk boundary, before any evaluation query is
known; recall is measured once at the end with the shared uniform-RBF readout over the cache. The
policies (SV's certified reserve eviction, streaming H2O, recency, random and the published peers
applied per chunk) and the paired comparison: :func:`run`. Pruned streaming is an empirical
trajectory, not certified equal to the full-history solve (seed 001 Proposition 2).
"""
from __future__ import annotations

import math
import time

import numpy as np

from evaluation.claims import bounded_text, ci, claim, peer_fig, strongest, weakest
from evaluation.studies.common import check_int, check_pos, envelope, mean_ci, paired_vs_sv, vs_sv_table
from evaluation.studies.readout import uniform_recall
from evaluation.studies.skewed_redundancy import make_context
from sv_core import Gate, calibrate_C, rbf_kernel

STUDY = "streaming_eviction"
POLICIES = ("sv", "h2o", "recency", "random", "leverage", "kernel_leverage", "keydiff", "snapkv", "tova")
PEERS = ("leverage", "kernel_leverage", "keydiff", "snapkv", "tova")
#: seed 000 §5: rare recall after streaming with an online bounded budget
PAPER = {"sv": 0.93, "h2o": 0.30}


def stream_sv(X: np.ndarray, budget: int, chunk: int, C: float, sigma: float) -> tuple[np.ndarray, dict]:
    """Kept stream indices after streaming X through a maintained gate with reserve eviction."""
    g = Gate(C=C, sigma=sigma)
    pos_of: dict[int, int] = {}
    stats = {"certified_evictions": 0, "budget_evictions": 0, "warmup_evictions": 0, "max_cert_weight_change": 0.0}
    for s in range(0, X.shape[0], chunk):
        ids = g.admit(X[s : s + chunk])
        pos_of.update({int(i): s + j for j, i in enumerate(ids)})
        if g.gated:
            cert = g.evict_reserve()
            stats["certified_evictions"] += len(cert.evicted)
            stats["max_cert_weight_change"] = max(stats["max_cert_weight_change"], cert.max_abs_weight_change)
            while g.n > budget:
                a = g.alpha
                g.forget(int(g.ids[int(np.argmin(a))]))
                stats["budget_evictions"] += 1
        else:
            while g.n > budget:  # warm-up: ungated, evict the oldest
                g.forget(int(g.ids[0]))
                stats["warmup_evictions"] += 1
    return np.sort(np.array([pos_of[int(i)] for i in g.ids], dtype=np.intp)), stats


def stream_h2o(X: np.ndarray, budget: int, chunk: int, sigma: float) -> np.ndarray:
    """Kept stream indices under streaming heavy-hitter (accumulated attention) eviction."""
    cache: list[int] = []
    acc: dict[int, float] = {}
    for s in range(0, X.shape[0], chunk):
        for t in range(s, min(s + chunk, X.shape[0])):
            cache.append(t)
            acc[t] = 0.0
            w = rbf_kernel(X[t : t + 1], X[cache], sigma)[0]
            w = w / w.sum()
            for c, wi in zip(cache, w):
                acc[c] += float(wi)
        if len(cache) > budget:
            order = sorted(cache, key=lambda c: (acc[c], c))  # lowest mass first, older first on ties
            drop = set(order[: len(cache) - budget])
            cache = [c for c in cache if c not in drop]
    return np.array(sorted(cache), dtype=np.intp)


def stream_press(X: np.ndarray, budget: int, chunk: int, policy: str, sigma: float) -> np.ndarray:
    """Kept stream indices when a score-based peer re-scores cache + arriving chunk at every chunk
    boundary (``snapkv``: the chunk is the observation window and is always kept)."""
    from evaluation.policies import get_policy, select_top_k

    pol = get_policy(policy, **({"sigma": sigma} if policy in ("kernel_leverage", "snapkv") else {}))
    cache = np.zeros(0, dtype=np.intp)
    for s in range(0, X.shape[0], chunk):
        new = np.arange(s, min(s + chunk, X.shape[0]))
        cache = np.concatenate([cache, new])
        if cache.size <= budget:
            continue
        if policy == "snapkv":
            sc = pol.score(X[cache], queries=X[new])
            sc[-new.size:] = sc.max() + 1.0  # the observation window itself is kept
        else:
            sc = pol.score(X[cache])
        cache = cache[select_top_k(sc, budget)]
    return np.sort(cache)


def stream_tova(X: np.ndarray, budget: int, sigma: float) -> np.ndarray:
    """Kept stream indices under TOVA: token-by-token, drop the cached token the newest token
    attends to least (normalised RBF attention; ties -> the older token)."""
    from evaluation.policies import get_policy

    pol = get_policy("tova", sigma=sigma)
    cache: list[int] = []
    for t in range(X.shape[0]):
        cache.append(t)
        if len(cache) > budget:
            sc = pol.score(X[cache], queries=X[t : t + 1])
            del cache[int(np.argmin(sc))]  # argmin returns the first (oldest) on ties
    return np.array(sorted(cache), dtype=np.intp)


def run_trial(rng: np.random.Generator, *, budget_frac: float = 0.56, chunk: int = 6, nu: float = 0.5,
              sigma: float = 1.0, ctx_kw: dict | None = None, order: str = "random") -> dict:
    """One streamed context. ``order``: ``"random"`` (shuffled stream) or ``"rare_first"``
    (the context's own order: rare facts first, then the redundant boilerplate)."""
    ctx = make_context(rng, **(ctx_kw or {}))
    if order not in ("random", "rare_first"):
        raise ValueError(f"order must be 'random' or 'rare_first', got {order!r}")
    perm = rng.permutation(ctx["X"].shape[0]) if order == "random" else np.arange(ctx["X"].shape[0])
    X, y = ctx["X"][perm], ctx["y"][perm]
    n = X.shape[0]
    budget = int(math.ceil(budget_frac * n))
    C = calibrate_C(nu, n)
    if budget * C < 1.0:
        raise ValueError(f"budget {budget} is below 1/C = {1 / C:.3g}; raise budget_frac or nu")
    rare_tok = ctx["rare"][y]
    rare_q = ctx["rare"][ctx["qy"]]
    out = {"budget": budget}
    kept_sets = {}
    kept_sets["sv"], sv_stats = stream_sv(X, budget, chunk, C, sigma)
    kept_sets["h2o"] = stream_h2o(X, budget, chunk, sigma)
    kept_sets["recency"] = np.arange(n - budget, n)
    kept_sets["random"] = np.sort(rng.choice(n, size=budget, replace=False))
    for pol in ("leverage", "kernel_leverage", "keydiff", "snapkv"):
        kept_sets[pol] = stream_press(X, budget, chunk, pol, sigma)
    kept_sets["tova"] = stream_tova(X, budget, sigma)
    for pol, kept in kept_sets.items():
        ok = uniform_recall(ctx["Q"], ctx["qy"], X, y, kept, sigma, ctx["n_groups"])
        out[pol] = {"rare_recall": float(ok[rare_q].mean()), "dense_recall": float(ok[~rare_q].mean()),
                    "rare_retained": float(np.isin(np.flatnonzero(rare_tok), kept).mean()), "size": int(kept.size)}
    out["sv_stats"] = sv_stats
    return out


def run(trials: int = 60, seed: int = 0, *, budget_frac: float = 0.56, chunk: int = 6, nu: float = 0.5,
        sigma: float = 1.0, centre_scale: float = 1.5, order: str = "random", progress: bool = False) -> dict:
    """Run the streaming study; returns a ``dashboards/SCHEMA.md`` result dict.

    * ``sv`` (:func:`stream_sv`) — the causal layer's exact long-range gate path: a maintained fixed-C
      gate (:class:`sv_core.Gate`, ``C = 1/(ν n₀)`` with ``n₀`` = the stream length, fixed) admits
      each chunk by C&P increments, then evicts its reserve keys with a point-in-time certificate
      (:meth:`Gate.evict_reserve`). If the cache still exceeds the budget, the smallest-α active keys
      are removed by the exact decrement (:meth:`Gate.forget`) — an uncertified budget eviction,
      counted in the result. The ungated warm-up (fewer than ``⌈1/C⌉ + 2`` keys) evicts by recency.
    * ``h2o`` (:func:`stream_h2o`) — streaming heavy-hitter eviction: every arriving token attends
      (uniform RBF normalised over the cache plus itself) to the cache; attention received is
      accumulated per token; the lowest-accumulated tokens are evicted down to the budget.
    * ``recency`` keeps the last ``budget`` tokens; ``random`` evicts uniformly at random.
    * peers (:mod:`evaluation.peers`, :func:`stream_press`): ``leverage``, ``kernel_leverage`` (gate's
      σ) and ``keydiff`` re-score the cache plus the arriving chunk at every chunk boundary and keep
      the top ``budget`` (a kvpress-style press applied per chunk); ``snapkv`` does the same with the
      arriving chunk's keys as the observation window (queries) and, as SnapKV does, always keeps the
      window tokens; ``tova`` (:func:`stream_tova`) evicts token by token, as TOVA does: whenever the
      cache exceeds the budget, the token the newest token attends to least (ties: the older) is
      dropped. As for ``h2o``, the stream's own keys act as queries; no peer sees an evaluation query.

    Paired comparison (``metrics["vs_sv"]``): per-trial SV − policy rare recall, percentile bootstrap
    over trials (10,000×, the same resampled trials for every policy); ``metrics["peer_beats_sv"]``
    lists policies whose interval lies above SV. SV's certificate counts are reported beside them.
    """
    from tqdm.auto import tqdm

    trials = check_int("trials", trials, 1)
    chunk = check_int("chunk", chunk, 1)
    budget_frac = check_pos("budget_frac", budget_frac, 1.0)
    ctx_kw = {"centre_scale": centre_scale}
    t0 = time.perf_counter()
    rows = [run_trial(np.random.default_rng([seed, t]), budget_frac=budget_frac, chunk=chunk, nu=nu, sigma=sigma,
                      ctx_kw=ctx_kw, order=order)
            for t in tqdm(range(trials), desc="streaming eviction", disable=not progress, leave=False)]
    rt = time.perf_counter() - t0
    metrics = {p: {k: mean_ci(r[p][k] for r in rows) for k in ("rare_recall", "dense_recall", "rare_retained")}
               for p in POLICIES}
    metrics["budget"] = rows[0]["budget"]
    metrics["sv_certified_evictions_mean"] = float(np.mean([r["sv_stats"]["certified_evictions"] for r in rows]))
    metrics["sv_budget_evictions_mean"] = float(np.mean([r["sv_stats"]["budget_evictions"] for r in rows]))
    metrics["sv_warmup_evictions_mean"] = float(np.mean([r["sv_stats"]["warmup_evictions"] for r in rows]))
    metrics["sv_max_certified_weight_change"] = float(max(r["sv_stats"]["max_cert_weight_change"] for r in rows))
    metrics["vs_sv"] = paired_vs_sv({p: [r[p]["rare_recall"] for r in rows] for p in POLICIES},
                                    metric="rare recall", seed=seed)
    metrics["peer_beats_sv"] = list(metrics["vs_sv"]["peer_beats_sv"])
    metrics["sv_offers"] = {
        "certified_evictions_mean": metrics["sv_certified_evictions_mean"],
        "uncertified_budget_evictions_mean": metrics["sv_budget_evictions_mean"],
        "max_certified_weight_change": metrics["sv_max_certified_weight_change"],
        "exact_deletion": "C&P decrement (Gate.forget), also used for the budget evictions"}
    offers = {"sv": f"{metrics['sv_certified_evictions_mean']:.1f} certified reserve evictions/trial "
                    f"(max readout-weight change {bounded_text(metrics['sv_max_certified_weight_change'])}); "
                    f"{metrics['sv_budget_evictions_mean']:.1f} uncertified budget evictions/trial by exact decrement"}
    seed_fig = PAPER
    tables = [{"title": f"streamed context ({order} order), budget {metrics['budget']} of 66 tokens, chunk {chunk}",
               "columns": ["policy", "rare recall", "rare tokens retained", "dense recall", "seed (rare)"],
               "rows": [[p, metrics[p]["rare_recall"]["mean"], metrics[p]["rare_retained"]["mean"],
                         metrics[p]["dense_recall"]["mean"], seed_fig.get(p)] for p in POLICIES]}]
    tables.append(vs_sv_table("streamed context", metrics["vs_sv"], offers))
    figures = [{"kind": "bar", "title": "rare-item recall after streaming", "ylabel": "recall",
                "categories": list(POLICIES), "values": [metrics[p]["rare_recall"]["mean"] for p in POLICIES],
                "ci_low": [metrics[p]["rare_recall"]["low"] for p in POLICIES],
                "ci_high": [metrics[p]["rare_recall"]["high"] for p in POLICIES]}]
    claims = _claims(metrics, trials)
    return envelope(
        STUDY, "Streaming bounded-budget eviction", runtime_s=rt, metrics=metrics, tables=tables, figures=figures,
        claims=claims,
        config={"trials": trials, "seed": seed, "seeds": f"numpy default_rng([{seed}, trial])",
                "budget_frac": budget_frac, "chunk": chunk, "nu": nu, "n0": 66, "sigma": sigma,
                "centre_scale": centre_scale, "stream_order": order},
        notes="Seed 000 §5: certified selection retains rare items at 0.93 vs 0.30 for streaming heavy-hitter "
              "eviction; the seed gives no further protocol. Each reserve eviction is certified at its time "
              "only; the pruned trajectory is empirical (seed 001 Prop. 2).",
    )


def _claims(m: dict, trials: int) -> list[dict]:
    """SV vs streaming H2O (the paper's comparison) and vs every streaming peer, each decided on the paired
    bootstrap interval of the per-trial rare-recall difference (a point gap never suffices)."""
    rare = {p: m[p]["rare_recall"] for p in POLICIES}
    d = m["vs_sv"]["diffs"]
    how = f"95 % paired bootstrap over {trials} trials"
    run = ci(rare["sv"], how=f"SV rare recall, 95 % normal interval over {trials} trials")
    best = strongest(rare)
    gap = PAPER["sv"] - PAPER["h2o"]
    inside = d["h2o"]["low"] is not None and d["h2o"]["low"] <= gap <= d["h2o"]["high"]
    common = {"reference": "same stream, same budget, same uniform-RBF readout; queries unknown while evicting",
              "operation": "streaming pruning"}
    h2o = claim(
        "online certified reserve eviction retains rare items better than streaming heavy-hitter eviction",
        path="maintained fp64 gate: C&P admission, reserve eviction (+ exact decrement when over budget)",
        rule="95 % paired bootstrap interval of SV − streaming H2O rare recall above 0",
        passed=d["h2o"]["low"] is not None and d["h2o"]["low"] > 0, run=run,
        peer=peer_fig("streaming H2O", rare["h2o"]), difference=ci(d["h2o"], how=how),
        strongest_peer=peer_fig(best, rare[best]) if best else None,
        paper={"figure": "rare recall 0.93 (SV) vs 0.30 (streaming heavy-hitter eviction)", "source": "seed 000 §5"},
        value={"sv": rare["sv"]["mean"], "h2o": rare["h2o"]["mean"]}, **common,
        notes=f"the paper's gap ({gap:.2f}) lies {'inside' if inside else 'outside'} this interval: the paper's "
              f"magnitude is {'' if inside else 'not '}reproduced")
    bp, ok = weakest(d, PEERS)
    peers = claim(
        "online certified eviction retains rare items better than every streaming peer (leverage, kernel leverage, "
        "KeyDiff, SnapKV, TOVA)",
        path="maintained fp64 gate vs per-chunk re-scoring (TOVA: per token)",
        rule="95 % paired bootstrap interval of SV − each streaming peer's rare recall above 0",
        passed=ok, run=run, peer=peer_fig(bp, rare[bp]), difference=ci(d[bp], how=how),
        value={p: f"{d[p]['mean']:.3f} [{d[p]['low']:.3f}, {d[p]['high']:.3f}]" for p in PEERS}, **common)
    return [h2o, peers]
