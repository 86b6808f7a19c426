"""Arithmetic and rendering of the scale benchmark (:mod:`pipelines.bench.scale`): per-step
summaries, marginal cost per stay, log-log exponents, the full-MIMIC-IV extrapolation and
``docs/SCALE.md``. Pure functions of the result JSON: every figure of the document is computed
here from that file, none is typed by hand.

Result layout (what :mod:`pipelines.bench.scale` writes)::

    {"kind": "bench_scale", "machine": {...}, "settings": {...},
     "sizes": [{"label", "chartevents_rows", "stays_generated", "eligible_stays", "hourly_rows",
                "steps": {step: {"status": "ok" | "skipped" | "failed" | "timeout", "reason",
                                 "stays", "runs": [{"wall_s", "compute_s", "cpu_s",
                                                    "peak_rss_mb", "tree_rss_mb",
                                                    "load_start", "load_end"}]}}}]}
"""
from __future__ import annotations

import math
import statistics
from typing import Any

from dashboards.numbers import fixed, md_table
from pipelines.bench.fullrun_report import render_section, repeats_section

#: full MIMIC-IV v3.1: chartevents rows, ICU stays, stays of ≥ 48 h (approximate)
FULL_MIMIC = {"chartevents_rows": 433_000_000, "stays": 94_458, "eligible_stays": 42_000}

#: the build and its peers scale with chartevents rows; the studies with the stays they process
ROW_STEPS = ("build", "peer_duckdb", "peer_polars")
STEP_TITLES = {
    "build": "build-cohort --source mimic",
    "peer_duckdb": "peer: DuckDB SQL GROUP BY",
    "peer_polars": "peer: Polars lazy (streaming)",
    "retention": "retention",
    "heldout": "heldout-spo2",
    "deterioration": "deterioration (capped)",
}


def merge_results(results: list[dict]) -> dict:
    """One result from several runs: machine and settings of the first; every size keeps the
    settings and start time of its own run; a size (by label) measured again replaces the
    earlier one; sizes in order of chartevents rows."""
    if not results:
        raise ValueError("nothing to merge")
    out = {k: v for k, v in results[0].items() if k != "sizes"}
    out["merged_runs"] = [c for r in results for c in (r.get("merged_runs") or [r.get("created_utc")])]
    by_label: dict[str, dict] = {}
    for r in results:
        for size in r.get("sizes", []):
            by_label[size["label"]] = {**size, "settings": size.get("settings") or r.get("settings", {}),
                                       "command": size.get("command") or r.get("command"),
                                       **{k: size.get(k) or r.get(k) for k in ("uptime_start", "uptime_end")}}
    out["sizes"] = sorted(by_label.values(), key=lambda z: z.get("chartevents_rows") or 0)
    full = [r["full_run"] for r in results if r.get("full_run")]
    if full:  # the latest full-size run-all record (pipelines.bench.fullrun) is kept, with its repeats
        out["full_run"] = full[-1]
        repeats = [r["full_runs"] for r in results if r.get("full_runs")]
        if repeats:
            out["full_runs"] = repeats[-1]
    models = [r["scaleout"] for r in results if r.get("scaleout")]
    if models:  # the latest scale-out model (pipelines.bench.makespan) is kept
        out["scaleout"] = models[-1]
    return out


