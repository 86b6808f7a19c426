"""Right to be forgotten, end to end: one patient out of every gate state and every derived table,
with one hash-chained receipt, atomically.

:func:`forget_subject`

1. resolves the patient (``subject_id``, or the owner of ``stay_id``) — unknown → :class:`UnknownSubjectError`,
   already in the ledger → :class:`AlreadyForgottenError`; nothing is changed in either case;
2. for every stored context holding the patient's tokens, loads the gate and removes them by the
   maintained C&P decremental path (:meth:`sv_core.Gate.forget_many`), then verifies the result
   against an independent same-C refit (gate-score deviation on retained, removed and jittered
   probes; KKT residual). A context whose retained set would be empty or infeasible at the fixed
   C (``(n-k)·C < 1``) is dropped whole instead (recorded as ``dropped``);
3. in ONE DuckDB transaction: rewrites those gate states, deletes the tokens' rows, deletes the
   patient from every derived cohort table (:func:`cohort.purge.purge_subject`), refreshes the
   warehouse content hash (so cached study results keyed on it are not reused), and appends one
   receipt to the ledger. Any error rolls everything back.

The receipt holds counts, opaque context ids, tolerances and the salted hashes — never a raw id.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

from cohort.purge import purge_subject

from . import gate_store, ledger
from .errors import AlreadyForgottenError, UnknownSubjectError, WarehouseMissingError

KIND = "forget_subject"


@dataclass
class ForgetResult:
    """What :func:`forget_subject` did (aggregates only; safe to print)."""

    receipt_seq: int
    receipt_sha256: str
    rows_deleted: dict
    contexts: list
    certified: bool
    seconds: float

    def to_dict(self) -> dict:
        return {"receipt_seq": self.receipt_seq, "receipt_sha256": self.receipt_sha256,
                "rows_deleted": self.rows_deleted, "contexts": self.contexts,
                "certified": self.certified, "seconds": round(self.seconds, 4)}


def _table_names(con) -> set[str]:
    return {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}


def stay_hash(stay_id: int, key: bytes) -> str:
    import hashlib
    import hmac

    return hmac.new(key, f"stay:{int(stay_id)}".encode(), hashlib.sha256).hexdigest()


def _already(con, subj_hash: str | None, st_hash: str | None) -> bool:
    for r in ledger.rows(con):
        if r.kind != KIND:
            continue
        if subj_hash is not None and r.subject_id_hash == subj_hash:
            return True
        if st_hash is not None and st_hash in r.payload.get("stay_id_hashes", []):
            return True
    return False


def _resolve(con, subject_id: int | None, stay_id: int | None, key: bytes) -> int:
    tables = _table_names(con)
    if (subject_id is None) == (stay_id is None):
        raise UnknownSubjectError("give exactly one of subject_id or stay_id")
    if stay_id is not None:
        sh = stay_hash(stay_id, key)
        if _already(con, None, sh):
            raise AlreadyForgottenError("that stay's patient was already forgotten (a receipt exists)")
        row = None
        if "cohort_stays" in tables:
            row = con.execute("SELECT subject_id FROM cohort_stays WHERE stay_id = ?", [int(stay_id)]).fetchone()
        if row is None and gate_store.has_tables(con):
            row = con.execute(f"SELECT subject_id FROM {gate_store.TOKENS} WHERE stay_id = ? LIMIT 1",
                              [int(stay_id)]).fetchone()
        if row is None:
            raise UnknownSubjectError("no warehouse table or stored gate holds the given stay id; nothing changed")
        return int(row[0])
    return int(subject_id)


def forget_subject(warehouse: str | os.PathLike, subject_id: int | None = None, stay_id: int | None = None,
                   *, verify: bool = True, cache_dirs: tuple[str | os.PathLike, ...] = ()) -> ForgetResult:
    """Forget one patient everywhere; see the module docstring. Returns the receipt summary.

    Parameters
    ----------
    warehouse : path of the DuckDB warehouse (opened read-write).
    subject_id, stay_id : exactly one; a stay id forgets the patient who owns it (all their stays).
    verify : compare every decremented gate with an independent same-C refit.
    cache_dirs : derived result caches to delete after the commit (they may hold the patient's keys).
    """
    t0 = time.perf_counter()
    wh = Path(warehouse)
    if not wh.is_file():
        raise WarehouseMissingError(f"warehouse {wh} does not exist; build it with `forgetful build-cohort`")
    key = ledger.ledger_key(wh)
    con = duckdb.connect(str(wh))
    try:
        sid = _resolve(con, subject_id, stay_id, key)
        h = ledger.subject_hash(sid, key)
        if _already(con, h, None):
            raise AlreadyForgottenError("that patient was already forgotten (a receipt exists); nothing changed")
        tables = _table_names(con)
        stays = [int(r[0]) for r in con.execute(
            "SELECT stay_id FROM cohort_stays WHERE subject_id = ?", [sid]).fetchall()] if "cohort_stays" in tables else []
        per_ctx = gate_store.tokens_of_subject(con, sid)
        if gate_store.has_tables(con):
            stays = sorted(set(stays) | {int(r[0]) for r in con.execute(
                f"SELECT DISTINCT stay_id FROM {gate_store.TOKENS} WHERE subject_id = ?", [sid]).fetchall()})
        if not stays and not per_ctx:
            raise UnknownSubjectError("no warehouse table or stored gate holds the given subject id; nothing changed")

        # -- compute the new gate states (pure computation, nothing written yet) ------------
        plans = []  # (context_id, action, gate or None, info)
        for cid, tids in sorted(per_ctx.items()):
            study, n_before = gate_store.context_info(con, cid)
            g = gate_store.load_gate(con, cid)
            info = {"context_id": int(cid), "study": study, "n_before": int(g.n), "removed": int(tids.size)}
            remaining = g.n - tids.size
            if remaining <= 0 or (g.gated and remaining * g.C < 1.0 - 1e-12):
                info.update(action="dropped", n_after=0, certified=False,
                            reason="retained set empty or infeasible at the fixed C; context dropped whole")
                plans.append((cid, "dropped", None, info))
                continue
            pos = {int(t): i for i, t in enumerate(g.ids)}
            removed_keys = g.keys[[pos[int(t)] for t in tids]]
            was_gated = g.gated
            recs = g.forget_many([int(t) for t in tids])
            live_left = int(np.isin(g.ids, tids).sum())
            info.update(action="decrement", n_after=int(g.n), path_events=int(sum(r.path_events for r in recs)),
                        certified=bool(was_gated and g.gated and all(r.certified for r in recs)),
                        forgotten_tokens_live_after=live_left, C=g.C, sigma=g.sigma)
            if verify and g.gated:
                v = g.verify_against_refit(removed=removed_keys)
                info.update(max_abs_score_dev=v["max_abs_score_dev"], kkt_residual=v["kkt_residual"],
                            partition_match=v["partition_match"])
            plans.append((cid, "decrement", g, info))

        # -- one transaction: gate states, derived tables, content hash, receipt ------------
        con.execute("BEGIN TRANSACTION")
        try:
            for cid, action, g, _info in plans:
                if action == "dropped":
                    gate_store.drop_context(con, cid)
                else:
                    gate_store.update_gate(con, cid, g)
                    con.execute(f"DELETE FROM {gate_store.TOKENS} WHERE context_id = ? AND subject_id = ?",
                                [int(cid), sid])
            n_tok = sum(i["removed"] for _, _, _, i in plans)
            rows_deleted = {"gate_tokens": int(n_tok)}
            if "cohort_stays" in tables:
                rows_deleted.update(purge_subject(con, sid))
            if "build_info" in tables and "cohort_stays" in tables:
                from cohort.build import content_hash

                con.execute("UPDATE build_info SET value = ? WHERE key = 'content_hash'", [content_hash(con)])
            payload = {
                "rows_deleted": rows_deleted,
                "n_stays": len(stays),
                "stay_id_hashes": sorted(stay_hash(s, key) for s in stays),
                "contexts": [i for _, _, _, i in plans],
                "certified": bool(plans) and all(i.get("certified", False) for _, _, _, i in plans),
                "verified_against_refit": bool(verify),
                "reference": "fresh retained-key refit at the same fixed C",
                "path": "maintained fp64 C&P decremental path",
            }
            row = ledger.append(con, KIND, h, payload)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()
    for d in cache_dirs:
        shutil.rmtree(d, ignore_errors=True)
    return ForgetResult(receipt_seq=row.seq, receipt_sha256=row.sha256, rows_deleted=rows_deleted,
                        contexts=payload["contexts"], certified=payload["certified"],
                        seconds=time.perf_counter() - t0)
