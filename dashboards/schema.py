"""Validation of study result files (see dashboards/SCHEMA.md for the format).

Flows call :func:`validate_result` before writing a result, and the report renderer calls it on
every file it reads; both refuse the same things. Validation never modifies its input.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
import re
from typing import Any, Mapping

from dashboards.errors import AggregateOnlyError, ResultSchemaError

__all__ = [
    "SCHEMA_VERSION",
    "DATA_SOURCES",
    "FIGURE_KINDS",
    "MAX_ARRAY_LEN",
    "MAX_TABLE_ROWS",
    "IDENTIFIER_KEY",
    "KNOWN_STUDIES",
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

_STUDY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_REQUIRED = {
    "study": str,
    "title": str,
    "data": str,
    "runtime_s": (int, float),
    "seed_figure": dict,
    "metrics": dict,
    "tables": list,
    "figures": list,
}
_OPTIONAL = {
    "schema_version": int,
    "created": str,
    "notes": str,
    "config": dict,
    "claims": list,
    "receipts": dict,
}


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _fail(msg: str, source: str | None) -> None:
    raise ResultSchemaError(msg, source=source)


def _scan_aggregates(obj: Any, path: str, source: str | None) -> None:
    """Recursively refuse identifier-like keys and over-long arrays anywhere in the result."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if not isinstance(k, str):
                _fail(f"{path}: keys must be strings; got {k!r}", source)
            if IDENTIFIER_KEY.search(k):
                raise AggregateOnlyError(
                    f"{path}.{k}: key looks like a record identifier; reports hold aggregates only",
                    source=source,
                )
            _scan_aggregates(v, f"{path}.{k}", source)
    elif isinstance(obj, (list, tuple)):
        if len(obj) > MAX_ARRAY_LEN:
            raise AggregateOnlyError(
                f"{path}: array of length {len(obj)} exceeds {MAX_ARRAY_LEN}; looks like per-record "
                "data (store aggregates, e.g. a binned histogram or a curve on a fixed grid)",
                source=source,
            )
        for i, v in enumerate(obj):
            _scan_aggregates(v, f"{path}[{i}]", source)
    elif isinstance(obj, float) and not math.isfinite(obj):
        _fail(f"{path}: non-finite number {obj!r} (use null)", source)
    elif obj is not None and not isinstance(obj, (str, int, float, bool)):
        _fail(f"{path}: unsupported value type {type(obj).__name__}", source)


def _numbers(spec: Mapping, key: str, where: str, source: str | None, n: int | None = None) -> list:
    vals = spec.get(key)
    if not isinstance(vals, list) or not all(_is_number(v) for v in vals):
        _fail(f"{where}.{key}: must be a list of finite numbers", source)
    if n is not None and len(vals) != n:
        _fail(f"{where}.{key}: has {len(vals)} entries, expected {n}", source)
    return vals


def _validate_figure(spec: Any, where: str, source: str | None) -> None:
    if not isinstance(spec, Mapping):
        _fail(f"{where}: a figure spec must be an object", source)
    kind = spec.get("kind")
    if kind not in FIGURE_KINDS:
        _fail(f"{where}.kind: must be one of {FIGURE_KINDS}; got {kind!r}", source)
    if not isinstance(spec.get("title", ""), str):
        _fail(f"{where}.title: must be a string", source)
    if kind == "bar":
        cats = spec.get("categories")
        if not isinstance(cats, list) or not cats or not all(isinstance(c, str) for c in cats):
            _fail(f"{where}.categories: must be a non-empty list of strings", source)
        vals = _numbers(spec, "values", where, source, len(cats))
        if ("ci_low" in spec) != ("ci_high" in spec):
            _fail(f"{where}: give both ci_low and ci_high or neither", source)
        if "ci_low" in spec:
            lo = _numbers(spec, "ci_low", where, source, len(cats))
            hi = _numbers(spec, "ci_high", where, source, len(cats))
            if any(a > b for a, b in zip(lo, hi)):
                _fail(f"{where}: ci_low must not exceed ci_high", source)
        if spec.get("log_y") and any(v <= 0 for v in vals):
            _fail(f"{where}: log_y needs positive values", source)
    elif kind == "line":
        series = spec.get("series")
        if not isinstance(series, list) or not series:
            _fail(f"{where}.series: must be a non-empty list", source)
        for j, s in enumerate(series):
            w = f"{where}.series[{j}]"
            if not isinstance(s, Mapping) or not isinstance(s.get("label"), str):
                _fail(f"{w}: needs a string label", source)
            x = _numbers(s, "x", w, source)
            _numbers(s, "y", w, source, len(x))
            if s.get("style", "line") not in ("line", "markers", "both"):
                _fail(f"{w}.style: must be line, markers or both", source)
    elif kind == "funnel":
        stages = spec.get("stages")
        if not isinstance(stages, list) or not stages:
            _fail(f"{where}.stages: must be a non-empty list", source)
        for j, st in enumerate(stages):
            if not (isinstance(st, Mapping) and isinstance(st.get("label"), str) and _is_number(st.get("count"))
                    and st["count"] >= 0):
                _fail(f"{where}.stages[{j}]: needs a string label and a count >= 0", source)
    elif kind == "histogram":
        edges = _numbers(spec, "bin_edges", where, source)
        counts = _numbers(spec, "counts", where, source, len(edges) - 1)
        if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])):
            _fail(f"{where}.bin_edges: need >= 2 strictly increasing edges", source)
        if any(c < 0 for c in counts):
            _fail(f"{where}.counts: must be >= 0", source)


