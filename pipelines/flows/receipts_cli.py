"""``forgetful receipts …``: audit the deletion-receipt log; an auditor needs no secret.

Auditor (the log's public key only; nothing secret is read or created):

* ``verify --public-key FILE [--head STH.json] [--ledger DIR] [--warehouse W]`` checks every
  receipt line, the Merkle root against each signed tree head, the heads' signatures, the
  signed anchor, consistency with a head the auditor kept, and the log size and root the
  warehouse recorded (a rolled-back or restored log exits 1);
* ``verify-proof --public-key FILE PROOF.json`` checks an inclusion or consistency proof offline.

Operator (holds the keys in the config folder):

* ``verify`` without ``--public-key`` also checks every receipt's HMAC and, with the warehouse,
  that no forgotten subject is back in it or in any export folder registered with it (counts
  only); ``--head HASH --min-count N`` still take a row MAC;
* ``public-key --out FILE [--format pem|hex]`` writes the log's public key for auditors;
* ``head --out STH.json`` writes the newest signed tree head for an auditor to keep;
* ``prove --seq N --out FILE`` writes an inclusion proof of receipt N; ``prove --since STH.json``
  a consistency proof from a kept head to the newest one;
* ``list`` prints aggregate fields only (never the subject hashes); ``export DIR`` writes one
  JSON file per receipt and ``head.json`` (the newest signed head);
* ``accept-rollback`` is the last-resort recovery after a restore (README, deletion guarantees).

Exit 0 verified, 1 any verification failure (tampered, rolled back, re-inserted, another key),
2 usage, 3 other errors (one typed line).
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from pipelines import jsonout
from pipelines.runtime import runner

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _dir(args) -> Path:
    from pipelines.receipts.ledger import default_dir

    return Path(os.path.abspath(args.ledger)) if args.ledger else default_dir(args.warehouse)


def _ledger(args):
    from pipelines.receipts.ledger import FILE, Ledger
    from pipelines.store import warehouse as wh
    from pipelines.store.keys import Keys

    d = _dir(args)
    if not (d / FILE).is_file() and not Path(args.warehouse).is_file():
        wh.require(args.warehouse)  # neither a ledger nor a warehouse here: say what is missing
    led = Ledger(d, Keys.load(create=False))
    rec = _recorded(args)
    if rec is not None:  # no command reads a log shorter than what the warehouse recorded
        from pipelines.receipts import logaudit

        logaudit.check_recorded(led.state(), rec["size"], rec["root"], rec["what"])
    return led


def _fail(args, exc, extra: dict | None = None) -> int:
    reason = getattr(exc, "reason", None) or str(exc)
    seq = getattr(exc, "seq", None)
    print(f"TAMPERED: {type(exc).__name__}" + (f" at seq {seq}" if seq else "") + f": {reason}", file=sys.stderr)
    bad = {**(extra or {}), "chain_verified": False, "first_bad_seq": seq, "reason": reason,
           "error": type(exc).__name__}
    print(json.dumps(bad))
    jsonout.emit(args, bad)
    return runner.EXIT_VERIFY_FAILED


def _kept(args):
    """``--head``: a signed tree head file, or (legacy) a row MAC."""
    from pipelines.receipts.signing import read_head_file

    if args.head is None:
        return None, None
    if Path(args.head).is_file():
        return read_head_file(args.head), None
    if _HEX64.match(args.head):
        return None, args.head
    return None, None


def _recorded(args) -> dict | None:
    """The log state the warehouse recorded (read-only, shared lock), None without a warehouse."""
    from pipelines.store import locking
    from pipelines.store.warehouse import read_meta

    p = Path(args.warehouse)
    if not p.is_file():
        return None
    try:
        with locking.hold(p, exclusive=False, wait=args.wait):
            meta = read_meta(p)
    except PermissionError:  # a read-only copy (an auditor's): no lock file can be made, nobody writes it
        meta = read_meta(p)
    if meta.get("ledger_seq") is None:
        return {"size": 0, "root": None, "what": f"the warehouse {p.name}"}
    return {"size": int(meta["ledger_seq"]), "root": meta.get("ledger_root"), "what": f"the warehouse {p.name}"}


def _verify_public(args, kept, legacy_head) -> int:
    from pipelines.errors import LedgerTamperedError
    from pipelines.receipts import logaudit
    from pipelines.receipts.signing import load_public_key

    pub = load_public_key(args.public_key)
    d = _dir(args)
    rec = _recorded(args)
    if rec is None and not (d / logaudit.FILE).is_file() and not args.ledger:
        from pipelines.store import warehouse as wh

        wh.require(args.warehouse)
    try:
        out = logaudit.audit(d, pub, kept=kept, recorded=rec, all_signatures=args.all_signatures)
        logaudit.check_legacy(logaudit.read_rows(d / logaudit.FILE), legacy_head, args.min_count)
    except LedgerTamperedError as exc:
        return _fail(args, exc, {"mode": "public key"})
    out = {"chain_verified": True, "mode": "public key", **out, "warehouse_checked": rec is not None}
    if rec is not None:
        out["reinserted"] = "not checked: mapping subjects to hashes needs the operator's key"
    print(f"log verified with the public key: {out['n_rows']} receipts, root {out['root']}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def _verify(args) -> int:
    from pipelines.errors import LedgerKeyMismatchError, LedgerTamperedError
    from pipelines.receipts import logaudit
    from pipelines.store.warehouse import Warehouse, get_meta

    kept, legacy_head = _kept(args)
    if args.head is not None and kept is None and legacy_head is None:
        print("error: --head must be a signed tree head file (receipts head --out) or a 64-hex row MAC",
              file=sys.stderr)
        return runner.EXIT_USAGE
    if args.public_key:
        return _verify_public(args, kept, legacy_head)
    try:
        led = _ledger(args)
        n_signed = led.complete()
        if n_signed:
            print(f"[forgetful] signed {n_signed} tree head(s) an interrupted append left unsigned", file=sys.stderr)
        v = led.verify(head=legacy_head, min_count=args.min_count)
        st = led.state()
        if kept is not None:
            v["kept_head"] = logaudit.check_kept_head(st, kept, led.public_key())
        if args.all_signatures and st.heads:
            logaudit.check_heads(st, led.public_key(), all_signatures=True)
        out = {"chain_verified": True, "mode": "operator key", **v, "sth": st.heads[-1].to_json() if st.heads else None,
               "forgotten_subjects": len(led.registry())}
        if Path(args.warehouse).is_file():
            with Warehouse.open(args.warehouse, write=False, ledger_dir=args.ledger, wait=args.wait,
                                reconcile=False) as w:
                present = w.present_registered()
                con = w.connect(read_only=True)
                try:
                    applied = get_meta(con, "ledger_seq")
                finally:
                    con.close()
                ex = _scan_exports(w)
            reg = led.registry()
            reinserted = [h for h in present.values()
                          if applied is not None and reg.get(h) is not None and reg[h] <= int(applied)]
            out.update(warehouse_checked=True, pending_erasures=len(present) - len(reinserted),
                       reinserted=len(reinserted), warehouse_records=None if applied is None else int(applied), **ex)
            if ex["export_forgotten_rows"] or ex["export_files_unreadable"]:
                print(f"NOT VERIFIED: registered exports hold {ex['export_forgotten_rows']} row(s) of forgotten "
                      f"patients and {ex['export_files_unreadable']} file(s) that cannot be read to show them clean "
                      f"({ex['export_files_not_ours']} of the {ex['export_files_scanned']} files are not the ones "
                      "forgetful wrote); the next forget rewrites the project's own files, the others are yours to "
                      "delete", file=sys.stderr)
                bad = {**out, "warehouse_verified": False}
                print(json.dumps(bad))
                jsonout.emit(args, bad)
                return 1
            if reinserted:
                print(f"TAMPERED: {len(reinserted)} forgotten subject(s) are present in the warehouse although it "
                      "records their erasure (re-inserted data)", file=sys.stderr)
                bad = {**out, "chain_verified": True, "warehouse_verified": False}
                print(json.dumps(bad))
                jsonout.emit(args, bad)
                return 1
            if out["pending_erasures"]:  # a forgotten patient still in the warehouse is not verified
                print(f"NOT VERIFIED: {out['pending_erasures']} forgotten subject(s) are still in the warehouse "
                      "(erasure pending); any forgetful command that writes this warehouse completes it (e.g. rerun "
                      "the forget)", file=sys.stderr)
                bad = {**out, "warehouse_verified": False}
                print(json.dumps(bad))
                jsonout.emit(args, bad)
                return 1
            out["warehouse_verified"] = True
    except (LedgerTamperedError, LedgerKeyMismatchError) as exc:
        return _fail(args, exc, {"mode": "operator key"})
    print(f"ledger verified: {v['n_rows']} receipts, head {v['head']}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


def _scan_exports(w) -> dict:
    """Counts of forgotten patients in the warehouse's registered exports (nothing written)."""
    from pipelines.store import exports

    return exports.scan(w.export_entries(), w.exclusion())


