"""Markdown tables of :mod:`sv_core.bench.stream` result files, and the README block they fill.

``docs_text(*results)`` renders, from the result files only (no hand-typed figure):

1. the peer table: StreamingGate vs a plain ``Gate`` vs a libsvm re-solve per size and BLAS
   thread setting (wall ms per token, process CPU mean in brackets), exactness against the
   independent refit and the recomputed full-history KKT residual;
2. where the StreamingGate's time goes at each size (ms per token by part,
   :mod:`sv_core.streaming.profile`) and the sizes that set it (hot tier, support, margin set,
   keys re-checked per token);
3. the per-token cost along the stream (every streamed block of 1,000 tokens, subsampled).

``write_docs(path, text)`` replaces the text between ``<!-- bench_stream:begin -->`` and
``<!-- bench_stream:end -->`` in ``path`` (a typed error if the markers are missing).
"""
from __future__ import annotations

import os

import numpy as np

from sv_core.streaming.profile import PARTS

BEGIN, END = "<!-- bench_stream:begin -->", "<!-- bench_stream:end -->"


class DocsBlockError(ValueError):
    """The file to update cannot be read or has no single marker block."""


def thread_settings(w: dict) -> list[str]:
    """Names of the thread settings timed in one window record."""
    return [k for k, v in w.items() if isinstance(v, dict) and "streaming" in v]


def _inert_only(r: dict) -> bool:
    """True when the timed window held no token that changed the hot coefficients (its mean is
    then the cost of inert tokens only, not of the stream)."""
    w = r["window"]["streaming_work"]
    return w.get("hot_admissions_per_token", 1.0) == 0.0 and w.get("exact_checks_per_token", 1.0) == 0.0


def _tokens(res: dict, r: dict) -> str:
    """Size cell: the token count, with the stream named when it is not the ICU-like one and a
    dagger when the window held only inert tokens."""
    kind = res["config"].get("stream", "icu")
    return f"{r['tokens']:,}" + ("" if kind == "icu" else f" ({kind})") + (" †" if _inert_only(r) else "")


def _fmt(w: dict, peer: str) -> str:
    s = w.get(peer, {"n": 0})
    if not s.get("n"):
        return "not run (n² memory)"
    return (f"{s['mean_ms']:.3g} ({s['median_ms']:.2g}, {s['p25_ms']:.2g}-{s['p75_ms']:.2g}) "
            f"[{w[peer + '_cpu']['mean_ms']:.3g}]")


def table(*results: dict) -> str:
    """Peer table (per size and thread setting)."""
    out = ["| tokens | BLAS threads | StreamingGate ms/token: mean (median, IQR) [CPU mean] "
           "| plain Gate ms/token: mean (median, IQR) [CPU mean] | libsvm re-solve s/step: median (min-max), n "
           "| libsvm ÷ StreamingGate (means) | plain ÷ StreamingGate (CPU means) | hot / live "
           "| score dev vs refit: median, worst | full-history KKT | load (1 min) |",
           "|---" * 11 + "|"]
    for res in results:
        for r in res["sizes"]:
            w, e = r["window"], r["exactness"]
            lib = w["libsvm_s"]
            libs = f"{np.median(lib):.3g} ({min(lib):.3g}-{max(lib):.3g}), {len(lib)}" if lib else "—"
            for name in thread_settings(w):
                ratio = f"{1e3 * np.median(lib) / w[name]['streaming']['mean_ms']:.0f}×" if lib else "—"
                pc = w[name].get("plain_gate_cpu", {"n": 0})
                plain = (f"{pc['mean_ms'] / w[name]['streaming_cpu']['mean_ms']:.2g}×" if pc.get("n") else "—")
                dev = (f"{e['score_dev_median']:.1e}, {e['score_dev_max']:.1e}"
                       if e.get("score_dev_max") is not None else "no refit (certificate only)")
                out.append(f"| {_tokens(res, r)} | {name} | {_fmt(w[name], 'streaming')} "
                           f"| {_fmt(w[name], 'plain_gate')} "
                           f"| {libs} | {ratio} | {plain} | {r['n_hot']} / {r['n_live']} | {dev} "
                           f"| {e['kkt_residual_full_history']:.1e} "
                           f"| {r['load_before'][0]:.1f}–{r['load_after'][0]:.1f} |")
    return "\n".join(out)


