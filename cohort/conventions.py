"""Vital-sign conventions: which itemids (CLIF categories) feed each vital and which values are kept.

Two conventions, chosen with ``build_warehouse(..., convention=...)`` or
``python -m cohort.build --convention ...``; the full table and the reasons are in
``docs/VITALS.md``.

``"seed"`` (default)
    What the seed build always did, and what :mod:`cohort.constants` holds (``ITEMIDS``,
    ``PLAUSIBLE``, ``PLAINLY_FAHRENHEIT_ABOVE``): nine itemids; one closed range per vital on the
    converted value; a temperature charted as °C but above 50 is taken for °F and converted.
    Default builds are unchanged by this module (same SQL, same content hash).

``"mimic_code"``
    The itemids and value limits of the MIMIC Code Repository's MIMIC-IV ``vitalsign`` concept
    (``mimic-iv/concepts/measurement/vitalsign.sql``, MIT-LCP/mimic-code): additionally the
    "ART BP" arterial pressures 225309/225310 and "Respiratory Rate (Total)" 224690; open
    limits (0, 300) / (0, 400) / (0, 300) / (0, 70) / (0, 100]; temperature kept in (10, 50)
    when charted as °C and in (70, 120) °F (raw, before conversion) when charted as °F, with no
    "plainly °F" re-interpretation. Only the selection and the limits follow mimic-code; the
    hourly aggregation (per-source means, the mean of the two BP sources) is this project's for
    both conventions.

CLIF has no itemids: both conventions read the same ``vital_category`` values and differ there
only in the limits (CLIF temperatures arrive in °C, so the °C limits apply to every row).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cohort.constants import (
    CELSIUS_ITEMID,
    CLIF_CATEGORIES,
    FAHRENHEIT_ITEMID,
    ITEMIDS,
    PLAINLY_FAHRENHEIT_ABOVE,
    PLAUSIBLE,
    SRC_ARTERIAL,
    SRC_DEFAULT,
    SRC_NONINVASIVE,
    VITAL_CODE,
    fahrenheit_to_celsius,
)

SEED = "seed"
MIMIC_CODE = "mimic_code"
CONVENTIONS: tuple[str, ...] = (SEED, MIMIC_CODE)

#: ``d_items.label`` of every itemid either convention reads (MIMIC-IV v3.1 and its demo).
ITEM_LABELS: dict[int, str] = {
    220045: "Heart Rate",
    220050: "Arterial Blood Pressure systolic",
    220051: "Arterial Blood Pressure diastolic",
    225309: "ART BP Systolic",
    225310: "ART BP Diastolic",
    220179: "Non Invasive Blood Pressure systolic",
    220180: "Non Invasive Blood Pressure diastolic",
    220210: "Respiratory Rate",
    224690: "Respiratory Rate (Total)",
    220277: "O2 saturation pulseoxymetry",
    223762: "Temperature Celsius",
    223761: "Temperature Fahrenheit",
}


@dataclass(frozen=True)
class Range:
    """Kept values ``lo ⋖ v ⋖ hi``; each end closed (≤) or open (<)."""

    lo: float
    hi: float
    lo_closed: bool = True
    hi_closed: bool = True

    def contains(self, v: float) -> bool:
        above = v >= self.lo if self.lo_closed else v > self.lo
        below = v <= self.hi if self.hi_closed else v < self.hi
        return bool(above and below)

    def sql(self, col: str) -> str:
        """The test as SQL on ``col`` (``BETWEEN`` when both ends are closed)."""
        if self.lo_closed and self.hi_closed:
            return f"{col} BETWEEN {self.lo} AND {self.hi}"
        lo = f"{col} {'>=' if self.lo_closed else '>'} {self.lo}"
        hi = f"{col} {'<=' if self.hi_closed else '<'} {self.hi}"
        return f"({lo} AND {hi})"

    def __str__(self) -> str:
        return f"{'[' if self.lo_closed else '('}{self.lo:g}, {self.hi:g}{']' if self.hi_closed else ')'}"


@dataclass(frozen=True)
class Convention:
    """One vital-sign convention.

    itemids : MIMIC-IV chartevents itemid -> (vital, source, unit); every (vital, source) pair
        must be one the hourly step knows (:data:`cohort.constants.ITEMIDS`' pairs).
    plausible : vital -> kept range of the value after unit conversion (°C for temperature).
    fahrenheit_raw : kept range of the *charted* °F value of the Fahrenheit itemid, tested
        before conversion; None: the Fahrenheit itemid is converted and tested with
        ``plausible["temp_c"]``.
    plainly_fahrenheit_above : a value charted as °C above this is converted as °F (None: never).
    clif_categories : CLIF ``vital_category`` -> vital.
    """

    name: str
    itemids: dict[int, tuple[str, int, str]]
    plausible: dict[str, Range]
    fahrenheit_raw: Range | None
    plainly_fahrenheit_above: float | None
    clif_categories: dict[str, str] = field(default_factory=lambda: dict(CLIF_CATEGORIES))
    reference: str = ""

    # -- SQL used by the build (the seed's strings are exactly those of the seed build) -----
    def value_sql(self) -> str:
        """Converted value from the adapter's ``vital``, ``value`` and ``unit_f`` columns."""
        t = VITAL_CODE["temp_c"]
        if self.plainly_fahrenheit_above is None:
            cond = "unit_f"
        else:
            cond = f"(unit_f OR value > {self.plainly_fahrenheit_above})"
        return f"CASE WHEN vital = {t} AND {cond} THEN (value - 32.0) * 5.0 / 9.0 ELSE value END"

    def plausible_case_sql(self, col: str = "value", code: str = "vs // 4") -> str:
        """Plausible-range test as one CASE on the vital code; with ``fahrenheit_raw`` the
        temperature test also reads ``unit_f`` (the charted °F limits, mapped through the same
        conversion the value went through, so a raw bound and its converted bound agree)."""
        whens = []
        for v, r in self.plausible.items():
            test = r.sql(col)
            if v == "temp_c" and self.fahrenheit_raw is not None:
                f = self.fahrenheit_raw
                fc = Range(fahrenheit_to_celsius(f.lo), fahrenheit_to_celsius(f.hi), f.lo_closed, f.hi_closed)
                test = f"(CASE WHEN unit_f THEN {fc.sql(col)} ELSE {test} END)"
            whens.append(f"WHEN {VITAL_CODE[v]} THEN {test}")
        return f"(CASE {code} {' '.join(whens)} ELSE false END)"

    # -- the same rules in Python (tests, docs) --------------------------------------------
    def keeps(self, itemid: int, value: float) -> bool:
        """Whether a charted MIMIC-IV row (itemid, valuenum) is kept, after conversion."""
        if itemid not in self.itemids:
            return False
        vital = self.itemids[itemid][0]
        if vital == "temp_c":
            f = itemid == FAHRENHEIT_ITEMID
            if f and self.fahrenheit_raw is not None:
                return self.fahrenheit_raw.contains(value)
            plainly = self.plainly_fahrenheit_above is not None and value > self.plainly_fahrenheit_above
            if f or plainly:
                value = fahrenheit_to_celsius(value)
        return self.plausible[vital].contains(value)

    def table(self) -> list[dict]:
        """One row per itemid: itemid, d_items label, vital, source, unit, kept range."""
        src = {SRC_DEFAULT: "", SRC_ARTERIAL: "arterial", SRC_NONINVASIVE: "non-invasive"}
        rows = []
        for i, (v, s, unit) in self.itemids.items():
            as_f = i == FAHRENHEIT_ITEMID and self.fahrenheit_raw is not None
            r = self.fahrenheit_raw if as_f else self.plausible[v]
            note = ""
            if i == FAHRENHEIT_ITEMID:
                note = ("converted to °C, then the °C range" if self.fahrenheit_raw is None
                        else "tested as charted (°F), then converted to °C")
            elif i == CELSIUS_ITEMID:
                note = (f"> {self.plainly_fahrenheit_above:g} taken as °F and converted first"
                        if self.plainly_fahrenheit_above is not None else "no °F re-interpretation")
            rows.append({"itemid": i, "label": ITEM_LABELS[i], "vital": v, "source": src[s],
                         "unit": "°F" if as_f else
                         ("°C" if v == "temp_c" else unit), "range": str(r), "note": note})
        return rows


SEED_CONVENTION = Convention(
    name=SEED,
    itemids=dict(ITEMIDS),
    plausible={v: Range(lo, hi) for v, (lo, hi) in PLAUSIBLE.items()},
    fahrenheit_raw=None,
    plainly_fahrenheit_above=PLAINLY_FAHRENHEIT_ABOVE,
    reference="the seed build (SPEC §2)",
)

MIMIC_CODE_CONVENTION = Convention(
    name=MIMIC_CODE,
    itemids={
        220045: ("hr", SRC_DEFAULT, "bpm"),
        220050: ("sbp", SRC_ARTERIAL, "mmHg"),
        225309: ("sbp", SRC_ARTERIAL, "mmHg"),
        220179: ("sbp", SRC_NONINVASIVE, "mmHg"),
        220051: ("dbp", SRC_ARTERIAL, "mmHg"),
        225310: ("dbp", SRC_ARTERIAL, "mmHg"),
        220180: ("dbp", SRC_NONINVASIVE, "mmHg"),
        220210: ("rr", SRC_DEFAULT, "insp/min"),
        224690: ("rr", SRC_DEFAULT, "insp/min"),
        220277: ("spo2", SRC_DEFAULT, "%"),
        223762: ("temp_c", SRC_DEFAULT, "°C"),
        223761: ("temp_c", SRC_DEFAULT, "°F"),
    },
    plausible={
        "hr": Range(0.0, 300.0, False, False),
        "sbp": Range(0.0, 400.0, False, False),
        "dbp": Range(0.0, 300.0, False, False),
        "rr": Range(0.0, 70.0, False, False),
        "spo2": Range(0.0, 100.0, False, True),
        "temp_c": Range(10.0, 50.0, False, False),
    },
    fahrenheit_raw=Range(70.0, 120.0, False, False),
    plainly_fahrenheit_above=None,
    reference="MIT-LCP/mimic-code, mimic-iv/concepts/measurement/vitalsign.sql",
)

_BY_NAME = {c.name: c for c in (SEED_CONVENTION, MIMIC_CODE_CONVENTION)}


def get_convention(name: str | Convention) -> Convention:
    """The convention called ``name`` (``"seed"`` or ``"mimic_code"``)."""
    if isinstance(name, Convention):
        return name
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        from cohort.errors import BadParameterError

        raise BadParameterError(
            f"unknown vital-sign convention {name!r}; expected one of {', '.join(CONVENTIONS)}") from None


def markdown_table(name: str) -> str:
    """The convention's itemid/range table as Markdown (docs/VITALS.md is checked against it)."""
    rows = get_convention(name).table()
    out = ["| itemid | d_items label | vital | source | kept range | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        unit = f" {r['unit']}" if r["unit"] else ""
        out.append(f"| {r['itemid']} | {r['label']} | {r['vital']} | {r['source'] or '–'} | "
                   f"{r['range']}{unit} | {r['note'] or '–'} |")
    return "\n".join(out)
