"""Command line of the synthetic MIMIC-IV generator (:mod:`cohort.synthetic.gen`).

Command line::

    python -m cohort.synthetic --out DIR --stays N --seed S [--rows R] [--format csv.gz|parquet]
        [--workers W] [--chunk-stays C] [--vitals-only] [--params FILE] [--short-stay-share F]
    python -m cohort.synthetic --calibrate [--demo-root DIR] [--params-out FILE]
    python -m cohort.synthetic --fidelity [--stays N] [--seed S] [--json PATH]

The generator (:func:`generate`, :func:`make_small_warehouse`) lives in
:mod:`cohort.synthetic.gen` and is re-exported here; the model it draws from in
:mod:`cohort.synthetic.model`, its calibration to the real demo in
:mod:`cohort.synthetic.calibration`, the fidelity check in :mod:`cohort.fidelity`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cohort.errors import BadParameterError, DemoDataMissing
from cohort.fidelity import run_fidelity
from cohort.synthetic.calibration import calibrate
from cohort.synthetic.gen import CHUNK_STAYS, GenerateSummary, generate, make_small_warehouse
from cohort.synthetic.model import DEFAULT_PARAMS

__all__ = ["CHUNK_STAYS", "GenerateSummary", "generate", "main", "make_small_warehouse"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cohort.synthetic", description="Synthetic MIMIC-IV native layout.")
    p.add_argument("--out", default=None, help="output folder (required unless --calibrate/--fidelity)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--stays", type=int,
                   help="number of ICU stays to generate (only those of 48 h or more enter the cohort)")
    g.add_argument("--rows", type=int, help="generate chunks of stays until chartevents has ≥ this many rows")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed: same seed, same files, whatever --workers (default 0)")
    p.add_argument("--format", choices=["csv.gz", "parquet"], default="csv.gz")
    p.add_argument("--workers", type=int, default=None, help="generating processes (default: every core)")
    p.add_argument("--chunk-stays", type=int, default=CHUNK_STAYS, help="stays per chunk (part of the seed)")
    p.add_argument("--vitals-only", action="store_true", help="write the vital itemids' rows only")
    p.add_argument("--params", default=None, help=f"calibration JSON (default {DEFAULT_PARAMS.name})")
    p.add_argument("--short-stay-share", type=float, default=None,
                   help="share of stays under 48 h (default: calibrated)")
    p.add_argument("--calibrate", action="store_true", help="estimate the parameters from the real demo and write them")
    p.add_argument("--demo-root", default=None, help="demo CLIF folder (default: cohort.demo_data's cache)")
    p.add_argument("--params-out", default=None, help=f"--calibrate: output JSON (default {DEFAULT_PARAMS})")
    p.add_argument("--fidelity", action="store_true", help="print the synthetic-vs-demo fidelity table")
    p.add_argument("--json", default=None, help="--fidelity: also write the table as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    a = p.parse_args(argv)
    if a.calibrate:
        try:
            out = Path(a.params_out) if a.params_out else DEFAULT_PARAMS
            prm = calibrate(a.demo_root, out)
        except DemoDataMissing as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"params": str(out), "calibrated_from": prm["calibrated_from"], "n_stays": prm["n_stays"],
                          "n_hours": prm["n_hours"]}))
        return 0
    if a.fidelity:
        return run_fidelity(stays=a.stays or 1500, seed=a.seed, params=a.params, demo_root=a.demo_root,
                            json_path=a.json, short_stay_share=a.short_stay_share)
    if a.out is None or (a.stays is None) == (a.rows is None):
        p.error("give --out and exactly one of --stays/--rows (or --calibrate, or --fidelity)")
    try:
        s = generate(a.out, stays=a.stays, seed=a.seed, target_rows=a.rows, fmt=a.format, progress=not a.quiet,
                     params=a.params, short_stay_share=a.short_stay_share, workers=a.workers,
                     chunk_stays=a.chunk_stays, non_vital=not a.vitals_only)
    except BadParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(s.out_dir), "stays": s.n_stays, "chartevents_rows": s.n_chartevents,
                      "vital_rows": s.n_vital_rows, "seconds": round(s.seconds, 2), "workers": s.workers,
                      "rows_per_s": round(s.n_chartevents / max(s.seconds, 1e-9)),
                      "cpu_seconds": round(s.cpu_seconds, 2), "peak_rss_mb": s.peak_rss_mb, "format": s.fmt}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