def step_summary(step: dict) -> dict[str, Any] | None:
    """Median wall / compute / CPU seconds with their min–max, the largest peak RSS and the load
    at the start of the first run and the end of the last; None unless the step ran (status ok)."""
    runs = step.get("runs") or []
    if step.get("status") != "ok" or not runs:
        return None

    def med(key):
        xs = [r[key] for r in runs if r.get(key) is not None]
        return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)

    wall, cpu, comp, ccpu = med("wall_s"), med("cpu_s"), med("compute_s"), med("compute_cpu_s")
    tree = [r["tree_rss_mb"] for r in runs if r.get("tree_rss_mb") is not None]
    phases: dict[str, list[float]] = {}
    for r in runs:
        for k, v in (r.get("cpu_phases") or {}).items():
            phases.setdefault(k, []).append(v)
    return {"n_runs": len(runs), "wall_s": wall[0], "wall_min": wall[1], "wall_max": wall[2],
            "cpu_s": cpu[0], "cpu_min": cpu[1], "cpu_max": cpu[2], "compute_s": comp[0],
            "compute_cpu_s": ccpu[0], "compute_cpu_min": ccpu[1], "compute_cpu_max": ccpu[2],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "tree_rss_mb": max(tree) if tree else None,
            "load_start": runs[0].get("load_start"), "load_end": runs[-1].get("load_end"),
            "stays": step.get("stays"), "longest_stay_h": step.get("longest_stay_h"),
            "cpu_phases": {k: statistics.median(v) for k, v in phases.items()}}


def x_of(size: dict, step_name: str, step: dict) -> float | None:
    """The size variable of a step: chartevents rows for the build and its peers, the stays the
    step processed for the studies."""
    if step_name in ROW_STEPS:
        return size.get("chartevents_rows")
    return step.get("stays") or size.get("eligible_stays")


