"""Per-epoch training time of the deterioration models, interleaved, and same-seed reproducibility.

Command line::

    python -m evaluation.clinical.deterioration_bench --warehouse W [--rounds 3] [--threads 0 1] [--json OUT]
    python -m evaluation.clinical.deterioration_bench --table OUT [--readme docs/COMMANDS.md]

Each round trains every model of ``--models`` (default softmax and SV attention) for one epoch
with the same seed under every CPU thread count of ``--threads`` (default: torch's default count,
written 0, and 1 - the study's deterministic mode), models and thread counts in alternating order
from round to round (so machine load falls on every side alike), at the device's default caps
(:data:`evaluation.clinical.deterioration_training.CAPS`; ``--train-windows`` overrides). The
epoch time is the training pass plus the validation pass, as reported by the per-epoch progress
event, beside the process's CPU seconds over the same span (all threads; less sensitive to other
processes on a loaded machine) and the seconds of it spent producing rows (reading and featurising
shards from the warehouse: ``read_s``, the same work for every model), so the epoch splits into
reading and the model's compute. Printed, per thread count and model: the median epoch time with
its min-max spread and the median CPU seconds, the ratios of medians to the first model at the
same thread count, the median (min-max) of the per-round ratios (the two runs of a round made one after
the other), the median reading seconds and the per-round ratio of the compute (epoch less reading),
and the distinct test AUROCs over the rounds (one value each when runs are reproducible); the load
average before and after. A benchmark command, never a timed assertion.

A model may carry size overrides, ``NAME:KEY=VALUE[,KEY=VALUE...]`` with keys of
:data:`evaluation.clinical.deterioration_models.DEFAULT_SIZE` (e.g. ``sv_attention:chunk=16``), to
time a configuration beside the study's own: a measurement for a product decision, not a study figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from evaluation.clinical import deterioration as det
from evaluation.clinical import deterioration_training as dtr
from sv_core.jsonfile import write_json, write_marked_block


def default_threads() -> int:
    """Torch's intra-op thread count as the process started it (the study's deterministic mode
    sets it to 1 process-wide, so this is read before any training of the bench)."""
    import torch

    return int(torch.get_num_threads())


class ModelSpecError(ValueError):
    """A ``--models`` entry that is not ``NAME`` or ``NAME:KEY=VALUE[,KEY=VALUE...]``."""


def model_spec(spec: str) -> tuple[str, dict]:
    """``(model name, size overrides)`` of ``NAME[:KEY=VALUE,...]``: NAME one of
    :data:`~evaluation.clinical.deterioration_models.MODELS`, KEY one of ``DEFAULT_SIZE``, VALUE of
    that default's type (int or float). Raises :class:`ModelSpecError` on anything else."""
    name, sep, rest = str(spec).partition(":")
    if name not in dtr.MODELS:
        raise ModelSpecError(f"unknown model {name!r} in {spec!r}; choose from {', '.join(dtr.MODELS)}")
    if not sep:
        return name, {}
    try:
        return name, dtr.parse_size(rest.split(","))
    except det.DeteriorationInputError as e:
        raise ModelSpecError(f"{spec!r}: {e}") from None


