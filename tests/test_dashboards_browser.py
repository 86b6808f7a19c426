"""Open a rendered report in headless Chromium: no console errors, images load, non-blank screenshot.

Needs Debian ``chromium`` + ``chromium-driver`` (``apt-get install -y chromium chromium-driver``) and
the dev dependency ``selenium``; skipped with a reason when any is missing. The browser runs with
networking features disabled and a fresh profile; the page is a local file.
Set ``FORGETFUL_SCREENSHOT_DIR`` to keep the screenshot for a visual check.
"""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dashboards.report import write_report

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium chromium-driver)"),
    pytest.mark.skipif(CHROMEDRIVER is None, reason="chromedriver not installed (apt-get install -y chromium-driver)"),
]

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--hide-scrollbars", "--window-size=1280,900",
]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (dev dependency) not installed")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def load_and_collect_problems(driver, path: Path) -> list[str]:
    """Open ``path``; return browser log entries at WARNING or above and images that failed to load."""
    driver.get_log("browser")  # drain anything left from a previous page
    driver.set_window_size(1280, 900)
    driver.get(path.resolve().as_uri())
    driver.execute_async_script(  # every embedded PNG decoded, so boxes have their final size
        "const done = arguments[0]; Promise.all(Array.from(document.images).map(i => i.decode().catch(() => null)))"
        ".then(() => done(true));")
    problems = [f"{e['level']}: {e['message']}" for e in driver.get_log("browser")
                if e["level"] in ("SEVERE", "WARNING")]
    broken = driver.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt)")
    problems += [f"image failed to load: {alt}" for alt in broken]
    return problems


def full_page_png(driver) -> bytes:
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1280, min(max(height, 900), 20_000))
    return driver.get_screenshot_as_png()


def test_problem_detector_catches_console_errors_and_broken_resources(browser, tmp_path):
    """Negative control: the check used below must be able to fail."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><h1>x</h1><img src="missing.png" alt="gone">'
                    '<script>console.error("boom")</script></body></html>')
    problems = load_and_collect_problems(browser, page)
    assert any("boom" in p for p in problems)
    assert any("missing.png" in p for p in problems)
    assert any("image failed to load: gone" in p for p in problems)


def test_report_in_headless_chromium(browser, tmp_path):
    from matplotlib.image import imread
    from test_dashboards_report import fixture_results, write_fixture_runs

    runs = write_fixture_runs(tmp_path)
    out = write_report(runs, tmp_path / "report.html")
    problems = load_and_collect_problems(browser, out)
    assert problems == []

    n_imgs = browser.execute_script("return document.images.length")
    assert n_imgs == out.read_text().count("<img ")
    assert n_imgs >= sum(len(r["figures"]) for r in fixture_results())
    # every loaded resource is inline (data:) — nothing was fetched from anywhere
    urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(u.startswith("data:") for u in urls), urls
    assert "Contract card" in browser.find_element("id", "contract").text
    assert "not run" in browser.find_element("id", "heldout").text

    png = full_page_png(browser)
    keep = os.environ.get("FORGETFUL_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "report_screenshot.png").write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 100_000  # a page of charts and tables, not an empty canvas
    img = imread(io.BytesIO(png), format="png")[..., :3]
    assert img.shape[0] > 3000 and img.shape[1] == 1280
    assert img.std() > 0.05  # not a flat blank image
    non_background = np.mean(np.any(np.abs(img - img[5, -5]) > 0.05, axis=-1))
    assert non_background > 0.10


# ------------------------------------------------------------------------------ layout: nothing overflows or clips
#: every <details> opened first, so collapsed tables are checked too; returns one line per problem
LAYOUT_PROBLEMS_JS = """
document.querySelectorAll('details').forEach(d => d.open = true);
const out = [];
const root = document.documentElement;
if (root.scrollWidth > root.clientWidth + 1)
  out.push('page scrolls sideways: ' + root.scrollWidth + ' > ' + root.clientWidth);
const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.className ? '.' + el.className : '') +
                   ' "' + (el.textContent || el.alt || '').trim().slice(0, 40) + '"';
