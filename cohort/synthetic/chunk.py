"""One chunk of synthetic ICU stays → its chartevents rows (an Arrow table in the MIMIC-IV
layout) and its stays' attributes. Pure NumPy array work per chunk; no loop over rows or hours.

Randomness: chunk ``c`` of seed ``s`` draws from ``SeedSequence(s, spawn_key=(c,)).spawn(2)``:
the first stream makes the stays and their vital rows, the second the non-vital rows and the
ventilation flag. The vital rows (and so every table the build makes) are therefore the same
whether non-vital rows are written or not, and every chunk is a function of (seed, chunk index,
stay range, parameters) alone — the worker that computes it does not matter.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cohort.constants import VITALS
from cohort.synthetic.items import (
    ART_SHARE,
    CATALOGUE,
    NON_VITAL_ROWS_PER_ICU_HOUR,
    QUANTILE_BUCKETS,
    VENT_SHARE,
    VITAL_ITEMS,
    ValueTable,
)
from cohort.synthetic.model import Model

HOUR_US = 3_600_000_000
MIN_US = 60_000_000
EPOCH_2110_US = 4_417_977_600 * 1_000_000  # 2110-01-01 00:00:00 UTC

CHARTEVENTS_SCHEMA = pa.schema([
    ("subject_id", pa.int64()), ("hadm_id", pa.int64()), ("stay_id", pa.int64()),
    ("caregiver_id", pa.int64()), ("charttime", pa.timestamp("us")), ("storetime", pa.timestamp("us")),
    ("itemid", pa.int64()), ("value", pa.string()), ("valuenum", pa.float64()),
    ("valueuom", pa.string()), ("warning", pa.int64()),
])
STAY_KEYS = ("k", "stay_id", "hadm_id", "subject_id", "intime", "outtime")

_VALUES: ValueTable | None = None
_CAT_ITEMIDS = np.array([it.itemid for it in CATALOGUE], dtype=np.int64)
_UNITS = sorted({u for _, _, u, _ in VITAL_ITEMS.values()} | {it.unit for it in CATALOGUE if it.unit})
_UNIT_STRINGS = pa.array(_UNITS + [None], pa.string())  # last entry: no unit
_NO_UNIT = len(_UNITS)
_CAT_UNIT = np.array([_UNITS.index(it.unit) if it.unit else _NO_UNIT for it in CATALOGUE], dtype=np.int32)
_VITAL_IDS = np.array(sorted(VITAL_ITEMS), dtype=np.int64)
_VITAL_UNIT = np.array([_UNITS.index(VITAL_ITEMS[i][2]) for i in _VITAL_IDS], dtype=np.int32)


def value_table() -> ValueTable:
    """The process-wide value dictionary (built once per process)."""
    global _VALUES
    if _VALUES is None:
        _VALUES = ValueTable()
    return _VALUES


def chunk_rngs(seed: int, chunk: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(stays + vitals stream, non-vital stream) of chunk ``chunk``."""
    vit, other = np.random.SeedSequence(int(seed), spawn_key=(int(chunk),)).spawn(2)
    return np.random.Generator(np.random.PCG64(vit)), np.random.Generator(np.random.PCG64(other))


