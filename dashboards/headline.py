"""The README's headline table: one row per seed claim (:data:`dashboards.seed_figures.SEED_CLAIMS`),
rendered from result files — this run's figure, the paper's, the strongest peer's, and whether the
claim holds.

A claim holds only when its interval excludes the peer (a paired bootstrap or t interval of the
difference), never on a point gap. The status also says when a run is not the paper's protocol and
when it rests on few units (low power). Every cell is read from a result file.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dashboards.numbers import doc_fmt, md_table
from dashboards.seed_figures import SEED_CLAIMS

BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
Payload = Mapping[str, Any]
Cells = tuple[str, str, str]  # this run, strongest peer, status


def _get(p: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(p, Mapping) or k not in p:
            return None
        p = p[k]
    return p


def _ci(mean: Any, low: Any, high: Any) -> str:
    return f"{doc_fmt(mean)} [{doc_fmt(low)}, {doc_fmt(high)}]"


def _primary(p: Payload) -> Mapping[str, Any] | None:
    """The claim that tests the paper's own statement: the first with a paper figure."""
    claims = [c for c in p.get("claims", []) if c.get("status")]
    return next((c for c in claims if _get(c, "paper", "figure")), claims[0] if claims else None)


def _peer_cell(p: Payload, primary: Mapping[str, Any] | None) -> str:
    """The strongest peer beside the paper's comparator: among the claims against another peer,
    the one with the smallest SV − peer difference, with its interval and what the interval says."""
    rivals = [c for c in p.get("claims", []) if isinstance(c.get("difference"), Mapping) and c.get("peer")
              and c is not primary and c["difference"].get("value") is not None]
    if not rivals:
        return ""
    c = min(rivals, key=lambda c: c["difference"]["value"])
    d, name = c["difference"], str(c["peer"].get("name", "")).replace("_", " ")
    value = c["peer"].get("value")
    head = f"{name} {doc_fmt(value)}" if isinstance(value, (int, float)) else name
    low, high = d.get("low"), d.get("high")
    verdict = ("" if low is None or high is None else "beats SV" if high < 0 else "SV ahead" if low > 0
               else "interval includes 0")
    return f"{head}: SV − {name} {_ci(d.get('value'), low, high)}" + (f", {verdict}" if verdict else "")


def _status_cell(p: Payload, primary: Mapping[str, Any] | None, prefix: str = "") -> str:
    """The paper's claim's status (decided on an interval by the study), with its low-power note."""
    if primary is None:
        return "does not hold (no claim in the result)"
    status = primary["status"]
    if status == "not run at the paper's protocol":
        reason = str(primary.get("reason", ""))
        why = reason.split(";")[0].removeprefix("not run at the paper's protocol: ")
        status = f"not run at the paper's protocol ({why})"
        if "is not met" in reason or "not met:" in reason:
            status += "; on this run the rule is not met"
        elif "is met" in reason:
            status += "; on this run the rule is met"
    if primary.get("status_stable") is False:
        status += " (interval ends within the stated tolerance: may differ on another machine)"
    return _join(prefix + status, _get(primary, "low_power", "label") if _get(primary, "low_power", "flag") else None)


def _cells(run: str, p: Payload, prefix: str = "") -> Cells:
    primary = _primary(p)
    return run, _peer_cell(p, primary), _status_cell(p, primary, prefix)


def _join(*parts: str | None) -> str:
    return "; ".join(p for p in parts if p)


# -------------------------------------------------------------------- this run's figure, per study
def _retention(p: Payload) -> Cells:
    m = p["metrics"]
    r, d = m.get("retention") or {}, m.get("diff_sv_minus_density") or {}
    return _cells(f"SV {doc_fmt(r.get('sv'))} vs density {doc_fmt(r.get('density'))}: "
                  f"diff {_ci(d.get('mean'), d.get('low'), d.get('high'))}", p)


def _audit(p: Payload) -> Cells:
    m = p["metrics"]
    regimes = [v for v in m.values() if isinstance(v, Mapping) and "score_dev_worst" in v and "decay_median" in v]
    worst = max((v["score_dev_worst"] for v in regimes if isinstance(v["score_dev_worst"], (int, float))),
                default=None)
    paths = m.get("completion_paths") or {}
    how = ", ".join(f"{doc_fmt(v)} {k.replace('_', ' ')}" for k, v in paths.items())
    run = f"{doc_fmt(m.get('completed'))}/{doc_fmt(m.get('attempted'))} completed ({how}); worst max \\|Δs\\| " \
          f"{doc_fmt(worst)}"
    return _cells(run, p)


