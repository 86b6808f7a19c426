"""Each study's settings as one typed, frozen dataclass, and the value checks every option shares.

A command builds its study's settings once, from its command line, and passes them down whole:
flow -> plan -> chunk tasks (the per-stay part, e.g. :meth:`RetentionSettings.stay_spec`, is what
the chunks and their cache keys see). Nothing is unpacked into positional tuples.

Every number has its range declared once, as a :class:`Bound`. The same object is the option's
argparse ``type`` — so :mod:`pipelines.preflight`'s light parser refuses ``--sigma nan`` in one
line (exit 2) before Prefect or the API server starts — and the dataclass's check in
``__post_init__``, so a flow started from Python or a deployment gets the same refusal
(:class:`pipelines.errors.SettingsError`). Integers are int64; floats finite.

Light on purpose (dataclasses and :mod:`cohort.events` only): preflight imports it.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields
from typing import Any

from cohort.events import EventDefinition
from pipelines.errors import SettingsError

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
#: longest ICU stay a ``--min-hours`` may ask for (a century of hours)
MAX_HOURS = 24.0 * 365.25 * 100
#: longest ``--wait`` / interval, in seconds (a year)
MAX_SECONDS = 365.25 * 86_400


@dataclass(frozen=True)
class Bound:
    """An allowed range: ``kind`` int (int64) or float (finite), ``low`` ≤ x ≤ ``high`` (``low``
    excluded when ``low_open``; None: no bound). Called on text it is an argparse ``type``."""

    kind: type = float
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def problem(self, v: Any) -> str | None:
        """Why ``v`` is out of range, or None."""
        if self.kind is int:
            if isinstance(v, bool) or not isinstance(v, int) and not _is_np_integer(v):
                return f"must be an integer, got {v!r}"
            v = int(v)
            if not INT64_MIN <= v <= INT64_MAX:
                return f"must fit in 64 bits (|x| < 2^63), got {v}"
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)) and not _is_np_number(v):
                return f"must be a number, got {v!r}"
            if not math.isfinite(float(v)):
                return f"must be a finite number, got {v}"
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return f"must be {'more than' if self.low_open else 'at least'} {self.low:g}, got {v:g}"
        if self.high is not None and v > self.high:
            return f"must be at most {self.high:g}, got {v:g}"
        return None

    def __call__(self, text: str):
        try:
            v = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"not {'an integer' if self.kind is int else 'a number'}: "
                                             f"{text!r}") from None
        msg = self.problem(v)
        if msg:
            raise argparse.ArgumentTypeError(msg)
        return v


def _is_np_integer(v: Any) -> bool:
    return type(v).__module__ == "numpy" and hasattr(v, "dtype") and v.dtype.kind in "iu"


def _is_np_number(v: Any) -> bool:
    return type(v).__module__ == "numpy" and hasattr(v, "dtype") and v.dtype.kind in "iuf"


COUNT = Bound(int, 1)  # stays, seeds, epochs, trials, workers: at least 1
COUNT0 = Bound(int, 0)  # 0 allowed (0 turns a part off, or means "no cap")
SEED = Bound(int, 0)
ID = Bound(int, INT64_MIN, INT64_MAX)  # a subject or stay id (int64, as the warehouse stores it)
NU = Bound(float, 0.0, 1.0, low_open=True)
POSITIVE = Bound(float, 0.0, low_open=True)  # a kernel width, a tolerance
HOURS = Bound(float, 0.0, MAX_HOURS)
SECONDS = Bound(float, 0.0, MAX_SECONDS)
INTERVAL = Bound(float, 0.0, MAX_SECONDS, low_open=True)
#: DuckDB memory limit of run-all's build (it spills to disk past it): the build's peak RSS is this
#: plus one bucket (cohort.build), so run-all stays under 2 GB on a full MIMIC-IV root
BUILD_MEMORY_LIMIT = "1GB"
#: patient-deletion: contexts checked against the independent refit (the first of the seeded shuffle)
REFIT_SAMPLE = 200


def event_file(text: str) -> EventDefinition:
    """argparse ``type`` of ``--events FILE``: the file's event (:func:`cohort.events.load_event`),
    or a one-line usage error naming what is wrong with it."""
    from cohort.errors import CohortError
    from cohort.events import load_event

    try:
        return load_event(text)
    except CohortError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def utc_microseconds(text: str) -> int:
    """argparse ``type`` of an ISO time (``--as-of``): microseconds since the epoch, read as UTC."""
    import datetime as dt

    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO time (e.g. 2180-07-23T12:00): {text!r}") from None
    return int(t.replace(tzinfo=dt.UTC).timestamp() * 1_000_000)


def check(what: str, value: Any, bound: Bound, optional: bool = False) -> None:
    """Raise :class:`SettingsError` when ``value`` is out of ``bound`` (None passes when ``optional``)."""
    if value is None and optional:
        return
    msg = bound.problem(value)
    if msg:
        raise SettingsError(f"{what} {msg}")


def check_fields(obj: Any, bounds: dict[str, Bound]) -> None:
    """:func:`check` every named field of a frozen settings dataclass (None passes where the default
    is None) and store it as its bound's kind (``48`` -> ``48.0`` for a float, a NumPy integer -> int),
    as a flow's typed parameter would have been."""
    defaults = {f.name: f.default for f in fields(obj)}
    for name, bound in bounds.items():
        v = getattr(obj, name)
        check(name, v, bound, optional=defaults.get(name) is None)
        if v is not None:
            object.__setattr__(obj, name, bound.kind(v))


