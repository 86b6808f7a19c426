"""Right to be forgotten, end to end, durable.

:func:`forget_subject` (``forgetful forget``), inside :meth:`Warehouse.open` (writer lock held,
pending erasures completed first):

1. resolves the patient (``subject_id``, or the owner of ``stay_id``); unknown →
   :class:`UnknownSubjectError` (``allow_absent`` registers a subject the warehouse does not hold,
   so no future build admits them); already registered → :class:`AlreadyForgottenError`;
2. plans every stored context holding the patient's tokens (pure computation): the maintained
   C&P decremental path (:meth:`sv_core.Gate.forget_many`) verified against an independent
   same-C refit, or — when the context held only this patient, or the rest is infeasible at the
   fixed C — the context is removed whole (a certified outcome: nothing of it remains);
3. **commits the receipt to the ledger first** (fsynced, :mod:`pipelines.receipts.ledger`): from this
   moment the subject is in the forget registry — every build excludes them at scan time and
   every command completes the erasure before reading anything;
4. erases physically (:func:`pipelines.store.erasure.rewrite`): the warehouse is rewritten into a fresh
   file without the patient, atomically swapped in; the task cache is removed; result files of
   the warehouse's runs directories are marked stale with the receipt number;
5. rewrites the ledger card of every registered runs folder from this warehouse's ledger and
   re-renders its report (:func:`write_ledger_result`; folders are found by identity,
   :mod:`pipelines.store.runs_registry`, so a copy of a runs folder and its original stay apart).

A crash after step 3 leaves a *pending* erasure that :func:`complete_pending` finishes on the
next command (idempotent: the rewrite only ever removes registered subjects). The receipt holds
counts, opaque context ids, tolerances and keyed hashes — never a raw id.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from pipelines.errors import AlreadyForgottenError, UnknownSubjectError
from pipelines.receipts.ledger import FORGET_KIND
from pipelines.store import gate_store, killpoint, safe_io
from pipelines.store.forget_apply import (  # noqa: F401  (complete_pending, ledger_result, STALE_FILE: re-exported)
    STALE_FILE,
    UNUSABLE,
    apply_erasure,
    complete_pending,
    content_fingerprints,
    erase_exports,
    ledger_result,
    plan_contexts,
    say_exports,
    say_unusable,
    write_ledger_result,
)
from pipelines.store.warehouse import Warehouse, table_names

KIND = FORGET_KIND


@dataclass
class ForgetResult:
    """What :func:`forget_subject` did (aggregates only; safe to print)."""

    receipt_seq: int
    receipt_mac: str
    rows_deleted: dict
    contexts: list
    certified: bool
    seconds: float
    recovered: bool = False

    def to_dict(self) -> dict:
        return {"receipt_seq": self.receipt_seq, "receipt_mac": self.receipt_mac, "rows_deleted": self.rows_deleted,
                "contexts": self.contexts, "certified": self.certified, "recovered": self.recovered,
                "seconds": round(self.seconds, 4)}

    def summary_line(self) -> str:
        c = self.contexts
        dec = sum(x["action"] == "decrement" for x in c)
        rem = sum(x["action"] == "removed" for x in c)
        unusable = sum(x.get("reason") == UNUSABLE for x in c)
        why = f" ({unusable} of them because the stored state was unusable)" if unusable else ""
        line = (f"forgotten: receipt #{self.receipt_seq}; {self.rows_deleted.get('cohort_stays', 0)} stays, "
                f"{sum(self.rows_deleted.values())} rows erased; {dec} contexts decremented, {rem} removed{why}; "
                f"certified: {str(self.certified).lower()}")
        bad = [x.get("reason", "") for x in c if not x.get("certified")]
        if bad:
            line += f" ({len(bad)} uncertified: {bad[0]})"
        return line + f"; {self.seconds:.2f} s"


def _resolve(con, subject_id: int | None, stay_id: int | None) -> int | None:
    if (subject_id is None) == (stay_id is None):
        raise UnknownSubjectError("give exactly one of subject_id or stay_id")
    for name, v in (("subject_id", subject_id), ("stay_id", stay_id)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise UnknownSubjectError(f"{name} must be an integer, got {type(v).__name__}")
    if subject_id is not None:
        return int(subject_id)
    tables = table_names(con)
    for t in ("cohort_stays", gate_store.TOKENS):
        if t in tables:
            row = con.execute(f"SELECT subject_id FROM {t} WHERE stay_id = ? LIMIT 1", [int(stay_id)]).fetchone()
            if row is not None:
                return int(row[0])
    return None


def forget_subject(warehouse: str | os.PathLike, subject_id: int | None = None, stay_id: int | None = None,
                   *, verify: bool = True, ledger_dir: str | os.PathLike | None = None, wait: float | None = None,
                   allow_absent: bool = False) -> ForgetResult:
    """Forget one patient everywhere; see the module docstring. Returns the receipt summary.

    Parameters
    ----------
    warehouse : path of the DuckDB warehouse.
    subject_id, stay_id : exactly one; a stay id forgets the patient who owns it (all their stays).
    verify : compare every decremented gate with an independent same-C refit.
    ledger_dir : the ledger/registry directory (default ``$FORGETFUL_LEDGER_DIR`` or
    ``<warehouse dir>/forget-registry``).
    wait : seconds to wait for another command's writer lock.
    allow_absent : register a subject the warehouse does not hold (so future builds exclude them).
    """
    t0 = time.perf_counter()
    with Warehouse.open(warehouse, write=True, ledger_dir=ledger_dir, wait=wait, on_witness_conflict="warn") as w:
        con = w.connect(read_only=True)
        try:
            sid = _resolve(con, subject_id, stay_id)
            if sid is None:
                raise UnknownSubjectError("no warehouse table or stored gate holds the given stay id; nothing changed")
            h = w.keys.subject_hash(sid)
            reg = w.registry()
            if h in reg and reg[h] is None:
                raise AlreadyForgottenError("that patient was already forgotten in another forget registry this "
                                            "configuration keeps for the same source; nothing changed")
            if h in reg:
                seq = reg[h]
                if h in w.completed:  # the earlier forget died after its commit: finished now
                    r = next(r for r in w.ledger.rows() if r.seq == seq)
                    return ForgetResult(seq, r.mac, r.payload.get("rows_deleted", {}), r.payload.get("contexts", []),
                                        bool(r.payload.get("certified")), time.perf_counter() - t0, recovered=True)
                raise AlreadyForgottenError(f"that patient was already forgotten (receipt #{seq}); nothing changed")
            tables = table_names(con)
            stays = set()
            for t in ("cohort_stays", gate_store.TOKENS):
                if t in tables:
                    stays |= {int(r[0]) for r in con.execute(f"SELECT DISTINCT stay_id FROM {t} WHERE subject_id = ?",
                                                             [sid]).fetchall()}
            counts = {}
            for (t,) in con.execute("SELECT table_name FROM duckdb_columns() WHERE column_name = 'subject_id' "
                                    "AND database_name = current_database()").fetchall():
                counts[t] = int(con.execute(f"SELECT count(*) FROM {t} WHERE subject_id = ?", [sid]).fetchone()[0])
            if "vitals_hourly" in tables and stays:
                counts["vitals_hourly"] = int(con.execute(
                    "SELECT count(*) FROM vitals_hourly WHERE stay_id IN (SELECT unnest(?::BIGINT[]))",
                    [sorted(stays)]).fetchone()[0])
            if not stays and not any(counts.values()) and not allow_absent:
                raise UnknownSubjectError("no warehouse table or stored gate holds the given subject id; "
                                          "nothing changed "
                                          "(--allow-absent registers it anyway, so no future build admits it)")
            updates, infos = plan_contexts(con, sid, w.keys, verify=verify)
            fingerprints = content_fingerprints(con, stays, w.keys)
        finally:
            con.close()
        certified = all(i.get("certified", False) for i in infos)
        payload = {
            "rows_deleted": counts,
            "n_stays": len(stays),
            "stay_id_hashes": sorted(w.keys.stay_hash(s) for s in stays),
            "content_fingerprints": fingerprints,
            "contexts": infos,
            "certified": certified,
            "verified_against_refit": bool(verify),
            "erasure": "warehouse and registered exports rewritten into fresh files and swapped; task cache removed",
            "reference": "fresh retained-key refit at the same fixed C",
            "path": "maintained fp64 C&P decremental path",
        }
        say_unusable(infos)
        from pipelines.store import exports, runs_registry

        exports.check_links(w.export_entries())  # a link is refused before anything is committed
        runs_registry.check_links(w.runs_dirs())
        with safe_io.storage_errors("forget: writing the receipt", lambda: _append_state(w, h)):
            row = w.ledger.append(KIND, h, payload)  # the durable commitment (registry entry)
            killpoint.hit("forget.committed")
            w.bind_registry()  # every warehouse of this source obeys this log from now on
        with safe_io.storage_errors("forget: erasing", (
                f"receipt #{row.seq} is committed, so the patient is forgotten and every build excludes them; the "
                "erasure is pending and the next forgetful command on this warehouse completes it (rerun this "
                "one once the disk allows); nothing was lost")):
            if stays or any(counts.values()):
                apply_erasure(w, {sid: h}, updates, row.seq)
            else:
                ex = erase_exports(w)
                safe_io.remove_own_dir(w.cache_dir, "task cache folder")
                w.record_ledger()
                say_exports(ex)
            killpoint.hit("forget.erased")
        with safe_io.storage_errors("forget: updating the report's ledger card",
                                    f"receipt #{row.seq} is committed and the erasure is complete"):
            write_ledger_result(w)
    return ForgetResult(receipt_seq=row.seq, receipt_mac=row.mac, rows_deleted=counts, contexts=infos,
                        certified=certified, seconds=time.perf_counter() - t0)


def _append_state(w: Warehouse, h: str) -> str:
    """What a failed receipt append left (read back from the ledger)."""
    try:
        seq = w.ledger.registry().get(h)
    except Exception as exc:  # noqa: BLE001 - only for the message
        return f"the ledger could not be read back ({type(exc).__name__}): run `forgetful receipts verify`"
    if seq is None:
        return "no receipt was written and nothing was erased; rerun once the disk allows"
    return (f"receipt #{seq} was committed, so the patient is forgotten; the erasure is pending and the next "
            "forgetful command on this warehouse completes it; nothing was lost")
