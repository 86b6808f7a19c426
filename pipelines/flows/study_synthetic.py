"""The fixed-protocol synthetic studies as Prefect flows and ``forgetful`` subcommands.

Each row of :data:`STUDIES` is one study: its command, result name, the function in
:mod:`evaluation.studies` that runs it (``fn(trials=, seed=, progress=) -> result dict``), the
seed's trial count and a one-line help. Each gets a Prefect flow (``FLOWS[study]``) that runs
the study as one task and writes ``runs/<study>/result.json`` (validated against
dashboards/SCHEMA.md). Studies with extra options (learned keys, retrieval memory) have their
own modules.
"""
from __future__ import annotations

import functools
import importlib
from pathlib import Path

from prefect import flow, task

from pipelines.flows.study_common import add_common_args, default_out, finish, write_result

#: (command, study, "module:function" under evaluation.studies, default trials, help)
STUDIES = [
    ("planted-secret", "planted_secret", "planted_secret:run", 30,
     "study: remove a planted secret (exact decrement vs decay)"),
    ("skewed-redundancy", "skewed_redundancy", "skewed_redundancy:run", 60,
     "study: matched-budget selection under skewed redundancy"),
    ("streaming-eviction", "streaming_eviction", "streaming_eviction:run", 60,
     "study: online bounded-budget eviction (gate vs streaming H2O)"),
    ("selective-copying", "selective_copying", "recall_tasks:run_selective_copying", 100,
     "study: selective copying, 8 informative + F filler (gate vs gate-off ablation)"),
    ("capacity", "capacity", "recall_tasks:run_capacity", 100,
     "study: capacity sweep (SV gate vs gate-off ablation)"),
    ("mqar-control", "mqar_control", "recall_tasks:run_mqar_control", 200,
     "study: distinct-key recall control (gate vs ungated)"),
]


def _study_fn(target: str):
    module, fn = target.split(":")
    return getattr(importlib.import_module(f"evaluation.studies.{module}"), fn)


def _make_flow(command: str, study: str, target: str, trials: int):
    @task(name=f"{command}-trials")
    def compute(trials: int, seed: int, progress: bool) -> dict:
        return _study_fn(target)(trials=trials, seed=seed, progress=progress)

    out_default = default_out(study)  # computed once, when the flow is made (as a call in the signature was)

    @flow(name=f"study-{command}", log_prints=True)
    def study_flow(trials: int = trials, seed: int = 0, out: str | Path = out_default,
                   progress: bool = True) -> str:
        return str(write_result(compute(trials, seed, progress), Path(out)))

    return study_flow


FLOWS = {study: _make_flow(cmd, study, target, trials) for cmd, study, target, trials, _ in STUDIES}


def _cli(study: str, args) -> int:
    return finish(args, FLOWS[study](args.trials, args.seed, args.out, not args.no_progress))


def add_cli(sub) -> None:
    for cmd, study, _, trials, help_ in STUDIES:
        p = sub.add_parser(cmd, help=help_)
        add_common_args(p, study, trials)
        p.set_defaults(func=functools.partial(_cli, study))
