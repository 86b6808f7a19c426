"""Slow, obvious reference of the whole build (pure Python loops over rows), for tests.

It re-reads the source files row by row (``csv``/``gzip`` for the native layout, pyarrow's
``to_pylist`` for parquet) and applies SPEC §2 step by step with dictionaries, so the fast
DuckDB + Polars path in :mod:`cohort.build` can be checked against it on small inputs. Only
the deterministic sample/split helpers are shared (they are not what is being checked).
"""
from __future__ import annotations

import csv
import gzip
import math
import re
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cohort.constants import (
    CLIF_CATEGORIES,
    EVENT_THRESHOLDS,
    FAHRENHEIT_ITEMID,
    ITEMIDS,
    PLAINLY_FAHRENHEIT_ABOVE,
    PLAUSIBLE,
    SPO2_EVENT_BELOW,
    VITALS,
    fahrenheit_to_celsius,
)
from cohort.selection import assign_splits, sample_stays

HOUR_US = 3_600_000_000
_NUM = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")
_EPOCH = datetime(1970, 1, 1)


def _us(x) -> int | None:
    if x is None or x == "":
        return None
    if isinstance(x, str):
        x = datetime.fromisoformat(x)
    if x.tzinfo is not None:
        x = x.astimezone(UTC).replace(tzinfo=None)
    d = x - _EPOCH
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def _rows(path_no_ext: Path):
    for ext in (".csv.gz", ".csv", ".parquet"):
        p = path_no_ext.with_name(path_no_ext.name + ext)
        if p.is_file():
            if ext == ".parquet":
                import pyarrow.parquet as pq

                yield from pq.read_table(p).to_pylist()
            else:
                opener = gzip.open if ext == ".csv.gz" else open
                with opener(p, "rt", newline="") as f:
                    for r in csv.DictReader(f):
                        yield {k: (None if v == "" else v) for k, v in r.items()}
            return
    raise FileNotFoundError(path_no_ext)


def _num(x) -> float | None:
    if x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    return float(x) if _NUM.match(x) else None


def _load_mimic(root: Path):
    stays = []
    for r in _rows(root / "icu" / "icustays"):
        stays.append(dict(stay_id=int(r["stay_id"]), subject_id=int(r["subject_id"]),
                          hadm_id=None if r["hadm_id"] is None else int(r["hadm_id"]),
                          in_us=_us(r["intime"]), out_us=_us(r["outtime"]), key=str(int(r["stay_id"]))))

    def meas(cohort_keys):
        for r in _rows(root / "icu" / "chartevents"):
            item = int(r["itemid"])
            if item not in ITEMIDS or r["stay_id"] is None or str(int(r["stay_id"])) not in cohort_keys:
                continue
            vital, src, _ = ITEMIDS[item]
            v = _num(r["valuenum"])  # text-only rows (valuenum null) are not measurements
            yield cohort_keys[str(int(r["stay_id"]))], _us(r["charttime"]), vital, src, v, item == FAHRENHEIT_ITEMID

    return stays, meas


def _load_clif(root: Path):
    import pyarrow.parquet as pq

    hosp = defaultdict(set)  # a hospitalization listed under several patients: one stay row per patient
    for r in pq.read_table(root / "clif_hospitalization.parquet").to_pylist():
        if r["patient_id"] is not None:
            hosp[r["hospitalization_id"]].add(r["patient_id"])
    segs = defaultdict(list)
    for r in pq.read_table(root / "clif_adt.parquet").to_pylist():
        if (r["location_category"] or "").lower() == "icu":
            segs[r["hospitalization_id"]].append((_us(r["in_dttm"]), _us(r["out_dttm"])))
    stays = []
    for h, lst in segs.items():
        for k, (a, b) in enumerate(sorted(lst, key=lambda t: (t[0] is None, t[0], t[1])), start=1):
            for p in sorted(hosp.get(h, ())) or [None]:
                stays.append(dict(stay_id=int(h) * 100 + k, subject_id=None if p is None else int(p),
                                  hadm_id=int(h), in_us=a, out_us=b, key=str(h)))

    def meas(cohort_keys_multi):
        for r in pq.read_table(root / "clif_vitals.parquet").to_pylist():
            cat = r["vital_category"]
            if cat not in CLIF_CATEGORIES:
                continue
            for sid in cohort_keys_multi.get(str(r["hospitalization_id"]), []):
                vital = CLIF_CATEGORIES[cat]
                src = 0
                if cat in ("sbp", "dbp"):
                    name = (r.get("vital_name") or "").lower()
                    src = 1 if ("arterial" in name or "art bp" in name) else 2
                yield sid, _us(r["recorded_dttm"]), vital, src, r["vital_value"], False

    return stays, meas