def check_each(obj: Any, name: str, bound: Bound) -> None:
    """:func:`check` every value of the tuple field ``name`` (None: none) and store them as the bound's kind."""
    values = getattr(obj, name)
    if values is None:
        return
    for v in values:
        check(name, v, bound)
    object.__setattr__(obj, name, tuple(bound.kind(v) for v in values))


# ------------------------------------------------------------------------------ the studies
@dataclass(frozen=True)
class RetentionSettings:
    """``forgetful retention`` / ``heldout-spo2`` (:mod:`pipelines.flows.clinical_retention`).

    heldout : the held-out SpO₂ control (label SpO₂ < 90, SpO₂ withheld from the selectors).
    event : your own event (:mod:`cohort.events`) in place of the built-in one; the held-out rule
        withholds its channels from every selector. Gates are stored only by the built-in
        retention study (they back ``forgetful forget``).
    """

    heldout: bool = False
    event: EventDefinition | None = None
    nu: float = 0.3
    sigma: float = 3.0
    seed: int = 0
    n_boot: int = 10_000
    stays: int | None = None
    stays_per_task: int | None = None
    audit_stays: int = 50
    sensitivity_stays: int = 200
    persist_gates: bool = True

    def __post_init__(self):
        check_fields(self, {"nu": NU, "sigma": POSITIVE, "seed": SEED, "n_boot": COUNT, "stays": COUNT,
                            "stays_per_task": COUNT, "audit_stays": COUNT0, "sensitivity_stays": COUNT0})
        if self.event is not None and len(self.event.channels) >= 6:
            raise SettingsError(f"the event {self.event.name!r} reads every vital: the held-out rule would leave the "
                                "selectors no channel")

    @property
    def study(self) -> str:
        """The result's study name."""
        if self.event is not None:
            return f"{'heldout' if self.heldout else 'retention'}_{self.event.slug}"
        return "heldout_spo2" if self.heldout else "icu_retention"

    @property
    def command(self) -> str:
        return "heldout-spo2" if self.heldout else "retention"

    @property
    def label(self) -> str:
        """The event column (built-in events) or the event's name."""
        if self.event is not None:
            return self.event.name
        return "event_spo2" if self.heldout else "event_composite"

    @property
    def drop(self) -> tuple[str, ...]:
        """The channels withheld from every selector (the held-out rule)."""
        if self.event is not None:
            return self.event.channels
        return ("spo2",) if self.heldout else ()

    @property
    def stores_gates(self) -> bool:
        return self.persist_gates and not self.heldout and self.event is None

    def stay_spec(self):
        """What each stay's computation needs (:class:`evaluation.clinical.retention_spec.StaySpec`)."""
        from evaluation.clinical.retention_spec import StaySpec

        return StaySpec(label=self.label, drop=self.drop, nu=self.nu, sigma=self.sigma,
                        build_gate=self.stores_gates, event=self.event)


@dataclass(frozen=True)
class CohortSettings:
    """``forgetful build-cohort`` (:mod:`pipelines.flows.clinical_cohort`): the synthetic cohort's
    size and seed, the cohort filters, the build's memory cap and the MEDS code map."""

    stays: int = 1500
    seed: int = 0
    min_hours: float = 48
    sample: int | None = None
    memory_limit: str = "4GB"
    meds_codes: str | None = None
    fetch: bool = False

    def __post_init__(self):
        check_fields(self, {"stays": COUNT, "seed": SEED, "min_hours": HOURS, "sample": COUNT})


