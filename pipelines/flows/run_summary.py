"""The short human summary ``forgetful run-all`` ends with: the headline figures of every study,
read from the result files (``<runs>/<study>/result.json``, ``dashboards/SCHEMA.md``) — never
recomputed — the report's path and the time each step took. At most about 20 lines.

Per clinical study one line: retention and the held-out SpO₂ control, SV against the seed's
comparator (the first claim) and against the closest peer (the smallest SV − peer difference),
each with its interval and whether its claim holds; deterioration, SV attention's seed-averaged
AUROC against the best other model with the paired difference; patient deletion and the audit,
their claim and value; the synthetic, learned-key and retrieval studies together, as claims
holding and the ones that do not. A result written before this run started (a skipped step) is
marked "earlier run"; one whose tasks came from the task cache, "cached".
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from dashboards.numbers import duration, fmt

#: clinical study -> the command that writes it (the summary's label)
CLINICAL = {"cohort": "build-cohort", "icu_retention": "retention", "heldout_spo2": "heldout-spo2",
            "patient_deletion": "patient-deletion", "deterioration": "deterioration", "deletion_audit": "audit",
            "ledger": "receipts"}
SYNTHETIC = ("planted_secret", "skewed_redundancy", "streaming_eviction", "selective_copying", "capacity",
             "mqar_control", "learned_keys", "retrieval_memory", "synthetic_fidelity")
DATA = {"demo": "real MIMIC-IV demo", "synthetic": "synthetic", "mimic": "your MIMIC-IV root", "clif": "your CLIF root",
        "meds": "your MEDS dataset"}
MODEL_NAMES = {"sv_attention": "SV attention", "softmax": "softmax", "lstm": "LSTM", "gru": "GRU",
               "lightgbm": "LightGBM"}
_DIFF = re.compile(r"SV minus (\S+)")
_CI = re.compile(r"^\s*(-?[\d.eE+-]+)\s*\[")


def _holds(c: dict) -> str:
    h = c.get("holds")
    return "" if h is None else (" holds" if h else " does NOT hold")


def _tally(p: dict) -> str:
    cl = [c for c in p.get("claims") or [] if c.get("holds") is not None]
    return f" · {sum(bool(c['holds']) for c in cl)}/{len(cl)} claims hold" if cl else ""


def _retention(p: dict) -> str:
    diffs = [(m.group(1), c) for c in p.get("claims") or [] if (m := _DIFF.search(c.get("statement", "")))
             and isinstance(c.get("value"), str)]
    if not diffs:
        return _generic(p)
    main_peer, main = diffs[0]
    out = f"SV − {main_peer} {main['value']}{_holds(main)}"
    close_peer, close = min(diffs, key=lambda d: float(_CI.match(d[1]["value"]).group(1))
                            if _CI.match(d[1]["value"]) else math.inf)
    if close_peer != main_peer:
        out += f"; closest peer: SV − {close_peer} {close['value']}{_holds(close)}"
    n = (p.get("metrics") or {}).get("n_stays_included")
    return out + (f" ({n} stays)" if n else "") + _tally(p)


def _deterioration(p: dict) -> str:
    m = p.get("metrics") or {}
    stays = f" ({m['test_stays']} test stays)" if m.get("test_stays") else ""
    if isinstance(m.get("headline"), str):  # the winner and its paired differences, as the study states them
        return m["headline"] + stays + _tally(p)
    sv = m.get("sv_attention")
    peers = [k for k in ("lstm", "gru", "softmax", "lightgbm")
             if isinstance(m.get(k), dict) and "auroc_seedavg" in m[k]]
    if not isinstance(sv, dict) or "auroc_seedavg" not in sv or not peers:
        return _generic(p)
    best = max(peers, key=lambda k: m[k]["auroc_seedavg"])

    def auc(k: str) -> str:
        r = m[k]
        return (f"{MODEL_NAMES[k]} {r['auroc_seedavg']:.3f} "
                f"[{r['auroc_seedavg_low']:.3f}, {r['auroc_seedavg_high']:.3f}]")
    out = f"AUROC {auc('sv_attention')} vs {auc(best)}"
    d = (m.get("paired") or {}).get(f"sv_attention - {best}")
    if isinstance(d, dict) and "auroc_diff" in d:
        out += f": Δ {d['auroc_diff']:.3f} [{d['auroc_diff_low']:.3f}, {d['auroc_diff_high']:.3f}]"
    return out + stays


def _audit(p: dict) -> str:
    m = p.get("metrics") or {}
    if m.get("headline"):  # maintained path / exact fallback / failed, against the paper's protocol
        return m["headline"] + _tally(p)
    worst = [(v["score_dev_worst"], k) for k, v in m.items() if isinstance(v, dict) and "score_dev_worst" in v]
    out = f"{fmt(m.get('completed'))}/{fmt(m.get('attempted'))} deletions complete"
    if worst:
        w, regime = max(worst)
        out += f", worst max |Δ score| vs refit {fmt(w)} ({regime})"
    return out + _tally(p)


def _cohort(p: dict) -> str:
    m = p.get("metrics") or {}
    source = (p.get("config") or {}).get("source")  # a MEDS build is real data ("mimic") read from a MEDS dataset
    what = DATA["meds"] if source == "meds" else DATA.get(p.get("data"), p.get("data"))
    return f"{fmt(m.get('n_stays'))} stays, {fmt(m.get('n_tokens'))} hourly tokens ({what})"


def _ledger(p: dict) -> str:
    m = p.get("metrics") or {}
    return (f"{fmt(m.get('receipts'))} deletion receipt(s), "
            f"chain {'verified' if m.get('chain_verified') else 'NOT verified'}")


def _generic(p: dict) -> str:
    claims = p.get("claims") or []
    if not claims:
        return p.get("title", "")
    c = next((c for c in claims if c.get("holds") is False), claims[0])
    value = c.get("value")
    value = fmt(value) if isinstance(value, (int, float)) else (value if isinstance(value, str) else "")
    text = c["statement"] + (f": {value}" if value and len(value) < 40 else "")
    return (text if len(text) <= 80 else text[:79] + "…") + _holds(c) + _tally(p)


def _patient_deletion(p: dict) -> str:
    """The evidence that tells exact deletion from removal: both gaps to the same-C refit."""
    c = next((c for c in p.get("claims") or [] if isinstance(c.get("value"), dict)
              and {"exact max", "naive median"} <= set(c["value"])), None)
    if c is None:
        return _generic(p)
    v, m = c["value"], p.get("metrics") or {}
    k, n = m.get("refit_contexts"), m.get("contexts_completed")
    sampled = isinstance(k, int) and isinstance(n, int) and k < n
    over = f" over {k:,} of {n:,} contexts (refit sample)" if sampled else ""
    return (f"gap to a same-C refit: exact deletion {fmt(v['exact max'])} (max), naive removal "
            f"{fmt(v['naive median'])} (median){over}") + _holds(c) + _tally(p)


LINES = {"cohort": _cohort, "icu_retention": _retention, "heldout_spo2": _retention,
         "patient_deletion": _patient_deletion, "deterioration": _deterioration, "deletion_audit": _audit,
         "ledger": _ledger}


def _load(runs: Path, study: str) -> tuple[dict | None, float]:
    p = runs / study / "result.json"
    try:
        return json.loads(p.read_text()), p.stat().st_mtime
    except (OSError, ValueError):
        return None, 0.0


def _marks(p: dict, mtime: float, since: float | None) -> str:
    tc = (p.get("config") or {}).get("task_cache") or {}
    marks = (["earlier run"] if since is not None and mtime < since else []) + (["cached"] if tc.get("tasks_cached")
                                                                              else [])
    return f" ({', '.join(marks)})" if marks else ""


def summary_lines(runs_dir: str | Path, *, report: str | None = None, seconds: dict[str, float] | None = None,
                  total_s: float | None = None, since: float | None = None,
                  peak_rss_mb: dict[str, float] | None = None, rss_method: str | None = None) -> list[str]:
    """The summary as lines (see the module docstring). ``seconds``: run-all's step timings;
    ``since``: the run's start (epoch seconds), to mark results it did not write; ``peak_rss_mb``:
    each step's peak resident memory, put beside its time (``rss_method``: how it was measured,
    :mod:`pipelines.runtime.step_meter`)."""
    runs = Path(runs_dir)
    head = "run-all done" + (f" in {duration(total_s)}" if total_s is not None else "")
    lines = [head + (f" · report: {report}" if report else "")]
    for study, label in CLINICAL.items():
        p, mtime = _load(runs, study)
        if p is None:
            continue
        lines.append(f"  {label:<17} {LINES[study](p)}{_marks(p, mtime, since)}")
    syn = [(s, *_load(runs, s)) for s in SYNTHETIC]
    syn = [(s, p, t) for s, p, t in syn if p is not None]
    if syn:
        claims = [(s, c) for s, p, _ in syn for c in p.get("claims") or [] if c.get("holds") is not None]
        failing = {}
        for s, c in claims:
            failing.setdefault(s, [0, 0])
            failing[s][0] += bool(c["holds"])
            failing[s][1] += 1
        bad = [f"{s.replace('_', '-')} {k}/{n}" for s, (k, n) in failing.items() if k < n]
        earlier = sum(1 for _, _, t in syn if since is not None and t < since)
        lines.append(f"  {'synthetic (' + str(len(syn)) + ')':<17} {sum(k for k, _ in failing.values())}/{len(claims)} "
                     f"claims hold" + (f"; not all: {', '.join(bad)}" if bad else "")
                     + (f" ({earlier} from an earlier run)" if earlier else ""))
    if seconds:
        rss = peak_rss_mb or {}
        lines.append("  time" + (f" · peak RSS ({rss_method or 'MB'})" if rss else "") + ": " + ", ".join(
            f"{k} {duration(v)}" + (f" · {rss[k]:,.0f} MB" if k in rss else "") for k, v in seconds.items()))
    return lines
