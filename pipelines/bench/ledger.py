"""How long the receipt log takes to verify at a given size (a command, never a timed test).

``python -m pipelines.bench.ledger --rows 10000 --repeat 5 [--json OUT]`` writes a synthetic log
of ``rows`` receipts (payloads shaped like real ones, keyed hashes of made-up ids) into a
temporary folder with throw-away keys — built directly, not by ``rows`` appends — then times,
interleaved ``repeat`` times: the auditor's public verification (newest signature + head chain,
and every signature), the operator's keyed verification, one more append, and one inclusion and
one consistency proof. Prints the median and range (seconds) of each as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from sv_core.jsonfile import write_json


def build_log(directory: Path, rows: int, keys, key) -> None:
    """``rows`` receipts and their signed heads, written in one pass."""
    from pipelines.receipts import logaudit, signing, translog
    from pipelines.receipts.logaudit import GENESIS, Row

    prev, lines, leaves = GENESIS, [], []
    for i in range(1, rows + 1):
        payload = {"certified": True, "n_stays": 1 + i % 3, "rows_deleted": {"cohort_stays": 1 + i % 3,
                   "vitals_hourly": 48 * (1 + i % 3)}, "stay_id_hashes": [keys.stay_hash(i)],
                   "contexts": [{"action": "decrement", "context_id": i % 97, "certified": True,
                                 "max_abs_score_dev": 1.1e-15 * (i % 7)}]}
        r = Row(i, "2026-01-01T00:00:00Z", "forget_subject", keys.subject_hash(10_000_000 + i), payload,
                keys.fingerprint, prev, "")
        r = Row(**{**r.to_json(), "mac": keys.mac("ledger", r.body())})
        lines.append(r.line())
        leaves.append(translog.leaf_hash(r.line()))
        prev = r.mac
    directory.mkdir(parents=True, exist_ok=True)
    (directory / logaudit.FILE).write_bytes(b"".join(x + b"\n" for x in lines))
    hp, heads = signing.ZERO, []
    for i, root in enumerate(translog.prefix_roots(leaves), start=1):
        h = signing.sign_head(key, i, root, hp)
        heads.append(h.line())
        hp = h.digest()
    (directory / logaudit.HEADS).write_text("".join(x + "\n" for x in heads))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="forgetful-bench-ledger-") as tmp:
        os.environ["FORGETFUL_CONFIG_DIR"] = str(Path(tmp) / "config")
        os.environ.pop("FORGETFUL_LEDGER_KEY", None)
        from pipelines.receipts import logaudit, translog
        from pipelines.receipts.ledger import Ledger
        from pipelines.receipts.signing import load_signing_key
        from pipelines.store.keys import Keys

        keys = Keys.load(create=True)
        key = load_signing_key(create=True)
        pub = key.public_key()
        d = Path(tmp) / "ledger"
        t0 = time.perf_counter()
        build_log(d, a.rows, keys, key)
        built = time.perf_counter() - t0
        led = Ledger(d, keys)
        led.complete()  # writes the signed anchor
        kept = logaudit.LogState.read(d).heads[a.rows // 2]

        def proofs():
            st = logaudit.LogState.read(d)
            t = translog.Tree(st.leaves)
            return t.inclusion_proof(st.size // 3), t.consistency_proof(kept.tree_size)

        cases = {
            "public verify (newest signature + chain, anchor, kept head)": lambda: logaudit.audit(d, pub, kept=kept),
            "public verify, every signature": lambda: logaudit.audit(d, pub, kept=kept, all_signatures=True),
            "operator verify (HMAC chain + heads + anchor)": led.verify,
            "one inclusion and one consistency proof": proofs,
        }
        cases["append one receipt"] = lambda: led.append("forget_subject", keys.subject_hash(1),
                                                         {"n_stays": 0, "certified": True})
        times: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(a.repeat):
            for name, fn in cases.items():
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    out = {"rows": a.rows, "repeat": a.repeat, "build_s": round(built, 2), "load_avg": os.getloadavg(),
           "seconds": {k: {"median": round(statistics.median(v), 4), "min": round(min(v), 4), "max": round(max(v), 4),
                           "cpu_median": round(statistics.median(cpu[k]), 4)} for k, v in times.items()}}
    print(json.dumps(out, indent=1))
    if a.json:
        write_json(a.json, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