const CONTAINERS = '.tablewrap, .lead, .seed, .run, .pair, .card-head, details, article, section';
const container = el => {  // the nearest enclosing box (display: contents has none)
  for (let a = el.parentElement; a; a = a.parentElement)
    if (a.matches(CONTAINERS) && a.getBoundingClientRect().width > 0) return a;
  return null;
};
for (const el of document.querySelectorAll('main *')) {
  const box = container(el);
  if (!box) continue;
  const r = el.getBoundingClientRect(), b = box.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;
  if (r.right > b.right + 1 || r.left < b.left - 1)
    out.push('overflows its ' + (box.className || box.tagName.toLowerCase()) + ': ' + name(el));
}
for (const w of document.querySelectorAll('.tablewrap')) {
  if (w.scrollWidth > w.clientWidth + 1)
    out.push('table wider than its card (scrolls): ' + name(w.querySelector('th') || w));
}
for (const el of document.querySelectorAll('h1, h2, h3, h4, summary, th, .badge, .caption')) {
  const hidden = getComputedStyle(el).overflow !== 'visible';
  if (el.scrollWidth > el.clientWidth + 1 || (hidden && el.scrollHeight > el.clientHeight + 1))
    out.push('clipped: ' + name(el));
}
return out;
"""


def layout_problems(driver, path: Path) -> list[str]:
    assert load_and_collect_problems(driver, path) == []
    return driver.execute_script(LAYOUT_PROBLEMS_JS)


def test_layout_detector_catches_overflow_and_clipping(browser, tmp_path):
    """Negative control for the layout check below."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><main style="width:600px"><section>'
                    '<h3 style="width:80px;overflow:hidden;white-space:nowrap">a heading far too long for its box</h3>'
                    '<div style="width:900px">wide</div><div class="tablewrap" style="overflow-x:auto">'
                    '<table style="width:2000px"><tr><th>x</th></tr></table></div></section></main></body></html>')
    problems = layout_problems(browser, page)
    assert any(p.startswith("clipped: h3") for p in problems), problems
    assert any(p.startswith("overflows its section: div") for p in problems), problems
    assert any(p.startswith("table wider than its card") for p in problems), problems


def test_report_layout_has_no_overflow_or_clipped_title(browser, tmp_path):
    from test_dashboards_report import write_fixture_runs

    out = write_report(write_fixture_runs(tmp_path), tmp_path / "report.html")
    assert layout_problems(browser, out) == []


# ------------------------------------------------------------------------------ the auditor sequence in the browser
COUNT_JS = "return document.querySelector('#study-ledger .ledger .count').textContent"


def test_browser_reads_the_right_ledger_card_after_forget_rerender_and_copy(browser, prefect_harness,
                                                                             tmp_path_factory, tmp_path):
    from test_dashboards_ledger_card import EXPECTED_COUNT, auditor_sequence

    seq = auditor_sequence(tmp_path_factory)
    keep = os.environ.get("FORGETFUL_SCREENSHOT_DIR")
    for i, (step, page) in enumerate(seq["pages"].items()):
        f = tmp_path / f"step{i}.html"
        f.write_text(page)
        assert layout_problems(browser, f) == [], step
        count = browser.execute_script(COUNT_JS)
        assert int(count) == EXPECTED_COUNT[step], step
        ledger_badges = browser.execute_script(
            "return Array.from(document.querySelectorAll('#study-ledger .badge.stale')).length")
        cohort_badge = browser.execute_script(
            "const b = document.querySelector('#study-cohort .badge.stale'); return b ? b.textContent : null")
        assert ledger_badges == 0, step
        assert (cohort_badge is None) == (step == "run-all"), step
        assert cohort_badge is None or cohort_badge.startswith("stale since receipt #1:"), (step, cohort_badge)
        if keep:
            card = browser.find_element("id", "study-ledger")
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / f"ledger_card_{i}_{step.replace(' ', '_').replace(chr(39), '')}.png").write_bytes(
                card.screenshot_as_png)
    # and the files on disk now: each folder's report shows its own ledger
    for folder in (seq["runs"], seq["copy"]):
        load_and_collect_problems(browser, folder / "report.html")
        assert browser.execute_script(COUNT_JS) == "2"