def within(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """owner index and position-within-owner for ``counts`` (shape (n,)) → two (Σcounts,) arrays."""
    owner = np.repeat(np.arange(counts.size), counts)
    pos = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, pos


def _segments(rng, n_h: np.ndarray, starts: np.ndarray, per_hour: float, lo: int, hi: int):
    """Random windows in each stay: (global hour index, window id, pos, length) arrays."""
    counts = rng.poisson(n_h * per_hour)
    stay_of, _ = within(counts)
    start = np.floor(rng.random(stay_of.size) * n_h[stay_of]).astype(np.int64)
    length = rng.integers(lo, hi + 1, size=stay_of.size)
    seg, pos = within(length)
    local = start[seg] + pos
    ok = local < n_h[stay_of[seg]]
    return (starts[stay_of[seg]] + local)[ok], seg[ok], pos[ok], length[seg[ok]]


def stay_chunk(rng, k0: int, n: int, model: Model, short_share: float | None = None) -> dict:
    """Stay-level attributes for global stay numbers k0..k0+n-1 (LOS from the calibrated quantiles)."""
    k = np.arange(k0, k0 + n, dtype=np.int64)
    los_h = model.los_hours(rng, n, short_share)
    intime = EPOCH_2110_US + rng.integers(0, 90 * 365 * 86400, n) * 1_000_000
    outtime = intime + np.round(los_h * 3600).astype(np.int64) * 1_000_000
    return dict(
        k=k, stay_id=30_000_000 + k, hadm_id=20_000_000 + k, subject_id=10_000_000 + k - (k % 7 == 6),
        intime=intime, outtime=outtime, los_h=los_h, n_h=np.ceil(los_h - 1e-9).astype(np.int64),
        never=rng.random(n) < 0.01, art=rng.random(n) < ART_SHARE,
        f_frac=np.where(rng.random(n) < 0.8, 0.9, 0.1),
    )


_BAD_VALUES = {220045: (0.0, 350.0), 220277: (29.0, 3.0), 220210: (0.0, 120.0), 220050: (0.0, 400.0),
               220051: (0.0, 300.0), 220179: (0.0, 400.0), 220180: (1.0, 300.0), 223761: (0.0, 990.0),
               223762: (0.0, 370.0)}


def vital_rows(rng, st: dict, model: Model) -> dict[str, np.ndarray]:
    """The nine vital itemids' rows of a chunk: ``stay`` (chunk-local index), ``ts`` (µs),
    ``item``, ``val`` (charted number), ``text`` (True: text charted, ``valuenum`` null).
    Charting quirks: °F and °C temperature, arterial and non-invasive BP in the same hour, gaps,
    implausible values, plainly-°F values in the °C item, text-only values, duplicated
    charttimes, rows before intime / after outtime, stays that never record a vital."""
    n_h = st["n_h"]
    n = n_h.size
    H = int(n_h.sum())
    sidx, hh = within(n_h)
    starts = np.cumsum(n_h) - n_h
    # hourly true values from the calibrated process; events are whatever crosses a threshold
    x = model.values(model.latent(rng, n_h, sidx, hh))
    gap = np.zeros(H, dtype=bool)
    g, _, _, _ = _segments(rng, n_h, starts, model.gap_share / 5.0, 2, 8)
    gap[g] = True
    live = ~gap & ~st["never"][sidx]
    # within-hour charting offsets (minutes) so that charttime stays inside the hour
    off_main = rng.integers(0, 60, H) * MIN_US
    off_bp = rng.integers(0, 60, H) * MIN_US
    off_t = rng.integers(0, 60, H) * MIN_US
    off_x = (off_main + 30 * MIN_US) % HOUR_US
    j = {v: i for i, v in enumerate(VITALS)}
    col = {v: x[:, j[v]] for v in VITALS}
    noise = lambda sd: rng.normal(0, sd, H)  # noqa: E731
    sbp, dbp, temp = col["sbp"], col["dbp"], col["temp_c"]
    sbp_a, dbp_a = np.round(sbp + noise(1.0)), np.round(dbp + noise(1.0))
    sbp_n, dbp_n = np.round(sbp + noise(1.0)), np.round(dbp + noise(1.0))
    p_obs, extra = model.observed_share, model.extra_rows
    obs = {v: live & (rng.random(H) < p_obs[j[v]]) for v in ("hr", "sbp", "rr", "spo2", "temp_c")}
    art = st["art"][sidx]
    is_f = rng.random(H) < st["f_frac"][sidx]
    has_art = obs["sbp"] & art & (rng.random(H) < 0.9)
    has_nibp = obs["sbp"] & (~has_art | (rng.random(H) < 0.25))
    more = {v: rng.random(H) < extra[j[v]] for v in ("hr", "sbp", "rr", "spo2")}
    sbp_x, dbp_x = np.round(sbp + noise(1.0)), np.round(dbp + noise(1.0))
    parts = [  # (hour mask, itemid, value per hour, offset per hour)
        (obs["hr"], 220045, np.round(col["hr"]), off_main),
        (obs["hr"] & more["hr"], 220045, np.round(col["hr"] + noise(1.0)), off_x),
        (obs["spo2"], 220277, np.minimum(np.round(col["spo2"]), 100.0), off_main),
        (obs["spo2"] & more["spo2"], 220277, np.minimum(np.round(col["spo2"] + noise(0.5)), 100.0), off_x),
        (obs["rr"], 220210, np.round(col["rr"]), off_main),
        (obs["rr"] & more["rr"], 220210, np.round(col["rr"] + noise(0.5)), off_x),
        (has_art, 220050, sbp_a, off_bp), (has_art, 220051, dbp_a, off_bp),
        (has_art & more["sbp"], 220050, sbp_x, off_x), (has_art & more["sbp"], 220051, dbp_x, off_x),
        (has_nibp, 220179, sbp_n, off_bp), (has_nibp, 220180, dbp_n, off_bp),
        (has_nibp & ~has_art & more["sbp"], 220179, sbp_x, off_x),
        (has_nibp & ~has_art & more["sbp"], 220180, dbp_x, off_x),
        (obs["temp_c"] & is_f, 223761, np.round(temp * 9 / 5 + 32, 1), off_t),
        (obs["temp_c"] & ~is_f, 223762, np.round(temp, 1), off_t),
    ]
    idx = [np.nonzero(m)[0] for m, _, _, _ in parts]
    hidx = np.concatenate(idx)
    item = np.concatenate([np.full(i.size, it, dtype=np.int64) for i, (_, it, _, _) in zip(idx, parts)])
    val = np.concatenate([v[i] for i, (_, _, v, _) in zip(idx, parts)]).astype(np.float64)
    off = np.concatenate([o[i] for i, (_, _, _, o) in zip(idx, parts)])
    stay = sidx[hidx]
    # a row in the last (partial) hour may pass outtime: keep it inside the stay
    ts = np.minimum(st["intime"][stay] + hh[hidx] * HOUR_US + off, st["outtime"][stay])
    nv = val.size
    # implausible values (0.3 %), plainly-°F in the °C item (1 % of its rows), text-only values (0.2 %)
    bad = rng.random(nv) < 0.003
    for it, choices in _BAD_VALUES.items():
        s = bad & (item == it)
        val[s] = rng.choice(np.array(choices), size=int(s.sum()))
    pf = (item == 223762) & (rng.random(nv) < 0.01)
    val[pf] = np.round(val[pf] * 9 / 5 + 32, 1)
    text = rng.random(nv) < 0.002
    # duplicated charttimes (0.3 %): the same row again, half of them with a corrected value
    dup = np.nonzero(rng.random(nv) < 0.003)[0]
    dval = val[dup] + np.where(rng.random(dup.size) < 0.5, 0.0, 1.0)
    # HR rows before intime / after outtime
    pre = np.nonzero((rng.random(n) < 0.25) & ~st["never"])[0]
    post = np.nonzero((rng.random(n) < 0.2) & ~st["never"])[0]
    edge_stay = np.concatenate([pre, post])
    edge_ts = np.concatenate([st["intime"][pre] - rng.integers(1, 120, pre.size) * MIN_US,
                              st["outtime"][post] + rng.integers(1, 120, post.size) * MIN_US])
    edge_val = np.round(rng.normal(88, 10, edge_stay.size))
    return {
        "stay": np.concatenate([stay, stay[dup], edge_stay]),
        "ts": np.concatenate([ts, ts[dup], edge_ts]),
        "item": np.concatenate([item, item[dup], np.full(edge_stay.size, 220045, dtype=np.int64)]),
        "val": np.concatenate([val, dval, edge_val]),
        "text": np.concatenate([text, text[dup], np.zeros(edge_stay.size, dtype=bool)]),
    }


def _rate_per_active_hour() -> np.ndarray:
    """Rows per charted stay-hour of each catalogue item, scaled so that the catalogue adds
    :data:`NON_VITAL_ROWS_PER_ICU_HOUR` rows per ICU hour on average over all stays."""
    share = {"all": 1.0, "vent": VENT_SHARE, "art": ART_SHARE}
    w = np.array([it.rate for it in CATALOGUE])
    return w / w.sum() * NON_VITAL_ROWS_PER_ICU_HOUR / np.array([share[it.when] for it in CATALOGUE])


_RATE = _rate_per_active_hour()
_WHEN = np.array([{"all": 0, "vent": 1, "art": 2}[it.when] for it in CATALOGUE])


def other_rows(rng, st: dict, vt: ValueTable, rate_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Non-vital rows of a chunk: per stay and catalogue item a Poisson count over the stay's
    length (ventilator items only for ventilated stays, arterial ones only with an arterial
    line), charttimes uniform over the stay at minute resolution, values by one table lookup.
    Rows come grouped by stay, then item. Returns ``stay``, ``ts``, ``cat`` (catalogue index),
    ``entry`` (value dictionary index) and ``raw`` (64 random bits per row for the
    bookkeeping columns)."""
    n = st["los_h"].size
    vent = rng.random(n) < VENT_SHARE
    active = np.stack([np.ones(n, dtype=bool), vent, st["art"]], axis=1)[:, _WHEN]  # (n, items)
    counts = rng.poisson(st["los_h"][:, None] * (_RATE * rate_scale)[None, :] * active)
    n_items = len(CATALOGUE)
    c = counts.ravel()
    stay = np.repeat(np.repeat(np.arange(n, dtype=np.int32), n_items), c)
    cat = np.repeat(np.tile(np.arange(n_items, dtype=np.int32), n), c)
    raw = rng.bit_generator.random_raw(stay.size)  # uint64: bits 0-11 value bucket, 28-63 time
    bucket = (raw & np.uint64(QUANTILE_BUCKETS - 1)).astype(np.int32)
    entry = vt.item_table.ravel()[cat * QUANTILE_BUCKETS + bucket]
    los_min = np.maximum(np.floor(st["los_h"] * 60.0).astype(np.int64), 1)
    minute = ((raw >> np.uint64(28)).astype(np.int64) * los_min[stay]) >> 36
    ts = st["intime"][stay] + minute * MIN_US
    return {"stay": stay, "ts": ts, "cat": cat, "entry": entry, "raw": raw}


def _bookkeeping(raw: np.ndarray, st: dict, stay: np.ndarray, ts: np.ndarray):
    """caregiver_id (one per stay and 12-hour shift), storetime (1–40 min after charttime) and
    warning (≈ 0.1 %) from 64 random bits per row."""
    shift = ((ts - st["intime"][stay]) * (1.0 / (12 * HOUR_US))).astype(np.int64)  # may be -1 before intime
    key = (st["stay_id"] * 0x9E3779B1) & 0xFFFFFFFF  # per-stay hash, then one per shift
    h = (key[stay] + shift * 0x85EBCA6B) & 0xFFFFFFFF
    caregiver = 10_000 + ((h * 89_999) >> 32)
    delay = 1 + ((((raw >> np.uint64(12)) & np.uint64(63)).astype(np.int64) * 40) >> 6)
    warning = (((raw >> np.uint64(18)) & np.uint64(1023)) == 0).astype(np.int64)
    return caregiver, ts + delay * MIN_US, warning


def chunk_table(seed: int, chunk: int, k0: int, n: int, model: Model, short_share: float | None = None,
                non_vital: bool = True) -> tuple[pa.Table, dict]:
    """Chunk ``chunk``'s chartevents (:data:`CHARTEVENTS_SCHEMA`) and its stays' attributes
    (:data:`STAY_KEYS`, each shape (n,)) for global stays k0..k0+n-1."""
    vt = value_table()
    rv, ro = chunk_rngs(seed, chunk)
    st = stay_chunk(rv, k0, n, model, short_share)
    v = vital_rows(rv, st, model)
    nv = v["val"].size
    v_entry, strings = vt.vital_index(np.where(v["text"], 0.0, v["val"]))
    v_entry[v["text"]] = vt.text_values[rv.integers(0, vt.text_values.size, int(v["text"].sum()))]
    v_raw = rv.bit_generator.random_raw(nv)
    v_unit = np.where(v["text"], _NO_UNIT, _VITAL_UNIT[np.searchsorted(_VITAL_IDS, v["item"])]).astype(np.int32)
    v_num = np.where(v["text"], np.nan, v["val"])
    if non_vital:
        o = other_rows(ro, st, vt)
        stay = np.concatenate([v["stay"], o["stay"]])
        ts = np.concatenate([v["ts"], o["ts"]])
        raw = np.concatenate([v_raw, o["raw"]])
        item = np.concatenate([v["item"], _CAT_ITEMIDS[o["cat"]]])
        entry = np.concatenate([v_entry, o["entry"]])
        unit = np.concatenate([v_unit, _CAT_UNIT[o["cat"]]])
        vnum = np.concatenate([v_num, vt.valuenum[o["entry"]]])
    else:
        stay, ts, raw, item, entry, unit, vnum = v["stay"], v["ts"], v_raw, v["item"], v_entry, v_unit, v_num
    caregiver, storetime, warning = _bookkeeping(raw, st, stay, ts)
    table = pa.table({
        "subject_id": st["subject_id"][stay], "hadm_id": st["hadm_id"][stay], "stay_id": st["stay_id"][stay],
        "caregiver_id": caregiver, "charttime": pa.array(ts, pa.timestamp("us")),
        "storetime": pa.array(storetime, pa.timestamp("us")), "itemid": item,
        "value": pc.take(strings, pa.array(entry)), "valuenum": pa.array(vnum, mask=np.isnan(vnum)),
        "valueuom": pc.take(_UNIT_STRINGS, pa.array(unit)), "warning": warning,
    }, schema=CHARTEVENTS_SCHEMA)
    return table, {key: st[key] for key in STAY_KEYS}
