"""The ``forgetful`` command line.

Every flow module in :mod:`pipelines.flows` exposes ``add_cli(subparsers)``. :data:`COMMANDS`
maps each command to its module and one-line help, so ``forgetful --help`` and a command like
``forget`` import only what they need (no torch, no Prefect): a command's module is imported
when that command runs. ``tests/test_cli_table.py`` keeps the table equal to what the modules
register.

Global options (before the command): ``--version``, ``-v/--verbose`` (Prefect's INFO logs),
``-q/--quiet`` (no progress bars or Prefect warnings). Exit codes: 0 ok, 1 a verification
failed (``receipts verify``), 2 usage error, 3 a domain error (one typed line on stderr), 4 a
storage failure — disk full, read-only file system, permission denied (one line; nothing lost,
a pending erasure is completed by the next command).
A command's inputs (source root, warehouse, cron, option combinations) are checked by
:mod:`pipelines.preflight` before any heavy import or the Prefect API server starts.

Every file and folder a command creates is owner-only (the command runs under umask 077): the
warehouse and its WAL, exports, ledger anchors, keys, results and reports.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import re
import sys

# Local, offline use: no telemetry calls (the machine may have no network at all).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Progress bars and the printed summaries carry the run; Prefect's per-task INFO lines would bury
# them. Set PREFECT_LOGGING_LEVEL=INFO to see every flow and task run.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# A loaded 2-core machine can need more than Prefect's default 20 s to start the ephemeral API.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

DESCRIPTION = ("Auditable support-vector memory: certified retention, verified deletion, "
               "clinical and synthetic studies as Prefect flows.")

#: command -> (module under pipelines.flows, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build-cohort": ("clinical_cohort", "build the hourly vital-sign warehouse (default: the real MIMIC-IV demo)"),
    "retention": ("retention_cli", "certified event-hour retention per ICU stay (SV vs peers)"),
    "heldout-spo2": ("retention_cli", "held-out SpO2 control (SpO2 < 90 label, 5-d keys without SpO2)"),
    "patient-deletion": ("clinical_deletion", "forget one of five patients sharing a context (leakage, KKT, decay)"),
    "deterioration": ("clinical_deterioration", "predict a composite event within 6 h: SV attention vs LSTM, GRU, "
                                                "softmax and LightGBM"),
    "audit": ("audit_flow", "fixed-C deletion audit incl. the real ICU-key regime"),
    "bench-delete": ("bench_delete_flow", "deletion latency: decrement vs same-C refit (study result)"),
    "run-all": ("run_all", "the main job: demo check, warehouse, every clinical study, report"),
    "forget": ("forget_cli", "forget one patient everywhere, durably, with one tamper-evident receipt"),
    "receipts": ("receipts_cli", "verify, list, export or prove the deletion-receipt log"),
    "witness": ("witness_cli", "run a transparency-log witness that cosigns a receipt log's checkpoints"),
    "export": ("export_cli", "export the warehouse as Parquet or MEDS for your own analysis"),
    "meds-dev": ("meds_dev_cli", "MEDS-DEV entries: train on a MEDS dataset's ACES labels, predict a split"),
    "report": ("report_cli", "re-render the HTML report from the stored results (no Prefect server)"),
    "serve": ("serve_cli", "serve the flows as Prefect deployments (run-all on a cron schedule)"),
    "ingest": ("ingest_flow", "incremental ingest of new chartevents/vitals files into a streaming warehouse"),
    "gate-demo": ("gate_demo", "admit a stream, certify, evict, forget with verification"),
    "lm": ("language_model", "language model: SV hybrid vs matched sliding window"),
    "throughput": ("throughput_flow", "training-step throughput: SV hybrid vs softmax (study result)"),
    "learned-keys": ("study_learned_keys", "study: forget/edit facts on the frozen keys of a trained recall model"),
    "retrieval-memory": ("study_retrieval_memory", "study: forgettable retrieval memory over MiniLM embeddings"),
    "planted-secret": ("study_synthetic", "study: planted secret, retrieved before and after forgetting"),
    "skewed-redundancy": ("study_synthetic", "study: rare-token recall under skewed redundancy"),
    "streaming-eviction": ("study_synthetic", "study: streaming eviction, SV vs streaming H2O"),
    "selective-copying": ("study_synthetic", "study: selective copying with the SV readout"),
    "capacity": ("study_synthetic", "study: recall capacity vs stored items"),
    "mqar-control": ("study_synthetic", "study: distinct-key MQAR control (gated vs ungated)"),
}


EPILOG = ("exit codes: 0 ok, 1 verification failed, 2 usage error, 3 domain error (one typed line), "
          "4 storage error: disk full, read-only or permission denied (one line; nothing lost)")


def _version() -> str:
    from sv_core._version import __version__

    return __version__


class _VersionAction(argparse.Action):
    """``--version``, read only when asked for: the version lives in ``sv_core``, whose import
    (NumPy, the gate) would otherwise be paid by ``--help`` and every command that never uses it."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"forgetful {_version()}")
        parser.exit()


