"""MEDS (Medical Event Data Standard, v0.4) as a source of the hourly warehouse: the code map,
the layout check and the build's input adapter. The export is :mod:`cohort.meds_export`.

A MEDS dataset is a folder ``<root>/data/**/*.parquet`` of event shards (``subject_id`` int64,
``time`` timestamp[us], ``code`` string, ``numeric_value`` float32, extra columns allowed) with
``<root>/metadata/``; the schemas are those of ``meds==0.4.*`` (the ``meds`` extra; this module
needs only DuckDB and pyarrow, the tests validate with the package). Stays come from the
``ICU_ADMISSION`` / ``ICU_DISCHARGE`` events grouped by ``icustay_id`` and ``subject_id``;
measurements are the events whose code is in the :class:`CodeMap` (default:
:func:`default_code_map`, the MIMIC_IV_MEDS chartevents codes ``LAB//<itemid>//*`` of the
convention's itemids and this project's export codes; ``--meds-codes FILE``:
:func:`load_code_map`). The build then applies the same conversions, ranges, funnel and
forget-registry exclusion as for every source. docs/MEDS.md has the rules, the code-map format
and the sources looked up (facts only).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cohort.constants import FAHRENHEIT_ITEMID, SRC_ARTERIAL, SRC_DEFAULT, SRC_NONINVASIVE, VITAL_CODE, VITALS
from cohort.conventions import SEED, Convention, get_convention
from cohort.errors import (
    BadParameterError,
    ColumnTypeError,
    InputMissingError,
    MissingColumnsError,
    UnreadableInputError,
    redact,
)
from cohort.sources import INTEGER_TYPES, Adapter

#: the MEDS version whose schemas the export writes and the reader expects
MEDS_VERSION = "0.4.1"
MEDS_LAYOUT = ("MEDS v0.4 layout: <root>/data/**/*.parquet event shards (subject_id, time, code, numeric_value and "
               "the stay column, icustay_id by default), <root>/metadata/ optional")
ICU_ADMISSION, ICU_DISCHARGE, STAY_COLUMN = "ICU_ADMISSION", "ICU_DISCHARGE", "icustay_id"
#: the project's train/val/test as MEDS split names
MEDS_SPLIT = {"train": "train", "val": "tuning", "test": "held_out"}

#: vital -> (code of this project's hourly-mean events, unit); see :mod:`cohort.meds_export`
HOURLY_CODES: dict[str, str] = {
    "hr": "HOURLY_MEAN//HR//bpm", "sbp": "HOURLY_MEAN//SBP//mmHg", "dbp": "HOURLY_MEAN//DBP//mmHg",
    "rr": "HOURLY_MEAN//RR//insp/min", "spo2": "HOURLY_MEAN//SPO2//%", "temp_c": "HOURLY_MEAN//TEMP//°C",
}
_SOURCES = {"": SRC_DEFAULT, "arterial": SRC_ARTERIAL, "non-invasive": SRC_NONINVASIVE}
_SOURCE_NAME = {v: k for k, v in _SOURCES.items()}


def chartevents_code(itemid: int, unit: str) -> str:
    """The MIMIC_IV_MEDS code of a chartevents row: ``LAB//<itemid>//<valueuom>``."""
    return f"LAB//{int(itemid)}//{unit}"


@dataclass(frozen=True)
class Target:
    """What a matched code means: the vital, its measurement source, whether the value is °F."""

    vital: str
    source: int = SRC_DEFAULT
    fahrenheit: bool = False


