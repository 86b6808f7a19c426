"""Input checks of a ``forgetful`` command before anything heavy starts.

A flow command imports Prefect and torch and starts its own Prefect API server
(:mod:`pipelines.runtime.signals`) before it reads its first input. So a missing ``--root``, a
malformed source root, a bad cron, an out-of-range number or a missing warehouse is checked here
first, from the command line alone, with no Prefect and no torch imported and no server started:
one line on stderr and exit 2 (usage) or 3 (data). Each check reuses the check of the code that
later reads the input; what is checked per command: :func:`check`; the light parsers:
:func:`light_parser`.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from pipelines.errors import (
    LIGHTGBM_EXTRA_HINT,
    MODELS_EXTRA_HINT,
    IngestError,
    MissingExtraError,
    UsageError,
    WarehouseMissingError,
)
from pipelines.settings import (
    COUNT,
    COUNT0,
    HOURS,
    ID,
    INTERVAL,
    NU,
    POSITIVE,
    REFIT_SAMPLE,
    SECONDS,
    SEED,
    event_file,
    utc_microseconds,
)

#: exit codes (see :mod:`pipelines.runtime.runner`)
EXIT_USAGE, EXIT_DOMAIN = 2, 3
SOURCES = ["demo", "mimic", "clif", "synthetic"]
#: the sources of ``build-cohort`` and ``run-all`` (``serve`` schedules the others)
BUILD_SOURCES = ["demo", "mimic", "clif", "meds", "synthetic"]
DEFAULT_WAREHOUSE = "runs/warehouse.duckdb"
#: commands that need torch (the ``models`` extra): the deterioration models, the language model,
#: its throughput benchmark and the studies on torch recall models (``evaluation.studies``'
#: ``learned_keys`` and ``recall_tasks``)
TORCH_COMMANDS = frozenset({"deterioration", "lm", "throughput", "learned-keys", "selective-copying", "capacity",
                            "mqar-control"})
#: ``audit`` regimes that need torch (``learned``: the keys of a small trained torch model)
TORCH_REGIMES = frozenset({"learned"})
#: the deterioration study's models (:data:`evaluation.clinical.deterioration.MODELS`; equal by test)
DETERIORATION_MODELS = ("lstm", "gru", "softmax", "sv_attention", "lightgbm")
#: ``meds-dev`` models: the torch sequence models and LightGBM (:mod:`pipelines.flows.meds_dev_cli`)
MEDS_DEV_MODELS = DETERIORATION_MODELS


class _Unparsed(Exception):
    """The light parser's own argparse error (the full parser fails on the same input)."""


class _LightParser(argparse.ArgumentParser):
    def error(self, message):  # never print the usage block or exit from here
        raise _Unparsed(message)


def _opt(*flags: str, **kw) -> tuple[tuple[str, ...], dict]:
    return flags, kw


_WORKERS = _opt("--workers", type=COUNT, default=2)
_WAIT = _opt("--wait", type=SECONDS, default=None, metavar="SECONDS")
_WAREHOUSE = _opt("--warehouse", default=DEFAULT_WAREHOUSE)
_RUNS = _opt("--runs", default="runs")
_SOURCE_ROOT = (_opt("--source", choices=BUILD_SOURCES, default="demo"), _opt("--root", default=None))
_SEED = _opt("--seed", type=SEED, default=0)
_STUDY = (_WAREHOUSE, _RUNS, _WORKERS, _WAIT)
_RETENTION = (*_STUDY, _opt("--nu", type=NU, default=0.3), _opt("--sigma", type=POSITIVE, default=3.0), _SEED,
              _opt("--n-boot", type=COUNT, default=10_000),
              _opt("--stays", type=COUNT, default=None), _opt("--stays-per-task", type=COUNT, default=None),
              _opt("--audit-stays", type=COUNT0, default=50), _opt("--sensitivity-stays", type=COUNT0, default=200),
              _opt("--events", type=event_file, default=None))