def _clock(res: dict) -> str:
    """Clock of the per-part times: process CPU (files written since it was recorded) or wall."""
    return "CPU" if res["config"].get("parts_clock") == "cpu" else "wall"


def breakdown_table(*results: dict) -> str:
    """Where the StreamingGate's time goes in each timed window (all thread settings)."""
    out = ["| tokens | how | hot / support / margin (≥ ⌈1/C⌉) | hot admissions per token "
           "| cold keys re-checked per token (share of cold tier) | "
           + " | ".join(f"{p} ms/token" for p in PARTS) + " | total ms/token | clock |",
           "|---" * (7 + len(PARTS)) + "|"]
    for res in results:
        for r in res["sizes"]:
            w = r["window"]
            sw, parts = w["streaming_work"], w.get("streaming_parts_ms")
            if parts is None:
                continue
            how = "streamed" if r["how"] == "streamed" else "warm start"
            out.append(f"| {_tokens(res, r)} | {how} | {sw['n_hot_end']} / {sw['n_support']} / {sw['n_margin']} "
                       f"(≥ {sw['support_lower_bound']}) | {sw['hot_admissions_per_token']:.2f} "
                       f"| {sw['exact_checks_per_token']:.0f} ({sw['cold_fraction_rechecked_per_token']:.1%}) | "
                       + " | ".join(f"{parts[p]:.3g}" for p in PARTS)
                       + f" | {sum(parts.values()):.3g} | {_clock(res)} |")
    return "\n".join(out)


def growth_table(*results: dict, rows: int = 10) -> str:
    """Per-token cost along the streamed part (at most ``rows`` blocks of 1,000 tokens)."""
    out = ["| tokens streamed | ms/token: mean (median) [CPU mean] | hot / support | "
           + " | ".join(f"{p}" for p in PARTS) + " | clock |", "|---" * (4 + len(PARTS)) + "|"]
    for res in results:
        blocks = [b for b in res.get("stream_blocks", []) if "parts_ms" in b]
        if len(blocks) > rows:
            blocks = [blocks[int(i)] for i in np.unique(np.linspace(0, len(blocks) - 1, rows).round())]
        for b in blocks:
            kind = res["config"].get("stream", "icu")
            span = f"{b['tokens'] - 999:,}–{b['tokens']:,}" + ("" if kind == "icu" else f" ({kind})")
            cpu = f"{b['cpu_mean_ms']:.3g}" if "cpu_mean_ms" in b else "—"
            out.append(f"| {span} | {b['mean_ms']:.3g} ({b['median_ms']:.2g}) [{cpu}] "
                       f"| {b['n_hot']} / {b['n_support']} | " + " | ".join(f"{b['parts_ms'][p]:.3g}" for p in PARTS)
                       + f" | {_clock(res)} |")
    return "\n".join(out)


def _slope(x, y) -> float:
    """Exponent between the first and the last point (log-log)."""
    if len(x) < 2 or x[-1] == x[0] or not (y[0] and y[-1]):
        return float("nan")
    return float(np.log(y[-1] / y[0]) / np.log(x[-1] / x[0]))


def _cpu(w: dict, peer: str) -> float | None:
    v = [w[k][peer + "_cpu"]["mean_ms"] for k in thread_settings(w) if w[k].get(peer + "_cpu", {}).get("n")]
    return float(np.mean(v)) if v else None


