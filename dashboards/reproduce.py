"""Generated figure documents, written from committed result files, and the check that a fresh run
reproduces them.

    python -m dashboards.reproduce --write              # docs from docs/results/ (committed)
    python -m dashboards.reproduce --store runs --write # copy a fresh run's results in, then write
    python -m dashboards.reproduce --check              # after `make demo`: runs/ vs the docs

``docs/results/demo/`` holds the result files of one ``make demo`` run and ``docs/results/studies/``
those of studies run apart (the language model): aggregates only, validated by
:func:`dashboards.schema.validate_result` (which refuses record-level data). ``docs/FIGURES.md``,
the README's headline table (:mod:`dashboards.headline`) and REPRODUCE.md's language-model block
are rendered from them, so anyone can regenerate them from what is committed.

``--check`` renders the same documents from a run (``--runs``; default ``runs/`` when it holds
results, studies it lacks taken from the committed files) and compares them with the committed
documents study by study, at the precision they print (:func:`figure_differences`); without a
run it checks that the committed documents equal a rendering of the committed results.
"""
from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dashboards.commands import RESULT_COMMANDS
from dashboards.errors import ReportError
from dashboards.headline import BEGIN, END, headline_rows, lm_block, render_headline
from dashboards.numbers import doc_fmt, md_table
from dashboards.report import load_results

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "FIGURES.md"
README = ROOT / "README.md"
REPRODUCE_MD = ROOT / "REPRODUCE.md"
RESULTS = ROOT / "docs" / "results"
DEMO_RESULTS = RESULTS / "demo"
STUDY_RESULTS = RESULTS / "studies"
COMMITTED = (DEMO_RESULTS, STUDY_RESULTS)
LM_BEGIN, LM_END = "<!-- lm:begin -->", "<!-- lm:end -->"
#: studies stored in docs/results/studies/ (run apart from `make demo`); every other goes to demo/
APART = ("language_model", "throughput", "deletion_latency")

#: (section title, studies in order)
ORDER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Clinical studies", ("cohort", "icu_retention", "heldout_spo2", "patient_deletion", "deterioration", "ledger")),
    ("Exact gate", ("deletion_audit", "deletion_latency")),
    ("Synthetic, learned-key and retrieval studies",
     ("planted_secret", "skewed_redundancy", "streaming_eviction", "selective_copying", "capacity", "mqar_control",
      "learned_keys", "retrieval_memory", "synthetic_fidelity")),
    ("Language model", ("language_model", "throughput")),
)
#: studies cheap enough to rerun in the default test suite (seconds, seeded)
CHEAP = ("planted_secret", "skewed_redundancy", "streaming_eviction")
COMMANDS = {**RESULT_COMMANDS, "ledger": "forgetful receipts verify",
            "synthetic_fidelity": "python -m cohort.synthetic --fidelity"}
DATA = {"demo": "real MIMIC-IV demo", "synthetic": "synthetic",
        "mimic": "user MIMIC-IV root", "clif": "user CLIF root", "text": "text corpus"}

#: timing studies: figures are seconds of this machine; printed, never compared
TIMED = ("throughput", "deletion_latency")


def study_tolerance(payload: Mapping[str, Any] | None) -> dict[str, float]:
    """The loosest of the tolerances a result states (``tolerances`` at the top and per table
    column, dashboards/SCHEMA.md): how far a figure of that study may move on another machine.
    Empty for a study that states none: its figures must agree at the precision they print."""
    specs = list(((payload or {}).get("tolerances") or {}).values())
    for t in (payload or {}).get("tables", []):
        specs += list((t.get("tolerances") or {}).values())
    out: dict[str, float] = {}
    for spec in specs:
        for k in ("abs", "rel", "decades"):
            if isinstance(spec.get(k), (int, float)):
                out[k] = max(out.get(k, 0.0), float(spec[k]))
    return out


_NUMBER = re.compile(r"(-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?)")


def _unit(token: str) -> float:
    """One unit in the last digit ``token`` prints: ``0.899`` -> 1e-3, ``2.49e-14`` -> 1e-16, ``80`` -> 1."""
    mant, _, exp = token.replace(",", "").partition("e")
    decimals = len(mant.partition(".")[2])
    return 10.0 ** (int(exp or 0) - decimals)


def _numbers_agree(a: str, b: str, tol: Mapping[str, float] | None = None, bound: bool = False,
                   timed: bool = False) -> bool:
    """Same string; one unit in the last printed digit; for printed bounds (``< 1e-k``) the same or
    the next decade (more where ``tol`` allows decades); within a study's stated tolerance ``tol``
    (:func:`study_tolerance`); anything for a timing."""
    if a == b or timed:
        return True
    x, y = float(a.replace(",", "")), float(b.replace(",", ""))
    tol = tol or {}
    if bound:
        return x > 0 and y > 0 and abs(math.log10(x / y)) <= max(1.0, tol.get("decades", 0.0)) + 1e-9
    if abs(x - y) <= min(_unit(a), _unit(b)) * (1 + 1e-9):
        return True
    if abs(x - y) <= tol.get("abs", 0.0) or abs(x - y) <= tol.get("rel", 0.0) * max(abs(x), abs(y)):
        return True
    return x > 0 and y > 0 and abs(math.log10(x / y)) <= tol.get("decades", 0.0)