@dataclass(frozen=True)
class DeletionSettings:
    """``forgetful patient-deletion`` (:mod:`pipelines.flows.clinical_deletion`); ``gammas`` None:
    the study's decay factors (:data:`evaluation.clinical.patient_deletion.GAMMAS`)."""

    nu: float = 0.5
    sigma: float = 2.0
    per_context: int = 5
    max_hours: int = 48
    dedupe_tol: float = 0.1
    max_contexts: int | None = None
    max_stays: int | None = None
    seed: int = 0
    gammas: tuple[float, ...] | None = None
    decay_sigmas: tuple[float, ...] = ()
    persist_gates: bool = True
    batch_contexts: int = 32
    refit_sample: int = REFIT_SAMPLE

    def __post_init__(self):
        check_fields(self, {"nu": NU, "sigma": POSITIVE, "per_context": COUNT, "max_hours": COUNT,
                            "dedupe_tol": Bound(float, 0.0), "max_contexts": COUNT, "max_stays": COUNT, "seed": SEED,
                            "batch_contexts": COUNT, "refit_sample": COUNT})
        check_each(self, "gammas", NU)
        check_each(self, "decay_sigmas", POSITIVE)


@dataclass(frozen=True)
class DeteriorationSettings:
    """``forgetful deterioration`` (:mod:`pipelines.flows.clinical_deterioration`). ``models``
    None: every model of the study; ``seeds``, ``max_epochs`` and the window / stay caps None:
    the device's caps (0 = no cap)."""

    models: tuple[str, ...] | None = None
    seeds: int | None = None
    window: int = 48
    max_epochs: int | None = None
    n_boot: int = 10_000
    size: dict | None = None
    mode: str = "sliding"
    context: int = 48
    label: str = "filled"
    device: str = "cpu"
    train_windows: int | None = None
    val_windows: int | None = None
    test_stays: int | None = None
    tabular_windows: int | None = None

    def __post_init__(self):
        check_fields(self, {"seeds": COUNT, "window": COUNT, "max_epochs": COUNT, "n_boot": COUNT, "context": COUNT0,
                            "train_windows": COUNT0, "val_windows": COUNT0, "test_stays": COUNT0,
                            "tabular_windows": COUNT0})


@dataclass(frozen=True)
class RunAllSettings:
    """``forgetful run-all`` (:mod:`pipelines.flows.run_all`): each step's own settings, and how
    the steps run (``skip``, the Dask scheduler or the thread-pool size)."""

    cohort: CohortSettings = CohortSettings(memory_limit=BUILD_MEMORY_LIMIT)
    retention: RetentionSettings = RetentionSettings()
    deterioration: DeteriorationSettings = DeteriorationSettings(seeds=3, max_epochs=12)
    audit_trials: int = 50
    skip: tuple[str, ...] = ()
    dask_address: str | None = None
    workers: int = 2

    def __post_init__(self):
        check_fields(self, {"audit_trials": COUNT, "workers": COUNT})
        if self.retention.heldout or self.retention.event is not None:
            raise SettingsError("run-all's retention settings are the built-in study's (heldout-spo2 follows them)")

    @property
    def heldout(self) -> RetentionSettings:
        """The held-out SpO₂ control's settings: the retention study's, held out."""
        from dataclasses import replace

        return replace(self.retention, heldout=True)


@dataclass(frozen=True)
class IngestSettings:
    """How ``forgetful ingest`` runs (:func:`pipelines.ingest.ingest`): the new warehouse's
    standardisation and cohort filter (with ``init``), the watermark, and the run's resources."""

    frozen: dict | None = None
    min_hours: float = 48
    seed: int = 0
    as_of_us: int | None = None
    max_steps: int | None = None
    jobs: int | None = None
    batch_stays: int | None = None
    memory_limit: str | None = None  # None: the ingest's default (pipelines.ingest.steps.MEMORY_LIMIT)

    def __post_init__(self):
        check_fields(self, {"min_hours": HOURS, "seed": SEED, "as_of_us": ID, "max_steps": COUNT, "jobs": COUNT,
                            "batch_stays": COUNT})
