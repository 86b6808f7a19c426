"""Streaming benchmark: StreamingGate vs a plain Gate vs libsvm re-solves, token by token, on an ICU-like stream.

``python -m sv_core.bench.stream [--sizes 1000,10000,100000] [--threads both] [--quick] [--json PATH]``;
``--table FILE … [--write-docs docs/STREAMING.md]`` prints the tables of saved results (and writes them
between the ``bench_stream`` markers of a document; :mod:`sv_core.bench.stream_tables`).

An ICU-like drifting stream (:func:`icu_stream`) is admitted one token at a time into a
:class:`StreamingGate`; at each size the next ``--window`` tokens are timed interleaved for three
ways of keeping the exact full-history memory, the StreamingGate's time is split into its parts,
and its exactness is checked against an independent refit. The protocol: :func:`run`; the
results: docs/STREAMING.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np

from sv_core.bench.stream_tables import DocsBlockError, docs_text, thread_settings, write_docs
from sv_core.calibrate import calibrate_C
from sv_core.gate import Gate
from sv_core.jsonfile import write_json
from sv_core.kernels import rbf_kernel
from sv_core.refit import refit
from sv_core.streaming import StreamingGate
from sv_core.streaming.profile import CostProfile, hot_shape, parts_per_token

EVICT_EVERY = 24
_LIBSVM_CPU: list[float] = []  # process CPU seconds of the libsvm solves, in call order


def icu_stream(n: int, d: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Drifting, autocorrelated stream with rare far excursions; returns (X, is_excursion)."""
    rng = np.random.default_rng(seed)
    drift = np.cumsum(rng.normal(scale=0.012, size=(n, d)), axis=0)
    t = np.arange(n)[:, None]
    circ = 0.4 * np.sin(2 * np.pi * t / 24.0 + rng.uniform(0, 2 * np.pi, size=(1, d)))
    phi = 0.8
    e = np.zeros((n, d))
    eps = rng.normal(size=(n, d)) * np.sqrt(1 - phi**2)
    for i in range(1, n):
        e[i] = phi * e[i - 1] + eps[i]
    exc = np.zeros((n, d))
    flag = np.zeros(n, bool)
    i = 0
    while i < n:
        if rng.random() < 1.0 / 1500.0:
            L = int(rng.integers(3, 9))
            u = rng.normal(size=d)
            exc[i:i + L] = 5.0 * u / np.linalg.norm(u)
            flag[i:i + L] = True
            i += L
        else:
            i += 1
    return drift + circ + 0.8 * e + exc, flag


def _threads(n: int | None):
    if n is None:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=n)


def _stats(ts) -> dict[str, Any]:
    a = np.asarray(ts, dtype=np.float64) * 1e3
    if a.size == 0:
        return {"n": 0}
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {"n": int(a.size), "median_ms": float(med), "p25_ms": float(q1), "p75_ms": float(q3),
            "mean_ms": float(a.mean()), "max_ms": float(a.max())}


def _libsvm_fit(X: np.ndarray, C: float, sigma: float):
    from sklearn.svm import OneClassSVM

    n = X.shape[0]
    nu = 1.0 / (n * C)
    c, t = time.process_time(), time.perf_counter()
    m = OneClassSVM(nu=nu, gamma=1.0 / sigma**2, tol=1e-8, cache_size=1000).fit(X)
    dt = time.perf_counter() - t
    _LIBSVM_CPU.append(time.process_time() - c)
    a = np.zeros(n)
    a[m.support_] = m.dual_coef_[0] / (nu * n)
    return a, dt


def _sg_step(sg: StreamingGate, x: np.ndarray, t_index: int, cpu: list | None = None) -> float:
    c, t = time.process_time(), time.perf_counter()
    sg.admit(x)
    if (t_index + 1) % EVICT_EVERY == 0:
        sg.evict_reserve()
    dt = time.perf_counter() - t
    if cpu is not None:
        cpu.append(time.process_time() - c)
    return dt


