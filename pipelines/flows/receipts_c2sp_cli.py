"""The C2SP side of ``forgetful receipts``: verifier keys, checkpoints, tlog-proofs, witness
requests, the witnesses the log asks, and the auditor's witness policy.

* ``public-key --format vkey`` — the log's verifier key ``<origin>+<key ID>+<base64(0x01 || key)>``
  (https://c2sp.org/signed-note); the origin names this log (:mod:`pipelines.receipts.checkpoints`);
* ``head --format checkpoint`` — the newest checkpoint as a signed note with every cosignature
  the log holds (https://c2sp.org/tlog-checkpoint);
* ``prove --index I --format tlog-proof`` — ``c2sp.org/tlog-proof@v1`` for the entry at
  zero-based index ``I``: ``extra`` is the receipt line exactly as hashed into the leaf, then
  the RFC 6962 inclusion path and the checkpoint (https://c2sp.org/tlog-proof);
* ``prove --since CHECKPOINT --format tlog-witness`` — an ``add-checkpoint`` request body from a
  kept checkpoint (or signed tree head) to the newest (https://c2sp.org/tlog-witness);
* ``verify-proof`` of a ``.tlog-proof`` file, offline, with ``--witness WVKEY --quorum K``;
* ``verify --witness WVKEY [--quorum K] [--witness-url URL]`` — the newest checkpoint must carry
  valid cosignatures of K of the given witnesses; each URL is asked whether it cosigned a
  larger tree (:func:`pipelines.receipts.witness_client.probe`);
* ``witness add --url URL --vkey WVKEY`` / ``list`` / ``remove --vkey WVKEY`` — who the log asks
  (operator); ``add`` asks the new witness at once.

``--public-key`` accepts the vkey too; a vkey also pins the origin (a PEM or hex key trusts the
origin the log states).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from pipelines import jsonout
from pipelines.receipts import c2sp, translog
from pipelines.receipts.checkpoints import Checkpoints, check_witnessed, read_vkey, witness_vkey
from pipelines.runtime import runner


def ledger_dir(args) -> Path:
    """``--ledger``, else the default ledger folder of ``--warehouse``."""
    from pipelines.receipts.ledger import default_dir

    return Path(os.path.abspath(args.ledger)) if args.ledger else default_dir(args.warehouse)  # a link: refused


def load_log_key(path: str):
    """(Ed25519 public key, its :class:`~pipelines.receipts.c2sp.Vkey` or None) from a vkey, PEM
    or hex file."""
    from pipelines.receipts.signing import load_public_key

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8").strip() if p.is_file() else ""
    except UnicodeDecodeError:
        text = ""
    if text.count("+") >= 2 and "\n" not in text:
        v = read_vkey(text, c2sp.ED25519)
        return v.public_key(), v
    return load_public_key(path), None


def log_vkey(store: Checkpoints, pub, given: c2sp.Vkey | None) -> c2sp.Vkey:
    """The log's verifier key: the given vkey, else the origin the ledger folder states."""
    from pipelines.errors import LedgerTamperedError

    if given is not None:
        return given
    origin = store.origin()
    if origin is None:
        raise LedgerTamperedError(0, "the log has published no checkpoint yet (no origin): the operator's "
                                     "`receipts head --format checkpoint` publishes one")
    return c2sp.Vkey.of(origin, pub)


def vkey_text(ledger_dir: Path, key) -> str:
    from pipelines.receipts.signing import log_id

    return c2sp.Vkey.of(Checkpoints(ledger_dir).ensure_origin(log_id(key)), key).text() + "\n"


def newest_note(ledger_dir: Path, st, pub, given: c2sp.Vkey | None, operator: bool) -> str:
    """The checkpoint of the log's current size as a signed note: signed now by the operator, or
    the stored one (checked against the log's key) for an auditor."""
    from pipelines.errors import EmptyLedgerError, LedgerTamperedError
    from pipelines.receipts.signing import load_signing_key

    store = Checkpoints(ledger_dir)
    if operator:
        return store.publish(st, load_signing_key())
    note = store.newest_note(st)
    if note is None:
        raise EmptyLedgerError(f"the log has published no checkpoint of its {st.size} receipts: the operator's next "
                               "forgetful command with witnesses, or `receipts head --format checkpoint`, signs it")
    body, sigs = c2sp.split_note(note)
    if not c2sp.note_verified(body, sigs, log_vkey(store, pub, given)):
        raise LedgerTamperedError(st.size, "the stored checkpoint is not signed by the log's key")
    return note


def prove_text(args, ledger_dir: Path, st, pub, given, operator: bool) -> str:
    """The tlog-proof or add-checkpoint body ``prove`` writes (``--format tlog-proof|tlog-witness``)."""
    from pipelines.receipts import logaudit
    from pipelines.receipts.signing import read_head_file

    note = newest_note(ledger_dir, st, pub, given, operator)
    tree = translog.Tree(st.leaves)
    if args.format == "tlog-proof":
        index = args.index if args.index is not None else args.seq - 1
        return c2sp.tlog_proof_text(index, tree.inclusion_proof(index), note, extra=st.rows[index].line())
    if Path(args.since).read_bytes().lstrip().startswith(b"{"):
        old = read_head_file(args.since)
        logaudit.check_kept_head(st, old, pub, "the given head")
        size = old.tree_size
    else:
        size = check_kept_checkpoint(Path(args.since), ledger_dir, st, pub, given, "the given checkpoint")["tree_size"]
    return c2sp.add_checkpoint_body(size, tree.consistency_proof(size) if 0 < size < st.size else [], note)