def summary(*results: dict) -> list[str]:
    """Growth exponents over the sizes of each stream (log-log slope from the smallest to the
    largest size; windows of inert tokens only left out) and the ratios to both peers per size
    (process CPU means over all thread settings)."""
    out = []
    streams: dict[str, list[dict]] = {}
    for res in results:
        streams.setdefault(res["config"].get("stream", "icu"), []).extend(res["sizes"])
    for kind, rows in streams.items():
        rows = sorted((r for r in rows if not _inert_only(r)), key=lambda r: r["tokens"])
        if len(rows) < 2:
            continue
        n = [r["n_live"] for r in rows]
        sup = [r["window"]["streaming_work"].get("n_support", r["n_hot"]) for r in rows]
        sg = [_cpu(r["window"], "streaming") for r in rows]
        out.append(f"* {kind} stream, from {n[0]:,} to {n[-1]:,} live tokens: the hot support grows as "
                   f"n^{_slope(n, sup):.2f} ({sup[0]:,} → {sup[-1]:,} keys; the fixed-C bound is ⌈1/C⌉ = "
                   f"{rows[0]['window']['streaming_work'].get('support_lower_bound', '?')}) and the StreamingGate's "
                   f"CPU per token as n^{_slope(n, sg):.2f} ({sg[0]:.3g} → {sg[-1]:.3g} ms).")
    for res in results:
        for r in res["sizes"]:
            w = r["window"]
            c, p = _cpu(w, "streaming"), _cpu(w, "plain_gate")
            if c is None:  # the streaming side was not timed in this window: nothing to divide by
                continue
            lib = w.get("libsvm_cpu_s") or w["libsvm_s"]
            bits = [f"plain Gate ÷ StreamingGate {p / c:.2g}×" if p else "plain Gate not run (n² memory)"]
            if lib:
                what = "" if w.get("libsvm_cpu_s") else " (libsvm wall time)"
                bits.append(f"libsvm re-solve ÷ StreamingGate {1e3 * float(np.median(lib)) / c:.0f}×{what}")
            out.append(f"* {_tokens(res, r)} tokens (CPU means): " + ", ".join(bits) + ".")
    if any(_inert_only(r) for res in results for r in res["sizes"]):
        out.append("* † the timed window held no token that changed the hot coefficients: its figures are the "
                   "cost of inert tokens only, not of the stream at that size (left out of the growth lines).")
    return out


def docs_text(*results: dict) -> str:
    """The README block: run description, the peer table, the breakdown and the growth table."""
    head = []
    for res in results:
        c = res["config"]
        head.append(f"{c.get('stream', 'icu')} stream, {', '.join(f'{t:,}' for t in c['sizes'])} tokens "
                    f"(window {c['window']}, C = "
                    f"1/({c['nu']}·{c['n0']}), σ = {c['sigma']}, d = {c['d']}, libsvm steps {c['libsvm_steps']}, "
                    f"{res['machine']['cpus']} CPUs, run {res['wall_s'] / 60:.1f} min)")
    text = ["Result files: " + "; ".join(head) + ".", "", table(*results), "",
            "Where the StreamingGate's time goes (timed window; ms per token by part, on the clock named):", "",
            breakdown_table(*results), "", *summary(*results)]
    g = growth_table(*results)
    if g.count("\n") > 1:
        text += ["", "Per-token cost along the stream (blocks of 1,000 tokens, one BLAS thread; parts in ms per "
                 "token on the clock named):",
                 "", g]
    return "\n".join(text)


def write_docs(path: str, text: str) -> None:
    """Replace the block between the markers in ``path``: written to a temporary file beside it
    and renamed, so the file is either unchanged (any error) or fully updated."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise DocsBlockError(f"cannot read {path}: {exc}") from None
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise DocsBlockError(f"{path} must hold one {BEGIN} … {END} block")
    head, rest = doc.split(BEGIN, 1)
    new = head + BEGIN + "\n" + text.rstrip("\n") + "\n" + END + rest.split(END, 1)[1]
    tmp = f"{path}.bench_stream.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise DocsBlockError(f"cannot write {path}: {exc}") from None
