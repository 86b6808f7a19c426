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
3. **commits the receipt to the ledger first** (fsynced, :mod:`pipelines.ledger`): from this
   moment the subject is in the forget registry — every build excludes them at scan time and
   every command completes the erasure before reading anything;
4. erases physically (:func:`pipelines.erasure.rewrite`): the warehouse is rewritten into a fresh
   file without the patient, atomically swapped in; the task cache is removed; result files of
   the warehouse's runs directories are marked stale with the receipt number;
5. rewrites the ledger card of every registered runs folder from this warehouse's ledger and
   re-renders its report (:func:`write_ledger_result`; folders are found by identity,
   :mod:`pipelines.runs_registry`, so a copy of a runs folder and its original stay apart).

A crash after step 3 leaves a *pending* erasure that :func:`complete_pending` finishes on the
next command (idempotent: the rewrite only ever removes registered subjects). The receipt holds
counts, opaque context ids, tolerances and keyed hashes — never a raw id.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import erasure, gate_store, safe_io
from .errors import AlreadyForgottenError, GateStoreError, UnknownSubjectError
from .ledger import FORGET_KIND
from .warehouse import Warehouse, table_names, data_kind, get_meta

KIND = FORGET_KIND
STALE_FILE = "stale.json"


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


# ------------------------------------------------------------------------------------ planning
def plan_contexts(con, subject_id: int, keys, verify: bool = True, score_tol: float = 1e-6,
                  kkt_tol: float = 1e-9) -> tuple[dict[int, tuple | None], list[dict]]:
    """New gate states for every context holding ``subject_id``'s tokens (nothing is written).

    Returns (gate_updates for :func:`erasure.rewrite`, per-context receipt info)."""
    updates: dict[int, tuple | None] = {}
    infos = []
    mine = gate_store.tokens_of_subject(con, subject_id)
    bad = gate_store.unauthentic_contexts(con, keys)
    for cid in sorted(set(mine) | set(bad)):
        tids = mine.get(cid, np.zeros(0, dtype=np.int64))
        if cid not in bad:
            try:
                study, _ = gate_store.context_info(con, cid)
                g = gate_store.load_gate(con, cid, keys)
            except GateStoreError as exc:
                bad[cid] = str(exc)
        if cid in bad:  # fail toward erasure: an unusable state never blocks a deletion
            updates[cid] = None
            infos.append(_unusable(con, cid, tids, bad[cid]))
            continue
        info = {"context_id": int(cid), "study": study, "n_before": int(g.n), "removed": int(tids.size)}
        remaining = g.n - tids.size
        if remaining <= 0:
            info.update(action="removed", n_after=0, certified=True,
                        certificate="context removed: it held only this patient's tokens")
            updates[cid] = None
            infos.append(info)
            continue
        if g.gated and remaining * g.C < 1.0 - 1e-12:
            info.update(action="removed", n_after=0, certified=True,
                        certificate="context removed: the other tokens are infeasible at the fixed C")
            updates[cid] = None
            infos.append(info)
            continue
        pos = {int(t): i for i, t in enumerate(g.ids)}
        removed_keys = g.keys[[pos[int(t)] for t in tids]]
        was_gated = g.gated
        recs = g.forget_many([int(t) for t in tids])
        info.update(action="decrement", n_after=int(g.n), path_events=int(sum(r.path_events for r in recs)),
                    forgotten_tokens_live_after=int(np.isin(g.ids, tids).sum()), C=g.C, sigma=g.sigma,
                    fallbacks=int(sum(bool(getattr(r, "fallback", False)) for r in recs)))
        if not g.gated:
            info.update(certified=True, certificate="ungated (warm-up) context: uniform readout over the remaining tokens")
        elif not was_gated:
            info.update(certified=False, reason="context was ungated before the deletion")
        else:
            ok = all(r.certified for r in recs)
            info.update(certified=ok, certificate="maintained C&P decrement at the fixed C")
            if not ok:
                info["reason"] = "the decremental path did not certify"
            if verify:
                v = g.verify_against_refit(removed=removed_keys)
                info.update(max_abs_score_dev=v["max_abs_score_dev"], kkt_residual=v["kkt_residual"],
                            partition_match=v["partition_match"])
                if ok and not (v["max_abs_score_dev"] <= score_tol and v["kkt_residual"] <= kkt_tol):
                    info.update(certified=False, reason="refit check exceeded its tolerance")
        blob = gate_store.gate_to_blob(g)
        rows = [r for r in gate_store.token_rows(con, cid) if r[1] != int(subject_id)]
        updates[cid] = (blob, gate_store.state_mac(keys, cid, study, blob, rows), int(g.n))
        infos.append(info)
    return updates, infos


UNUSABLE = "stored state unusable"