#: command -> the options its checks read, declared as the command's own parser declares them (every
#: number's range is its :class:`pipelines.settings.Bound` type: a bad value is refused here, in one line)
SPECS: dict[str, tuple[tuple[tuple[str, ...], dict], ...]] = {
    "build-cohort": (*_SOURCE_ROOT, _opt("--stays", type=COUNT, default=1500), _opt("--fetch", action="store_true"),
                     _opt("--meds-codes", default=None), _WAREHOUSE, _RUNS, _WORKERS, _WAIT,
                     _SEED, _opt("--min-hours", type=HOURS, default=48),
                     _opt("--sample", type=COUNT, default=None)),
    "run-all": (*_SOURCE_ROOT, _opt("--stays", type=COUNT, default=1500), _opt("--fetch", action="store_true"),
                _opt("--warehouse", default=None), _RUNS, _WORKERS, _WAIT,
                _opt("--skip", nargs="*", default=[]), _SEED,
                _opt("--det-seeds", type=COUNT, default=3), _opt("--det-max-epochs", type=COUNT, default=12),
                _opt("--audit-trials", type=COUNT, default=50), _opt("--n-boot", type=COUNT, default=10_000),
                _opt("--study-stays", type=COUNT, default=None)),
    "ingest": (_opt("--source", choices=["mimic", "clif"], required=True), _opt("--root", required=True),
               _opt("--init", action="store_true"), _opt("--frozen", default=None),
               _opt("--jobs", type=COUNT, default=None), _opt("--max-steps", type=COUNT, default=None),
               _opt("--min-hours", type=HOURS, default=48), _SEED,
               _opt("--as-of", type=utc_microseconds, default=None),
               _opt("--warehouse", default=DEFAULT_WAREHOUSE), _RUNS, _WORKERS, _WAIT),
    "serve": (_opt("--cron", default="0 3 * * *"), _opt("--source", choices=SOURCES, default="demo"),
              _opt("--root", default=None), _opt("--ingest-root", default=None),
              _opt("--ingest-source", choices=["mimic", "clif"], default="mimic"),
              _opt("--ingest-interval", type=INTERVAL, default=3600)),
    "retention": _RETENTION,
    "heldout-spo2": _RETENTION,
    "patient-deletion": (*_STUDY, _opt("--nu", type=NU, default=0.5), _opt("--sigma", type=POSITIVE, default=2.0),
                         _SEED, _opt("--contexts", "--max-contexts", type=COUNT, default=None),
                         _opt("--stays", type=COUNT, default=None), _opt("--decay-sigmas", type=POSITIVE, nargs="*"),
                         _opt("--refit-sample", type=COUNT, default=REFIT_SAMPLE)),
    "deterioration": (*_STUDY, *(_opt(f"--{n}", type=COUNT, default=None) for n in ("seeds", "max-epochs")),
                      *(_opt(f"--{n}", type=COUNT0, default=None) for n in ("train-windows", "val-windows",
                                                                            "test-stays", "tabular-windows")),
                      _opt("--window", type=COUNT, default=48), _opt("--context", type=COUNT0, default=48),
                      _opt("--n-boot", type=COUNT, default=10_000),
                      _opt("--models", nargs="+", choices=DETERIORATION_MODELS, default=list(DETERIORATION_MODELS))),
    "meds-dev": (_opt("--model", choices=MEDS_DEV_MODELS, default=None), _opt("--model-dir", default=None),
                 _opt("--dataset-dir", required=True), _opt("--labels-dir", required=True),
                 _opt("--meds-codes", default=None)),
    "audit": (*_STUDY, _opt("--trials", type=COUNT, default=300),
              _opt("--regimes", nargs="*", default=None, metavar="REGIME"), _SEED),
    "gate-demo": (_opt("--n", type=COUNT, default=120), _opt("--d", type=COUNT, default=6),
                  _opt("--nu", type=NU, default=0.4), _opt("--sigma", type=POSITIVE, default=2.0),
                  _SEED),
    "forget": (_opt("--subject-id", type=ID, default=None), _opt("--stay-id", type=ID, default=None),
               _opt("--warehouse", default=DEFAULT_WAREHOUSE), _WAIT),
}
#: ``set_defaults`` of a command's parser that override an option's declared default
DEFAULTS = {"ingest": {"warehouse": "runs/stream.duckdb"}}


