"""Peak memory of one stay's retention work at the full cohort's longest stay (issue 36).

``python -m pipelines.bench.stay_memory [--hours N] [--against DIR] [--json OUT]`` computes, in a
fresh process, what a retention chunk computes for one stay (:func:`evaluation.clinical.retention.stay_retention`
with the study's default policies and the gate built: the certified solve, the density and peer
scores, ``Gate.from_solution`` and its score) on ICU-like keys of ``N`` hours (default: the
longest eligible stay of the full-size root, :func:`pipelines.bench.makespan.full_workload`), and
reports the process's peak resident memory above what it held before (``VmHWM``), in MB and in
bytes per hour² (the unit of :data:`pipelines.runtime.chunk_memory.STAY_BYTES_PER_HOUR2`).
``--against DIR`` runs the same child on another checkout's code first (e.g. the main branch),
so the two peaks sit side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from sv_core.jsonfile import write_json

PROJECT = Path(__file__).resolve().parents[2]

# the child: keys made before the baseline is read; VmHWM reset (clear_refs 5) so it measures the stay
_CHILD = """
import json, sys, time
import numpy as np
from evaluation.clinical.retention import DEFAULT_POLICIES, build_policies, stay_retention
from sv_core.bench.solve import icu_like_keys

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith(("VmHWM:", "VmRSS:")):
            yield line.split()[0], int(line.split()[1]) * 1024

n = int(sys.argv[1])
X = icu_like_keys(n, np.random.default_rng(0))
ev = np.zeros(n, dtype=bool); ev[:: 7] = True
built = build_policies(list(DEFAULT_POLICIES), nu=0.3, sigma=3.0)
stay_retention(X[:200], ev[:200], built, build_gate=True)  # imports and first-call allocations
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")
base = dict(hwm())["VmRSS:"]
t = time.perf_counter()
r = stay_retention(X, ev, built, build_gate=True)
secs = time.perf_counter() - t
print(json.dumps({"n": n, "base": base, "peak": dict(hwm())["VmHWM:"], "seconds": secs,
                  "gate_built": "gate" in r, "retention": {k: float(v) for k, v in r["retention"].items()}}))
"""


def measure(hours: int, code: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(hours)], capture_output=True, text=True, env=env,
                         cwd=str(code), check=True).stdout.strip().splitlines()[-1]
    r = json.loads(out)
    above = r["peak"] - r["base"]
    return {"hours": hours, "peak_above_start_mb": above / 2**20, "bytes_per_hour2": above / hours**2,
            "seconds": r["seconds"], "retention": r["retention"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.bench.stay_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=int, default=None, help="stay length (default: the full cohort's longest)")
    ap.add_argument("--against", default=None, metavar="DIR", help="also measure this checkout's code (first)")
    ap.add_argument("--json", default=None, metavar="OUT")
    a = ap.parse_args(argv)
    if not Path("/proc/self/clear_refs").exists():
        ap.error("needs Linux /proc (VmHWM and clear_refs)")
    hours = a.hours
    if hours is None:
        from pipelines.bench.makespan import full_workload

        w = full_workload()
        hours = max(w["hours"].values())
    load = [round(x, 2) for x in os.getloadavg()]
    rows = []
    if a.against:
        rows.append({"code": "against", **measure(hours, Path(a.against).resolve())})
    rows.append({"code": "this checkout", **measure(hours, PROJECT)})
    res = {"kind": "stay_memory", "hours": hours, "rows": rows, "load_before": load,
           "load_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
           "python": platform.python_version(),
           "same_retention": len({json.dumps(r["retention"], sort_keys=True) for r in rows}) == 1}
    for r in rows:
        print(f"{r['code']}: {hours:,} h stay, peak {r['peak_above_start_mb']:.0f} MB above start "
              f"({r['bytes_per_hour2']:.1f} bytes/hour²), {r['seconds']:.1f} s")
    print(f"same retention figures: {res['same_retention']}; load {res['load_before']} -> {res['load_after']}")
    if a.json:
        write_json(a.json, res, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