def _exactness(sg: StreamingGate, sample: int, seed: int) -> dict[str, Any]:
    """Independent refit over hot + all (or ``sample``) cold keys vs the streaming gate."""
    rng = np.random.default_rng(seed)
    ids, keys = sg.ids, sg.keys
    hot = np.isin(ids, sg.hot_ids)
    cold = np.flatnonzero(~hot)
    pick_c = cold if cold.size <= sample else np.sort(rng.choice(cold, sample, replace=False))
    pick = np.sort(np.concatenate([np.flatnonzero(hot), pick_c]))
    t = time.perf_counter()
    a, rho = refit(keys[pick], C=sg.C, sigma=sg.sigma)
    t_refit = time.perf_counter() - t
    others = np.setdiff1d(cold, pick_c)
    others = others if others.size <= 2000 else rng.choice(others, 2000, replace=False)
    P = np.vstack([keys[pick], keys[others], keys[rng.choice(keys.shape[0], 300)]
                   + 0.1 * rng.normal(size=(300, keys.shape[1]))])
    dev = np.abs(sg.score(P) - (2.0 * rbf_kernel(P, keys[pick], sg.sigma) @ a - rho))
    t = time.perf_counter()
    cert = sg.certificate(exact=True)
    return {"refit_keys": int(pick.size), "refit_hot": int(hot.sum()), "refit_cold": int(pick_c.size),
            "refit_s": t_refit, "n_probes": int(P.shape[0]),
            "score_dev_median": float(np.median(dev)), "score_dev_max": float(dev.max()),
            "alpha_dev_hot_max": float(np.abs(sg.alpha[pick] - a).max()),
            "certificate_s": time.perf_counter() - t, "future_safe": cert["future_safe"],
            "kkt_residual_full_history": cert["kkt_residual"]["max"]}


