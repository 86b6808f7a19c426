"""Your own event, as ACES-style predicates over the six hourly vitals.

An event file is YAML in the shape of an ACES task's ``predicates`` block: *plain* predicates (a
``code`` and optional ``value_min`` / ``value_max``, exclusive unless ``value_min_inclusive`` /
``value_max_inclusive`` is true, as in ACES) and *derived* ones (``expr: or(a, b, …)`` or
``and(…)`` over plain predicates); ``event:`` names the predicate that marks an event hour (it may
be left out when there is one predicate). ACES's ``trigger``, ``windows`` and ``metadata`` may
be present (another tool reads them) and are ignored here::

    predicates:
      hypoxaemia: {code: "HOURLY_MEAN//SPO2//%", value_max: 90}
    event: hypoxaemia

The codes a predicate may name: :func:`parse_event`. An hour is an event hour when the predicate
holds on the hour's filled value (``vitals_hourly``'s vital columns); an hour without a value is
never one. :class:`EventDefinition` is frozen: an event travels whole into study settings and
chunk tasks, and is part of their cache keys.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cohort.constants import VITALS
from cohort.errors import BadParameterError, InputMissingError

#: keys of an ACES task file that describe the task, not the event (left to the tools that read them)
ACES_TASK_KEYS = ("trigger", "windows", "metadata", "description")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")
_EXPR = re.compile(r"^\s*(and|or)\((.*)\)\s*$")
_PLAIN_KEYS = {"code", "value_min", "value_max", "value_min_inclusive", "value_max_inclusive"}


@dataclass(frozen=True)
class Predicate:
    """A plain predicate on one vital's filled hourly value: ``value_min < x < value_max`` (``≤``
    where inclusive; None: that side open). ``code`` is the code as written in the file."""

    name: str
    code: str
    vital: str
    value_min: float | None = None
    value_max: float | None = None
    value_min_inclusive: bool = False
    value_max_inclusive: bool = False

    def evaluate(self, column: Any):
        """``(n,)`` values -> ``(n,)`` bool (NaN: False)."""
        import numpy as np

        x = np.asarray(column, dtype=np.float64)
        out = ~np.isnan(x)
        if self.value_min is not None:
            out &= (x >= self.value_min) if self.value_min_inclusive else (x > self.value_min)
        if self.value_max is not None:
            out &= (x <= self.value_max) if self.value_max_inclusive else (x < self.value_max)
        return out

    def sql(self) -> str:
        """The same test over the ``vitals_hourly`` column of the vital (NULL and NaN: false)."""
        terms = [f"NOT isnan({self.vital})"]
        if self.value_min is not None:
            terms.append(f"{self.vital} {'>=' if self.value_min_inclusive else '>'} {self.value_min!r}::DOUBLE")
        if self.value_max is not None:
            terms.append(f"{self.vital} {'<=' if self.value_max_inclusive else '<'} {self.value_max!r}::DOUBLE")
        return f"coalesce({' AND '.join(terms)}, false)"


@dataclass(frozen=True)
class Derived:
    """``op`` (``"and"`` / ``"or"``) over plain predicates, by name."""

    name: str
    op: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class EventDefinition:
    """The event of a study: its plain predicates, all of which (``combine="and"``) or any of
    which (``"or"``, also for a single predicate) make an hour an event hour."""

    name: str
    predicates: tuple[Predicate, ...]
    combine: str = "or"

    @property
    def channels(self) -> tuple[str, ...]:
        """The vitals the event reads, in :data:`cohort.constants.VITALS` order."""
        used = {p.vital for p in self.predicates}
        return tuple(v for v in VITALS if v in used)

    @property
    def slug(self) -> str:
        """The name in lower case (a study name part: ``[a-z0-9_]``)."""
        return self.name.lower()

    def evaluate(self, filled: Any):
        """``(n, 6)`` filled hourly values (VITALS order) -> ``(n,)`` bool event hours."""
        import numpy as np

        X = np.asarray(filled, dtype=np.float64)
        hits = [p.evaluate(X[:, VITALS.index(p.vital)]) for p in self.predicates]
        return np.logical_and.reduce(hits) if self.combine == "and" else np.logical_or.reduce(hits)

    def sql(self) -> str:
        """The event as a boolean SQL expression over ``vitals_hourly``'s columns."""
        return "(" + f" {self.combine.upper()} ".join(p.sql() for p in self.predicates) + ")"

    def describe(self) -> str:
        """One line: what makes an hour an event hour (codes and bounds, no data)."""
        def one(p: Predicate) -> str:
            lo = "" if p.value_min is None else f"{p.value_min:g} {'≤' if p.value_min_inclusive else '<'} "
            hi = "" if p.value_max is None else f" {'≤' if p.value_max_inclusive else '<'} {p.value_max:g}"
            return f"{lo}{p.vital}{hi}" if (lo or hi) else f"{p.vital} charted"
        return f"{self.name}: " + f" {self.combine} ".join(one(p) for p in self.predicates)