def _global_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("-v", "--verbose", action="store_true", help="show Prefect's INFO logs of every flow and task")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars, no Prefect warnings")


def _light_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command listed, without importing any command module."""
    parser = argparse.ArgumentParser(prog="forgetful", description=DESCRIPTION, epilog=EPILOG)
    _global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return parser


class OneLineParser(argparse.ArgumentParser):
    """A usage error in one line, ``forgetful CMD: error: …``, exit 2 (``--help`` shows the usage);
    its subparsers are of this class too."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The full parser (imports the modules of ``commands``, default: all)."""
    parser = OneLineParser(prog="forgetful", description=DESCRIPTION, epilog=EPILOG)
    _global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    modules = []
    for name in commands or COMMANDS:
        mod = COMMANDS[name][0]
        if mod not in modules:
            modules.append(mod)
    for mod in modules:
        try:
            module = importlib.import_module(f"pipelines.flows.{mod}")
        except ImportError as exc:  # an optional extra is missing: say so, keep the rest usable
            if exc.name == "torch":
                from pipelines.errors import MODELS_EXTRA_HINT

                print(f"forgetful: command module {mod!r} needs torch, which is not installed: {MODELS_EXTRA_HINT}",
                      file=sys.stderr)
            else:
                print(f"forgetful: command module {mod!r} unavailable ({exc})", file=sys.stderr)
            continue
        module.add_cli(sub)
    _plain_help(parser)
    return parser


_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc|ref|doc|term):`~?([^`<]+?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str | None) -> str | None:
    """Help text from a docstring without raw reStructuredText: ``:func:`x``` -> ``x``,
    double-backtick literals -> the bare literal, ``*x*`` emphasis kept as is."""
    if not text:
        return text
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


def _plain_help(parser: argparse.ArgumentParser) -> None:
    """Strip RST markup from a parser's description, epilog and every option's help, recursively."""
    parser.description = plain_text(parser.description)
    parser.epilog = plain_text(parser.epilog)
    for action in parser._actions:
        if isinstance(action.help, str):
            action.help = plain_text(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain_text(choice.help)
            for sp in action.choices.values():
                _plain_help(sp)


def main(argv: list[str] | None = None) -> int:
    global _in_process
    process = argv is None  # the `forgetful` process itself, not a call from Python
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = next((a for a in argv if not a.startswith("-")), None)
    if cmd not in COMMANDS:
        _light_parser().parse_args(argv)  # prints help / the version / the usage error and exits
        return 2
    pre = argv[:argv.index(cmd)]
    # the command's inputs, checked before Prefect, torch or the API server start (pipelines.preflight)
    from pipelines.preflight import run as preflight

    rc = preflight(cmd, argv[argv.index(cmd) + 1:])
    if rc is not None:
        return rc
    if "-v" in pre or "--verbose" in pre:
        os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"
    elif "-q" in pre or "--quiet" in pre:
        os.environ["PREFECT_LOGGING_LEVEL"] = "ERROR"
        if process:  # libraries' own bars too (e.g. transformers' "Loading weights"), read at their import
            os.environ.setdefault("TQDM_DISABLE", "1")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    old_umask = os.umask(0o077)  # owner-only files and folders (warehouse, WAL, exports, anchors, keys)
    os.umask(old_umask | 0o077)
    try:
        if process:  # own Prefect API server (started before the heavy imports), SIGINT/SIGTERM handling
            from pipelines.runtime.signals import run_command

            _in_process = True
            return run_command(cmd, argv, lambda: _dispatch(cmd, argv))
        return _dispatch(cmd, argv)
    finally:
        os.umask(old_umask)


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector for a burst of imports, then freeze what they left alive
    (it is never scanned again) and resume collecting. Importing Prefect and a flow module builds
    thousands of pydantic models; the collections that triggers are wasted work. A collector that
    was off stays off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()


#: set by :func:`main` in the ``forgetful`` process itself (never by a call of ``main([...])``)
_in_process = False


def _dispatch(cmd: str, argv: list[str]) -> int:
    with gc_paused() if _in_process else contextlib.nullcontext():  # the command's imports
        parser = build_parser([cmd])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if cmd not in sub.choices:  # its module could not be imported (build_parser said why, in one line)
        return 3
    args = parser.parse_args(argv)
    if args.quiet and hasattr(args, "no_progress"):
        args.no_progress = True
    from pipelines.runtime.runner import configure_run_logging

    # run logs go to the Prefect API; the console shows printed progress, not Prefect's records
    configure_run_logging(verbose=os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING") == "INFO")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    from pipelines.runtime.runner import report_error
    from pipelines.runtime.signals import wait_for_api

    wait_for_api()  # this command's own API server (pipelines.runtime.signals), if it started one
    try:
        result = func(args)
    except Exception as exc:  # a typed error: one line and its exit code (runner.report_error)
        rc = report_error(exc)
        if rc is None:
            raise
        return rc
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
