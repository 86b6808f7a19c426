"""Render a self-contained HTML report from stored study result files.

Usage::

    python -m dashboards.report --runs runs --out report.html

Every ``*.json`` under ``--runs`` that is an object with a ``"study"`` key is a result file
(dashboards/SCHEMA.md); each is validated with :func:`dashboards.schema.validate_result` and the
whole report is refused (typed error, exit status 2, no file written) if any fails — in particular
if a file looks like record-level data. Other JSON files are skipped and listed by name.

The page is one HTML file: inline CSS, figures embedded as base64 PNG (matplotlib Agg), no
scripts and no network assets. Each section shows this run's figure beside the seed figure;
studies without a result show "not run".
"""
from __future__ import annotations

import argparse
import datetime as _dt
import html
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from dashboards.atomic import atomic_write_text
from dashboards.errors import ReportError, ResultSchemaError, RunsDirectoryError
from dashboards.figures import png_data_uri, render_png
from dashboards.labels import metric_label
from dashboards.schema import KNOWN_STUDIES, validate_result
from dashboards.seed_figures import CONTRACT_CARD, SEED_FIGURES

__all__ = ["LoadedResult", "SECTIONS", "load_results", "render_report", "write_report", "main"]


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
    Section("deletion", "Deletion audit and receipts", ("ledger", "deletion_audit", "patient_deletion", "deletion_latency"),
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

CSS = """
:root { --ink:#1d2733; --muted:#5f6b76; --line:#d9dee3; --run:#1f6fb2; --seed:#8c8c8c; --bg:#fbfcfd; }
* { box-sizing: border-box; }
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--ink);
       background: var(--bg); margin: 0; line-height: 1.45; font-size: 14px; }
header { background: #16324f; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 4px 0; font-size: 22px; }
header p { margin: 2px 0; color: #d5e2ef; font-size: 13px; }
main { max-width: 1180px; margin: 0 auto; padding: 8px 24px 40px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; margin: 18px 0; padding: 14px 18px; }
h2 { font-size: 18px; margin: 4px 0 6px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
h4 { font-size: 13px; margin: 10px 0 4px; color: var(--muted); text-transform: uppercase; letter-spacing: .04em; }
p.intro { color: var(--muted); margin: 0 0 8px; }
.pair { display: grid; grid-template-columns: minmax(0, 1.25fr) minmax(0, 1fr); gap: 18px; align-items: start;
        margin: 0 0 22px; }
header a { color: #cfe3ff; }
.run { border-left: 4px solid var(--run); padding-left: 12px; }
.seed { border-left: 4px solid var(--seed); padding-left: 12px; background: #f6f6f6; padding: 8px 12px; }
.seed p { font-size: 13px; color: #444; }
img.fig { max-width: 100%; height: auto; display: block; margin: 6px 0; border: 1px solid #eef0f2; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 12.5px; width: 100%; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f1f4f7; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 11.5px; margin-left: 6px;
         background: #e7eef6; color: #16324f; }
.badge.demo { background: #e8f4ea; color: #1e5a2c; }
.badge.stale { background: #fde8e8; color: #8a1c1c; }
.badge.mimic { background: #fbeee0; color: #7a3e06; }
.warn { color: #7a3e06; background: #fff1e0; border: 1px solid #f0b36b; padding: 6px 10px; border-radius: 4px;
        font-weight: 600; }
.legend { color: var(--muted); font-size: 12px; margin: 2px 0 10px; }
.notrun { color: #8a6d00; background: #fff8db; border: 1px dashed #e2c35b; padding: 8px 12px; border-radius: 4px; }
.ok { color: #1e6b34; font-weight: 600; }
.bad { color: #a3212f; font-weight: 600; }
.meta { color: var(--muted); font-size: 12px; }
footer { color: var(--muted); font-size: 12px; max-width: 1180px; margin: 0 auto; padding: 0 24px 30px; }
@media (max-width: 820px) { .pair { grid-template-columns: 1fr; } }
"""


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
        and the forget registry are never read.

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
        if any(p.startswith(".") for p in parts) or parts[0] == "forget-registry":
            continue
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


# --------------------------------------------------------------------------------------------
# formatting helpers
# --------------------------------------------------------------------------------------------
def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) < 1e-3 or abs(v) >= 1e6:
            return f"{v:.3e}"
        return f"{v:.4g}"
    if isinstance(v, Mapping):
        return "; ".join(f"{metric_label(str(k))} = {_fmt(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_fmt(x) for x in v[:12])
        return f"[{inner}{', …' if len(v) > 12 else ''}]"
    return str(v)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


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
    """A visible warning when the card's intervals or estimates rest on few units (< MIN_STAYS
    stays, or contexts for patient deletion) or an interval has zero width; "" otherwise."""
    msgs = []
    key, unit = POWER_UNITS.get(p["study"], ("", ""))
    count = p.get("metrics", {}).get(key) if key else None
    if _is_num(count) and count < MIN_STAYS:
        msgs.append(f"rests on {int(count):,} {unit} (fewer than {MIN_STAYS}): intervals and estimates here are "
                    "low-power and can move a lot on another cohort")
    zero = _zero_width_cis(p)
    if zero:
        msgs.append(f"{zero} interval(s) have zero width (e.g. a bootstrap over a single stay): they show no "
                    "uncertainty, not certainty")
    if not msgs:
        return ""
    return '<p class="warn">⚠ Low power: this result ' + "; ".join(_e(m) for m in msgs) + ".</p>"


HOLDS_LEGEND = ("holds: whether this run's own value meets the claim's stated condition, checked by the study on "
                "this run (e.g. a 95 % CI lower bound above 0, or the decrement's deviation below decay's); yes/no, "
                "— when the study states no condition. It is not the seed's verdict and not a significance test.")


def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]], raw_cols: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for j, c in enumerate(r):
            if j in raw_cols:
                cells.append(f"<td>{c}</td>")
            else:
                cls = ' class="num"' if _is_num(c) else ""
                cells.append(f"<td{cls}>{_e(_fmt(c))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _img(spec: Mapping[str, Any], *, seed: bool) -> str:
    uri = png_data_uri(render_png(spec, seed=seed))
    alt = ("seed figure: " if seed else "figure: ") + str(spec.get("title", spec["kind"]))
    return f'<img class="fig" src="{uri}" alt="{_e(alt)}">'


# --------------------------------------------------------------------------------------------
# blocks
# --------------------------------------------------------------------------------------------
_STALE: dict[str, int] = {}  # result path -> receipt seq it predates (set by render_report)


def _ledger_html(m: Mapping[str, Any]) -> str:
    """The ledger card's headline: receipts, verification, head, last deletion (no identifiers)."""
    ok = bool(m.get("chain_verified"))
    status = ('<span class="ok">verified</span>' if ok else '<span class="bad">NOT verified</span>')
    n = int(m.get("receipts", 0))
    text = (f"<p>{n:,} deletion receipt(s); keyed chain {status}"
            + (f"; {int(m.get('pending_erasures', 0))} erasure(s) pending" if m.get("pending_erasures") else "")
            + (f"; last deletion {_e(m['last_deletion_utc'])}" if m.get("last_deletion_utc") else "")
            + ".</p>")
    if n:
        text += (f'<p class="meta">head <code>{_e(m.get("head", ""))}</code> — an auditor keeps it and later runs '
                 f'<code>forgetful receipts verify --head HEAD --min-count {n}</code>.</p>')
    else:
        text += '<p class="meta">No patient has been forgotten: the ledger is empty (nothing to verify yet).</p>'
    return text


def _run_block(res: LoadedResult) -> str:
    p = res.payload
    data = p["data"]
    stale = _STALE.get(res.path)
    parts = [
        f'<h3>{_e(p["title"])}<span class="badge {_e(data)}">{_e(DATA_LABELS.get(data, data))}</span>'
        + (f'<span class="badge stale">stale since receipt #{stale}: rerun</span>' if stale else "") + "</h3>",
        f'<p class="meta">study <code>{_e(p["study"])}</code> · file <code>{_e(res.path)}</code> · '
        f'runtime {_e(_fmt(float(p["runtime_s"])))} s'
        + (f' · created {_e(p["created"])}' if "created" in p else "") + "</p>",
    ]
    warn = low_power_warning(p)
    if warn:
        parts.append(warn)
    if p["study"] == "ledger":
        parts.append(_ledger_html(p["metrics"]))
    for fig in p["figures"]:
        parts.append(_img(fig, seed=False))
    if p.get("claims"):
        parts.append("<h4>Claims (each with its reference state and numerical path)</h4>")
        parts.append(_claims_table(p["claims"]))
    if "receipts" in p:
        parts.append("<h4>Deletion receipts</h4>" + _receipts_table([res]))
    for tab in p["tables"]:
        if tab.get("title"):
            parts.append(f"<h4>{_e(tab['title'])}</h4>")
        parts.append(_table(tab["columns"], tab["rows"]))
    if p["metrics"]:
        parts.append("<h4>Metrics</h4>" + _table(["metric", "value"], _named(p["metrics"])))
    if p.get("config"):
        parts.append("<h4>Configuration</h4>" + _table(["parameter", "value"], _named(p["config"])))
    if p.get("notes"):
        parts.append(f'<p class="meta">{_e(p["notes"])}</p>')
    return '<div class="run">' + "".join(parts) + "</div>"


#: clinical studies whose seed figures come from real MIMIC-IV records
REAL_DATA_STUDIES = frozenset({"cohort", "icu_retention", "heldout_spo2", "patient_deletion", "deterioration"})


def _seed_for(study: str, payload: Mapping[str, Any]) -> str:
    """The seed block beside a run — except a synthetic run of a real-data study, which is never
    placed beside the seed's real-data figures as if comparable."""
    if study in REAL_DATA_STUDIES and payload.get("data") == "synthetic":
        return ('<div class="seed"><h4>Seed figure</h4><p class="notrun">Not shown: this run used synthetic data; the '
                'seed figure is from real MIMIC-IV records and is not comparable.</p></div>')
    return _seed_block(study, payload["seed_figure"])


def _seed_block(study: str, from_result: Mapping[str, Any] | None) -> str:
    seed = dict(SEED_FIGURES.get(study, {}))
    if from_result:
        seed.update({k: v for k, v in from_result.items() if v is not None})
    if not seed:
        return '<div class="seed"><h4>Seed figure</h4><p>No published comparator for this study.</p></div>'
    parts = ["<h4>Seed figure</h4>"]
    if seed.get("figure"):
        parts.append(_img(seed["figure"], seed=True))
    if seed.get("text"):
        parts.append(f"<p>{_e(seed['text'])}</p>")
    if seed.get("values") and not seed.get("figure"):
        parts.append(_table(["seed quantity", "value"], _named(seed["values"])))
    if seed.get("source"):
        parts.append(f'<p class="meta">source: {_e(seed["source"])}</p>')
    return '<div class="seed">' + "".join(parts) + "</div>"


def _claims_table(claims: Sequence[Mapping[str, Any]], study_col: Sequence[str] | None = None) -> str:
    cols = (["study"] if study_col else []) + ["statement", "reference state", "numerical path", "value", "holds"]
    rows = []
    for i, c in enumerate(claims):
        holds = c.get("holds")
        mark = "—" if holds is None else ('<span class="ok">yes</span>' if holds else '<span class="bad">no</span>')
        row = ([study_col[i]] if study_col else []) + [c["statement"], c["reference"], c["path"], c.get("value"), mark]
        rows.append(row)
    return _table(cols, rows, raw_cols=(len(cols) - 1,)) + f'<p class="legend">{_e(HOLDS_LEGEND)}</p>'


def _receipts_table(results: Sequence[LoadedResult]) -> str:
    rows = []
    for r in results:
        rec = r.payload["receipts"]
        chain = '<span class="ok">verified</span>' if rec["chain_verified"] else '<span class="bad">NOT verified</span>'
        done = (f"{rec['completed']:,} / {rec['attempted']:,}" if "completed" in rec and "attempted" in rec else "—")
        rows.append([r.payload["study"], r.payload["data"], rec["count"], rec["certified"], done, chain])
    return _table(["study", "data", "receipts", "certified", "completed / attempted", "receipt chain"], rows,
                  raw_cols=(5,))


def _section_html(sec: Section, by_study: Mapping[str, list[LoadedResult]]) -> str:
    parts = [f'<section id="{_e(sec.key)}"><h2>{_e(sec.title)}</h2><p class="intro">{_e(sec.intro)}</p>']
    for study in sec.studies:
        found = by_study.get(study, [])
        if not found:
            label = study.replace("_", " ")
            run = (f'<div class="run"><h3>{_e(label)}</h3><p class="notrun">not run — no result file for study '
                   f'<code>{_e(study)}</code> under the runs directory.</p></div>')
            parts.append(f'<div class="pair">{run}{_seed_block(study, None)}</div>')
            continue
        for res in found:
            parts.append(f'<div class="pair">{_run_block(res)}{_seed_for(study, res.payload)}</div>')
    if sec.key == "deletion":
        with_receipts = [r for rs in by_study.values() for r in rs if "receipts" in r.payload]
        parts.append("<h3>Receipts summary (all studies)</h3>")
        parts.append(_receipts_table(with_receipts) if with_receipts
                     else '<p class="notrun">not run — no result file carries deletion receipts.</p>')
    parts.append("</section>")
    return "".join(parts)


def _contract_card_html(results: Sequence[LoadedResult]) -> str:
    claims, owners = [], []
    for r in results:
        for c in r.payload.get("claims", []):
            claims.append(c)
            owners.append(r.payload["study"])
    rows = []
    for row in CONTRACT_CARD:
        ev = [f"{_e(o)}: {_e(c['statement'])} = {_e(_fmt(c.get('value')))}"
              + ("" if c.get("holds") is None else (" <span class='ok'>✓</span>" if c["holds"] else " <span class='bad'>✗</span>"))
              for c, o in zip(claims, owners) if c.get("operation") == row["operation"]]
        rows.append([row["operation"], row["statement"], row["reference"], row["boundary"],
                     "<br>".join(ev) if ev else "<span class='meta'>no claim in this report</span>"])
    parts = ['<section id="contract"><h2>Contract card</h2>',
             '<p class="intro">Seed 001 Table 1. Each claim names its reference state and numerical path; '
             "algebraic and empirical statements are kept distinct. The last column lists this report's claims "
             "filed under each operation.</p>",
             _table(["operation", "certified statement", "reference and path", "explicit boundary",
                     "evidence in this report"], rows, raw_cols=(4,)),
             '<p class="legend">✓ / ✗: the claim holds / does not hold on this run. ' + _e(HOLDS_LEGEND) + "</p>"]
    if claims:
        parts.append("<h3>All claims in this report</h3>" + _claims_table(claims, owners))
    parts.append("</section>")
    return "".join(parts)


def _summary_html(results: Sequence[LoadedResult], skipped: Sequence[str]) -> str:
    rows = []
    for r in results:
        p = r.payload
        rows.append([p["study"], p["title"], p["data"], float(p["runtime_s"]), r.path])
    known = {s for sec in SECTIONS for s in sec.studies}
    missing = sorted(known - {r.payload["study"] for r in results})
    parts = ['<section id="summary"><h2>Studies in this report</h2>']
    parts.append(_table(["study", "title", "data", "runtime (s)", "file"], rows) if rows
                 else '<p class="notrun">No result files found — every section shows "not run".</p>')
    if missing:
        parts.append(f'<p class="meta">not run: {_e(", ".join(missing))}</p>')
    if skipped:
        parts.append(f'<p class="meta">skipped non-result JSON files: {_e(", ".join(skipped))}</p>')
    parts.append("</section>")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------
def render_report(runs_dir: str | os.PathLike, *, title: str = "forgetful — study report") -> str:
    """Validate every result under ``runs_dir`` and return the report as one HTML string."""
    results, skipped = load_results(runs_dir)
    _STALE.clear()
    stale_file = Path(runs_dir) / "stale.json"
    if stale_file.is_file():
        try:
            st = json.loads(stale_file.read_text())
            _STALE.update({str(f): int(st["receipt_seq"]) for f in st.get("files", [])})
        except (ValueError, KeyError, TypeError):
            pass
    by_study: dict[str, list[LoadedResult]] = {}
    for r in results:
        by_study.setdefault(r.payload["study"], []).append(r)
    sources = sorted({r.payload["data"] for r in results})
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    credit = ""
    if "demo" in sources:
        credit = ("Real records: MIMIC-IV Clinical Database Demo (PhysioNet, ODbL), as converted to CLIF 2.1 by "
                  "the CLIF consortium. ")
    nav = " · ".join(f'<a href="#{s.key}">{_e(s.title)}</a>' for s in SECTIONS)
    body = [
        "<header>",
        f"<h1>{_e(title)}</h1>",
        f"<p>Generated {now} from {len(results)} result file(s); data: {_e(', '.join(sources) or 'none')}. "
        "Aggregates only — no record-level data.</p>",
        f"<p>{nav} · <a href='#contract'>Contract card</a></p>",
        "</header><main>",
        _summary_html(results, skipped),
    ]
    for sec in SECTIONS:
        body.append(_section_html(sec, by_study))
    from dashboards.stream_card import STUDY as _STREAM  # streaming ingest (issue 13)
    from dashboards.stream_card import stream_section_html

    body.append(stream_section_html(by_study.get(_STREAM, [])))
    others = [r for r in results if r.payload["study"] not in KNOWN_STUDIES and r.payload["study"] != _STREAM]
    if others:
        body.append('<section id="other"><h2>Other studies</h2>')
        for r in others:
            body.append(f'<div class="pair">{_run_block(r)}{_seed_block(r.payload["study"], r.payload["seed_figure"])}</div>')
        body.append("</section>")
    body.append(_contract_card_html(results))
    body.append("</main>")
    body.append(f"<footer>{_e(credit)}Seed figures are published comparators (seed 001 / SPEC §3), drawn in grey; "
                "they are not this project's results.</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>" + "".join(body) + "</body></html>\n")


def write_report(runs_dir: str | os.PathLike, out: str | os.PathLike, **kw: Any) -> Path:
    """Render and write atomically: on any error the output path is left untouched."""
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