@dataclass(frozen=True)
class CodeMap:
    """MEDS code -> vital, and how stays are found. See the module docstring."""

    vitals: dict[str, Target]
    icu_admission: str = ICU_ADMISSION
    icu_discharge: str = ICU_DISCHARGE
    stay_column: str = STAY_COLUMN
    patterns: list[tuple[str, bool, Target]] = field(default_factory=list, compare=False)

    def __post_init__(self):
        exact = [(c, True, t) for c, t in self.vitals.items() if not c.endswith("*")]
        prefix = sorted(((c[:-1], False, t) for c, t in self.vitals.items() if c.endswith("*")),
                        key=lambda p: -len(p[0]))
        object.__setattr__(self, "patterns", exact + prefix)

    def to_json(self) -> dict:
        def one(t: Target) -> dict:
            d: dict[str, Any] = {"vital": t.vital}
            if t.vital in ("sbp", "dbp"):
                d["source"] = _SOURCE_NAME[t.source]
            if t.fahrenheit:
                d["fahrenheit"] = True
            return d
        return {"vitals": {c: one(t) for c, t in self.vitals.items()}, "icu_admission": self.icu_admission,
                "icu_discharge": self.icu_discharge, "stay_column": self.stay_column}

    def digest(self) -> str:
        """sha256 of the canonical JSON (recorded in the warehouse's build params)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    def case_sql(self, code: str = "code") -> tuple[str, str, str, str]:
        """The map as SQL: ``k``, the index of the pattern the column ``code`` matches (NULL when
        the map reads no such code), and, over a column ``k``, the vital code (UTINYINT), the
        source code (UTINYINT) and whether the value is °F (the adapters' ``vital``, ``src``,
        ``unit_f``)."""
        pats = self.patterns
        match = "CASE " + " ".join(
            f"WHEN {code + ' = ' + _sql_str(c) if exact else 'starts_with(' + code + ', ' + _sql_str(c) + ')'} "
            f"THEN {i}" for i, (c, exact, _) in enumerate(pats)) + " END"
        vital = " ".join(f"WHEN {i} THEN {VITAL_CODE[t.vital]}" for i, (_, _, t) in enumerate(pats))
        src = " ".join(f"WHEN {i} THEN {t.source}" for i, (_, _, t) in enumerate(pats))
        f_ids = [str(i) for i, (_, _, t) in enumerate(pats) if t.fahrenheit]
        return (match, f"CAST(CASE k {vital} END AS UTINYINT)", f"CAST(CASE k {src} END AS UTINYINT)",
                f"k IN ({', '.join(f_ids)})" if f_ids else "false")


def default_code_map(convention: str | Convention = SEED) -> CodeMap:
    """``LAB//<itemid>//*`` for every itemid of ``convention`` (MIMIC_IV_MEDS's chartevents
    codes), plus this project's ``HOURLY_MEAN//…`` codes (its own export reads back)."""
    conv = get_convention(convention)
    vitals = {f"LAB//{i}//*": Target(v, s, i == FAHRENHEIT_ITEMID) for i, (v, s, _) in conv.itemids.items()}
    for v, code in HOURLY_CODES.items():
        vitals[code] = Target(v, SRC_NONINVASIVE if v in ("sbp", "dbp") else SRC_DEFAULT)
    return CodeMap(vitals)


def _target(code: str, spec: Any) -> Target:
    where = f"--meds-codes: code {code!r}"
    if isinstance(spec, str):
        spec = {"vital": spec}
    if not isinstance(spec, dict) or set(spec) - {"vital", "source", "fahrenheit"}:
        raise BadParameterError(f"{where}: expected a vital name or {{vital, source, fahrenheit}}")
    vital = spec.get("vital")
    if vital not in VITALS:
        raise BadParameterError(f"{where}: vital {vital!r} is not one of {', '.join(VITALS)}")
    bp = vital in ("sbp", "dbp")
    source = spec.get("source", "non-invasive" if bp else "")
    if source not in _SOURCES or bp != (source != ""):
        ok = "arterial or non-invasive" if bp else "no source (only blood pressure has one)"
        raise BadParameterError(f"{where}: source {source!r}; {vital} takes {ok}")
    f = spec.get("fahrenheit", False)
    if not isinstance(f, bool) or (f and vital != "temp_c"):
        raise BadParameterError(f"{where}: fahrenheit must be true or false, and true only for temp_c")
    return Target(vital, _SOURCES[source], f)


