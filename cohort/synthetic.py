"""Synthetic MIMIC-IV generator in the native layout (same files, columns, itemids, units).

Command line::

    python -m cohort.synthetic --out DIR --stays N --seed S [--rows R] [--format csv.gz|parquet]
        [--params FILE] [--short-stay-share F]
    python -m cohort.synthetic --calibrate [--demo-root DIR] [--params-out FILE]
    python -m cohort.synthetic --fidelity [--stays N] [--seed S] [--json PATH]

Physiology per stay (:class:`cohort.synthetic_calibration.Model`, calibrated to the real
MIMIC-IV demo; committed default ``cohort/synthetic_params.json``): a copula onto the demo's
marginals of a between-stay offset, a slow diagonal VAR(1) and heavy-tailed (multivariate t)
hour-to-hour variation, with the demo's between-stay covariance, within-stay correlation, lag
structure, per-vital observed-hour shares, all-vital charting gaps, rows per charted hour and
stay lengths. No episode is injected: deterioration events are the build's threshold crossings
of these values (``cohort.constants.EVENT_THRESHOLDS``), and SpO₂ is coupled to HR/RR only
through the demo's weak correlations and the shared size of large hourly moves.
``--fidelity`` compares synthetic with the demo (:mod:`cohort.fidelity`).
Charting mimics the real quirks the build must handle: °F (223761) and °C (223762)
temperature, arterial and non-invasive BP in the same hour, charting gaps, implausible values
(HR 0, SpO₂ 29, ...), a Celsius-charted value that is plainly °F, ``valuenum`` null with text in
``value``, duplicated charttimes, rows before intime and after outtime, stays under 48 h, stays
that never record a vital, and non-vital itemids that the scan must skip.

Deterministic per (seed, stays or rows, parameters): the stays are generated in fixed chunks of
``CHUNK_STAYS`` with one RNG stream per chunk, and each chunk is written out before the next is
drawn, so 100M+ rows never sit in memory at once. ``synthetic_manifest.json`` labels the output
``"source_kind": "synthetic"``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .constants import VITALS
from .synthetic_calibration import DEFAULT_PARAMS, Model
from .synthetic_io import _small_tables, _Writer

CHUNK_STAYS = 1000
HOUR_US = 3_600_000_000
MIN_US = 60_000_000
EPOCH_2110_US = 4_417_632_000 * 1_000_000  # 2110-01-01 00:00:00 UTC

VITAL_ITEMS = {  # itemid: (label, abbreviation, unit, category)
    220045: ("Heart Rate", "HR", "bpm", "Routine Vital Signs"),
    220050: ("Arterial Blood Pressure systolic", "ABPs", "mmHg", "Routine Vital Signs"),
    220051: ("Arterial Blood Pressure diastolic", "ABPd", "mmHg", "Routine Vital Signs"),
    220179: ("Non Invasive Blood Pressure systolic", "NBPs", "mmHg", "Routine Vital Signs"),
    220180: ("Non Invasive Blood Pressure diastolic", "NBPd", "mmHg", "Routine Vital Signs"),
    220210: ("Respiratory Rate", "RR", "insp/min", "Respiratory"),
    220277: ("O2 saturation pulseoxymetry", "SpO2", "%", "Respiratory"),
    223761: ("Temperature Fahrenheit", "Temperature F", "°F", "Routine Vital Signs"),
    223762: ("Temperature Celsius", "Temperature C", "°C", "Routine Vital Signs"),
}
OTHER_ITEMS = {  # non-vital items the scan must skip: itemid: (label, abbr, unit, category, lo, hi, text)
    220046: ("Heart rate Alarm - High", "HR Alarm - High", "bpm", "Alarms", 110, 150, None),
    220047: ("Heart Rate Alarm - Low", "HR Alarm - Low", "bpm", "Alarms", 40, 60, None),
    220052: ("Arterial Blood Pressure mean", "ABPm", "mmHg", "Routine Vital Signs", 55, 110, None),
    220181: ("Non Invasive Blood Pressure mean", "NBPm", "mmHg", "Routine Vital Signs", 55, 110, None),
    220739: ("GCS - Eye Opening", "GCS - Eye Opening", None, "Neurological", 1, 4, None),
    223900: ("GCS - Verbal Response", "GCS - Verbal Response", None, "Neurological", 1, 5, None),
    224641: ("Alarms On", "Alarms On", None, "Alarms", None, None, "Yes"),
}
TEXT_VALUES = np.array(["Unable to assess", "Refused", "Patient off unit", "UTA"], dtype=object)

CHARTEVENTS_SCHEMA = pa.schema([
    ("subject_id", pa.int64()), ("hadm_id", pa.int64()), ("stay_id", pa.int64()),
    ("caregiver_id", pa.int64()), ("charttime", pa.timestamp("us")), ("storetime", pa.timestamp("us")),
    ("itemid", pa.int64()), ("value", pa.string()), ("valuenum", pa.float64()),
    ("valueuom", pa.string()), ("warning", pa.int64()),
])


@dataclass
class GenerateSummary:
    out_dir: Path
    n_stays: int
    n_chartevents: int
    seconds: float
    fmt: str


def _within(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """owner index and position-within-owner for ``counts`` (shape (n,)) → two (Σcounts,) arrays."""
    owner = np.repeat(np.arange(counts.size), counts)
    pos = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, pos


def _segments(rng, n_h: np.ndarray, starts: np.ndarray, per_hour: float, lo: int, hi: int):
    """Random windows in each stay: returns (global hour index, window id, pos, length) arrays."""
    counts = rng.poisson(n_h * per_hour)
    stay_of, _ = _within(counts)
    start = np.floor(rng.random(stay_of.size) * n_h[stay_of]).astype(np.int64)
    length = rng.integers(lo, hi + 1, size=stay_of.size)
    seg, pos = _within(length)
    local = start[seg] + pos
    ok = local < n_h[stay_of[seg]]
    return (starts[stay_of[seg]] + local)[ok], seg[ok], pos[ok], length[seg[ok]]


def _stay_chunk(rng, k0: int, n: int, model: Model, short_share: float | None = None):
    """Stay-level attributes for global stay numbers k0..k0+n-1 (LOS from the calibrated quantiles)."""
    k = np.arange(k0, k0 + n, dtype=np.int64)
    los_h = model.los_hours(rng, n, short_share)
    intime = EPOCH_2110_US + rng.integers(0, 90 * 365 * 86400, n) * 1_000_000
    outtime = intime + np.round(los_h * 3600).astype(np.int64) * 1_000_000
    return dict(
        k=k, stay_id=30_000_000 + k, hadm_id=20_000_000 + k, subject_id=10_000_000 + k - (k % 7 == 6),
        intime=intime, outtime=outtime, los_h=los_h, n_h=np.ceil(los_h - 1e-9).astype(np.int64),
        never=rng.random(n) < 0.01, art=rng.random(n) < 0.35,
        f_frac=np.where(rng.random(n) < 0.8, 0.9, 0.1),
    )


def _rows_for(hours_mask, itemid, values, offsets, H):
    idx = np.nonzero(hours_mask)[0]
    return idx, np.full(idx.size, itemid, dtype=np.int64), values[idx], offsets[idx]


def _chunk_table(rng, st, model: Model) -> pa.Table:
    n_h = st["n_h"]
    n = n_h.size
    H = int(n_h.sum())
    sidx, hh = _within(n_h)
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
    noise = lambda sd: rng.normal(0, sd, H)  # noqa: E731
    j = {v: i for i, v in enumerate(VITALS)}
    hr = np.round(x[:, j["hr"]])
    spo2 = np.minimum(np.round(x[:, j["spo2"]]), 100.0)
    rr = np.round(x[:, j["rr"]])
    sbp, dbp, temp = x[:, j["sbp"]], x[:, j["dbp"]], x[:, j["temp_c"]]
    sbp_a, dbp_a = np.round(sbp + noise(1.0)), np.round(dbp + noise(1.0))
    sbp_n, dbp_n = np.round(sbp + noise(1.0)), np.round(dbp + noise(1.0))
    temp_c = np.round(temp, 1)
    temp_f = np.round(temp * 9 / 5 + 32, 1)
    p_obs, extra = model.observed_share, model.extra_rows
    obs = {v: live & (rng.random(H) < p_obs[j[v]]) for v in ("hr", "sbp", "rr", "spo2", "temp_c")}
    art = st["art"][sidx]
    is_f = rng.random(H) < st["f_frac"][sidx]
    has_t = obs["temp_c"]
    has_art = obs["sbp"] & art & (rng.random(H) < 0.9)
    has_nibp = obs["sbp"] & (~has_art | (rng.random(H) < 0.25))
    more = {v: rng.random(H) < extra[j[v]] for v in ("hr", "sbp", "rr", "spo2")}
    sbp_x, dbp_x = np.round(sbp + noise(1.0)), np.round(dbp + noise(1.0))
    parts = [
        _rows_for(obs["hr"], 220045, hr, off_main, H),
        _rows_for(obs["hr"] & more["hr"], 220045, np.round(x[:, j["hr"]] + noise(1.0)), off_x, H),
        _rows_for(obs["spo2"], 220277, spo2, off_main, H),
        _rows_for(obs["spo2"] & more["spo2"], 220277, np.minimum(np.round(x[:, j["spo2"]] + noise(0.5)), 100.0),
                  off_x, H),
        _rows_for(obs["rr"], 220210, rr, off_main, H),
        _rows_for(obs["rr"] & more["rr"], 220210, np.round(x[:, j["rr"]] + noise(0.5)), off_x, H),
        _rows_for(has_art, 220050, sbp_a, off_bp, H),
        _rows_for(has_art, 220051, dbp_a, off_bp, H),
        _rows_for(has_art & more["sbp"], 220050, sbp_x, off_x, H),
        _rows_for(has_art & more["sbp"], 220051, dbp_x, off_x, H),
        _rows_for(has_nibp, 220179, sbp_n, off_bp, H),
        _rows_for(has_nibp, 220180, dbp_n, off_bp, H),
        _rows_for(has_nibp & ~has_art & more["sbp"], 220179, sbp_x, off_x, H),
        _rows_for(has_nibp & ~has_art & more["sbp"], 220180, dbp_x, off_x, H),
        _rows_for(has_t & is_f, 223761, temp_f, off_t, H),
        _rows_for(has_t & ~is_f, 223762, temp_c, off_t, H),
    ]
    hidx = np.concatenate([p[0] for p in parts])
    item = np.concatenate([p[1] for p in parts])
    val = np.concatenate([p[2] for p in parts]).astype(np.float64)
    off = np.concatenate([p[3] for p in parts])
    ts = st["intime"][sidx[hidx]] + hh[hidx] * HOUR_US + off
    # a row in the last (partial) hour may pass outtime: keep it inside the stay
    ts = np.minimum(ts, st["outtime"][sidx[hidx]])
    nv = val.size
    text = np.zeros(nv, dtype=bool)
    # implausible values (0.3 %), plainly-°F in the °C item (0.1 %), text-only values (0.2 %)
    bad = rng.random(nv) < 0.003
    bad_vals = {220045: [0.0, 350.0], 220277: [29.0, 3.0], 220210: [0.0, 120.0], 220050: [0.0, 400.0],
                220051: [0.0, 300.0], 220179: [0.0, 400.0], 220180: [1.0, 300.0], 223761: [0.0, 990.0],
                223762: [0.0, 370.0]}
    for it, choices in bad_vals.items():
        s = bad & (item == it)
        val[s] = rng.choice(choices, size=int(s.sum()))
    pf = (item == 223762) & (rng.random(nv) < 0.01)
    val[pf] = np.round(val[pf] * 9 / 5 + 32, 1)
    text = rng.random(nv) < 0.002
    stay_of = sidx[hidx]
    # duplicated charttimes (0.3 %): the same row again, half of them with a corrected value
    dup = np.nonzero(rng.random(nv) < 0.003)[0]
    dval = val[dup] + np.where(rng.random(dup.size) < 0.5, 0.0, 1.0)
    # rows before intime / after outtime
    pre = np.nonzero((rng.random(n) < 0.25) & ~st["never"])[0]
    post = np.nonzero((rng.random(n) < 0.2) & ~st["never"])[0]
    edge_stay = np.concatenate([pre, post])
    edge_ts = np.concatenate([st["intime"][pre] - rng.integers(1, 120, pre.size) * MIN_US,
                              st["outtime"][post] + rng.integers(1, 120, post.size) * MIN_US])
    edge_val = np.round(rng.normal(88, 10, edge_stay.size))
    # non-vital items (~1.7 rows/hour)
    n_other = rng.poisson(1.7, H)
    o_h, _ = _within(n_other)
    o_item_keys = np.array(list(OTHER_ITEMS))
    o_item = o_item_keys[rng.integers(0, len(o_item_keys), o_h.size)]
    o_val = np.full(o_h.size, np.nan)
    o_text = np.zeros(o_h.size, dtype=bool)
    for it, (_, _, _, _, lo, hi, txt) in OTHER_ITEMS.items():
        s = o_item == it
        if txt is None:
            assert lo is not None and hi is not None
            o_val[s] = rng.integers(lo, hi + 1, int(s.sum()))
        else:
            o_text[s] = True
    o_ts = st["intime"][sidx[o_h]] + hh[o_h] * HOUR_US + rng.integers(0, 60, o_h.size) * MIN_US
    o_ts = np.minimum(o_ts, st["outtime"][sidx[o_h]])

    stay_all = np.concatenate([stay_of, stay_of[dup], edge_stay, sidx[o_h]])
    item_all = np.concatenate([item, item[dup], np.full(edge_stay.size, 220045), o_item])
    val_all = np.concatenate([val, dval, edge_val, o_val])
    ts_all = np.concatenate([ts, ts[dup], edge_ts, o_ts])
    text_all = np.concatenate([text, text[dup], np.zeros(edge_stay.size, bool), np.zeros(o_h.size, bool)])
    yes_all = np.concatenate([np.zeros(nv + dup.size + edge_stay.size, bool), o_text])
    nr = stay_all.size

    valuenum = pa.array(val_all, mask=text_all | yes_all | np.isnan(val_all))
    value = pc.cast(valuenum, pa.string())
    txt_choice = pc.take(pa.array(TEXT_VALUES.astype(str)), pa.array(rng.integers(0, TEXT_VALUES.size, nr)))
    value = pc.if_else(pa.array(text_all), txt_choice, value)
    value = pc.if_else(pa.array(yes_all), pa.scalar("Yes"), value)
    units: dict[int, str | None] = {it: u for it, (_, _, u, _) in VITAL_ITEMS.items()}
    units.update({it: v[2] for it, v in OTHER_ITEMS.items()})
    uom_keys = np.array(sorted(units))
    uom_dict = pa.array([units[i] for i in uom_keys], pa.string())
    uom = pc.take(uom_dict, pa.array(np.searchsorted(uom_keys, item_all)))
    uom = pc.if_else(pa.array(text_all), pa.nulls(nr, pa.string()), uom)
    return pa.table({
        "subject_id": st["subject_id"][stay_all], "hadm_id": st["hadm_id"][stay_all],
        "stay_id": st["stay_id"][stay_all], "caregiver_id": rng.integers(10000, 99999, nr),
        "charttime": pa.array(ts_all, pa.timestamp("us")),
        "storetime": pa.array(ts_all + rng.integers(1, 40, nr) * MIN_US, pa.timestamp("us")),
        "itemid": item_all, "value": value, "valuenum": valuenum, "valueuom": uom,
        "warning": np.where(rng.random(nr) < 0.001, 1, 0),
    }, schema=CHARTEVENTS_SCHEMA)


def generate(out_dir: str | Path, stays: int | None = None, seed: int = 0, target_rows: int | None = None,
             fmt: str = "csv.gz", progress: bool = False, params: str | Path | dict | None = None,
             short_stay_share: float | None = None) -> GenerateSummary:
    """Write a synthetic MIMIC-IV native layout into ``out_dir``.

    Parameters
    ----------
    out_dir : folder receiving ``icu/`` and ``hosp/``
    stays : number of ICU stays (all lengths; with the default parameters about 54 % are under
        48 h, as in the demo, and the build keeps the others)
    seed : RNG seed (the output is a deterministic function of seed, stays/target_rows and the
        parameters)
    target_rows : instead of ``stays``, keep adding chunks of stays until chartevents has at
        least this many rows
    fmt : "csv.gz" (as distributed) or "parquet"
    params : calibration parameters (dict or JSON path, from ``--calibrate``); None: the
        committed default ``cohort/synthetic_params.json``
    short_stay_share : share of stays under 48 h (None: the calibrated share)
    """
    if fmt not in ("csv.gz", "parquet"):
        raise ValueError(f"fmt must be 'csv.gz' or 'parquet', got {fmt!r}")
    if (stays is None) == (target_rows is None):
        raise ValueError("give exactly one of stays, target_rows")
    if short_stay_share is not None and not 0.0 <= short_stay_share < 1.0:
        raise ValueError(f"short_stay_share must be in [0, 1), got {short_stay_share}")
    model = Model(params)
    t0 = time.perf_counter()
    out = Path(out_dir)
    for old in list(out.glob("icu/*")) + list(out.glob("hosp/*")):
        if old.is_file() and old.name.split(".")[0] in ("chartevents", "icustays", "d_items", "patients", "admissions"):
            old.unlink()
    writer = _Writer(out / "icu" / "chartevents", CHARTEVENTS_SCHEMA, fmt)
    all_stays: list[dict] = []
    n_rows = 0
    n_done = 0
    chunk = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=target_rows or stays, unit="row" if target_rows else "stay", file=sys.stderr,
                   desc="[synthetic]", unit_scale=True)
    try:
        while True:
            if stays is not None:
                n = min(CHUNK_STAYS, stays - n_done)
                if n <= 0:
                    break
            else:
                if n_rows >= int(target_rows or 0):
                    break
                n = CHUNK_STAYS
            rng = np.random.default_rng([int(seed), chunk, 0xC0])
            st = _stay_chunk(rng, n_done, n, model, short_stay_share)
            t = _chunk_table(rng, st, model)
            writer.write(t)
            n_rows += t.num_rows
            all_stays.append({k: st[k] for k in ("k", "stay_id", "hadm_id", "subject_id", "intime", "outtime")})
            n_done += n
            chunk += 1
            if bar is not None:
                bar.update(t.num_rows if target_rows else n)
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    merged = {k: np.concatenate([s[k] for s in all_stays]) for k in all_stays[0]} if all_stays else None
    if merged is None:
        raise ValueError("no stays generated")
    for rel, table in _small_tables(merged, VITAL_ITEMS, OTHER_ITEMS).items():
        w = _Writer(out / rel, table.schema, fmt)
        w.write(table)
        w.close()
    summary = GenerateSummary(out, n_done, n_rows, time.perf_counter() - t0, fmt)
    (out / "synthetic_manifest.json").write_text(json.dumps(
        {"generator": "cohort.synthetic", "source_kind": "synthetic", "seed": seed, "stays": n_done,
         "chartevents_rows": n_rows, "format": fmt, "model": model.params.get("model"),
         "calibrated_from": model.params.get("calibrated_from"),
         "params": "default" if params is None else ("dict" if isinstance(params, dict) else str(params)),
         "short_stay_share": model.short_share if short_stay_share is None else short_stay_share,
         "note": "synthetic data in the MIMIC-IV v3.1 native layout; no real patient"}, indent=1))
    return summary


#: Short-stay share of :func:`make_small_warehouse`: kept at the pre-calibration 28 % so that
#: other packages' small test warehouses keep about 70 % of their generated stays.
SMALL_WAREHOUSE_SHORT_SHARE = 0.28


def make_small_warehouse(tmp_dir: str | Path, stays: int = 40, seed: int = 0) -> Path:
    """Generate ``stays`` synthetic stays under ``tmp_dir/mimic`` and build
    ``tmp_dir/warehouse.duckdb`` from them (quiet). For other packages' tests; no pytest needed."""
    from .build import build_warehouse

    tmp = Path(tmp_dir)
    generate(tmp / "mimic", stays=stays, seed=seed, fmt="parquet", short_stay_share=SMALL_WAREHOUSE_SHORT_SHARE)
    s = build_warehouse("mimic", tmp / "mimic", tmp / "warehouse.duckdb", seed=seed, progress=False, memory_limit="1GB")
    return s.warehouse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cohort.synthetic", description="Synthetic MIMIC-IV native layout.")
    p.add_argument("--out", default=None, help="output folder (required unless --calibrate/--fidelity)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--stays", type=int)
    g.add_argument("--rows", type=int, help="generate chunks of stays until chartevents has ≥ this many rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=["csv.gz", "parquet"], default="csv.gz")
    p.add_argument("--params", default=None, help=f"calibration JSON (default {DEFAULT_PARAMS.name})")
    p.add_argument("--short-stay-share", type=float, default=None,
                   help="share of stays under 48 h (default: calibrated)")
    p.add_argument("--calibrate", action="store_true", help="estimate the parameters from the real demo and write them")
    p.add_argument("--demo-root", default=None, help="demo CLIF folder (default: cohort.demo_data's cache)")
    p.add_argument("--params-out", default=None, help=f"--calibrate: output JSON (default {DEFAULT_PARAMS})")
    p.add_argument("--fidelity", action="store_true", help="print the synthetic-vs-demo fidelity table")
    p.add_argument("--json", default=None, help="--fidelity: also write the table as JSON here")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if a.calibrate:
        from .errors import DemoDataMissing
        from .synthetic_calibration import calibrate

        try:
            out = Path(a.params_out) if a.params_out else DEFAULT_PARAMS
            prm = calibrate(a.demo_root, out)
        except DemoDataMissing as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"params": str(out), "calibrated_from": prm["calibrated_from"], "n_stays": prm["n_stays"],
                          "n_hours": prm["n_hours"]}))
        return 0
    if a.fidelity:
        from .fidelity import run_fidelity

        return run_fidelity(stays=a.stays or 1500, seed=a.seed, params=a.params, demo_root=a.demo_root,
                            json_path=a.json, short_stay_share=a.short_stay_share)
    if a.out is None or (a.stays is None) == (a.rows is None):
        p.error("give --out and exactly one of --stays/--rows (or --calibrate, or --fidelity)")
    s = generate(a.out, stays=a.stays, seed=a.seed, target_rows=a.rows, fmt=a.format, progress=not a.quiet,
                 params=a.params, short_stay_share=a.short_stay_share)
    print(json.dumps({"out": str(s.out_dir), "stays": s.n_stays, "chartevents_rows": s.n_chartevents,
                      "seconds": round(s.seconds, 2), "format": s.fmt}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