def reference_build(source: str, root: str | Path, min_hours: float = 48, sample: int | None = None, seed: int = 0):
    """Pure-Python build.

    Returns
    -------
    dict with ``funnel`` (list of (step, n_stays, n_rows)), ``stays`` (stay_id -> dict with
    subject_id, hadm_id, n_hours, split), ``hourly`` (stay_id -> list of per-hour dicts with the
    six vitals, ``_observed``, ``_z``, event_composite, event_spo2), ``standardisation``
    (vital -> (mean, sd)), ``medians`` (vital -> float).
    """
    root = Path(root)
    stays, meas = _load_mimic(root) if source == "mimic" else _load_clif(root)
    funnel: list[tuple[str, int, int | None]] = [("icu_stays_in_source", len(stays), None)]
    owners = defaultdict(set)
    for s in stays:
        if s["subject_id"] is not None:
            owners[s["stay_id"]].add(s["subject_id"])
    stays = [s for s in stays if len(owners[s["stay_id"]]) <= 1]  # a stay under two subjects is dropped
    funnel.append(("one_subject_per_stay", len(stays), None))
    seen, valid = set(), []
    for s in sorted(stays, key=lambda s: (s["stay_id"], s["in_us"] or 0)):
        if s["subject_id"] is None or s["in_us"] is None or s["out_us"] is None or s["out_us"] <= s["in_us"]:
            continue
        if s["stay_id"] in seen:
            continue
        seen.add(s["stay_id"])
        valid.append(s)
    funnel.append(("valid_times", len(valid), None))
    long_ = [s for s in valid if s["out_us"] - s["in_us"] >= round(min_hours * HOUR_US)]
    funnel.append((f"los_ge_{min_hours:g}h", len(long_), None))
    if sample is not None:
        keep = set(sample_stays([s["stay_id"] for s in long_], sample, seed).tolist())
        long_ = [s for s in long_ if s["stay_id"] in keep]
        funnel.append((f"sampled_{sample}_seed_{seed}", len(long_), None))
    cohort = {s["stay_id"]: s for s in long_}
    for s in long_:
        s["n_hours"] = math.ceil((s["out_us"] - s["in_us"]) / HOUR_US)
    keys: dict = defaultdict(list)
    for s in long_:
        keys[s["key"]].append(s["stay_id"])
    keymap = {k: v[0] for k, v in keys.items()} if source == "mimic" else keys

    counts: defaultdict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    per_ts = defaultdict(list)  # (stay, vital, src, ts) -> values
    for sid, ts, vital, src, v, unit_f in meas(keymap):
        c = counts[sid]
        c[0] += 1
        if v is None:
            continue
        if vital == "temp_c" and (unit_f or v > PLAINLY_FAHRENHEIT_ABOVE):
            v = fahrenheit_to_celsius(v)
        c[1] += 1
        s = cohort[sid]
        if not (s["in_us"] <= ts <= s["out_us"]):
            continue
        c[2] += 1
        lo, hi = PLAUSIBLE[vital]
        if not (lo <= v <= hi):
            continue
        c[3] += 1
        per_ts[(sid, vital, src, ts)].append(v)
    for i, step in enumerate(("vital_rows", "numeric_value", "charttime_within_stay", "plausible_range")):
        funnel.append((step, sum(1 for c in counts.values() if c[i] > 0), sum(c[i] for c in counts.values())))

    per_src = defaultdict(list)
    for (sid, vital, src, ts), vals in per_ts.items():
        s = cohort[sid]
        hour = min((ts - s["in_us"]) // HOUR_US, s["n_hours"] - 1)
        per_src[(sid, hour, vital, src)].append(sum(vals) / len(vals))
    per_vital = defaultdict(list)
    for (sid, hour, vital, _src), vals in per_src.items():
        per_vital[(sid, hour, vital)].append(sum(vals) / len(vals))
    obs = {k: sum(v) / len(v) for k, v in per_vital.items()}

    final = sorted(sid for sid in cohort if counts[sid][3] > 0)
    funnel.append(("stays_with_a_vital", len(final), sum(cohort[s]["n_hours"] for s in final)))
    splits = assign_splits([cohort[s]["subject_id"] for s in final], seed)
    out_stays = {s: dict(subject_id=cohort[s]["subject_id"], hadm_id=cohort[s]["hadm_id"],
                         n_hours=cohort[s]["n_hours"], split=splits[cohort[s]["subject_id"]]) for s in final}
    train = {s for s in final if out_stays[s]["split"] == "train"}
    medians = {}
    for v in VITALS:
        tv = [x for (sid, h, vv), x in obs.items() if vv == v and sid in train]
        av = [x for (sid, h, vv), x in obs.items() if vv == v and sid in out_stays]
        medians[v] = statistics.median(tv) if tv else statistics.median(av)

    hourly = {}
    for sid in final:
        n = cohort[sid]["n_hours"]
        rows: list[dict[str, Any]] = [dict(hour=h) for h in range(n)]
        for v in VITALS:
            col = [obs.get((sid, h, v)) for h in range(n)]
            for h in range(n):
                rows[h][f"{v}_observed"] = col[h] is not None
            last: float | None = None
            for h in range(n):  # forward fill
                if col[h] is None:
                    col[h] = last
                else:
                    last = col[h]
            nxt: float | None = None
            for h in reversed(range(n)):  # back fill
                if col[h] is None:
                    col[h] = nxt
                else:
                    nxt = col[h]
            for h in range(n):
                rows[h][v] = medians[v] if col[h] is None else col[h]
        for r in rows:
            ev = False
            for v, (ev_lo, ev_hi) in EVENT_THRESHOLDS.items():
                if (ev_lo is not None and r[v] < ev_lo) or (ev_hi is not None and r[v] > ev_hi):
                    ev = True
            r["event_composite"] = ev
            r["event_spo2"] = r["spo2"] < SPO2_EVENT_BELOW
        hourly[sid] = rows
    stdz = {}
    for v in VITALS:
        vals = [r[v] for sid in train for r in hourly[sid]]
        sd = statistics.stdev(vals) if len(vals) > 1 else 1.0
        stdz[v] = (statistics.fmean(vals), sd if sd > 0 else 1.0)
    for sid in final:
        for r in hourly[sid]:
            for v in VITALS:
                r[f"{v}_z"] = (r[v] - stdz[v][0]) / stdz[v][1]
    funnel.append(("hourly_tokens", len(final), sum(len(hourly[s]) for s in final)))
    return dict(funnel=funnel, stays=out_stays, hourly=hourly, standardisation=stdz, medians=medians)