def figure_differences(old: str, new: str, limit: int = 5, tol: Mapping[str, float] | None = None,
                       timed: bool = False) -> list[str]:
    """Lines where ``new`` disagrees with ``old`` at the precision they print (empty: they agree).

    Words, punctuation and layout must be identical; numbers are compared by :func:`_numbers_agree`
    (``tol``: the study's stated tolerance; ``timed``: a timing, never compared). At most ``limit``."""
    a, b = old.splitlines(), new.splitlines()
    out: list[str] = []
    if len(a) != len(b):
        out.append(f"{len(a)} lines vs {len(b)} lines")
    for i, (la, lb) in enumerate(zip(a, b), 1):
        pa, pb = _NUMBER.split(la), _NUMBER.split(lb)
        same_text = len(pa) == len(pb) and pa[0::2] == pb[0::2]
        agree = same_text and all(_numbers_agree(x, y, tol, bound=pa[2 * k].endswith("< "), timed=timed)
                                  for k, (x, y) in enumerate(zip(pa[1::2], pb[1::2])))
        if not agree:
            out.append(f"line {i}: {la!r} vs {lb!r}")
        if len(out) >= limit:
            break
    return out


def _comparability(p: Mapping[str, Any]) -> str:
    from dashboards.seed_figures import seed_comparability

    c = seed_comparability(p["study"], p["data"])
    if not c["comparable"]:
        return f" (seed figure not comparable: {c['reason']})"
    return f" (not comparable in part: {c['partial']})" if c["partial"] else ""


def _anchor_file(study: str) -> str:
    return f"docs/results/{'studies' if study in APART else 'demo'}/{study}/result.json"


def study_section(p: Mapping[str, Any]) -> list[str]:
    """Markdown of one result: title, provenance, headline tables, claims (no run time: it varies)."""
    out = [f'<a id="{anchor(p["study"])}"></a>', "", f"### {p['title']}", "",
           f"`{COMMANDS.get(p['study'], p['study'])}` · data: {DATA.get(p['data'], p['data'])}{_comparability(p)}"
           f" · file `{_anchor_file(p['study'])}`", ""]
    for tab in p.get("tables", [])[:3]:
        if tab.get("title"):
            out += [f"*{doc_fmt(tab['title'])}*", ""]
        out += md_table(tab["columns"], tab["rows"], doc_fmt) + [""]
    for c in p.get("claims", []):
        status = c.get("status") or ({True: "holds", False: "does not hold"}.get(c.get("holds")))
        mark = "" if status is None else (" — holds" if status == "holds" else f" — **{status}**")
        out.append(f"- {doc_fmt(c['statement'])}: {doc_fmt(c.get('value'))}{mark}")
    if p.get("claims"):
        out.append("")
    return out


def anchor(study: str) -> str:
    """The stable link target of a study's section in docs/FIGURES.md (titles change with protocols)."""
    return f"study-{study.replace('_', '-')}"


def collect(runs_dirs: Sequence[str | Path]) -> dict[str, Mapping[str, Any]]:
    """study -> result payload; the first directory that holds a study wins."""
    found: dict[str, Mapping[str, Any]] = {}
    for d in runs_dirs:
        if Path(d) in COMMITTED and not Path(d).is_dir():
            continue  # a committed folder not made yet (no study run apart so far)
        for r in load_results(d)[0]:
            found.setdefault(r.payload["study"], r.payload)
    return found


def figure_blocks(found: Mapping[str, Mapping[str, Any]]) -> list[tuple[str | None, str]]:
    """``docs/FIGURES.md`` as (study or None, text) blocks, in document order."""
    blocks: list[tuple[str | None, str]] = [(None, "\n".join([
        "# Figures (generated — do not edit)", "",
        "Written by `python -m dashboards.reproduce --write` from the committed result files in "
        "`docs/results/`; every number below is read from a result JSON. Residuals print as the decade "
        "they lie below (`< 1e-12`: their digits are BLAS and summation-order noise). Seed figures live in "
        "the report and `REPRODUCE.md`; a real-data study run on synthetic data says that its seed figure "
        "is not comparable.", ""]))]
    for title, names in ORDER:
        names = tuple(s for s in names if s in found)
        if names:
            blocks.append((None, f"## {title}\n"))
            blocks += [(s, "\n".join(study_section(found[s]))) for s in names]
    return blocks


def render_figures(runs_dirs: Sequence[str | Path], studies: Sequence[str] | None = None) -> str:
    """``docs/FIGURES.md`` from the result files of ``runs_dirs`` (first directory wins per study)."""
    found = collect(runs_dirs)
    if studies is not None:
        found = {s: p for s, p in found.items() if s in studies}
    return "\n".join(t for _, t in figure_blocks(found)).rstrip() + "\n"


