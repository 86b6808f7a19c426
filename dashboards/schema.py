"""Validation of study result files (see dashboards/SCHEMA.md for the format).

Flows call :func:`validate_result` before writing a result, and the report renderer calls it on
every file it reads; both refuse the same things. Validation never modifies its input.

Two passes:

1. :func:`scan_aggregates` — the privacy scan, over the whole JSON tree: identifier-like keys or
   table columns, lists longer than :data:`MAX_ARRAY_LEN`, tables longer than
   :data:`MAX_TABLE_ROWS` (:class:`AggregateOnlyError`), non-finite numbers and non-JSON values;
2. :class:`Result` — the layout, as strict pydantic models (no coercion: ``True`` is not a
   number, ``"1"`` is not an integer); unknown top-level fields are refused, nested objects may
   carry extra presentation keys (``ylabel``, ``log_y`` …).

The first problem found is raised as one typed line, ``<file>: <where>: <what>``.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from dashboards.errors import AggregateOnlyError, ResultSchemaError
from dashboards.schema_parts import Claim, Count, Number, Part, Tolerance, absent, bad_value

__all__ = [
    "SCHEMA_VERSION",
    "DATA_SOURCES",
    "FIGURE_KINDS",
    "MAX_ARRAY_LEN",
    "MAX_TABLE_ROWS",
    "IDENTIFIER_KEY",
    "KNOWN_STUDIES",
    "Result",
    "scan_aggregates",
    "validate_result",
    "write_result",
]

SCHEMA_VERSION = 1
DATA_SOURCES = ("demo", "synthetic", "mimic", "clif", "text")
FIGURE_KINDS = ("bar", "line", "funnel", "histogram")
#: Longest list allowed anywhere in a result (ROC curves are stored on a ≤ 201-point grid).
MAX_ARRAY_LEN = 512
#: Most rows in one table (a table with more rows is treated as per-record data).
MAX_TABLE_ROWS = 100
#: Keys/column names that identify patients, admissions or stays (MIMIC-IV and CLIF spellings).
IDENTIFIER_KEY = re.compile(
    r"(^|_)(subject|stay|icustay|hadm|patient|hospitalization|encounter|person|record)_?ids?$|^mrns?$",
    re.IGNORECASE,
)

#: Canonical study names -> report section (flows should use these names).
KNOWN_STUDIES: dict[str, str] = {
    "cohort": "cohort",
    "icu_retention": "retention",
    "heldout_spo2": "heldout",
    "deletion_audit": "deletion",
    "deletion_latency": "deletion",
    "ledger": "deletion",
    "patient_deletion": "deletion",
    "deterioration": "deterioration",
    "planted_secret": "synthetic",
    "skewed_redundancy": "synthetic",
    "streaming_eviction": "synthetic",
    "selective_copying": "synthetic",
    "capacity": "synthetic",
    "mqar_control": "synthetic",
    "learned_keys": "synthetic",
    "retrieval_memory": "synthetic",
    "synthetic_fidelity": "synthetic",
    "language_model": "lm",
    "throughput": "lm",
}

STUDY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


# ------------------------------------------------------------------------------ 1. privacy scan
def _fail(msg: str, source: str | None) -> None:
    raise ResultSchemaError(msg, source=source)


def scan_aggregates(obj: Any, source: str | None = None, path: str = "$") -> None:
    """Refuse, anywhere in ``obj``, what looks like record-level data or is not plain JSON.

    Raises :class:`AggregateOnlyError` for identifier-like keys or table columns, lists longer
    than :data:`MAX_ARRAY_LEN` and tables with more than :data:`MAX_TABLE_ROWS` rows;
    :class:`ResultSchemaError` for non-string keys, non-finite numbers and other value types.
    """
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if not isinstance(k, str):
                _fail(f"{path}: keys must be strings; got {k!r}", source)
            if IDENTIFIER_KEY.search(k):
                raise AggregateOnlyError(f"{path}.{k}: key looks like a record identifier; reports hold "
                                         "aggregates only", source=source)
            scan_aggregates(v, source, f"{path}.{k}")
        if path.startswith("$.tables[") and path.count(".") == 1:  # a table object: columns and length
            cols, rows = obj.get("columns"), obj.get("rows")
            where = path[2:]
            for c in cols if isinstance(cols, list) else ():
                if isinstance(c, str) and IDENTIFIER_KEY.search(c.strip().replace(" ", "_")):
                    raise AggregateOnlyError(f"{where}.columns: column {c!r} looks like a record identifier",
                                             source=source)
            if isinstance(rows, list) and len(rows) > MAX_TABLE_ROWS:
                raise AggregateOnlyError(f"{where}.rows: {len(rows)} rows exceed {MAX_TABLE_ROWS}; looks like "
                                         "per-record data", source=source)
    elif isinstance(obj, (list, tuple)):
        if len(obj) > MAX_ARRAY_LEN:
            raise AggregateOnlyError(
                f"{path}: array of length {len(obj)} exceeds {MAX_ARRAY_LEN}; looks like per-record "
                "data (store aggregates, e.g. a binned histogram or a curve on a fixed grid)", source=source)
        for i, v in enumerate(obj):
            scan_aggregates(v, source, f"{path}[{i}]")
    elif isinstance(obj, float) and not math.isfinite(obj):
        _fail(f"{path}: non-finite number {obj!r} (use null)", source)
    elif obj is not None and not isinstance(obj, (str, int, float, bool)):
        _fail(f"{path}: unsupported value type {type(obj).__name__}", source)


# ------------------------------------------------------------------------------ 2. layout models
# (strict nested parts, claims and tolerances: dashboards.schema_parts)
Cell = StrictStr | StrictBool | StrictInt | StrictFloat | None
_absent, _bad, _Part = absent, bad_value, Part


class BarFigure(_Part):
    kind: Literal["bar"]
    title: StrictStr = ""
    categories: list[StrictStr] = Field(min_length=1)
    values: list[Number]
    ci_low: list[Number] = _absent()
    ci_high: list[Number] = _absent()

    @model_validator(mode="after")
    def _shapes(self) -> BarFigure:
        n = len(self.categories)
        for name in ("values", "ci_low", "ci_high"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise _bad(f"{name}: has {len(v)} entries, expected {n}")
        if ("ci_low" in self.model_fields_set) != ("ci_high" in self.model_fields_set):
            raise _bad("give both ci_low and ci_high or neither")
        if self.ci_low is not None and any(a > b for a, b in zip(self.ci_low, self.ci_high or [])):
            raise _bad("ci_low must not exceed ci_high")
        if (self.model_extra or {}).get("log_y") and any(v <= 0 for v in self.values):
            raise _bad("log_y needs positive values")
        return self


class Series(_Part):
    label: StrictStr
    x: list[Number]
    y: list[Number]
    style: Literal["line", "markers", "both"] = "line"

    @model_validator(mode="after")
    def _same_length(self) -> Series:
        if len(self.y) != len(self.x):
            raise _bad(f"y: has {len(self.y)} entries, expected {len(self.x)}")
        return self


class LineFigure(_Part):
    kind: Literal["line"]
    title: StrictStr = ""
    series: list[Series] = Field(min_length=1)


class Stage(_Part):
    label: StrictStr
    count: Annotated[Number, Field(ge=0)]


class FunnelFigure(_Part):
    kind: Literal["funnel"]
    title: StrictStr = ""
    stages: list[Stage] = Field(min_length=1)


class HistogramFigure(_Part):
    kind: Literal["histogram"]
    title: StrictStr = ""
    bin_edges: list[Number]
    counts: list[Annotated[Number, Field(ge=0)]]

    @model_validator(mode="after")
    def _bins(self) -> HistogramFigure:
        e = self.bin_edges
        if len(self.counts) != len(e) - 1:
            raise _bad(f"counts: has {len(self.counts)} entries, expected {len(e) - 1}")
        if len(e) < 2 or any(b <= a for a, b in zip(e, e[1:])):
            raise _bad("bin_edges: need >= 2 strictly increasing edges")
        return self


def _kind(v: Any) -> str | None:
    k = v.get("kind") if isinstance(v, Mapping) else None
    return k if k in FIGURE_KINDS else None


Figure = Annotated[
    Annotated[BarFigure, Tag("bar")] | Annotated[LineFigure, Tag("line")] | Annotated[FunnelFigure, Tag("funnel")]
    | Annotated[HistogramFigure, Tag("histogram")],
    Discriminator(_kind, custom_error_type="figure_kind",
                  custom_error_message=f"kind: must be one of {FIGURE_KINDS}"),
]


class Table(_Part):
    title: StrictStr = ""
    columns: list[StrictStr] = Field(min_length=1)
    rows: list[list[Cell]]
    #: column name -> how far its numbers may move on another machine
    tolerances: dict[str, Tolerance] = _absent()

    @model_validator(mode="after")
    def _row_width(self) -> Table:
        for i, r in enumerate(self.rows):
            if len(r) != len(self.columns):
                raise _bad(f"rows[{i}]: must be a list of {len(self.columns)} cells")
        unknown = sorted(set(self.tolerances or {}) - set(self.columns))
        if unknown:
            raise _bad(f"tolerances: {unknown} name no column")
        return self


class Receipts(_Part):
    count: Count
    certified: Count
    #: true / false: the study's receipt chain verified or not; null: the study keeps no chain
    chain_verified: StrictBool | None
    attempted: Count = _absent()
    completed: Count = _absent()

    @model_validator(mode="after")
    def _certified(self) -> Receipts:
        if self.certified > self.count:
            raise _bad("certified: cannot exceed receipts.count")
        return self


class Timing(_Part):
    """How the run's time splits when it resumed from the task cache (all optional)."""

    resumed: StrictBool = _absent()
    cached_tasks: Count = _absent()
    tasks: Count = _absent()
    compute_s: Annotated[Number, Field(ge=0)] = _absent()