def _fail(where: str, what: str) -> BadParameterError:
    return BadParameterError(f"{where}: {what}")


def _bound(where: str, key: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise _fail(where, f"{key} must be a finite number, got {v!r}")
    return float(v)


def _vital_of(where: str, code: str) -> tuple[str, bool]:
    """(vital, Fahrenheit?) of one code: a vital name, a project export code or a code the default
    MEDS code map reads."""
    if not isinstance(code, str) or not code:
        raise _fail(where, f"code must be a non-empty string, got {code!r}")
    if code in VITALS:
        return code, False
    from cohort.meds import default_code_map

    for pattern, exact, target in default_code_map().patterns:
        if code == pattern if exact else code.startswith(pattern):
            return target.vital, target.fahrenheit
    raise _fail(where, f"code {code!r} names none of the six vitals ({', '.join(VITALS)}; a HOURLY_MEAN//… "
                       "export code or a LAB//<itemid>//<unit> code of the default MEDS code map)")


def _plain(name: str, spec: dict, where: str) -> Predicate:
    extra = set(spec) - _PLAIN_KEYS
    if extra:
        raise _fail(where, f"unsupported key(s) {', '.join(sorted(extra))} (a predicate here takes "
                           f"{', '.join(sorted(_PLAIN_KEYS))}: the warehouse holds hourly vitals only)")
    code = spec["code"]
    if isinstance(code, dict):
        if set(code) != {"any"} or not isinstance(code["any"], list) or not code["any"]:
            raise _fail(where, "code as a mapping takes only 'any' with a non-empty list of codes (regex is "
                               "not supported here)")
        found = {_vital_of(where, c) for c in code["any"]}
        text = "any(" + ", ".join(map(str, code["any"])) + ")"
    else:
        found, text = {_vital_of(where, code)}, code
    if len({v for v, _ in found}) != 1 or len(found) != 1:
        raise _fail(where, "the codes of one predicate must name one vital in one unit")
    vital, fahrenheit = found.pop()
    lo, hi = _bound(where, "value_min", spec.get("value_min")), _bound(where, "value_max", spec.get("value_max"))
    inc = {k: spec.get(k, False) for k in ("value_min_inclusive", "value_max_inclusive")}
    for k, v in inc.items():
        if not isinstance(v, bool):
            raise _fail(where, f"{k} must be true or false, got {v!r}")
    if fahrenheit:  # the warehouse holds °C
        lo, hi = (None if lo is None else (lo - 32.0) * 5.0 / 9.0), (None if hi is None else (hi - 32.0) * 5.0 / 9.0)
    if lo is not None and hi is not None and (lo > hi or (lo == hi and not all(inc.values()))):
        raise _fail(where, f"no value satisfies value_min {spec.get('value_min')!r} and value_max "
                           f"{spec.get('value_max')!r}")
    return Predicate(name, str(text), vital, lo, hi, **inc)


def read_predicates(spec: Any, where: str = "events") -> dict[str, Predicate | Derived]:
    """The ``predicates`` block of an event or ACES task file: name -> :class:`Predicate` (plain,
    with ``code``) or :class:`Derived` (``expr: and(…)`` / ``or(…)`` over plain predicates)."""
    if not isinstance(spec, dict) or not spec:
        raise _fail(where, "'predicates' must be a non-empty mapping of name -> {code, value_min, value_max} "
                           "or {expr: or(a, b)}")
    out: dict[str, Predicate | Derived] = {}
    for name, p in spec.items():
        at = f"{where}: predicate {name!r}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise _fail(where, f"predicate name {name!r} must be a letter or _ then letters, digits or _ (≤ 48)")
        if not isinstance(p, dict) or ("code" in p) == ("expr" in p):
            raise _fail(at, "needs exactly one of 'code' (a plain predicate) or 'expr' (a derived one)")
        if "code" in p:
            out[name] = _plain(name, p, at)
            continue
        if set(p) != {"expr"}:
            raise _fail(at, "a derived predicate takes only 'expr'")
        m = _EXPR.match(str(p["expr"]))
        members = tuple(x.strip() for x in m.group(2).split(",")) if m else ()
        if not m or len(members) < 2:
            raise _fail(at, f"expr must be and(a, b, …) or or(a, b, …) over ≥ 2 predicates, got {p['expr']!r}")
        out[name] = Derived(name, m.group(1), members)
    for d in (x for x in out.values() if isinstance(x, Derived)):
        for member in d.members:
            if not isinstance(out.get(member), Predicate):
                raise _fail(f"{where}: predicate {d.name!r}", f"{member!r} is not a plain predicate of this file "
                                                             "(derived predicates combine plain ones)")
    return out


def parse_event(spec: Any, where: str = "events") -> EventDefinition:
    """The :class:`EventDefinition` of a parsed event file (see the module docstring).

    A ``code`` names one of the six vitals: a vital name (``hr``, ``sbp``, ``dbp``, ``rr``, ``spo2``,
    ``temp_c``), this project's MEDS export code (``HOURLY_MEAN//HR//bpm`` …) or a code the default
    MEDS code map reads (``LAB//220045//bpm`` …; bounds on a Fahrenheit code are converted to °C);
    ``code: {any: [...]}`` takes codes of one vital. :class:`EventDefinition` gives
    :meth:`~EventDefinition.evaluate` (``(n, 6)`` filled values -> ``(n,)`` bool),
    :attr:`~EventDefinition.channels` (the vitals it reads: the held-out rule withholds them from every
    selector) and :meth:`~EventDefinition.sql` (the same test over ``vitals_hourly``'s columns).
    """
    if not isinstance(spec, dict) or "predicates" not in spec:
        raise _fail(where, "expected a mapping with 'predicates' (and 'event' naming one of them)")
    extra = set(spec) - {"predicates", "event", *ACES_TASK_KEYS}
    if extra:
        raise _fail(where, f"unknown key(s) {', '.join(sorted(map(str, extra)))}")
    preds = read_predicates(spec["predicates"], where)
    name = spec.get("event")
    if name is None:
        if len(preds) != 1:
            raise _fail(where, f"'event' must name the event's predicate (one of {', '.join(preds)})")
        name = next(iter(preds))
    if name not in preds:
        raise _fail(where, f"event {name!r} is not a predicate of this file (one of {', '.join(preds)})")
    p = preds[name]
    if isinstance(p, Predicate):
        return EventDefinition(name, (p,))
    return EventDefinition(name, tuple(preds[m] for m in p.members), p.op)  # type: ignore[misc]


def load_event(path: str | Path) -> EventDefinition:
    """The event of a YAML file (``yaml.safe_load``: plain data only)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise InputMissingError(f"--events {p}: no such file")
    try:
        spec = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BadParameterError(f"--events {p}: not readable YAML ({type(exc).__name__})") from None
    return parse_event(spec, f"--events {p.name}")
