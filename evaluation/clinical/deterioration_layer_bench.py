"""Where a training step of the deterioration study's attention goes: the SV layer beside softmax's.

Command line::

    python -m evaluation.clinical.deterioration_layer_bench [--lengths 48 72 96] [--threads 1 2] [--rounds 9]
        [--models softmax sv_attention sv_attention:chunk=24] [--json OUT]
    python -m evaluation.clinical.deterioration_layer_bench --table OUT [--readme docs/COMMANDS.md]

`evaluation.clinical.deterioration_bench` times whole epochs; this command opens one up. Each
round times the attention layer of every model of ``--models`` (built as the study builds it,
:func:`~evaluation.clinical.deterioration_models.make_model`, same seed) on one batch of the
study's size (16 windows of ``d_model`` features) at every window length of ``--lengths`` (the
study's windows are 48 to 96 hours) and every CPU thread count of ``--threads``: a forward and a
backward pass, ``--reps`` times, models in alternating order from round to round. For an SV layer
the seconds inside each compiled loop of ``sv_core._batchfast`` (FISTA, the KKT solve and its
backward, the readout and its backward, the Gram backward) are summed as they run; the rest of the
layer's time is torch and Python around them (the Gram's forward, the masks, the autograd graph).

Printed per thread count, length and model: the median milliseconds per forward + backward with
their min-max spread, the median (min-max) of the per-round ratios to the first model, and for an SV
layer the median milliseconds in the compiled loops, by loop and in all. A benchmark command, never
a timed assertion; the machine's load average is recorded before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from evaluation.clinical import deterioration as det
from evaluation.clinical import deterioration_models as dm
from evaluation.clinical.deterioration_bench import ModelSpecError, model_spec, paired_ratio
from sv_core.jsonfile import write_json, write_marked_block

#: the study's batch (`deterioration_training.fit`) and window lengths (48 to 96 hours)
BATCH = 16
LENGTHS = (48, 72, 96)
#: the compiled loops a training step of the SV layer calls, in the order they run
LOOPS = ("fista", "kkt_forward", "readout_forward", "readout_backward", "kkt_backward", "gram_backward")
#: the attention models (the others have no attention layer)
ATTENTION_MODELS = ("softmax", "sv_attention")
BEGIN, END = "<!-- deterioration_layer_bench:begin -->", "<!-- deterioration_layer_bench:end -->"
#: the result file docs/COMMANDS.md renders
README_RESULT = "docs/results/deterioration_layer_bench.json"


class _TimedLoops:
    """Stands in for the ``sv_core._batchfast`` module: each function of :data:`LOOPS` is the
    module's own, with its wall seconds added to ``seconds[name]``; everything else passes through."""

    def __init__(self, ext, seconds: dict[str, float]):
        self._ext, self._seconds = ext, seconds

    def __getattr__(self, name: str):
        fn = getattr(self._ext, name)
        if name not in LOOPS:
            return fn

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - t0
        return timed


@contextmanager
def timed_loops(seconds: dict[str, float]) -> Iterator[bool]:
    """For the ``with`` block, every call of a compiled loop adds its seconds to ``seconds``; yields
    whether the loops are built (when not, nothing is timed and the layers run their torch paths)."""
    from sv_core.batched import common

    ext = common.batchfast
    if ext is None:
        yield False
        return
    common.batchfast = _TimedLoops(ext, seconds)
    try:
        yield True
    finally:
        common.batchfast = ext


def attention_layer(name: str, size: dict, max_len: int = max(LENGTHS)):
    """The attention module of model ``name`` at ``size`` (over the study's), as the study builds it."""
    full = {**dm.DEFAULT_SIZE, **size}
    return dm.make_model(name, det.N_FEATURES, max_len, full, seed=0).blocks[0].attn


def time_layer(layer, x, grad, reps: int) -> tuple[float, dict[str, float]]:
    """Seconds per forward + backward of ``layer`` on ``x`` (upstream gradient ``grad``), and the
    seconds per pass inside each compiled loop."""
    loops: dict[str, float] = {}
    with timed_loops(loops):
        t0 = time.perf_counter()
        for _ in range(reps):
            x.grad = None
            layer.zero_grad(set_to_none=True)
            layer(x).backward(grad)
        elapsed = time.perf_counter() - t0
    return elapsed / reps, {k: v / reps for k, v in loops.items()}