def bench(warehouse: str, models: list[str], rounds: int = 3, train_windows: int | None = None,
          device: str = "cpu", seed: int = 0, n_boot: int = 200, threads: list[int] | None = None) -> dict:
    """Per-epoch seconds and the test AUROC of each run, per thread count (``threads``, default
    ``[1]``; 0 = torch's default count) and model (a :func:`model_spec`): ``times_s[str(t)][model]``
    (``rounds`` entries), ``aurocs`` alike, ``summary[str(t)][model]``; ``sizes[model]``: its full size."""
    specs = {m: model_spec(m) for m in models}
    load_before = os.getloadavg()
    default = default_threads()
    ts = [default if int(t) == 0 else int(t) for t in (threads or [1])]
    caps = dtr.CAPS[device]
    tw = caps["train_windows"] if train_windows is None else int(train_windows)
    data = dtr.study_data(warehouse, val_windows=caps["val_windows"], test_stays=caps["test_stays"])
    times: dict[str, dict[str, list[float]]] = {str(t): {m: [] for m in models} for t in ts}
    cpu: dict[str, dict[str, list[float]]] = {str(t): {m: [] for m in models} for t in ts}
    read: dict[str, dict[str, list[float]]] = {str(t): {m: [] for m in models} for t in ts}
    aurocs: dict[str, dict[str, list[float]]] = {str(t): {m: [] for m in models} for t in ts}
    runs = [(t, m) for t in ts for m in models]
    for r in range(rounds):
        for t, m in (runs if r % 2 == 0 else runs[::-1]):
            events: list[dict] = []
            with dtr.epoch_progress(events.append):
                res = dtr.train_and_test(data, specs[m][0], seed, size=specs[m][1] or None, max_epochs=1,
                                         n_boot=n_boot, train_windows=tw, device=device, threads=t)
            times[str(t)][m].append(float(events[0]["elapsed_s"]))
            cpu[str(t)][m].append(float(events[0]["cpu_s"]))
            read[str(t)][m].append(float(events[0]["read_s"]))
            aurocs[str(t)][m].append(float(res["auroc"]))
    summary: dict[str, dict[str, dict]] = {}
    for t in ts:
        base = statistics.median(times[str(t)][models[0]])
        cbase = statistics.median(cpu[str(t)][models[0]])
        compute = {m: [e - r for e, r in zip(times[str(t)][m], read[str(t)][m])] for m in models}
        summary[str(t)] = {m: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                               "read_median_s": statistics.median(read[str(t)][m]),
                               "compute_median_s": statistics.median(compute[m]),
                               "compute_paired_ratio": paired_ratio(compute[m], compute[models[0]]),
                               "ratio_to_" + models[0]: statistics.median(v) / base,
                               "cpu_median_s": statistics.median(cpu[str(t)][m]),
                               "cpu_ratio_to_" + models[0]: statistics.median(cpu[str(t)][m]) / cbase,
                               "distinct_auroc": sorted(set(aurocs[str(t)][m])),
                               "paired_ratio": paired_ratio(times[str(t)][m], times[str(t)][models[0]])}
                           for m, v in times[str(t)].items()}
    return {"warehouse": os.path.basename(warehouse), "device": device, "rounds": rounds, "seed": seed,
            "threads": ts, "default_threads": default, "cpu_count": os.cpu_count(),
            "train_windows": min(tw, data.train.n_windows), "val_windows": data.val.n_windows,
            "load_before": load_before,
            "sizes": {m: {**dtr.DEFAULT_SIZE, **sz} for m, (_, sz) in specs.items()},
            "times_s": times, "cpu_s": cpu, "read_s": read, "aurocs": aurocs, "summary": summary}