def _patient_deletion(p: Payload) -> Cells:
    m = p["metrics"]
    gap = m.get("gap_to_refit") or {}
    dl = m.get("decay_leakage_mean") or {}
    gam = m.get("decay_gammas") or []
    run = (f"leakage {doc_fmt(m.get('leakage_after_max'))} after exact deletion; gap to a same-C refit "
           f"{doc_fmt(_get(gap, 'exact', 'score_max'))} (max); decay leakage "
           f"{' / '.join(doc_fmt(dl.get(f'gamma_{g}')) for g in gam)} (γ = {' / '.join(map(str, gam))}, "
           f"{m.get('decay_gamma_note', '')})")
    return _cells(run, p)


def _skewed(p: Payload) -> Cells:
    cell = _get(p, "metrics", "nu_0.45") or {}
    return _cells(f"ν = 0.45: rare recall SV {doc_fmt(_get(cell, 'sv', 'rare', 'mean'))} vs paper-form oracle H2O "
                  f"{doc_fmt(_get(cell, 'oracle', 'rare', 'mean'))}", p)


def _streaming(p: Payload) -> Cells:
    m = p["metrics"]
    d = _get(m, "vs_sv", "diffs", "h2o") or {}
    return _cells(f"rare recall SV {doc_fmt(_get(m, 'sv', 'rare_recall', 'mean'))} vs streaming H2O "
                  f"{doc_fmt(_get(m, 'h2o', 'rare_recall', 'mean'))}: "
                  f"diff {_ci(d.get('mean'), d.get('low'), d.get('high'))}",
                  p)


def _deterioration(p: Payload) -> Cells:
    m = p["metrics"]
    names = {"sv_attention": "SV attention", "lstm": "LSTM", "softmax": "softmax", "gru": "GRU",
             "lightgbm": "LightGBM"}
    models = {k: v for k, v in m.items() if k in names and isinstance(v, Mapping) and "auroc_seedavg" in v}
    run = ", ".join(f"{names[k]} {doc_fmt(v['auroc_seedavg'])}" for k, v in models.items()) + " (test AUROC)"
    win = m.get("winner")
    c = next((c for c in p.get("claims", []) if "highest test AUROC" in str(c.get("statement", ""))
              and isinstance(c.get("difference"), Mapping)), None)
    if win in names and c is not None:  # which model wins: its paired interval against the runner-up
        d, rival = c["difference"], _get(c, "strongest_peer", "name") or "the runner-up"
        verdict = "holds" if c.get("status") == "holds" else "interval includes 0" if c.get("status") else ""
        run += (f"; best: {names[win]}, ahead of {rival} by ΔAUROC {_ci(d.get('value'), d.get('low'), d.get('high'))}"
                + (f" ({verdict})" if verdict else ""))
    run_, peer, status = _cells(run, p, prefix="LSTM ahead of SV attention: ")
    best = max((k for k in models if k != "sv_attention"), key=lambda k: models[k]["auroc_seedavg"], default=None)
    d = _get(m, "paired", f"sv_attention - {best}") or {}
    if best and d:
        low, high = d.get("auroc_diff_low"), d.get("auroc_diff_high")
        verdict = "beats SV" if high < 0 else "SV ahead" if low > 0 else "interval includes 0"
        peer = (f"{names[best]} {doc_fmt(models[best]['auroc_seedavg'])}: SV − {names[best]} ΔAUROC "
                f"{_ci(d.get('auroc_diff'), low, high)}, {verdict}")
    return run_, peer, status


def _lm(p: Payload) -> Cells:
    m = p["metrics"]
    refs = m.get("references") or {}
    run = (f"SV hybrid {doc_fmt(m.get('mean_sv_bpb'))} vs matched sliding window {doc_fmt(m.get('mean_swa_bpb'))} "
           f"bits/byte, {doc_fmt(m.get('n_seeds'))} paired seeds, {doc_fmt(m.get('steps'))} steps; paired t "
           f"{_p(m.get('paired_t_p'))}, {doc_fmt(m.get('seeds_favouring_sv'))} of {doc_fmt(m.get('n_seeds'))} seeds "
           "favour SV")
    run_, peer, status = _cells(run, p)
    if refs:  # the single-seed reference rows (same backbone and budget; not in the paired test)
        best = min(refs, key=lambda k: refs[k] if refs[k] is not None else float("inf"))
        peer = (f"{best} {doc_fmt(refs[best])} (single seed; references: "
                + ", ".join(f"{k} {doc_fmt(v)}" for k, v in refs.items()) + ")")
    return run_, peer, status


