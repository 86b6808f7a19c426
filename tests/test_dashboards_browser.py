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
    driver.get(path.resolve().as_uri())
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
