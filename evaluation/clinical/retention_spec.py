"""What one stay's retention computation needs, as one frozen value: the event, the withheld
channels, the gate's ν and σ, the policies, whether to build the maintained gate.

:class:`StaySpec` is what the retention study's chunk tasks receive (and what their cache keys
hold); :meth:`StaySpec.keys_events` turns a :class:`cohort.streams.StayStream` into the selectors'
keys ``(n, 6 - len(drop))`` and the event hours ``(n,)``: a built-in event column of the warehouse
(``event_composite``, ``event_spo2``), or your own event (:class:`cohort.events.EventDefinition`)
evaluated on the stay's filled values. :meth:`StaySpec.event_sql` is the same event over
``vitals_hourly``'s columns, for queries that count event hours.
"""
from __future__ import annotations

from dataclasses import dataclass

from cohort.constants import EVENT_COLUMNS, VITALS
from cohort.events import EventDefinition
from evaluation.clinical.retention import DEFAULT_POLICIES
from evaluation.errors import MetricError


@dataclass(frozen=True)
class StaySpec:
    """label : a built-in event column, or the event's name when ``event`` is given.
    drop : vitals withheld from every selector's keys."""

    label: str = "event_composite"
    drop: tuple[str, ...] = ()
    nu: float = 0.3
    sigma: float = 3.0
    policies: tuple[str, ...] = DEFAULT_POLICIES
    build_gate: bool = True
    event: EventDefinition | None = None

    def __post_init__(self):
        if self.event is None and self.label not in EVENT_COLUMNS:
            raise MetricError(f"label must be one of {EVENT_COLUMNS} or an event's name, got {self.label!r}")
        if self.event is not None and self.label != self.event.name:
            raise MetricError(f"label {self.label!r} is not the event's name {self.event.name!r}")
        bad = [v for v in self.drop if v not in VITALS]
        if bad:
            raise MetricError(f"unknown vital(s) to withhold: {bad}")

    def keys_events(self, s):
        """``(keys (n, d), event hours (n,) bool)`` of one :class:`cohort.streams.StayStream`."""
        ev = self.event.evaluate(s.raw) if self.event is not None else getattr(s, self.label)
        return s.keys(self.drop), ev

    def event_sql(self) -> str:
        """The event hours as a boolean SQL expression over ``vitals_hourly``'s columns."""
        return self.event.sql() if self.event is not None else self.label
