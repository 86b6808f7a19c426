"""The log asks its witnesses; an auditor asks one (https://c2sp.org/tlog-witness, add-checkpoint).

:func:`ask` runs when a writing command opens its warehouse and again when it is done
(:meth:`pipelines.store.warehouse.Warehouse.open`), only when ``witnesses.json`` names at least
one witness: the log signs the checkpoint of its current size and POSTs it to each witness with a
consistency proof from the size that witness last cosigned. A witness that has cosigned a larger
or another tree stops a build, export or study before it reads a row; a witness that is down never
blocks anything. :func:`probe` is the auditor's question (``receipts verify --witness-url``).
``$FORGETFUL_WITNESS_TIMEOUT`` (seconds, default 5) bounds each request. docs/RECEIPTS.md.
"""
from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from pipelines.errors import LedgerTamperedError, WitnessConflictError, WitnessError
from pipelines.receipts import c2sp, translog
from pipelines.receipts.checkpoints import Checkpoints, Witness
from pipelines.receipts.logaudit import LogState

TIMEOUT_ENV = "FORGETFUL_WITNESS_TIMEOUT"
REUSE_S = 60.0
MAX_RESPONSE = 64 * 1024
_asked: dict[str, tuple[float, tuple, list[dict]]] = {}  # ledger dir -> (when, its files, outcomes)


class WitnessDown(Exception):
    """The witness could not be reached (or answered with a server error)."""


def _timeout() -> float:
    try:
        return max(0.1, float(os.environ.get(TIMEOUT_ENV, "5")))
    except ValueError:
        return 5.0


def check_url(url: str) -> str:
    """An ``http(s)://host[:port][/prefix]`` submission prefix, without a trailing slash."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
        raise WitnessError(f"{url!r} is not an http(s):// witness URL (its submission prefix)")
    return url.rstrip("/")


def post(url: str, body: str) -> tuple[int, str, str]:
    """``POST <url>/add-checkpoint``: (status, content type, body text). Loopback addresses
    bypass any configured HTTP proxy. Raises :class:`WitnessDown`."""
    req = urllib.request.Request(check_url(url) + "/add-checkpoint", data=body.encode("utf-8"), method="POST",
                                 headers={"Content-Type": "text/plain; charset=utf-8"})
    host = urllib.parse.urlsplit(url).hostname
    handlers = [urllib.request.ProxyHandler({})] if host in ("127.0.0.1", "localhost", "::1") else []
    try:
        with urllib.request.build_opener(*handlers).open(req, timeout=_timeout()) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read(MAX_RESPONSE).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        if e.code >= 500:
            raise WitnessDown(f"HTTP {e.code}") from None
        return e.code, e.headers.get("Content-Type", ""), e.read(MAX_RESPONSE).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise WitnessDown(str(getattr(e, "reason", e)) or type(e).__name__) from None


def _size(ctype: str, text: str) -> int | None:
    """The witness's size from a ``409`` answer (``text/x.tlog.size``), None if malformed."""
    if ctype.split(";")[0].strip() != "text/x.tlog.size" or not text.endswith("\n"):
        return None
    try:
        return c2sp.decimal(text[:-1], "size")
    except c2sp.NoteError:
        return None


def _cosignatures(text: str, body: str, v: c2sp.Vkey) -> tuple[int | None, list[c2sp.Signature]]:
    """(timestamp, the signature lines of ``v``) of a ``200`` answer; (None, []) if none verifies."""
    try:
        sigs = [c2sp.Signature.parse(x) for x in text.rstrip("\n").split("\n")] if text.endswith("\n") else []
    except c2sp.NoteError:
        return None, []
    t = c2sp.cosignature_time(body, sigs, v)
    return t, ([s for s in sigs if (s.name, s.key_id) == (v.name, v.key_id)] if t is not None else [])


