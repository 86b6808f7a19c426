"""The language-model study's result file (dashboards/SCHEMA.md) from a raw comparison of
:func:`evaluation.studies.language_model.run_comparison`: tables, figure, claim, and how the run
differs from the paper's protocol."""
from __future__ import annotations

import math

from evaluation.studies.language_model import PROTOCOLS
from evaluation.studies.lm_claims import lm_claim


def _num(x):
    """JSON-safe number for the report (NaN/inf -> None)."""
    return float(x) if x is not None and math.isfinite(float(x)) else None


def proto_note(res: dict) -> str:
    """How a run differs from the paper's protocol (3.22M model, enwik8's first 5M bytes, 7 seeds)."""
    cfg = res["config"]
    parts = []
    if (cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["block"], cfg["batch"]) != (256, 4, 4, 256, 16):
        parts.append(f"a smaller model (d {cfg['d_model']}, {cfg['n_layers']} layers, block {cfg['block']})")
    if len(res.get("seeds", [])) != 7:
        parts.append(f"{len(res.get('seeds', []))} seeds, not 7")
    parts.append(f"{cfg['steps']:,} steps per run (the paper does not state its count)")
    if cfg.get("device", "cpu") == "cpu":
        parts.append("on CPU")
    parts.append(f"corpus {res.get('corpus_name', 'Shakespeare')} ({res.get('corpus_bytes', 0):,} bytes), not enwik8")
    return ", ".join(parts)


def study_result(res: dict, corpus_name: str) -> dict:
    """The report's ``language_model`` study result (dashboards/SCHEMA.md) from the raw comparison.
    A non-seed protocol is named in the title and the notes (the report shows both)."""
    protocol = res.get("protocol", "custom")
    base = protocol.split("+")[0]
    proto_label = PROTOCOLS[base][2] if base in PROTOCOLS else "custom configuration"
    if protocol.endswith("+custom"):
        proto_label += " (with custom steps or seeds)"
    if protocol in ("seed", "paper"):
        title_tag = ""
    elif protocol == "paper+custom":
        title_tag = f"; the paper's model and seeds at {res['config']['steps']:,} steps on this machine"
    else:
        title_tag = f"; {protocol} protocol, not the seed's"
    t = res["tests"]
    per = res["per_seed"]
    series = []
    for seed, c in res["curves"].items():
        for name, label in (("sv", "SV hybrid"), ("swa", "matched sliding window")):
            pts = c[name][-256:]
            series.append({"label": f"{label} (seed {seed})", "x": [p["step"] for p in pts],
                           "y": [_num(p["val_bpb"]) for p in pts], "style": "both"})
    tables = [{"title": "per seed: best validation bits per byte",
               "columns": ["seed", "SV hybrid", "matched sliding window", "window", "mean |S∪E|"],
               "rows": [[r["seed"], _num(r["sv_bpb"]), _num(r["swa_bpb"]), r["window"], _num(r["mean_active_state"])]
                        for r in per]}]
    if res.get("references"):
        tables.append({"title": "single-seed reference rows (not part of the paired test)",
                       "columns": ["variant", "seed", "best val bits/byte", "state"],
                       "rows": [[r["variant"], r["seed"], _num(r["best_val_bpb"]), r["state"]["kind"]]
                                for r in res["references"]]})
    return {
        "study": "language_model",
        "title": f"Byte-level language model: SV hybrid vs matched sliding window ({corpus_name}{title_tag})",
        "data": "text",
        "runtime_s": float(res["wall_s"]),
        "seed_figure": {},
        "metrics": {"mean_sv_bpb": _num(t["mean_sv"]), "mean_swa_bpb": _num(t["mean_swa"]),
                    "mean_rel_improvement": _num(t["mean_rel_improvement"]), "paired_t_p": _num(t["t_p"]),
                    "wilcoxon_p": _num(t["wilcoxon_p"]), "d_z": _num(t.get("d_z")),
                    "seeds_favouring_sv": t.get("seeds_favouring_sv"),
                    "diff_ci95": [_num(v) for v in t.get("diff_ci95", [None, None])],
                    "rel_improvement_ci95": [_num(v) for v in t.get("rel_improvement_ci95", [None, None])],
                    "references": {r["variant"]: _num(r["best_val_bpb"]) for r in res.get("references", [])},
                    "protocol_note": proto_note(res),
                    "n_seeds": t["n"], "steps": res["config"]["steps"],
                    "corpus_bytes": res["corpus_bytes"], "protocol": protocol},
        "tables": tables,
        "figures": [{"kind": "line", "title": "validation bits per byte", "xlabel": "step",
                     "ylabel": "bits/byte", "series": series}] if series else [],
        "claims": [lm_claim(t, protocol, proto_note(res))],
        "config": {"protocol": protocol, "protocol_label": proto_label,
                   **{k: v for k, v in res["config"].items() if isinstance(v, (int, float, str, bool))}},
        "notes": (f"Protocol: {proto_label}." + ("" if base in ("seed", "paper") else
                  " Runs far shorter than the seed's are a pipeline check, not a converged comparison.")),
    }
