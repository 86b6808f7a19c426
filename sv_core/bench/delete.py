"""Deletion latency: maintained C&P decrement vs three peers, interleaved, at every size.

Protocol: for each n in {64, 120, 256, 512, 1024, 2048}, d = 6, nu = 0.4 (C = 1/(nu n) fixed),
sigma = 2, one maintained gate over n Gaussian keys. ``deletions`` *active* tokens (margin or
error; chosen uniformly among the active ones) are deleted one after another; right after each
decrement, on the same retained keys, the peers are timed (interleaved, so machine load hits all
of them alike):

* scikit-learn ``OneClassSVM`` (libsvm SMO, ``tol=1e-6``, nu' = 1/(n C)) refit from scratch;
* the project's refit oracle :func:`sv_core.refit` (Clarabel interior point + KKT polish);
* the solver's own NumPy reference loop (``FORGETFUL_SOLVER=reference``; a twin gate deleting the
  same token), so the compiled fast path's gain is a ratio measured in the same run;
* OSQP (if importable), fp64, eps 1e-7, polished, set up once on the full problem and *warm-started*: a
  deletion is a bound update ``0 <= a_k <= 0`` plus a warm start from the previous solution (the
  strongest incremental peer; no refactorisation of the kernel).

Reserve deletions (``reserve_deletions``, trivially exact: no coefficient moves) and one-key
admissions (``admissions`` fresh keys) are timed separately. Medians with inter-quartile ranges,
fallback counts (operations completed by the gate's exact fallback) and the log-log slope of the
median cost vs n are reported. Peers run with the machine's default BLAS threads; the gate caps
BLAS to one thread inside its solver calls. Speed is measured here, never asserted in tests.

Usage::

    python -m sv_core.bench.delete --json runs/bench_delete/result.json
"""
from __future__ import annotations

import argparse
import contextlib
import math
import platform
import sys
import time
from typing import Any

import numpy as np

from sv_core._fastpath import fast_path_available
from sv_core.calibrate import calibrate_C
from sv_core.gate import Gate
from sv_core.jsonfile import write_json
from sv_core.kernels import rbf_kernel
from sv_core.refit import refit
from sv_core.solver import reference_loop

DEFAULT_SIZES = (64, 120, 256, 512, 1024, 2048)


def _stats(x) -> dict:
    x = np.asarray([v for v in x if v == v], dtype=np.float64)
    if x.size == 0:
        return {"count": 0, "median": float("nan"), "q25": float("nan"), "q75": float("nan")}
    return {"count": int(x.size), "median": float(np.median(x)), "q25": float(np.percentile(x, 25)),
            "q75": float(np.percentile(x, 75))}


class _OSQPPeer:
    """Warm-started OSQP on the full problem; deleting key k sets its upper bound to 0."""

    def __init__(self, X: np.ndarray, C: float, sigma: float):
        import osqp
        from scipy import sparse

        n = X.shape[0]
        K = rbf_kernel(X, X, sigma)
        self.P = sparse.triu(sparse.csc_matrix(2.0 * K), format="csc")
        q = -np.diag(K).copy()
        A = sparse.vstack([sparse.csc_matrix(np.ones((1, n))), sparse.identity(n, format="csc")], format="csc")
        self.l = np.r_[1.0, np.zeros(n)]
        self.u = np.r_[1.0, np.full(n, C)]
        self.m = osqp.OSQP()
        t0 = time.perf_counter()
        self.m.setup(self.P, q, A, self.l, self.u, verbose=False, eps_abs=1e-7, eps_rel=1e-7,
                     polishing=True, max_iter=100_000)
        r = self._solve()
        self.setup_s = time.perf_counter() - t0
        self.x, self.y = r.x, r.y

    def _solve(self):
        try:
            return self.m.solve(raise_error=False)
        except TypeError:  # osqp < 1.0
            return self.m.solve()

    def delete(self, row: int) -> tuple[float, bool]:
        t0 = time.perf_counter()
        self.u[1 + row] = 0.0
        self.m.update(u=self.u)
        self.m.warm_start(x=self.x, y=self.y)
        r = self._solve()
        dt = time.perf_counter() - t0
        self.x, self.y = r.x, r.y
        return dt, str(r.info.status).startswith("solved")


