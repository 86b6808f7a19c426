"""Vital-sign definitions shared by every part of the cohort package (SPEC §2).

One place holds the MIMIC-IV itemids, the CLIF categories, the plausibility ranges and the
deterioration thresholds, so that the fast build, the slow reference and the synthetic
generator cannot disagree.

``ITEMIDS`` and ``PLAUSIBLE`` are the seed's vital-sign convention (the build's default); the
mimic-code ``vitalsign`` alternative and both tables are in :mod:`cohort.conventions` and
docs/VITALS.md.
"""
from __future__ import annotations

#: The six vitals, in the column order used everywhere (warehouse, readers, matrices).
VITALS: tuple[str, ...] = ("hr", "sbp", "dbp", "rr", "spo2", "temp_c")

#: Integer code of each vital inside the warehouse's scratch tables.
VITAL_CODE: dict[str, int] = {v: i for i, v in enumerate(VITALS)}

#: Measurement source codes. BP is charted both arterially and non-invasively.
SRC_DEFAULT = 0
SRC_ARTERIAL = 1
SRC_NONINVASIVE = 2

#: MIMIC-IV chartevents itemid -> (vital, source, unit).
ITEMIDS: dict[int, tuple[str, int, str]] = {
    220045: ("hr", SRC_DEFAULT, "bpm"),
    220050: ("sbp", SRC_ARTERIAL, "mmHg"),
    220179: ("sbp", SRC_NONINVASIVE, "mmHg"),
    220051: ("dbp", SRC_ARTERIAL, "mmHg"),
    220180: ("dbp", SRC_NONINVASIVE, "mmHg"),
    220210: ("rr", SRC_DEFAULT, "insp/min"),
    220277: ("spo2", SRC_DEFAULT, "%"),
    223762: ("temp_c", SRC_DEFAULT, "°C"),
    223761: ("temp_c", SRC_DEFAULT, "°F"),
}
FAHRENHEIT_ITEMID = 223761
CELSIUS_ITEMID = 223762

#: A temperature charted as Celsius but above this value is plainly Fahrenheit (e.g. 99.0).
PLAINLY_FAHRENHEIT_ABOVE = 50.0

#: CLIF 2.1 vital_category -> vital name.
CLIF_CATEGORIES: dict[str, str] = {
    "heart_rate": "hr",
    "sbp": "sbp",
    "dbp": "dbp",
    "respiratory_rate": "rr",
    "spo2": "spo2",
    "temp_c": "temp_c",
}

#: Plausible (kept) range per vital after unit conversion, inclusive (SPEC §2).
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "hr": (10.0, 300.0),
    "sbp": (20.0, 300.0),
    "dbp": (5.0, 220.0),
    "rr": (2.0, 80.0),
    "spo2": (30.0, 100.0),
    "temp_c": (25.0, 45.0),
}

#: Deterioration thresholds on raw filled values: (below, above); an hour is an event when
#: value < below or value > above (SPEC §2).
EVENT_THRESHOLDS: dict[str, tuple[float | None, float | None]] = {
    "hr": (40.0, 130.0),
    "sbp": (90.0, 200.0),
    "rr": (6.0, 30.0),
    "spo2": (90.0, None),
    "temp_c": (35.0, 38.5),
}
SPO2_EVENT_BELOW = 90.0

OBSERVED_COLUMNS: tuple[str, ...] = tuple(f"{v}_observed" for v in VITALS)
Z_COLUMNS: tuple[str, ...] = tuple(f"{v}_z" for v in VITALS)
EVENT_COLUMNS: tuple[str, ...] = ("event_composite", "event_spo2")

#: Split fractions by subject (train, val, test).
SPLIT_FRACTIONS: tuple[float, float, float] = (0.70, 0.15, 0.15)


def fahrenheit_to_celsius(v: float) -> float:
    """(v − 32)·5/9."""
    return (v - 32.0) * 5.0 / 9.0
