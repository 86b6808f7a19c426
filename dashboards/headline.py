"""The README's headline table: one row per seed claim (:data:`dashboards.seed_figures.SEED_CLAIMS`),
rendered from result files — this run's figure, the paper's, the strongest peer's, and whether the
claim holds.

A claim holds only when its interval excludes the peer (a paired bootstrap or t interval of the
difference), never on a point gap. The status also says when a run is not the paper's protocol and
when it rests on few units (low power). Every cell is read from a result file.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from dashboards.numbers import doc_fmt
from dashboards.seed_figures import SEED_CLAIMS

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


def _interval_status(low: Any, high: Any, favour_positive: bool = True) -> str:
    """``holds`` when the interval excludes 0 on the claimed side, else ``does not hold``."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "does not hold (no interval)"
    ok = low > 0 if favour_positive else high < 0
    return "holds" if ok else "does not hold (interval includes 0)" if low <= 0 <= high else "does not hold"


def _power(p: Payload) -> str | None:
    """The result's own low-power statement, if any."""
    m = p.get("metrics", {})
    if m.get("low_power_reason"):
        return str(m["low_power_reason"])
    power = m.get("power")
    if isinstance(power, Mapping) and power.get("low_power"):
        return f"low power: {power.get('count')} {power.get('units')} (reference {power.get('reference_count')})"
    return None


def _join(*parts: str | None) -> str:
    return "; ".join(p for p in parts if p)


# ------------------------------------------------------------------------------- one row per study
def _retention(p: Payload) -> Cells:
    m = p["metrics"]
    r, d = m.get("retention") or {}, m.get("diff_sv_minus_density") or {}
    run = f"SV {doc_fmt(r.get('sv'))} vs density {doc_fmt(r.get('density'))}: diff {_ci(d.get('mean'), d.get('low'), d.get('high'))}"
    peers = {k[len("diff_sv_minus_"):]: v for k, v in m.items()
             if k.startswith("diff_sv_minus_") and k != "diff_sv_minus_density" and isinstance(v, Mapping)}
    peer, beaten = "", None
    if peers:
        name, v = min(peers.items(), key=lambda kv: kv[1]["mean"])
        label = name.replace("_", " ")
        beaten = f"{label} beats SV" if v["high"] < 0 else None
        peer = f"{label} {doc_fmt(r.get(name))} (SV − {label} {_ci(v['mean'], v['low'], v['high'])})"
    return run, peer, _join(_interval_status(d.get("low"), d.get("high")) + " vs density", beaten, _power(p))


def _audit(p: Payload) -> Cells:
    m = p["metrics"]
    regimes = [v for v in m.values() if isinstance(v, Mapping) and "score_dev_worst" in v and "decay_median" in v]
    worst = max((v["score_dev_worst"] for v in regimes), default=None)
    decay = min((v["decay_median"] for v in regimes), default=None)
    paths = m.get("completion_paths")
    if isinstance(paths, Mapping):
        how = ", ".join(f"{doc_fmt(v)} {k.replace('_', ' ')}" for k, v in paths.items())
    else:
        how = (f"{doc_fmt(m.get('completed_maintained'))} maintained, {doc_fmt(m.get('completed_fallback'))} "
               f"exact fallback, {doc_fmt(m.get('failed'))} failed")
    run = f"{doc_fmt(m.get('completed'))}/{doc_fmt(m.get('attempted'))} completed ({how}); worst max \\|Δs\\| {doc_fmt(worst)}"
    peer = f"coefficient decay γ = 0.01: median max \\|Δs\\| ≥ {doc_fmt(decay)} in every regime" if decay else ""
    holds = all(c.get("status", "holds" if c.get("holds") else "no") == "holds" for c in p.get("claims", []))
    protocol = None if m.get("paper_protocol") else f"not the paper's protocol: {m.get('trials_label')}"
    return run, peer, _join("holds" if holds and p.get("claims") else "does not hold", protocol, _power(p))


