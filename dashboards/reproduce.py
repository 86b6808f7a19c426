"""Generated figure documentation: ``docs/FIGURES.md`` and the README's headline table, written from
stored result files (never hand-copied numbers).

    python -m dashboards.reproduce --runs runs [--runs runs_synth …] --write      # regenerate
    python -m dashboards.reproduce --runs runs --check                          # exit 1 if stale

``docs/FIGURES.md`` holds, per study, its headline table(s) and claims as the result file states
them (numbers at 3 significant digits), its data source and run time. The README's headline
table sits between ``<!-- headline:begin -->`` and ``<!-- headline:end -->`` and is rebuilt from
the same files (:data:`HEADLINE`). ``tests/test_reproduce_docs.py`` reruns the cheap synthetic
studies and fails when the committed ``docs/FIGURES.md`` disagrees with them.

Agreement (``--check`` and the test) is judged at the precision the docs print, never at rounding
noise (:func:`figure_differences`): the text around the numbers must be identical; two printed
numbers agree when they are the same string, differ by at most one unit in the last digit either
of them prints (a value on a rounding boundary may print either way on another machine), or are
both residuals below :data:`RESIDUAL_BOUND` (their digits are BLAS and summation-order noise).
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dashboards.commands import RESULT_COMMANDS
from dashboards.errors import ReportError
from dashboards.report import load_results

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "FIGURES.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"

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
#: the command stated beside each study: the one that writes its result (dashboards.commands), except
#: where another reproduces the figure itself
COMMANDS = {**RESULT_COMMANDS, "ledger": "forgetful receipts verify",
            "synthetic_fidelity": "python -m cohort.synthetic --fidelity"}
DATA = {"demo": "real MIMIC-IV demo", "synthetic": "synthetic",
        "mimic": "user MIMIC-IV root", "clif": "user CLIF root", "text": "text corpus"}


def fmt(x: Any) -> str:
    """3 significant digits for floats (exact zeros stay 0), integers with separators."""
    if isinstance(x, bool) or x is None:
        return "–" if x is None else str(x).lower()
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x == 0:
            return "0"
        if abs(x) >= 1e5 or abs(x) < 1e-3:
            return f"{x:.2e}"
        return f"{x:.3g}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    if isinstance(x, Mapping):
        return "; ".join(f"{k} {fmt(v)}" for k, v in x.items())
    return str(x).replace("|", "\\|").replace("\n", " ")


#: A printed figure below this is a residual at fp64 rounding level (a deviation from a refit, a
#: readout change, a KKT residual): its digits depend on BLAS and summation order, so another machine
#: prints other digits. Docs and reruns agree on such a figure when both lie below this bound, the
#: one the project documents for its certificates (README: "measured change ≤ 1e-12"; the KKT guard
#: polishes above 1e-12).
RESIDUAL_BOUND = 1e-12
_NUMBER = re.compile(r"(-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?)")


def _unit(token: str) -> float:
    """One unit in the last digit ``token`` prints: ``0.899`` -> 1e-3, ``2.49e-14`` -> 1e-16, ``80`` -> 1."""
    mant, _, exp = token.replace(",", "").partition("e")
    decimals = len(mant.partition(".")[2])
    return 10.0 ** (int(exp or 0) - decimals)


def _numbers_agree(a: str, b: str) -> bool:
    if a == b:
        return True
    x, y = float(a.replace(",", "")), float(b.replace(",", ""))
    if abs(x) < RESIDUAL_BOUND and abs(y) < RESIDUAL_BOUND:
        return True
    return abs(x - y) <= min(_unit(a), _unit(b)) * (1 + 1e-9)


def figure_differences(old: str, new: str, limit: int = 5) -> list[str]:
    """Lines where ``new`` disagrees with ``old`` at the printed precision (empty: they agree).

    The words, punctuation and layout must be identical; numbers are compared by
    :func:`_numbers_agree` (same string, one unit in the last printed digit, or both residuals
    below :data:`RESIDUAL_BOUND`). Returns at most ``limit`` human-readable differences."""
    a, b = old.splitlines(), new.splitlines()
    out: list[str] = []
    if len(a) != len(b):
        out.append(f"{len(a)} lines vs {len(b)} lines")
    for i, (la, lb) in enumerate(zip(a, b), 1):
        pa, pb = _NUMBER.split(la), _NUMBER.split(lb)
        same_text = len(pa) == len(pb) and pa[0::2] == pb[0::2]
        if not same_text or not all(_numbers_agree(x, y) for x, y in zip(pa[1::2], pb[1::2])):
            out.append(f"line {i}: {la!r} vs {lb!r}")
        if len(out) >= limit:
            break
    return out


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(fmt(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return out


def _comparability(p: Mapping[str, Any]) -> str:
    """`` (seed figure not comparable: why)`` where :func:`dashboards.seed_figures.seed_comparability`
    says so, else ""."""
    from dashboards.seed_figures import seed_comparability

    c = seed_comparability(p["study"], p["data"])
    if not c["comparable"]:
        return f" (seed figure not comparable: {c['reason']})"
    return f" (not comparable in part: {c['partial']})" if c["partial"] else ""


def study_section(p: Mapping[str, Any], source: str) -> list[str]:
    """Markdown of one result: title, provenance, headline tables, claims."""
    out = [f"### {p['title']}", "",
           f"`{COMMANDS.get(p['study'], p['study'])}` · data: {DATA.get(p['data'], p['data'])}{_comparability(p)}"
           f" · file `{source}`", "",
           f"runtime: {fmt(float(p['runtime_s']))} s", ""]
    for tab in p.get("tables", [])[:3]:
        if tab.get("title"):
            out += [f"*{fmt(tab['title'])}*", ""]
        out += _table(tab["columns"], tab["rows"]) + [""]
    for c in p.get("claims", []):
        holds = c.get("holds")
        mark = "" if holds is None else (" — holds" if holds else " — **does not hold**")
        out.append(f"- {fmt(c['statement'])}: {fmt(c.get('value'))}{mark}")
    if p.get("claims"):
        out.append("")
    return out


def render_figures(runs_dirs: Sequence[str | Path], studies: Sequence[str] | None = None) -> str:
    """``docs/FIGURES.md`` from the result files of ``runs_dirs`` (first directory wins per study)."""
    found: dict[str, tuple[Mapping, str]] = {}
    for d in runs_dirs:
        results, _ = load_results(d)
        for r in results:
            found.setdefault(r.payload["study"], (r.payload, f"{Path(d).name}/{r.path}"))
    lines = ["# Figures (generated — do not edit)", "",
             "Written by `python -m dashboards.reproduce --write` from the stored result files; every number below "
             "is read from a result JSON. Seed figures live in the report and `REPRODUCE.md`; a real-data study run "
             "on synthetic data says that its seed figure (from real MIMIC-IV records) is not comparable.", ""]
    for title, names in ORDER:
        names = [s for s in names if s in found and (studies is None or s in studies)]
        if not names:
            continue
        lines += [f"## {title}", ""]
        for s in names:
            lines += study_section(*found[s])
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------- README
def _get(p: Mapping | None, *path: str) -> Any:
    for k in path:
        if not isinstance(p, Mapping) or k not in p:
            return None
        p = p[k]
    return p


def _ret(p):
    r = _get(p, "metrics", "retention") or {}
    if not r:
        return None
    d = _get(p, "metrics", "diff_sv_minus_density") or {}
    lev = _get(p, "metrics", "diff_sv_minus_leverage") or {}
    s = f"SV {fmt(r.get('sv'))} vs density {fmt(r.get('density'))}"
    if isinstance(d, Mapping) and "low" in d:
        s += f", diff {fmt(d.get('mean', d.get('diff')))} [{fmt(d['low'])}, {fmt(d['high'])}]"
    if "leverage" in r:
        s += f"; ridge leverage {fmt(r['leverage'])}"
        if isinstance(lev, Mapping) and "low" in lev:
            s += f" (SV − leverage {fmt(lev.get('mean', lev.get('diff')))} [{fmt(lev['low'])}, {fmt(lev['high'])}])"
    beats = _get(p, "metrics", "peer_beats_sv")
    if beats:
        s += f"; **beats SV: {', '.join(map(str, beats))}**"
    n = _get(p, "metrics", "n_stays_included")
    return s + (f" ({n} stays)" if n else "")


HEADLINE: tuple[tuple[str, str, Callable[[Mapping], str | None], str], ...] = (
    ("deletion audit, decrement vs same-C refit", "deletion_audit",
     lambda p: _get(p, "metrics", "headline") or (
                f"{fmt(_get(p, 'metrics', 'completed'))}/{fmt(_get(p, 'metrics', 'attempted'))} complete, "
                f"worst max |Δ score| {fmt(max(v['score_dev_worst'] for v in p['metrics'].values() if isinstance(v, Mapping) and 'score_dev_worst' in v))}")
     if _get(p, "metrics", "completed") is not None else None, "1,199/1,200, worst 1.1e-2"),
    ("ICU event-hour retention at budget |S∪E|", "icu_retention", _ret, "0.80 vs 0.05"),
    ("held-out SpO₂ control", "heldout_spo2", _ret, "0.464 vs 0.225, diff 0.239 [0.194, 0.284]"),
    ("patient deletion: gap to a same-C refit (exact vs naive removal) and leakage", "patient_deletion",
     lambda p: _get(p, "metrics", "headline") or (f"{fmt(_get(p, 'metrics', 'leakage_after_max'))}; "
                f"{fmt(_get(p, 'metrics', 'decay_leakage_mean', 'gamma_0.1'))} / "
                f"{fmt(_get(p, 'metrics', 'decay_leakage_mean', 'gamma_0.01'))}")
     if _get(p, "metrics", "leakage_after_max") is not None else None, "leakage 0; decay 0.29 / 0.09 (γ not stated)"),
    ("receipt ledger after the main job", "ledger",
     lambda p: (f"{fmt(_get(p, 'metrics', 'receipts'))} receipts, chain "
                f"{'verified' if _get(p, 'metrics', 'chain_verified') else 'NOT verified'}"), "– (no ledger in the seed)"),
)


def render_headline(runs_dirs: Sequence[str | Path]) -> str:
    found: dict[str, Mapping] = {}
    for d in runs_dirs:
        for r in load_results(d)[0]:
            found.setdefault(r.payload["study"], r.payload)
    rows = []
    for claim, study, fn, seed in HEADLINE:
        p = found.get(study)
        val = fn(p) if p is not None else None
        if val is None:
            continue
        data = DATA.get(p["data"], p["data"]).split(" (")[0]
        if study == "deletion_audit":  # its regimes mix the warehouse's stays with synthetic keys
            data += " and synthetic regimes"
        esc = lambda t: str(t).replace("|", "\\|")  # noqa: E731
        rows.append(f"| {esc(claim)} ({data}) | {esc(val)} | {esc(seed)} |")
    return "\n".join([BEGIN, "| claim | here | seed |", "|---|---|---|", *rows, END])


def _replace_block(text: str, block: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README has no {BEGIN} … {END} block")
    return re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)


def _normal(text: str) -> str:
    """Run times vary between runs; the check compares everything else."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("runtime:"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards.reproduce",
                                 description="Write docs/FIGURES.md and the README's headline table from the stored "
                                             "result files (never hand-copied numbers), or check that they match. "
                                             "Both read the runs directories of `forgetful run-all` (exit 2 when "
                                             "there are none).")
    ap.add_argument("--runs", action="append", default=None, help="runs directory (repeatable; default: runs)")
    ap.add_argument("--figures", default=str(FIGURES), help="output markdown (default: docs/FIGURES.md)")
    ap.add_argument("--readme", default=str(README))
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="regenerate docs/FIGURES.md and the README headline table")
    g.add_argument("--check", action="store_true", help="exit 1 when the committed docs differ from the results")
    a = ap.parse_args(argv)
    runs = a.runs or ["runs"]
    try:  # a fresh clone has no runs/: say what to run first, in one line, and touch nothing
        fig = render_figures(runs)
        headline = render_headline(runs)
    except ReportError as exc:
        print(f"error: {exc}; the docs are generated from result files: run `forgetful run-all` first "
              "(or name its runs directory with --runs)", file=sys.stderr)
        return 2
    readme = Path(a.readme).read_text()
    new_readme = _replace_block(readme, headline)
    if a.write:
        Path(a.figures).parent.mkdir(parents=True, exist_ok=True)
        Path(a.figures).write_text(fig)
        Path(a.readme).write_text(new_readme)
        print(f"wrote {a.figures} and the headline table of {a.readme}")
        return 0
    ok = not figure_differences(_normal(Path(a.figures).read_text()), _normal(fig)) and not figure_differences(
        readme, new_readme)
    print("docs match the results" if ok else "docs differ from the results: run python -m dashboards.reproduce --write",
          file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
