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


class LedgerKeyMismatchError(LedgerKeyError):
    """The ledger was written under another key than the configured one (a verification
    failure: ``receipts verify`` exits 1)."""


class KeyLocationError(LedgerKeyError):
    """A key file lies beside the warehouse or inside a data folder (ledger, runs, exports)."""


class LedgerRollbackError(LedgerTamperedError):
    """The log is shorter than, or inconsistent with, a size and root recorded earlier (by the
    warehouse, the signed anchor or an auditor's kept head): a restored backup or a rewrite."""

    def __str__(self) -> str:
        return f"the deletion-receipt log was rolled back or replaced: {self.reason}"


class EmptyLedgerError(LedgerError):
    """The ledger folder an auditor named does not exist or holds no receipt: never "verified:
    0 receipts" unless ``--allow-empty`` says an empty log is expected (exit 3)."""


class WitnessError(PipelineError):
    """A witness is misconfigured or cannot be used as asked (a bad verifier key, a URL that is
    not HTTP(S), a witness folder without its key, an auditor's witness that cannot be reached)."""


class WitnessConflictError(LedgerRollbackError):
    """A witness has cosigned a larger tree of this log, or another tree of the same size: the
    log was restored from a backup or forked. Builds and exports are refused until the newer log
    is put back (a verification failure for ``receipts verify``)."""


class WarehouseBusyError(PipelineError):
    """Another forgetful command holds the warehouse's writer lock past the wait limit."""


class ErasureError(PipelineError):
    """A warehouse table cannot be erased safely (it holds no subject/stay column and is not a
    known aggregate table), so the forget was not applied."""


class UsageError(PipelineError):
    """A command line that cannot run as given (a missing ``--root``, a bad cron, an option combination
    that makes no sense). Found before the command starts; exit code 2, like argparse's own errors."""


class SettingsError(UsageError, ValueError):
    """A study setting or option value out of its range: not finite, negative, beyond int64
    (:mod:`pipelines.settings`). A usage error: exit code 2, one line."""


#: how to install the optional torch dependency (the ``models`` extra)
MODELS_EXTRA_HINT = "pip install 'forgetful-attention[models]'"
#: how to install LightGBM (the ``lightgbm`` extra: the deterioration study's and MEDS-DEV's tree peer)
LIGHTGBM_EXTRA_HINT = "pip install 'forgetful-attention[lightgbm]'"


class MissingExtraError(PipelineError):
    """A command needs an optional extra that is not installed (torch: ``[models]``, LightGBM:
    ``[lightgbm]``); exit code 3.
    Checked before the command starts (:mod:`pipelines.preflight`)."""


class IngestError(PipelineError):
    """A streaming-ingest failure (nothing of the failed step was committed)."""


# ---- file-system safety and storage failures (issue 19, items 4-7; pipelines/store/safe_io.py) ----
class UnsafePathError(PipelineError):
    """A path where forgetful erases or rewrites (warehouse, its WAL, an export file or folder)
    is a symbolic link: refused, never followed, nothing changed."""


class StorageError(PipelineError, OSError):
    """The disk is full, read-only or refuses permission (ENOSPC, EDQUOT, EROFS, EACCES, EPERM,
    EIO) while forgetful writes. Exit code 4. The message says what was being done and what state
    was left (nothing lost; a committed receipt's erasure is completed by the next command)."""

    def __init__(self, message: str, errno_: int | None = None):
        # OSError(errno, strerror) would reformat the message; keep it one plain line
        Exception.__init__(self, message)
        self.errno = errno_

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "storage error"




# ---- the forget registry as an operator meets it (issue 31; pipelines/store/registries.py) ----
class RegistryUnreadableError(PipelineError):
    """A forget registry this configuration keeps for the source (or the index naming them)
    cannot be read: the command refuses rather than building, exporting or ingesting without it."""
