"""The study steps of :mod:`pipelines.bench.scale`: what each runs (:data:`STEPS`, the one table
to update when a command gains an option), how a study is capped to ``--study-stays`` (its own
stays option read from the command's parser, or a sampled warehouse), and the longest stay a
step processed (what sets a study's peak RSS).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StepSpec:
    """One study step: its command, fixed arguments, and the options that cap the stays it
    processes (the first one the command's parser knows is given ``--study-stays``)."""

    command: str
    args: tuple[str, ...] = ()
    stays_options: tuple[str, ...] = ()


#: the one table to update when a command gains an option
STEPS: dict[str, StepSpec] = {
    "build": StepSpec("build-cohort"),
    "retention": StepSpec("retention", (), ("--stays",)),
    "heldout": StepSpec("heldout-spo2", (), ("--stays",)),
    # documented caps of a CPU run (issue 20's measurements): one seed, two epochs
    "deterioration": StepSpec("deterioration", ("--seeds", "1", "--max-epochs", "2"), ("--stays", "--max-stays")),
}
PEERS = ("duckdb", "polars")


def command_options(command: str) -> set[str]:
    """Every option string of ``forgetful <command>``, read from the command's own parser."""
    from pipelines.cli import build_parser

    parser = build_parser([command])
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return set(action.choices[command]._option_string_actions)
    return set()


def stays_cap(name: str, options: set[str]) -> str | None:
    """The option of a study command that caps its stays (the first of :data:`STEPS` it has)."""
    return next((o for o in STEPS[name].stays_options if o in options), None)


def needs_sample(name: str, options: set[str], eligible: int | None, study_stays: int | None) -> bool:
    """True when a study must run on a sampled warehouse: a cap is asked for, the command has no
    stays option and the warehouse holds more eligible stays than the cap."""
    return bool(study_stays) and stays_cap(name, options) is None and (eligible is None or eligible > study_stays)


def study_argv(name: str, options: set[str], eligible: int | None, study_stays: int | None,
               full_study_max: int) -> tuple[list[str] | None, int | None, str]:
    """(extra arguments, stays it will process, reason) of a study step; arguments None = skip."""
    spec = STEPS[name]
    cap = stays_cap(name, options)
    args = list(spec.args)
    if study_stays and cap:
        return args + [cap, str(study_stays)], min(study_stays, eligible or study_stays), f"{cap} {study_stays}"
    if needs_sample(name, options, eligible, study_stays):
        return args, study_stays, f"a warehouse sampled by build-cohort --sample {study_stays}"
    if not study_stays and eligible is not None and eligible > full_study_max:
        why = (f"{spec.command} has no stays option ({', '.join(spec.stays_options)}) and no --study-stays given; "
               if not cap else "no --study-stays given; ")
        return None, None, why + f"{eligible:,} eligible stays > --full-study-max {full_study_max:,}"
    return args, eligible, "every eligible stay"


def longest_stay(warehouse: Path, extra: list[str]) -> int | None:
    """Hours of the longest stay a study step processed: of its ``--stays N`` sample (the seeded
    order every study uses, seed 0) or of every eligible stay of ``warehouse`` (an aggregate; no
    stay id is kept). None when the warehouse cannot be read."""
    from evaluation.clinical.sampling import sample_stays
    from pipelines.store import warehouse as whs

    try:
        rows = whs.stays(str(warehouse))
    except Exception:  # noqa: BLE001 - a figure of the report, never a reason to fail the benchmark
        return None
    hours = {int(r[0]): int(r[3]) for r in rows}
    n = int(extra[extra.index("--stays") + 1]) if "--stays" in extra else None
    ids = sample_stays(list(hours), n, 0) if hours else []
    return max((hours[int(i)] for i in ids), default=None)


