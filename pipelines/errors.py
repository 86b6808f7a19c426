"""Typed errors of the pipelines package. Every message says what was expected and how to fix it;
none of them carries a record-level identifier beyond what the caller passed in."""
from __future__ import annotations


class PipelineError(Exception):
    """Base class of every pipelines error."""


class WarehouseMissingError(PipelineError, FileNotFoundError):
    """The warehouse file does not exist (build it with ``forgetful build-cohort``)."""

    @classmethod
    def at(cls, path) -> WarehouseMissingError:
        """The error for the batch warehouse ``path`` (its message names the command that builds it)."""
        return cls(f"warehouse {path} does not exist; build it first with `forgetful build-cohort --warehouse {path}`")


class UnknownSubjectError(PipelineError, KeyError):
    """``forget`` was asked for a subject/stay that no warehouse table or gate state holds."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else "unknown subject"


class AlreadyForgottenError(PipelineError):
    """``forget`` was asked for a subject whose deletion is already in the receipt ledger."""


class LedgerError(PipelineError):
    """The deletion-receipt ledger is malformed (bad row, missing table)."""


class LedgerTamperedError(LedgerError):
    """The hash chain does not verify. ``seq`` is the first row that fails and ``reason`` why."""

    def __init__(self, seq: int, reason: str):
        self.seq = int(seq)
        self.reason = reason
        super().__init__(f"deletion-receipt chain broken at seq {seq}: {reason}")


class GateStoreError(PipelineError):
    """A stored gate state is missing or inconsistent with its token table."""


class StudyInputError(PipelineError, ValueError):
    """A study cannot run on this warehouse (too few stays, no events, bad parameter)."""


class LedgerKeyError(LedgerError):
    """The ledger key is missing, too short, readable by others, or differs from the ledger's."""


class WarehouseBusyError(PipelineError):
    """Another forgetful command holds the warehouse's writer lock past the wait limit."""


class ErasureError(PipelineError):
    """A warehouse table cannot be erased safely (it holds no subject/stay column and is not a
    known aggregate table), so the forget was not applied."""


class UsageError(PipelineError):
    """A command line that cannot run as given (a missing ``--root``, a bad cron, an option combination
    that makes no sense). Found before the command starts; exit code 2, like argparse's own errors."""


class IngestError(PipelineError):
    """A streaming-ingest failure (nothing of the failed step was committed)."""
