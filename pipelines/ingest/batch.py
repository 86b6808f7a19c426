"""The stays of one watermark step, recomputed in batches (:mod:`pipelines.ingest`).

A step first *stages* its files (rows, watermark, file records; one transaction). Then the
affected stays (:func:`affected_stays`: a newly closed hour, or a late row of this step in an
already emitted hour) are recomputed in batches of consecutive stay ids, **one committed
transaction per batch**: the batch's hours ``[r0, r1)`` (causal fill, frozen z-scores), their
``vitals_hourly`` rows, the token-map changes and the per-stay gates, each saved with the step
number. A batch already committed is not affected any more (its gates carry the step), so a run
killed anywhere redoes only uncommitted batches: nothing is admitted twice.

Cost per batch does not grow with the warehouse: every read and write is limited to the
batch's stay-id range (DuckDB zone maps; the tables are appended in stay order), raw rows are
read only from steps whose watermark reaches the batch's first re-computed hour, the stored
token map is diffed (only changed rows are rewritten), and a stored gate whose MAC matches is
loaded without re-verifying full-history KKT over its cold tier (the MAC authenticates the
state this code wrote after its own certificate; ``StreamingGate.from_state`` still checks the
structure and the hot tier's KKT). Gate updates are pure functions of arrays
(:func:`pipelines.ingest.gates.update_stay`) and may run in worker processes; results do not
depend on the number of workers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from cohort.constants import VITALS
from cohort.incremental import STAYS_TABLE, causal_rows, closed_hours, out_table
from pipelines.ingest import state as st
from pipelines.ingest.state import IngestError

HOUR_MS = 3_600_000
HOUR_US = 3_600_000_000
Z_COLS = [f"{v}_z" for v in VITALS]
BATCH_STAYS = 2000        # stays per batch (one transaction each)
BATCH_TOKENS = 1_000_000  # ... or fewer, so that the batch's stored token maps stay bounded


@dataclass(frozen=True)
class StepParams:
    """What every batch of a step needs: the step number and watermark, gate parameters and
    the frozen standardisation (mean, sd, median: (6,) arrays)."""

    step: int
    w_new: int | None
    C: float
    sigma: float
    mean: np.ndarray
    sd: np.ndarray
    median: np.ndarray


# ------------------------------------------------------------------------ which stays
def affected_stays(con, step: int, w_new: int | None) -> dict[str, np.ndarray]:
    """Stays of the cohort that step ``step`` still has to recompute, sorted by stay id.

    Emitted hours are the gate's live-token count (one live token per closed hour). Late rows
    are this step's rows in an hour the stay has emitted. A stay whose gate was saved by this
    step is done. Returns arrays ``ids, subject, n_hours, in_us, em, r0, r1``."""
    q = (f"WITH late AS (SELECT r.stay_id, min(least(r.ms // {HOUR_MS}, t.n_hours - 1)) AS lmin "
         f"FROM {st.ROWS} r JOIN {STAYS_TABLE} t USING (stay_id) JOIN {st.GATES} g USING (stay_id) "
         f"WHERE r.step = {int(step)} AND g.step < {int(step)} AND least(r.ms // {HOUR_MS}, t.n_hours - 1) < g.n_live "
         "GROUP BY r.stay_id) "
         "SELECT t.stay_id, t.subject_id, t.n_hours, t.in_us, t.out_us, coalesce(g.n_live, 0) AS em, "
         "coalesce(g.step, -1) AS gstep, coalesce(late.lmin, 2147483647) AS lmin "
         f"FROM {STAYS_TABLE} t JOIN cohort_stays c USING (stay_id) LEFT JOIN {st.GATES} g USING (stay_id) "
         "LEFT JOIN late USING (stay_id) ORDER BY t.stay_id")
    t = {k: np.asarray(v) for k, v in con.execute(q).fetchnumpy().items()}
    em = t["em"].astype(np.int64)
    closed = closed_hours(w_new, t["in_us"], t["out_us"], t["n_hours"])
    lm = t["lmin"].astype(np.int64)
    aff = (t["gstep"] < step) & ((closed > em) | (lm < em))
    return {"ids": t["stay_id"][aff].astype(np.int64), "subject": t["subject_id"][aff].astype(np.int64),
            "n_hours": t["n_hours"][aff].astype(np.int64), "in_us": t["in_us"][aff].astype(np.int64),
            "em": em[aff], "r0": np.minimum(em, lm)[aff], "r1": closed[aff].astype(np.int64)}


def batches(todo: dict[str, np.ndarray], max_stays: int = BATCH_STAYS, max_tokens: int = BATCH_TOKENS):
    """Consecutive slices of ``todo`` with at most ``max_stays`` stays and (unless a single
    stay exceeds it) ``max_tokens`` stored plus new tokens."""
    n = todo["ids"].size
    size = todo["r1"]  # the stay's token map after the step
    lo = 0
    while lo < n:
        c = np.cumsum(size[lo:lo + max_stays])
        k = max(1, int(np.searchsorted(c, max_tokens, side="right")))
        yield slice(lo, lo + k)
        lo += k


def step_floor(con, batch: dict[str, np.ndarray], current: int) -> int:
    """Smallest step that can hold a raw row the batch needs: rows of step s have charttime
    ≤ its watermark W_s, and the batch needs rows from ``min(intime + r0 h)`` on."""
    t_min = int((batch["in_us"] + batch["r0"] * HOUR_US).min())
    row = con.execute(f"SELECT min(step) FROM {st.FILES} WHERE watermark_us >= ?", [t_min]).fetchone()
    return current if row is None or row[0] is None else min(int(row[0]), current)


# ------------------------------------------------------------------------ a batch: read, compute, write
def _starts(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """(len(ids) + 1,) bounds of each id's rows in ``sorted_ids``, which holds only ``ids``
    (both ascending)."""
    return np.append(np.searchsorted(sorted_ids, ids, side="left"), sorted_ids.size)


def prepare(con, keys, b: dict[str, np.ndarray], p: StepParams) -> dict:
    """Read a batch (stays ``b``, sorted ids): raw rows, carried fill, stored keys of re-opened
    hours, gates (MAC-checked) and token maps; recompute its hours. Returns the batch's work."""
    ids = b["ids"]
    n = ids.size
    lo, hi = int(ids[0]), int(ids[-1])
    rng = f"BETWEEN {lo} AND {hi}"
    reopen = b["r0"] < b["em"]
    con.register("_ing_aff", pa.table({"stay_id": pa.array(ids), "lo_ms": pa.array(b["r0"] * HOUR_MS),
                                       "r0": pa.array(b["r0"].astype(np.int32)), "reopen": pa.array(reopen),
                                       "sidx": pa.array(np.arange(n, dtype=np.int64))}))
    try:
        s_min = step_floor(con, b, p.step)
        raw = con.execute(f"SELECT a.sidx, r.ms, r.vs, r.value FROM {st.ROWS} r JOIN _ing_aff a USING (stay_id) "
                          f"WHERE r.stay_id {rng} AND r.step >= {s_min} AND r.ms >= a.lo_ms "
                          "ORDER BY a.sidx, r.ms, r.vs, r.value").fetchnumpy()
        carry = np.broadcast_to(p.median, (n, len(VITALS))).copy()
        if (b["r0"] > 0).any():
            sel = ", ".join("v." + v for v in VITALS)
            cr = con.execute(f"SELECT a.sidx, {sel} FROM vitals_hourly v JOIN _ing_aff a "
                             f"ON v.stay_id = a.stay_id AND v.hour = a.r0 - 1 WHERE v.stay_id {rng}").fetchnumpy()
            if len(cr["sidx"]):
                carry[np.asarray(cr["sidx"], np.int64)] = np.column_stack([cr[v] for v in VITALS])
        old_z = np.zeros((0, len(VITALS)))
        if reopen.any():
            o = con.execute(f"SELECT a.sidx, v.hour, {', '.join('v.' + c for c in Z_COLS)} FROM vitals_hourly v "
                            f"JOIN _ing_aff a USING (stay_id) WHERE v.stay_id {rng} AND a.reopen AND v.hour >= a.r0 "
                            "ORDER BY a.sidx, v.hour").fetchnumpy()
            old_z = np.column_stack([np.asarray(o[c], np.float64) for c in Z_COLS])
            if old_z.shape[0] != int((b["em"] - b["r0"]).sum()):
                raise IngestError("the stored hourly rows of a re-opened stay do not match its gate's live tokens")
        g = con.execute(f"SELECT stay_id, state_npz, state_mac FROM {st.GATES} WHERE stay_id {rng} ORDER BY stay_id"
                        ).fetchall()
        tk = con.execute(f"SELECT stay_id, subject_id, hour, token_id, event, hot FROM {st.TOKENS} WHERE stay_id {rng} "
                         "ORDER BY stay_id, hour").fetchnumpy()
    finally:
        con.unregister("_ing_aff")
    rep, hour, filled, observed = causal_rows(raw["ms"], raw["vs"], raw["value"], raw["sidx"], b["n_hours"],
                                              b["r0"], b["r1"], carry)
    del raw
    tab = out_table(ids[rep], hour, filled, observed, p.mean, p.sd)
    z = np.column_stack([tab.column(c).to_numpy() for c in Z_COLS])
    ev = tab.column("event_composite").to_numpy(zero_copy_only=False).astype(bool)
    gates = {int(s): (bytes(blob), str(mac)) for s, blob, mac in g}
    t_stay = np.asarray(tk["stay_id"], np.int64)
    keep = np.isin(t_stay, ids)
    old = {c: np.asarray(tk[c])[keep] for c in ("stay_id", "subject_id", "hour", "token_id", "event", "hot")}
    tb = _starts(old["stay_id"], ids)
    rb = np.searchsorted(rep, np.arange(n + 1))
    ob = np.concatenate([[0], np.cumsum(b["em"] - b["r0"])])
    items = []
    for i, s in enumerate(ids.tolist()):
        em = int(b["em"][i])
        hrs = old["hour"][tb[i]:tb[i + 1]]
        tok_old = old["token_id"][tb[i]:tb[i + 1]].astype(np.int64)
        if hrs.size != em or (em and not np.array_equal(hrs, np.arange(em))):
            raise IngestError("a stay's stored token map does not cover its emitted hours; refusing to update it")
        blob = None
        if s in gates:
            blob, mac = gates[s]
            # the stored rows as they are (an edited subject or token id fails the MAC)
            dig = st.token_digest_arrays(tok_old, old["subject_id"][tb[i]:tb[i + 1]], s, hrs)
            if not keys.equal(st.gate_mac(keys, s, blob, digest=dig), mac):
                raise IngestError("a stored per-stay gate failed its MAC check (edited state or token map); "
                                  "refusing to use it")
            if em and not np.all(old["subject_id"][tb[i]:tb[i + 1]] == b["subject"][i]):
                raise IngestError("a stay's stored tokens name another subject than the source does now; "
                                  "refusing to update it")
        elif em:
            raise IngestError("a stay has live tokens but no stored gate; refusing to update it")
        items.append((blob, tok_old, int(b["r0"][i]), z[rb[i]:rb[i + 1]], old_z[ob[i]:ob[i + 1]]))
    return {"b": b, "items": items, "tab": tab, "ev": ev, "rep": rep, "old": old, "tb": tb, "reopen": reopen}


