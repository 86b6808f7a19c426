"""Completion on degenerate streams, and a random operation fuzz (issue 10's acceptance commands).

    python -m sv_core.bench.degenerate completion [--contexts 60]
    python -m sv_core.bench.degenerate fuzz [--sequences 600]

``completion``: near-duplicate clusters (8 centres × 8 copies, d = 6, σ = 2, ν = 0.4) at jitter
1e-2 … 1e-7 and exact repeats; each context admits its 64 keys one at a time and forgets 2; a
context counts as complete and exact when every operation succeeded, the KKT residual is
≤ 1e-9 and the gate score is within 1e-6 of an independent refit (:func:`sv_core.refit`).
Fallbacks (the documented exact re-solve) are counted, not hidden.

``fuzz``: random admit / forget / evict sequences mixing fresh keys and near-duplicates (d 2–6,
σ 0.5–3); counts sequences that end with KKT > 1e-9, score deviation > 1e-6, or a typed error on
valid input. When the margin set is empty ρ is not unique, so the kernel part is compared.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from sv_core import Gate, calibrate_C, rbf_kernel, refit
from sv_core.errors import GateError
from sv_core.jsonfile import write_json

JITTERS = (1e-2, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 1e-6, 1e-7, 0.0)


def completion(contexts: int = 60, seed: int = 12345) -> list[dict]:
    rows = []
    for jit in JITTERS:
        rng = np.random.default_rng(seed)
        r = {"jitter": jit, "contexts": contexts, "complete_exact": 0, "admit_fail": 0, "forget_fail": 0,
             "refit_fail": 0, "fallbacks": 0, "worst_kkt": 0.0, "worst_dev": 0.0}
        t0 = time.perf_counter()
        for _ in range(contexts):
            X = np.repeat(2.0 * rng.standard_normal((8, 6)), 8, axis=0) + jit * rng.standard_normal((64, 6))
            X = X[rng.permutation(64)]
            C = calibrate_C(0.4, 64)
            g = Gate(C=C, sigma=2.0)
            try:
                for x in X:
                    g.admit(x)
            except GateError:
                r["admit_fail"] += 1
                continue
            try:
                for tid in rng.choice(g.ids, 2, replace=False):
                    g.forget(int(tid))
            except GateError:
                r["forget_fail"] += 1
                continue
            r["fallbacks"] += int(getattr(g, "fallbacks", 0))
            try:
                a, rho = refit(g.keys, C=C, sigma=2.0)
            except GateError:
                r["refit_fail"] += 1
                continue
            dev = float(np.abs(g.score(g.keys) - (2 * rbf_kernel(g.keys, g.keys, 2.0) @ a - rho)).max())
            kkt = float(g.kkt_residual()["max"])
            r["worst_kkt"], r["worst_dev"] = max(r["worst_kkt"], kkt), max(r["worst_dev"], dev)
            r["complete_exact"] += int(kkt <= 1e-9 and dev <= 1e-6)
        r["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(r)
    return rows


def fuzz(sequences: int = 600, steps: int = 20) -> dict:
    out = {"sequences": sequences, "ops": 0, "kkt_gt_1e-9": 0, "dev_gt_1e-6": 0, "errors_on_valid_input": 0,
           "fallbacks": 0, "worst_kkt": 0.0, "worst_dev": 0.0}
    t0 = time.perf_counter()
    for seq in range(sequences):
        rng = np.random.default_rng([7, seq])
        d, sigma, n0 = int(rng.integers(2, 7)), float(rng.uniform(0.5, 3)), int(rng.integers(10, 40))
        g = Gate(C=calibrate_C(float(rng.uniform(0.2, 0.8)), n0), sigma=sigma)
        try:
            g.admit(rng.standard_normal((n0, d)))
            for _ in range(steps):
                u = rng.random()
                out["ops"] += 1
                if u < 0.45:
                    if g.n and rng.random() < 0.5:
                        scale = 10.0 ** rng.integers(-8, -1) * (rng.random() < 0.8)
                        x = g.keys[rng.integers(g.n)] + scale * rng.standard_normal(d)
                    else:
                        x = rng.standard_normal(d)
                    g.admit(x)
                elif u < 0.9:
                    if (g.n - 1) * g.C >= 1:
                        g.forget(int(rng.choice(g.ids)))
                else:
                    g.evict_reserve()
            X = g.keys
            a, rho = refit(X, C=g.C, sigma=sigma)
            P = np.vstack([X, X + 0.1 * rng.standard_normal(X.shape)])
            s, sr = g.score(P), 2 * rbf_kernel(P, X, sigma) @ a - rho
            if not g.partition()["margin"]:
                s, sr = s + g.rho, sr + rho
            dev, kkt = float(np.abs(s - sr).max()), float(g.kkt_residual()["max"])
            out["worst_kkt"], out["worst_dev"] = max(out["worst_kkt"], kkt), max(out["worst_dev"], dev)
            out["kkt_gt_1e-9"] += int(kkt > 1e-9)
            out["dev_gt_1e-6"] += int(dev > 1e-6)
            out["fallbacks"] += int(g.fallbacks)
        except GateError:
            out["errors_on_valid_input"] += 1
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sv_core.bench.degenerate", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("completion")
    c.add_argument("--contexts", type=int, default=60)
    f = sub.add_parser("fuzz")
    f.add_argument("--sequences", type=int, default=600)
    for p in (c, f):
        p.add_argument("--json", default=None, help="also write the result as JSON")
    a = ap.parse_args(argv)
    res = completion(a.contexts) if a.what == "completion" else fuzz(a.sequences)
    for r in (res if isinstance(res, list) else [res]):
        print(json.dumps(r))
    if a.json:
        write_json(a.json, res, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