def fit_power(xs, ys) -> dict[str, float] | None:
    """Least-squares fit of log y = log a + b·log x; {"exponent": b, "prefactor": a, "n": points}
    or None with fewer than two distinct positive x."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y and x > 0 and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    b = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    return {"exponent": b, "prefactor": math.exp(my - b * mx), "n": n}


def _series(result: dict, step_name: str) -> list[tuple[float, dict]]:
    out = []
    for size in result.get("sizes", []):
        st = size.get("steps", {}).get(step_name)
        s = step_summary(st) if st else None
        x = x_of(size, step_name, st) if st else None
        if s is not None and x:
            out.append((float(x), s))
    return sorted(out, key=lambda t: t[0])


def step_names(result: dict) -> list[str]:
    seen: list[str] = []
    for size in result.get("sizes", []):
        for k in size.get("steps", {}):
            if k not in seen:
                seen.append(k)
    order = list(STEP_TITLES)
    return sorted(seen, key=lambda k: (order.index(k) if k in order else len(order), k))


def cpu_key(result: dict, name: str) -> str:
    """The CPU figure a step is fitted on: the build's and peers' own CPU (``compute_cpu_s``,
    interpreter start and imports left out, which would flatten the exponent) when every size
    has it, else the process CPU (``cpu_s``)."""
    ser = _series(result, name)
    if name in ROW_STEPS and ser and all(s.get("compute_cpu_s") for _, s in ser):
        return "compute_cpu_s"
    return "cpu_s"


def fits(result: dict) -> dict[str, dict]:
    """Per step: exponents of CPU seconds (:func:`cpu_key`), wall seconds and peak RSS against
    its size variable; ``cpu_metric`` names the CPU figure."""
    out = {}
    for name in step_names(result):
        ser = _series(result, name)
        xs = [x for x, _ in ser]
        ck = cpu_key(result, name)
        out[name] = {"cpu_s": fit_power(xs, [s[ck] for _, s in ser]), "cpu_metric": ck,
                     **{k: fit_power(xs, [s[k] for _, s in ser]) for k in ("wall_s", "peak_rss_mb")}}
    return out


def marginals(result: dict) -> dict[str, list[dict]]:
    """Per step: CPU-ms per stay between consecutive sizes, (Δ CPU seconds / Δ stays)·1000 —
    the studies per processed stay, the build and its peers per eligible stay (CPU figure:
    :func:`cpu_key`)."""
    out: dict[str, list[dict]] = {}
    for name in step_names(result):
        ck = cpu_key(result, name)
        pts = []
        for size in result.get("sizes", []):
            st = size.get("steps", {}).get(name)
            if not st:  # this size did not run the step
                continue
            s = step_summary(st)
            n = (st.get("stays") if name not in ROW_STEPS else None) or size.get("eligible_stays")
            if s is not None and n and s.get(ck) is not None:
                pts.append((float(n), s[ck]))
        pts.sort()
        out[name] = [{"from_stays": a[0], "to_stays": b[0], "cpu_ms_per_stay": 1000 * (b[1] - a[1]) / (b[0] - a[0])}
                     for a, b in zip(pts, pts[1:]) if b[0] > a[0]]
    return out


def memory_growth(result: dict) -> dict[str, dict]:
    """Per step measured at ≥ 2 sizes: peak RSS at the smallest and the largest size, the growth
    in MB and the ratio of the size variable between them (issue 20: ≤ 150 MB from 1× to 4× stays)."""
    out = {}
    for name in step_names(result):
        ser = _series(result, name)
        if len(ser) >= 2:
            (xa, sa), (xb, sb) = ser[0], ser[-1]
            out[name] = {"x_from": xa, "x_to": xb, "ratio": xb / xa, "rss_from": sa["peak_rss_mb"],
                         "rss_to": sb["peak_rss_mb"], "growth_mb": sb["peak_rss_mb"] - sa["peak_rss_mb"],
                         "longest_from": sa.get("longest_stay_h"), "longest_to": sb.get("longest_stay_h")}
    return out


def extrapolate(result: dict, target: dict | None = None) -> dict[str, dict]:
    """Full-MIMIC-IV estimate per step, anchored at the largest measured size (x0, y0): the build
    and its peers go to ``target["chartevents_rows"]``, the studies to ``target["eligible_stays"]``.

    * power law: y0·(x_target / x0)^b with the fitted exponent b (CPU, wall, peak RSS);
    * ``cpu_s_marginal`` / ``peak_rss_mb_marginal``: y0 + slope·(x_target − x0), the slope
      between the two largest sizes (a constant start-up cost is not multiplied up; memory that
      grows per stay is not flattened by a small fitted exponent)."""
    target = dict(FULL_MIMIC if target is None else target)
    f = fits(result)
    out = {}
    for name in step_names(result):
        ser = _series(result, name)
        if not ser:
            continue
        x0, s0 = ser[-1]
        ck = f[name]["cpu_metric"]
        xt = target["chartevents_rows"] if name in ROW_STEPS else target["eligible_stays"]
        row = {"x_measured": x0, "x_target": xt, "cpu_metric": ck}
        for k, sk in (("cpu_s", ck), ("wall_s", "wall_s"), ("peak_rss_mb", "peak_rss_mb")):
            fit = f[name][k]
            row[k] = None if fit is None or s0[sk] is None else s0[sk] * (xt / x0) ** fit["exponent"]
        row["cpu_s_marginal"] = row["peak_rss_mb_marginal"] = None
        if len(ser) >= 2:
            x1, s1 = ser[-2]
            row["cpu_s_marginal"] = s0[ck] + (s0[ck] - s1[ck]) / (x0 - x1) * (xt - x0)
            row["peak_rss_mb_marginal"] = (s0["peak_rss_mb"]
                                           + (s0["peak_rss_mb"] - s1["peak_rss_mb"]) / (x0 - x1) * (xt - x0))
        out[name] = row
    return out


# ------------------------------------------------------------------------------ rendering
def _rows_label(n) -> str:
    return "–" if not n else (f"{n / 1e6:,.1f}M" if n >= 1e6 else f"{n / 1e3:,.0f}k")


def _dur(s) -> str:
    if s is None:
        return "–"
    return f"{s:,.1f} s" if s < 600 else (f"{s / 60:,.1f} min" if s < 7200 else f"{s / 3600:,.2f} h")


def _uptime_note(size: dict, result: dict) -> str:
    """A merged size measured by another run than the first names that run's ``uptime``."""
    if not size.get("uptime_start") or size.get("uptime_start") == result.get("uptime_start"):
        return ""
    return f" `uptime` of its run at the start: {size['uptime_start']}; at the end: {size.get('uptime_end', '?')}."


