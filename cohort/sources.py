"""Input adapters: MIMIC-IV native layout and CLIF 2.1 parquet (and MEDS, :mod:`cohort.meds`),
one output contract.

Each adapter checks its files (presence, readability, required columns) and then gives the
build two SQL relations over DuckDB:

* ``stays_sql()`` -> ``(stay_id BIGINT, subject_id BIGINT, hadm_id BIGINT, intime TIMESTAMP,
  outtime TIMESTAMP, join_key)``: every ICU stay of the source, unfiltered.
* ``measurements_sql(cohort_table)`` -> ``(stay_id, ts_us BIGINT, vital UTINYINT, src UTINYINT,
  value DOUBLE, unit_f BOOLEAN)``: the six vitals' rows (the build joins them to the cohort's
  stays in ``cohort_table``, which has ``stay_id`` and ``join_key``), with the itemid / category
  filter pushed into the
  scan. ``value`` is the charted number (``valuenum``; NULL when only text was charted);
  ``unit_f`` marks a Fahrenheit itemid. Unit conversion and the
  plausibility filter are applied by the build, identically for both adapters.

Which itemids (CLIF categories) are read is the adapter's ``convention``
(:mod:`cohort.conventions`; default ``"seed"``, the itemids of :data:`cohort.constants.ITEMIDS`).

Times are carried as microseconds since the epoch (``epoch_us``), which treats a naive
timestamp as UTC and converts a ``TIMESTAMPTZ`` to UTC, so both layouts compare alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from cohort.constants import FAHRENHEIT_ITEMID, VITAL_CODE
from cohort.conventions import SEED, Convention, get_convention
from cohort.errors import ColumnTypeError, InputMissingError, MissingColumnsError, UnreadableInputError, redact

NATIVE_LAYOUT = (
    "MIMIC-IV v3.1 native layout: <root>/icu/icustays, <root>/icu/chartevents, "
    "<root>/icu/d_items, <root>/hosp/patients, <root>/hosp/admissions, "
    "each as .csv.gz (as distributed), .csv or .parquet"
)
CLIF_LAYOUT = (
    "CLIF 2.1 layout: <root>/clif_adt, <root>/clif_vitals, <root>/clif_hospitalization, "
    "<root>/clif_patient, each as .parquet"
)
_EXTS = (".csv.gz", ".csv", ".parquet")

#: DuckDB types forced on known MIMIC CSV columns (others are sniffed).
_CSV_TYPES = {
    "subject_id": "BIGINT", "hadm_id": "BIGINT", "stay_id": "BIGINT", "caregiver_id": "BIGINT",
    "itemid": "BIGINT", "charttime": "TIMESTAMP", "storetime": "TIMESTAMP",
    "intime": "TIMESTAMP", "outtime": "TIMESTAMP", "value": "VARCHAR", "valuenum": "DOUBLE",
    "valueuom": "VARCHAR", "warning": "BIGINT", "los": "DOUBLE",
    "first_careunit": "VARCHAR", "last_careunit": "VARCHAR", "label": "VARCHAR",
    "abbreviation": "VARCHAR", "linksto": "VARCHAR", "category": "VARCHAR",
    "unitname": "VARCHAR", "param_type": "VARCHAR", "lownormalvalue": "DOUBLE",
    "highnormalvalue": "DOUBLE", "admittime": "TIMESTAMP", "dischtime": "TIMESTAMP",
    "deathtime": "TIMESTAMP", "edregtime": "TIMESTAMP", "edouttime": "TIMESTAMP",
    "dod": "DATE", "anchor_age": "BIGINT", "anchor_year": "BIGINT",
}


#: DuckDB's integer types (a column the build joins or compares as an integer)
INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT")
#: DuckDB's time types (``TIMESTAMP``, ``TIMESTAMP_NS``, ``TIMESTAMP WITH TIME ZONE`` …, and ``DATE``)
TIME_TYPES = ("TIMESTAMP", "DATE")
#: columns of a Parquet input that the build reads through a function or join needing a type (a
#: CSV's are forced on read, :data:`_CSV_TYPES`): column -> (what it must be, DuckDB type prefixes)
TYPED_COLUMNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "charttime": ("a timestamp", TIME_TYPES), "recorded_dttm": ("a timestamp", TIME_TYPES),
    "in_dttm": ("a timestamp", TIME_TYPES), "out_dttm": ("a timestamp", TIME_TYPES),
    "itemid": ("an integer", INTEGER_TYPES),
}


def _sql_str(s: str | Path) -> str:
    return "'" + str(s).replace("'", "''") + "'"


@dataclass
class Table:
    """One input file: its path, the DuckDB reader expression and its column names."""

    name: str
    path: Path
    columns: list[str] = field(default_factory=list)
    reader: str = ""

    def check(self, con: duckdb.DuckDBPyConnection, required: list[str]) -> None:
        """Read the schema (fails clearly on a corrupt file) and check the required columns: present,
        and in a Parquet file of the type the build needs (:data:`TYPED_COLUMNS`)."""
        is_parquet = self.path.name.endswith(".parquet")
        try:
            if is_parquet:
                probe = f"read_parquet({_sql_str(self.path)})"
            else:
                probe = f"read_csv({_sql_str(self.path)}, header=true, sample_size=2048)"
            desc = con.execute(f"DESCRIBE SELECT * FROM {probe}").fetchall()
        except duckdb.Error as exc:  # IOException, InvalidInputException, ...
            kind = "parquet" if is_parquet else "CSV/gzip"
            raise UnreadableInputError(
                f"{self.path}: cannot be read as {kind} ({type(exc).__name__}: "
                f"{redact(str(exc).splitlines()[0][:300])})"
            ) from exc
        self.columns = [r[0] for r in desc]
        missing = [c for c in required if c not in self.columns]
        if missing:
            raise MissingColumnsError(str(self.path), missing, self.columns)
        if is_parquet:
            types = {r[0]: str(r[1]).upper() for r in desc}
            for c in (c for c in required if c in TYPED_COLUMNS):
                what, ok = TYPED_COLUMNS[c]
                if not types[c].startswith(ok):
                    raise ColumnTypeError(f"{self.path}: column {c} is {types[c]}, expected {what}")
            self.reader = f"read_parquet({_sql_str(self.path)})"
        else:
            types = {c: t for c, t in _CSV_TYPES.items() if c in self.columns}
            types_sql = "{" + ", ".join(f"{_sql_str(k)}: {_sql_str(v)}" for k, v in types.items()) + "}"
            self.reader = (
                f"read_csv({_sql_str(self.path)}, header=true, types={types_sql})"
            )


def find_table(root: Path, rel: str, layout: str, exts=_EXTS) -> Table:
    for ext in exts:
        p = root / f"{rel}{ext}"
        if p.is_file():
            return Table(rel, p)
    tried = ", ".join(str(root / f"{rel}{e}") for e in exts)
    raise InputMissingError(f"missing input table {rel!r}: none of {tried} exists. Expected {layout}.")


#: required columns of every input table, per layout (the adapters and :func:`check_layout` read them)
REQUIRED_COLUMNS: dict[str, dict[str, list[str]]] = {
    "mimic": {
        "icu/icustays": ["subject_id", "hadm_id", "stay_id", "intime", "outtime"],
        "icu/chartevents": ["stay_id", "charttime", "itemid", "valuenum"],
        "icu/d_items": ["itemid", "label"],
        "hosp/patients": ["subject_id"],
        "hosp/admissions": ["subject_id", "hadm_id"],
    },
    "clif": {
        "clif_adt": ["hospitalization_id", "in_dttm", "out_dttm", "location_category"],
        "clif_vitals": ["hospitalization_id", "recorded_dttm", "vital_category", "vital_value"],
        "clif_hospitalization": ["hospitalization_id", "patient_id"],
        "clif_patient": ["patient_id"],
    },
}
#: the stays tables of a layout (what the incremental ingest reads besides its measurement part files)
STAYS_TABLES = {"mimic": ("icu/icustays",), "clif": ("clif_adt", "clif_hospitalization")}
_LAYOUT = {"mimic": (NATIVE_LAYOUT, _EXTS), "clif": (CLIF_LAYOUT, (".parquet",))}


def check_layout(source: str, root: str | Path, tables: tuple[str, ...] | None = None,
                 con: duckdb.DuckDBPyConnection | None = None) -> dict[str, Table]:
    """Check a MIMIC-IV (``"mimic"``) or CLIF (``"clif"``) root the way the build reads it, in
    milliseconds: the folder exists, and every table of ``tables`` (default: all the layout needs)
    is present, readable and has its required columns. Returns the checked tables by name.

    Raises
    ------
    BadParameterError
        ``source`` is neither "mimic" nor "clif".
    InputMissingError, UnreadableInputError, MissingColumnsError, ColumnTypeError
        The first problem found (the message names the file, and the column or the expected layout).
    """
    if source not in REQUIRED_COLUMNS:
        from cohort.errors import BadParameterError

        raise BadParameterError(f"unknown source {source!r}; expected one of mimic, clif")
    root = Path(root)
    if not root.is_dir():
        kind = "MIMIC-IV" if source == "mimic" else "CLIF"
        raise InputMissingError(f"{kind} root {root} is not a directory. Expected {_LAYOUT[source][0]}.")
    layout, exts = _LAYOUT[source]
    found = {rel: find_table(root, rel, layout, exts) for rel in (tables or tuple(REQUIRED_COLUMNS[source]))}
    use = duckdb.connect() if con is None else con
    try:  # every file present first, then each schema: one DESCRIBE (a CSV's header, a parquet footer)
        for rel, t in found.items():
            t.check(use, REQUIRED_COLUMNS[source][rel])
    finally:
        if con is None:
            use.close()
    return found


class Adapter:
    """Common interface of the input adapters."""

    name: str = ""
    scan_files: list[Path]
    convention: Convention = get_convention(SEED)

    def stays_sql(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def measurements_sql(self, cohort_table: str) -> str:  # pragma: no cover - interface
        raise NotImplementedError


class MimicNativeAdapter(Adapter):
    """MIMIC-IV v3.1 native files (``icu/`` and ``hosp/``), csv.gz / csv / parquet."""

    name = "mimic"

    def __init__(self, root: str | Path, con: duckdb.DuckDBPyConnection, convention: str | Convention = SEED):
        self.convention = get_convention(convention)
        t = check_layout("mimic", root, con=con)
        self.icustays, self.chartevents, self.d_items = t["icu/icustays"], t["icu/chartevents"], t["icu/d_items"]
        self.patients, self.admissions = t["hosp/patients"], t["hosp/admissions"]
        self.scan_files = [self.chartevents.path]

    def stays_sql(self) -> str:
        return (
            "SELECT CAST(stay_id AS BIGINT) AS stay_id, CAST(subject_id AS BIGINT) AS subject_id, "
            "CAST(hadm_id AS BIGINT) AS hadm_id, CAST(intime AS TIMESTAMP) AS intime, "
            "CAST(outtime AS TIMESTAMP) AS outtime, CAST(stay_id AS VARCHAR) AS join_key "
            f"FROM {self.icustays.reader}"
        )

    def measurements_sql(self, cohort_table: str) -> str:
        itemids = self.convention.itemids
        # The itemids come in as a join to a small VALUES map (itemid -> vital code, source), not
        # as ``itemid IN (...)``: DuckDB pushes the join's key filter into the Parquet scan and
        # needs no CASE per row, where an IN list ran as a MARK join over every chartevents row
        # (same rows, same hash; python -m cohort.bench compares the CPU).
        vmap = ", ".join(f"({i}, {VITAL_CODE[v]}, {s})" for i, (v, s, _) in itemids.items())
        # valuenum only: a null valuenum (text such as "Unable to assess" in ``value``) is not a
        # measurement, and not reading the text column keeps the 430M-row scan lean.
        value = "CAST(ce.valuenum AS DOUBLE)"
        return (
            "SELECT CAST(ce.stay_id AS BIGINT) AS stay_id, epoch_us(ce.charttime) AS ts_us, "
            "CAST(vm.vital AS UTINYINT) AS vital, CAST(vm.src AS UTINYINT) AS src, "
            f"{value} AS value, ce.itemid = {FAHRENHEIT_ITEMID} AS unit_f "
            f"FROM {self.chartevents.reader} AS ce "
            f"JOIN (VALUES {vmap}) AS vm(itemid, vital, src) ON ce.itemid = vm.itemid"
        )


class ClifAdapter(Adapter):
    """CLIF 2.1 parquet tables. ICU stays are the ICU segments (``location_category = 'icu'``)
    of ``clif_adt``; vitals come from ``clif_vitals`` by ``vital_category``.

    Stay ids: CLIF has none, so ``stay_id = hospitalization_id·100 + k`` where k is the
    1-based rank of the ICU segment within its hospitalization by ``in_dttm`` (numeric ids, as in
    the MIMIC-derived demo); with non-numeric ids a dense rank is used instead. The same rule
    gives ``subject_id`` from ``patient_id`` and ``hadm_id`` from ``hospitalization_id``. A
    hospitalization listed under several patients yields its stays once per patient (never one
    patient picked silently), so the build drops them as stays with more than one subject.
    Arterial BP is recognised by ``vital_name`` containing "arterial" or "art bp"; every other
    BP row (non-invasive, manual) counts as non-invasive.

    CLIF has no itemids, so a convention selects only by ``vital_category`` (the same six
    categories under both conventions); what the CLIF ETL mapped into a category (for the MIMIC
    demo: "ART BP" arterial pressures and manual cuff pressures in ``sbp``/``dbp``) is read
    under either (docs/VITALS.md).
    """

    name = "clif"

    def __init__(self, root: str | Path, con: duckdb.DuckDBPyConnection, convention: str | Convention = SEED):
        self.convention = get_convention(convention)
        t = check_layout("clif", root, con=con)
        self.adt, self.vitals = t["clif_adt"], t["clif_vitals"]
        self.hosp, self.patient = t["clif_hospitalization"], t["clif_patient"]
        self.scan_files = [self.vitals.path]
        self._con = con

    def _numeric(self, expr: str, table: str) -> bool:
        row = self._con.execute(
            f"SELECT count(*) FROM {table} WHERE {expr} IS NOT NULL AND TRY_CAST({expr} AS BIGINT) IS NULL"
        ).fetchone()
        return row is not None and row[0] == 0

    def stays_sql(self) -> str:
        h_num = self._numeric("hospitalization_id", self.hosp.reader)
        p_num = self._numeric("patient_id", self.hosp.reader)
        hadm = ("TRY_CAST(h.hospitalization_id AS BIGINT)" if h_num
                else "dense_rank() OVER (ORDER BY h.hospitalization_id)")
        subj = "TRY_CAST(h.patient_id AS BIGINT)" if p_num else "dense_rank() OVER (ORDER BY h.patient_id)"
        k = "row_number() OVER (PARTITION BY a.hospitalization_id ORDER BY a.in_dttm, a.out_dttm)"
        return f"""
            WITH seg AS (
                SELECT a.hospitalization_id, a.in_dttm, a.out_dttm, {k} AS k
                FROM {self.adt.reader} AS a WHERE lower(a.location_category) = 'icu'
            ), h AS (
                SELECT DISTINCT hospitalization_id, patient_id FROM {self.hosp.reader} WHERE patient_id IS NOT NULL
            ), hh AS (SELECT h.hospitalization_id, {hadm} AS hadm_id, {subj} AS subject_id FROM h)
            SELECT CAST(hh.hadm_id * 100 + seg.k AS BIGINT) AS stay_id,
                   CAST(hh.subject_id AS BIGINT) AS subject_id, CAST(hh.hadm_id AS BIGINT) AS hadm_id,
                   make_timestamp(epoch_us(seg.in_dttm)) AS intime,
                   make_timestamp(epoch_us(seg.out_dttm)) AS outtime,
                   CAST(seg.hospitalization_id AS VARCHAR) AS join_key
            FROM seg LEFT JOIN hh USING (hospitalization_id)
        """

    def measurements_sql(self, cohort_table: str) -> str:
        categories = self.convention.clif_categories
        cats = ", ".join(f"'{c}'" for c in categories)
        vital_case = " ".join(f"WHEN '{c}' THEN {VITAL_CODE[v]}" for c, v in categories.items())
        if "vital_name" in self.vitals.columns:
            art = "(lower(v.vital_name) LIKE '%arterial%' OR lower(v.vital_name) LIKE '%art bp%')"
            src = f"CASE WHEN v.vital_category IN ('sbp', 'dbp') THEN CASE WHEN {art} THEN 1 ELSE 2 END ELSE 0 END"
        else:
            src = "CASE WHEN v.vital_category IN ('sbp', 'dbp') THEN 2 ELSE 0 END"
        return (
            "SELECT c.stay_id, epoch_us(v.recorded_dttm) AS ts_us, "
            f"CAST(CASE v.vital_category {vital_case} END AS UTINYINT) AS vital, "
            f"CAST({src} AS UTINYINT) AS src, CAST(v.vital_value AS DOUBLE) AS value, false AS unit_f "
            f"FROM {self.vitals.reader} AS v "
            f"JOIN {cohort_table} AS c ON CAST(v.hospitalization_id AS VARCHAR) = c.join_key "
            f"WHERE v.vital_category IN ({cats})"
        )
