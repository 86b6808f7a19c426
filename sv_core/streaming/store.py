"""Where the cold tier of :class:`sv_core.StreamingGate` keeps its keys.

* :class:`ColdStore` -- the pluggable interface (``add`` / ``remove`` / ``get`` / ``ids``); a
  warehouse-backed store (e.g. DuckDB) implements the same four methods.
* :class:`ArrayColdStore` -- the default in-memory store. Appends, removals and look-ups cost
  O(1) amortised per key (a capacity-doubling key buffer, an id -> row map, removed rows reused
  after a compaction that runs only when at least half the buffer is dead), so a long stream
  does not pay O(stored keys) per admission.
"""
from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np

from sv_core.errors import InvalidKeysError, UnknownTokenError


class ColdStore(abc.ABC):
    """Where cold (certified-inert) keys live. Ids are stream token ids (int64)."""

    @abc.abstractmethod
    def add(self, ids: np.ndarray, keys: np.ndarray) -> None:
        """Store keys ``(m, d)`` under new ids ``(m,)``."""

    @abc.abstractmethod
    def remove(self, ids: np.ndarray) -> np.ndarray:
        """Delete ids; returns their keys ``(m, d)`` aligned with ``ids``."""

    @abc.abstractmethod
    def get(self, ids: np.ndarray) -> np.ndarray:
        """Keys ``(m, d)`` aligned with ``ids`` (UnknownTokenError if one is absent)."""

    @abc.abstractmethod
    def ids(self) -> np.ndarray:
        """All stored ids, ascending."""

    def __len__(self) -> int:
        return int(self.ids().size)

    def __contains__(self, tid) -> bool:
        return bool(np.isin(int(tid), self.ids()))

    def iter_batches(self, size: int = 4096) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        ids = self.ids()
        for lo in range(0, ids.size, size):
            yield ids[lo:lo + size], self.get(ids[lo:lo + size])


class ArrayColdStore(ColdStore):
    """Default in-memory store: a key buffer with an id -> row map (amortised O(1) per key).

    Parameters
    ----------
    dim : optional key dimension (otherwise taken from the first ``add``).
    """

    def __init__(self, dim: int | None = None):
        self._dim = None if dim is None else int(dim)
        self._keys = np.zeros((0, self._dim or 0))
        self._row: dict[int, int] = {}
        self._used = 0  # rows in use or dead at the end of the buffer

    def _rows(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).ravel()
        row = self._row
        try:
            return np.fromiter((row[i] for i in ids.tolist()), dtype=np.int64, count=ids.size)
        except KeyError as exc:
            missing = [i for i in ids.tolist() if i not in row][:5]
            raise UnknownTokenError(f"token(s) {missing} not in the cold store") from exc

    def _compact(self) -> None:
        order = sorted(self._row.items())
        rows = np.fromiter((r for _, r in order), dtype=np.int64, count=len(order))
        keys = self._keys[rows]
        cap = max(16, 2 * rows.size)
        self._keys = np.zeros((cap, keys.shape[1]))
        self._keys[:rows.size] = keys
        self._row = {i: k for k, (i, _) in enumerate(order)}
        self._used = rows.size

    def add(self, ids, keys) -> None:
        ids = np.asarray(ids, dtype=np.int64).ravel()
        if ids.size == 0:
            return
        keys = np.asarray(keys, dtype=np.float64).reshape(ids.size, -1)
        if self._dim is None or (not self._row and self._keys.shape[1] != keys.shape[1]):
            self._dim = int(keys.shape[1])
            self._keys = np.zeros((0, self._dim))
            self._used = 0
        if keys.shape[1] != self._dim:
            raise InvalidKeysError(f"cold keys have dimension {keys.shape[1]}, the store holds {self._dim}")
        lst = ids.tolist()
        if len(set(lst)) != len(lst) or any(i in self._row for i in lst):
            raise InvalidKeysError("a cold store id is added twice")
        if self._used + ids.size > self._keys.shape[0]:
            if 2 * len(self._row) < self._used:
                self._compact()
            if self._used + ids.size > self._keys.shape[0]:
                cap = max(16, 2 * (self._used + ids.size))
                buf = np.zeros((cap, self._dim))
                buf[:self._used] = self._keys[:self._used]
                self._keys = buf
        lo = self._used
        self._keys[lo:lo + ids.size] = keys
        self._row.update(zip(lst, range(lo, lo + ids.size)))
        self._used += ids.size

    def remove(self, ids) -> np.ndarray:
        lst = np.asarray(ids, dtype=np.int64).ravel().tolist()
        if len(set(lst)) != len(lst):
            raise UnknownTokenError("an id is removed twice from the cold store")
        rows = self._rows(lst)
        out = self._keys[rows]
        for i in lst:
            del self._row[i]
        if not self._row:
            self._used = 0
        return out

    def get(self, ids) -> np.ndarray:
        return self._keys[self._rows(ids)]

    def ids(self) -> np.ndarray:
        return np.asarray(sorted(self._row), dtype=np.int64)

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, tid) -> bool:
        return int(tid) in self._row
