"""Render a self-contained HTML report from stored study result files.

Usage::

    python -m dashboards.report --runs runs --out report.html

Every ``*.json`` under ``--runs`` that is an object with a ``"study"`` key is a result file
(dashboards/SCHEMA.md); each is validated with :func:`dashboards.schema.validate_result` and the
whole report is refused (typed error, exit status 2, no file written) if any fails — in particular
if a file looks like record-level data. Other JSON files are skipped and listed by name.

The page reads like a results section: per study its chart (or headline table), the seed figure
beside it and the claims table up front; everything else (further figures, the full tables, every
metric, the configuration) is collapsed in a ``<details>`` block. It is one HTML file rendered
from the jinja2 templates in ``dashboards/templates`` (autoescaped): inline CSS, figures embedded
as base64 PNG (matplotlib Agg), no scripts and no network assets. Studies without a result show
"not run" with the command that fills them. This module builds plain values for the templates;
all markup lives in the templates.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from dashboards.commands import result_command
from dashboards.errors import ReportError, ResultSchemaError, RunsDirectoryError
from dashboards.figures import png_data_uri, render_png
from dashboards.labels import metric_label
from dashboards.schema import KNOWN_STUDIES, validate_result
from dashboards.seed_figures import CONTRACT_CARD, SEED_DATA, SEED_FIGURES, seed_comparability
from dashboards.stream_card import STUDY as STREAM
from dashboards.stream_card import stream_context
from dashboards.templating import environment, fmt, is_number

__all__ = ["LoadedResult", "SECTIONS", "load_results", "read_stale", "render_report", "write_report", "main",
           "low_power_warning", "build_context", "fmt"]

#: the file a forget writes into each registered runs folder (pipelines.store.forget): result files that
#: predate a deletion receipt
STALE_FILE = "stale.json"


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    studies: tuple[str, ...]
    intro: str


SECTIONS: tuple[Section, ...] = (
    Section("cohort", "Cohort funnel", ("cohort",),
            "Stays and hourly tokens surviving each cohort rule (counts only)."),
    Section("retention", "Event-hour retention by policy", ("icu_retention",),
            "Fraction of threshold-event hours kept at the support-defined budget k = |S∪E|; every policy "
            "keeps the same k per stay. Error bars: 95 % bootstrap intervals over stays."),
    Section("heldout", "Held-out SpO₂ control", ("heldout_spo2",),
            "Events are raw SpO₂ < 90 %; the SpO₂ channel is removed from every selector's input."),
    Section("deletion", "Deletion audit and receipts",
            ("ledger", "deletion_audit", "patient_deletion", "deletion_latency"),
            "Decrement (maintained fp64 C&P path) against a fresh retained-key refit at the same C; "
            "coefficient decay as the comparator. Gate-score and readout audits, not a formal privacy "
            "guarantee or deletion from model weights."),
    Section("deterioration", "Deterioration prediction", ("deterioration",),
            "Event within the next six hours, per hour: ROC curves and AUROC/AUPRC with bootstrap intervals."),
    Section("synthetic", "Synthetic selection and recall studies",
            ("planted_secret", "skewed_redundancy", "streaming_eviction", "selective_copying", "capacity",
             "mqar_control", "learned_keys", "retrieval_memory", "synthetic_fidelity"),
            "Fixed-context probes of when support selection helps (and a negative control where it cannot)."),
    Section("lm", "Language model", ("language_model", "throughput"),
            "Byte-level LM usability and throughput (the causal hybrid's local path has no SV certificate)."),
)

DATA_LABELS = {
    "demo": "MIMIC-IV demo (real records, 100 patients)",
    "synthetic": "synthetic",
    "mimic": "MIMIC-IV (user-supplied root)",
    "clif": "CLIF (user-supplied root)",
    "text": "public-domain text corpus",
}

HOLDS_LEGEND = ("holds: whether this run's own value meets the claim's stated condition, checked by the study on "
                "this run (e.g. a 95 % CI lower bound above 0, or the decrement's deviation below decay's); yes/no, "
                "— when the study states no condition. It is not the seed's verdict and not a significance test.")

#: most rows of a result's first table shown up front when the result has no figure
LEAD_ROWS = 12

#: clinical studies whose seed figures come from real MIMIC-IV records (decided in dashboards.seed_figures)
REAL_DATA_STUDIES = frozenset(s for s, kind in SEED_DATA.items() if kind == "real")


@dataclass(frozen=True)
class LoadedResult:
    """One validated result file (``path`` is relative to the runs directory)."""

    path: str
    payload: dict


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------
def load_results(runs_dir: str | os.PathLike) -> tuple[list[LoadedResult], list[str]]:
    """Find and validate result files under ``runs_dir``.

    Returns
    -------
    results : list of LoadedResult
        Sorted by (study, path).
    skipped : list of str
        Relative paths of JSON files that are not result files (no ``"study"`` key).
        Hidden files and folders (``.<warehouse>.cache/``, the task cache; ``.prefect-results``)
        and the forget registry are never read; ``stale.json`` is read by :func:`read_stale`.

    Raises
    ------
    RunsDirectoryError
        ``runs_dir`` does not exist or is not a directory.
    ResultSchemaError / AggregateOnlyError
        A result file is unreadable or invalid; nothing is rendered.
    """
    root = Path(runs_dir)
    if not root.is_dir():
        raise RunsDirectoryError(f"runs directory {str(root)!r} does not exist or is not a directory")
    results: list[LoadedResult] = []
    skipped: list[str] = []
    for path in sorted(root.rglob("*.json")):
        rel = path.relative_to(root).as_posix()
        parts = path.relative_to(root).parts
        if any(p.startswith(".") for p in parts) or parts[0] == "forget-registry" or rel == STALE_FILE:
            continue  # caches, the registry, and the stale marks (read by read_stale)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ResultSchemaError(f"cannot read JSON: {exc}", source=rel) from None
        if not (isinstance(payload, dict) and "study" in payload):
            skipped.append(rel)
            continue
        validate_result(payload, source=rel)
        results.append(LoadedResult(rel, payload))
    results.sort(key=lambda r: (r.payload["study"], r.path))
    return results, skipped


def read_stale(runs_dir: str | os.PathLike) -> tuple[dict[str, int], int | None]:
    """From ``<runs>/stale.json`` (written by a forget, trimmed by every rerun): result path -> the
    first deletion receipt it predates, and the newest receipt the folder was told of. A missing
    or unreadable file means nothing is stale."""
    f = Path(runs_dir) / STALE_FILE
    try:
        st = json.loads(f.read_text())
        seq = int(st["receipt_seq"])
        since = st.get("since") if isinstance(st.get("since"), dict) else {}
        files = {str(p): int(since.get(p, seq)) for p in st.get("files", [])}
        return files, int(st.get("latest", seq))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, None


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------
_is_num = is_number


def _named(d: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """Flatten nested metrics/config into (human-readable name, value) rows — never a raw
    dotted key (dashboards.labels.METRIC_NAMES, with a prettifying fallback)."""
    rows: list[tuple[str, Any]] = []
    for k, v in d.items():
        path = (*prefix, str(k))
        if isinstance(v, Mapping):
            rows.extend(_named(v, path))
        else:
            rows.append((" · ".join(metric_label(c) for c in path), v))
    return rows


#: fewer bootstrap units than this and an estimate's interval is flagged as low-power
MIN_STAYS = 20
#: study -> (metrics key holding the number of units its intervals/estimates rest on, what a unit is)
POWER_UNITS: dict[str, tuple[str, str]] = {
    "cohort": ("n_stays", "stays"),
    "icu_retention": ("n_stays_included", "stays with an event"),
    "heldout_spo2": ("n_stays_included", "stays with an event"),
    "deterioration": ("test_stays", "test-split stays"),
    "patient_deletion": ("contexts_completed", "five-patient contexts"),
}


def _zero_width_cis(p: Mapping[str, Any]) -> int:
    """How many intervals in the metrics ({low, high} pairs, ``*_low``/``*_high`` keys) and bar
    figures (ci_low/ci_high) have zero width — the mark of a bootstrap over a single unit."""
    n = 0

    def walk(d: Mapping[str, Any]) -> None:
        nonlocal n
        for k, v in d.items():
            if isinstance(v, Mapping):
                walk(v)
            elif isinstance(k, str) and k.endswith("low") and _is_num(v):
                hi = d.get(k[:-3] + "high")
                if _is_num(hi) and hi == v:
                    n += 1

    walk(p.get("metrics", {}))
    for fig in p.get("figures", []):
        if "ci_low" in fig and "ci_high" in fig:
            n += sum(1 for a, b in zip(fig["ci_low"], fig["ci_high"]) if _is_num(a) and a == b)
    return n


def low_power_warning(p: Mapping[str, Any]) -> str:
    """The text of a visible warning when the card's intervals or estimates rest on few units
    (< MIN_STAYS stays, or contexts for patient deletion) or an interval has zero width; "" otherwise."""
    msgs = []
    key, unit = POWER_UNITS.get(p["study"], ("", ""))
    count = p.get("metrics", {}).get(key) if key else None
    if _is_num(count) and count < MIN_STAYS:
        msgs.append(f"rests on {int(count):,} {unit} (fewer than {MIN_STAYS}): intervals and estimates here are "
                    "low-power and can move a lot on another cohort")
    pw = p.get("metrics", {}).get("power")
    if not msgs and isinstance(pw, Mapping) and pw.get("low_power") and pw.get("label"):
        msgs.append(str(pw["label"]))  # the study's own label (e.g. the audit's trials per regime)
    zero = _zero_width_cis(p)
    if zero:
        msgs.append(f"{zero} interval(s) have zero width (e.g. a bootstrap over a single stay): they show no "
                    "uncertainty, not certainty")
    return ("Low power: this result " + "; ".join(msgs) + ".") if msgs else ""


# --------------------------------------------------------------------------------------------
# view model: plain values for the templates
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=128)
def _png_uri(spec_json: str, seed: bool) -> str:
    """A figure spec drawn once per process (the seed figures recur on every render)."""
    return png_data_uri(render_png(json.loads(spec_json), seed=seed))


def _figure(spec: Mapping[str, Any], *, seed: bool) -> dict:
    alt = ("seed figure: " if seed else "figure: ") + str(spec.get("title", spec["kind"]))
    return {"src": _png_uri(json.dumps(spec, sort_keys=True), seed), "alt": alt, "caption": spec.get("caption")}


def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str = "") -> dict:
    return {"title": title, "columns": list(columns), "rows": [list(r) for r in rows]}


def _claims(claims: Sequence[Mapping[str, Any]], owners: Sequence[str] | None = None) -> list[dict]:
    return [{"study": owners[i] if owners else None, "statement": c["statement"], "reference": c["reference"],
             "path": c["path"], "value": c.get("value"), "holds": c.get("holds"), "operation": c.get("operation")}
            for i, c in enumerate(claims)]


def _receipt_row(r: LoadedResult) -> dict:
    rec = r.payload["receipts"]
    done = (f"{rec['completed']:,} / {rec['attempted']:,}"
            if rec.get("completed") is not None and rec.get("attempted") is not None else None)
    return {"study": r.payload["study"], "data": r.payload["data"], "count": rec["count"],
            "certified": rec["certified"], "done": done, "chain": rec["chain_verified"]}


def _runtime(p: Mapping[str, Any]) -> dict | None:
    """What the card says about time: the recorded seconds, labelled as the result describes them
    (a resumed run's seconds are not presented as the study's compute time)."""
    if p["study"] == "ledger":
        return None  # written by every forget; its runtime_s carries no meaning
    t = p.get("timing") or {}
    return {"seconds": float(p["runtime_s"]), "resumed": bool(t.get("resumed")),
            "cached_tasks": t.get("cached_tasks"), "tasks": t.get("tasks"), "compute_s": t.get("compute_s")}


def _seed(study: str, payload: Mapping[str, Any] | None) -> dict:
    """The seed block beside a card — except a synthetic run of a real-data study, which is never
    placed beside the seed's real-data figures as if comparable."""
    out: dict[str, Any] = {"not_comparable": False, "reason": None, "partial": None, "empty": False, "text": None,
                           "source": None, "figure": None, "table": None}
    if payload is not None:
        comp = seed_comparability(study, payload.get("data", ""))
        if not comp["comparable"]:
            return {**out, "not_comparable": True, "reason": comp["reason"]}
        out["partial"] = comp["partial"]
    seed = dict(SEED_FIGURES.get(study, {}))
    if payload is not None and payload.get("seed_figure"):
        seed.update({k: v for k, v in payload["seed_figure"].items() if v is not None})
    if not seed:
        return {**out, "empty": True}
    out.update(text=seed.get("text"), source=seed.get("source"))
    if seed.get("figure"):
        out["figure"] = _figure(seed["figure"], seed=True)
    elif seed.get("values"):
        out["table"] = _table(["seed quantity", "value"], _named(seed["values"]))
    return out


