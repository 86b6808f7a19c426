"""Nightly-ingest benchmark: ``python -m pipelines.bench.ingest --stays 42000 --hours-per-day 24``.

Writes a generated MIMIC-layout root (``icu/icustays.parquet`` and one ``icu/chartevents_partNNN``
file per day, written directly with a small vectorised writer: every stay is live for the whole
benchmark, so each day brings ``stays × hours-per-day`` new hourly tokens), then runs, each in a
fresh child process (what a scheduled ``forgetful ingest`` is):

* ``init``: the streaming warehouse is created (frozen standardisation supplied, no batch build)
  and the history part (``--history-hours`` per stay) is ingested;
* ``day 1``, a ``nothing new`` run, ``day 2`` … ``day --days``, and a last ``nothing new`` run.

A share ``--late`` of each day's rows arrives one day late (in the next day's file): those are
late rows that re-open their stays. ``--other-rows`` non-vital chartevents rows per stay-hour
make the scan look like MIMIC's (most chartevents rows are not vital signs).

Each phase reports wall and CPU seconds (the child and its worker processes), peak RSS (the
child; its workers separately), start-up (imports) apart from the ingest body, stays touched,
tokens admitted, late rows, re-admissions and tokens/s. The result is written to
``runs/bench_ingest/<name>.json`` (not committed). ``--pythonpath`` runs the phases against
another checkout (e.g. the main branch, for a before/after comparison on the same root).
Benchmarks are commands, never timed asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dashboards.numbers import fixed, md_table, spread
from sv_core.jsonfile import write_json

T0 = np.datetime64("2150-01-01T00:00:00", "us")
#: (itemid, nominal mean, nominal sd) per vital, in the warehouse's VITALS order
ITEMS = {"hr": (220045, 85.0, 15.0), "sbp": (220179, 120.0, 18.0), "dbp": (220180, 65.0, 11.0),
         "rr": (220210, 19.0, 4.0), "spo2": (220277, 96.5, 2.0), "temp_c": (223762, 37.0, 0.5)}
OTHER_ITEMIDS = np.array([220739, 223900, 223901, 220048, 224650, 227969, 220046, 220047], np.int64)
STAY0, SUBJECT0, HADM0 = 30_000_000, 10_000_000, 20_000_000


# ------------------------------------------------------------------------ the generated root
class Layout:
    """Stays and their charting schedule (a deterministic function of ``stays`` and ``seed``).

    Stay i is admitted at ``T0 + s_i`` (s_i uniform in the first day) and stays beyond the last
    benchmark day. Window 0 (the history part) covers chart times in ``[T0, T0 + history_h
    + 24 h)``; day k covers the next ``hours_per_day`` hours."""

    def __init__(self, stays: int, seed: int, history_hours: int, hours_per_day: int, days: int):
        rng = np.random.default_rng([seed, 0])
        self.n, self.seed = stays, seed
        self.hpd, self.hist = hours_per_day, history_hours
        self.s = rng.integers(0, 86_400, stays).astype(np.int64)              # intime offset (s)
        horizon = 24 * 3600 + 3600 * (history_hours + hours_per_day * (days + 2))
        self.los = horizon + rng.integers(24 * 3600, 96 * 3600, stays).astype(np.int64)
        self.base = rng.normal(0.0, 0.5, (stays, len(ITEMS)))                 # per-stay offsets (sd units)
        self.phase = rng.uniform(0.0, 2 * np.pi, (stays, 1))

    def window(self, k: int) -> tuple[int, int]:
        """Chart-time window of part k, seconds since T0: [a, b)."""
        h0 = 24 * 3600 + 3600 * self.hist
        if k == 0:
            return 0, h0
        return h0 + 3600 * self.hpd * (k - 1), h0 + 3600 * self.hpd * k

    def stays_table(self):
        import pyarrow as pa

        i = np.arange(self.n, dtype=np.int64)
        intime = T0 + self.s.astype("timedelta64[s]")
        outtime = intime + self.los.astype("timedelta64[s]")
        return pa.table({"subject_id": pa.array(SUBJECT0 + i), "hadm_id": pa.array(HADM0 + i),
                         "stay_id": pa.array(STAY0 + i), "first_careunit": pa.array(np.full(self.n, "MICU")),
                         "last_careunit": pa.array(np.full(self.n, "MICU")),
                         "intime": pa.array(intime.astype("datetime64[us]")),
                         "outtime": pa.array(outtime.astype("datetime64[us]")),
                         "los": pa.array(self.los / 86_400.0)})

    def rows(self, k: int, late: float, other: int) -> dict[str, np.ndarray]:
        """Every chartevents row charted in window k: (stay index, seconds since T0, itemid,
        value), plus a boolean ``late`` (the row is delivered in the next part)."""
        a, b = self.window(k)
        rng = np.random.default_rng([self.seed, 1, k])
        lo = np.maximum((a - self.s) // 3600 - 1, 0)
        hi = np.maximum((b - self.s) // 3600 + 1, lo)
        m = hi - lo
        rep = np.repeat(np.arange(self.n), m)
        hour = lo[rep] + (np.arange(rep.size) - np.repeat(np.cumsum(m) - m, m))
        nv = len(ITEMS)
        mu = np.array([v[1] for v in ITEMS.values()])
        sd = np.array([v[2] for v in ITEMS.values()])
        circ = 0.3 * np.sin(2 * np.pi * hour[:, None] / 24.0 + self.phase[rep])
        exc = (rng.random((rep.size, 1)) < 0.01) * rng.normal(0.0, 3.0, (rep.size, nv))
        z = self.base[rep] + circ + rng.normal(0.0, 0.4, (rep.size, nv)) + exc
        val = mu + sd * z
        lim = np.array([(30, 220), (60, 220), (30, 140), (5, 50), (75, 100), (34, 41)], float)
        val = np.clip(val, lim[:, 0], lim[:, 1])
        t = self.s[rep, None] + 3600 * hour[:, None] + rng.integers(60, 3500, (rep.size, nv))
        keep = rng.random((rep.size, nv)) < 0.9
        sidx = np.broadcast_to(rep[:, None], (rep.size, nv))[keep]
        item = np.broadcast_to(np.array([v[0] for v in ITEMS.values()]), (rep.size, nv))[keep]
        t, val = t[keep], np.round(val[keep], 1)
        if other:
            orep = np.repeat(np.arange(rep.size), other)
            sidx = np.concatenate([sidx, rep[orep]])
            t = np.concatenate([t, self.s[rep[orep]] + 3600 * hour[orep] + rng.integers(0, 3600, orep.size)])
            item = np.concatenate([item, OTHER_ITEMIDS[rng.integers(0, OTHER_ITEMIDS.size, orep.size)]])
            val = np.concatenate([val, np.round(rng.normal(50.0, 20.0, orep.size), 1)])
        inside = (t >= a) & (t < b) & (t < self.s[sidx] + self.los[sidx])
        sidx, t, item, val = sidx[inside], t[inside], item[inside], val[inside]
        order = np.lexsort((item, t, sidx))
        sidx, t, item, val = sidx[order], t[order], item[order], val[order]
        is_late = rng.random(sidx.size) < late if k > 0 else np.zeros(sidx.size, bool)
        return {"sidx": sidx, "t": t, "itemid": item, "value": val, "late": is_late}

    def part(self, k: int, late: float, other: int):
        """The rows delivered in part k: window k's on-time rows and window k−1's late rows."""
        import pyarrow as pa

        cur = self.rows(k, late, other)
        sel = [(cur, ~cur["late"])]
        if k > 1:
            prev = self.rows(k - 1, late, other)
            sel.append((prev, prev["late"]))
        cols = {c: np.concatenate([r[c][m] for r, m in sel]) for c in ("sidx", "t", "itemid", "value")}
        sidx = cols["sidx"].astype(np.int64)
        return pa.table({"subject_id": pa.array(SUBJECT0 + sidx), "hadm_id": pa.array(HADM0 + sidx),
                         "stay_id": pa.array(STAY0 + sidx),
                         "charttime": pa.array(T0 + cols["t"].astype("timedelta64[s]").astype("timedelta64[us]")),
                         "itemid": pa.array(cols["itemid"].astype(np.int64)),
                         "valuenum": pa.array(cols["value"])})


def frozen_table() -> dict:
    """A supplied frozen standardisation (the generator's nominal moments)."""
    sd = np.sqrt(0.5 ** 2 + 0.3 ** 2 / 2 + 0.4 ** 2 + 0.01 * 9)
    return {v: {"mean": mu, "sd": s * sd, "median": mu} for v, (_, mu, s) in ITEMS.items()}


def write_parts(layout: Layout, parts_dir: Path, days: int, late: float, other: int) -> list[Path]:
    """``chartevents_part000`` (history) … ``chartevents_part{days:03d}`` into ``parts_dir``."""
    import pyarrow.parquet as pq

    parts_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(days + 1):
        p = parts_dir / f"chartevents_part{k:03d}.parquet"
        if not p.is_file():
            tmp = p.with_suffix(".tmp")
            pq.write_table(layout.part(k, late, other), tmp, row_group_size=1 << 20)
            os.replace(tmp, p)
        out.append(p)
    return out


# ------------------------------------------------------------------------ one phase (a child)
CHILD = r"""
import json, os, resource, sys, time
t_start = time.perf_counter()
def hwm_mb():
    # this process's own high-water mark: ru_maxrss also counts the pages of the parent it was
    # forked from (Linux keeps the larger of the two across exec), VmHWM belongs to this image
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
from pipelines.ingest import ingest
from pipelines.settings import IngestSettings
def runq_wait_s():  # seconds runnable but waiting for a CPU (inline: the other checkout may lack the helper)
    try:
        return int(open("/proc/self/schedstat").read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
t_imp = time.perf_counter() - t_start
a = json.loads(sys.argv[1])
c0 = os.times(); t0 = time.perf_counter(); q0 = runq_wait_s()
r = ingest(a["warehouse"], "mimic", a["root"], init=a["init"],
           settings=IngestSettings(frozen=a["frozen"], **a["extra"]))
wall = time.perf_counter() - t0; c1 = os.times(); runq = runq_wait_s() - q0
steps = r["steps"]
cpu = (c1.user - c0.user) + (c1.system - c0.system)
tm = [s.get("timing") or {} for s in steps]
out = {"wall_s": wall, "import_s": t_imp,
       "cpu_s": cpu,
       # where the main process's wall went: its CPU (all its threads), waiting for a CPU (other
       # load), waiting on the workers' results, and the rest (blocked: I/O, fsync, locks)
       "runq_s": runq, "wait_workers_s": sum(t.get("gates_s", 0.0) for t in tm),
       "commit_checkpoint_s": sum(t.get("commit_s", 0.0) + t.get("finish_s", 0.0) for t in tm)
       + r.get("phases", {}).get("checkpoint_s", 0.0),
       "worker_runq_s": sum(t.get("worker_runq_s", 0.0) for t in tm),
       "cpu_children_s": (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system),
       "peak_rss_mb": hwm_mb(),
       "peak_rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
       "steps": len(steps), "n_rows": sum(s["n_rows"] for s in steps),
       "n_usable": sum(s["n_usable"] for s in steps),
       "stays_touched": sum(s["stays_updated"] for s in steps),
       "new_tokens": sum(s["new_tokens"] for s in steps),
       "replaced_tokens": sum(s["replaced_tokens"] for s in steps),
       "late_rows": sum(s["late_rows"] for s in steps),
       "reopened_hours": sum(s["reopened_hours"] for s in steps),
       "readmissions_run": sum(s.get("readmissions", 0) for s in steps),
       "n_stays": r["n_stays"], "n_tokens": r["n_tokens"], "n_hot": r["n_hot"], "n_cold": r["n_cold"],
       "readmissions_total": r["readmissions"], "future_safe_stays": r["future_safe_stays"],
       "gated_stays": r["gated_stays"], "phases": r.get("phases", {}),
       "step_timing": [s.get("timing") for s in steps],
       "worker_cpu_s": sum((s.get("timing") or {}).get("worker_cpu_s", 0.0) for s in steps),
       "worker_peak_rss_mb": max([0.0] + [(s.get("timing") or {}).get("worker_peak_rss_mb", 0.0) for s in steps])}
print("BENCH " + json.dumps(out), flush=True)
"""


def run_phase(name: str, warehouse: Path, root: Path, pythonpath: str, init: bool = False,
              frozen: dict | None = None, extra: dict | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    arg = json.dumps({"warehouse": str(warehouse), "root": str(root), "init": init, "frozen": frozen,
                      "extra": extra or {}})
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, arg], env=env, capture_output=True, text=True,
                       cwd=pythonpath.split(os.pathsep)[0])  # "-c" puts the cwd first on sys.path
    total = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("BENCH ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"phase {name} failed (exit {p.returncode}): {p.stderr[-3000:]}")
    out = json.loads(lines[-1][6:])
    out.update(phase=name, process_s=total, cpu_total_s=out["cpu_s"] + out["cpu_children_s"] + out["worker_cpu_s"],
               tokens_per_s=out["new_tokens"] / out["wall_s"] if out["wall_s"] > 0 else None)
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ------------------------------------------------------------------------ the CLI comparison
def cli_compare(stays: int, work: Path, sides: dict[str, str], repeats: int, seed: int = 0) -> dict:
    """``forgetful ingest`` as a user runs it (a fresh process each, Prefect's API server included)
    on a generated ``stays``-stay MIMIC root: the first run (``--init``: frozen standardisation
    from a causal batch build, then every part file) and a run with nothing new, for each checkout
    in ``sides`` (name -> PYTHONPATH), interleaved (the order alternates between repeats)."""
    root = work / f"cli_root_{stays}_{seed}"
    if not (root / "icu").is_dir():
        subprocess.run([sys.executable, "-m", "cohort.synthetic", "--out", str(root), "--stays", str(stays),
                        "--seed", str(seed), "--format", "parquet", "--vitals-only", "--quiet"], check=True,
                       env=dict(os.environ, PYTHONPATH=next(iter(sides.values()))))
    runs = []
    for rep in range(repeats):
        order = list(sides) if rep % 2 == 0 else list(reversed(sides))
        for side in order:
            wh = work / f"cli_{side}_{stays}" / "stream.duckdb"
            shutil.rmtree(wh.parent, ignore_errors=True)
            wh.parent.mkdir(parents=True)
            env = dict(os.environ, PYTHONPATH=sides[side], PYTHONDONTWRITEBYTECODE="1")
            for run, extra in (("first", ["--init"]), ("nothing_new", [])):
                cmd = [sys.executable, "-m", "pipelines.cli", "ingest", "--source", "mimic", "--root", str(root),
                       "--warehouse", str(wh), *extra]
                t0 = time.perf_counter()
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=sides[side].split(os.pathsep)[0])
                wall = time.perf_counter() - t0
                if p.returncode != 0:
                    raise RuntimeError(f"{side} {run} failed (exit {p.returncode}): {p.stderr[-2000:]}")
                out = [ln for ln in p.stdout.splitlines() if ln.strip()]
                runs.append({"side": side, "run": run, "repeat": rep, "wall_s": wall, "load_after": _load(),
                             "stdout_lines": len(out), "last_line": out[-1][:300] if out else ""})
                print(f"{side:>8} {run:>12}: {wall:7.2f} s  load {runs[-1]['load_after'][0]}", flush=True)
    return {"kind": "cli", "stays": stays, "seed": seed, "sides": sides, "repeats": repeats, "runs": runs,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}