def bench_one(n: int, deletions: int = 30, d: int = 6, nu: float = 0.4, sigma: float = 2.0,
              seed: int = 0, sklearn: bool = True, project_refit: bool = True, osqp: bool = True,
              refit_max: int | None = None, reserve_deletions: int = 10, admissions: int = 10,
              osqp_max: int | None = None, reference: bool = True) -> dict:
    """Time ``deletions`` active deletions at size ``n`` with interleaved peers (see module doc).

    ``refit_max`` caps how many deletions also time the project's refit (default: all up to
    n = 256, then 10 / 3 / 2 at n <= 512 / 1024 / above; it is an interior-point solve of a dense
    n x n QP) and ``osqp_max`` the warm-started OSQP solves (all up to n = 512, then 10 / 3).
    Returns per-class medians (``active``, ``reserve``, ``all``) with the keys of the previous
    version plus IQRs, OSQP, admissions, fallbacks."""
    if sklearn:
        from sklearn.svm import OneClassSVM
    if refit_max is None:
        refit_max = deletions if n <= 256 else 10 if n <= 512 else 3 if n <= 1024 else 2
    if osqp_max is None:
        osqp_max = deletions if n <= 512 else 10 if n <= 1024 else 3
    rng = np.random.default_rng([seed, n])
    X = rng.standard_normal((n, d))
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    ids = g.admit(X)
    twin = None
    if reference and fast_path_available():
        with reference_loop():
            twin = Gate(C=C, sigma=sigma)
            twin.admit(X)
    row_of = {int(i): r for r, i in enumerate(ids)}
    peer = None
    osqp_note = None
    if osqp:
        try:
            peer = _OSQPPeer(X, C, sigma)
        except ImportError:
            osqp_note = "osqp is not installed (pip install osqp)"
    rows = []
    for i in range(deletions):
        p = g.partition()
        act = p["margin"] + p["error"]
        tid = int(rng.choice(act))
        status = g.status_of(tid)
        t0 = time.perf_counter()
        rec = g.forget(tid)
        t_dec = time.perf_counter() - t0
        keys = g.keys
        row = {"status": status, "decrement_ms": 1e3 * t_dec, "events": rec.path_events,
               "fallback": bool(rec.fallback), "refit_ms": float("nan"), "sklearn_ms": float("nan"),
               "osqp_ms": float("nan"), "reference_ms": float("nan")}
        if twin is not None:
            with reference_loop():
                t0 = time.perf_counter()
                twin.forget(tid)
                row["reference_ms"] = 1e3 * (time.perf_counter() - t0)
        if sklearn:
            nu_p = min(1.0, 1.0 / (keys.shape[0] * C))
            t0 = time.perf_counter()
            OneClassSVM(kernel="rbf", gamma=1.0 / sigma**2, nu=nu_p, tol=1e-6).fit(keys)
            row["sklearn_ms"] = 1e3 * (time.perf_counter() - t0)
        if project_refit and i < refit_max:
            t0 = time.perf_counter()
            refit(keys, C=C, sigma=sigma)
            row["refit_ms"] = 1e3 * (time.perf_counter() - t0)
        if peer is not None and i < osqp_max:
            dt, ok = peer.delete(row_of[tid])
            row["osqp_ms"] = 1e3 * dt if ok else float("nan")
            row["osqp_solved"] = ok
        rows.append(row)
    reserve_rows = []
    for _ in range(reserve_deletions):
        res = g.partition()["reserve"]
        if not res or (g.n - 1) * C < 1.0:
            break
        tid = int(rng.choice(res))
        t0 = time.perf_counter()
        rec = g.forget(tid)
        reserve_rows.append({"status": "reserve", "decrement_ms": 1e3 * (time.perf_counter() - t0),
                             "fallback": bool(rec.fallback)})
    adm = []
    for _ in range(admissions):
        x = rng.standard_normal(d)
        t0 = time.perf_counter()
        g.admit(x)
        adm.append(1e3 * (time.perf_counter() - t0))
    kkt = g.kkt_residual()["max"]

    def summary(rs: list[dict]) -> dict:
        if not rs:
            return {"count": 0}
        dec = np.array([r["decrement_ms"] for r in rs])
        out = {"count": len(rs), "decrement_ms_median": float(np.median(dec)),
               "decrement_ms_iqr": [float(np.percentile(dec, 25)), float(np.percentile(dec, 75))],
               "fallbacks": int(sum(r["fallback"] for r in rs))}
        for peer_name in ("refit", "sklearn", "osqp", "reference"):
            v = np.array([r.get(f"{peer_name}_ms", np.nan) for r in rs])
            ok = np.isfinite(v)
            s = _stats(v)
            out[f"{peer_name}_ms_median"] = s["median"]
            out[f"{peer_name}_ms_iqr"] = [s["q25"], s["q75"]]
            out[f"{peer_name}_count"] = s["count"]
            ratio = v[ok] / dec[ok]
            out[f"{peer_name}_over_decrement_median"] = float(np.median(ratio)) if ratio.size else float("nan")
        return out

    active = summary(rows)
    return {
        "n": n, "C": C, "deletions": deletions, "d": d,
        "active": active,
        "reserve": summary(reserve_rows) if reserve_rows else {"count": 0},
        # kept for consumers of the previous schema: the timed deletions are all active now
        "all": active,
        "admission": {**_stats(adm), "iqr": [_stats(adm)["q25"], _stats(adm)["q75"]],
                      "over_active_decrement": float(np.median(adm) / active["decrement_ms_median"])},
        "fallbacks": int(g.fallbacks),
        "fast_path": bool(fast_path_available()),
        "fast_events": int(g._solver.fast_events),
        "kkt_residual_end": float(kkt),
        "osqp_setup_s": None if peer is None else float(peer.setup_s),
        "osqp_note": osqp_note,
        "refit_max": int(refit_max),
        "osqp_max": int(osqp_max),
    }


