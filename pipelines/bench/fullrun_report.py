"""The full-size ``run-all`` record of the scale benchmark (:mod:`pipelines.bench.fullrun`): what a
whole pipeline run on a MIMIC-size root cost per step, and its section of ``docs/SCALE.md``.

Pure functions of files a run wrote — ``run-all --json`` (per step: wall seconds, CPU seconds, peak
RSS of the process and its live children, RSS at the step's start; :mod:`pipelines.runtime.step_meter`),
the cohort step's result (stays, hourly tokens, the funnel) and the generated root's manifest
(chartevents rows) — so every figure of the section comes from a result file.

Record layout::

    {"kind": "run_all_full", "created_utc", "command", "bench_command", "commit", "machine",
     "uptime_start", "uptime_end", "rc",
     "data": {"source_kind", "chartevents_rows", "icu_stays", "eligible_stays", "hourly_tokens"},
     "steps": {step: {"wall_s", "cpu_s", "peak_rss_mb", "children_peak_rss_mb", "start_rss_mb"}},
     "peak_rss_mb_max", "total_seconds", "rss_method", "rss_method_note", "headlines": {step: line}}
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dashboards.numbers import duration, fixed, md_table
from pipelines.errors import PipelineError

KIND = "run_all_full"
#: issue 20: every step of run-all on a ≥ 40,000-stay root within this peak RSS on the 2-core machine
PEAK_TARGET_MB = 2048.0


class FullRunError(PipelineError):
    """A full-run record could not be made from the given files (missing, or not what run-all writes)."""


def _read_json(path: Path, what: str) -> dict:
    try:
        obj = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FullRunError(f"{what} not found: {path}") from None
    except (OSError, ValueError) as e:
        raise FullRunError(f"{what} is not readable JSON: {path} ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise FullRunError(f"{what} is not a JSON object: {path}")
    return obj


def data_summary(runs_dir: Path, root: Path | None = None) -> dict[str, Any]:
    """Aggregate counts of the run's data: the cohort step's result (``<runs>/cohort/result.json``)
    and, for a generated root, its manifest's chartevents rows. Counts only, no record."""
    cohort = _read_json(Path(runs_dir) / "cohort" / "result.json", "the cohort step's result")
    m = cohort.get("metrics") or {}
    funnel = {row[0]: row[1] for t in cohort.get("tables", []) if t.get("title") == "funnel"
              for row in t.get("rows", []) if isinstance(row, list) and len(row) >= 2}
    out: dict[str, Any] = {"source_kind": cohort.get("data"), "icu_stays": funnel.get("icu_stays_in_source"),
                           "eligible_stays": m.get("n_stays"), "hourly_tokens": m.get("n_tokens"),
                           "chartevents_rows": None}
    if root is not None and (Path(root) / "synthetic_manifest.json").is_file():
        man = _read_json(Path(root) / "synthetic_manifest.json", "the generated root's manifest")
        out["chartevents_rows"] = man.get("chartevents_rows")
    return out


def headlines(runs_dir: Path) -> dict[str, str]:
    """One aggregate line per study from its result file (claims held / stays), for context."""
    out = {}
    for step, study in (("retention", "icu_retention"), ("heldout-spo2", "heldout_spo2"),
                        ("patient-deletion", "patient_deletion"), ("deterioration", "deterioration")):
        p = Path(runs_dir) / study / "result.json"
        if not p.is_file():
            continue
        try:
            r = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        claims = r.get("claims") or []
        held = sum(1 for c in claims if c.get("holds"))
        out[step] = f"{held}/{len(claims)} claims hold" if claims else "no claims"
    return out


@dataclass(frozen=True)
class Provenance:
    """How a full run was made: the commands, commit, machine, ``uptime`` lines, exit code, time."""

    command: str
    bench_command: str
    commit: str | None
    machine: dict
    uptime_start: str
    uptime_end: str
    rc: int
    created_utc: str


def make_record(steps_json: Path, runs_dir: Path, *, root: Path | None, made: Provenance) -> dict[str, Any]:
    """The record of one full ``run-all`` from its ``--json`` file and its runs folder."""
    sj = _read_json(steps_json, "run-all's --json file")
    secs = sj.get("seconds")
    if not isinstance(secs, dict) or not secs:
        raise FullRunError(f"run-all's --json file has no per-step seconds: {steps_json}")
    steps = {}
    for name, wall in secs.items():
        steps[name] = {"wall_s": wall, **{k: (sj.get(src) or {}).get(name) for k, src in (
            ("cpu_s", "cpu_seconds"), ("peak_rss_mb", "peak_rss_mb"),
            ("children_peak_rss_mb", "children_peak_rss_mb"), ("start_rss_mb", "start_rss_mb"))}}
    return {"kind": KIND, "created_utc": made.created_utc, "command": made.command,
            "bench_command": made.bench_command, "commit": made.commit, "machine": made.machine,
            "uptime_start": made.uptime_start, "uptime_end": made.uptime_end,
            "rc": int(made.rc), "data": data_summary(runs_dir, root), "steps": steps,
            "peak_rss_mb_max": sj.get("peak_rss_mb_max"), "total_seconds": sj.get("total_seconds"),
            "rss_method": sj.get("rss_method"), "rss_method_note": sj.get("rss_method_note"),
            "headlines": headlines(runs_dir)}


