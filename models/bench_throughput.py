"""Throughput benchmark: softmax vs SV hybrid at the 3.22M configuration.

A timed step is ``zero_grad`` + forward + cross-entropy + backward (no optimiser update, no
data loading), batch 16, block 256, as in 001 Appendix C. Each model (the seed's unfused softmax,
torch's fused softmax, the SV hybrid): 3 warm-ups, then the median of 7 synchronised samples; the
models are sampled in turn in the same process on the same device so background load affects all
alike.

    python -m models.bench_throughput --json runs/throughput/result.json [--device cpu|cuda|mps]
        [--batch 16] [--fista-tol 1e-4] [--fista-iters 80] [--threads N]
        [--kkt-solver auto|compiled|cholesky|lu] [--fista-backend auto|torch|compiled] [--reference-readout]

The defaults are the language-model study's configuration (`evaluation.studies.language_model`:
chunk 64, C 0.25, sigma 2, 80 FISTA iterations with early exit at 1e-4, ``kkt_solver`` and
``fista_backend`` "auto" - the compiled loops on CPU when built). ``--kkt-solver lu --fista-backend
torch --reference-readout`` times the reference implementations (the SPEC's ``torch.linalg.solve``
KKT solve, the torch FISTA loop and the dense readout) for a before/after comparison.

    python -m models.bench_throughput --table docs/results/bench_throughput_1thread.json
        docs/results/bench_throughput_default.json --readme docs/COMMANDS.md

renders the results' table (printed, or into the ``throughput`` markers of ``--readme``).

JSON keys: softmax_tokens_per_s, hybrid_tokens_per_s, ratio (hybrid step time / softmax step
time, i.e. softmax_tokens_per_s / hybrid_tokens_per_s), softmax_fused_tokens_per_s and
ratio_vs_fused (the same against torch's fused ``scaled_dot_product_attention``, the peer a user
would pick), device, torch_version, threads, plus the configuration and per-sample times.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from models.backbone import GPT, GPTConfig
from sv_core.batched import FISTA_BACKENDS, KKT_SOLVERS
from sv_core.batched.common import compiled_build
from sv_core.jsonfile import write_json, write_marked_block


class BenchError(RuntimeError):
    """The requested device is unavailable or the configuration is invalid."""


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def _resolve_device(device: str) -> str:
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda requested but torch.cuda.is_available() is False")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise BenchError("--device mps requested but MPS is not available")
    if device not in ("cpu", "cuda", "mps"):
        raise BenchError(f"unknown device {device!r}")
    return device


def build_models(block: int = 256, d_model: int = 256, n_layers: int = 4, n_heads: int = 4, fista_iters: int = 80,
                 fista_tol: float | None = 1e-4, kkt_solver: str = "auto", fused_readout: bool = True,
                 fista_backend: str = "auto") -> dict[str, GPT]:
    """The timed models, ``{"softmax": GPT, "softmax_fused": GPT, "hybrid": GPT}`` (byte vocabulary): the
    seed's unfused softmax reference, torch's fused ``scaled_dot_product_attention`` and the SV hybrid;
    the defaults are the language-model study's 3.22M configuration (tested against its `build_model`)."""
    base = dict(vocab_size=256, block_size=block, d_model=d_model, n_layers=n_layers, n_heads=n_heads)
    return {
        "softmax": GPT(GPTConfig(attention="softmax", **base)),
        "softmax_fused": GPT(GPTConfig(attention="softmax", attn_kwargs={"fused": True}, **base)),
        "hybrid": GPT(
            GPTConfig(
                attention="sv_hybrid",
                attn_kwargs={"chunk": 64, "C": 0.25, "sigma": 2.0, "fista_iters": fista_iters,
                             "fista_tol": fista_tol, "kkt_solver": kkt_solver,
                             "fused_readout": fused_readout, "fista_backend": fista_backend},
                **base,
            )
        ),
    }


def run_benchmark(
    device: str = "cpu",
    batch: int = 16,
    block: int = 256,
    warmup: int = 3,
    repeats: int = 7,
    fista_iters: int = 80,
    fista_tol: float | None = 1e-4,
    seed: int = 0,
    d_model: int = 256,
    n_layers: int = 4,
    n_heads: int = 4,
    kkt_solver: str = "auto",
    fused_readout: bool = True,
    fista_backend: str = "auto",
) -> dict:
    """Time the three models of `build_models`, interleaved; returns the result dict (see module docstring)."""
    device = _resolve_device(device)
    torch.manual_seed(seed)
    models = {k: m.to(device) for k, m in build_models(block, d_model, n_layers, n_heads, fista_iters, fista_tol,
                                                        kkt_solver, fused_readout, fista_backend).items()}
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (batch, block + 1), generator=g).to(device)
    inp, tgt = x[:, :-1], x[:, 1:]

    def step(model):
        model.zero_grad(set_to_none=True)
        _sync(device)
        t0 = time.perf_counter()
        _, loss = model(inp, tgt)
        loss.backward()
        _sync(device)
        return time.perf_counter() - t0

    load_before = os.getloadavg()[0]
    for _ in range(warmup):
        for m in models.values():
            step(m)
    samples = {k: [] for k in models}
    for _ in range(repeats):
        for k, m in models.items():
            samples[k].append(step(m))
    tokens = batch * block
    med = {k: statistics.median(v) for k, v in samples.items()}
    fista_its = [s.get("fista_iterations") for s in models["hybrid"].attention_stats()]
    return {
        "softmax_tokens_per_s": tokens / med["softmax"],
        "hybrid_tokens_per_s": tokens / med["hybrid"],
        "ratio": med["hybrid"] / med["softmax"],
        "softmax_fused_tokens_per_s": tokens / med["softmax_fused"],
        "ratio_vs_fused": med["hybrid"] / med["softmax_fused"],
        "device": device,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "batch": batch,
        "block": block,
        "params_non_embedding": models["softmax"].num_params(),
        "warmup": warmup,
        "repeats": repeats,
        "fista_iters": fista_iters,
        "fista_tol": fista_tol,
        "kkt_solver": kkt_solver,
        "fista_backend": fista_backend,
        "fused_readout": fused_readout,
        "compiled_loops": compiled_build(),
        "fista_iterations_last_step": fista_its,
        "step_seconds": samples,
        "step_seconds_min_max": {k: [min(v), max(v)] for k, v in samples.items()},
        "load_1min_before_after": [load_before, os.getloadavg()[0]],
        "softmax_note": "softmax: the unfused masked reference (the seed's); softmax_fused: torch's "
                        "scaled_dot_product_attention(is_causal=True)",
        "seed_figure": {"hybrid_tokens_per_s": 9125, "ratio_vs_cpu_softmax": 6.1},
    }


