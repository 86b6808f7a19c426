"""The chartevents items of :mod:`cohort.synthetic`: the nine vital itemids the build reads, a
catalogue of common non-vital itemids the build's scan must read and skip, and the ``value``
strings of both (one dictionary, so a row's text costs one lookup).

Real MIMIC-IV itemids and labels only; the sources (facts, not text) are listed above
:data:`CATALOGUE`, the volume of non-vital rows above :data:`NON_VITAL_ROWS_PER_ICU_HOUR`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from scipy.special import ndtri

# Proportion: the MIMIC-IV demo's chartevents has 668,862 rows (PhysioNet demo v2.2 file listing);
# its nine seed vital itemids have 77,036 rows (counted in the demo's CLIF vitals) over 12,832 ICU
# hours (its CLIF ADT ICU segments): vitals are 11.5 % of the rows, and the other items add
# (668,862 − 77,036) / 12,832 ≈ 46.1 rows per ICU hour. The full MIMIC-IV v3.1 agrees (≈ 433M rows
# over 94,458 stays of mean ≈ 3.6 days ≈ 53 rows per ICU hour in all). The real file spreads the
# non-vital volume over ~3,000 itemids, mostly nursing text items; this catalogue is scaled up
# uniformly to the same volume instead (assumption): ``rate`` is each item's relative weight (the
# demo's rows per ICU hour where known).
#: Non-vital chartevents rows per ICU hour (the demo's figure, derived above).
NON_VITAL_ROWS_PER_ICU_HOUR = 46.1
#: Share of the demo's chartevents rows that are the nine seed vital itemids (77,036 / 668,862).
DEMO_VITAL_ROW_SHARE = 0.115
#: Share of stays on invasive ventilation (assumption) and with an arterial line (as the vitals).
VENT_SHARE = 0.35
ART_SHARE = 0.35

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

#: Text charted instead of a number in a vital's row (``valuenum`` null).
TEXT_VALUES = ("Unable to assess", "Refused", "Patient off unit", "UTA")


@dataclass(frozen=True)
class Item:
    """One non-vital chartevents item. ``values``: ``("num", mean, sd, step, lo, hi)`` (a rounded,
    clipped normal; ``step`` 1, 0.1 or 0.01) or ``("cat", ((text, valuenum or None, weight), ...))``.
    ``when``: the stays that chart it (``all``, ``vent``, ``art``)."""

    itemid: int
    label: str
    abbreviation: str
    category: str
    unit: str | None
    param_type: str
    rate: float
    when: str
    values: tuple


def _n(*pairs):  # numeric choices: ((value, weight), ...) -> cat entries with valuenum
    return ("cat", tuple((None, float(v), w) for v, w in pairs))


_GCS_EYE = ("cat", (("Spontaneously", 4.0, 2049), ("To Speech", 3.0, 809), ("To Pain", 2.0, 212),
                    ("No Response", 1.0, 433)))
_GCS_VERBAL = ("cat", (("Oriented", 5.0, 1461), ("Confused", 4.0, 449), ("Inappropriate Words", 3.0, 65),
                       ("Incomprehensible sounds", 2.0, 82), ("No Response", 1.0, 83),
                       ("No Response-ETT", 1.0, 1360)))
_GCS_MOTOR = ("cat", (("Obeys Commands", 6.0, 2482), ("Localizes Pain", 5.0, 440), ("Flex-withdraws", 4.0, 222),
                      ("Abnormal Flexion", 3.0, 52), ("Abnormal extension", 2.0, 44), ("No response", 1.0, 250)))

# Sources of the catalogue (facts, not text, taken from them):
# * mimic-code (MIT-LCP/mimic-code, mimic-iv/concepts/measurement/): vitalsign.sql (220052, 220181,
#   224642, 225664, 220621), ventilator_setting.sql (224684–224690, 224696, 220339, 224700, 223835,
#   223848, 223849), oxygen_delivery.sql (223834, 226732), rhythm.sql (220048, 224650, 224651),
#   gcs.sql (220739, 223900, 223901, the "No Response-ETT" verbal value).
# * CLIF-MIMIC (Common-Longitudinal-ICU-data-Format/CLIF-MIMIC, data/mappings/mimic-to-clif-mappings
#   - labs.csv): the chartevents lab items 220224, 220235, 223830, 225698, 228640, 220227, 223772
#   with their labels, categories and units.
# * Alarm items (220046, 220047, 223751, 223752, 223769, 223770, 224161, 224162, 224168, 224641,
#   226253): labels as listed by public MIMIC-IV d_items extracts; units follow the item they
#   guard; their rate (≈ 1,200 rows each in the demo's 140 stays) likewise.
# * Text values of ventilator mode, ventilator type and O2 delivery device, their mix, and the GCS
#   component mix: the real demo's CLIF tables (clif_respiratory_support, clif_patient_assessments;
#   aggregate counts). The GCS answer texts other than "No Response-ETT", the rhythm/ectopy/
#   temperature-site texts and all numeric value distributions are clinically plausible assumptions.
CATALOGUE: tuple[Item, ...] = (
    # blood pressure means, charted with the systolic/diastolic pairs
    Item(220181, "Non Invasive Blood Pressure mean", "NBPm", "Routine Vital Signs", "mmHg", "Numeric", 0.706, "all",
         ("num", 78, 12, 1, 30, 160)),
    Item(220052, "Arterial Blood Pressure mean", "ABPm", "Routine Vital Signs", "mmHg", "Numeric", 0.437, "art",
         ("num", 77, 12, 1, 30, 160)),
    # alarm limits
    Item(220046, "Heart rate Alarm - High", "HR Alarm - High", "Alarms", "bpm", "Numeric", 0.094, "all",
         _n((120, 3), (130, 4), (140, 1.5), (110, 1), (150, 0.5))),
    Item(220047, "Heart Rate Alarm - Low", "HR Alarm - Low", "Alarms", "bpm", "Numeric", 0.094, "all",
         _n((50, 6), (40, 1.5), (45, 1), (55, 1), (60, 0.5))),
    Item(223769, "O2 Saturation Pulseoxymetry Alarm - High", "SpO2 Alarm - High", "Alarms", "%", "Numeric", 0.094,
         "all", _n((100, 19), (99, 1))),
    Item(223770, "O2 Saturation Pulseoxymetry Alarm - Low", "SpO2 Alarm - Low", "Alarms", "%", "Numeric", 0.094,
         "all", _n((90, 7), (92, 6), (88, 4), (85, 2), (93, 1))),
    Item(224161, "Resp Alarm - High", "Resp Alarm - High", "Alarms", "insp/min", "Numeric", 0.094, "all",
         _n((35, 4), (30, 3), (40, 2), (45, 1))),
    Item(224162, "Resp Alarm - Low", "Resp Alarm - Low", "Alarms", "insp/min", "Numeric", 0.094, "all",
         _n((8, 5), (6, 2), (5, 1.5), (10, 1.5))),
    Item(223751, "Non-Invasive Blood Pressure Alarm - High", "NBP Alarm - High", "Alarms", "mmHg", "Numeric", 0.094,
         "all", _n((160, 4), (180, 3), (170, 1.5), (150, 1.5))),
    Item(223752, "Non-Invasive Blood Pressure Alarm - Low", "NBP Alarm - Low", "Alarms", "mmHg", "Numeric", 0.094,
         "all", _n((90, 5), (80, 3), (85, 1), (100, 1))),
    Item(226253, "SpO2 Desat Limit", "SpO2 Desat Limit", "Alarms", "%", "Numeric", 0.094, "all",
         _n((85, 5), (88, 3), (90, 2))),
    Item(224641, "Alarms On", "Alarms On", "Alarms", None, "Checkbox", 0.094, "all", _n((1, 1))),
    Item(224168, "Parameters Checked", "Parameters Checked", "Alarms", None, "Checkbox", 0.094, "all", _n((1, 1))),
    # neurological
    Item(220739, "GCS - Eye Opening", "GCS - Eye Opening", "Neurological", None, "Text", 0.273, "all", _GCS_EYE),
    Item(223900, "GCS - Verbal Response", "GCS - Verbal Response", "Neurological", None, "Text", 0.273, "all",
         _GCS_VERBAL),
    Item(223901, "GCS - Motor Response", "GCS - Motor Response", "Neurological", None, "Text", 0.273, "all",
         _GCS_MOTOR),
    # rhythm, temperature site
    Item(220048, "Heart Rhythm", "Heart Rhythm", "Routine Vital Signs", None, "Text", 0.25, "all",
         ("cat", (("SR (Sinus Rhythm)", None, 60), ("ST (Sinus Tachycardia)", None, 15),
                  ("AF (Atrial Fibrillation)", None, 15), ("SB (Sinus Bradycardia)", None, 7),
                  ("Paced", None, 3)))),
    Item(224650, "Ectopy Type 1", "Ectopy Type 1", "Routine Vital Signs", None, "Text", 0.2, "all",
         ("cat", (("None", None, 70), ("PVC's", None, 15), ("PAC's", None, 10), ("Bigeminy", None, 5)))),
    Item(224651, "Ectopy Frequency 1", "Ectopy Frequency 1", "Routine Vital Signs", None, "Text", 0.08, "all",
         ("cat", (("Rare", None, 50), ("Occasional", None, 35), ("Frequent", None, 15)))),
    Item(224642, "Temperature Site", "Temp Site", "Routine Vital Signs", None, "Text", 0.31, "all",
         ("cat", (("Oral", None, 55), ("Axillary", None, 15), ("Blood", None, 15), ("Temporal", None, 10),
                  ("Rectal", None, 5)))),
    # oxygen delivery
    Item(223834, "O2 Flow", "O2 Flow", "Respiratory", "L/min", "Numeric", 0.094, "all",
         _n((2, 35), (3, 20), (4, 15), (1, 10), (6, 10), (10, 5), (15, 5))),
    Item(226732, "O2 Delivery Device(s)", "O2 Delivery Device(s)", "Respiratory", None, "Text", 0.198, "all",
         ("cat", (("Endotracheal tube", None, 1198), ("Nasal cannula", None, 912), ("Aerosol-cool", None, 117),
                  ("Face tent", None, 98), ("Tracheostomy tube", None, 67), ("High flow nasal cannula", None, 46),
                  ("High flow neb", None, 35), ("Bipap mask ", None, 28), ("Non-rebreather", None, 20),
                  ("None", None, 60)))),
    # ventilator settings and measurements (ventilated stays)
    Item(223835, "Inspired O2 Fraction", "FiO2", "Respiratory", None, "Numeric", 0.137, "vent",
         _n((40, 35), (50, 20), (30, 15), (60, 10), (100, 8), (35, 7), (80, 5))),
    Item(220339, "PEEP set", "PEEP set", "Respiratory", "cmH2O", "Numeric", 0.115, "vent",
         _n((5, 60), (8, 15), (10, 15), (12, 5), (14, 5))),
    Item(224700, "Total PEEP Level", "Total PEEP Level", "Respiratory", "cmH2O", "Numeric", 0.1, "vent",
         ("num", 7, 2.5, 1, 0, 25)),
    Item(224688, "Respiratory Rate (Set)", "Respiratory Rate (Set)", "Respiratory", "insp/min", "Numeric", 0.063,
         "vent", _n((14, 20), (16, 25), (18, 20), (20, 15), (12, 10), (22, 10))),
    Item(224689, "Respiratory Rate (spontaneous)", "Respiratory Rate (spontaneous)", "Respiratory", "insp/min",
         "Numeric", 0.08, "vent", ("num", 6, 6, 1, 0, 45)),
    Item(224690, "Respiratory Rate (Total)", "Respiratory Rate (Total)", "Respiratory", "insp/min", "Numeric", 0.104,
         "vent", ("num", 19, 5, 1, 4, 50)),
    Item(224684, "Tidal Volume (set)", "Tidal Volume (set)", "Respiratory", "mL", "Numeric", 0.061, "vent",
         _n((400, 30), (450, 30), (500, 20), (350, 10), (550, 10))),
    Item(224685, "Tidal Volume (observed)", "Tidal Volume (observed)", "Respiratory", "mL", "Numeric", 0.1, "vent",
         ("num", 450, 90, 1, 100, 1000)),
    Item(224686, "Tidal Volume (spontaneous)", "Tidal Volume (spontaneous)", "Respiratory", "mL", "Numeric", 0.05,
         "vent", ("num", 380, 120, 1, 0, 1000)),
    Item(224687, "Minute Volume", "Minute Volume", "Respiratory", "L/min", "Numeric", 0.1, "vent",
         ("num", 8.5, 2.2, 0.1, 1, 25)),
    Item(224696, "Plateau Pressure", "Plateau Pressure", "Respiratory", "cmH2O", "Numeric", 0.05, "vent",
         ("num", 20, 4, 1, 8, 40)),
    Item(223849, "Ventilator Mode", "Ventilator Mode", "Respiratory", None, "Text", 0.115, "vent",
         ("cat", (("CMV/ASSIST/AutoFlow", None, 467), ("CPAP/PSV", None, 467), ("APV (cmv)", None, 230),
                  ("SPONT", None, 145), ("CMV/ASSIST", None, 29), ("PSV/SBT", None, 27), ("Standby", None, 22),
                  ("MMV/PSV/AutoFlow", None, 21), ("P-CMV", None, 15)))),
    Item(223848, "Ventilator Type", "Ventilator Type", "Respiratory", None, "Text", 0.1, "vent",
         ("cat", (("Drager", None, 904), ("Hamilton", None, 396)))),
    Item(228640, "EtCO2", "EtCO2", "Routine Vital Signs", None, "Numeric", 0.012, "vent",
         ("num", 36, 6, 1, 5, 70)),
    # lab values copied into chartevents
    Item(225664, "Glucose finger stick (range 70-100)", "Glucose FS (range 70 -100)", "Routine Vital Signs", "mg/dL",
         "Numeric", 0.095, "all", ("num", 140, 40, 1, 40, 450)),
    Item(220621, "Glucose (serum)", "Glucose (serum)", "Labs", "mg/dL", "Numeric", 0.05, "all",
         ("num", 135, 35, 1, 40, 450)),
    Item(220224, "Arterial O2 pressure", "PO2 (Arterial)", "Labs", "mmHg", "Numeric", 0.04, "vent",
         ("num", 110, 40, 1, 30, 500)),
    Item(220235, "Arterial CO2 Pressure", "PCO2 (Arterial)", "Labs", "mmHg", "Numeric", 0.04, "vent",
         ("num", 40, 7, 1, 15, 90)),
    Item(223830, "PH (Arterial)", "PH (Arterial)", "Labs", None, "Numeric", 0.04, "vent",
         ("num", 7.38, 0.06, 0.01, 6.8, 7.7)),
    Item(225698, "TCO2 (calc) Arterial", "TCO2 (calc) Arterial", "Labs", None, "Numeric", 0.04, "vent",
         ("num", 25, 4, 1, 8, 45)),
    Item(220227, "Arterial O2 Saturation", "SaO2", "Labs", "%", "Numeric", 0.012, "vent",
         ("num", 96, 2.5, 1, 60, 100)),
    Item(223772, "SvO2", "SvO2", "Hemodynamics", "%", "Numeric", 0.02, "art", ("num", 68, 8, 1, 30, 95)),
)

#: Uniform-bucket resolution of the per-item value lookup tables.
QUANTILE_BUCKETS = 4096
_BUCKET_BITS = 12


def fmt_number(x: float) -> str:
    """``value`` text of a charted number: shortest decimal, no trailing ``.0`` (72 → "72")."""
    s = repr(float(x))
    return s[:-2] if s.endswith(".0") else s


class ValueTable:
    """One string dictionary for the ``value`` column of every chunk, with its ``valuenum``.

    Entries: the numbers 0–1000 in steps of 0.1 (``grid01``), 0–20 in steps of 0.01
    (``grid001``), then every categorical text and :data:`TEXT_VALUES`. ``item_table`` (shape
    (n_items, QUANTILE_BUCKETS)) maps a uniform bucket to an entry for each catalogue item, so a
    non-vital row's value is one lookup. Numbers off both grids (rare vital values) are formatted
    per chunk by :meth:`vital_index`."""

    def __init__(self, catalogue: tuple[Item, ...] = CATALOGUE):
        g01 = np.round(np.arange(10_001) / 10.0, 1)
        g001 = np.round(np.arange(2_001) / 100.0, 2)
        strings = [fmt_number(v) for v in g01] + [fmt_number(v) for v in g001]
        vnum = list(g01) + list(g001)
        self.n01, self.off001 = g01.size, g01.size
        texts: dict[tuple[str, float | None], int] = {}

        def text_entry(t: str, vn: float | None) -> int:
            key = (t, vn)
            if key not in texts:
                texts[key] = len(strings)
                strings.append(t)
                vnum.append(np.nan if vn is None else vn)
            return texts[key]

        self.text_values = np.array([text_entry(t, None) for t in TEXT_VALUES], dtype=np.int32)
        p = (np.arange(QUANTILE_BUCKETS) + 0.5) / QUANTILE_BUCKETS
        table = np.empty((len(catalogue), QUANTILE_BUCKETS), dtype=np.int32)
        for i, it in enumerate(catalogue):
            kind = it.values[0]
            if kind == "num":
                _, mu, sd, step, lo, hi = it.values
                x = np.clip(mu + sd * ndtri(p), lo, hi)
                table[i] = self.number_index(x, step)
            elif kind == "cat":
                choices = it.values[1]
                w = np.array([c[2] for c in choices], dtype=float)
                edges = np.cumsum(w) / w.sum()
                pick = np.minimum(np.searchsorted(edges, p, side="right"), len(choices) - 1)
                ent = np.array([self.number_index(np.array([vn]), 1)[0] if t is None else text_entry(t, vn)
                                for t, vn, _ in choices], dtype=np.int32)
                table[i] = ent[pick]
            else:  # pragma: no cover - catalogue is static
                raise ValueError(f"unknown value model {kind!r} for itemid {it.itemid}")
        self.item_table = table
        self.strings = pa.array(strings, pa.string())
        self.valuenum = np.array(vnum, dtype=np.float64)

    def number_index(self, x: np.ndarray, step: float) -> np.ndarray:
        """Entries of numbers on a grid (``step`` 1 or 0.1: grid01; 0.01: grid001), rounded to it."""
        if step >= 0.1:
            k = np.rint(np.round(x / step) * step * 10.0).astype(np.int64)
            if k.min(initial=0) < 0 or k.max(initial=0) >= self.n01:
                raise ValueError("number outside the 0-1000 grid")
            return k.astype(np.int32)
        k = np.rint(x * 100.0).astype(np.int64)
        if k.min(initial=0) < 0 or k.max(initial=0) > 2000:
            raise ValueError("number outside the 0-20 grid")
        return (self.off001 + k).astype(np.int32)

    def vital_index(self, val: np.ndarray) -> tuple[np.ndarray, pa.Array]:
        """Entries for charted vital numbers (any float): on the 0.1 grid a lookup, otherwise an
        extra entry appended to a per-chunk copy of the dictionary. Returns (indices, strings)."""
        k = np.rint(val * 10.0)
        ok = (k >= 0) & (k < self.n01) & (np.abs(k / 10.0 - val) < 1e-9)
        idx = np.where(ok, k, 0).astype(np.int32)
        if ok.all():
            return idx, self.strings
        extra, inv = np.unique(val[~ok], return_inverse=True)
        idx[~ok] = len(self.strings) + inv.astype(np.int32)
        return idx, pa.concat_arrays([self.strings, pa.array([fmt_number(v) for v in extra], pa.string())])


def d_items_rows(catalogue: tuple[Item, ...] = CATALOGUE) -> list[tuple]:
    """(itemid, label, abbreviation, linksto, category, unitname, param_type, lownormalvalue,
    highnormalvalue) of every item the generator charts, sorted by itemid."""
    rows: list[tuple] = [(i, lab, ab, "chartevents", cat, u, "Numeric", None, None)
                         for i, (lab, ab, u, cat) in VITAL_ITEMS.items()]
    rows += [(it.itemid, it.label, it.abbreviation, "chartevents", it.category, it.unit, it.param_type, None, None)
             for it in catalogue]
    return sorted(rows)