def check_kept_checkpoint(path: Path, ledger_dir: Path, st, pub, given, what: str = "the kept checkpoint") -> dict:
    """A checkpoint kept outside the log (``receipts head --format checkpoint``): signed by the
    log's key, and the log extends it (its root at that size, and a consistency proof from it)."""
    from pipelines.errors import LedgerRollbackError, LedgerTamperedError
    from pipelines.receipts import logaudit

    try:
        body, sigs = c2sp.split_note(path.read_text(encoding="utf-8"))
        cp = c2sp.parse_checkpoint(body)
    except (c2sp.NoteError, UnicodeDecodeError) as exc:
        raise LedgerTamperedError(0, f"{path.name} is not a checkpoint ({exc})") from None
    v = given or c2sp.Vkey.of(Checkpoints(ledger_dir).origin() or cp.origin, pub)
    if cp.origin != v.name or not c2sp.note_verified(body, sigs, v):
        raise LedgerTamperedError(cp.size, f"{what} is not signed by the log's key for this log")
    logaudit.check_recorded(st, cp.size, cp.root.hex(), what)
    if 0 < cp.size < st.size:
        proof = translog.Tree(st.leaves).consistency_proof(cp.size)
        if not translog.verify_consistency(cp.size, st.size, cp.root, st.root(), proof):
            raise LedgerRollbackError(cp.size, f"no consistency proof from {what} to the log")
    return {"tree_size": cp.size, "consistent": True}


def verify_tlog_proof(args, text: str) -> dict:
    """Check a ``.tlog-proof`` offline: the log's signature on its checkpoint, the inclusion of
    the ``extra`` bytes at ``index``, and (``--witness``) a quorum of cosignatures."""
    from pipelines.errors import LedgerTamperedError

    pub, given = load_log_key(args.public_key)
    try:
        proof = c2sp.parse_tlog_proof(text)
        body, sigs = c2sp.split_note(proof.note)
        cp = c2sp.parse_checkpoint(body)
    except c2sp.NoteError as exc:
        raise LedgerTamperedError(0, f"{Path(args.proof).name} is not a tlog-proof: {exc}") from None
    v = given or c2sp.Vkey.of(cp.origin, pub)
    if cp.origin != v.name or not c2sp.note_verified(body, sigs, v):
        raise LedgerTamperedError(cp.size, "the proof's checkpoint is not signed by the given log key")
    if proof.extra is None:
        raise LedgerTamperedError(proof.index + 1, "the proof carries no entry (no extra line) to check")
    if not translog.verify_inclusion(proof.index, cp.size, translog.leaf_hash(proof.extra), proof.path, cp.root):
        raise LedgerTamperedError(proof.index + 1, "the inclusion path does not lead to the checkpoint's root")
    cosigned = _quorum(args, body, sigs, cp.size)
    return {"kind": c2sp.PROOF_HEADER, "index": proof.index, "tree_size": cp.size, "origin": cp.origin,
            "cosigned_by": cosigned, "verified": True}


def _quorum(args, body: str, sigs, size: int) -> list[str]:
    from pipelines.errors import LedgerTamperedError

    ws = [witness_vkey(w) for w in args.witness or []]
    ok = [v.name for v in ws if c2sp.cosignature_time(body, sigs, v) is not None]
    need = _needed(args, ws)
    if len(ok) < need:
        raise LedgerTamperedError(size, f"the checkpoint carries valid cosignatures of {len(ok)} of the {need} "
                                        f"required witness(es) ({', '.join(ok) or 'none'})")
    return ok


def _needed(args, ws) -> int:
    return args.quorum if args.quorum is not None else min(1, len(ws))


def usage_problem(args) -> str | None:
    """What is wrong with the witness options of ``verify``/``verify-proof`` (exit 2), or None."""
    n = len(args.witness or [])
    if getattr(args, "witness_url", None) and not n:
        return "--witness-url needs the witnesses' verifier keys (--witness WVKEY)"
    if args.quorum is not None and not (n and 0 <= args.quorum <= n):
        return f"--quorum must be between 0 and the number of --witness keys given ({n})"
    return None


