"""The command that writes each study's result file (shown on the report's "not run" cards).

One table: :mod:`dashboards.report` names these on every card without a result, and
:mod:`dashboards.reproduce` states them beside each study in ``docs/FIGURES.md``.
``tests/test_dashboards_report.py`` checks that every command is a registered ``forgetful``
subcommand and that every canonical study has one.
"""
from __future__ import annotations

__all__ = ["RESULT_COMMANDS", "result_command"]

#: study -> the command whose run writes ``<runs>/<study>/result.json`` (add ``--runs DIR`` for another folder)
RESULT_COMMANDS: dict[str, str] = {
    "cohort": "forgetful build-cohort",
    "icu_retention": "forgetful retention",
    "heldout_spo2": "forgetful heldout-spo2",
    "patient_deletion": "forgetful patient-deletion",
    "deterioration": "forgetful deterioration",
    "ledger": "forgetful forget --subject-id ID (or forgetful run-all)",
    "deletion_audit": "forgetful audit",
    "deletion_latency": "forgetful bench-delete",
    "planted_secret": "forgetful planted-secret",
    "skewed_redundancy": "forgetful skewed-redundancy",
    "streaming_eviction": "forgetful streaming-eviction",
    "selective_copying": "forgetful selective-copying",
    "capacity": "forgetful capacity",
    "mqar_control": "forgetful mqar-control",
    "learned_keys": "forgetful learned-keys",
    "retrieval_memory": "forgetful retrieval-memory",
    "synthetic_fidelity": "forgetful run-all (its fidelity step)",
    "language_model": "forgetful lm",
    "throughput": "forgetful throughput",
    "ingest": "forgetful ingest",
}


def result_command(study: str) -> str | None:
    """The command that fills ``study``'s card, or None for a study this table does not know."""
    return RESULT_COMMANDS.get(study)