def slope(ns, ys) -> float:
    """Least-squares slope of log(y) on log(n) (cost ~ n^slope)."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y == y and y > 0]
    if len(pts) < 2:
        return float("nan")
    a = np.array(pts)
    return float(np.polyfit(a[:, 0], a[:, 1], 1)[0])


def format_table(res: dict) -> str:
    hdr = (f"{'n':>5} {'active ms [IQR]':>24} {'fb':>3} {'admit ms':>9} {'adm/del':>7} "
           f"{'sklearn ms':>10} {'x':>6} {'refit ms':>9} {'x':>7} {'osqp ms':>8} {'x':>6} {'reserve ms':>10} "
           f"{'numpy-ref ms':>12} {'x':>5}")
    lines = [hdr]
    for s in res["sizes"]:
        a = s["active"]
        iqr = a["decrement_ms_iqr"]
        lines.append(
            f"{s['n']:>5} {a['decrement_ms_median']:>8.3f} [{iqr[0]:.3f}, {iqr[1]:.3f}]".ljust(31)
            + f"{a['fallbacks']:>3} {s['admission']['median']:>9.3f} {s['admission']['over_active_decrement']:>7.2f} "
            f"{a['sklearn_ms_median']:>10.2f} {a['sklearn_over_decrement_median']:>6.1f} "
            f"{a['refit_ms_median']:>9.1f} {a['refit_over_decrement_median']:>7.0f} "
            f"{a['osqp_ms_median']:>8.2f} {a['osqp_over_decrement_median']:>6.1f} "
            f"{s['reserve'].get('decrement_ms_median', float('nan')):>10.3f} "
            f"{a.get('reference_ms_median', float('nan')):>12.3f} "
            f"{a.get('reference_over_decrement_median', float('nan')):>5.2f}")
    sl = res["slopes"]
    lines.append("slope of median cost vs n (log-log): " + ", ".join(f"{k} {v:.2f}" for k, v in sl.items()))
    return "\n".join(lines)


def _run_sizes(args: argparse.Namespace, res: dict, t_start: float) -> None:
    for n in args.sizes:
        res["sizes"].append(bench_one(n, args.deletions, seed=args.seed, sklearn=not args.no_sklearn,
                                      project_refit=not args.no_refit, osqp=not args.no_osqp,
                                      refit_max=args.refit_max, reserve_deletions=args.reserve_deletions,
                                      admissions=args.admissions, osqp_max=args.osqp_max,
                                      reference=not args.no_reference))
        print(f"n={n} done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
        if args.json_out:  # partial results survive an interrupted run
            write_json(args.json_out, res)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sv_core.bench.delete", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=list(DEFAULT_SIZES))
    ap.add_argument("--deletions", type=int, default=30, help="active deletions per size")
    ap.add_argument("--reserve-deletions", type=int, default=10)
    ap.add_argument("--admissions", type=int, default=10)
    ap.add_argument("--refit-max", type=int, default=None,
                    help="deletions per size that also time the project's refit (default: all up to "
                         "n=256, then 10/3/2)")
    ap.add_argument("--osqp-max", type=int, default=None,
                    help="deletions per size that also time warm-started OSQP (default: all up to "
                         "n=512, then 10/3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sklearn", action="store_true")
    ap.add_argument("--no-refit", action="store_true")
    ap.add_argument("--no-osqp", action="store_true")
    ap.add_argument("--no-reference", action="store_true",
                    help="do not time the NumPy reference loop beside the compiled fast path")
    ap.add_argument("--threads", type=int, default=None,
                    help="pin BLAS/OpenMP to this many threads for the whole run (default: the "
                         "machine's default threads; the gate always caps its own solver calls)")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    try:
        import threadpoolctl

        blas = threadpoolctl.threadpool_info()
    except Exception:  # noqa: BLE001
        blas = []
    res: dict[str, Any] = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "python": platform.python_version(), "numpy": np.__version__,
                       "blas": [{k: b.get(k) for k in ("internal_api", "num_threads", "version")} for b in blas]},
           "protocol": {"d": 6, "nu": 0.4, "sigma": 2.0, "seed": args.seed, "deletions": args.deletions,
                        "interleaved": True, "sklearn_tol": 1e-6, "osqp": "fp64, eps 1e-7, polished, warm-started",
                        "threads": args.threads or "default", "fast_path": bool(fast_path_available())},
           "sizes": []}
    t_start = time.perf_counter()
    pin = contextlib.nullcontext()
    if args.threads:
        from threadpoolctl import threadpool_limits

        pin = threadpool_limits(args.threads)
    with pin:
        _run_sizes(args, res, t_start)
    ns = [s["n"] for s in res["sizes"]]
    res["slopes"] = {
        "decrement": slope(ns, [s["active"]["decrement_ms_median"] for s in res["sizes"]]),
        "admission": slope(ns, [s["admission"]["median"] for s in res["sizes"]]),
        "sklearn": slope(ns, [s["active"]["sklearn_ms_median"] for s in res["sizes"]]),
        "refit": slope(ns, [s["active"]["refit_ms_median"] for s in res["sizes"]]),
        "osqp": slope(ns, [s["active"]["osqp_ms_median"] for s in res["sizes"]]),
        "reference": slope(ns, [s["active"].get("reference_ms_median", float("nan")) for s in res["sizes"]]),
    }
    res["fallbacks_total"] = int(sum(s["fallbacks"] for s in res["sizes"]))
    res["runtime_s"] = time.perf_counter() - t_start
    print(format_table(res))
    if args.json_out:
        print(f"wrote {write_json(args.json_out, res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