def _ledger(p: Mapping[str, Any], stale_seq: int | None) -> dict:
    m = p["metrics"]
    n = int(m.get("receipts", 0))
    return {"receipts": n, "chain": m.get("chain_verified"), "pending": int(m.get("pending_erasures") or 0),
            "last": m.get("last_deletion_utc") or None, "head": m.get("head") or None,
            "behind": stale_seq if stale_seq is not None and stale_seq > n else None}


def _card_anchor(r: LoadedResult) -> str:
    """``study-<name>`` for the canonical ``<name>/result.json``, else a slug of the file's path."""
    s = r.payload["study"]
    return f"study-{s}" if r.path == f"{s}/result.json" else "file-" + re.sub(r"[^A-Za-z0-9]+", "-", r.path).strip("-")


def _card(res: LoadedResult, stale: Mapping[str, int], newest_receipt: int | None) -> dict:
    p = res.payload
    figures = [_figure(f, seed=False) for f in p["figures"]]
    tables = [_table(t["columns"], t["rows"], t.get("title", "")) for t in p["tables"]]
    lead: dict[str, Any] = {"ledger": None, "figure": None, "table": None, "rows_of": None}
    if p["study"] == "ledger":
        lead["ledger"] = _ledger(p, newest_receipt)
    elif figures:
        lead["figure"] = figures.pop(0)
    elif tables and len(tables[0]["rows"]) > LEAD_ROWS:  # its head up front, the whole table collapsed
        lead.update(table={**tables[0], "rows": tables[0]["rows"][:LEAD_ROWS]}, rows_of=len(tables[0]["rows"]))
    elif tables:
        lead["table"] = tables.pop(0)
    return {
        "anchor": _card_anchor(res),
        "study": p["study"], "title": p["title"], "data": p["data"],
        "data_label": DATA_LABELS.get(p["data"], p["data"]),
        "file": res.path, "created": p.get("created"),
        "stale": None if p["study"] == "ledger" else stale.get(res.path), "command": result_command(p["study"]),
        "runtime": _runtime(p), "warning": low_power_warning(p), "lead": lead,
        "claims": _claims(p.get("claims") or []),
        "receipts": [_receipt_row(res)] if "receipts" in p else [],
        "more_figures": figures, "tables": tables,
        "metrics": _named(p["metrics"]), "config": _named(p.get("config") or {}), "notes": p.get("notes") or "",
        "seed": _seed(p["study"], p),
    }


