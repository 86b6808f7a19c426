"""``forgetful receipts verify|list``: check the hash-chained deletion-receipt ledger.

``verify`` recomputes every row's SHA-256 and link; it prints the head hash, or the first
tampered row (exit 1). ``list`` prints aggregate fields only (seq, time, kind, counts) — never
the salted subject hashes.
"""
from __future__ import annotations

import json
import sys

import duckdb

from pipelines import ledger, runner
from pipelines import warehouse as wh
from pipelines.errors import LedgerTamperedError


def _open(path: str):
    return duckdb.connect(str(wh.require(path)), read_only=True)


@runner.cli_errors
def _verify(args) -> int:
    con = _open(args.warehouse)
    try:
        try:
            v = ledger.verify(con)
        except LedgerTamperedError as exc:
            print(f"TAMPERED: first bad row seq={exc.seq}: {exc.reason}", file=sys.stderr)
            print(json.dumps({"chain_verified": False, "first_bad_seq": exc.seq, "reason": exc.reason}))
            return 1
    finally:
        con.close()
    print(json.dumps({"chain_verified": True, **v}))
    return 0


@runner.cli_errors
def _list(args) -> int:
    con = _open(args.warehouse)
    try:
        rows = ledger.rows(con)
        s = ledger.summary(con)
    finally:
        con.close()
    print(f"{'seq':>4}  {'ts':<20}  {'kind':<15} {'stays':>5} {'contexts':>8} {'certified':>9}  rows deleted")
    for r in rows:
        try:
            p = r.payload
        except ValueError:
            p = {}
        rd = ", ".join(f"{k}={v}" for k, v in sorted(p.get("rows_deleted", {}).items()))
        print(f"{r.seq:>4}  {r.ts:<20}  {r.kind:<15} {p.get('n_stays', ''):>5} {len(p.get('contexts', [])):>8} "
              f"{str(p.get('certified', '')):>9}  {rd}")
    print(json.dumps({k: s[k] for k in ("count", "certified", "by_kind", "chain_verified", "first_bad_seq")}))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("receipts", help="verify or list the deletion-receipt ledger", description=__doc__)
    rs = p.add_subparsers(dest="receipts_command", metavar="{verify,list}")
    rs.required = True
    v = rs.add_parser("verify", help="re-check the hash chain; exit 1 at the first tampered row")
    v.add_argument("--warehouse", default="runs/warehouse.duckdb")
    v.set_defaults(func=_verify)
    ls = rs.add_parser("list", help="aggregate fields of every receipt")
    ls.add_argument("--warehouse", default="runs/warehouse.duckdb")
    ls.set_defaults(func=_list)