def witness_policy(args, ledger_dir: Path, st, pub, given) -> dict | None:
    """``verify --witness …``: :func:`~pipelines.receipts.checkpoints.check_witnessed`, after
    asking each ``--witness-url`` (the witnesses' answers are verified with their keys)."""
    from pipelines.receipts import witness_client

    if not args.witness:
        return None
    ws = [witness_vkey(w) for w in args.witness]
    store = Checkpoints(ledger_dir)
    v = log_vkey(store, pub, given)
    probes, fresh = [], {}
    urls = args.witness_url or []
    if store.newest_note(st) is None:  # nothing published to ask about: check_witnessed says so (exit 1)
        urls = []
    for url in urls:
        p = witness_client.probe(url, ws, st, newest_note(ledger_dir, st, pub, v, operator=False))
        probes.append(p)
        if p["status"] == "cosigned":
            fresh[p["witness"]] = p["time"]
    out = check_witnessed(st, store, v, ws, _needed(args, ws), fresh)
    return {**out, "asked": probes}


# ----------------------------------------------------------------------- receipts witness …
@runner.cli_errors
def _witness(args) -> int:
    from pipelines.errors import WitnessError
    from pipelines.receipts import witness_client
    from pipelines.receipts.checkpoints import Witness
    from pipelines.receipts.ledger import Ledger
    from pipelines.store.keys import Keys

    d = ledger_dir(args)
    store = Checkpoints(d)
    ws = store.witnesses()
    out: dict = {}
    if args.witness_command == "add":
        w = Witness(witness_client.check_url(args.url), witness_vkey(args.vkey))
        led = Ledger(d, Keys.load(create=False))
        led.signer()  # the log's key must exist before a witness is told about it
        store.set_witnesses([x for x in ws if x.vkey.key_id != w.vkey.key_id or x.name != w.name] + [w])
        out = {"added": w.name, "url": w.url, "asked": witness_client.ask(led, refuse=False)}
    elif args.witness_command == "remove":
        v = witness_vkey(args.vkey)
        keep = [x for x in ws if (x.name, x.vkey.key_id) != (v.name, v.key_id)]
        if len(keep) == len(ws):
            raise WitnessError(f"the log does not ask {v.name}; nothing changed")
        store.set_witnesses(keep)
        out = {"removed": v.name}
    sizes = {}
    for e in store.entries():
        for x in store.witnesses():
            if (e.sig.name, e.sig.key_id) == (x.name, x.vkey.key_id):
                sizes[x.name] = max(sizes.get(x.name, 0), e.size)
    out["witnesses"] = [{"name": x.name, "url": x.url, "vkey": x.vkey.text(), "newest_cosigned_size": sizes.get(x.name)}
                        for x in store.witnesses()]
    print(json.dumps(out, indent=1))
    jsonout.emit(args, out)
    return 0


def add_cli(rs, v, vp, pk, hd, pr) -> None:
    """The C2SP options of ``receipts verify|verify-proof|public-key|head|prove`` and the
    ``receipts witness`` subcommand (called by :func:`pipelines.flows.receipts_cli.add_cli`)."""
    for q in (v, vp):
        q.add_argument("--witness", action="append", default=None, metavar="WVKEY",
                       help="a witness's verifier key (text or file; cosignature/v1): require its cosignature "
                            "(repeat for several; see --quorum)")
        q.add_argument("--quorum", type=int, default=None, metavar="K",
                       help="how many of the --witness keys must have cosigned (default: 1 when any is given)")
    v.add_argument("--witness-url", action="append", default=None, metavar="URL",
                   help="ask this witness (its add-checkpoint prefix) whether it has cosigned a larger tree of "
                        "this log: a restored or forked log is caught without a kept head")
    v.add_argument("--allow-empty", action="store_true",
                   help="accept a ledger folder that is missing or holds no receipt (default: one line, exit 3)")
    hd.add_argument("--format", choices=["json", "checkpoint"], default="json",
                    help="json: the signed tree head; checkpoint: the C2SP checkpoint note with every "
                         "cosignature the log holds (default %(default)s)")
    pr.add_argument("--format", choices=["json", "tlog-proof", "tlog-witness"], default="json",
                    help="json (forgetful's own); tlog-proof: c2sp.org/tlog-proof@v1 of --index/--seq; "
                         "tlog-witness: the add-checkpoint body from --since (default %(default)s)")
    wi = rs.add_parser("witness", help="the transparency-log witnesses this log asks to cosign its checkpoints")
    ws = wi.add_subparsers(dest="witness_command", metavar="{add,list,remove}")
    ws.required = True
    add = ws.add_parser("add", help="ask this witness to cosign every new checkpoint (asked at once)")
    add.add_argument("--url", required=True, metavar="URL", help="the witness's submission prefix (http(s)://…)")
    add.add_argument("--vkey", required=True, metavar="WVKEY", help="the witness's verifier key (text or file)")
    ls = ws.add_parser("list", help="the witnesses and the newest size each has cosigned")
    rm = ws.add_parser("remove", help="stop asking a witness (auditors who require it will see no new cosignature)")
    rm.add_argument("--vkey", required=True, metavar="WVKEY", help="the witness's verifier key (text or file)")
    for q in (add, ls, rm):
        q.add_argument("--warehouse", default="runs/warehouse.duckdb", help="DuckDB warehouse (default: %(default)s)")
        runner.add_lock_args(q)
        jsonout.add_json_arg(q)
        q.set_defaults(func=_witness)