def _sample_note(size: dict) -> str:
    sw = size.get("study_warehouse")
    if not sw:
        return ""
    run = sw.get("run") or {}
    return (f" Studies without a stays option ran on a warehouse sampled by `{sw.get('command')}` "
            f"(that build: wall {fixed(run.get('wall_s'))} s, CPU {fixed(run.get('cpu_s'))} s, exit {run.get('rc')}; "
            "not counted in any study's figures).")


def render_markdown(result: dict, source_name: str = "the result JSON") -> str:
    """docs/SCALE.md from a result: per-size tables, build vs peers, marginal CPU per stay,
    exponents and the full-MIMIC-IV extrapolation."""
    st = result.get("settings", {})
    mach = result.get("machine", {})
    started = result.get("merged_runs") or [result.get("created_utc", "?")]
    L = ["# Scale benchmark", "",
         f"Generated by `python -m pipelines.bench.scale` from {source_name} — do not edit by hand "
         "(re-render with `python -m pipelines.bench.scale --render FILE`).", ""]
    cmds = list(dict.fromkeys(c for c in [*(z.get("command") for z in result.get("sizes", [])), result.get("command")]
                              if c))
    if len(cmds) == 1:
        L += ["Rerun (one line, from the repository root; replaces the result file and this document):", "",
              "```", cmds[0], "```", ""]
    elif cmds:
        L += ["Rerun (one line, from the repository root: this result merges runs; the first command replaces "
              "the result file and this document, each later one adds its sizes with `--append`):", "",
              "```", " && ".join(cmds), "```", ""]
    if result.get("complete") is False:
        L += ["**Incomplete:** the run was stopped before its last size; the sizes below are the ones it finished.", ""]
    if result.get("uptime_start"):
        L += [f"`uptime` at the start: {result['uptime_start']}; at the end: {result.get('uptime_end', '?')}.", ""]
    L += [
         f"Machine: {mach.get('cpu_count', '?')} CPUs, {fixed(mach.get('mem_total_gb'))} GB memory, "
         f"{mach.get('platform', '?')}; runs started {', '.join(str(x) for x in started)}. "
         f"Data: {st.get('data', 'MIMIC-layout roots')}.", "",
         "How it is measured: each step is its own process through the real command line "
         "(`python -m pipelines.cli …`), with `PREFECT_API_URL` pointed at one Prefect API server the "
         "benchmark starts once, so no command pays a server start-up. *wall* is the command's wall "
         "time (interpreter and imports included), *compute* the time the command reports for its own "
         "work (build `seconds`, study `runtime_s`), *compute CPU* the CPU the build (or peer) reports "
         "for its own work (interpreter start and imports left out), *CPU* user + system seconds of the "
         "process and its children (`wait4`), *peak RSS* the largest resident set of any process of "
         "the command (`ru_maxrss`, measured through a small fork-exec launcher so a command does not "
         "inherit the benchmark's own high-water mark), *tree RSS* the largest sampled sum over its "
         "process group (`/proc`, every 0.25 s). *load* is the "
         "1-minute load average at the step's start → end: on a shared machine wall time follows "
         "the load, CPU seconds much less, so compare CPU.", ""]
    if st.get("notes"):
        L += [f"Settings: {st['notes']}", ""]
    for size in result.get("sizes", []):
        L += [f"## {size.get('label') or _rows_label(size.get('chartevents_rows'))}: "
              f"{fixed(size.get('chartevents_rows'))} chartevents rows, {fixed(size.get('stays_generated'))} stays, "
              f"{fixed(size.get('eligible_stays'))} eligible (≥ 48 h), "
              f"{fixed(size.get('hourly_rows'))} hourly rows", "",
              f"Measured {size.get('measured_utc', '?')}; build and peers interleaved "
              f"{(size.get('settings') or st).get('repeat', 1)}× (median; wall min–max), the studies once."
              + _sample_note(size) + _uptime_note(size, result), ""]
        rows = []
        for name in step_names({"sizes": [size]}):
            step = size["steps"][name]
            s = step_summary(step)
            title = STEP_TITLES.get(name, name)
            if s is None:
                rows.append([title, "–", f"{step.get('status', '?')}: {step.get('reason', '')}"] + [""] * 8)
                continue
            n = s["stays"] if name not in ROW_STEPS else size.get("eligible_stays")
            rate = (size["chartevents_rows"] / s["compute_s"]
                    if name in ROW_STEPS and s.get("compute_s") and size.get("chartevents_rows") else None)
            spread = f" ({fixed(s['wall_min'])}–{fixed(s['wall_max'])})" if s["n_runs"] > 1 else ""
            rows.append([title, fixed(n), fixed(s["wall_s"]) + spread, fixed(s["compute_s"]),
                         fixed(s["compute_cpu_s"], 2), fixed(s["cpu_s"]), fixed(s["peak_rss_mb"], 0),
                         fixed(s["tree_rss_mb"], 0), fixed(rate, 0), fixed(1000 * s["cpu_s"] / n if n else None),
                         f"{fixed(s['load_start'])} → {fixed(s['load_end'])}"])
        L += md_table(["step", "stays", "wall s (min–max)", "compute s", "compute CPU s", "CPU s", "peak RSS MB",
                       "tree RSS MB", "rows/s", "CPU-ms/stay", "load start → end"], rows, align="lrrrrrrrrrl")
        peers = [p for p in ("peer_duckdb", "peer_polars") if step_summary(size["steps"].get(p, {}))]
        b = step_summary(size["steps"].get("build", {}))
        if b and peers:
            ratios = []
            for p in peers:
                ps = step_summary(size["steps"][p])
                assert ps is not None  # peers holds only the steps that ran
                cc = (fixed(b["compute_cpu_s"] / ps["compute_cpu_s"], 2)
                      if b.get("compute_cpu_s") and ps.get("compute_cpu_s") else "–")
                ratios.append(f"{STEP_TITLES[p].split(': ')[1]}: compute CPU {cc}×, process CPU "
                              f"{fixed(b['cpu_s'] / ps['cpu_s'], 2)}×, compute wall "
                              f"{fixed(b['compute_s'] / ps['compute_s'], 2) if ps['compute_s'] else '–'}×")
            L += ["", "Build vs peers (build ÷ peer, medians; *compute* CPU excludes interpreter start and "
                  "imports): " + "; ".join(ratios) + "."]
            ph = b.get("cpu_phases") or {}
            if ph:
                core = ph.get("scan", 0.0) + ph.get("hourly", 0.0)
                d = step_summary(size["steps"].get("peer_duckdb", {}))
                vs = (f" Scan + hourly means (the peers' work) = {fixed(core, 2)} CPU s = "
                      f"{fixed(core / d['compute_cpu_s'], 2)}× the DuckDB peer; the rest writes the warehouse."
                      if d and d.get("compute_cpu_s") else "")
                L += ["", "Build CPU by phase (medians, s): "
                      + ", ".join(f"{k} {fixed(v, 2)}" for k, v in ph.items()) + "." + vs]
        L.append("")
    m = marginals(result)
    if any(m.values()):
        L += ["## Marginal CPU per stay between sizes", ""]
        L += md_table(["step", "stays from → to", "CPU-ms per stay"],
                      [[STEP_TITLES.get(name, name), f"{fixed(int(r['from_stays']))} → {fixed(int(r['to_stays']))}",
                        fixed(r["cpu_ms_per_stay"])] for name, rows in m.items() for r in rows], align="llr")
        L.append("")
    f = fits(result)
    L += ["## Fitted exponents", "",
          "Least squares of log y against log x over the sizes measured (x: chartevents rows for the build "
          "and its peers, processed stays for the studies); 1.0 is linear.", ""]
    keys = ("cpu_s", "wall_s", "peak_rss_mb")
    L += md_table(["step", "x", "sizes", "CPU figure", "CPU exponent", "wall exponent", "peak RSS exponent"],
                  [[STEP_TITLES.get(name, name), "rows" if name in ROW_STEPS else "stays",
                    max((fs[k]["n"] for k in keys if fs[k]), default=0),
                    "compute CPU" if fs["cpu_metric"] == "compute_cpu_s" else "process CPU",
                    *(fixed(fs[k]["exponent"], 2) if fs[k] else "–" for k in keys)] for name, fs in f.items()],
                  align="llrlrrr")
    g = memory_growth(result)
    if g:
        L += ["", "## Peak RSS growth", "",
              "Smallest → largest measured size (issue 20 asks the studies for ≤ 150 MB growth from 1× to 4× stays). "
              "A study's peak is set by its longest stay (n × n matrices), so that column says whether two sizes "
              "are alike in what sets the peak: a larger sample of a larger root holds longer stays.", ""]
        rows = []
        for name, r in g.items():
            lf, lt = r.get("longest_from"), r.get("longest_to")
            longest = "–" if name in ROW_STEPS or lf is None or lt is None else f"{fixed(lf)} → {fixed(lt)}"
            rows.append([STEP_TITLES.get(name, name), f"{fixed(int(r['x_from']))} → {fixed(int(r['x_to']))}",
                         fixed(r["ratio"]), longest, f"{fixed(r['rss_from'], 0)} → {fixed(r['rss_to'], 0)}",
                         fixed(r["growth_mb"], 0)])
        L += md_table(["step", "x from → to", "×", "longest stay h from → to", "peak RSS MB from → to", "growth MB"],
                      rows, align="llrllr")
    tgt = FULL_MIMIC
    ex = extrapolate(result)
    L += ["", "## Extrapolation to full MIMIC-IV", "",
          f"Target: {fixed(tgt['chartevents_rows'])} chartevents rows, {fixed(tgt['stays'])} ICU stays, "
          f"≈ {fixed(tgt['eligible_stays'])} eligible; the build and its peers scale with rows, the studies with "
          "stays. *power law*: the largest measured size's figure × (x_target / x_measured)^exponent; "
          "*marginal*: the largest size's CPU + the CPU per unit of x between the two largest sizes × the "
          "rest (a constant start-up cost is not multiplied up). Synthetic rows are narrower than real ones "
          "(no free text in most non-vital rows) and a real csv.gz must be decompressed and parsed, so a "
          "real file costs the scan more per row."
          + (" The studies' peak RSS follows their longest stay's n × n matrices, not their number, so its "
             "extrapolation overstates; the full-size run-all below measures it." if result.get("full_run") else ""),
          ""]
    L += md_table(["step", "measured at x", "CPU, power law", "CPU, marginal", "wall, power law (this load)",
                   "peak RSS MB, power law", "peak RSS MB, marginal"],
                  [[STEP_TITLES.get(name, name), fixed(int(r["x_measured"])), _dur(r["cpu_s"]),
                    _dur(r["cpu_s_marginal"]), _dur(r["wall_s"]), fixed(r["peak_rss_mb"], 0),
                    fixed(r.get("peak_rss_mb_marginal"), 0)] for name, r in ex.items()], align="lrrrrrr")
    L.append("")
    if result.get("full_run"):
        L += render_section(result["full_run"])
        if len(result.get("full_runs") or []) > 1:
            L += repeats_section(result["full_runs"])
    if result.get("scaleout"):
        from pipelines.bench.makespan_report import render_section as scaleout_section

        L += scaleout_section(result["scaleout"])
    return "\n".join(L)