class SeedFigure(_Part):
    source: StrictStr = _absent()
    text: StrictStr = _absent()
    values: dict[str, Number] = _absent()
    figure: Figure | None = None


class Result(BaseModel):
    """One study result file (dashboards/SCHEMA.md); unknown top-level fields are refused."""

    model_config = ConfigDict(strict=True, extra="forbid")

    study: StrictStr
    title: StrictStr
    data: StrictStr
    runtime_s: Number
    seed_figure: SeedFigure
    metrics: dict[str, Any]
    tables: list[Table]
    figures: list[Figure]
    schema_version: StrictInt = _absent()
    created: StrictStr = _absent()
    notes: StrictStr = _absent()
    config: dict[str, Any] = _absent()
    claims: list[Claim] = _absent()
    receipts: Receipts = _absent()
    timing: Timing = _absent()
    #: dotted metric path (``*`` matches one level) -> how far that figure may move on another machine
    tolerances: dict[str, Tolerance] = _absent()

    @field_validator("study")
    @classmethod
    def _study(cls, v: str) -> str:
        if not STUDY_NAME.match(v):
            raise _bad(f"study must match {STUDY_NAME.pattern}; got {v!r}")
        return v

    @field_validator("data")
    @classmethod
    def _data(cls, v: str) -> str:
        if v not in DATA_SOURCES:
            raise _bad(f"data must be one of {DATA_SOURCES}; got {v!r}")
        return v

    @field_validator("runtime_s")
    @classmethod
    def _runtime(cls, v: float) -> float:
        if v < 0:
            raise _bad("runtime_s must be a finite number >= 0")
        return v

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise _bad(f"schema_version {v} is not {SCHEMA_VERSION}")
        return v


