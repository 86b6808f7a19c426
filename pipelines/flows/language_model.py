"""The language-model study as a Prefect flow and the ``forgetful lm`` command.

    forgetful lm [--protocol cpu|seed|tiny] [--corpus PATH] [--steps N] [--seeds 0 1 2]
                 [--out runs/language_model/result.json] [--references [deltanet linear softmax]]

The study (SV hybrid vs matched-state sliding-window softmax, 001 §6.3, App. C/D: training,
validation bits per byte, the paired tests, the protocols) is
:mod:`evaluation.studies.language_model`; here each training run is a Prefect task, the corpus is
loaded and the result files are written. The corpus defaults to the Shakespeare file built by
``python -m models.corpus fetch``.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from prefect import flow, task

from evaluation.studies.language_model import (
    DEFAULT_PROTOCOL,
    PROTOCOLS,
    REFERENCE_VARIANTS,
    LMStudyError,
    check_references,
    run_comparison,
    train_run,
)
from evaluation.studies.language_model_result import study_result
from models.corpus import CorpusMissingError, load_corpus
from sv_core.jsonfile import write_json

train_task = task(train_run, name="lm-train-run")


@dataclass(frozen=True)
class LMSettings:
    """The study's settings: the protocol (``tiny`` for a smoke run), ``steps`` / ``seeds``
    overriding the protocol's, the reference rows, the torch device and intra-op threads."""

    protocol: str = DEFAULT_PROTOCOL
    steps: int | None = None
    seeds: tuple[int, ...] | None = None
    references: tuple[str, ...] | None = None
    device: str = "cpu"
    threads: int | None = None


@flow(name="language-model", log_prints=True)
def language_model_flow(corpus: str | None = None, out: str = "runs/language_model/result.json",
                        settings: LMSettings = LMSettings(), progress: bool = True,
                        resume_dir: str | None = None) -> dict:
    """Prefect flow: load the corpus, run the paired comparison (each training run a task) and
    the optional single-seed reference rows, write the JSON result. ``settings.steps`` /
    ``seeds`` override the protocol's (the result then records ``<protocol>+custom`` unless they
    equal the protocol's own). ``settings.threads`` fixes torch's intra-op threads (same bits for
    a seed at a fixed thread count); ``resume_dir`` (default: a ``runs`` folder beside ``out``)
    keeps each finished training run so a rerun resumes."""
    protocol, steps, seeds, device, threads = (settings.protocol, settings.steps, settings.seeds, settings.device,
                                               settings.threads)
    references = None if settings.references is None else list(settings.references)
    refs = check_references(references)  # fail before any training or corpus loading
    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise LMStudyError(f"device {device!r} is not available here (torch.cuda.is_available() is False)")
    if threads is not None:
        if int(threads) < 1:
            raise LMStudyError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    if protocol not in PROTOCOLS:
        raise LMStudyError(f"unknown protocol {protocol!r}; choose from {list(PROTOCOLS)}")
    cfg, default_seeds, _ = PROTOCOLS[protocol]
    seeds = list(seeds if seeds is not None else default_seeds)
    if steps is not None and int(steps) < 1:
        raise LMStudyError(f"steps must be >= 1, got {steps}")
    if steps is not None and int(steps) != cfg.steps:
        cfg = replace(cfg, steps=int(steps), eval_interval=min(cfg.eval_interval, int(steps)))
    cfg = replace(cfg, device=device)
    ran = protocol if cfg.steps == PROTOCOLS[protocol][0].steps and seeds == default_seeds else f"{protocol}+custom"
    data = load_corpus(corpus, cfg.max_bytes)
    path = Path(out)
    resume = Path(resume_dir) if resume_dir is not None else path.parent / "runs"
    res = run_comparison(cfg, seeds, data, runner=lambda *a: train_task(*a), progress=progress, references=refs,
                         resume_dir=resume)
    res["protocol"] = ran
    res["environment"] = {"torch": torch.__version__, "device": device, "threads": torch.get_num_threads()}
    path.parent.mkdir(parents=True, exist_ok=True)
    from dashboards.schema import write_result

    res["corpus_name"] = Path(corpus).name if corpus else "Shakespeare (Project Gutenberg)"
    write_result(study_result(res, res["corpus_name"]), path)
    # full per-step curves and configuration beside it ("kind", not "study": the report skips it)
    details = dict(res)
    details["kind"] = details.pop("study")
    write_json(path.with_name("details.json"), details)
    return res


def _reference_name(name: str) -> str:
    if name not in REFERENCE_VARIANTS:
        raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(REFERENCE_VARIANTS)}")
    return name


def _cli(args: argparse.Namespace) -> int:
    if args.references is not None and not args.references:
        args.references = list(REFERENCE_VARIANTS)  # bare --references: every reference row
    try:
        settings = LMSettings(protocol="tiny" if args.tiny else args.protocol, steps=args.steps,
                              seeds=None if args.seeds is None else tuple(args.seeds),
                              references=None if args.references is None else tuple(args.references),
                              device=args.device, threads=args.threads)
        res = language_model_flow(corpus=args.corpus, out=args.out, settings=settings, progress=not args.no_progress,
                                  resume_dir=args.resume_dir)
    except (CorpusMissingError, LMStudyError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    t = res["tests"]
    print(f"[{res['protocol']} protocol] SV {t['mean_sv']:.4f} vs swa {t['mean_swa']:.4f} bits/byte over {t['n']} "
          f"seeds; paired t p={t['t_p']:.3g}, Wilcoxon p={t['wilcoxon_p']:.3g} -> {args.out}")
    for r in res["references"]:
        print(f"  reference {r['variant']} (seed {r['seed']}): {r['best_val_bpb']:.4f} bits/byte")
    from pipelines.jsonout import emit_file

    emit_file(args, args.out)
    return 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("lm", help="language model: SV hybrid vs matched sliding window")
    p.add_argument("--corpus", default=None, help="byte file (default: Shakespeare from "
                   "`python -m models.corpus fetch`)")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default=DEFAULT_PROTOCOL,
                   help="cpu: minutes on a 2-core CPU, a pipeline check (default); paper: the paper's 3.22M "
                        "model, 7 paired seeds (default 2,000 steps: a GPU's job, --device cuda; set --steps "
                        "for a CPU budget); seed: 3.22M, 3 seeds; tiny: seconds-long smoke run")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per run (default: the protocol's; cpu 30, seed 2000)")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="paired seeds (default: the protocol's; cpu 0 1, seed 0 1 2)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's); fix it for bit-identical reruns")
    p.add_argument("--resume-dir", default=None,
                   help="finished training runs are kept here and reused by a rerun "
                        "(default: a runs/ folder beside --out)")
    p.add_argument("--tiny", action="store_true", help="seconds-long smoke configuration (= --protocol tiny)")
    p.add_argument("--out", default="runs/language_model/result.json",
                   help="study result JSON; details.json goes beside it (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no per-step / per-eval progress lines")
    p.add_argument("--references", nargs="*", default=None, metavar="NAME",
                   type=_reference_name,
                   help="also train single-seed reference rows on the same backbone and budget "
                        f"(no names: all of {', '.join(REFERENCE_VARIANTS)})")
    from pipelines.jsonout import add_json_arg

    add_json_arg(p)
    p.set_defaults(func=_cli)