def _not_run(study: str) -> dict:
    return {"study": study, "label": study.replace("_", " "), "command": result_command(study),
            "anchor": f"study-{study}", "seed": _seed(study, None)}


def _contract(results: Sequence[LoadedResult]) -> dict:
    claims, owners = [], []
    for r in results:
        for c in r.payload.get("claims", []):
            claims.append(c)
            owners.append(r.payload["study"])
    all_claims = _claims(claims, owners)
    rows = [{**row, "evidence": [c for c in all_claims if c["operation"] == row["operation"]]} for row in CONTRACT_CARD]
    return {"rows": rows, "claims": all_claims}


def build_context(runs_dir: str | os.PathLike, title: str) -> dict:
    """Everything the report template shows, as plain values (validated results only)."""
    results, skipped = load_results(runs_dir)
    stale, newest = read_stale(runs_dir)
    by_study: dict[str, list[LoadedResult]] = {}
    for r in results:
        by_study.setdefault(r.payload["study"], []).append(r)
    sections = []
    for sec in SECTIONS:
        cards = []
        for study in sec.studies:
            found = by_study.get(study, [])
            cards += ([{"run": _card(r, stale, newest), "not_run": None} for r in found]
                      or [{"run": None, "not_run": _not_run(study)}])
        receipts = None
        if sec.key == "deletion":
            receipts = [_receipt_row(r) for rs in by_study.values() for r in rs if "receipts" in r.payload]
        sections.append({"key": sec.key, "title": sec.title, "intro": sec.intro, "cards": cards,
                         "receipts": receipts})
    others = [_card(r, stale, newest) for r in results
              if r.payload["study"] not in KNOWN_STUDIES and r.payload["study"] != STREAM]
    known = {s for sec in SECTIONS for s in sec.studies}
    missing = sorted(known - set(by_study))
    sources = sorted({r.payload["data"] for r in results})
    contract = _contract(results)
    holds = [c["holds"] for c in contract["claims"] if c["holds"] is not None]
    summary = [{"study": r.payload["study"], "title": r.payload["title"], "data": r.payload["data"],
                "stale": None if r.payload["study"] == "ledger" else stale.get(r.path), "runtime": _runtime(r.payload),
                "anchor": _card_anchor(r)} for r in results]
    return {
        "title": title, "generated": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "n_results": len(results), "sources": sources, "demo_credit": "demo" in sources,
        "nav": [{"key": s.key, "title": s.title} for s in SECTIONS],
        "summary": summary, "missing": [{"study": s, "command": result_command(s)} for s in missing],
        "skipped": skipped, "n_stale": sum(1 for s in summary if s["stale"]),
        "claims_hold": sum(holds), "claims_checked": len(holds),
        "sections": sections, "stream": stream_context(by_study.get(STREAM, [])), "others": others,
        "contract": contract, "holds_legend": HOLDS_LEGEND,
    }


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------
def render_report(runs_dir: str | os.PathLike, *, title: str = "forgetful — study report") -> str:
    """Validate every result under ``runs_dir`` and return the report as one HTML string."""
    return environment().get_template("report.html").render(**build_context(runs_dir, title))


def write_report(runs_dir: str | os.PathLike, out: str | os.PathLike, **kw: Any) -> Path:
    """Render and write atomically: on any error the output path is left untouched."""
    from sv_core.jsonfile import atomic_write_text  # the gate package stays out of the report's import

    text = render_report(runs_dir, **kw)
    return atomic_write_text(out, text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dashboards.report",
                                     description="Render stored study results into one self-contained HTML report.")
    parser.add_argument("--runs", default="runs", help="directory searched recursively for result JSON (default: runs)")
    parser.add_argument("--out", default="report.html", help="output HTML file (default: report.html)")
    parser.add_argument("--title", default="forgetful — study report", help="page title")
    return parser


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns 0 on success, 2 when the report is refused."""
    args = build_parser().parse_args(argv)
    try:
        path = write_report(args.runs, args.out, title=args.title)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