def paired_ratio(times: list[float], base: list[float]) -> dict[str, float]:
    """Median, min and max over rounds of ``times[r] / base[r]`` - each round's ratio of two runs made
    next to each other, so a host that speeds up or slows down between rounds (a shared machine) moves
    both sides of a pair alike; steadier than the ratio of the two medians."""
    r = [a / b for a, b in zip(times, base)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def table(out: dict, models: list[str]) -> list[str]:
    """The printed lines of a :func:`bench` result."""
    w = max(13, *(len(m) for m in models))
    lines = [f"{'threads':>7} {'model':>{w}} {'epoch s, median (min-max)':>27} {'ratio':>6}"
             f" {'per-round (min-max)':>20} {'read s':>6} {'compute per-round':>23} {'CPU s':>7} {'ratio':>6}"
             f"  AUROC over rounds   (ratios to {models[0]}: of the medians; median of each round's)"]
    for t, per in out["summary"].items():
        for m, s in per.items():
            ratio = next(v for k, v in s.items() if k.startswith("ratio_to_"))
            cratio = next(v for k, v in s.items() if k.startswith("cpu_ratio_to_"))
            pr = paired_ratio(out["times_s"][t][m], out["times_s"][t][models[0]])
            cp = s["compute_paired_ratio"]
            lines.append(f"{t:>7} {m:>{w}} {s['median_s']:>12.3f} ({s['min_s']:.3f}-{s['max_s']:.3f})"
                         f" {ratio:>5.2f}x {pr['median']:>5.2f}x ({pr['min']:.2f}-{pr['max']:.2f})"
                         f" {s['read_median_s']:>6.3f} {cp['median']:>8.2f}x ({cp['min']:.2f}-{cp['max']:.2f})"
                         f" {s['cpu_median_s']:>7.3f} {cratio:>5.2f}x  {s['distinct_auroc']}")
    return lines


BEGIN, END = "<!-- deterioration_bench:begin -->", "<!-- deterioration_bench:end -->"
#: the result file the block of docs/COMMANDS.md is rendered from (``--table FILE --readme docs/COMMANDS.md``)
README_RESULT = "docs/results/deterioration_bench_42k.json"


def markdown(out: dict) -> str:
    """The README block of a :func:`bench` result: per thread count, each model's median epoch
    seconds (min-max), its ratio to the first model's median, the per-round ratio
    (:func:`paired_ratio`), the median seconds of reading rows and the per-round ratio of the compute
    (epoch less reading; "–" in a result that predates ``read_s``), CPU seconds and their ratio; the
    setting and the load."""
    models = list(next(iter(out["summary"].values())))
    lines = ["| threads | model | epoch s, median (min–max) | × " + models[0] + " | per-round × " + models[0]
             + ", median (min–max) | of it reading rows, s | compute per-round × " + models[0]
             + ", median (min–max) | CPU s | × " + models[0] + " (CPU) | test AUROC over rounds |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t, per in out["summary"].items():
        for m, s in per.items():
            ratio = next(v for k, v in s.items() if k.startswith("ratio_to_"))
            cratio = next(v for k, v in s.items() if k.startswith("cpu_ratio_to_"))
            pr = paired_ratio(out["times_s"][t][m], out["times_s"][t][models[0]])
            au = ", ".join(f"{a:.3f}" for a in sorted({round(x, 3) for x in s["distinct_auroc"]}))
            cp = s.get("compute_paired_ratio")
            rd_, cpt = ("–", "–") if cp is None else (
                f"{s['read_median_s']:.2f}", f"{cp['median']:.2f}× ({cp['min']:.2f}–{cp['max']:.2f})")
            lines.append(f"| {t} | {m} | {s['median_s']:.2f} ({s['min_s']:.2f}–{s['max_s']:.2f}) | {ratio:.2f}× | "
                         f"{pr['median']:.2f}× ({pr['min']:.2f}–{pr['max']:.2f}) | {rd_} | {cpt} | "
                         f"{s['cpu_median_s']:.2f} | {cratio:.2f}× | {au} |")
    la, lb = out["load_before"][0], (out.get("load_after") or [float("nan")])[0]
    lines += ["", f"*{out['rounds']} interleaved rounds, warehouse `{out['warehouse']}`, "
                  f"{out['train_windows']:,} training "
                  f"and {out['val_windows']:,} validation windows per epoch ({out['device']} caps), "
                  f"seed {out['seed']}, "
                  f"{out['cpu_count']} CPUs (torch default {out['default_threads']} threads), 1-min load "
                  f"{la:.1f} before, {lb:.1f} after*"]
    return "\n".join(lines)


def write_readme(readme: str, text: str) -> None:
    """Replace what lies between the ``deterioration_bench`` markers of ``readme`` with ``text``."""
    write_marked_block(readme, BEGIN, END, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m evaluation.clinical.deterioration_bench",
        description="Time one training epoch of each deterioration model under each CPU thread count, interleaved "
                    "over rounds with the same seed, and report the median epoch time with its spread, the ratio "
                    "to the first model and whether the AUROC repeats.")
    ap.add_argument("--warehouse", default="runs/warehouse.duckdb",
                    help="warehouse file (default runs/warehouse.duckdb)")
    ap.add_argument("--models", nargs="+", default=["softmax", "sv_attention"],
                    help="models to time, each NAME or NAME:KEY=VALUE[,KEY=VALUE...] (size overrides, e.g. "
                         f"sv_attention:chunk=16); NAME one of {', '.join(dtr.MODELS)}; ratios are to the first "
                         "(default softmax sv_attention)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--threads", nargs="+", type=int, default=[0, 1],
                    help="CPU intra-op thread counts, 0 = torch's default (default 0 1; 1 is the study's mode)")
    ap.add_argument("--train-windows", type=int, default=None, help="training windows per epoch (default: the cap)")
    ap.add_argument("--device", default="cpu", choices=dtr.DEVICES, help="device (default cpu)")
    ap.add_argument("--json", default=None, help="also write the result to this file")
    ap.add_argument("--table", default=None, metavar="FILE",
                    help="print the Markdown table of this result file (from --json) and exit")
    ap.add_argument("--readme", default=None, metavar="FILE",
                    help="with --table: write the table between the deterioration_bench markers of this file")
    a = ap.parse_args(argv)
    if a.table:
        with open(a.table) as f:
            text = markdown(json.load(f))
        print(text)
        if a.readme:
            write_readme(a.readme, text)
        return 0
    if a.readme:
        ap.error("--readme needs --table")
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    for m in a.models:
        try:
            model_spec(m)
        except ModelSpecError as e:
            ap.error(str(e))
    if len(set(a.models)) != len(a.models):
        ap.error("--models: each entry once")
    if any(t < 0 for t in a.threads):
        ap.error("--threads must be >= 0")
    load = os.getloadavg()
    t0 = time.perf_counter()
    out = bench(a.warehouse, a.models, a.rounds, a.train_windows, a.device, threads=a.threads)
    out["load_after"] = os.getloadavg()
    out["wall_s"] = time.perf_counter() - t0
    print(f"load average before {load[0]:.2f}, after {out['load_after'][0]:.2f} ({out['cpu_count']} CPUs); "
          f"{a.rounds} rounds, {out['train_windows']} training windows, {out['val_windows']} validation windows, "
          f"{a.device}, threads {out['threads']} (torch default {out['default_threads']})")
    print("\n".join(table(out, a.models)))
    print(f"total {out['wall_s']:.0f} s")
    if a.json:
        write_json(a.json, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
