"""``forgetful bench-delete``: deletion latency (maintained decrement vs same-C refit) as a study.

Wraps :func:`sv_core.bench.delete.bench_one` (one Prefect task per context size, run one after
another so timings do not compete for cores) and writes the ``deletion_latency`` study result
for the report. Speed is measured here, never asserted.
"""
from __future__ import annotations

import platform
import time

from prefect import flow, task

from dashboards.seed_figures import seed_field, seed_line
from pipelines import jsonout
from pipelines.runtime import runner

#: the sizes of ``python -m sv_core.bench.delete`` (kept literal: --help must not import sv_core)
DEFAULT_SIZES = (64, 120, 256, 512, 1024, 2048)



@task(name="bench-delete-size")
def bench_size(n: int, deletions: int, seed: int) -> dict:
    from sv_core.bench.delete import bench_one

    return bench_one(n, deletions, seed=seed)


def _null_nan(x):
    """A peer that did not run (e.g. OSQP not installed) is null in the result, never NaN."""
    if isinstance(x, dict):
        return {k: _null_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_null_nan(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    return x


@flow(name="deletion-latency", log_prints=True)
def bench_delete_flow(sizes: tuple[int, ...] = DEFAULT_SIZES, deletions: int = 30, seed: int = 0,
                      runs_dir: str = "runs") -> dict:
    t0 = time.perf_counter()
    per = [bench_size(n, deletions, seed) for n in sizes]  # sequential on purpose: clean timings
    rows = []
    for s in per:
        act = s["active"]
        iqr = act.get("decrement_ms_iqr") or [None, None]
        rows.append([s["n"], act.get("decrement_ms_median"), iqr[0], iqr[1], s["reserve"].get("decrement_ms_median"),
                     s["admission"].get("median"), act["sklearn_ms_median"], act["sklearn_over_decrement_median"],
                     act["refit_ms_median"], act["refit_over_decrement_median"], act.get("osqp_ms_median"),
                     act.get("osqp_over_decrement_median"), act.get("reference_ms_median"),
                     act.get("reference_over_decrement_median"), s["fallbacks"]])
    fast = bool(per and per[0].get("fast_path"))
    result = {
        "study": "deletion_latency",
        "title": "Deletion latency: maintained C&P decrement vs refits and warm-started OSQP",
        "data": "synthetic",
        "runtime_s": time.perf_counter() - t0,
        "seed_figure": seed_field("deletion_latency"),
        "metrics": _null_nan({f"n{s['n']}": {**s["active"], "admission_ms_median": s["admission"].get("median"),
                                             "admission_over_active": s["admission"].get("over_active_decrement"),
                                             "reserve_ms_median": s["reserve"].get("decrement_ms_median"),
                                             "fallbacks": s["fallbacks"], "fast_path": s.get("fast_path")}
                              for s in per}),
        "tables": [{"title": (f"median ms per active deletion ({deletions} per n; peers timed on the same retained "
                              "keys right after each deletion, interleaved; × = peer / deletion, median of ratios; "
                              f"compiled fast path {'on' if fast else 'not built'}; the NumPy reference loop "
                              "deletes the same token in a twin gate)"),
                    "columns": ["n", "active deletion", "q25", "q75", "reserve deletion", "one-key admission",
                                "scikit-learn OCSVM", "× scikit-learn", "project refit", "× project refit",
                                "warm OSQP", "× warm OSQP", "NumPy reference loop", "× reference", "fallbacks"],
                    "rows": rows}],
        "figures": [{"kind": "line", "title": "median latency", "xlabel": "n", "ylabel": "ms", "log_y": True,
                     "series": [{"label": "active deletion", "x": [r[0] for r in rows],
                                 "y": [r[1] for r in rows], "style": "both"},
                                {"label": "refit (Clarabel + KKT polish)", "x": [r[0] for r in rows],
                                 "y": [r[8] for r in rows], "style": "both"},
                                {"label": "scikit-learn OneClassSVM", "x": [r[0] for r in rows],
                                 "y": [r[6] for r in rows], "style": "both"},
                                *([{"label": "warm-started OSQP", "x": [r[0] for r in rows],
                                    "y": [r[10] for r in rows], "style": "both"}]
                                  if all(isinstance(r[10], float) and r[10] == r[10] for r in rows) else [])]}],
        "config": {"sizes": list(sizes), "deletions": deletions, "d": 6, "nu": 0.4, "sigma": 2.0, "seed": seed,
                   "machine": platform.platform(), "processor": platform.processor()},
    }
    result = _null_nan(result)
    runner.write_study_result(result, runs_dir)
    return result


@runner.cli_errors
def _main(args) -> int:
    r = runner.run_cli_flow(bench_delete_flow, args, sizes=tuple(args.sizes), deletions=args.deletions,
                            seed=args.seed, runs_dir=args.runs)
    print(" | ".join(r["tables"][0]["columns"]))
    for row in r["tables"][0]["rows"]:
        print(" | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in row))
    print(seed_line("deletion_latency", r["data"]))
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("bench-delete", help="deletion latency: decrement vs same-C refit (study result)",
                       description=__doc__)
    p.add_argument("--sizes", type=int, nargs="*", default=list(DEFAULT_SIZES), metavar="N",
                   help=f"context sizes n to time (default: {' '.join(map(str, DEFAULT_SIZES))})")
    p.add_argument("--deletions", type=int, default=30, help="active deletions timed per size (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the contexts (default %(default)s)")
    runner.add_common_args(p, warehouse=False)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