def _p(x: Any) -> str:
    text = doc_fmt(x)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def _learned(p: Payload) -> Cells:
    m = p["metrics"]
    sel = m.get("matched_budget") or {}
    run = (f"forgotten fact recall {doc_fmt(_get(m, 'forgotten_recall', 'mean'))} (chance {doc_fmt(m.get('chance'))}), "
           f"others {doc_fmt(_get(m, 'others_recall_after_forget', 'mean'))}")
    if sel:
        run += (f"; rare fact kept at budget {doc_fmt(sel.get('budget'))} of {doc_fmt(sel.get('facts'))} stored: SV "
                f"{doc_fmt(sel.get('sv'))} vs H2O {doc_fmt(sel.get('h2o'))}")
    return _cells(run, p)


def _retrieval(p: Payload) -> Cells:
    m = p["metrics"]
    return _cells(f"{doc_fmt(m.get('answered_before'))}/{doc_fmt(m.get('asked'))} answered; deleted fact → "
                  f"{'no record' if m.get('deleted_fact_returns_no_record') else 'still answered'}", p)


ROWS: dict[str, Callable[[Payload], Cells]] = {
    "deletion_audit": _audit, "icu_retention": _retention, "heldout_spo2": _retention,
    "patient_deletion": _patient_deletion, "skewed_redundancy": _skewed, "streaming_eviction": _streaming,
    "deterioration": _deterioration, "language_model": _lm, "learned_keys": _learned,
    "retrieval_memory": _retrieval,
}
DATA = {"demo": "real MIMIC-IV demo", "synthetic": "synthetic", "mimic": "MIMIC-IV", "clif": "CLIF",
        "text": "text corpus"}


def _esc(t: str) -> str:
    return str(t).replace("\n", " ").replace("|", "\\|").replace("\\\\|", "\\|")


def headline_rows(found: Mapping[str, Payload]) -> list[tuple[str, str]]:
    """(study, Markdown row) for every seed claim, in :data:`SEED_CLAIMS` order; a study without a
    result says so in its row."""
    rows = []
    for claim in SEED_CLAIMS:
        study = claim["study"]
        p = found.get(study)
        if p is None:
            cells: Cells = ("not run (no result file)", "", f"not run: {claim['not_run']}")
            data = "–"
        else:
            cells = ROWS[study](p)
            data = DATA.get(p["data"], p["data"])
        rows.append((study, f"| {_esc(claim['claim'])} | {data} | {_esc(cells[0])} | {_esc(claim['paper'])} | "
                            f"{_esc(cells[1]) or '–'} | {_esc(cells[2])} |"))
    return rows


def render_headline(found: Mapping[str, Payload]) -> str:
    head = ["| claim | data | this run | paper | strongest peer | status |", "|---|---|---|---|---|---|"]
    return "\n".join([BEGIN, *head, *(r for _, r in headline_rows(found)), END])


def lm_block(p: Payload | None) -> list[str]:
    """REPRODUCE.md's language-model table: per seed, both models' best validation bits per byte and
    the matched window; then the paired tests. From the committed result file only."""
    if p is None:
        return ["*No language-model result is committed yet (`docs/results/studies/language_model/`).*"]
    m = p["metrics"]
    per = next((t for t in p.get("tables", []) if t.get("title", "").startswith("per seed")), None)
    out = [f"**{p['title']}** — protocol: {p['config'].get('protocol_label', m.get('protocol'))}; "
           f"{doc_fmt(m.get('steps'))} steps per run, corpus {doc_fmt(m.get('corpus_bytes'))} bytes.", ""]
    if per:
        out += md_table(per["columns"], per["rows"], doc_fmt) + [""]
    ci = m.get("diff_ci95") or [None, None]
    out.append(f"Mean SV {doc_fmt(m.get('mean_sv_bpb'))} vs matched window {doc_fmt(m.get('mean_swa_bpb'))} bits/byte; "
               f"paired difference (window − SV) 95 % t-interval [{doc_fmt(ci[0])}, {doc_fmt(ci[1])}]; mean relative "
               f"improvement {doc_fmt(m.get('mean_rel_improvement'))}; paired t p = {doc_fmt(m.get('paired_t_p'))}, "
               f"Wilcoxon p = {doc_fmt(m.get('wilcoxon_p'))}, d_z = {doc_fmt(m.get('d_z'))}; "
               f"{doc_fmt(m.get('seeds_favouring_sv'))} of {doc_fmt(m.get('n_seeds'))} seeds favour SV. "
               "Paper (enwik8, 7 seeds): 2.178 vs 2.383, p = 0.001, d_z = 2.25.")
    return out
