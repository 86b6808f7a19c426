"""Deletion latency: maintained C&P decrement vs a fresh same-C refit (and scikit-learn).

Protocol (SPEC §3): n in {120, 256, 384, 512}, d = 6, nu = 0.4 (C = 1/(nu n) fixed), sigma = 2,
30 uniform-random deletions per n from one maintained gate. For each deletion we time the
decrement, an independent refit of the retained keys at the same C (:func:`sv_core.refit`), and
scikit-learn's ``OneClassSVM`` (nu' = 1/(n C)) on the same keys. Reserve and active deletions are
reported separately. Speed is measured here; it is never asserted in tests.

Usage::

    python -m sv_core.bench_delete --json runs/bench_delete/result.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import time

import numpy as np

from .calibrate import calibrate_C
from .gate import Gate
from .refit import refit


def bench_one(n: int, deletions: int = 30, d: int = 6, nu: float = 0.4, sigma: float = 2.0,
              seed: int = 0, sklearn: bool = True) -> dict:
    from sklearn.svm import OneClassSVM

    rng = np.random.default_rng([seed, n])
    X = rng.standard_normal((n, d))
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    g.admit(X)
    rows = []
    for _ in range(deletions):
        tid = int(rng.choice(g.ids))
        status = g.status_of(tid)
        t0 = time.perf_counter()
        g.forget(tid)
        t_dec = time.perf_counter() - t0
        keys = g.keys
        t0 = time.perf_counter()
        refit(keys, C=C, sigma=sigma)
        t_ref = time.perf_counter() - t0
        t_sk = float("nan")
        if sklearn:
            nu_p = min(1.0, 1.0 / (keys.shape[0] * C))
            t0 = time.perf_counter()
            OneClassSVM(kernel="rbf", gamma=1.0 / sigma**2, nu=nu_p, tol=1e-6).fit(keys)
            t_sk = time.perf_counter() - t0
        rows.append({"status": status, "decrement_ms": 1e3 * t_dec, "refit_ms": 1e3 * t_ref,
                     "sklearn_ms": 1e3 * t_sk})
    out = {"n": n, "C": C, "deletions": deletions}
    for name, sel in (("all", lambda r: True), ("active", lambda r: r["status"] != "reserve"),
                      ("reserve", lambda r: r["status"] == "reserve")):
        rs = [r for r in rows if sel(r)]
        if not rs:
            out[name] = {"count": 0}
            continue
        dec = np.array([r["decrement_ms"] for r in rs])
        ref = np.array([r["refit_ms"] for r in rs])
        sk = np.array([r["sklearn_ms"] for r in rs])
        out[name] = {
            "count": len(rs),
            "decrement_ms_median": float(np.median(dec)),
            "refit_ms_median": float(np.median(ref)),
            "sklearn_ms_median": float(np.median(sk)),
            "refit_over_decrement_median": float(np.median(ref / dec)),
            "sklearn_over_decrement_median": float(np.median(sk / dec)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sv_core.bench_delete", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[120, 256, 384, 512])
    ap.add_argument("--deletions", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sklearn", action="store_true")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    from tqdm.auto import tqdm

    res = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "python": platform.python_version(), "numpy": np.__version__},
           "sizes": []}
    for n in tqdm(args.sizes, desc="bench_delete"):
        res["sizes"].append(bench_one(n, args.deletions, seed=args.seed, sklearn=not args.no_sklearn))
    hdr = f"{'n':>5}{'decr ms':>10}{'active ms':>11}{'reserve ms':>11}{'refit ms':>10}{'refit/decr':>11}{'sklearn ms':>11}{'sk/decr':>9}"
    print(hdr)
    for s in res["sizes"]:
        a, act, rsv = s["all"], s["active"], s["reserve"]
        print(f"{s['n']:>5}{a['decrement_ms_median']:>10.3f}{act.get('decrement_ms_median', float('nan')):>11.3f}"
              f"{rsv.get('decrement_ms_median', float('nan')):>11.3f}{a['refit_ms_median']:>10.1f}"
              f"{a['refit_over_decrement_median']:>11.0f}{a['sklearn_ms_median']:>11.2f}"
              f"{a['sklearn_over_decrement_median']:>9.1f}")
    if args.json_out:
        p = pathlib.Path(args.json_out)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(res, indent=2))
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