def load_code_map(spec: str | Path | dict | CodeMap | None, convention: str | Convention = SEED) -> CodeMap:
    """The code map from a JSON file path, a dict or a :class:`CodeMap` (None: the default)."""
    if spec is None:
        return default_code_map(convention)
    if isinstance(spec, CodeMap):
        return spec
    if not isinstance(spec, dict):
        p = Path(spec)
        if not p.is_file():
            raise InputMissingError(f"--meds-codes {p}: no such file")
        try:
            spec = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise BadParameterError(f"--meds-codes {p}: not readable JSON ({type(exc).__name__})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("vitals"), dict) or not spec["vitals"]:
        raise BadParameterError("--meds-codes: expected a JSON object with a non-empty \"vitals\" object")
    extra = set(spec) - {"vitals", "icu_admission", "icu_discharge", "stay_column"}
    if extra:
        raise BadParameterError(f"--meds-codes: unknown key(s) {', '.join(sorted(extra))}")
    vitals = {}
    for code, t in spec["vitals"].items():
        if not code or "*" in code[:-1] or code == "*":
            raise BadParameterError(f"--meds-codes: code {code!r}: '*' may only end a prefix")
        vitals[code] = _target(code, t)
    kw = {}
    for k in ("icu_admission", "icu_discharge", "stay_column"):
        if k in spec:
            if not isinstance(spec[k], str) or not spec[k]:
                raise BadParameterError(f"--meds-codes: {k} must be a non-empty string")
            kw[k] = spec[k]
    return CodeMap(vitals, **kw)


# ------------------------------------------------------------------------------ layout check
def _sql_str(s: str | Path) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def find_shards(root: str | Path) -> list[Path]:
    """The data shards of a MEDS root (``data/**/*.parquet``, sorted; hidden files ignored).

    Raises InputMissingError (no root, no ``data/`` folder, no shard) or UnreadableInputError (a
    file under ``data/`` that is not a ``.parquet`` shard)."""
    root = Path(root)
    if not root.is_dir():
        raise InputMissingError(f"MEDS root {root} is not a directory. Expected {MEDS_LAYOUT}.")
    data = root / "data"
    if not data.is_dir():
        raise InputMissingError(f"MEDS root {root} has no data/ folder. Expected {MEDS_LAYOUT}.")
    shards = []
    for f in sorted(data.rglob("*")):
        if f.is_dir() or f.name.startswith("."):
            continue
        if not f.name.endswith(".parquet"):
            raise UnreadableInputError(f"{f}: not a Parquet shard (a MEDS data folder holds only *.parquet files)")
        shards.append(f)
    if not shards:
        raise InputMissingError(f"MEDS data folder {data} holds no *.parquet shard. Expected {MEDS_LAYOUT}.")
    return shards


def _expected(col: str, stay_column: str) -> tuple[str, tuple[str, ...]]:
    if col in ("subject_id", "hadm_id", stay_column):
        return "an integer", INTEGER_TYPES
    if col == "time":
        return "a timestamp", ("TIMESTAMP",)
    if col == "code":
        return "a string", ("VARCHAR",)
    return "a float", ("FLOAT", "DOUBLE")


def check_meds_root(root: str | Path, codes: CodeMap | None = None, con=None,
                    require_stay: bool = True) -> tuple[list[Path], set[str]]:
    """Check a MEDS root the way the build reads it, from the Parquet footers only: the shards
    exist, each is Parquet, has ``subject_id``, ``time``, ``code``, ``numeric_value`` and (with
    ``require_stay``, the build's need) the stay column, each of the right type. Returns (shards,
    columns present in any shard).

    Raises InputMissingError, UnreadableInputError, MissingColumnsError or ColumnTypeError (the
    first problem found; the message names the file)."""
    import duckdb

    codes = codes or default_code_map()
    shards = find_shards(root)
    required = ["subject_id", "time", "code", "numeric_value", *([codes.stay_column] if require_stay else [])]
    own = con is None
    con = duckdb.connect() if own else con
    seen: set[str] = set()
    try:
        for f in shards:
            try:
                desc = con.execute(f"DESCRIBE SELECT * FROM read_parquet({_sql_str(f)})").fetchall()
            except duckdb.Error as exc:
                raise UnreadableInputError(f"{f}: cannot be read as parquet ({type(exc).__name__}: "
                                           f"{redact(str(exc).splitlines()[0][:300])})") from exc
            types = {r[0]: str(r[1]).upper() for r in desc}
            missing = [c for c in required if c not in types]
            if missing:
                raise MissingColumnsError(str(f), missing, list(types))
            for c in [*required, *(["hadm_id"] if "hadm_id" in types else [])]:
                what, ok = _expected(c, codes.stay_column)
                if not types[c].startswith(ok):
                    raise ColumnTypeError(f"{f}: column {c} is {types[c]}, expected {what} ({MEDS_LAYOUT})")
            seen |= set(types)
    finally:
        if own:
            con.close()
    return shards, seen


def read_dataset_metadata(root: str | Path) -> dict:
    """``metadata/dataset.json`` of a MEDS root ({} when absent or not a JSON object)."""
    p = Path(root) / "metadata" / "dataset.json"
    try:
        obj = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


# ------------------------------------------------------------------------------ the adapter
class MedsAdapter(Adapter):
    """The build's input adapter over a MEDS root (the contract of :mod:`cohort.sources`:
    ``stays_sql()`` and ``measurements_sql(cohort_table)``)."""

    name = "meds"

    def __init__(self, root: str | Path, con, convention: str | Convention = SEED,
                 codes: str | Path | dict | CodeMap | None = None):
        self.convention = get_convention(convention)
        self.codes = load_code_map(codes, self.convention)
        self.shards, self.columns = check_meds_root(root, self.codes, con)
        self.scan_files = [Path(root) / "data"]
        files = ", ".join(_sql_str(f) for f in self.shards)
        self.reader = f"read_parquet([{files}], union_by_name = true)"

    def _is(self, prefix: str) -> str:
        return f"(code = {_sql_str(prefix)} OR starts_with(code, {_sql_str(prefix + '//')}))"

    def stays_sql(self) -> str:
        stay = _ident(self.codes.stay_column)
        hadm = "hadm_id" if "hadm_id" in self.columns else "NULL"
        adm, dis = self._is(self.codes.icu_admission), self._is(self.codes.icu_discharge)
        return f"""
            SELECT CAST(stay AS BIGINT) AS stay_id, CAST(subject_id AS BIGINT) AS subject_id,
                   CAST(max(hadm) AS BIGINT) AS hadm_id,
                   make_timestamp(min(CASE WHEN adm THEN epoch_us(time) END)) AS intime,
                   make_timestamp(max(CASE WHEN NOT adm THEN epoch_us(time) END)) AS outtime,
                   CAST(stay AS VARCHAR) AS join_key
            FROM (SELECT {stay} AS stay, subject_id, {hadm} AS hadm, time, {adm} AS adm
                  FROM {self.reader} WHERE ({adm} OR {dis}) AND {stay} IS NOT NULL)
            GROUP BY stay, subject_id
        """

    def measurements_sql(self, cohort_table: str) -> str:
        match, vital, src, unit_f = self.codes.case_sql("m.code")
        stay = _ident(self.codes.stay_column)
        return f"""
            SELECT stay_id, ts_us, {vital} AS vital, {src} AS src, value, {unit_f} AS unit_f
            FROM (SELECT c.stay_id, epoch_us(m.time) AS ts_us, CAST(m.numeric_value AS DOUBLE) AS value,
                         {match} AS k
                  FROM {self.reader} AS m
                  JOIN {cohort_table} AS c ON CAST(m.{stay} AS BIGINT) = c.stay_id
                                          AND CAST(m.subject_id AS BIGINT) = c.subject_id)
            WHERE k IS NOT NULL
        """


def markdown_code_map(convention: str | Convention = SEED) -> str:
    """The default code map as a Markdown table (docs/MEDS.md is checked against it)."""
    from cohort.conventions import ITEM_LABELS

    conv = get_convention(convention)
    out = ["| MEDS code | vital | source | unit read as | origin |", "|---|---|---|---|---|"]
    for code, t in default_code_map(conv).vitals.items():
        if code.startswith("LAB//"):
            i = int(code.split("//")[1])
            origin = f"MIMIC_IV_MEDS chartevents, itemid {i} ({ITEM_LABELS[i]})"
        else:
            origin = "this project's export (hourly mean)"
        unit = "°F (converted)" if t.fahrenheit else ("°C" if t.vital == "temp_c" else "as charted")
        out.append(f"| `{code}` | {t.vital} | {_SOURCE_NAME[t.source] or '–'} | {unit} | {origin} |")
    return "\n".join(out)
