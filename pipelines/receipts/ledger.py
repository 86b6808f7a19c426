"""The deletion-receipt ledger and forget registry: an append-only log of receipts in its own
folder, never inside the (rebuildable) warehouse, keyed for the operator and signed for everyone.

File ``<ledger dir>/receipts.jsonl``, one canonical JSON object per line (the row format and the
MAC chain: :class:`Ledger`); each line is a leaf of an RFC 9162 Merkle tree
(:mod:`pipelines.receipts.translog`) whose heads the log signs with its Ed25519 key
(:mod:`pipelines.receipts.signing`), so anyone with the public key checks the log
(:mod:`pipelines.receipts.logaudit`) without being able to write a row; anchors and the
warehouse's record refuse a rolled-back log (:class:`LedgerRollbackError`). The *registry* is the
set of ``subject_id_hash`` values of ``forget_subject`` rows: every build excludes those subjects
at scan time, and every command completes pending erasures first. docs/RECEIPTS.md.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from pipelines.errors import LedgerError, LedgerKeyMismatchError, LedgerTamperedError
from pipelines.receipts import logaudit, signing, translog
from pipelines.receipts.logaudit import FILE, GENESIS, HEADS, LogState, Row, canonical_json  # noqa: F401  (public names)
from pipelines.store.keys import Keys
from pipelines.store.safe_io import open_nofollow, refuse_link

LEDGER_ENV = "FORGETFUL_LEDGER_DIR"
FORGET_KIND = "forget_subject"
ROLLBACK_KIND = "rollback_accepted"


def default_dir(warehouse: str | os.PathLike) -> Path:
    """``$FORGETFUL_LEDGER_DIR``, else ``<warehouse folder>/forget-registry`` (absolute; the last
    component is never resolved, so a link in its place is seen and refused by :class:`Ledger`)."""
    env = os.environ.get(LEDGER_ENV)
    if env:
        return Path(os.path.abspath(Path(env).expanduser()))
    return Path(warehouse).resolve().parent / "forget-registry"


def log_exists(directory: str | os.PathLike) -> bool:
    """Does ``directory`` hold a receipt log (a non-empty ``receipts.jsonl``)?"""
    try:
        return os.lstat(Path(directory) / FILE).st_size > 0
    except (FileNotFoundError, NotADirectoryError):
        return False


def _append_line(path: Path, line: str) -> None:
    """Append one line, fsynced; a failed or short write (disk full) is cut back off, so the file
    never ends in half a line."""
    new = not path.exists()
    data = (line + "\n").encode("ascii")
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "receipt log file")
    try:
        size = os.fstat(fd).st_size
        try:
            if os.write(fd, data) != len(data):
                raise OSError(28, f"short write to {path.name} (disk full?)")
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
    if new:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


#: the same fsynced append, cut back on failure, for the log's other append-only files (its C2SP
#: checkpoints and cosignatures: :mod:`pipelines.receipts.checkpoints`)
append_line = _append_line


def _cut_back(sizes: list[tuple[Path, int | None]]) -> None:
    """Return each file to its recorded size (None: it did not exist), fsynced: an append whose
    signed head could not be written leaves neither the receipt nor a head."""
    for f, size in sizes:
        if size is None:
            f.unlink(missing_ok=True)
            continue
        fd = open_nofollow(f, os.O_WRONLY, "receipt log file")
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)


class Ledger:
    """One ledger directory under one key. Reading verifies the whole log every time (HMAC
    chain, Merkle roots, the newest head's signature, the anchor), so a caller never acts on a
    tampered registry.

    Row::

        {"seq": 1, "ts": "...", "kind": "forget_subject", "subject_id_hash": "<hmac>",
         "payload": {...aggregates...}, "key_fp": "<16 hex>", "prev": "<mac of seq-1>", "mac": "<hmac>"}

    * ``seq`` counts 1, 2, 3, … without gaps; ``prev`` is the previous row's ``mac`` (64 zeros first);
    * ``mac`` = HMAC-SHA256 under the ledger sub-key (:mod:`pipelines.store.keys`) of the canonical
      JSON of every other field; ``key_fp`` is the key's public fingerprint (another key is refused,
      :class:`LedgerKeyMismatchError`). Subject and stay ids are keyed hashes: the id space is small
      enough to brute-force a plain hash;
    * after every append the log signs a tree head into ``heads.jsonl``;
    * **no rollback**: every append also stores the new signed head as the *anchor* in the config
      folder (beside the keys, not beside the ledger), and a warehouse records the size and root
      it has applied (:meth:`record`). A log shorter than, or inconsistent with, any of them
      is refused (:class:`LedgerRollbackError`).

    Appends are serialised by an exclusive lock on ``<ledger dir>/.lock`` and fsynced before return;
    a receipt is committed together with its signed head or not at all (a failed head write cuts the
    row back off; only a kill between the two leaves an unsigned tail, which the next writer signs).
    No symbolic link is followed: the log folder, its files, the anchors folder and the anchor are
    checked before every read and write (:meth:`check_links`) and opened with ``O_NOFOLLOW``.
    """

    def __init__(self, directory: str | os.PathLike, keys: Keys):
        given = Path(os.path.abspath(directory))
        refuse_link(given, "receipt log folder")  # resolve() below would follow it
        self.dir = given.resolve()
        self.path = self.dir / FILE
        self.heads_path = self.dir / HEADS
        self.keys = keys
        self._signer = None
        self._verified: tuple | None = None  # (file signature, LogState) of the last full verification

    # -- keys ----------------------------------------------------------------------------
    def signer(self, create: bool = False):
        """The log's Ed25519 private key (created in the config folder on the first append)."""
        if self._signer is None:
            self._signer = signing.load_signing_key(create=create)
        return self._signer

    def public_key(self):
        return self.signer().public_key()

    # -- anchors -------------------------------------------------------------------------
    def anchor(self):
        """The anchor's signed head (or a legacy ``{"seq", "head"}``), None when absent."""
        return logaudit.read_anchor(self.path)

    def check_links(self) -> None:
        """Refuse (:class:`~pipelines.errors.UnsafePathError`, nothing written) a symbolic link in
        place of the log folder or of anything in it (receipts, signed heads, lock, checkpoints,
        witnesses), of the configuration or anchors folder, or of this log's anchor."""
        a = logaudit.anchor_path(self.path)
        for f, what in ((self.dir, "receipt log folder"), (a.parent.parent, "configuration folder"),
                        (a.parent, "anchors folder"), (a, "anchor")):
            refuse_link(f, what)
        try:
            entries = list(os.scandir(self.dir))
        except (FileNotFoundError, NotADirectoryError):
            return
        for e in entries:
            if e.is_symlink():
                refuse_link(e.path, "receipt log file")

    def _write_anchor(self, head: signing.TreeHead) -> None:
        p = logaudit.anchor_path(self.path)
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)  # a killed writer's leftover, or a planted link (removed, never followed)
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "anchor")
        with os.fdopen(fd, "w") as fh:
            fh.write(canonical_json({"head": head.to_json(), "ledger": str(self.path)}))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)

    # -- reading -------------------------------------------------------------------------
    def _signature(self) -> tuple:
        """Identity of the files a verification read (inode, size, mtime and ctime in ns)."""
        out: list[tuple | None] = []
        for f in (self.path, self.heads_path, logaudit.anchor_path(self.path), signing.signing_key_file()):
            try:
                s = os.stat(f)
                out.append((s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns))
            except FileNotFoundError:
                out.append(None)
        return (self.keys.fingerprint, *out)

    def state(self, check_anchor: bool = True) -> LogState:
        """The verified log (see :meth:`verify`); ``check_anchor=False`` only for the recovery.
        A full verification is repeated whenever any file it read changed (a command reads the
        registry many times; an unchanged log is not re-hashed within one process)."""
        self.check_links()
        sig = self._signature()
        if check_anchor and self._verified is not None and self._verified[0] == sig:
            return self._verified[1]
        st = self._state(check_anchor)
        if check_anchor:
            self._verified = (sig, st)
        return st

    def _state(self, check_anchor: bool) -> LogState:
        st = LogState.read(self.dir)
        fp = self.keys.fingerprint
        logaudit.check_rows(st.rows)
        for r in st.rows:
            if r.key_fp != fp:
                raise LedgerKeyMismatchError(
                    f"receipt {r.seq} was written under key fingerprint {r.key_fp}, the configured key is {fp}: "
                    "restore the original key (see README, deletion guarantees)")
            if not Keys.equal(self.keys.mac("ledger", r.body()), r.mac):
                raise LedgerTamperedError(r.seq, "mac does not match the row's content (edited or forged)")
        # a reader without the signing key still checks the heads' chain and roots (the rows are
        # authenticated by their MACs); a writer needs the key (:meth:`_sign_tail`)
        pub = self.public_key() if signing.signing_key_file().exists() else None
        if pub is not None and st.heads and st.heads[-1].log_id != signing.log_id(pub):
            raise LedgerKeyMismatchError("the log's tree heads were signed by another key than the configured "
                                         f"signing key {signing.signing_key_file()}: restore the original key")
        logaudit.check_heads(st, pub, allow_unsigned_tail=True)  # rows are authenticated by their MACs
        a = self.anchor() if check_anchor else None
        if isinstance(a, dict):  # a legacy unsigned anchor: accepted only for a log that predates signing
            if st.heads:
                raise LedgerTamperedError(a["seq"], "the anchor is not a signed tree head (forged)")
            if a["seq"] > st.size:
                raise logaudit.LedgerRollbackError(
                    st.size + 1, f"the ledger holds {st.size} rows but its anchor records {a['seq']} (rows or the "
                                 "whole ledger deleted)")
            if a["seq"] > 0 and not Keys.equal(st.rows[a["seq"] - 1].mac, a["head"]):
                raise logaudit.LedgerRollbackError(a["seq"], "row does not match the anchored head (ledger replaced "
                                                             "or rolled back)")
        elif a is not None:
            logaudit.check_kept_head(st, a, pub, "the anchor")
        return st

    def verify(self, head: str | None = None, min_count: int | None = None) -> dict:
        """Check every row (MAC, link, key), every signed head, the stored anchor and
        (optionally) an auditor's head MAC / minimum count. Returns ``{"n_rows", "head", "root",
        "key_fp", "anchor", "unsigned"}``; raises :class:`LedgerTamperedError` (a rollback:
        :class:`LedgerRollbackError`) or :class:`LedgerKeyMismatchError`."""
        st = self.state()
        rows = st.rows
        logaudit.check_legacy(rows, head, min_count)
        a = self.anchor()
        anchor = ("none" if a is None else f"seq {a['seq']} matched (unsigned, legacy)" if isinstance(a, dict)
                  else f"size {a.tree_size} consistent")
        return {"n_rows": len(rows), "head": rows[-1].mac if rows else GENESIS, "root": st.root().hex(),
                "key_fp": self.keys.fingerprint, "anchor": anchor, "unsigned": len(rows) - len(st.heads)}

    def rows(self) -> list[Row]:
        """Verified rows, in order."""
        return self.state().rows

    def registry(self) -> dict[str, int]:
        """Forgotten subjects: subject hash -> receipt seq (verified first)."""
        return {r.subject_id_hash: r.seq for r in self.rows() if r.kind == FORGET_KIND}

    def head(self) -> tuple[int, str]:
        v = self.verify()
        return v["n_rows"], v["head"]

    def record(self) -> dict[str, str]:
        """What a warehouse records about the log it reflects: size, newest MAC, Merkle root."""
        st = self.state()
        return {"ledger_seq": str(st.size), "ledger_head": st.rows[-1].mac if st.rows else GENESIS,
                "ledger_root": st.root().hex()}

    def check_recorded(self, meta: dict, what: str, st: LogState | None = None) -> None:
        """Refuse a log that is shorter than, or inconsistent with, a record ``meta`` (the keys of
        :meth:`record`; absent keys are not checked) made by ``what``."""
        if meta.get("ledger_seq") is None:
            return
        st = st or self.state()
        n = int(meta["ledger_seq"])
        logaudit.check_recorded(st, n, meta.get("ledger_root"), what)
        mac = meta.get("ledger_head")
        if n and mac is not None and not Keys.equal(st.rows[n - 1].mac, mac):
            raise logaudit.LedgerRollbackError(n, f"receipt {n} is not the one {what} recorded (the log was rewritten)")

    # -- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):
        self.check_links()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = open_nofollow(self.dir / ".lock", os.O_RDWR | os.O_CREAT, "receipt log lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _sign_tail(self, st: LogState) -> list[signing.TreeHead]:
        """Sign a head for every tree size that has none (an interrupted append, or a log from
        before signing); the rows were authenticated by their MACs. Caller holds the lock."""
        key = self.signer(create=not st.heads)  # never a new key for a log that has signed heads
        prev = st.heads[-1].digest() if st.heads else signing.ZERO
        new = []
        for size in range(len(st.heads) + 1, st.size + 1):
            h = signing.sign_head(key, size, st.root(size), prev)
            _append_line(self.heads_path, h.line())
            new.append(h)
            prev = h.digest()
        if new:
            self._write_anchor(new[-1])
        elif st.heads and not isinstance(self.anchor(), signing.TreeHead):
            self._write_anchor(st.heads[-1])  # a legacy or missing anchor: store the signed one
        return new

    def complete(self) -> int:
        """Sign any receipt that has no signed head yet (and replace a legacy anchor); returns how
        many heads were signed. Nothing is created for a log that needs nothing."""
        st = self.state()
        if st.size == len(st.heads) and (not st.heads or isinstance(self.anchor(), signing.TreeHead)):
            return 0
        with self._locked():
            return len(self._sign_tail(self.state()))

    def append(self, kind: str, subject_id_hash: str, payload: dict, ts: str | None = None) -> Row:
        """Append one receipt (aggregates only in ``payload``) and sign the new tree head;
        durable (fsynced) on return."""
        if not kind or not isinstance(kind, str):
            raise LedgerError(f"kind must be a non-empty string, got {type(kind).__name__}")
        try:
            canonical_json(payload)
        except (TypeError, ValueError) as exc:
            raise LedgerError(f"receipt payload is not canonical JSON: {exc}") from exc
        with self._locked():
            st = self.state()
            self.signer(create=not st.heads)  # before the row: a missing key must not leave it unsigned
            self._sign_tail(st)
            seq, prev = st.size, st.rows[-1].mac if st.rows else GENESIS
            row = Row(seq + 1, ts or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), kind, str(subject_id_hash),
                      json.loads(canonical_json(payload)), self.keys.fingerprint, prev, "")
            row = Row(**{**row.to_json(), "mac": self.keys.mac("ledger", row.body())})
            sizes = [(f, f.stat().st_size if f.exists() else None) for f in (self.path, self.heads_path)]
            _append_line(self.path, row.line().decode("ascii"))
            try:
                self._sign_tail(self.state())
            except Exception:  # a receipt is committed with its signed head, or not at all (an interrupt
                _cut_back(sizes)  # or a kill leaves an unsigned tail, which the next writer signs)
                raise
        return row

    # -- auditor exports -----------------------------------------------------------------
    def export(self, out_dir: str | os.PathLike) -> dict:
        """Write ``receipt-<seq>.json`` per row and ``head.json`` (the newest signed tree head,
        for ``receipts verify --head``); returns the head record."""
        with self._locked():
            self._sign_tail(self.state())
        st = self.state()
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for r in st.rows:
            (out / f"receipt-{r.seq:06d}.json").write_text(json.dumps(r.to_json(), indent=1, sort_keys=True) + "\n")
        sth = st.heads[-1].to_json() if st.heads else None
        if sth is not None:
            (out / "head.json").write_text(json.dumps(sth, indent=1, sort_keys=True) + "\n")
        return {"n_rows": st.size, "head": st.rows[-1].mac if st.rows else GENESIS, "root": st.root().hex(),
                "sth": sth}

    def summary(self) -> dict:
        """Aggregates only (no hashes of ids): counts, chain status, head, last deletion time."""
        try:
            v = self.verify()
            rows = self.state().rows
            ok, where, reason = True, None, None
        except LedgerTamperedError as exc:
            rows, v, ok, where, reason = [], {"n_rows": 0, "head": None}, False, exc.seq, exc.reason
        by_kind: dict[str, int] = {}
        for r in rows:
            by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
        certified = sum(bool(r.payload.get("certified")) for r in rows)
        return {"count": v["n_rows"], "certified": certified, "by_kind": by_kind, "chain_verified": ok,
                "first_bad_seq": where, "reason": reason, "head": v["head"],
                "last_ts": rows[-1].ts if rows else None}


def tree_of(st: LogState) -> translog.Tree:
    """The Merkle tree of a log state (for proofs)."""
    return translog.Tree(st.leaves)
