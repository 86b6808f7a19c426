"""Planning and applying an erasure (:mod:`pipelines.store.forget` steps 2, 4 and 5), and completing a
pending one.

:func:`plan_contexts` decides what happens to every stored context holding a patient's tokens;
:func:`apply_erasure` erases them physically (exports, task cache, stale marks, the warehouse
rewrite); :func:`write_ledger_result` rewrites the report's ledger card. :func:`complete_pending`
finishes an erasure whose receipt is committed but whose rows are still present — the
:class:`pipelines.store.warehouse.Warehouse` handle calls it on every writable open, so this module
works on an open handle it is given and never imports the warehouse handle itself.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from pipelines.errors import GateStoreError
from pipelines.store import erasure, gate_store, killpoint, safe_io
from pipelines.store.handle import WarehouseHandle
from pipelines.store.warehouse_files import data_kind, get_meta

STALE_FILE = "stale.json"

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
            infos.append(unusable_entry(con, cid, tids, bad[cid]))
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
            info.update(certified=True,
                        certificate="ungated (warm-up) context: uniform readout over the remaining tokens")
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


def content_fingerprints(con, stays: set[int], keys) -> list[str]:
    """Keyed fingerprints of the hourly content of ``stays`` (:func:`cohort.build.content.blocks`
    of their observed hourly means in ``vitals_hourly``; HMAC under the ``content`` sub-key, so
    the receipt holds no value). Empty when the warehouse has no such table (a streaming one)."""
    from cohort.build.content import blocks
    from cohort.constants import VITALS
    from pipelines.store.warehouse_files import table_names

    if not stays or "vitals_hourly" not in table_names(con):
        return []
    cols = {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'vitals_hourly' "
                                      "AND database_name = current_database()").fetchall()}
    if not all(v in cols and f"{v}_observed" in cols for v in VITALS):
        return []
    sel = ", ".join(f"CASE WHEN {v}_observed THEN {v} END" for v in VITALS)
    out: set[str] = set()
    for stay in sorted(stays):
        rows = con.execute(f"SELECT hour, {sel} FROM vitals_hourly WHERE stay_id = ? ORDER BY hour", [int(stay)]
                           ).fetchnumpy()
        hours = np.asarray(rows["hour"], dtype=np.int64)
        values = np.column_stack([np.ma.asarray(rows[k], dtype=np.float64).filled(np.nan) for k in list(rows)[1:]]) \
            if hours.size else np.empty((0, len(VITALS)))  # NULL (not observed) -> NaN
        out.update(keys.content_hash(b) for b in blocks(hours, values))
    return sorted(out)


UNUSABLE = "stored state unusable"


def unusable_entry(con, cid: int, tids: np.ndarray, detail: str) -> dict:
    """Receipt entry of a context removed whole because its stored state cannot be used."""
    row = con.execute(f"SELECT study FROM {gate_store.STATES} WHERE context_id = ?", [int(cid)]).fetchone()
    n = con.execute(f"SELECT count(*) FROM {gate_store.TOKENS} WHERE context_id = ?", [int(cid)]).fetchone()[0]
    return {"context_id": int(cid), "study": str(row[0]) if row else "unknown", "n_before": int(n),
            "removed": int(tids.size), "action": "removed", "n_after": 0, "certified": True,
            "certificate": "context removed whole: its stored state was unusable, so nothing of it is kept",
            "reason": UNUSABLE, "detail": detail}


def say_unusable(infos: list[dict]) -> None:
    for i in infos:
        if i.get("reason") == UNUSABLE:
            print(f"[forgetful] context {i['context_id']} ({i['study']}): {UNUSABLE} ({i['detail']}); removed whole "
                  "instead of decremented, a certified erasure recorded in the receipt; rerun that study to "
                  "rebuild its gates", file=sys.stderr)


# ------------------------------------------------------------------------------------ applying
def mark_stale(runs_dirs: list[Path], seq: int, kind: str) -> None:
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


def apply_erasure(w: WarehouseHandle, subjects: dict[int, str], updates: dict, seq_applied: int) -> dict[str, int]:
    """Erase ``subjects`` from the exports, purge the task cache, mark results stale, and rewrite
    the warehouse without them (physically). The warehouse comes last: until its swap the
    subjects are still present, so a kill or a storage failure anywhere before leaves the whole
    erasure pending and the next command's :func:`complete_pending` redoes every step
    (each is idempotent)."""
    from cohort.build import content_hash

    runs = w.runs_dirs()
    ex = erase_exports(w)
    safe_io.remove_own_dir(w.cache_dir, "task cache folder")
    killpoint.hit("forget.cache_removed")
    mark_stale(runs, seq_applied, data_kind(w.path))
    killpoint.hit("forget.stale_marked")
    removed = erasure.rewrite(w.path, set(subjects), updates, w.ledger_meta(), content_hash_fn=content_hash)
    say_exports(ex)
    return removed


def erase_exports(w: WarehouseHandle, entries: list | None = None) -> dict[str, int]:
    """Rewrite every file the project wrote in the registered exports (or ``entries``) without
    any patient the registry names (:func:`pipelines.store.exports.erase`); counts only."""
    from pipelines.store import export_registry, exports

    entries = w.export_entries() if entries is None else entries
    ex = exports.erase(entries, w.exclusion(), w.remember_export_version)
    export_registry.note_seen(w, entries)
    return ex


def say_exports(ex: dict[str, int]) -> None:
    """What :func:`erase_exports` did, on stderr (counts only)."""
    if any(v for k, v in ex.items() if k != "export_files_left_alone"):
        print(f"[forgetful] exports: {ex['export_files_rewritten']} file(s) rewritten, "
              f"{ex['export_files_removed']} removed (unreadable), {ex['export_rows_removed']} rows erased",
              file=sys.stderr)
    if ex["export_files_left_alone"]:
        print(f"[forgetful] exports: {ex['export_files_left_alone']} file(s) in registered export folders are not "
              "the ones forgetful wrote (changed or put there since): left exactly as they are; they may still hold "
              "forgotten patients (`forgetful receipts verify` counts them): check or delete them yourself",
              file=sys.stderr)


def complete_pending(w: WarehouseHandle) -> dict[str, int | None]:
    """Finish every erasure the registry holds but the warehouse does not reflect yet (a forget
    killed after its commit, a warehouse built without the registry, re-inserted rows, or a
    patient another registry of the same source names). Returns subject hash -> receipt seq for
    the subjects erased now (None: named by another registry of the source)."""
    reg = w.registry()
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
        recheck_exports(w, reg, state)
        return {}
    with safe_io.storage_errors(f"completing {len(present)} pending erasure(s)", state):
        apply_erasure(w, present, updates, max(n if reg[h] is None else reg[h] for h in present.values()))
    with safe_io.storage_errors("updating the report's ledger card", "the pending erasures are complete"):
        write_ledger_result(w)
    print(f"[forgetful] completed {len(present)} pending erasure(s) from the forget registry", file=sys.stderr)
    return {h: reg[h] for h in present.values()}


def recheck_exports(w: WarehouseHandle, reg: dict, state: str) -> None:
    """Export folders whose files changed since the project last looked at them (a copy put back,
    stat only: :func:`pipelines.store.export_registry.changed`) are cleaned against the whole
    registry now, not at the next forget."""
    from pipelines.store import export_registry

    moved = [e for e in w.export_entries() if export_registry.changed(e)] if reg else []
    if moved:  # (no forgotten patient: nothing to look for, and nothing is written)
        with safe_io.storage_errors("checking the registered exports", state):
            say_exports(erase_exports(w, moved))


def ledger_result(w: WarehouseHandle, runtime_s: float = 0.0) -> dict:
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
        "notes": "verify independently with the log's public key (no secret): forgetful receipts verify --public-key "
                 "log.pub --head HEAD --min-count N",
    }


def write_card(result: dict, runs_dir: Path) -> Path:
    """Validate (aggregates only) and write ``<runs>/<study>/result.json``, which is current again:
    its stale mark goes (the flows' writer, :func:`pipelines.runtime.results.write_study_result`,
    adds the task-cache and Prefect-artifact steps a study run needs; a card needs neither)."""
    from dashboards.schema import write_result

    path = Path(runs_dir) / result["study"] / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(result, path)
    unstale(Path(runs_dir), f"{result['study']}/result.json")
    return path


def unstale(runs_dir: Path, rel: str) -> None:
    """A result written now is current again: drop it from ``<runs>/stale.json`` (:func:`mark_stale`)."""
    p = runs_dir / STALE_FILE
    if not p.is_file():
        return
    try:
        st = json.loads(p.read_text())
        files = [f for f in st.get("files", []) if f != rel]
    except (ValueError, AttributeError):
        p.unlink(missing_ok=True)
        return
    if files:
        st["files"] = files
        tmp = runs_dir / f".{STALE_FILE}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(st, indent=1))
        os.replace(tmp, p)
    else:
        p.unlink(missing_ok=True)


def write_ledger_result(w: WarehouseHandle, render: bool = True) -> list[Path]:
    """Write the ledger card of ``w``'s own ledger into every runs folder registered with the
    warehouse (found by identity: never a copy's or the original's), then — with ``render`` —
    re-render each folder's ``report.html`` so it says at once what the card and the stale marks
    say. A report problem never undoes an erasure (it is reported on stderr). Returns the cards."""
    res = ledger_result(w)
    res["data"] = data_kind(w.path)
    written = []
    for d in w.runs_dirs():
        if not d.is_dir():
            continue
        written.append(write_card(res, d))
        if render and (d / "report.html").is_file():
            try:
                from dashboards.report import write_report

                write_report(d, d / "report.html")
            except Exception as exc:  # a report problem must never undo an erasure
                print(f"[forgetful] report not re-rendered ({type(exc).__name__})", file=sys.stderr)
    return written