def submit(w: Witness, st: LogState, note: str, known: int) -> dict:
    """Ask ``w`` to cosign ``note`` (the checkpoint of ``st``), starting from the size ``known``
    the log believes it last cosigned; :func:`ask` lists the outcomes."""
    body, _ = c2sp.split_note(note)
    n, old, http = st.size, min(known, st.size), []
    tree = translog.Tree(st.leaves)
    for _ in range(3):
        proof = tree.consistency_proof(old) if 0 < old < n else []
        status, ctype, text = post(w.url, c2sp.add_checkpoint_body(old, proof, note))
        http.append(status)
        if status == 200:
            t, sigs = _cosignatures(text, body, w.vkey)
            if t is None:
                return {"status": "refused", "http": http, "detail": "no valid cosignature of its key in the answer"}
            return {"status": "cosigned", "http": http, "time": t, "sigs": sigs}
        if status == 409:
            s = _size(ctype, text)
            if s is None:
                return {"status": "refused", "http": http, "detail": "a 409 answer without its size"}
            if s > n:
                return {"status": "ahead", "http": http, "size": s}
            if s == old:  # the same size with another root
                return {"status": "forked", "http": http, "size": s}
            old = s
            continue
        if status == 422:
            return {"status": "forked", "http": http, "size": old}
        return {"status": "refused", "http": http, "detail": f"HTTP {status}"}
    return {"status": "forked", "http": http, "size": old}


def _cosigned(store: Checkpoints, st: LogState, w: Witness) -> set[int]:
    """The sizes of this log (roots matching) with a stored cosignature of ``w``."""
    return {e.size for e in store.entries() if (e.sig.name, e.sig.key_id) == (w.name, w.vkey.key_id)
            and e.size <= st.size and e.root == st.root(e.size)}


def _say(w: Witness, o: dict, n: int, refuse: bool) -> None:
    if o["status"] == "down":
        print(f"[forgetful] witness {w.name} is unreachable ({o['detail']}): the checkpoint of {n} receipts is not "
              "cosigned yet; the next forgetful command asks again", file=sys.stderr)
    elif o["status"] == "refused":
        print(f"[forgetful] witness {w.name} refused the checkpoint of {n} receipts ({o['detail']}): check that it "
              "trusts this log's verifier key (forgetful receipts public-key --format vkey)", file=sys.stderr)
    elif o["status"] in ("ahead", "forked") and not refuse:
        print(f"[forgetful] WARNING: {conflict_line(w.name, o, n)}; builds and exports are refused until it is "
              "resolved", file=sys.stderr)


def conflict_line(who: str, o: dict, n: int) -> str:
    """What a witness's conflicting answer ``o`` means, for a log of ``n`` receipts."""
    if o["status"] == "ahead":
        return (f"witness {who} has cosigned {o['size']} receipts of this log, which holds {n}: the log was "
                "restored from a backup or forked (HTTP 409)")
    return (f"witness {who} has cosigned another tree of {o['size']} receipts of this log: the log was forked "
            f"or rewritten (HTTP {o['http'][-1]})")


def _files(d) -> tuple:
    """Identity of the log's files (a restore or an append changes it)."""
    out = []
    for name in ("receipts.jsonl", "heads.jsonl", "checkpoints.jsonl", "witnesses.json"):
        try:
            s = os.stat(d / name)
            out.append((s.st_ino, s.st_size, s.st_mtime_ns))
        except FileNotFoundError:
            out.append(None)
    return tuple(out)