# ------------------------------------------------------------------------ markdown from result files
def _med(xs: list[float]) -> str:
    """Median (min–max) of repeated wall times; one run: its value."""
    if len(xs) == 1:
        return fixed(xs[0])
    return spread({"median": float(np.median(xs)), "min": min(xs), "max": max(xs)})


MIMIC_TOKENS = 42_000 * 24  #: a day's new hourly tokens at MIMIC scale (issue 21)


def _own_seconds(line: str) -> float | None:
    """The seconds the command reports for its ingest (its summary line, or an older JSON print)."""
    if line.startswith("{"):
        try:
            return float(json.loads(line)["seconds"])
        except (ValueError, KeyError, TypeError):
            return None
    tail = line.rsplit(";", 1)[-1].strip()
    return float(tail[:-2]) if tail.endswith(" s") and tail[:-2].replace(".", "", 1).isdigit() else None


def table(*results: dict) -> str:
    """Markdown tables of result files written by this command (phases and CLI comparisons)."""
    out = []
    for r in results:
        if r.get("kind") == "cli":
            out += [f"`forgetful ingest` on a generated {r['stays']}-stay root, {r['repeats']} interleaved repeats "
                    f"(wall seconds from process start to exit, median (min–max)):", ""]
            rows = []
            for side in r["sides"]:
                sel = {k: [x for x in r["runs"] if x["side"] == side and x["run"] == k]
                       for k in ("first", "nothing_new")}
                w = {k: [x["wall_s"] for x in v] for k, v in sel.items()}
                own = {k: [t for t in (_own_seconds(x["last_line"]) for x in v) if t is not None]
                       for k, v in sel.items()}
                ld = [x["load_after"][0] for x in r["runs"] if x["side"] == side]
                own_s = " / ".join(_med(own[k]) if own[k] else "–" for k in ("first", "nothing_new"))
                rows.append([f"{side} ({Path(r['sides'][side]).name})", _med(w["first"]), _med(w["nothing_new"]),
                             own_s, f"{fixed(min(ld))}–{fixed(max(ld))}"])
            out += md_table(["checkout", "first run (--init)", "nothing new",
                             "the ingest itself: first / nothing new", "load (1 min)"], rows)
            out.append("")
            continue
        c = r["config"]
        out += [f"{c['stays']:,} live stays, {c['hours_per_day']} new hours per stay a day, late share {c['late']:g}, "
                f"{r['machine']['cpus']} CPUs, load {r['machine']['load_start'][0]:.1f} at the start:", ""]
        out += md_table(["phase", "wall s", "CPU s (all processes)", "peak RSS MB (main / worker)", "stays touched",
                         "tokens admitted", "CPU ms / token", "tokens / s (wall)", "start-up s", "load after"],
                        [[p["phase"], fixed(p["wall_s"]), fixed(p["cpu_total_s"]),
                          f"{fixed(p['peak_rss_mb'], 0)} / {fixed(p['worker_peak_rss_mb'], 0)}", p["stays_touched"],
                          p["new_tokens"],
                          fixed(1e3 * p["cpu_total_s"] / p["new_tokens"], 3) if p["new_tokens"] else "–",
                          fixed(p["tokens_per_s"], 0) if p["new_tokens"] else "–", fixed(p["import_s"]),
                          fixed(p["load_after"][0])] for p in r["phases"]])
        out.append("")
        for p in r["phases"]:
            if not p["new_tokens"] or p["phase"] == "init":
                continue
            cpu, tok, st = p["cpu_total_s"], p["new_tokens"], max(p["stays_touched"], 1)
            line = (f"* {p['phase']}: {1e3 * cpu / tok:.3f} CPU ms per token, {1e3 * cpu / st:.1f} CPU ms per stay; "
                    f"on 2 idle cores between CPU/2 and CPU: {cpu / 2:.0f}–{cpu:.0f} s")
            if c["stays"] * c["hours_per_day"] != MIMIC_TOKENS:
                k = MIMIC_TOKENS / tok
                line += (f"; scaled to {MIMIC_TOKENS:,} tokens (42,000 stays × 24 h) at this per-token CPU: "
                         f"{k * cpu / 2:.0f}–{k * cpu:.0f} s")
            out.append(line)
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipelines.bench.ingest",
        description="Nightly-ingest benchmark. Writes a generated MIMIC-layout root (every stay live, one "
                    "chartevents part file per day) and runs the streaming ingest on it, each phase in a fresh "
                    "process: init with the history, day 1, a run with nothing new, the later days, and a last run "
                    "with nothing new; wall and CPU seconds, peak RSS, stays touched and tokens admitted per phase "
                    "go to a JSON result file. With --cli: the forgetful ingest command itself (first run, nothing "
                    "new) on a small generated root, this checkout against --pythonpath, interleaved. With --table: "
                    "the markdown tables of result files.")
    ap.add_argument("--stays", type=int, default=1000)
    ap.add_argument("--hours-per-day", type=int, default=24)
    ap.add_argument("--history-hours", type=int, default=48, help="history per stay before day 1 (about)")
    ap.add_argument("--days", type=int, default=5, help="days ingested after the history")
    ap.add_argument("--late", type=float, default=0.0005, help="share of a day's rows delivered a day late")
    ap.add_argument("--other-rows", type=int, default=0, help="non-vital chartevents rows per stay-hour")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/forgetful_bench_ingest"),
                    help="work folder (root, parts, warehouse)")
    ap.add_argument("--jobs", type=int, default=None, help="ingest worker processes (default: the ingest's own)")
    ap.add_argument("--pythonpath", default=None, help="checkout the phases run against (default: this one)")
    ap.add_argument("--label", default="", help="added to the result file name")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_ingest"))
    ap.add_argument("--cli", action="store_true",
                    help="instead: time forgetful ingest (first run, nothing new) on a generated --stays root, this "
                         "checkout against --pythonpath (if given), interleaved")
    ap.add_argument("--repeats", type=int, default=3, help="--cli: interleaved repeats")
    ap.add_argument("--table", nargs="+", type=Path, default=None, metavar="JSON",
                    help="only print the markdown tables of these result files")
    a = ap.parse_args(argv)
    if a.table:
        print(table(*(json.loads(p.read_text()) for p in a.table)))
        return 0
    here = str(Path(__file__).resolve().parents[2])
    pp = a.pythonpath or here
    if a.cli:
        sides = {"this": here, **({"other": a.pythonpath} if a.pythonpath else {})}
        res = cli_compare(a.stays, a.dir, sides, a.repeats, a.seed)
        a.out.mkdir(parents=True, exist_ok=True)
        f = a.out / f"bench_ingest_cli_{a.stays}{('_' + a.label) if a.label else ''}.json"
        write_json(f, res)
        print(f"wrote {f}")
        return 0
    lay = Layout(a.stays, a.seed, a.history_hours, a.hours_per_day, a.days)
    data = a.dir / f"data_{a.stays}_{a.hours_per_day}_{a.history_hours}_{a.days}_{a.late}_{a.other_rows}_{a.seed}"
    t0 = time.perf_counter()
    parts = write_parts(lay, data / "parts", a.days, a.late, a.other_rows)
    gen_s = time.perf_counter() - t0
    run = a.dir / f"run_{a.stays}{('_' + a.label) if a.label else ''}"
    shutil.rmtree(run, ignore_errors=True)
    root = run / "root"
    (root / "icu").mkdir(parents=True)
    import pyarrow.parquet as pq

    pq.write_table(lay.stays_table(), root / "icu" / "icustays.parquet")
    wh = run / "stream.duckdb"
    extra = {} if a.jobs is None else {"jobs": a.jobs}
    res = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_start": _load()},
           "generate_s": gen_s, "part_rows": [pq.ParquetFile(p).metadata.num_rows for p in parts], "phases": []}

    a.out.mkdir(parents=True, exist_ok=True)
    name = f"bench_ingest_{a.stays}{('_' + a.label) if a.label else ''}.json"

    def save():
        res["machine"]["load_end"] = _load()
        res["warehouse_mb"] = wh.stat().st_size / 2 ** 20 if wh.is_file() else None
        write_json(a.out / name, res)

    def phase(name, **kw):
        r = run_phase(name, wh, root, pp, extra=extra, **kw)
        r["load_after"] = _load()
        res["phases"].append(r)
        save()  # after every phase: a long run stopped early keeps what it measured
        print(f"{name:>12}: wall {r['wall_s']:8.2f} s  cpu {r['cpu_total_s']:8.2f} s  "
              f"rss {r['peak_rss_mb']:7.0f} MB (workers {r['worker_peak_rss_mb']:.0f})  "
              f"stays {r['stays_touched']:>6}  "
              f"tokens {r['new_tokens']:>8}  late {r['late_rows']:>5}  readm {r['readmissions_run']:>4}  "
              f"import {r['import_s']:.2f} s  load {r['load_after'][0]}", flush=True)
        print(f"{'':>12}  main: cpu {r['cpu_s']:.1f} s, waiting for a CPU {r.get('runq_s', 0.0):.1f} s, on workers "
              f"{r.get('wait_workers_s', 0.0):.1f} s, commits + checkpoint {r.get('commit_checkpoint_s', 0.0):.1f} s; "
              f"workers waiting for a CPU {r.get('worker_runq_s', 0.0):.1f} s", flush=True)
        return r

    shutil.copy(parts[0], root / "icu" / parts[0].name)
    phase("init", init=True, frozen=frozen_table())
    for k in range(1, a.days + 1):
        shutil.copy(parts[k], root / "icu" / parts[k].name)
        phase(f"day{k}")
        if k == 1:
            phase("nothing_new")
    phase("nothing_new_end")
    save()
    print(f"wrote {a.out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