def _unusable(con, cid: int, tids: np.ndarray, detail: str) -> dict:
    """Receipt entry of a context removed whole because its stored state cannot be used."""
    row = con.execute(f"SELECT study FROM {gate_store.STATES} WHERE context_id = ?", [int(cid)]).fetchone()
    n = con.execute(f"SELECT count(*) FROM {gate_store.TOKENS} WHERE context_id = ?", [int(cid)]).fetchone()[0]
    return {"context_id": int(cid), "study": str(row[0]) if row else "unknown", "n_before": int(n),
            "removed": int(tids.size), "action": "removed", "n_after": 0, "certified": True,
            "certificate": "context removed whole: its stored state was unusable, so nothing of it is kept",
            "reason": UNUSABLE, "detail": detail}


def _say_unusable(infos: list[dict]) -> None:
    for i in infos:
        if i.get("reason") == UNUSABLE:
            print(f"[forgetful] context {i['context_id']} ({i['study']}): {UNUSABLE} ({i['detail']}); removed whole "
                  "instead of decremented, a certified erasure recorded in the receipt; rerun that study to "
                  "rebuild its gates", file=sys.stderr)


# ------------------------------------------------------------------------------------ applying
def _mark_stale(runs_dirs: list[Path], seq: int, kind: str) -> None:
    """Record in each runs directory which of its results predate receipt ``seq``: every
    ``*/result.json`` except those whose ``data`` names another source than this warehouse's
    (``kind``; e.g. a synthetic study beside a demo warehouse) and except the ledger card, which
    :func:`write_ledger_result` rewrites after every forget. A result already stale keeps the
    receipt it first predated; ``latest`` is the newest receipt."""
    for d in runs_dirs:
        if not d.is_dir():
            continue
        since = {}
        try:
            old = json.loads((d / STALE_FILE).read_text())
            since = {str(f): int(old.get("since", {}).get(f, old["receipt_seq"])) for f in old.get("files", [])}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        for p in sorted(d.glob("*/result.json")):
            rel = p.relative_to(d).as_posix()
            if rel == "ledger/result.json":
                continue
            try:
                other = json.loads(p.read_text()).get("data")
            except (OSError, ValueError, AttributeError):
                other = None  # unreadable: marked, rather than vouched for
            if not (isinstance(other, str) and other != kind):  # e.g. a synthetic study beside a demo warehouse
                since.setdefault(rel, int(seq))
        if not since:
            continue
        tmp = d / f".{STALE_FILE}.tmp{os.getpid()}"
        tmp.unlink(missing_ok=True)  # never write through a planted link
        with os.fdopen(safe_io.open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "stale marker"), "w") as fh:
            fh.write(json.dumps({"receipt_seq": min(since.values()), "latest": int(seq),
                                 "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "files": sorted(since), "since": since}, indent=1))
        os.replace(tmp, d / STALE_FILE)


def _apply(w: Warehouse, subjects: dict[int, str], updates: dict, seq_applied: int) -> dict[str, int]:
    """Erase ``subjects`` from the exports, purge the task cache, mark results stale, and rewrite
    the warehouse without them (physically). The warehouse comes last: until its swap the
    subjects are still present, so a kill or a storage failure anywhere before leaves the whole
    erasure pending and the next command's :func:`complete_pending` redoes every step
    (each is idempotent)."""
    from cohort.build import content_hash

    from . import exports

    runs = w.runs_dirs()
    ex = exports.erase(w.export_dirs(), set(subjects))
    safe_io.remove_own_dir(w.cache_dir, "task cache folder")
    _mark_stale(runs, seq_applied, data_kind(w.path))
    removed = erasure.rewrite(w.path, set(subjects), updates, w.ledger_meta(), content_hash_fn=content_hash)
    if any(ex.values()):
        print(f"[forgetful] exports: {ex['export_files_rewritten']} file(s) rewritten, "
              f"{ex['export_files_removed']} removed (unreadable), {ex['export_rows_removed']} rows erased",
              file=sys.stderr)
    return removed


def complete_pending(w: Warehouse) -> dict[str, int]:
    """Finish every erasure the registry holds but the warehouse does not reflect yet (a forget
    killed after its commit, a warehouse built without the registry, re-inserted rows).
    Returns subject hash -> receipt seq for the subjects erased now."""
    reg = w.ledger.registry()
    con = w.connect(read_only=True)
    try:
        present = w.present_registered(con) if reg else {}
        applied = get_meta(con, "ledger_seq")
        updates: dict[int, tuple | None] = {}
        for sid in sorted(present):
            u, _ = plan_contexts(con, sid, w.keys, verify=False)
            for cid, val in u.items():  # a context shared by two pending subjects: drop it whole
                updates[cid] = None if cid in updates else val
    finally:
        con.close()
    n, _ = w.ledger.head()
    state = ("the receipts are committed, so every build excludes these patients; the erasure stays pending and the "
             "next forgetful command on this warehouse completes it once the disk allows; nothing was lost")
    if not present:
        if n and applied != str(n):
            with safe_io.storage_errors("removing the task cache", state):
                safe_io.remove_own_dir(w.cache_dir, "task cache folder")  # caches may predate the last receipt
                w.record_ledger()  # it reflects every receipt: record the log it extends (no rollback)
        return {}
    with safe_io.storage_errors(f"completing {len(present)} pending erasure(s)", state):
        _apply(w, present, updates, max(reg[h] for h in present.values()))
    with safe_io.storage_errors("updating the report's ledger card", "the pending erasures are complete"):
        write_ledger_result(w)
    print(f"[forgetful] completed {len(present)} pending erasure(s) from the forget registry", file=sys.stderr)
    return {h: reg[h] for h in present.values()}


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
    ledger_dir : the ledger/registry directory (default ``$FORGETFUL_LEDGER_DIR`` or ``<warehouse dir>/forget-registry``).
    wait : seconds to wait for another command's writer lock.
    allow_absent : register a subject the warehouse does not hold (so future builds exclude them).
    """
    t0 = time.perf_counter()
    with Warehouse.open(warehouse, write=True, ledger_dir=ledger_dir, wait=wait) as w:
        con = w.connect(read_only=True)
        try:
            sid = _resolve(con, subject_id, stay_id)
            if sid is None:
                raise UnknownSubjectError("no warehouse table or stored gate holds the given stay id; nothing changed")
            h = w.keys.subject_hash(sid)
            reg = w.ledger.registry()
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
                raise UnknownSubjectError("no warehouse table or stored gate holds the given subject id; nothing changed "
                                          "(--allow-absent registers it anyway, so no future build admits it)")
            updates, infos = plan_contexts(con, sid, w.keys, verify=verify)
        finally:
            con.close()
        certified = all(i.get("certified", False) for i in infos)
        payload = {
            "rows_deleted": counts,
            "n_stays": len(stays),
            "stay_id_hashes": sorted(w.keys.stay_hash(s) for s in stays),
            "contexts": infos,
            "certified": certified,
            "verified_against_refit": bool(verify),
            "erasure": "warehouse and registered exports rewritten into fresh files and swapped; task cache removed",
            "reference": "fresh retained-key refit at the same fixed C",
            "path": "maintained fp64 C&P decremental path",
        }
        _say_unusable(infos)
        from . import exports

        exports.check_links(w.export_dirs())  # a link is refused before anything is committed
        with safe_io.storage_errors("forget: writing the receipt", lambda: _append_state(w, h)):
            row = w.ledger.append(KIND, h, payload)  # the durable commitment (registry entry)
        with safe_io.storage_errors("forget: erasing", (
                f"receipt #{row.seq} is committed, so the patient is forgotten and every build excludes them; the "
                "erasure is pending and the next forgetful command on this warehouse completes it (rerun this "
                "one once the disk allows); nothing was lost")):
            if stays or any(counts.values()):
                _apply(w, {sid: h}, updates, row.seq)
            else:
                exports.erase(w.export_dirs(), {sid})
                safe_io.remove_own_dir(w.cache_dir, "task cache folder")
                w.record_ledger()
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


def ledger_result(w: Warehouse, runtime_s: float = 0.0) -> dict:
    """The report's ledger card (aggregates only: counts, head, status, last deletion time)."""
    s = w.ledger.summary()
    pending = len(w.present_registered()) if s["chain_verified"] else 0
    return {
        "study": "ledger", "title": "Deletion-receipt ledger", "data": "demo", "runtime_s": float(runtime_s),
        "seed_figure": {},
        "metrics": {"receipts": s["count"], "certified": s["certified"], "chain_verified": s["chain_verified"],
                    "pending_erasures": pending, "head": s["head"] or "", "last_deletion_utc": s["last_ts"] or "",
                    "key_fingerprint": w.keys.fingerprint},
        "tables": [], "figures": [],
        "notes": "verify independently: forgetful receipts verify --head HEAD --min-count N",
    }


def write_ledger_result(w: Warehouse, render: bool = True) -> list[Path]:
    """Write the ledger card of ``w``'s own ledger into every runs folder registered with the
    warehouse (found by identity: never a copy's or the original's), then — with ``render`` —
    re-render each folder's ``report.html`` so it says at once what the card and the stale marks
    say. A report problem never undoes an erasure (it is reported on stderr). Returns the cards."""
    from .runner import write_study_result

    res = ledger_result(w)
    res["data"] = data_kind(w.path)
    written = []
    for d in w.runs_dirs():
        if not d.is_dir():
            continue
        written.append(write_study_result(res, d, "ledger"))
        if render and (d / "report.html").is_file():
            try:
                from dashboards.report import write_report

                write_report(d, d / "report.html")
            except Exception as exc:  # a report problem must never undo an erasure
                print(f"[forgetful] report not re-rendered ({type(exc).__name__})", file=sys.stderr)
    return written