def read_record(path: Path) -> dict:
    """A record an earlier ``--out`` wrote; :class:`FullRunError` when it is not one."""
    rec = _read_json(path, "record")
    if rec.get("kind") != KIND or not isinstance(rec.get("steps"), dict):
        raise FullRunError(f"not a full-size run-all record (kind {KIND!r} with steps): {path}")
    return rec


def repeats_section(runs: list[dict]) -> list[str]:
    """Every full-size run side by side: per step peak RSS, then the run's data, total and verdict."""
    steps = list(dict.fromkeys(s for fr in runs for s in fr.get("steps") or {}))
    head = ["step", *(f"run {i} peak RSS MB" for i in range(1, len(runs) + 1))]
    rows = [[s, *(fixed(((fr.get("steps") or {}).get(s) or {}).get("peak_rss_mb"), 0) for fr in runs)] for s in steps]
    rows += [["**largest**", *(f"**{fixed(fr.get('peak_rss_mb_max'), 0)}**" for fr in runs)],
             ["wall", *(duration(fr.get("total_seconds")) for fr in runs)],
             ["chartevents rows", *(fixed((fr.get("data") or {}).get("chartevents_rows"), 0) for fr in runs)],
             ["eligible stays", *(fixed((fr.get("data") or {}).get("eligible_stays"), 0) for fr in runs)],
             ["commit · exit code", *(f"`{(fr.get('commit') or '?')[:7]}` · {fr.get('rc')}" for fr in runs)],
             ["made (UTC)", *((fr.get("created_utc") or "?")[:16] for fr in runs)]]
    within = sum(1 for fr in runs if fr.get("peak_rss_mb_max") is not None and fr["peak_rss_mb_max"] <= PEAK_TARGET_MB)
    L = ["### Every full-size run", "",
         f"{len(runs)} full-size runs; {within} of them kept every step within {fixed(PEAK_TARGET_MB, 0)} MB "
         "(the largest step's peak RSS, bold). The section above is the latest.", ""]
    L += md_table(head, rows, align="l" + "r" * len(runs))
    L.append("")
    return L


def render_section(fr: dict) -> list[str]:
    """The ``docs/SCALE.md`` section of a full-run record (markdown lines)."""
    d = fr.get("data") or {}
    steps = fr.get("steps") or {}
    cpu = sum(v.get("cpu_s") or 0.0 for v in steps.values())
    peak = fr.get("peak_rss_mb_max")
    top = max(steps, key=lambda k: steps[k].get("peak_rss_mb") or 0.0) if steps else None
    verdict = ("within" if peak is not None and peak <= PEAK_TARGET_MB else "above")
    L = ["## Full-size run-all", "",
         f"One `run-all` on a generated MIMIC-layout root of {fixed(d.get('chartevents_rows'), 0)} chartevents rows, "
         f"{fixed(d.get('icu_stays'), 0)} ICU stays, {fixed(d.get('eligible_stays'), 0)} eligible (≥ 48 h), "
         f"{fixed(d.get('hourly_tokens'), 0)} hourly tokens; commit `{(fr.get('commit') or '?')[:7]}`, "
         f"exit code {fr.get('rc')}. Made by:", "",
         "```", fr.get("bench_command") or fr.get("command") or "?", "```", "",
         f"`uptime` at the start: {fr.get('uptime_start', '?')}; at the end: {fr.get('uptime_end', '?')}.", "",
         f"Peak RSS: {fr.get('rss_method_note') or fr.get('rss_method') or '?'}. *start RSS* is what earlier steps "
         "left resident when the step began (it counts in the step's peak); *children* is the largest child "
         "process alive in the step (the Prefect API server run-all starts, generator workers).", ""]
    L += md_table(["step", "wall", "CPU s", "peak RSS MB", "of which children MB", "start RSS MB"],
                  [[name, duration(v.get("wall_s")), fixed(v.get("cpu_s"), 0), fixed(v.get("peak_rss_mb"), 0),
                    fixed(v.get("children_peak_rss_mb"), 0), fixed(v.get("start_rss_mb"), 0)]
                   for name, v in steps.items()], align="lrrrrr")
    L += ["", f"Total: {duration(fr.get('total_seconds'))} wall, {fixed(cpu, 0)} CPU-s; the largest step's peak RSS "
              f"{fixed(peak, 0)} MB ({top}) — {verdict} issue 20's {fixed(PEAK_TARGET_MB, 0)} MB."]
    if fr.get("headlines"):
        L += ["", "Studies (from their result files): "
              + "; ".join(f"{k} {v}" for k, v in fr["headlines"].items()) + "."]
    L.append("")
    return L
