"""Per-stay solve: the certified solve (sv_core.solve) vs libsvm, interleaved, at every size.

Protocol (the retention study's): ν = 0.3, σ = 3, ``C = 1/(ν n)``, d = 6, two key families:
``icu`` (ICU-like stays, :func:`icu_like_keys`) and ``gauss`` (standard Gaussian keys). Per size,
family and thread setting, :func:`bench_one` times both solvers interleaved and reports their KKT
violations and score gap; ``--rss`` (:func:`bench_rss`), ``--gate`` (:func:`bench_gate`) and
``--admit`` (:func:`bench_admit`) measure the peak memory, the cold-admission crossover and the
maintained gate's batch admission. Speed is measured here, never asserted in tests.

Usage::

    python -m sv_core.bench.solve [--n 300 1000 3000 10000] [--threads 1] [--json OUT]
    python -m sv_core.bench.solve --admit --kinds icu --threads 1 --json docs/results/bench_gate_admit.json
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import platform
import subprocess
import sys
import time
from typing import Any

import numpy as np

from sv_core.certified import solve
from sv_core.jsonfile import write_json
from sv_core.kernels import rbf_matvec
from sv_core.refit import refit
from sv_core.smo import fast_smo_available

DEFAULT_SIZES = (300, 1000, 3000, 10000)
NU, SIGMA, D = 0.3, 3.0, 6
#: repetitions that also time the refit (seconds per solve at n = 1000)
REFIT_REPS = 5
#: ``--admit`` times the first C&P step after the admission (it builds the n x n kernel) up to this n
FIRST_STEP_MAX = 3000
#: vitals-like channels: level, spread and recording resolution (HR, SBP, DBP, MBP, RR, SpO₂)
_LEVEL = np.array([85.0, 120.0, 62.0, 80.0, 18.0, 96.0])
_SPREAD = np.array([12.0, 16.0, 10.0, 11.0, 4.0, 2.0])


def icu_like_keys(n: int, rng: np.random.Generator, d: int = D) -> np.ndarray:
    """(n, d) z-scored ICU-like hourly keys; d ≤ 6 channels.

    Six vitals-like channels (heart rate, systolic/diastolic/mean pressure, respiratory rate, SpO₂),
    each a slow AR(1) stream with heavy-tailed (t₄) innovations around a per-stay level, recorded at
    the vitals' integer resolution (so exact repeats occur, as in real hourly data) and z-scored per
    stay; a small local generator because ``sv_core`` does not import ``cohort``.
    """
    if not 1 <= d <= 6:
        raise ValueError(f"d must be in 1..6, got {d}")
    phi = rng.uniform(0.85, 0.98, d)
    level = _LEVEL[:d] + _SPREAD[:d] * rng.standard_normal(d) * 0.5
    z = np.empty((n, d))
    z[0] = rng.standard_normal(d)
    eps = rng.standard_t(4, size=(n, d)) * np.sqrt(1.0 - phi**2) * 0.6
    for t in range(1, n):
        z[t] = phi * z[t - 1] + eps[t]
    v = np.round(level + _SPREAD[:d] * z)
    sd = v.std(axis=0)
    return (v - v.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def keys(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, n, 0 if kind == "icu" else 1])
    return icu_like_keys(n, rng) if kind == "icu" else rng.standard_normal((n, D))


def _stats(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    return {"median": float(np.median(x)), "q25": float(np.percentile(x, 25)),
            "q75": float(np.percentile(x, 75)), "count": int(x.size)}


def libsvm_solution(X: np.ndarray, C: float, sigma: float, tol: float = 1e-8):
    """libsvm's solution in this project's terms: ``(alpha (n,), rho)`` (SPEC §3b)."""
    from sklearn.svm import OneClassSVM

    n = X.shape[0]
    nu_p = 1.0 / (n * C)
    m = OneClassSVM(kernel="rbf", nu=nu_p, gamma=1.0 / sigma**2, tol=tol).fit(X)
    a = np.zeros(n)
    a[m.support_] = m.dual_coef_.ravel() / (nu_p * n)
    return a, 1.0 + 2.0 * float(m.intercept_[0]) / (nu_p * n)


def kkt_of(X: np.ndarray, a: np.ndarray, rho: float, C: float, sigma: float) -> float:
    """Largest KKT violation of any (alpha, rho), bounds read with a 1e-12·C margin."""
    sup = np.flatnonzero(a != 0.0)
    g = rho - 1.0 + 2.0 * rbf_matvec(X, X[sup], a[sup], sigma)
    lo, hi = a <= 1e-12 * C, a >= C * (1.0 - 1e-12)
    mid = ~(lo | hi)
    v = [abs(a.sum() - 1.0), float(np.maximum(-a, 0).max()), float(np.maximum(a - C, 0).max()),
         float(np.abs(g[mid]).max(initial=0.0)), float(np.maximum(g[hi], 0).max(initial=0.0)),
         float(np.maximum(-g[lo], 0).max(initial=0.0))]
    return float(max(v))


def score_gap(X: np.ndarray, a1: np.ndarray, r1: float, a2: np.ndarray, r2: float, sigma: float) -> float:
    """``max |s_1(x) − s_2(x)|`` over the keys, ``s(x) = 2 Σ α_i κ(x, x_i) − ρ``."""
    d = a1 - a2
    sup = np.flatnonzero(d != 0.0)
    return float(np.abs(2.0 * rbf_matvec(X, X[sup], d[sup], sigma) - (r1 - r2)).max())


def _timed(f):
    w, c = time.perf_counter(), time.process_time()
    out = f()
    return out, (time.perf_counter() - w) * 1e3, (time.process_time() - c) * 1e3


def bench_one(kind: str, n: int, reps: int, seed: int, refit_max: int) -> dict:
    """The same keys solved ``reps`` times by, in turn, :func:`sv_core.solve` and scikit-learn's
    ``OneClassSVM(nu=1/(nC), gamma=1/σ², tol=1e-8)`` (libsvm; single-threaded), and at n ≤
    ``refit_max`` (in the first ``REFIT_REPS``) the old per-stay path (:func:`sv_core.refit`, Clarabel
    + KKT polish); medians with inter-quartile ranges and the median of the per-rep libsvm/solve
    ratios, in wall time and in process CPU time (steadier on a loaded machine; both sides are
    single-threaded). One untimed warm-up call of each precedes the timing. The solve caps BLAS to one
    thread inside itself at n ≥ 192; libsvm does not use BLAS. Reported beside the times: the KKT
    violation of each (the certificate's; libsvm's recomputed from its α = dual_coef/(ν' n) and
    ρ = 1 + 2·intercept/(ν' n), SPEC §3b), the max gate score gap between the two over the keys, the
    set sizes, SMO iterations and fallbacks.
    """
    X = keys(kind, n, seed)
    C = 1.0 / (NU * n)
    t_solve, t_lib, t_refit, ratio, c_solve, c_lib, c_ratio = [], [], [], [], [], [], []
    solve(X, C, SIGMA)  # warm-up of both (first-call costs are not the solve's)
    libsvm_solution(X, C, SIGMA)
    if n <= refit_max:
        refit(X, C=C, sigma=SIGMA)
    sol = a_l = rho_l = None
    for rep in range(reps):
        sol, w1, c1 = _timed(lambda: solve(X, C, SIGMA))
        (a_l, rho_l), w2, c2 = _timed(lambda: libsvm_solution(X, C, SIGMA))
        t_solve.append(w1)
        t_lib.append(w2)
        ratio.append(w2 / w1)
        c_solve.append(c1)
        c_lib.append(c2)
        c_ratio.append(c2 / max(c1, 1e-6))
        if n <= refit_max and rep < REFIT_REPS:
            t3 = time.perf_counter()
            refit(X, C=C, sigma=SIGMA)
            t_refit.append((time.perf_counter() - t3) * 1e3)
    assert sol is not None and a_l is not None and rho_l is not None
    cert = sol.certificate
    return {
        "kind": kind, "n": n, "C": C, "solve_ms": _stats(t_solve), "libsvm_ms": _stats(t_lib),
        "refit_ms": _stats(t_refit) if t_refit else None, "libsvm_over_solve": _stats(ratio),
        "solve_cpu_ms": _stats(c_solve), "libsvm_cpu_ms": _stats(c_lib), "libsvm_over_solve_cpu": _stats(c_ratio),
        "kkt_solve": cert.kkt_violation, "kkt_libsvm": kkt_of(X, a_l, rho_l, C, SIGMA),
        "score_gap_solve_libsvm": score_gap(X, sol.alpha, sol.rho, a_l, rho_l, SIGMA),
        "counts": cert.counts, "smo_iterations": cert.smo_iterations, "repair_rounds": cert.repair_rounds,
        "method": cert.method, "fallbacks": cert.fallbacks, "margin_residual": cert.margin_residual,
    }


def _admit(X: np.ndarray, C: float):
    from sv_core.gate import Gate

    g = Gate(C, SIGMA)
    g.admit(X)
    return g


def bench_admit(kind: str, n: int, reps: int, seed: int) -> dict:
    """``Gate(C, σ).admit(X)`` vs libsvm, interleaved.

    With the gate's recomputed KKT residual, the peak memory traced during the admission
    (``tracemalloc``, one untimed call) beside the n × |support| and n × n kernel sizes, and the time
    of the first C&P step (one deletion, which builds the kernel and bordered inverse) up to
    ``FIRST_STEP_MAX`` keys.
    """
    import tracemalloc

    X = keys(kind, n, seed)
    C = 1.0 / (NU * n)
    _admit(X, C)  # warm-up of both
    libsvm_solution(X, C, SIGMA)
    t_gate, t_lib, ratio, c_gate, c_lib, c_ratio = [], [], [], [], [], []
    g = a_l = rho_l = None
    for _ in range(reps):
        g, w1, c1 = _timed(lambda: _admit(X, C))
        (a_l, rho_l), w2, c2 = _timed(lambda: libsvm_solution(X, C, SIGMA))
        t_gate.append(w1)
        t_lib.append(w2)
        ratio.append(w1 / w2)
        c_gate.append(c1)
        c_lib.append(c2)
        c_ratio.append(c1 / max(c2, 1e-6))
    assert g is not None and a_l is not None and rho_l is not None
    tracemalloc.start()
    _admit(X, C)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    first = []
    if n <= FIRST_STEP_MAX:
        for _ in range(3):
            h = _admit(X, C)
            tid = int(h.support_ids()[0])
            t0 = time.perf_counter()
            h.forget(tid)
            first.append((time.perf_counter() - t0) * 1e3)
    sup = int(np.count_nonzero(g.alpha))
    return {
        "kind": kind, "n": n, "C": C, "admit_ms": _stats(t_gate), "libsvm_ms": _stats(t_lib),
        "admit_over_libsvm": _stats(ratio), "admit_cpu_ms": _stats(c_gate), "libsvm_cpu_ms": _stats(c_lib),
        "admit_over_libsvm_cpu": _stats(c_ratio), "kkt_gate": g.kkt_residual()["max"],
        "kkt_libsvm": kkt_of(X, a_l, rho_l, C, SIGMA),
        "score_gap_gate_libsvm": score_gap(X, g.alpha, g.rho, a_l, rho_l, SIGMA),
        "counts": {k: len(v) for k, v in g.partition().items()}, "cold_solve": g.cold_solve_log[-1]["method"],
        "fallbacks": g.fallbacks, "peak_traced_mb": peak / 2**20, "support_kernel_mb": n * sup * 8 / 2**20,
        "full_kernel_mb": n * n * 8 / 2**20, "first_step_ms": _stats(first) if first else None,
    }


def bench_gate(n: int, reps: int, seed: int) -> dict:
    """Cold ``Gate.admit`` of n ICU-like keys: certified solve vs settling one by one.

    The crossover behind ``sv_core.gate.CERTIFIED_MIN_KEYS``.
    """
    from sv_core.gate import Gate

    X = keys("icu", n, seed)
    C = 1.0 / (NU * n)
    tc: list[float] = []
    tp: list[float] = []
    for _ in range(reps):
        for mode, out in (("certified", tc), ("path", tp)):
            g = Gate(C, SIGMA, cold_solve=mode)
            t0 = time.perf_counter()
            g.admit(X)
            out.append((time.perf_counter() - t0) * 1e3)
    return {"n": n, "certified_ms": _stats(tc), "path_ms": _stats(tp),
            "path_over_certified": _stats(np.asarray(tp) / np.asarray(tc))}


# peak RSS of the child itself: VmHWM of /proc/self/status (ru_maxrss would carry the forking
# parent's size across exec on Linux); ru_maxrss where /proc is absent
_RSS_CHILD = """
import resource, sys, time

def hwm():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

import numpy as np
from sv_core.bench.solve import keys, NU, SIGMA
from sv_core.certified import solve
n = int(sys.argv[1]); X = keys(sys.argv[2], n, int(sys.argv[3])); C = 1.0 / (NU * n)
base = hwm()
t = time.perf_counter(); s = solve(X, C, SIGMA); t = time.perf_counter() - t
print(base, hwm(), t, s.certificate.kkt_violation)
"""


def bench_rss(kind: str, n: int, seed: int) -> dict:
    """Peak RSS of a fresh process that imports ``sv_core``, makes the keys and solves them once."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).resolve().parents[2]),
                                         env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(n), kind, str(seed)], capture_output=True,
                         text=True, check=True, env=env).stdout.split()
    base, peak, secs, kkt = int(out[0]), int(out[1]), float(out[2]), float(out[3])
    return {"kind": kind, "n": n, "rss_before_solve_mb": base / 1024, "peak_rss_mb": peak / 1024,
            "solve_s": secs, "kkt": kkt}


def format_admit_table(res: dict) -> str:
    lines = [f"Gate(C, sigma).admit(X) vs libsvm OneClassSVM.fit(tol=1e-8) (nu={NU}, sigma={SIGMA}, d={D}); load "
             f"{res['load_before']} -> {res['load_after']}",
             f"{'kind':6}{'n':>7}{'threads':>8} {'admit ms [IQR]':>25} {'libsvm ms [IQR]':>25}{'admit/lib':>10}"
             f"{'(cpu)':>7}{'KKT gate':>10}{'gap':>9}{'peak MB':>9}{'n|sup| MB':>10}{'n^2 MB':>8}{'1st step ms':>12}"]
    for r in res["admit"]:
        a, ll = r["admit_ms"], r["libsvm_ms"]
        fs = f"{r['first_step_ms']['median']:.1f}" if r["first_step_ms"] else "-"
        lines.append(
            f"{r['kind']:6}{r['n']:>7}{r['threads']:>8} {a['median']:>11.4g} [{a['q25']:.4g}, {a['q75']:.4g}]"
            f" {ll['median']:>11.4g} [{ll['q25']:.4g}, {ll['q75']:.4g}]{r['admit_over_libsvm']['median']:>10.2f}"
            f"{r['admit_over_libsvm_cpu']['median']:>7.2f}{r['kkt_gate']:>10.1e}{r['score_gap_gate_libsvm']:>9.1e}"
            f"{r['peak_traced_mb']:>9.1f}{r['support_kernel_mb']:>10.1f}{r['full_kernel_mb']:>8.0f}{fs:>12}")
    return "\n".join(lines)


def format_table(res: dict) -> str:
    lines = [f"certified solve vs libsvm (nu={NU}, sigma={SIGMA}, d={D}); load {res['load_before']} -> "
             f"{res['load_after']}; compiled SMO: {res['protocol']['compiled_smo']}",
             f"{'kind':6}{'n':>7}{'threads':>8} {'solve ms [IQR]':>25} {'libsvm ms [IQR]':>25}"
             f"{'lib/solve':>10}{'(cpu)':>9}"
             f"{'refit ms':>10}{'KKT solve':>11}{'KKT libsvm':>11}{'gap':>9}{'|S|':>5}{'|E|':>6}{'fb':>4}"]
    for r in res["runs"]:
        s, ll = r["solve_ms"], r["libsvm_ms"]
        rf = f"{r['refit_ms']['median']:.1f}" if r["refit_ms"] else "-"
        iqr_s = f"{s['median']:.4g} [{s['q25']:.4g}, {s['q75']:.4g}]"
        iqr_l = f"{ll['median']:.4g} [{ll['q25']:.4g}, {ll['q75']:.4g}]"
        lines.append(
            f"{r['kind']:6}{r['n']:>7}{r['threads']:>8} {iqr_s:>25} {iqr_l:>25}"
            f"{r['libsvm_over_solve']['median']:>10.2f}"
            f"{r['libsvm_over_solve_cpu']['median']:>9.2f}"
            f"{rf:>10}{r['kkt_solve']:>11.1e}{r['kkt_libsvm']:>11.1e}{r['score_gap_solve_libsvm']:>9.1e}"
            f"{r['counts']['margin']:>5}{r['counts']['error']:>6}{r['fallbacks']:>4}")
    for g in res.get("gate", []):
        lines.append(f"gate cold admit n={g['n']}: certified {g['certified_ms']['median']:.2f} ms, path "
                     f"{g['path_ms']['median']:.2f} ms (path/certified {g['path_over_certified']['median']:.2f})")
    for m in res.get("rss", []):
        lines.append(f"rss {m['kind']} n={m['n']}: {m['rss_before_solve_mb']:.0f} MB before the solve, peak "
                     f"{m['peak_rss_mb']:.0f} MB ({m['solve_s']:.2f} s, KKT {m['kkt']:.1e})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sv_core.bench.solve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="*", default=list(DEFAULT_SIZES), help="stay lengths")
    ap.add_argument("--kinds", nargs="*", default=["icu", "gauss"], choices=["icu", "gauss"])
    ap.add_argument("--threads", nargs="*", default=["default", "1"],
                    help="BLAS thread settings to run ('default' and/or integers; default both)")
    ap.add_argument("--reps", type=int, default=None,
                    help="interleaved repetitions per size (default 41 below n = 1000, 15 below 3000, then 7)")
    ap.add_argument("--refit-max", type=int, default=1000, help="also time the refit up to this n")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gate", type=int, nargs="*", default=None,
                    help="also time a cold Gate.admit at these sizes (certified vs one by one)")
    ap.add_argument("--rss", action="store_true", help="also measure peak RSS per size in a subprocess")
    ap.add_argument("--admit", action="store_true",
                    help="time Gate(C, sigma).admit(X) against libsvm instead of the bare solve")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    res: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__},
        "protocol": {"nu": NU, "sigma": SIGMA, "d": D, "seed": args.seed, "reps": args.reps, "interleaved": True,
                     "libsvm_tol": 1e-8, "compiled_smo": fast_smo_available()},
        "load_before": [round(v, 2) for v in os.getloadavg()], "runs": [], "admit": []}
    t0 = time.perf_counter()
    for thr in args.threads:
        pin = contextlib.nullcontext() if thr == "default" else threadpool_limits(int(thr))
        with pin:
            for n in args.n:
                for kind in args.kinds:
                    reps = args.reps or (41 if n < 1000 else 15 if n < 3000 else 7)
                    if args.admit:
                        r = bench_admit(kind, n, reps, args.seed)
                    else:
                        r = bench_one(kind, n, reps, args.seed, args.refit_max)
                    r["reps"] = reps
                    r["threads"] = thr
                    res["admit" if args.admit else "runs"].append(r)
                    print(f"{kind} n={n} threads={thr} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                          flush=True)
    if args.gate:
        res["gate"] = [bench_gate(n, args.reps or 41, args.seed) for n in args.gate]
    if args.rss:
        res["rss"] = [bench_rss(kind, n, args.seed) for n in args.n for kind in args.kinds]
    res["load_after"] = [round(v, 2) for v in os.getloadavg()]
    res["runtime_s"] = time.perf_counter() - t0
    print(format_admit_table(res) if args.admit else format_table(res))
    if args.json_out:
        print(f"wrote {write_json(args.json_out, res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