def _patient_deletion(p: Payload) -> Cells:
    m = p["metrics"]
    gap = m.get("gap_to_refit") or {}
    dl = m.get("decay_leakage_mean") or {}
    gam = m.get("decay_gammas") or ["0.5", "0.1"]
    run = (f"leakage {doc_fmt(m.get('leakage_after_max'))} after exact deletion; gap to a same-C refit "
           f"{doc_fmt(_get(gap, 'exact', 'score_max'))} (max); decay leakage "
           f"{' / '.join(doc_fmt(dl.get(f'gamma_{g}')) for g in gam)} (γ = {' / '.join(map(str, gam))}, "
           f"{m.get('decay_gamma_note', 'fitted to the paper figure')})")
    peer = f"naive removal without re-solving: gap {doc_fmt(_get(gap, 'naive', 'score_median'))} (median), leakage {doc_fmt(m.get('leakage_naive_max'))}"
    holds = all(c.get("holds") for c in p.get("claims", []))
    return run, peer, _join("holds" if holds else "does not hold", _power(p))


def _peer_table(p: Payload, pre: tuple[str, ...], name_sv: str, metric_path: tuple[str, ...]) -> tuple[str, Any]:
    """The strongest published peer: the smallest SV − peer mean among the result's paired diffs."""
    diffs = _get(p, "metrics", *pre) or {}
    published = {k: v for k, v in diffs.items() if isinstance(v, Mapping) and k not in ("h2o", "oracle", "recency",
                                                                                        "random", "density")}
    if not published:
        return "", None
    name, v = min(published.items(), key=lambda kv: kv[1]["mean"])
    label = name.replace("_", " ")
    beats = ": beats SV" if v["high"] < 0 else (": ties SV" if v["low"] <= 0 <= v["high"] else "")
    return f"{label}: SV − {label} {_ci(v['mean'], v['low'], v['high'])}{beats}", v


def _skewed(p: Payload) -> Cells:
    cell = _get(p, "metrics", "nu_0.45") or {}
    sv, oracle = _get(cell, "sv", "rare", "mean"), _get(cell, "oracle", "rare", "mean")
    d = _get(cell, "vs_sv", "diffs", "oracle") or {}
    run = f"ν = 0.45: rare recall SV {doc_fmt(sv)} vs paper-form oracle H2O {doc_fmt(oracle)}"
    if d:
        run += f" (SV − oracle {_ci(d.get('mean'), d.get('low'), d.get('high'))})"
    peer, _ = _peer_table(p, ("nu_0.45", "vs_sv", "diffs"), "sv", ())
    st = _interval_status(d.get("low"), d.get("high")) if d else ("holds" if p["claims"][0].get("holds") else "does not hold")
    return run, peer, st


def _streaming(p: Payload) -> Cells:
    m = p["metrics"]
    d = _get(m, "vs_sv", "diffs", "h2o") or {}
    run = (f"rare recall SV {doc_fmt(_get(m, 'sv', 'rare_recall', 'mean'))} vs streaming H2O "
           f"{doc_fmt(_get(m, 'h2o', 'rare_recall', 'mean'))}: diff {_ci(d.get('mean'), d.get('low'), d.get('high'))}")
    peer, _ = _peer_table(p, ("vs_sv", "diffs"), "sv", ())
    return run, peer, _interval_status(d.get("low"), d.get("high"))


def _deterioration(p: Payload) -> Cells:
    m = p["metrics"]
    names = {"sv_attention": "SV attention", "lstm": "LSTM", "softmax": "softmax", "gru": "GRU",
             "lightgbm": "LightGBM"}
    models = {k: v for k, v in m.items() if k in names and isinstance(v, Mapping) and "auroc_seedavg" in v}
    run = ", ".join(f"{names[k]} {doc_fmt(v['auroc_seedavg'])}" for k, v in models.items()) + " (AUROC)"
    best = max((k for k in models if k != "sv_attention"), key=lambda k: models[k]["auroc_seedavg"], default=None)
    paired = _get(m, "paired", f"sv_attention - {best}") or {}
    peer = (f"{names[best]}: SV − {names[best]} ΔAUROC "
            f"{_ci(paired.get('auroc_diff'), paired.get('auroc_diff_low'), paired.get('auroc_diff_high'))}") if best else ""
    lstm = _get(m, "paired", "sv_attention - lstm") or {}
    st = _interval_status(lstm.get("auroc_diff_low"), lstm.get("auroc_diff_high"), favour_positive=False)
    n = m.get("test_stays")
    low = f"low power: {n} test stays" if isinstance(n, int) and n < 100 else None
    return run, peer, _join(f"LSTM ahead of SV attention: {st}", low)


