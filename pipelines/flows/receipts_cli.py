"""``forgetful receipts verify|list|export``: audit the deletion-receipt ledger.

``verify`` checks every row's HMAC and link, the key fingerprint and the stored head anchor;
``--head HASH`` / ``--min-count N`` also check an auditor's own copy of the head (truncation,
deletion of every row, a replaced or rolled-back ledger). With ``--warehouse`` it also checks
that no registered (forgotten) subject is present in the warehouse (re-inserted data).
Exit 0 verified, 1 verification failed (tampered / re-inserted / an erasure still pending), 2 usage,
3 other errors.
``list`` prints aggregate fields only (seq, time, kind, counts) — never the subject hashes.
``export DIR`` writes one JSON file per receipt and ``head.json`` for an auditor to keep.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pipelines import jsonout, runner


def _ledger(args):
    from pipelines import warehouse as wh
    from pipelines.keys import Keys
    from pipelines.ledger import FILE, Ledger, default_dir

    d = Path(args.ledger) if args.ledger else default_dir(args.warehouse)
    if not (d / FILE).is_file() and not Path(args.warehouse).is_file():
        wh.require(args.warehouse)  # neither a ledger nor a warehouse here: say what is missing
    return Ledger(d, Keys.load(create=False))


@runner.cli_errors
def _verify(args) -> int:
    from pipelines.errors import LedgerTamperedError
    from pipelines.warehouse import Warehouse

    led = _ledger(args)
    try:
        v = led.verify(head=args.head, min_count=args.min_count)
    except LedgerTamperedError as exc:
        print(f"TAMPERED: first bad row seq={exc.seq}: {exc.reason}", file=sys.stderr)
        bad = {"chain_verified": False, "first_bad_seq": exc.seq, "reason": exc.reason}
        print(json.dumps(bad))
        jsonout.emit(args, bad)
        return 1
    out = {"chain_verified": True, **v, "forgotten_subjects": len(led.registry())}
    if Path(args.warehouse).is_file():
        with Warehouse.open(args.warehouse, write=False, ledger_dir=args.ledger, wait=args.wait,
                            reconcile=False) as w:
            present = w.present_registered()
            from pipelines.warehouse import get_meta

            con = w.connect(read_only=True)
            try:
                applied = get_meta(con, "ledger_seq")
            finally:
                con.close()
        reg = led.registry()
        reinserted = [h for h in present.values() if applied is not None and reg[h] <= int(applied)]
        out.update(warehouse_checked=True, pending_erasures=len(present) - len(reinserted),
                   reinserted=len(reinserted))
        if reinserted:
            print(f"TAMPERED: {len(reinserted)} forgotten subject(s) are present in the warehouse although it "
                  "records their erasure (re-inserted data)", file=sys.stderr)
            bad = {**out, "chain_verified": True, "warehouse_verified": False}
            print(json.dumps(bad))
            jsonout.emit(args, bad)
            return 1
        if out["pending_erasures"]:  # a forgotten patient still in the warehouse is not verified
            print(f"NOT VERIFIED: {out['pending_erasures']} forgotten subject(s) are still in the warehouse (erasure "
                  "pending); any forgetful command that writes this warehouse completes it (e.g. rerun the forget)",
                  file=sys.stderr)
            bad = {**out, "warehouse_verified": False}
            print(json.dumps(bad))
            jsonout.emit(args, bad)
            return 1
        out["warehouse_verified"] = True
    print(f"ledger verified: {v['n_rows']} receipts, head {v['head']}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def _list(args) -> int:
    led = _ledger(args)
    rows = led.rows()
    print(f"{'seq':>4}  {'ts':<20}  {'kind':<15} {'stays':>5} {'contexts':>8} {'certified':>9}  rows erased")
    for r in rows:
        p = r.payload
        rd = ", ".join(f"{k}={v}" for k, v in sorted(p.get("rows_deleted", {}).items()))
        print(f"{r.seq:>4}  {r.ts:<20}  {r.kind:<15} {p.get('n_stays', ''):>5} {len(p.get('contexts', [])):>8} "
              f"{str(p.get('certified', '')):>9}  {rd}")
    s = led.summary()
    agg = {k: s[k] for k in ("count", "certified", "by_kind", "chain_verified", "head")}
    print(json.dumps(agg))
    jsonout.emit(args, {**agg, "receipts": [{"seq": r.seq, "ts": r.ts, "kind": r.kind,
                                             "n_stays": r.payload.get("n_stays"),
                                             "contexts": len(r.payload.get("contexts", [])),
                                             "certified": r.payload.get("certified"),
                                             "rows_deleted": r.payload.get("rows_deleted", {})} for r in rows]})
    return 0


@runner.cli_errors
def _export(args) -> int:
    head = _ledger(args).export(args.out)
    out = {"exported": head["n_rows"], "to": str(Path(args.out).resolve()), "head": head["head"]}
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("receipts", help="verify, list or export the deletion-receipt ledger", description=__doc__)
    rs = p.add_subparsers(dest="receipts_command", metavar="{verify,list,export}")
    rs.required = True
    v = rs.add_parser("verify", help="check the keyed chain, the anchors and (optionally) a warehouse; exit 1 if tampered")
    v.add_argument("--head", default=None, metavar="HASH", help="the head hash an auditor recorded earlier")
    v.add_argument("--min-count", type=int, default=None, metavar="N", help="the ledger must hold at least N receipts")
    ls = rs.add_parser("list", help="aggregate fields of every receipt")
    ex = rs.add_parser("export", help="write each receipt as JSON plus head.json into DIR")
    ex.add_argument("out", metavar="DIR", help="folder for one JSON file per receipt and head.json")
    for q in (v, ls, ex):
        q.add_argument("--warehouse", default="runs/warehouse.duckdb", help="DuckDB warehouse (default: %(default)s)")
        runner.add_lock_args(q)
        jsonout.add_json_arg(q)
    v.set_defaults(func=_verify)
    ls.set_defaults(func=_list)
    ex.set_defaults(func=_export)