_GATE_COLS = ("stay_id", "subject_id", "state_npz", "state_mac", "n_live", "n_hot", "n_cold", "gated", "readmissions",
              "future_safe", "step")


def write(con, keys, w: dict, results: list, step: int, timing: dict | None = None) -> dict:
    """Write a prepared batch's results (inside the caller's transaction); returns its counts
    (``timing`` accumulates seconds per table written)."""
    import time

    timing = {} if timing is None else timing
    t0 = time.process_time()

    def lap(key):  # CPU seconds (DuckDB's threads included)
        nonlocal t0
        t = time.process_time()
        timing[key] = timing.get(key, 0.0) + t - t0
        t0 = t

    b, ids, old = w["b"], w["b"]["ids"], w["old"]
    lo, hi = int(ids[0]), int(ids[-1])
    rng = f"BETWEEN {lo} AND {hi}"
    if w["reopen"].any():
        con.register("_ing_re", pa.table({"stay_id": pa.array(ids[w["reopen"]]),
                                          "r0": pa.array(b["r0"][w["reopen"]].astype(np.int32))}))
        con.execute(f"DELETE FROM vitals_hourly USING _ing_re a WHERE vitals_hourly.stay_id = a.stay_id "
                    f"AND vitals_hourly.hour >= a.r0 AND vitals_hourly.stay_id {rng}")
        con.unregister("_ing_re")
    con.register("_ing_out", w["tab"])
    con.execute("INSERT INTO vitals_hourly SELECT * FROM _ing_out")
    con.unregister("_ing_out")
    lap("write_hourly_cpu_s")
    # token map: the new map of every stay (hours 0..r1-1) against the stored one (0..em-1)
    n_new = b["r1"]
    stay = np.repeat(ids, n_new)
    hour = np.arange(stay.size) - np.repeat(np.cumsum(n_new) - n_new, n_new)
    tok = np.concatenate([r[1] for r in results]) if results else np.zeros(0, np.int64)
    hot = np.concatenate([r[2] for r in results]) if results else np.zeros(0, bool)
    ev = np.zeros(stay.size, bool)
    prev = hour < np.repeat(b["r0"], n_new)          # hours before r0 keep their stored event flag
    in_old = hour < np.repeat(b["em"], n_new)
    ev[prev] = old["event"][_old_index(w["tb"], b, prev, n_new)].astype(bool)
    ev[~prev] = w["ev"]                               # the recomputed hours, in (stay, hour) order
    o_idx = _old_index(w["tb"], b, in_old, n_new)
    same = np.zeros(stay.size, bool)
    same[in_old] = ((old["token_id"][o_idx] == tok[in_old]) & (old["event"][o_idx].astype(bool) == ev[in_old])
                    & (old["hot"][o_idx].astype(bool) == hot[in_old]))
    gone = in_old & ~same
    if gone.any():
        con.register("_ing_tdel", pa.table({"stay_id": pa.array(stay[gone]),
                                            "hour": pa.array(hour[gone].astype(np.int32))}))
        con.execute(f"DELETE FROM {st.TOKENS} USING _ing_tdel d WHERE {st.TOKENS}.stay_id = d.stay_id "
                    f"AND {st.TOKENS}.hour = d.hour AND {st.TOKENS}.stay_id {rng}")
        con.unregister("_ing_tdel")
    ins = ~same
    subj = np.repeat(b["subject"], n_new)
    con.register("_ing_tok", pa.table({"stay_id": pa.array(stay[ins]), "subject_id": pa.array(subj[ins]),
                                       "hour": pa.array(hour[ins].astype(np.int32)), "token_id": pa.array(tok[ins]),
                                       "event": pa.array(ev[ins]), "hot": pa.array(hot[ins])}))
    con.execute(f"INSERT INTO {st.TOKENS} SELECT * FROM _ing_tok")
    con.unregister("_ing_tok")
    lap("write_tokens_cpu_s")
    # gates, MAC'd over the blob and the new token map
    tb_new = np.concatenate([[0], np.cumsum(n_new)])
    macs = []
    for i, s in enumerate(ids.tolist()):
        sl = slice(tb_new[i], tb_new[i + 1])
        dig = st.token_digest_arrays(tok[sl], int(b["subject"][i]), s, hour[sl])
        macs.append(st.gate_mac(keys, s, results[i][0], digest=dig))
    lap("write_macs_cpu_s")
    c = [r[3] for r in results]
    con.register("_ing_g", pa.table({
        "stay_id": pa.array(ids), "subject_id": pa.array(b["subject"]),
        "state_npz": pa.array([r[0] for r in results], pa.binary()), "state_mac": pa.array(macs),
        "n_live": pa.array([x["n"] for x in c], pa.int32()), "n_hot": pa.array([x["n_hot"] for x in c], pa.int32()),
        "n_cold": pa.array([x["n_cold"] for x in c], pa.int32()), "gated": pa.array([x["gated"] for x in c]),
        "readmissions": pa.array([x["readmissions"] for x in c], pa.int32()),
        "future_safe": pa.array([x["future_safe"] for x in c]),
        "step": pa.array(np.full(ids.size, step, np.int32))}))
    # an UPDATE of the stored rows (the table's key index is untouched) and an INSERT of new ones:
    # several times cheaper than INSERT OR REPLACE (a delete and an append per row)
    upd = ", ".join(f"{c} = g.{c}" for c in _GATE_COLS[1:])
    con.execute(f"UPDATE {st.GATES} SET {upd} FROM _ing_g g WHERE {st.GATES}.stay_id = g.stay_id "
                f"AND {st.GATES}.stay_id {rng}")
    con.execute(f"INSERT INTO {st.GATES} SELECT * FROM _ing_g WHERE stay_id NOT IN "
                f"(SELECT stay_id FROM {st.GATES} WHERE stay_id {rng})")
    con.unregister("_ing_g")
    lap("write_gates_cpu_s")
    return {"new": sum(x["new"] for x in c), "replaced": sum(x["replaced"] for x in c),
            "reopened": sum(x["reopened"] for x in c), "readmissions": sum(x["readm_delta"] for x in c),
            "stays_updated": int(ids.size), "tokens_rewritten": int(ins.sum()),
            "future_safe_all": all(x["future_safe"] for x in c if x["cert_gated"])}


def _old_index(tb: np.ndarray, b: dict, mask: np.ndarray, n_new: np.ndarray) -> np.ndarray:
    """Index into the stored token rows of the new rows selected by ``mask`` (hours < em)."""
    stay_i = np.repeat(np.arange(n_new.size), n_new)[mask]
    hour = (np.arange(mask.size) - np.repeat(np.cumsum(n_new) - n_new, n_new))[mask]
    return tb[stay_i] + hour
