"""``forgetful learned-keys``: train a small MQAR model, freeze its keys, forget and edit exactly, and
compare rare-fact selection under redundancy at the matched budget ``k = |S∪E|`` (``--copies``).

The flow also registers a learned-key regime with :func:`sv_core.audit.register_regime` and runs
the fixed-C deletion audit on it (``--audit-trials``, 300 in the full run).
"""
from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from pipelines.flows.study_common import add_common_args, finish, write_result

STUDY = "learned_keys"


@task(name="learned-keys-study")
def _compute(trials: int, seed: int, steps: int, audit_trials: int, progress: bool, copies: int = 6) -> dict:
    from evaluation.studies.learned_keys import run

    return run(trials=trials, seed=seed, steps=steps, audit_trials=audit_trials, copies=copies, progress=progress)


@flow(name="study-learned-keys", log_prints=True)
def learned_keys_flow(trials: int = 200, seed: int = 0, steps: int = 600, audit_trials: int = 300,
                      out: str | Path = f"runs/{STUDY}/result.json", progress: bool = True, copies: int = 6) -> str:
    result = _compute(trials, seed, steps, audit_trials, progress, copies)
    return str(write_result(result, Path(out)))


def _cli(args) -> int:
    return finish(args, learned_keys_flow(args.trials, args.seed, args.steps, args.audit_trials, args.out,
                                          not args.no_progress, args.copies))


def add_cli(sub) -> None:
    p = sub.add_parser("learned-keys", help="study: forget/edit facts on the frozen keys of a trained recall model")
    add_common_args(p, STUDY, 200)
    p.add_argument("--steps", type=int, default=600, help="training steps of the recall model")
    p.add_argument("--audit-trials", type=int, default=300, help="learned-key deletion-audit trials (0: skip)")
    p.add_argument("--copies", type=int, default=6,
                   help="times each non-rare fact is restated in the redundancy comparison (default %(default)s)")
    p.set_defaults(func=_cli)