def _validate_table(tab: Any, where: str, source: str | None) -> None:
    if not isinstance(tab, Mapping):
        _fail(f"{where}: a table must be an object", source)
    cols = tab.get("columns")
    rows = tab.get("rows")
    if not isinstance(tab.get("title", ""), str):
        _fail(f"{where}.title: must be a string", source)
    if not isinstance(cols, list) or not cols or not all(isinstance(c, str) for c in cols):
        _fail(f"{where}.columns: must be a non-empty list of strings", source)
    for c in cols:
        if IDENTIFIER_KEY.search(c.strip().replace(" ", "_")):
            raise AggregateOnlyError(f"{where}.columns: column {c!r} looks like a record identifier", source=source)
    if not isinstance(rows, list):
        _fail(f"{where}.rows: must be a list of rows", source)
    if len(rows) > MAX_TABLE_ROWS:
        raise AggregateOnlyError(
            f"{where}.rows: {len(rows)} rows exceed {MAX_TABLE_ROWS}; looks like per-record data", source=source
        )
    for i, r in enumerate(rows):
        if not isinstance(r, list) or len(r) != len(cols):
            _fail(f"{where}.rows[{i}]: must be a list of {len(cols)} cells", source)
        for c in r:
            if not (c is None or isinstance(c, (str, bool)) or _is_number(c)):
                _fail(f"{where}.rows[{i}]: cells must be strings, numbers, booleans or null", source)


def _validate_claim(claim: Any, where: str, source: str | None) -> None:
    if not isinstance(claim, Mapping):
        _fail(f"{where}: a claim must be an object", source)
    for key in ("statement", "reference", "path"):
        if not isinstance(claim.get(key), str) or not claim[key].strip():
            _fail(
                f"{where}.{key}: every claim must name its statement, reference state and numerical path",
                source,
            )
    if "holds" in claim and not isinstance(claim["holds"], bool):
        _fail(f"{where}.holds: must be true or false", source)
    if "operation" in claim and not isinstance(claim["operation"], str):
        _fail(f"{where}.operation: must be a string", source)


def _validate_receipts(rec: Mapping, source: str | None) -> None:
    for key in ("count", "certified"):
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            _fail(f"receipts.{key}: must be a non-negative integer", source)
    if rec["certified"] > rec["count"]:
        _fail("receipts.certified: cannot exceed receipts.count", source)
    if not isinstance(rec.get("chain_verified"), bool):
        _fail("receipts.chain_verified: must be true or false", source)
    for key in ("attempted", "completed"):
        if key in rec and (isinstance(rec[key], bool) or not isinstance(rec[key], int) or rec[key] < 0):
            _fail(f"receipts.{key}: must be a non-negative integer", source)


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
    _scan_aggregates(result, "$", source)
    for key, typ in _REQUIRED.items():
        if key not in result:
            _fail(f"missing required field {key!r}", source)
        if not isinstance(result[key], typ) or isinstance(result[key], bool):
            _fail(f"field {key!r} has type {type(result[key]).__name__}", source)
    for key, typ in _OPTIONAL.items():
        if key in result and (not isinstance(result[key], typ) or isinstance(result[key], bool)):
            _fail(f"field {key!r} has type {type(result[key]).__name__}", source)
    unknown = set(result) - set(_REQUIRED) - set(_OPTIONAL)
    if unknown:
        _fail(f"unknown top-level field(s) {sorted(unknown)}", source)
    if not _STUDY_NAME.match(result["study"]):
        _fail(f"study must match {_STUDY_NAME.pattern}; got {result['study']!r}", source)
    if result["data"] not in DATA_SOURCES:
        _fail(f"data must be one of {DATA_SOURCES}; got {result['data']!r}", source)
    if not _is_number(result["runtime_s"]) or result["runtime_s"] < 0:
        _fail("runtime_s must be a finite number >= 0", source)
    if result.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        _fail(f"schema_version {result['schema_version']} is not {SCHEMA_VERSION}", source)
    seed = result["seed_figure"]
    for key in ("source", "text"):
        if key in seed and not isinstance(seed[key], str):
            _fail(f"seed_figure.{key}: must be a string", source)
    if "values" in seed:
        if not isinstance(seed["values"], Mapping) or not all(_is_number(v) for v in seed["values"].values()):
            _fail("seed_figure.values: must map labels to numbers", source)
    if "figure" in seed and seed["figure"] is not None:
        _validate_figure(seed["figure"], "seed_figure.figure", source)
    for i, fig in enumerate(result["figures"]):
        _validate_figure(fig, f"figures[{i}]", source)
    for i, tab in enumerate(result["tables"]):
        _validate_table(tab, f"tables[{i}]", source)
    for i, claim in enumerate(result.get("claims", [])):
        _validate_claim(claim, f"claims[{i}]", source)
    if "receipts" in result:
        _validate_receipts(result["receipts"], source)
    return result  # type: ignore[return-value]


def write_result(result: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Validate ``result`` and write it as JSON to ``path`` atomically (nothing is written on error).

    Flows call this instead of ``json.dump`` so that a file the report would refuse is never
    produced. Returns the written path.
    """
    import json

    from dashboards.atomic import atomic_write_text

    validate_result(result, source=str(path))
    text = json.dumps(result, indent=2, ensure_ascii=False, allow_nan=False)
    return atomic_write_text(path, text + "\n")
