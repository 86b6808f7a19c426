"""``forgetful receipts verify`` and ``verify-proof`` (operator and auditor), and what every
``receipts`` command uses to read the log: its folder, the state the warehouse recorded, a
kept head, the one-line failure report (exit 1). The parsers are in
:mod:`pipelines.flows.receipts_cli`, the C2SP forms in :mod:`pipelines.flows.receipts_c2sp_cli`.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from pipelines import jsonout
from pipelines.flows.receipts_c2sp_cli import ledger_dir
from pipelines.runtime import runner

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def require_log(args, d: Path, n_rows: int | None = None) -> None:
    """A missing, empty or mistyped ledger folder is one line, exit 3 (unless ``--allow-empty``)."""
    from pipelines.errors import EmptyLedgerError
    from pipelines.receipts.logaudit import FILE

    if getattr(args, "allow_empty", False):
        return
    hint = "pass --allow-empty if no patient has been forgotten yet"
    if not d.is_dir():
        raise EmptyLedgerError(f"no ledger folder at {d} (mistyped? the default is <warehouse folder>/"
                               "forget-registry); nothing was verified")
    if not (d / FILE).is_file():
        raise EmptyLedgerError(f"{d} holds no receipt log ({FILE}): not a ledger folder, or an empty one ({hint})")
    if n_rows == 0:
        raise EmptyLedgerError(f"the log in {d} holds 0 receipts: nothing was verified ({hint})")


def open_ledger(args):
    """The operator's :class:`~pipelines.receipts.ledger.Ledger` (keys from the config folder),
    refused when shorter than what the warehouse recorded."""
    from pipelines.receipts.ledger import FILE, Ledger
    from pipelines.store import warehouse as wh
    from pipelines.store.keys import Keys

    d = ledger_dir(args)
    if not (d / FILE).is_file() and not Path(args.warehouse).is_file():
        wh.require(args.warehouse)  # neither a ledger nor a warehouse here: say what is missing
    led = Ledger(d, Keys.load(create=False))
    rec = recorded(args)
    if rec is not None:  # no command reads a log shorter than what the warehouse recorded
        from pipelines.receipts import logaudit

        logaudit.check_recorded(led.state(), rec["size"], rec["root"], rec["what"])
    return led


def fail(args, exc, extra: dict | None = None) -> int:
    """Report a verification failure: one ``TAMPERED:`` line, the JSON record; exit 1."""
    reason = getattr(exc, "reason", None) or str(exc)
    seq = getattr(exc, "seq", None)
    print(f"TAMPERED: {type(exc).__name__}" + (f" at seq {seq}" if seq else "") + f": {reason}", file=sys.stderr)
    bad = {**(extra or {}), "chain_verified": False, "first_bad_seq": seq, "reason": reason,
           "error": type(exc).__name__}
    print(json.dumps(bad))
    jsonout.emit(args, bad)
    return runner.EXIT_VERIFY_FAILED


def kept_head(args):
    """``--head``: (signed tree head, legacy row MAC, C2SP checkpoint file); at most one is set."""
    from pipelines.receipts.signing import read_head_file

    if args.head is None:
        return None, None, None
    p = Path(args.head)
    if p.is_file():
        if not p.read_bytes().lstrip().startswith(b"{"):
            return None, None, p  # a checkpoint (receipts head --format checkpoint)
        return read_head_file(args.head), None, None
    if _HEX64.match(args.head):
        return None, args.head, None
    return None, None, None


def recorded(args) -> dict | None:
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


def verify_public(args, kept, legacy_head, checkpoint) -> int:
    from pipelines.errors import LedgerTamperedError
    from pipelines.flows.receipts_c2sp_cli import check_kept_checkpoint, load_log_key, witness_policy
    from pipelines.receipts import logaudit

    pub, given = load_log_key(args.public_key)
    d = ledger_dir(args)
    rec = recorded(args)
    if rec is None and not (d / logaudit.FILE).is_file() and not args.ledger:
        from pipelines.store import warehouse as wh

        wh.require(args.warehouse)
    require_log(args, d)
    try:
        out = logaudit.audit(d, pub, kept=kept, recorded=rec, all_signatures=args.all_signatures)
        require_log(args, d, out["n_rows"])
        logaudit.check_legacy(logaudit.read_rows(d / logaudit.FILE), legacy_head, args.min_count)
        st = logaudit.LogState.read(d)
        if checkpoint is not None:
            out["kept_checkpoint"] = check_kept_checkpoint(checkpoint, d, st, pub, given)
        witnessed = witness_policy(args, d, st, pub, given)
    except LedgerTamperedError as exc:
        return fail(args, exc, {"mode": "public key"})
    out = {"chain_verified": True, "mode": "public key", **out, "warehouse_checked": rec is not None}
    if witnessed is not None:
        out["witnessed"] = witnessed
    if rec is not None:
        out["reinserted"] = "not checked: mapping subjects to hashes needs the operator's key"
    print(f"log verified with the public key: {out['n_rows']} receipts, root {out['root']}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def verify(args) -> int:
    from pipelines.errors import LedgerKeyMismatchError, LedgerTamperedError
    from pipelines.flows.receipts_c2sp_cli import usage_problem
    from pipelines.receipts import logaudit
    from pipelines.store import exports
    from pipelines.store.warehouse import Warehouse, get_meta

    kept, legacy_head, checkpoint = kept_head(args)
    if args.head is not None and kept is None and legacy_head is None and checkpoint is None:
        print("error: --head must be a signed tree head or checkpoint file (receipts head --out) or a 64-hex "
              "row MAC", file=sys.stderr)
        return runner.EXIT_USAGE
    if usage_problem(args):
        print(f"error: {usage_problem(args)}", file=sys.stderr)
        return runner.EXIT_USAGE
    if args.public_key:
        return verify_public(args, kept, legacy_head, checkpoint)
    if args.ledger:
        require_log(args, ledger_dir(args))
    try:
        led = open_ledger(args)
        n_signed = led.complete()
        if n_signed:
            print(f"[forgetful] signed {n_signed} tree head(s) an interrupted append left unsigned", file=sys.stderr)
        v = led.verify(head=legacy_head, min_count=args.min_count)
        st = led.state()
        if kept is not None:
            v["kept_head"] = logaudit.check_kept_head(st, kept, led.public_key())
        if checkpoint is not None:
            from pipelines.flows.receipts_c2sp_cli import check_kept_checkpoint

            v["kept_checkpoint"] = check_kept_checkpoint(checkpoint, led.dir, st, led.public_key(), None)
        if args.all_signatures and st.heads:
            logaudit.check_heads(st, led.public_key(), all_signatures=True)
        out = {"chain_verified": True, "mode": "operator key", **v, "sth": st.heads[-1].to_json() if st.heads else None,
               "forgotten_subjects": len(led.registry())}
        from pipelines.flows.receipts_c2sp_cli import witness_policy

        witnessed = witness_policy(args, led.dir, st, led.public_key(), None)
        if witnessed is not None:
            out["witnessed"] = witnessed
        if Path(args.warehouse).is_file():
            with Warehouse.open(args.warehouse, write=False, ledger_dir=args.ledger, wait=args.wait,
                                reconcile=False) as w:
                present = w.present_registered()  # also those another registry of the source names
                con = w.connect(read_only=True)
                try:
                    applied = get_meta(con, "ledger_seq")
                finally:
                    con.close()
                ex = exports.scan(w.export_entries(), w.exclusion())
            reg = led.registry()
            reinserted = [h for h in present.values()
                          if applied is not None and reg.get(h) is not None and reg[h] <= int(applied)]
            out.update(warehouse_checked=True, pending_erasures=len(present) - len(reinserted),
                       reinserted=len(reinserted), warehouse_records=None if applied is None else int(applied), **ex)
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
            if ex["export_forgotten_rows"] or ex["export_files_unreadable"]:
                print(f"NOT VERIFIED: registered exports hold {ex['export_forgotten_rows']} row(s) of forgotten "
                      f"patients and {ex['export_files_unreadable']} file(s) that cannot be read to show them clean "
                      f"({ex['export_files_not_ours']} of the {ex['export_files_scanned']} files are not the ones "
                      "forgetful wrote); the next writing command rewrites the project's own files, the others are "
                      "yours to delete", file=sys.stderr)
                bad = {**out, "warehouse_verified": False}
                print(json.dumps(bad))
                jsonout.emit(args, bad)
                return 1
            out["warehouse_verified"] = True
    except (LedgerTamperedError, LedgerKeyMismatchError) as exc:
        return fail(args, exc, {"mode": "operator key"})
    print(f"ledger verified: {v['n_rows']} receipts, head {v['head']}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def verify_proof(args) -> int:
    from pipelines.errors import LedgerError, LedgerTamperedError
    from pipelines.flows.receipts_c2sp_cli import load_log_key, usage_problem, verify_tlog_proof
    from pipelines.receipts.c2sp import PROOF_HEADER
    from pipelines.receipts.logaudit import check_proof_file

    if usage_problem(args):
        print(f"error: {usage_problem(args)}", file=sys.stderr)
        return runner.EXIT_USAGE
    pub, _ = load_log_key(args.public_key)
    try:
        head = Path(args.proof).read_bytes()[:len(PROOF_HEADER) + 1]
    except FileNotFoundError:
        raise LedgerError(f"proof file {args.proof} does not exist") from None
    try:
        if head == (PROOF_HEADER + "\n").encode():
            try:
                out = verify_tlog_proof(args, Path(args.proof).read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                raise LedgerTamperedError(0, f"{Path(args.proof).name} is not UTF-8 text") from None
        elif args.witness:
            print("error: --witness applies to a .tlog-proof (its checkpoint's cosignatures)", file=sys.stderr)
            return runner.EXIT_USAGE
        else:
            out = check_proof_file(args.proof, pub)
    except LedgerTamperedError as exc:
        return fail(args, exc)
    print(f"proof verified: {out['kind']}", file=sys.stderr)
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0