_TOP = set(Result.model_fields)


def _where(loc: tuple) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in FIGURE_KINDS and i and (isinstance(loc[i - 1], int) or loc[i - 1] == "figure"):
            continue  # the union tag pydantic puts in the location
        else:
            out += f".{part}" if out else str(part)
    return out


def _message(err: dict, result: Mapping) -> str:
    """One readable line for a pydantic error (the first one, in field order)."""
    loc, typ = err["loc"], err["type"]
    where = _where(loc)
    if len(loc) == 1 and loc[0] in _TOP:
        if typ == "missing":
            return f"missing required field {loc[0]!r}"
        if typ.endswith("_type") or typ == "model_type":
            return f"field {loc[0]!r} has type {type(result.get(loc[0])).__name__}"
    if typ == "missing":
        return f"{where}: required field is missing"
    msg = err["msg"]
    if typ in ("forgetful", "figure_kind"):
        if len(loc) == 1:
            return msg
        head, _, rest = msg.partition(": ")
        if rest and re.fullmatch(r"[a-z_]+(\[\d+\])?", head):  # "values: has 2 entries" -> where.values: …
            return f"{where}.{head}: {rest}"
    return f"{where}: {msg}" if where else msg


def validate_result(result: Any, *, source: str | None = None) -> dict:
    """Check one study result against SCHEMA.md; return it unchanged.

    Parameters
    ----------
    result : dict
        The parsed JSON payload.
    source : str, optional
        File name used in error messages.

    Raises
    ------
    AggregateOnlyError
        Identifier-like keys/columns or per-record-length arrays/tables anywhere.
    ResultSchemaError
        Any other departure from the schema.
    """
    if not isinstance(result, Mapping):
        _fail("a result must be a JSON object", source)
    scan_aggregates(result, source)
    unknown = set(result) - _TOP
    try:
        Result.model_validate(result)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        missing = [e for e in errors if e["type"] == "missing" and len(e["loc"]) == 1]
        typed = [e for e in errors if len(e["loc"]) == 1 and e["loc"][0] in _TOP and e["type"] != "forgetful"]
        if not (missing or typed) and unknown:
            _fail(f"unknown top-level field(s) {sorted(unknown)}", source)
        _fail(_message((missing or typed or errors)[0], result), source)
    return result  # type: ignore[return-value]


def write_result(result: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Validate ``result`` and write it as JSON to ``path`` atomically (nothing is written on error).

    Flows call this instead of ``json.dump`` so that a file the report would refuse is never
    produced. Returns the written path.
    """
    import json

    from sv_core.jsonfile import atomic_write_text

    validate_result(result, source=str(path))
    text = json.dumps(result, indent=2, ensure_ascii=False, allow_nan=False)
    return atomic_write_text(path, text + "\n")