BEGIN, END = "<!-- throughput:begin -->", "<!-- throughput:end -->"
#: the result files the block of docs/COMMANDS.md is rendered from
README_RESULTS = ("docs/results/bench_throughput_1thread.json", "docs/results/bench_throughput_default.json")


def markdown(results: list[dict]) -> str:
    """The table of benchmark results: per result, the threads, each side's tokens/s and step seconds
    (median, min-max), the ratio of medians; the configuration and the load below."""
    lines = ["| threads | softmax tok/s | SV hybrid tok/s | softmax step s, median (min–max) | "
             "SV hybrid step s, median (min–max) | SV / softmax | fused softmax tok/s | SV / fused softmax | "
             "1-min load before, after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        med = {k: statistics.median(v) for k, v in r["step_seconds"].items()}
        mm = r["step_seconds_min_max"]
        lb, la = r["load_1min_before_after"]
        lines.append(f"| {r['threads']} | {r['softmax_tokens_per_s']:,.0f} | {r['hybrid_tokens_per_s']:,.0f} | "
                     f"{med['softmax']:.2f} ({mm['softmax'][0]:.2f}–{mm['softmax'][1]:.2f}) | "
                     f"{med['hybrid']:.2f} ({mm['hybrid'][0]:.2f}–{mm['hybrid'][1]:.2f}) | "
                     f"**{r['ratio']:.2f}×** | " + (f"{r['softmax_fused_tokens_per_s']:,.0f} | "
                                                   f"{r['ratio_vs_fused']:.2f}× | " if "ratio_vs_fused" in r
                                                   else "– | – | ") + f"{lb:.1f}, {la:.1f} |")
    r0 = results[0]
    build = r0.get("compiled_loops") or {}
    lines += ["", f"*{r0['device']}, torch {r0['torch_version']}, batch {r0['batch']} × block {r0['block']}, "
                  f"{r0['params_non_embedding']:,} non-embedding parameters; {r0['repeats']} interleaved samples "
                  f"after {r0['warmup']} warm-ups; SV: FISTA ≤ {r0['fista_iters']} iterations, early exit "
                  f"{r0['fista_tol']}, backend {r0.get('fista_backend', 'torch')}, KKT {r0['kkt_solver']}, compiled "
                  f"loops {'with OpenMP' if build.get('openmp') else 'built' if build.get('built') else 'not built'}; "
                  f"{r0['softmax_note']}*"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.bench_throughput", description=__doc__.split("\n")[0])
    p.add_argument("--json", help="output JSON path (required unless --table)")
    p.add_argument("--table", nargs="+", metavar="RESULT", help="render these result files' table instead")
    p.add_argument("--readme", help="with --table: write it between the throughput markers of this file")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--fista-iters", type=int, default=80)
    p.add_argument("--fista-tol", type=float, default=1e-4,
                   help="early-exit tolerance (<= 0 disables early exit: fixed iterations)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--kkt-solver", default="auto", choices=list(KKT_SOLVERS),
                   help="ridged KKT solve: auto (the study's: compiled on CPU when built), compiled, "
                        "Schur-complement Cholesky or torch.linalg.solve")
    p.add_argument("--fista-backend", default="auto", choices=list(FISTA_BACKENDS),
                   help="FISTA partition finder: auto (the study's: compiled on CPU when built), torch, compiled")
    p.add_argument("--reference-readout", action="store_true",
                   help="dense reference readout instead of the chunked fused one")
    a = p.parse_args(argv)
    if a.table:
        try:
            text = markdown([json.loads(open(f, encoding="utf-8").read()) for f in a.table])
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: cannot render {a.table}: {e}", file=sys.stderr)
            return 2
        if a.readme:
            write_marked_block(a.readme, BEGIN, END, text)
        else:
            print(text)
        return 0
    if not a.json:
        p.error("--json is required (or --table RESULT ...)")
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        res = run_benchmark(a.device, a.batch, a.block, a.warmup, a.repeats, a.fista_iters,
                            a.fista_tol if a.fista_tol and a.fista_tol > 0 else None,
                            kkt_solver=a.kkt_solver, fused_readout=not a.reference_readout,
                            fista_backend=a.fista_backend)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json(a.json, res)
    print(json.dumps({k: res[k] for k in ("softmax_tokens_per_s", "hybrid_tokens_per_s", "ratio",
                                          "softmax_fused_tokens_per_s", "ratio_vs_fused", "device", "threads")},
                     indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    sys.exit(main())