def light_parser(cmd: str) -> argparse.ArgumentParser:
    """The light parser of ``cmd`` (:data:`SPECS`); nothing is required in it (the full parser
    reports a missing required option with its usage).

    Each checked command has a *light parser* (:data:`SPECS`): only the options these checks read,
    declared exactly as the command's own parser declares them (``tests/test_cli_preflight.py`` holds
    the two equal), read with ``parse_known_args`` so every other option passes through to the full
    parser. An error of the light parser (a bad ``--workers`` value, ``--root`` without its folder,
    an ambiguous abbreviation) is an error of the full parser too, and is reported as usage (exit 2).
    """
    p = _LightParser(prog=f"forgetful {cmd}", add_help=False)
    for flags, kw in SPECS[cmd]:
        p.add_argument(*flags, **{k: v for k, v in kw.items() if k != "required"})
    p.set_defaults(**DEFAULTS.get(cmd, {}))
    return p


# ------------------------------------------------------------------------------------------ checks
def _needs_root(source: str, root: str | None, flag: str = "--root") -> None:
    if source in ("mimic", "clif", "meds") and not root:
        raise UsageError(f"--source {source} needs {flag} DIR (your MIMIC-IV, CLIF or MEDS folder)")


def check_source(source: str, root: str | None, fetch: bool = False, meds_codes: str | None = None) -> None:
    """The input of a build: the demo in its cache (unless it is to be fetched), or a MIMIC-IV /
    CLIF / MEDS root whose files the build can read (MEDS: with the code map of ``meds_codes``).
    ``synthetic`` is generated: nothing to check."""
    _needs_root(source, root)
    if meds_codes is not None and source != "meds":
        raise UsageError("--meds-codes applies only to --source meds")
    if source == "demo":
        if not fetch:
            from cohort.demo_data import ensure_demo

            ensure_demo(root)
    elif source in ("mimic", "clif"):
        from cohort.sources import check_layout

        check_layout(source, root)
    elif source == "meds":
        from cohort.meds import check_meds_root, load_code_map

        check_meds_root(root, load_code_map(meds_codes))


def check_ingest_root(source: str, root: str) -> None:
    """What every ingest run reads besides its new part files: the root's stays tables."""
    from cohort.sources import STAYS_TABLES, check_layout

    check_layout(source, root, STAYS_TABLES[source])


def check_warehouse(path: str) -> None:
    """What :func:`pipelines.store.warehouse.require` checks, without importing DuckDB (this runs on the
    way to the API server's start)."""
    if not Path(path).is_file():
        raise WarehouseMissingError.at(Path(path))


def _croniter():
    """Prefect's own cron parser (its vendored ``croniter``), loaded from its file so that Prefect
    itself is not imported; None when this Prefect has none there."""
    try:
        spec = importlib.util.find_spec("prefect")  # finds the package, does not import it
        if spec is None or not spec.origin:
            return None
        path = Path(spec.origin).parent / "_vendor" / "croniter" / "croniter.py"
        if not path.is_file():
            return None
        mod_spec = importlib.util.spec_from_file_location("_forgetful_prefect_croniter", path)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        return mod.croniter
    except Exception:  # noqa: BLE001 - no usable parser here: serve's own error handling reports it
        return None


def check_cron(cron: str) -> None:
    """A cron string Prefect's ``CronSchedule`` accepts: what its validator checks (valid for
    croniter, no random/hashed ``R``/``H`` fields)."""
    croniter = _croniter()
    if croniter is None:
        return
    if not croniter.is_valid(cron):
        raise UsageError(f"--cron {cron!r} is not a valid cron string (five fields: minute hour day month weekday, "
                         "e.g. '0 3 * * *')")
    if any(f.casefold() in ("r", "h") for f in cron.split()):
        raise UsageError(f"--cron {cron!r}: random and hashed (R, H) fields are not supported")


