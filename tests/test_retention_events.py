"""Your own event for the retention studies (issue 35 item 4): the ACES-style predicate reader
(:mod:`cohort.events`), the held-out rule applied to whatever channel defines the event, and a file
that restates the built-in SpO₂ < 90 giving bit-identical results."""
from __future__ import annotations

import shutil

import duckdb
import numpy as np
import pytest

from cohort.constants import VITALS
from cohort.errors import BadParameterError
from cohort.events import Derived, Predicate, load_event, parse_event, read_predicates
from cohort.synthetic import make_small_warehouse
from pipelines.runtime import runner

TACHY = {"predicates": {"tachycardia": {"code": "HOURLY_MEAN//HR//bpm", "value_min": 110}}}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_small_warehouse(tmp_path_factory.mktemp("events") / "src", stays=40, seed=0)


@pytest.fixture
def site(base, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    w = runs / "warehouse.duckdb"
    shutil.copy(base, w)
    return str(w), str(runs)


def _stays(w):
    from cohort.streams import iter_stays

    return list(iter_stays(w))


# ------------------------------------------------------------------------------ the reader
def test_plain_and_derived_predicates_in_aces_shape(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text("predicates:\n"
                 "  low_sat: {code: spo2, value_max: 90}\n"
                 "  fast: {code: 'LAB//220045//bpm', value_min: 130, value_min_inclusive: true}\n"
                 "  either: {expr: 'or(low_sat, fast)'}\n"
                 "event: either\n"
                 "trigger: _ANY_EVENT\n")  # an ACES task's own keys are left to the tools that read them
    ev = load_event(f)
    assert ev.name == "either" and ev.combine == "or" and ev.channels == ("hr", "spo2")
    low, fast = ev.predicates
    assert (low.vital, low.value_max, low.value_max_inclusive) == ("spo2", 90.0, False)
    assert (fast.vital, fast.value_min, fast.value_min_inclusive) == ("hr", 130.0, True)
    X = np.full((4, len(VITALS)), 95.0)
    X[:, VITALS.index("hr")] = [80, 130, 129.9, np.nan]
    X[:, VITALS.index("spo2")] = [89.9, 95, 90, 85]
    assert ev.evaluate(X).tolist() == [True, True, False, True]  # 90 is not < 90; 130 is ≥ 130 (inclusive)
    preds = read_predicates({"a": {"code": "rr", "value_min": 30}, "b": {"code": "rr", "value_max": 6},
                             "c": {"expr": "and(a, b)"}})
    assert isinstance(preds["a"], Predicate) and preds["c"] == Derived("c", "and", ("a", "b"))


def test_a_fahrenheit_code_has_its_bounds_in_celsius():
    from cohort.constants import FAHRENHEIT_ITEMID

    ev = parse_event({"predicates": {"fever": {"code": f"LAB//{FAHRENHEIT_ITEMID}//°F", "value_min": 100.4}}})
    assert ev.channels == ("temp_c",) and ev.predicates[0].value_min == pytest.approx(38.0)


@pytest.mark.parametrize("spec,says", [
    ({"predicates": {"x": {"code": "NOPE", "value_min": 1}}}, "names none of the six vitals"),
    ({"predicates": {"x": {"code": {"regex": "HR.*"}}}}, "regex is not supported"),
    ({"predicates": {"x": {"code": "hr", "other_cols": {"unit": "bpm"}}}}, "unsupported key(s) other_cols"),
    ({"predicates": {"x": {"code": "hr", "value_min": float("nan")}}}, "value_min must be a finite number"),
    ({"predicates": {"x": {"code": "hr", "value_min": 120, "value_max": 100}}}, "no value satisfies"),
    ({"predicates": {"x": {"code": "hr"}, "y": {"code": "rr"}}}, "'event' must name"),
    ({"predicates": {"x": {"code": "hr"}}, "event": "y"}, "event 'y' is not a predicate"),
    ({"predicates": {"x": {"code": "hr"}, "d": {"expr": "or(x, e)"}, "e": {"expr": "and(x, x)"}}, "event": "d"},
     "'e' is not a plain predicate"),
    ({"predicates": {"x": {"code": "hr"}, "d": {"expr": "not(x)"}}, "event": "d"}, "expr must be and("),
    ({"predicates": {"x": {"code": "hr"}}, "windows": {}, "task": 1}, "unknown key(s) task"),
    ({"predicates": {"1x": {"code": "hr"}}}, "predicate name '1x'"),
    (["not", "a", "mapping"], "expected a mapping with 'predicates'"),
])
def test_a_bad_event_file_is_one_typed_line(spec, says):
    with pytest.raises(BadParameterError) as e:
        parse_event(spec)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_event_every_vital_reads_leaves_no_selector_channel():
    from pipelines.errors import SettingsError
    from pipelines.settings import RetentionSettings

    every = parse_event({"predicates": {**{v: {"code": v, "value_min": 0} for v in VITALS},
                                        "any": {"expr": f"or({', '.join(VITALS)})"}}, "event": "any"})
    with pytest.raises(SettingsError, match="reads every vital"):
        RetentionSettings(event=every)


def test_numpy_and_sql_find_the_same_event_hours_and_restate_the_built_in_events(base):
    from evaluation.clinical.retention_spec import StaySpec

    ev = parse_event({"predicates": {"fast": {"code": "hr", "value_min": 110}, "slow_rr": {"code": "rr",
                                                                                           "value_max": 10},
                                     "e": {"expr": "or(fast, slow_rr)"}}, "event": "e"})
    stays = _stays(base)
    mine = sum(int(ev.evaluate(s.raw).sum()) for s in stays)
    con = duckdb.connect(str(base), read_only=True)
    sql = con.execute(f"SELECT count(*) FILTER (WHERE {StaySpec(label='e', event=ev).event_sql()}) "
                      "FROM vitals_hourly").fetchone()[0]
    con.close()
    assert mine == sql > 0
    spo2 = parse_event({"predicates": {"hypox": {"code": "HOURLY_MEAN//SPO2//%", "value_max": 90}}})
    assert all(np.array_equal(spo2.evaluate(s.raw), s.event_spo2) for s in stays)  # the warehouse's own label


# ------------------------------------------------------------------------------ the study
def _run(flow_obj, w, runs, settings):
    with runner.results_context(runs):
        return flow_obj.with_options(task_runner=runner.make_task_runner(None, 2))(
            warehouse=w, runs_dir=runs, settings=settings, progress=False)


def test_the_held_out_rule_withholds_the_channel_that_defines_the_event(prefect_harness, site, monkeypatch):
    """An event on heart rate (not SpO₂): every selector's keys lack HR — and only HR — and the
    event hours are the predicate on the stay's filled HR."""
    from evaluation.clinical import retention as study
    from pipelines.flows.clinical_retention import heldout_flow, retention_flow
    from pipelines.settings import RetentionSettings

    w, runs = site
    ev = parse_event(TACHY)
    seen, real = [], study.stay_retention

    def spy(X, e, built, **kw):
        seen.append((np.array(X), np.array(e)))
        return real(X, e, built, **kw)
    monkeypatch.setattr(study, "stay_retention", spy)
    kw = dict(n_boot=200, stays_per_task=5, audit_stays=2, sensitivity_stays=0, event=ev)
    res = _run(retention_flow, w, runs, RetentionSettings(**kw))
    stays = {s.stay_id: s for s in _stays(w)}
    keep = [i for i, v in enumerate(VITALS) if v != "hr"]
    assert len(seen) == len(stays) == res["metrics"]["n_stays"]
    by_z = {s.z[:, keep].tobytes(): s for s in stays.values()}
    for X, e in seen:
        s = by_z[X.tobytes()]  # the keys are the stay's z-scored vitals without HR, in order
        assert X.shape[1] == 5 and np.array_equal(e, s.raw[:, VITALS.index("hr")] > 110)
    m, cfg = res["metrics"], res["config"]
    assert (res["study"], m["label"], m["key_dim"]) == ("retention_tachycardia", "tachycardia", 5)
    assert cfg["selector_input"] == "5-d z-scored vitals without hr" and cfg["event"] == "tachycardia: 110 < hr"
    assert m["n_stays_included"] == sum(bool((s.raw[:, 0] > 110).any()) for s in stays.values())
    assert m["gates_persisted"] == 0 and res["seed_figure"] == {}  # the built-in study's gates stay as they are
    held = _run(heldout_flow, w, runs, RetentionSettings(heldout=True, **kw))
    assert held["study"] == "heldout_tachycardia" and held["metrics"]["retention"] == m["retention"]


def test_an_event_restating_spo2_below_90_is_bit_identical_to_the_built_in_control(prefect_harness, site):
    from pipelines.flows.clinical_retention import heldout_flow
    from pipelines.settings import RetentionSettings
    from pipelines.store import stay_results

    w, runs = site
    kw = dict(heldout=True, n_boot=300, stays_per_task=6, audit_stays=3, sensitivity_stays=4)
    ref = _run(heldout_flow, w, runs, RetentionSettings(**kw))
    spo2 = parse_event({"predicates": {"hypox": {"code": "spo2", "value_max": 90}}})
    got = _run(heldout_flow, w, runs, RetentionSettings(event=spo2, **kw))
    for k in ("retention", "refit_audit", "sensitivity", "key_dim", "n_stays_included", "mean_budget_fraction"):
        assert got["metrics"][k] == ref["metrics"][k], k
    assert [d for d in got["metrics"] if d.startswith("diff_")] == [d for d in ref["metrics"] if d.startswith("diff_")]
    assert all(got["metrics"][d] == ref["metrics"][d] for d in ref["metrics"] if d.startswith("diff_"))
    con = duckdb.connect(w, read_only=True)
    a, b = stay_results.read(con, "heldout_spo2"), stay_results.read(con, "heldout_hypox")
    con.close()
    assert sorted(a) == sorted(b) and a["stay_id"].size == ref["metrics"]["n_stays"]
    for c in a:
        assert a[c].tobytes() == b[c].tobytes(), c
