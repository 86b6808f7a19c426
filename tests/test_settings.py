"""Each study's settings (:mod:`pipelines.settings`): one frozen dataclass, every number checked
once by the same :class:`~pipelines.settings.Bound` that types its command-line option (issue 31
item 8, issue 34 item 2)."""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from pipelines.errors import SettingsError, UsageError
from pipelines.settings import (
    COUNT,
    HOURS,
    ID,
    NU,
    POSITIVE,
    SECONDS,
    CohortSettings,
    DeletionSettings,
    DeteriorationSettings,
    IngestSettings,
    RetentionSettings,
    RunAllSettings,
)

NOT_FINITE = [float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("bound,good,bad", [
    (NU, [1e-9, 0.3, 1.0], [0.0, -0.1, 1.0000001, *NOT_FINITE]),
    (POSITIVE, [1e-12, 3.0, 1e300], [0.0, -1.0, *NOT_FINITE]),
    (HOURS, [0, 48, 8.5e5], [-1, 1e308, *NOT_FINITE]),
    (SECONDS, [0, 0.5, 3600], [-5, *NOT_FINITE]),
    (COUNT, [1, 2 ** 63 - 1, np.int64(7)], [0, -3, 2 ** 63, True, 2.0, "3"]),
    (ID, [-(2 ** 63), 0, 2 ** 63 - 1, np.uint32(5)], [2 ** 63, -(2 ** 63) - 1, 1.5, False]),
])
def test_a_bound_takes_what_is_in_range_and_names_what_is_not(bound, good, bad):
    assert all(bound.problem(v) is None for v in good)
    for v in bad:
        msg = bound.problem(v)
        assert msg and "\n" not in msg, v


def test_as_an_argparse_type_it_refuses_in_one_usage_line():
    assert NU("0.5") == 0.5 and COUNT("12") == 12 and isinstance(COUNT("12"), int)
    for bound, text, says in ((POSITIVE, "nan", "must be a finite number, got nan"), (HOURS, "1e308", "at most"),
                              (COUNT, "1e3", "not an integer: '1e3'"), (ID, str(2 ** 64), "must fit in 64 bits"),
                              (SECONDS, "-5", "must be at least 0, got -5")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            bound(text)


@pytest.mark.parametrize("make,says", [
    (lambda: RetentionSettings(sigma=float("nan")), "sigma must be a finite number"),
    (lambda: RetentionSettings(nu=0), "nu must be more than 0"),
    (lambda: RetentionSettings(stays=0), "stays must be at least 1, got 0"),
    (lambda: RetentionSettings(audit_stays=-1), "audit_stays must be at least 0"),
    (lambda: RetentionSettings(n_boot=True), "n_boot must be an integer"),
    (lambda: CohortSettings(min_hours=float("inf")), "min_hours must be a finite number"),
    (lambda: CohortSettings(min_hours=1e308), "min_hours must be at most"),
    (lambda: CohortSettings(sample=0), "sample must be at least 1"),
    (lambda: DeletionSettings(decay_sigmas=(1.0, -2.0)), "decay_sigmas must be more than 0"),
    (lambda: DeletionSettings(gammas=(0.5, 1.5)), "gammas must be at most 1"),
    (lambda: DeteriorationSettings(seeds=0), "seeds must be at least 1"),
    (lambda: DeteriorationSettings(test_stays=-1), "test_stays must be at least 0"),
    (lambda: IngestSettings(jobs=0), "jobs must be at least 1"),
    (lambda: IngestSettings(as_of_us=2 ** 63), "as_of_us must fit in 64 bits"),
    (lambda: RunAllSettings(workers=0), "workers must be at least 1"),
    (lambda: RunAllSettings(retention=RetentionSettings(heldout=True)), "built-in study"),
])
def test_every_settings_dataclass_refuses_a_bad_value_in_one_line(make, says):
    with pytest.raises(SettingsError, match=says) as e:
        make()
    assert isinstance(e.value, UsageError) and "\n" not in str(e.value)


def test_settings_are_frozen_and_derive_the_studies_label_and_withheld_channels():
    r = RetentionSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.nu = 0.5  # type: ignore[misc]
    h = RunAllSettings().heldout
    assert (r.study, r.label, r.drop, r.stores_gates) == ("icu_retention", "event_composite", (), True)
    assert (h.study, h.label, h.drop, h.stores_gates) == ("heldout_spo2", "event_spo2", ("spo2",), False)
    spec = r.stay_spec()
    assert (spec.label, spec.drop, spec.nu, spec.sigma, spec.build_gate) == ("event_composite", (), 0.3, 3.0, True)


def test_an_empty_cohort_is_one_line_with_the_funnel_counts():
    from cohort.errors import EmptyCohortError

    e = EmptyCohortError("empty cohort after filters (los >= 1000 h)",
                         [("icu_stays", 140, None), ("adult", 120, None), ("los_ge_1000h", 0, None)])
    assert str(e) == ("empty cohort after filters (los >= 1000 h); stays after each step: icu_stays 140 → adult 120 "
                      "→ los_ge_1000h 0") and e.funnel[-1] == ("los_ge_1000h", 0, None)