def extra_available(module: str) -> bool:
    """Whether ``module`` can be imported (its spec is found; the module itself is not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def torch_available() -> bool:
    """Whether torch can be imported (its spec is found; torch itself is not imported)."""
    return extra_available("torch")


def require_torch(what: str, alternative: str = "") -> None:
    """Raise :class:`MissingExtraError` (one line: what needs torch, the extra to install) when
    torch is not installed."""
    if not torch_available():
        raise MissingExtraError(f"{what} needs torch, which is not installed: {MODELS_EXTRA_HINT}{alternative}")


def _audit(a: argparse.Namespace) -> None:
    regimes = a.regimes or None  # none given: every regime, ``learned`` included
    if regimes is None or TORCH_REGIMES & set(regimes):
        require_torch("forgetful audit's 'learned' regime (keys of a trained torch model)",
                      " (or leave the regime out: --regimes gaussian clustered icu_like redundant icu_warehouse)")
    _study(a)


def _build_cohort(a: argparse.Namespace) -> None:
    check_source(a.source, a.root, a.fetch, a.meds_codes)


def _run_all(a: argparse.Namespace) -> None:
    skip = set(a.skip or ())
    if "build-cohort" in skip:
        check_warehouse(a.warehouse or str(Path(a.runs) / "warehouse.duckdb"))
        if a.source == "demo" and not a.fetch:  # run-all's step 1 checks the demo either way
            check_source("demo", a.root)
        return
    check_source(a.source, a.root, a.fetch)


def _ingest(a: argparse.Namespace) -> None:
    if a.source is None or a.root is None:
        return  # required: the full parser says so, with its usage
    if a.frozen and not a.init:
        raise UsageError("--frozen applies only with --init (it fixes a new streaming warehouse's standardisation)")
    check_ingest_root(a.source, a.root)
    check_ingest_warehouse(a.warehouse, a.source, a.root, a.init)
    if a.init and a.frozen:
        _check_json_file(a.frozen, "--frozen")


def check_ingest_warehouse(warehouse: str, source: str, root: str, init: bool) -> None:
    """``--init`` creates a streaming warehouse (it must not exist); every other run ingests into
    one (it must exist — made by ``ingest --init``, not by ``build-cohort``)."""
    wh = Path(warehouse)
    if init and wh.exists():
        raise IngestError(f"{wh} already exists; --init creates a new streaming warehouse (choose another "
                          "--warehouse, or leave out --init to ingest into this one)")
    if not init and not wh.is_file():
        raise WarehouseMissingError(f"streaming warehouse {wh} does not exist; create it first with `forgetful "
                                    f"ingest --init --source {source} --root {root} --warehouse {wh}`")


def _check_json_file(path: str, flag: str) -> None:
    import json

    from cohort.errors import BadParameterError, InputMissingError

    p = Path(path)
    if not p.is_file():
        raise InputMissingError(f"{flag} {p}: no such file")
    try:
        obj = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadParameterError(f"{flag} {p}: not readable JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise BadParameterError(f"{flag} {p}: expected a JSON object {{vital: {{mean, sd, median}}}}")


def _serve(a: argparse.Namespace) -> None:
    check_cron(a.cron)
    _needs_root(a.source, a.root)
    if a.source in ("mimic", "clif"):
        check_source(a.source, a.root)
    if a.ingest_root:
        check_ingest_root(a.ingest_source, a.ingest_root)


def _study(a: argparse.Namespace) -> None:
    check_warehouse(a.warehouse)


def require_lightgbm(what: str, alternative: str = "") -> None:
    """Raise :class:`MissingExtraError` (one line) when LightGBM is not installed."""
    if not extra_available("lightgbm"):
        raise MissingExtraError(f"{what} needs lightgbm, which is not installed: {LIGHTGBM_EXTRA_HINT}{alternative}")


def _deterioration(a: argparse.Namespace) -> None:
    if "lightgbm" in (a.models or ()):
        rest = " ".join(m for m in DETERIORATION_MODELS if m != "lightgbm")
        require_lightgbm("forgetful deterioration's lightgbm peer", f" (or leave it out: --models {rest})")
    _study(a)


def _meds_dev(a: argparse.Namespace) -> None:
    from cohort.meds import check_meds_root, load_code_map

    if a.dataset_dir is None or a.labels_dir is None:
        return  # required: the full parser says so, with its usage
    model = a.model
    if model is None and a.model_dir:  # predict: the model its folder holds
        model = _trained_model(a.model_dir)
    if model == "lightgbm":
        require_lightgbm("forgetful meds-dev's lightgbm model")
    elif model is not None:
        require_torch(f"forgetful meds-dev's {model} model")
    check_meds_root(a.dataset_dir, load_code_map(a.meds_codes), require_stay=False)
    labels = Path(a.labels_dir)
    if not labels.is_dir() or not any(labels.rglob("*.parquet")):
        from cohort.errors import InputMissingError

        raise InputMissingError(f"--labels-dir {labels}: no *.parquet label files (the ACES output of the task)")


def _trained_model(folder: str) -> str | None:
    """The model name a trained ``meds-dev`` folder holds (None when it holds none: the command says so)."""
    import json

    try:
        name = json.loads((Path(folder) / "model.json").read_text()).get("model")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return name if name in MEDS_DEV_MODELS else None


CHECKS: dict[str, Callable[[argparse.Namespace], None]] = {
    "build-cohort": _build_cohort, "run-all": _run_all, "ingest": _ingest, "serve": _serve,
    "retention": _study, "heldout-spo2": _study, "patient-deletion": _study, "deterioration": _deterioration,
    "audit": _audit, "meds-dev": _meds_dev,
}


def check(cmd: str, args: list[str]) -> None:
    """Run the checks of ``cmd`` on its arguments (what follows the command name); raises
    :class:`UsageError` or the typed error of the failing input. Commands without checks, and
    any ``-h``/``--help``, pass. A command of :data:`TORCH_COMMANDS` without torch fails first.

    What is checked:

    * ``--source mimic|clif|meds`` needs ``--root``; the root's files present, readable and with their
      required columns (:func:`cohort.sources.check_layout`: one ``DESCRIBE`` per file — a CSV's
      header line, a parquet footer; no data scan; MEDS: :func:`cohort.meds.check_meds_root`, every
      data shard's footer, column names and types, and ``build-cohort --meds-codes``' JSON);
      ``demo`` needs the cached demo unless ``--fetch`` (:func:`cohort.demo_data.ensure_demo`);
    * the study commands, and ``run-all --skip build-cohort``: the warehouse exists
      (what :func:`pipelines.store.warehouse.require` checks);
    * ``ingest``: the root's stays tables; without ``--init`` the streaming warehouse exists (else the
      message names ``ingest --init``), with ``--init`` it does not, ``--frozen`` only with ``--init``;
    * ``serve``: the cron string, with the validator Prefect itself uses (its vendored ``croniter``,
      loaded from its file, without importing Prefect); ``--source mimic|clif`` needs ``--root``;
      ``--ingest-root``'s stays tables;
    * every number an option takes, by its type (:class:`pipelines.settings.Bound`): finite, in range,
      integers within int64 (``--min-hours nan``, ``--sigma -1``, ``--wait -5``, ``--subject-id 2**63``,
      ``--workers 0`` are refused in one line, exit 2); ``--events FILE`` read and checked
      (:mod:`cohort.events`); a Parquet source's typed columns (``charttime`` a timestamp …);
    * the optional torch dependency (the ``models`` extra) of the commands that train or run torch
      models (:data:`TORCH_COMMANDS`, and ``audit`` with its ``learned`` regime): without it, one line
      naming the extra to install and exit 3 (:class:`pipelines.errors.MissingExtraError`). ``run-all``
      is not refused: it skips its torch steps, one line each (:mod:`pipelines.flows.run_all`). Likewise
      LightGBM (the ``lightgbm`` extra) for ``deterioration``'s lightgbm peer and ``meds-dev``'s
      lightgbm model, and torch for ``meds-dev``'s sequence models (:data:`MEDS_DEV_MODELS`);
    * ``meds-dev``: the MEDS dataset's shards (as ``build-cohort --source meds`` checks them), the
      labels folder's Parquet files, ``predict``'s trained model folder.
    """
    if "-h" in args or "--help" in args:
        return
    if cmd in TORCH_COMMANDS:
        require_torch(f"forgetful {cmd}")
    if cmd not in SPECS:
        return
    try:
        ns, _ = light_parser(cmd).parse_known_args(args)  # every declared option's type and range
    except _Unparsed as exc:
        raise UsageError(str(exc)) from None
    if cmd in CHECKS:
        CHECKS[cmd](ns)


def one_line(text: str) -> str:
    """A message as one line (a multi-line message's lines joined)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def run(cmd: str, args: list[str]) -> int | None:
    """:func:`check`, reported: None when the command may start, else the exit code after one
    line on stderr — ``forgetful CMD: error: …`` (usage, 2) or ``error: Type: …`` (data, 3)."""
    from cohort.errors import CohortError
    from pipelines.errors import PipelineError

    try:
        check(cmd, args)
    except UsageError as exc:
        print(f"forgetful {cmd}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except (PipelineError, CohortError) as exc:
        print(f"error: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return EXIT_DOMAIN
    return None
