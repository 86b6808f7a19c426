"""Per-epoch training time of the deterioration models, interleaved, and same-seed reproducibility.

Command line::

    python -m evaluation.clinical.deterioration_bench --warehouse W [--rounds 3] [--json OUT]

Each round trains every model of ``--models`` (default softmax and SV attention) for one epoch
with the same seed, in alternating order from round to round (so machine load falls on both
sides alike), at the device's default caps (:data:`evaluation.clinical.deterioration_training.CAPS`;
``--train-windows`` overrides). The epoch time is the training pass plus the validation pass, as
reported by the per-epoch progress event; the study's deterministic mode (one intra-op thread on
CPU) is used, as in the study. Printed: per model the median epoch time with its min-max
spread, the ratio of medians to the first model, and the distinct test AUROCs over the rounds
(one value each when runs are reproducible). A benchmark command, never a timed assertion.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from evaluation.clinical import deterioration_training as dtr


def bench(warehouse: str, models: list[str], rounds: int = 3, train_windows: int | None = None,
          device: str = "cpu", seed: int = 0, n_boot: int = 200) -> dict:
    """Per-epoch seconds (one list per model, ``rounds`` entries) and the test AUROC of each run."""
    caps = dtr.CAPS[device]
    tw = caps["train_windows"] if train_windows is None else int(train_windows)
    data = dtr.study_data(warehouse, val_windows=caps["val_windows"], test_stays=caps["test_stays"])
    times: dict[str, list[float]] = {m: [] for m in models}
    aurocs: dict[str, list[float]] = {m: [] for m in models}
    for r in range(rounds):
        for m in (models if r % 2 == 0 else models[::-1]):
            events: list[dict] = []
            with dtr.epoch_progress(events.append):
                res = dtr.train_and_test(data, m, seed, max_epochs=1, n_boot=n_boot, train_windows=tw,
                                         device=device)
            times[m].append(float(events[0]["elapsed_s"]))
            aurocs[m].append(float(res["auroc"]))
    base = statistics.median(times[models[0]])
    return {"warehouse": os.path.basename(warehouse), "device": device, "rounds": rounds, "seed": seed,
            "train_windows": min(tw, data.train.n_windows), "val_windows": data.val.n_windows,
            "load_before": os.getloadavg(), "times_s": times, "aurocs": aurocs,
            "summary": {m: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                            "ratio_to_" + models[0]: statistics.median(t) / base,
                            "distinct_auroc": sorted(set(aurocs[m]))} for m, t in times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m evaluation.clinical.deterioration_bench",
        description="Time one training epoch of each deterioration model, interleaved over rounds with the same "
                    "seed, and report the median epoch time with its spread and whether the AUROC repeats.")
    ap.add_argument("--warehouse", default="runs/warehouse.duckdb",
                    help="warehouse file (default runs/warehouse.duckdb)")
    ap.add_argument("--models", nargs="+", default=["softmax", "sv_attention"], choices=dtr.MODELS,
                    help="models to time; ratios are to the first (default softmax sv_attention)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--train-windows", type=int, default=None, help="training windows per epoch (default: the cap)")
    ap.add_argument("--device", default="cpu", choices=dtr.DEVICES, help="device (default cpu)")
    ap.add_argument("--json", default=None, help="also write the result to this file")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    load = os.getloadavg()
    t0 = time.perf_counter()
    out = bench(a.warehouse, a.models, a.rounds, a.train_windows, a.device)
    out["load_after"] = os.getloadavg()
    print(f"load average before {load[0]:.2f}, after {out['load_after'][0]:.2f}; {a.rounds} rounds, "
          f"{out['train_windows']} training windows, {out['val_windows']} validation windows, {a.device}")
    for m, s in out["summary"].items():
        ratio = next(v for k, v in s.items() if k.startswith("ratio_to_"))
        print(f"{m:>13}: epoch {s['median_s']:.2f} s (min {s['min_s']:.2f}, max {s['max_s']:.2f}), "
              f"{ratio:.2f}x {a.models[0]}; AUROC over rounds {s['distinct_auroc']}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