def ask(led, refuse: bool = True) -> list[dict]:
    """Publish the log's newest checkpoint and ask every configured witness to cosign it (see
    the module docstring). Returns one outcome per witness (no witnesses: nothing, no I/O).

    As far as the log knows the witness's size; a ``409`` answer names the witness's size and the
    request is made once more from there. Outcomes:

    * ``cosigned`` — the cosignature is checked with the witness's verifier key and stored beside
      the checkpoint (it then appears in ``receipts head --format checkpoint`` and every tlog-proof);
    * ``ahead`` — the witness has cosigned a *larger* tree of this log (``409`` naming a larger
      size), ``forked`` — another tree of a size this log has (``409`` at the same size, or ``422``:
      its tree is not a prefix of this log): the log was restored or forked. With ``refuse`` (builds,
      exports, studies) :class:`~pipelines.errors.WitnessConflictError` stops the command before it
      reads a row; a forget goes on (it only removes data) and says so;
    * ``down`` — unreachable, timed out, or a server error: never blocks anything; the checkpoint is
      cosigned on a later command (``receipts verify --witness`` lists what lacks it);
    * ``refused`` — ``403`` (the witness does not trust this log's key), ``404`` (unknown origin),
      ``400``: a configuration to fix; said on stderr.

    One command asks once per log state: a nested open reuses the answers while the log's files
    are the very same (inode, size, modification time) and for at most :data:`REUSE_S` seconds, so
    a restored or edited folder is always asked about afresh; a witness that was down or refused is
    asked again at every open (it may be back). The first cosignature of each checkpoint is stored;
    later answers for it confirm it.
    """
    store = Checkpoints(led.dir)
    ws = store.witnesses()
    if not ws:
        return []
    st = led.state()
    hit = _asked.get(str(led.dir))
    if hit is not None and hit[1] == _files(led.dir) and time.monotonic() - hit[0] < REUSE_S:
        outcomes = hit[2]
    else:
        note = store.publish(st, led.signer())
        outcomes = []
        for w in ws:
            have = _cosigned(store, st, w)
            try:
                o = submit(w, st, note, max(have, default=0))
            except WitnessDown as exc:
                o = {"status": "down", "http": [], "detail": str(exc)}
            sigs = o.pop("sigs", [])
            if o["status"] == "cosigned" and st.size not in have:  # the first cosignature of a checkpoint
                store.add(st.size, st.root(), sigs)  # is kept; later answers confirm it
            _say(w, o, st.size, refuse)
            outcomes.append({"witness": w.name, "url": w.url, **o})
        if all(o["status"] not in ("down", "refused") for o in outcomes):
            _asked[str(led.dir)] = (time.monotonic(), _files(led.dir), outcomes)
    bad = [(w, o) for w, o in zip(ws, outcomes) if o["status"] in ("ahead", "forked")]
    if refuse and bad:
        w, o = bad[0]
        raise WitnessConflictError(o.get("size", st.size), (
            f"{conflict_line(w.name, o, st.size)}. Put the newer log back (docs/RECEIPTS.md, Witnesses); if it is "
            "lost, "
            f"`forgetful receipts accept-rollback` and `forgetful receipts witness remove --vkey {w.vkey.text()}`: "
            "auditors who require that witness then see the fork; nothing was read or written"))
    return outcomes


def probe(url: str, witnesses: list[c2sp.Vkey], st: LogState, note: str) -> dict:
    """The auditor asks the witness at ``url`` about the log's newest checkpoint ``note``
    (``old`` = its size, no proof): a cosignature by one of ``witnesses`` counts as fresh; a
    larger or another tree raises :class:`WitnessConflictError`. Nothing is advanced.

    The log's newest checkpoint with ``old`` equal to its own size, which a witness that cosigned a
    larger tree answers with ``409`` and its size; nothing is advanced.
    """
    body, _ = c2sp.split_note(note)
    try:
        status, ctype, text = post(url, c2sp.add_checkpoint_body(st.size, [], note))
    except WitnessDown as exc:
        raise WitnessError(f"the witness at {url} could not be asked ({exc}); nothing was verified") from None
    if status == 200:
        for v in witnesses:
            t, _ = _cosignatures(text, body, v)
            if t is not None:
                return {"url": url, "status": "cosigned", "witness": v.name, "time": t}
        return {"url": url, "status": "refused", "detail": "its answer holds no valid cosignature of a given key"}
    if status == 409:
        s = _size(ctype, text)
        if s is None:
            raise LedgerTamperedError(st.size, f"the witness at {url} answered 409 without its size")
        if s >= st.size:
            raise WitnessConflictError(st.size + 1 if s > st.size else st.size, conflict_line(
                f"at {url}", {"status": "ahead" if s > st.size else "forked", "size": s, "http": [409]}, st.size))
        return {"url": url, "status": "behind", "size": s}
    return {"url": url, "status": "refused", "detail": f"HTTP {status}"}