def _window(sg, plain, X, lo: int, w: int, blocks, libsvm_at: set[int], C, sigma, log) -> dict:
    """Interleaved timing of tokens X[lo:lo+w]; ``blocks`` = thread settings, one per block."""
    per: dict[str, dict[str, list[float]]] = {}
    lib: list[float] = []
    lib_cpu: list[float] = []
    bl = max(1, w // len(blocks))
    st0 = dict(sg.stats)
    prof = CostProfile(sg)
    for k in range(w):
        thr = blocks[min(k // bl, len(blocks) - 1)]
        name = "default" if thr is None else f"{thr}"
        rec = per.setdefault(name, {"streaming": [], "plain_gate": [], "streaming_cpu": [], "plain_gate_cpu": []})
        i = lo + k
        with _threads(thr):
            rec["streaming"].append(_sg_step(sg, X[i], i, rec["streaming_cpu"]))
            prof.refresh()
            if plain is not None:
                c, t = time.process_time(), time.perf_counter()
                plain.admit(X[i])
                rec["plain_gate"].append(time.perf_counter() - t)
                rec["plain_gate_cpu"].append(time.process_time() - c)
        if k in libsvm_at:
            _, dt = _libsvm_fit(X[:i + 1], C, sigma)
            lib.append(dt)
            lib_cpu.append(_LIBSVM_CPU[-1])
            log(f"    libsvm re-solve at {i + 1} live tokens: {dt:.2f} s")
    prof.detach()
    out: dict[str, Any] = {name: {peer: _stats(v) for peer, v in rec.items()} for name, rec in per.items()}
    out["streaming_parts_ms"] = parts_per_token(prof.totals, w)
    out["libsvm_s"] = lib
    out["libsvm_cpu_s"] = lib_cpu
    out["libsvm"] = _stats(lib)
    d = {k: sg.stats[k] - st0.get(k, 0) for k in sg.stats}
    out["streaming_work"] = {"tokens": w, "admitted_cold_fraction": d["admitted_cold"] / w,
                             "exact_checks_per_token": d["exact_checks"] / w, "readmissions": d["readmissions"],
                             "hot_admissions_per_token": 1.0 - d["admitted_cold"] / w,
                             "cold_fraction_rechecked_per_token": d["exact_checks"] / w / max(sg.n_cold, 1),
                             "n_hot_end": sg.n_hot, "n_cold_end": sg.n_cold, **hot_shape(sg)}
    return out


def run(sizes=(1000, 10_000, 100_000), window: int = 200, stream_max: int = 10_000, plain_max: int = 10_000,
        libsvm_steps: int = 3, threads: str = "both", refit_sample: int = 1500, warmup: int = 48,
        seed: int = 0, stream: str = "icu", log=print) -> dict:
    """The benchmark; returns the result dict (``--json``).

    The stream (d = 6: slow random-walk drift + circadian term + AR(1) noise, rare far excursion
    episodes) is admitted into a :class:`StreamingGate` (C = calibrate_C(0.3, 120), sigma = 1.5) with
    ``evict_reserve`` every 24 tokens. At each size N the next ``window`` tokens are timed
    *interleaved*, token by token:

    * ``streaming`` -- the StreamingGate (admission + its share of the eviction every 24 tokens);
    * ``plain_gate`` -- a plain :class:`Gate` holding every live token (built at N from the
      streaming gate's solution with :meth:`Gate.from_solution`, then admitting the same tokens);
      not run above ``plain_max`` live tokens (its Gram matrix is n^2 floats);
    * ``libsvm`` -- scikit-learn's ``OneClassSVM(nu=1/(nC), gamma=1/sigma^2, tol=1e-8)`` re-solved
      on the whole live history at sampled steps (``libsvm_steps`` per size; one thread).

    The window alternates blocks with default BLAS threads and with one thread (threadpoolctl); the
    untimed streaming that reaches each size runs on one thread. In every timed window
    :class:`sv_core.streaming.profile.CostProfile` splits the StreamingGate's time into parts (hot C&P
    solve, exact cold gradients, screening bound and scan, undo copy, other), recorded with the hot,
    support and margin sizes and the cold keys re-checked per token; the streamed part records the
    same per 1,000 tokens. ``stream="gauss"`` replaces the ICU-like stream by a stationary standard
    normal one (a control: the support still grows). libsvm times are kept as wall and process CPU.
    Sizes up to ``stream_max`` are reached by streaming every token; larger sizes start from the
    full-history solution at N (libsvm, polished by :meth:`StreamingGate.from_solution`, whose
    re-admission check repairs any key libsvm got wrong) and stream ``warmup`` untimed tokens first;
    at the largest streamed size the same warm start is timed too, as a check that it is
    representative.

    Exactness at every size: the independent :func:`sv_core.refit` over the hot tier plus all cold
    keys (or ``refit_sample`` of them) must give the same gate scores at the refit keys, other cold
    keys and jittered probes (median and worst |difference|), and the full-history certificate
    (every cold gradient exact) is recomputed. Machine load (``os.getloadavg``) is recorded per size.
    """
    C, sigma, d = calibrate_C(nu=0.3, n0=120), 1.5, 6
    sizes = sorted(int(s) for s in sizes)
    blocks = {"both": [None, 1, None, 1], "default": [None], "1": [1]}[threads]
    n_total = max(sizes) + window + warmup + 8
    X, flag = icu_stream(n_total, d=d, seed=seed)
    if stream == "gauss":  # control: stationary, no drift, no excursions
        X, flag = np.random.default_rng(seed).standard_normal((n_total, d)), np.zeros(n_total, bool)
    sg = StreamingGate(C=C, sigma=sigma)
    block_t: list[dict[str, Any]] = []
    t_stream, pos = [], 0
    cpu_stream: list[float] = []
    rows = []
    t_start = time.perf_counter()
    for N in sizes:
        row: dict[str, Any] = {"tokens": N, "load_before": os.getloadavg()}
        if N <= stream_max:
            prof, last = CostProfile(sg), None
            with _threads(1):  # reaching N is set-up: one BLAS thread (steady on a shared machine)
                while pos < N:
                    t_stream.append(_sg_step(sg, X[pos], pos, cpu_stream))
                    prof.refresh()
                    pos += 1
                    if pos % 1000 == 0:
                        blk = np.asarray(t_stream[-1000:]) * 1e3
                        now = prof.snapshot()
                        prev: dict[str, float] = last or {}
                        parts = parts_per_token({k: v - prev.get(k, 0.0) for k, v in now.items()}, 1000)
                        last = now
                        block_t.append({"tokens": pos, "mean_ms": float(blk.mean()), "median_ms": float(np.median(blk)),
                                        "cpu_mean_ms": float(1e3 * np.mean(cpu_stream[-1000:])),
                                        "n_hot": sg.n_hot, "n_cold": sg.n_cold, "parts_ms": parts, **hot_shape(sg)})
                        log(f"  streamed {pos}: mean {blk.mean():.3f} ms/token (median {np.median(blk):.3f}), "
                            f"hot {sg.n_hot} (support {block_t[-1]['n_support']}), cold {sg.n_cold}; ms/token "
                            + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
            prof.detach()
            gate, lo, how = sg, pos, "streamed"
        else:
            a, dt = _libsvm_fit(X[:N], C, sigma)
            log(f"  libsvm full-history solve at {N}: {dt:.1f} s")
            row["libsvm_solve_for_warm_start_s"] = dt
            row["libsvm_solve_for_warm_start_cpu_s"] = _LIBSVM_CPU[-1]
            t = time.perf_counter()
            gate = StreamingGate.from_solution(X[:N], a, C, sigma)
            row["warm_start_build_s"] = time.perf_counter() - t
            row["warm_start_readmissions"] = gate.stats["readmissions"]
            for i in range(N, N + warmup):
                _sg_step(gate, X[i], i)
            lo, how = N + warmup, f"warm start (from_solution) + {warmup} untimed tokens"
        row.update(how=how, n_live=gate.n, n_hot=gate.n_hot, n_cold=gate.n_cold)
        log(f"[{N}] {how}: live {gate.n}, hot {gate.n_hot}, cold {gate.n_cold}")
        if refit_sample >= 0:
            row["exactness"] = e = _exactness(gate, refit_sample, seed + N)
            log(f"    refit over {e['refit_keys']} keys ({e['refit_s']:.1f} s): score dev median "
                f"{e['score_dev_median']:.2e}, worst {e['score_dev_max']:.2e}; full-history KKT "
                f"{e['kkt_residual_full_history']:.2e}")
        else:  # no refit: the recomputed full-history certificate only
            cert = gate.certificate(exact=True)
            row["exactness"] = e = {"refit_keys": 0, "score_dev_median": None, "score_dev_max": None,
                                    "future_safe": cert["future_safe"],
                                    "kkt_residual_full_history": cert["kkt_residual"]["max"]}
            log(f"    no refit; full-history KKT {e['kkt_residual_full_history']:.2e}")
        plain = None
        if gate.n <= plain_max:
            t = time.perf_counter()
            plain = Gate.from_solution(gate.keys, gate.alpha, C, sigma)
            row["plain_gate_build_s"] = time.perf_counter() - t
        else:
            row["plain_gate"] = f"not run: a plain Gate over {gate.n} tokens needs an n^2 Gram matrix " \
                                f"({gate.n ** 2 * 8 / 2**30:.0f} GiB)"
        steps = set(np.linspace(0, window - 1, libsvm_steps).astype(int).tolist()) if libsvm_steps else set()
        if how != "streamed" and steps:  # the warm start's libsvm solve is a re-solve at N: count it
            steps = set(sorted(steps)[1:])
        row["window"] = _window(gate, plain, X, lo, window, blocks, steps, C, sigma, log)
        if how != "streamed" and libsvm_steps:
            row["window"]["libsvm_s"].insert(0, row["libsvm_solve_for_warm_start_s"])
            row["window"]["libsvm_cpu_s"].insert(0, row["libsvm_solve_for_warm_start_cpu_s"])
            row["window"]["libsvm"] = _stats(row["window"]["libsvm_s"])
        del plain
        if how == "streamed":
            pos = lo + window
            if N == max(s for s in sizes if s <= stream_max) and any(s > stream_max for s in sizes):
                row["warm_start_check"] = _warm_check(X, N, lo + window, window, C, sigma, warmup, log)
        row["load_after"] = os.getloadavg()
        rows.append(row)
        _log_row(row, log)
    return {"config": {"sizes": sizes, "window": window, "stream_max": stream_max, "plain_max": plain_max,
                       "libsvm_steps": libsvm_steps, "threads": threads, "refit_sample": refit_sample,
                       "warmup": warmup, "evict_every": EVICT_EVERY, "C": C, "nu": 0.3, "n0": 120,
                       "sigma": sigma, "d": d, "seed": seed, "stream": stream, "parts_clock": "cpu",
                       "libsvm": "OneClassSVM(nu=1/(nC), gamma=1/sigma^2, tol=1e-8, cache_size=1000)"},
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "stream_blocks": block_t, "sizes": rows, "excursion_tokens": int(flag.sum()),
            "wall_s": time.perf_counter() - t_start}


def _warm_check(X, N, lo, w, C, sigma, warmup, log) -> dict:
    """Per-token cost of a warm-started gate at N, to compare with the streamed one."""
    a, _ = _libsvm_fit(X[:N], C, sigma)
    g = StreamingGate.from_solution(X[:N], a, C, sigma)
    for i in range(N, N + warmup):
        _sg_step(g, X[i], i)
    ts = [_sg_step(g, X[i], i) for i in range(N + warmup, N + warmup + w)]
    out = {"tokens": N, "streaming": _stats(ts)}
    log(f"    warm-start check at {N}: mean {out['streaming']['mean_ms']:.3f} ms/token")
    return out


def _log_row(row, log) -> None:
    w = row["window"]
    for name in thread_settings(w):
        s = w[name]["streaming"]
        p = w[name].get("plain_gate", {"n": 0})
        log(f"    threads {name:>7}: streaming mean {s['mean_ms']:.3f} ms (median {s['median_ms']:.3f}, "
            f"IQR {s['p25_ms']:.3f}-{s['p75_ms']:.3f}; CPU mean {w[name]['streaming_cpu']['mean_ms']:.3f})"
            + (f" | plain mean {p['mean_ms']:.3f} ms (median {p['median_ms']:.3f}; CPU mean "
               f"{w[name]['plain_gate_cpu']['mean_ms']:.3f})" if p.get("n") else ""))
    log(f"    work: {w['streaming_work']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sv_core.bench.stream",
                                 description=__doc__.splitlines()[0].replace("``", ""))
    ap.add_argument("--sizes", default=None, help="comma-separated stream sizes (default 1000,10000,100000)")
    ap.add_argument("--window", type=int, default=None, help="timed tokens per size (default 200)")
    ap.add_argument("--stream-max", type=int, default=10_000, help="largest size reached by streaming every token")
    ap.add_argument("--plain-max", type=int, default=10_000, help="largest live size for the plain Gate")
    ap.add_argument("--libsvm-steps", type=int, default=3, help="libsvm re-solves timed per size")
    ap.add_argument("--threads", choices=("both", "default", "1"), default="both")
    ap.add_argument("--refit-sample", type=int, default=1500,
                    help="cold keys in the exactness refit (negative: no refit, the recomputed certificate only)")
    ap.add_argument("--warmup", type=int, default=48, help="untimed tokens after a warm start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stream", choices=("icu", "gauss"), default="icu",
                    help="icu: the drifting ICU-like stream; gauss: a stationary standard normal control")
    ap.add_argument("--quick", action="store_true", help="sizes 1000,2000 with a 96-token window (a quick check)")
    ap.add_argument("--json", default=None, help="write the result here (e.g. runs/bench_stream/bench.json)")
    ap.add_argument("--table", nargs="+", default=None, metavar="JSON",
                    help="only print the markdown tables of these result files")
    ap.add_argument("--write-docs", default=None, metavar="FILE",
                    help="with --table: replace the text between <!-- bench_stream:begin --> and "
                         "<!-- bench_stream:end --> in FILE (e.g. docs/STREAMING.md) by the tables")
    a = ap.parse_args(argv)
    if a.table:
        res = []
        for path in a.table:
            with open(path) as f:
                res.append(json.load(f))
        text = docs_text(*res)
        print(text)
        if a.write_docs:
            try:
                write_docs(a.write_docs, text)
            except DocsBlockError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        return 0
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else ([1000, 2000] if a.quick else [1000, 10_000, 100_000])
    window = a.window or (96 if a.quick else 200)
    one = run(sizes=sizes, window=window, stream_max=a.stream_max, plain_max=a.plain_max,
              libsvm_steps=a.libsvm_steps, threads=a.threads, refit_sample=a.refit_sample, warmup=a.warmup,
              seed=a.seed, stream=a.stream)
    print(docs_text(one))
    if a.json:
        write_json(a.json, one, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