def _replace_block(text: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"the document has no {begin} … {end} block")
    return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)


def render_lm_block(found: Mapping[str, Mapping[str, Any]]) -> str:
    """REPRODUCE.md's language-model block: the committed result's per-seed table and tests."""
    return "\n".join([LM_BEGIN, *lm_block(found.get("language_model")), LM_END])


def store(runs: str | Path) -> list[str]:
    """Copy the result files of a run into ``docs/results/`` (demo/ or studies/); returns their names.
    Only validated result files are copied (:func:`load_results` refuses record-level data)."""
    results, _ = load_results(runs)
    stored = []
    for r in results:
        study = r.payload["study"]
        dest = (STUDY_RESULTS if study in APART else DEMO_RESULTS) / study / "result.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(runs) / r.path, dest)
        stored.append(study)
    return stored


def documents(runs_dirs: Sequence[str | Path], figures: Path, readme: Path, reproduce_md: Path) -> dict[Path, str]:
    """Every generated document, rendered from ``runs_dirs``."""
    found = collect(runs_dirs)
    out = {figures: "\n".join(t for _, t in figure_blocks(found)).rstrip() + "\n",
           readme: _replace_block(readme.read_text(), render_headline(found))}
    if reproduce_md.exists() and LM_BEGIN in reproduce_md.read_text():
        out[reproduce_md] = _replace_block(reproduce_md.read_text(), render_lm_block(found), LM_BEGIN, LM_END)
    return out


def check_run(runs_dirs: Sequence[str | Path]) -> list[str]:
    """Differences between the documents rendered from a run and from the committed results, study
    by study at printed precision (empty: the run reproduces every documented figure)."""
    fresh, committed = collect([*runs_dirs, *COMMITTED]), collect(COMMITTED)
    out: list[str] = []
    for (sa, ta), (sb, tb) in zip(figure_blocks(committed), figure_blocks(fresh)):
        if sa != sb:
            out.append(f"FIGURES.md: study {sa} vs {sb}")
            continue
        tol = study_tolerance(committed.get(sa)) if sa else None
        out += [f"FIGURES.md § {sa}: {d}" for d in figure_differences(ta, tb, tol=tol, timed=sa in TIMED)]
    rows_a, rows_b = headline_rows(committed), headline_rows(fresh)
    for (sa, ra), (_, rb) in zip(rows_a, rows_b):
        out += [f"README headline § {sa}: {d}"
                for d in figure_differences(ra, rb, tol=study_tolerance(committed.get(sa)), timed=sa in TIMED)]
    if len(rows_a) != len(rows_b):
        out.append(f"README headline: {len(rows_a)} rows vs {len(rows_b)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards.reproduce",
                                 description="Write docs/FIGURES.md, the README's headline table and REPRODUCE.md's "
                                             "language-model block from the committed result files in docs/results/ "
                                             "(never hand-copied numbers), or check that a run reproduces them.")
    ap.add_argument("--runs", action="append", default=None,
                    help="a run's results folder (repeatable). --check: default runs/ when it holds results; "
                         "--store: the run to copy into docs/results/")
    ap.add_argument("--figures", default=str(FIGURES), help="figures document (default: docs/FIGURES.md)")
    ap.add_argument("--readme", default=str(README))
    ap.add_argument("--reproduce-md", default=str(REPRODUCE_MD))
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="render the documents from docs/results/")
    g.add_argument("--store", action="store_true",
                   help="copy the result files of --runs into docs/results/, then render the documents")
    g.add_argument("--check", action="store_true",
                   help="exit 1 when a run (or, without one, the committed results) disagrees with the documents")
    a = ap.parse_args(argv)
    paths = (Path(a.figures), Path(a.readme), Path(a.reproduce_md))
    try:
        if a.store:
            if not a.runs:
                ap.error("--store needs --runs DIR (the run whose results to commit)")
            for r in a.runs:
                print(f"stored {', '.join(store(r))} from {r}")
        if a.write or a.store:
            for path, text in documents(COMMITTED, *paths).items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            print(f"wrote {', '.join(p.name for p in paths if p.exists())} from docs/results/")
            return 0
        runs = a.runs or ([ROOT / "runs"] if (ROOT / "runs").is_dir() and any((ROOT / "runs").glob("*/result.json"))
                          else [])
        problems = [f"{p.name}: {d}" for p, text in documents(COMMITTED, *paths).items()
                    for d in figure_differences(p.read_text(), text, limit=3)]
        if problems:
            problems.insert(0, "the committed documents are not a rendering of docs/results/ "
                               "(run python -m dashboards.reproduce --write)")
        if runs:
            problems += check_run(runs)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    what = f"run {', '.join(map(str, runs))}" if runs else "committed results"
    if problems:
        print(f"docs differ from the {what}:", *problems[:20], sep="\n  ", file=sys.stderr)
        return 1
    print(f"docs match the {what}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
