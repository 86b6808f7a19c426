"""The report's streaming-ingest section (dashboards.stream_card) from stored ingest results."""
from __future__ import annotations

import json
import re

from dashboards.schema import validate_result


def ingest_result(n_steps: int = 6, with_series: bool = True) -> dict:
    """A fixture ingest result (numbers are arbitrary aggregates)."""
    hours = [200 * (i + 1) + 7 for i in range(n_steps)]
    hot = [30 + 5 * i for i in range(n_steps)]
    m = {"n_stays": 3, "n_tokens": hours[-1], "n_hot": hot[-1], "n_cold": hours[-1] - hot[-1], "readmissions": 11,
         "gated_stays": 3, "future_safe_stays": 3, "certified_retention": hot[-1] / hours[-1], "step": n_steps}
    if with_series:
        m["stream_series"] = {
            "step": list(range(1, n_steps + 1)), "hours_admitted": hours, "new_tokens": [200] * n_steps,
            "n_hot": hot, "n_cold": [h - k for h, k in zip(hours, hot)],
            "readmissions": [0, 0, 3, 5, 9, 11][:n_steps] + [11] * max(0, n_steps - 6),
            "late_rows": [0, 4, 0, 0, 2, 0][:n_steps] + [0] * max(0, n_steps - 6),
            "reopened_hours": [0, 3, 0, 0, 1, 0][:n_steps] + [0] * max(0, n_steps - 6),
            "replaced_tokens": [0] * n_steps, "certified_retention": [k / h for h, k in zip(hours, hot)]}
    return validate_result({"study": "ingest", "title": "Incremental ingest: per-stay streaming memories",
                            "data": "synthetic", "runtime_s": 2.5, "seed_figure": {}, "metrics": m, "tables": [],
                            "figures": [], "config": {"source": "mimic"}})


def _section(page: str) -> str:
    m = re.search(r'<section id="stream">(.*?)</section>', page, re.S)
    assert m, "no streaming section"
    return m.group(1)


def test_section_shows_the_series(tmp_path):
    from dashboards.report import render_report

    (tmp_path / "ingest").mkdir()
    (tmp_path / "ingest" / "result.json").write_text(json.dumps(ingest_result()))
    page = render_report(tmp_path)
    sec = _section(page)
    assert sec.count("<img") == 3  # tier sizes; re-admissions; late rows and re-opens
    rows = re.findall(r"<tr>(.*?)</tr>", sec.split("Sampled watermark steps")[1], re.S)
    cells = [c for c in (re.findall(r"<td class=\"num\">(.*?)</td>", r) for r in rows) if c]
    assert [c[:4] for c in cells] == [[f"{i + 1}", f"{200 * (i + 1) + 7:,}", f"{30 + 5 * i}",
                                       f"{200 * (i + 1) + 7 - 30 - 5 * i:,}"] for i in range(6)]
    assert [c[5] for c in cells] == ["0", "0", "3", "5", "9", "11"] and [c[7] for c in cells][1] == "3"
    assert "Other studies" not in page  # the ingest result is rendered once, in its own section


def test_long_series_is_sampled_in_the_table():
    from dashboards.stream_card import TABLE_ROWS, series_of, stream_table

    cols, rows = stream_table(series_of(ingest_result(n_steps=40)))
    assert len(rows) == TABLE_ROWS and rows[0][0] == 1 and rows[-1][0] == 40 and cols[0] == "step"


def test_old_result_without_series():
    from dashboards.stream_card import stream_section_html

    sec = _section(stream_section_html([ingest_result(with_series=False)]))
    assert "no per-step series" in sec and "<img" not in sec
    assert "1,207" in sec  # the run's totals are still shown (live tokens after the last step)


def test_no_ingest_result_no_section(tmp_path):
    from dashboards.report import render_report

    assert '<section id="stream">' not in render_report(tmp_path)


def test_no_late_rows_said_in_words():
    from dashboards.stream_card import stream_section_html

    r = ingest_result()
    ser = r["metrics"]["stream_series"]
    ser["late_rows"] = [0] * len(ser["step"])
    ser["reopened_hours"] = [0] * len(ser["step"])
    sec = _section(stream_section_html([r]))
    assert sec.count("<img") == 2 and "No late rows" in sec
