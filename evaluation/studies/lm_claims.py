"""The language-model study's claim, decided on the paired per-seed interval (seed 001 §6).

SV hybrid vs the matched-state sliding-window Transformer: the claim holds only when the 95 %
t-interval of the paired per-seed difference (swa − SV, bits/byte) lies above 0, never on the
means; a run off the paper's protocol (seven paired seeds at the paper's 3.22M model) is "not run
at the paper's protocol", and fewer than seven seeds carry the low-power flag (:mod:`evaluation.claims`).
"""
from __future__ import annotations

import math

from evaluation.claims import claim, interval, low_power


def _num(x):
    return float(x) if x is not None and math.isfinite(float(x)) else None


def lm_claim(t: dict, protocol: str, how_it_differs: str) -> dict:
    """``t``: :func:`evaluation.studies.language_model.paired_tests`; ``protocol``: the run's protocol name;
    ``how_it_differs``: how the run departs from the paper's protocol (``language_model_result.proto_note``)."""
    lo, hi = (t.get("diff_ci95") or [None, None])[:2]
    n = int(t["n"])
    return claim(
        "SV hybrid reaches lower best-validation bits/byte than the matched sliding-window Transformer",
        reference="sliding-window softmax with window = measured mean |S∪E| + chunk, same seeds",
        path="fp32 FISTA partitions + ridged KKT solve (batched training path)", operation="batched training",
        rule="95 % t-interval of the paired per-seed difference (swa − SV, bits/byte) above 0",
        passed=None if lo is None or not math.isfinite(lo) else bool(lo > 0),
        run=interval(_num(t["mean_sv"]), how=f"mean over {n} seeds (SV hybrid)", n=n),
        peer={"name": "matched sliding window (mean)", "value": _num(t["mean_swa"]), "low": None, "high": None},
        difference=interval(_num(t.get("mean_diff_swa_minus_sv")), _num(lo), _num(hi),
                            how=f"95 % paired t-interval over {n} seeds", n=n),
        paper={"figure": "2.178 vs 2.383 BPC (enwik8), 7 paired seeds, p = 0.001", "source": "seed 001 §6"},
        value=_num(t["mean_sv"] - t["mean_swa"]) if n else None,
        off_protocol=None if protocol == "paper" else f"not run at the paper's protocol: {how_it_differs}",
        power=low_power(n, 7, "paired seeds"), notes=f"this run: {how_it_differs}")