def bench(models: list[str], lengths=LENGTHS, threads=(1,), rounds: int = 9, reps: int = 30, warmup: int = 3,
          seed: int = 0) -> dict:
    """``times_ms[str(t)][str(T)][model]``: ``rounds`` milliseconds per forward + backward;
    ``loops_ms`` alike, per compiled loop (empty for a layer that calls none); ``summary`` the medians,
    spreads and per-round ratios to ``models[0]``."""
    import torch

    specs = {m: model_spec(m) for m in models}
    if len(set(models)) != len(models):
        raise ModelSpecError(f"a model is named twice in {' '.join(models)}")
    for m, (name, _) in specs.items():
        if name not in ATTENTION_MODELS:
            raise ModelSpecError(f"{m!r} has no attention layer; choose from {', '.join(ATTENTION_MODELS)}")
    layers = {m: attention_layer(*specs[m]) for m in models}
    load_before = os.getloadavg()
    before = torch.get_num_threads()
    g = torch.Generator().manual_seed(seed)
    d = dm.DEFAULT_SIZE["d_model"]
    inputs = {T: (torch.randn(BATCH, T, d, generator=g).requires_grad_(True), torch.randn(BATCH, T, d, generator=g))
              for T in lengths}
    ts = [str(int(t)) for t in threads]
    times = {t: {str(T): {m: [] for m in models} for T in lengths} for t in ts}
    loops = {t: {str(T): {m: [] for m in models} for T in lengths} for t in ts}
    try:
        for t in ts:
            torch.set_num_threads(int(t))
            for T in lengths:
                for m in models:
                    time_layer(layers[m], *inputs[T], warmup)
        for r in range(rounds):
            for t in (ts if r % 2 == 0 else ts[::-1]):
                torch.set_num_threads(int(t))
                for T in lengths:
                    for m in (models if r % 2 == 0 else models[::-1]):
                        s, lp = time_layer(layers[m], *inputs[T], reps)
                        times[t][str(T)][m].append(s * 1e3)
                        loops[t][str(T)][m].append({k: v * 1e3 for k, v in lp.items()})
    finally:
        torch.set_num_threads(before)
    summary: dict = {}
    for t in ts:
        for T in lengths:
            row = times[t][str(T)]
            for m in models:
                v = row[m]
                names = sorted({k for lp in loops[t][str(T)][m] for k in lp}, key=LOOPS.index)
                per = {k: statistics.median(lp.get(k, 0.0) for lp in loops[t][str(T)][m]) for k in names}
                total = [sum(lp.values()) for lp in loops[t][str(T)][m]]
                summary.setdefault(t, {}).setdefault(str(T), {})[m] = {
                    "median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v),
                    "paired_ratio": paired_ratio(v, row[models[0]]),
                    "loops_median_ms": per, "loops_total_median_ms": statistics.median(total) if names else 0.0,
                    "around_loops_median_ms": statistics.median(a - b for a, b in zip(v, total)) if names else None}
    return {"batch": BATCH, "d_model": d, "lengths": [int(T) for T in lengths], "threads": [int(t) for t in ts],
            "rounds": rounds, "reps": reps, "seed": seed, "cpu_count": os.cpu_count(),
            "load_before": load_before, "load_after": os.getloadavg(),
            "sizes": {m: {**dm.DEFAULT_SIZE, **specs[m][1]} for m in models},
            "times_ms": times, "loops_ms": loops, "summary": summary}


def markdown(out: dict) -> str:
    """The result as a Markdown table (the block :func:`main` writes with ``--readme``)."""
    first = next(iter(out["sizes"]))
    lines = [f"| threads | hours | model | ms per forward + backward, median (min–max) | per-round ratio to {first} "
             "| in compiled loops, ms | around them, ms |", "|---|---|---|---|---|---|---|"]
    for t, by_len in out["summary"].items():
        for T, by_model in by_len.items():
            for m, s in by_model.items():
                pr = s["paired_ratio"]
                loops = (f"{s['loops_total_median_ms']:.2f} (" + ", ".join(
                    f"{k} {v:.2f}" for k, v in s["loops_median_ms"].items()) + ")") if s["loops_median_ms"] else "–"
                around = "–" if s["around_loops_median_ms"] is None else f"{s['around_loops_median_ms']:.2f}"
                lines.append(f"| {t} | {T} | `{m}` | {s['median_ms']:.2f} ({s['min_ms']:.2f}–{s['max_ms']:.2f}) "
                             f"| {pr['median']:.2f}× ({pr['min']:.2f}–{pr['max']:.2f}) | {loops} | {around} |")
    lb, la = out["load_before"], out["load_after"]
    lines.append(f"\nBatch {out['batch']} × `d_model` {out['d_model']}, {out['rounds']} interleaved rounds of "
                 f"{out['reps']} passes; {out['cpu_count']} CPUs, load average {lb[0]:.2f} before, {la[0]:.2f} after.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluation.clinical.deterioration_layer_bench",
                                 description="Time one forward + backward of the deterioration study's attention "
                                 "layers (softmax and SV attention, as the study builds them) on a batch of 16 "
                                 "windows at each window length and thread count, interleaved over rounds, with the "
                                 "SV layer's milliseconds inside each compiled loop and around them.")
    ap.add_argument("--models", nargs="+", default=["softmax", "sv_attention"],
                    help="layers to time, each NAME or NAME:KEY=VALUE[,...] as in deterioration_bench; ratios are "
                         "to the first (default softmax sv_attention)")
    ap.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS), help="window lengths in hours "
                    f"(default {' '.join(map(str, LENGTHS))})")
    ap.add_argument("--threads", nargs="+", type=int, default=[1], help="CPU intra-op thread counts (default 1)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    ap.add_argument("--reps", type=int, default=30, help="passes timed per round (default 30)")
    ap.add_argument("--json", help="also write the result to this file")
    ap.add_argument("--table", metavar="FILE", help="print the Markdown table of this result file and exit")
    ap.add_argument("--readme", metavar="FILE", help="with --table: write the table between the "
                    "deterioration_layer_bench markers of this file")
    a = ap.parse_args(argv)
    if a.table:
        with open(a.table, encoding="utf-8") as f:
            text = markdown(json.load(f))
        if a.readme:
            write_marked_block(a.readme, BEGIN, END, text)
        print(text)
        return 0
    if a.readme:
        ap.error("--readme goes with --table")
    bad = [v for v in (*a.lengths, *a.threads, a.rounds, a.reps) if v < 1]
    if bad or max(a.lengths) > 96:
        ap.error("lengths (1 to 96), threads, rounds and reps must be positive")
    try:
        out = bench(a.models, a.lengths, a.threads, a.rounds, a.reps)
    except (ModelSpecError, det.DeteriorationInputError) as e:
        print(f"deterioration_layer_bench: {e}", file=sys.stderr)
        return 2
    if a.json:
        write_json(a.json, out)
    print(markdown(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