def _lm(p: Payload) -> Cells:
    m = p["metrics"]
    run = (f"SV hybrid {doc_fmt(m.get('mean_sv_bpb'))} vs matched sliding window {doc_fmt(m.get('mean_swa_bpb'))} "
           f"bits/byte, {doc_fmt(m.get('n_seeds'))} paired seeds, {doc_fmt(m.get('steps'))} steps; paired t p = "
           f"{doc_fmt(m.get('paired_t_p'))}")
    refs = _get(p, "metrics", "references") or {}
    peer = ", ".join(f"{k} {doc_fmt(v)}" for k, v in refs.items()) + " (single seed)" if refs else ""
    ci = m.get("diff_ci95") or [None, None]
    st = _interval_status(ci[0], ci[1])
    protocol = m.get("protocol")
    note = None if protocol in ("paper", "seed") else f"not the paper's protocol: {m.get('protocol_note', protocol)}"
    return run, peer, _join(st, note)


def _learned(p: Payload) -> Cells:
    m = p["metrics"]
    run = (f"forgotten fact recall {doc_fmt(_get(m, 'forgotten_recall', 'mean'))} (chance {doc_fmt(m.get('chance'))}), "
           f"others {doc_fmt(_get(m, 'others_recall_after_forget', 'mean'))}; edit residual "
           f"{doc_fmt(_get(m, 'edit', 'exact', 'residual_max'))}")
    sel = m.get("matched_budget") or {}
    peer = ""
    if sel:
        peer = (f"rare fact kept at budget {doc_fmt(sel.get('budget'))} < {doc_fmt(sel.get('facts'))} facts: SV "
                f"{doc_fmt(sel.get('sv'))} vs H2O {doc_fmt(sel.get('h2o'))}")
    holds = all(c.get("status", "holds" if c.get("holds") else "no") == "holds" for c in p.get("claims", []))
    return run, peer, "holds" if holds else "does not hold"


def _retrieval(p: Payload) -> Cells:
    m = p["metrics"]
    run = (f"{doc_fmt(m.get('answered_before'))}/{doc_fmt(m.get('asked'))} answered; deleted fact → "
           f"{'no record' if m.get('deleted_fact_returns_no_record') else 'still answered'}; gap to refit "
           f"{doc_fmt(m.get('score_dev_vs_refit'))}")
    peer, _ = _peer_table(p, ("redundancy", "vs_sv", "diffs"), "sv", ())
    holds = bool(p.get("claims")) and p["claims"][0].get("holds")
    return run, peer, "holds" if holds else "does not hold"


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
    from dashboards.reproduce import BEGIN, END

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
        from dashboards.numbers import md_table

        out += md_table(per["columns"], per["rows"], doc_fmt) + [""]
    ci = m.get("diff_ci95") or [None, None]
    out.append(f"Mean SV {doc_fmt(m.get('mean_sv_bpb'))} vs matched window {doc_fmt(m.get('mean_swa_bpb'))} bits/byte; "
               f"paired difference (window − SV) 95 % t-interval [{doc_fmt(ci[0])}, {doc_fmt(ci[1])}]; mean relative "
               f"improvement {doc_fmt(m.get('mean_rel_improvement'))}; paired t p = {doc_fmt(m.get('paired_t_p'))}, "
               f"Wilcoxon p = {doc_fmt(m.get('wilcoxon_p'))}, d_z = {doc_fmt(m.get('d_z'))}; "
               f"{doc_fmt(m.get('seeds_favouring_sv'))} of {doc_fmt(m.get('n_seeds'))} seeds favour SV. "
               "Paper (enwik8, 7 seeds): 2.178 vs 2.383, p = 0.001, d_z = 2.25.")
    return out
