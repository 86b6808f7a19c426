"""The type of an open warehouse as the erasure steps see it.

:class:`WarehouseHandle` is what :mod:`pipelines.store.forget_apply` reads of an open
:class:`pipelines.store.warehouse.Warehouse` (which satisfies it). It is a :class:`typing.Protocol`
because the warehouse calls the erasure module on every writable open (pending erasures are
completed before the caller sees a row), so that module cannot import the handle's class.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pipelines.receipts.ledger import Ledger
from pipelines.store.keys import Keys


@runtime_checkable
class WarehouseHandle(Protocol):
    """An open warehouse: its file, key, receipt ledger and the folders registered with it."""

    path: Path
    keys: Keys
    ledger: Ledger

    @property
    def cache_dir(self) -> Path: ...

    def connect(self, read_only: bool = False) -> Any: ...

    def present_registered(self, con=None) -> dict[int, str]: ...

    def ledger_meta(self) -> dict[str, str]: ...

    def record_ledger(self) -> None: ...

    def runs_dirs(self) -> list[Path]: ...

    def registry(self) -> dict[str, int | None]: ...

    def exclusion(self) -> Any: ...

    def export_entries(self) -> list: ...

    def remember_export_version(self, folder: Path, rel: str, sha: str) -> None: ...
