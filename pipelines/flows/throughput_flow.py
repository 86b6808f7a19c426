"""``forgetful throughput``: training-step throughput, SV hybrid vs softmax, as a report study.

Wraps :func:`models.bench_throughput.run_benchmark` (3.22M configuration, batch 16,
forward + loss + backward, median of 7 after 3 warm-ups, both models on the same device in the
same run) and writes the ``throughput`` study result. Speed is measured, never asserted.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from prefect import flow

from pipelines import jsonout
from pipelines.runtime import runner


@dataclass(frozen=True)
class ThroughputSettings:
    """The benchmark's device, batch, threads and repeats, and the model's shape: the defaults are
    the seed's 3.22M configuration; smaller ones are for tests."""

    device: str = "cpu"
    batch: int = 16
    threads: int | None = None
    repeats: int = 7
    warmup: int = 3
    block: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4


@flow(name="throughput", log_prints=True)
def throughput_flow(runs_dir: str = "runs", settings: ThroughputSettings = ThroughputSettings()) -> dict:
    """Measure both models' training steps and write the ``throughput`` study result."""
    import torch

    from models.bench_throughput import run_benchmark

    if settings.threads:
        torch.set_num_threads(int(settings.threads))
    t0 = time.perf_counter()
    r = run_benchmark(**{k: v for k, v in asdict(settings).items() if k != "threads"})
    result = {
        "study": "throughput",
        "title": f"Training-step throughput, 3.22M configuration ({r['device']}, {r['threads']} threads)",
        "data": "synthetic",
        "runtime_s": time.perf_counter() - t0,
        "seed_figure": {},
        "metrics": {"softmax_tokens_per_s": r["softmax_tokens_per_s"], "hybrid_tokens_per_s": r["hybrid_tokens_per_s"],
                    "ratio": r["ratio"], "softmax_fused_tokens_per_s": r["softmax_fused_tokens_per_s"],
                    "ratio_vs_fused": r["ratio_vs_fused"]},
        "tables": [{"title": "median tokens/s (forward + loss + backward)",
                    "columns": ["model", "tokens/s"],
                    "rows": [["softmax (unfused masked, the seed's reference)", r["softmax_tokens_per_s"]],
                             ["softmax (torch's fused scaled_dot_product_attention)", r["softmax_fused_tokens_per_s"]],
                             ["SV hybrid (the language model's configuration)", r["hybrid_tokens_per_s"]]]}],
        "figures": [{"kind": "bar", "title": "tokens per second", "ylabel": "tokens/s",
                     "categories": ["softmax", "fused softmax", "SV hybrid"],
                     "values": [r["softmax_tokens_per_s"], r["softmax_fused_tokens_per_s"],
                                r["hybrid_tokens_per_s"]]}],
        "config": {k: r[k] for k in ("device", "torch_version", "threads", "batch", "block", "warmup", "repeats",
                                     "fista_iters", "fista_tol", "kkt_solver", "fista_backend", "fused_readout")
                   if k in r},
        "notes": r.get("softmax_note", ""),
    }
    runner.write_study_result(result, runs_dir)
    return result


@runner.cli_errors
def _main(args) -> int:
    r = throughput_flow(runs_dir=args.runs, settings=ThroughputSettings(
        device=args.device, batch=args.batch, threads=args.threads, repeats=args.repeats, warmup=args.warmup))
    m = r["metrics"]
    print(f"softmax {m['softmax_tokens_per_s']:.0f} tok/s, fused softmax {m['softmax_fused_tokens_per_s']:.0f} tok/s, "
          f"hybrid {m['hybrid_tokens_per_s']:.0f} tok/s, ratio {m['ratio']:.2f} ({m['ratio_vs_fused']:.2f} vs fused) "
          "(seed: 6.1x on CPU, 35.8x on MPS)")
    jsonout.emit(args, r)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("throughput", help="training-step throughput: SV hybrid vs softmax (study result)",
                       description=__doc__)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"], help="torch device (default %(default)s)")
    p.add_argument("--batch", type=int, default=16, help="sequences per training step (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--repeats", type=int, default=7, help="timed steps; the median is reported (default %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default %(default)s)")
    p.add_argument("--runs", default="runs", help="runs directory for the result (default: %(default)s)")
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