@runner.cli_errors
def _list(args) -> int:
    led = _ledger(args)
    rows = led.rows()
    print(f"{'seq':>4}  {'ts':<20}  {'kind':<17} {'stays':>5} {'contexts':>8} {'certified':>9}  rows erased")
    for r in rows:
        p = r.payload
        rd = ", ".join(f"{k}={v}" for k, v in sorted(p.get("rows_deleted", {}).items()))
        print(f"{r.seq:>4}  {r.ts:<20}  {r.kind:<17} {p.get('n_stays', ''):>5} {len(p.get('contexts', [])):>8} "
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
    out = {"exported": head["n_rows"], "to": str(Path(args.out).resolve()), "head": head["head"],
           "root": head["root"]}
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def _public_key(args) -> int:
    from pipelines.errors import LedgerKeyMismatchError
    from pipelines.receipts.logaudit import anchored_heads
    from pipelines.receipts.signing import load_signing_key, log_id, public_key_text
    from pipelines.store.keys import signing_key_file

    key = load_signing_key(create=True)  # created only for a fresh configuration (no anchored log)
    other = [h for h in anchored_heads() if h.log_id != log_id(key)]
    if other:  # never hand auditors a key that did not sign this configuration's logs
        raise LedgerKeyMismatchError(
            f"the signing key {signing_key_file()} did not sign {len(other)} receipt log(s) this configuration keeps "
            "(another key was put in its place): restore the original signing.key from your backup (docs/DELETION.md, "
            "keys); no public key was written")
    text = public_key_text(key, args.format)
    _write_out(args.out, text)
    out = {"public_key": str(Path(args.out).resolve()), "format": args.format, "log_id": log_id(key)}
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


def _write_out(path: str, text: str) -> None:
    from dashboards.atomic import atomic_write_text

    atomic_write_text(Path(path), text)


def _state(args):
    """The verified log (public key given: with it only; else the operator's keys) and the key."""
    from pipelines.receipts import logaudit
    from pipelines.receipts.signing import load_public_key

    if args.public_key:
        pub = load_public_key(args.public_key)
        logaudit.audit(_dir(args), pub, recorded=_recorded(args))
        return logaudit.LogState.read(_dir(args)), pub
    led = _ledger(args)
    led.complete()
    return led.state(), led.public_key()


@runner.cli_errors
def _head(args) -> int:
    from pipelines.errors import LedgerTamperedError

    try:
        st, _ = _state(args)
    except LedgerTamperedError as exc:
        return _fail(args, exc)
    if not st.heads:
        print("error: the log is empty: there is no signed tree head yet", file=sys.stderr)
        return runner.EXIT_DOMAIN
    h = st.heads[-1]
    _write_out(args.out, json.dumps(h.to_json(), indent=1, sort_keys=True) + "\n")
    out = {"head": str(Path(args.out).resolve()), "tree_size": h.tree_size, "root_hash": h.root_hash}
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def _prove(args) -> int:
    from pipelines.errors import LedgerTamperedError
    from pipelines.receipts import logaudit, translog
    from pipelines.receipts.signing import read_head_file

    try:
        st, pub = _state(args)
        if not st.heads:
            print("error: the log is empty: nothing to prove", file=sys.stderr)
            return runner.EXIT_DOMAIN
        sth = st.heads[-1]
        tree = translog.Tree(st.leaves)
        if args.seq is not None:
            if not 1 <= args.seq <= st.size:
                print(f"error: --seq must be in 1..{st.size}", file=sys.stderr)
                return runner.EXIT_USAGE
            proof = {"version": "forgetful-inclusion-v1", "leaf": st.rows[args.seq - 1].line().decode("ascii"),
                     "leaf_index": args.seq - 1, "tree_size": st.size,
                     "audit_path": [h.hex() for h in tree.inclusion_proof(args.seq - 1)], "sth": sth.to_json()}
        else:
            old = read_head_file(args.since)
            logaudit.check_kept_head(st, old, pub, "the given head")
            proof = {"version": "forgetful-consistency-v1", "first": old.to_json(), "second": sth.to_json(),
                     "proof": [h.hex() for h in tree.consistency_proof(old.tree_size)] if old.tree_size else []}
    except LedgerTamperedError as exc:
        return _fail(args, exc)
    _write_out(args.out, json.dumps(proof, indent=1, sort_keys=True) + "\n")
    out = {"proof": str(Path(args.out).resolve()), "kind": proof["version"], "tree_size": st.size}
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def _verify_proof(args) -> int:
    from pipelines.errors import LedgerTamperedError
    from pipelines.receipts.logaudit import check_proof_file
    from pipelines.receipts.signing import load_public_key

    pub = load_public_key(args.public_key)
    try:
        out = check_proof_file(args.proof, pub)
    except LedgerTamperedError as exc:
        return _fail(args, exc)
    print(f"proof verified: {out['kind']}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def _accept_rollback(args) -> int:
    from pipelines.store.warehouse import accept_rollback

    out = accept_rollback(args.warehouse, ledger_dir=args.ledger, wait=args.wait)
    print(out.pop("message"), file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("receipts", help="verify, list, export or prove the deletion-receipt log", description=__doc__)
    names = "{verify,verify-proof,public-key,head,prove,list,export,accept-rollback}"
    rs = p.add_subparsers(dest="receipts_command", metavar=names)
    rs.required = True
    v = rs.add_parser("verify", help="check the log, its signed heads, anchors and (optionally) a warehouse and a "
                                     "kept head; exit 1 on any failure")
    v.add_argument("--public-key", default=None, metavar="FILE",
                   help="verify as an auditor with this public key only (PEM or hex; no secret needed)")
    v.add_argument("--head", default=None, metavar="STH.json|HASH",
                   help="a signed tree head kept earlier (file from `receipts head`), or a row MAC (legacy)")
    v.add_argument("--min-count", type=int, default=None, metavar="N", help="the log must hold at least N receipts")
    v.add_argument("--all-signatures", action="store_true",
                   help="verify every signed head's signature on its own (default: the newest one, which commits "
                        "to all earlier heads through their chain)")
    vp = rs.add_parser("verify-proof", help="check an inclusion or consistency proof offline with the public key")
    vp.add_argument("proof", metavar="PROOF.json", help="file written by `receipts prove`")
    vp.add_argument("--public-key", required=True, metavar="FILE", help="the log's public key (PEM or hex)")
    pk = rs.add_parser("public-key", help="write the log's Ed25519 public key for auditors")
    pk.add_argument("--out", required=True, metavar="FILE", help="where to write the public key")
    pk.add_argument("--format", choices=["pem", "hex"], default="pem",
                    help="PEM SubjectPublicKeyInfo, or the raw 32-byte key as 64 hex characters (default %(default)s)")
    hd = rs.add_parser("head", help="write the newest signed tree head (an auditor keeps it)")
    hd.add_argument("--out", required=True, metavar="STH.json", help="where to write the signed tree head")
    pr = rs.add_parser("prove", help="write an inclusion proof of one receipt, or a consistency proof from a kept head")
    g = pr.add_mutually_exclusive_group(required=True)
    g.add_argument("--seq", type=int, default=None, metavar="N", help="the receipt to prove")
    g.add_argument("--since", default=None, metavar="STH.json",
                   help="a kept signed tree head to prove consistency from")
    pr.add_argument("--out", required=True, metavar="FILE", help="where to write the proof (JSON)")
    ls = rs.add_parser("list", help="aggregate fields of every receipt")
    ex = rs.add_parser("export", help="write each receipt as JSON plus head.json into DIR")
    ex.add_argument("out", metavar="DIR", help="folder for one JSON file per receipt and head.json")
    ar = rs.add_parser("accept-rollback", help="recovery: accept a restored (shorter) log; the warehouse keeps the "
                                               "forgotten patients out until they are forgotten again")
    for q in (hd, pr):
        q.add_argument("--public-key", default=None, metavar="FILE",
                       help="verify the log with this public key only before writing (default: the operator's keys)")
    for q in (v, vp, pk, hd, pr, ls, ex, ar):
        if q is not vp and q is not pk:
            q.add_argument("--warehouse", default="runs/warehouse.duckdb",
                           help="DuckDB warehouse (default: %(default)s)")
            runner.add_lock_args(q)
        jsonout.add_json_arg(q)
    for q, fn in ((v, _verify), (vp, _verify_proof), (pk, _public_key), (hd, _head), (pr, _prove), (ls, _list),
                  (ex, _export), (ar, _accept_rollback)):
        q.set_defaults(func=fn)
