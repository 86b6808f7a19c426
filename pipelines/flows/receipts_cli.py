"""``forgetful receipts …``: audit the deletion-receipt log; an auditor needs no secret.

Auditor (the log's public key only; nothing secret is read or created): ``verify --public-key
FILE`` checks every receipt line, the Merkle root against each signed tree head, the heads'
signatures, the signed anchor, consistency with a kept head (``--head``) and the log size and root
the warehouse recorded (a rolled-back or restored log exits 1); ``--witness`` also requires
witness cosignatures; ``verify-proof`` checks an inclusion or consistency proof offline. A missing
or empty log is one line, exit 3 (``--allow-empty`` when expected), never "verified: 0 receipts".

Operator (holds the keys in the config folder): ``verify`` without ``--public-key`` also checks
every receipt's HMAC and that no forgotten subject is back in the warehouse or its exports;
``public-key``, ``head`` and ``prove`` write what an auditor keeps; ``witness add|list|remove``;
``list`` (aggregate fields only) and ``export DIR``; ``accept-rollback`` is the last-resort
recovery after a restore. docs/RECEIPTS.md.

Exit 0 verified, 1 any verification failure (tampered, rolled back, re-inserted, another key),
2 usage, 3 other errors (one typed line).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pipelines import jsonout
from pipelines.flows.receipts_c2sp_cli import ledger_dir
from pipelines.flows.receipts_verify_cli import fail, open_ledger, recorded, verify, verify_proof
from pipelines.runtime import runner


@runner.cli_errors
def _list(args) -> int:
    led = open_ledger(args)
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
    head = open_ledger(args).export(args.out)
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
    if args.format == "vkey":
        from pipelines.flows.receipts_c2sp_cli import vkey_text

        text = vkey_text(ledger_dir(args), key)
    else:
        text = public_key_text(key, args.format)
    out = {"public_key": str(Path(args.out).resolve()) if args.out else None, "format": args.format,
           "log_id": log_id(key)}
    if args.out is None:  # the key itself on stdout (--json PATH still gets the summary)
        print(text, end="")
        jsonout.emit(args, out)
        return 0
    _write_out(args.out, text)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


def _write_out(path: str, text: str) -> None:
    from sv_core.jsonfile import atomic_write_text

    atomic_write_text(Path(path), text)


def _state(args):
    """The verified log (public key given: with it only; else the operator's keys), the public
    key, the log's vkey when ``--public-key`` was one, and whether the operator's keys are used."""
    from pipelines.flows.receipts_c2sp_cli import load_log_key
    from pipelines.receipts import logaudit

    if args.public_key:
        pub, given = load_log_key(args.public_key)
        logaudit.audit(ledger_dir(args), pub, recorded=recorded(args))
        return logaudit.LogState.read(ledger_dir(args)), pub, given, False
    led = open_ledger(args)
    led.complete()
    return led.state(), led.public_key(), None, True


@runner.cli_errors
def _head(args) -> int:
    from pipelines.errors import LedgerTamperedError

    try:
        st, pub, given, operator = _state(args)
        if st.heads and args.format == "checkpoint":
            from pipelines.flows.receipts_c2sp_cli import newest_note

            text = newest_note(ledger_dir(args), st, pub, given, operator)
    except LedgerTamperedError as exc:
        return fail(args, exc)
    if not st.heads:
        print("error: the log is empty: there is no signed tree head yet", file=sys.stderr)
        return runner.EXIT_DOMAIN
    h = st.heads[-1]
    if args.format == "json":
        text = json.dumps(h.to_json(), indent=1, sort_keys=True) + "\n"
    _write_out(args.out, text)
    out = {"head": str(Path(args.out).resolve()), "format": args.format, "tree_size": h.tree_size,
           "root_hash": h.root_hash}
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def _prove(args) -> int:
    from pipelines.errors import LedgerTamperedError
    from pipelines.receipts import logaudit, translog
    from pipelines.receipts.signing import read_head_file

    if args.format == ("tlog-witness" if args.since is None else "tlog-proof") or (
            args.index is not None and args.format == "json"):
        print("error: --format tlog-proof goes with --seq/--index, tlog-witness with --since; --index with "
              "--format tlog-proof", file=sys.stderr)
        return runner.EXIT_USAGE
    try:
        st, pub, given, operator = _state(args)
        if not st.heads:
            print("error: the log is empty: nothing to prove", file=sys.stderr)
            return runner.EXIT_DOMAIN
        if args.index is not None and not 0 <= args.index < st.size:
            print(f"error: --index must be in 0..{st.size - 1}", file=sys.stderr)
            return runner.EXIT_USAGE
        sth = st.heads[-1]
        tree = translog.Tree(st.leaves)
        if args.seq is not None and not 1 <= args.seq <= st.size:
            print(f"error: --seq must be in 1..{st.size}", file=sys.stderr)
            return runner.EXIT_USAGE
        if args.format != "json":
            from pipelines.flows.receipts_c2sp_cli import prove_text

            proof = {"version": args.format, "text": prove_text(args, ledger_dir(args), st, pub, given, operator)}
        elif args.seq is not None:
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
        return fail(args, exc)
    _write_out(args.out, proof["text"] if "text" in proof else json.dumps(proof, indent=1, sort_keys=True) + "\n")
    out = {"proof": str(Path(args.out).resolve()), "kind": proof["version"], "tree_size": st.size}
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
    names = "{verify,verify-proof,public-key,head,prove,list,export,accept-rollback,witness}"
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
    vp.add_argument("proof", metavar="PROOF", help="file written by `receipts prove` (JSON or .tlog-proof)")
    vp.add_argument("--public-key", required=True, metavar="FILE", help="the log's public key (PEM, hex or vkey)")
    pk = rs.add_parser("public-key", help="write the log's Ed25519 public key for auditors")
    pk.add_argument("--out", default=None, metavar="FILE", help="where to write the public key (default: stdout)")
    pk.add_argument("--format", choices=["pem", "hex", "vkey"], default="pem",
                    help="PEM SubjectPublicKeyInfo, the raw 32-byte key as 64 hex characters, or the C2SP verifier "
                         "key <origin>+<key id>+<base64> naming this log (default %(default)s)")
    hd = rs.add_parser("head", help="write the newest signed tree head (an auditor keeps it)")
    hd.add_argument("--out", required=True, metavar="FILE", help="where to write the signed tree head")
    pr = rs.add_parser("prove", help="write an inclusion proof of one receipt, or a consistency proof from a kept head")
    g = pr.add_mutually_exclusive_group(required=True)
    g.add_argument("--seq", type=int, default=None, metavar="N", help="the receipt to prove (1-based)")
    g.add_argument("--index", type=int, default=None, metavar="I",
                   help="the entry to prove by its zero-based log index (with --format tlog-proof)")
    g.add_argument("--since", default=None, metavar="FILE",
                   help="a kept signed tree head (JSON) or checkpoint to prove consistency from")
    pr.add_argument("--out", required=True, metavar="FILE", help="where to write the proof")
    ls = rs.add_parser("list", help="aggregate fields of every receipt")
    ex = rs.add_parser("export", help="write each receipt as JSON plus head.json into DIR")
    ex.add_argument("out", metavar="DIR", help="folder for one JSON file per receipt and head.json")
    ar = rs.add_parser("accept-rollback", help="recovery: accept a restored (shorter) log; the warehouse keeps the "
                                               "forgotten patients out until they are forgotten again")
    for q in (hd, pr):
        q.add_argument("--public-key", default=None, metavar="FILE",
                       help="verify the log with this public key only before writing (default: the operator's keys)")
    from pipelines.flows.receipts_c2sp_cli import add_cli as add_c2sp_cli

    add_c2sp_cli(rs, v, vp, pk, hd, pr)
    for q in (v, vp, pk, hd, pr, ls, ex, ar):
        if q is not vp:
            q.add_argument("--warehouse", default="runs/warehouse.duckdb",
                           help="DuckDB warehouse (default: %(default)s)")
            runner.add_lock_args(q)
        jsonout.add_json_arg(q)
    for q, fn in ((v, verify), (vp, verify_proof), (pk, _public_key), (hd, _head), (pr, _prove), (ls, _list),
                  (ex, _export), (ar, _accept_rollback)):
        q.set_defaults(func=fn)
