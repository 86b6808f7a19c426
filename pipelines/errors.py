"""Typed errors of the pipelines package. Every message says what was expected and how to fix it;
none of them carries a record-level identifier beyond what the caller passed in."""
from __future__ import annotations


class PipelineError(Exception):
    """Base class of every pipelines error."""


class WarehouseMissingError(PipelineError, FileNotFoundError):
    """The warehouse file does not exist (build it with ``forgetful build-cohort``)."""


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


# ---- file-system safety and storage failures (issue 19, items 4-7; pipelines/safe_io.py) ----
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


class KeyBesideDataError(LedgerKeyError):
    """The secret key file (or the config folder holding it and the anchors) lies in the
    warehouse folder, a runs folder or the ledger folder, where a copy or backup of the data
    would carry it. Set FORGETFUL_ALLOW_KEY_BESIDE_DATA=1 to accept it anyway."""
