"""Early checks that a warehouse's cohort is large enough for a study.

Each clinical study calls one of these at its start, before any task runs or any result is
written, so a cohort that is too small fails with one line naming the minimum and what came out
short — e.g. ``deterioration needs ≥ 1 stay in the val split; this cohort's val split has 0 of
3 stays`` — instead of failing half-way in a task. The errors are :class:`CohortTooSmallError`
(a :class:`~pipelines.errors.StudyInputError`), so every command exits 3 with that one line.
Counts only: no identifier is read into a message.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

from pipelines.errors import StudyInputError

SPLITS = ("train", "val", "test")


class CohortTooSmallError(StudyInputError):
    """The cohort is too small for the study (a split, or the event stays, came out short)."""


@functools.lru_cache(maxsize=1)
def min_patients_for_all_splits() -> int:
    """The smallest number of patients from which :func:`cohort.selection.assign_splits` (by
    patient, 70/15/15) leaves no split empty — for that many patients and every larger count
    checked (up to 2,000)."""
    from cohort.selection import assign_splits

    def all_nonempty(n: int) -> bool:
        return set(assign_splits(range(n), 0).values()) == set(SPLITS)

    ok = [all_nonempty(n) for n in range(1, 2001)]
    return next(n for n in range(1, 2001) if all(ok[n - 1:]))


HINT = ("rebuild the warehouse with more patients (forgetful build-cohort: another --root, a larger or no "
        "--sample, a lower --min-hours; or --source synthetic --stays N)")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def split_counts(warehouse: str) -> dict[str, tuple[int, int]]:
    """split -> (stays, patients) of the warehouse's cohort (every split, zeros included)."""
    from pipelines.store.warehouse import stays

    out = {s: (0, 0) for s in SPLITS}
    by: dict[str, tuple[set, set]] = {}
    for stay_id, subject_id, split, _n in stays(warehouse):
        st, pt = by.setdefault(split, (set(), set()))
        st.add(stay_id)
        pt.add(subject_id)
    out.update({s: (len(st), len(pt)) for s, (st, pt) in by.items()})
    return out


def require_splits(warehouse: str, study: str, need: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Every split in ``need`` holds at least that many stays, else :class:`CohortTooSmallError`."""
    counts = split_counts(warehouse)
    total = sum(c[0] for c in counts.values())
    patients = sum(c[1] for c in counts.values())
    for split, minimum in need.items():
        have = counts.get(split, (0, 0))[0]
        if have < minimum:
            m = min_patients_for_all_splits()
            raise CohortTooSmallError(
                f"{study} needs ≥ {_plural(minimum, 'stay')} in the {split} split; this cohort's {split} split has "
                f"{have} of {_plural(total, 'stay')} ({_plural(patients, 'patient')}; the split is by patient, "
                f"70/15/15, and leaves no split empty from {m} patients on) — {HINT}")
    return counts


def require_event_stays(warehouse: str, study: str, event, minimum: int = 1,
                        what: str = "an event hour", split: str | None = None) -> int:
    """At least ``minimum`` stays (of ``split``, default all) have ≥ 1 event hour, else
    :class:`CohortTooSmallError`; returns the count. ``event``: a built-in event column
    (``event_composite``, ``event_spo2``) or your own :class:`cohort.events.EventDefinition`."""
    import duckdb

    from cohort.events import EventDefinition

    if isinstance(event, EventDefinition):
        test = event.sql()
    elif event in ("event_composite", "event_spo2"):
        test = event
    else:
        raise StudyInputError(f"unknown event column {event!r}")
    con = duckdb.connect(str(warehouse), read_only=True)
    try:
        n_event, n_all = con.execute(
            f"SELECT count(DISTINCT CASE WHEN {test} THEN h.stay_id END), count(DISTINCT s.stay_id) "
            "FROM cohort_stays s LEFT JOIN vitals_hourly h USING (stay_id)"
            + (" WHERE s.split = ?" if split else ""), [split] if split else []).fetchone()
    finally:
        con.close()
    if n_event < minimum:
        where = f"in the {split} split" if split else ""
        raise CohortTooSmallError(
            f"{study} needs ≥ {_plural(minimum, 'stay')} with {what}{' ' + where if where else ''}; this cohort"
            f"{chr(39) + 's ' + split + ' split' if split else ''} has {n_event} of {_plural(int(n_all), 'stay')} "
            f"with one — {HINT}")
    return int(n_event)


def require_patients(warehouse: str, study: str, minimum: int, what: str) -> int:
    """At least ``minimum`` patients in the cohort, else :class:`CohortTooSmallError`."""
    counts = split_counts(warehouse)
    patients = sum(c[1] for c in counts.values())
    if patients < minimum:
        raise CohortTooSmallError(
            f"{study} needs ≥ {minimum} patients ({what}); this cohort has {_plural(patients, 'patient')} — {HINT}")
    return patients
