"""The headless browser for the dashboard tests: Debian's Chromium driven by Selenium through the system chromedriver.

``scripts/browser-up`` installs both when missing (as root). Outside CI a host where that cannot happen skips
the browser tests with the reason; under ``CI=true`` it fails them, since CI must run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"{reason} (CI=true: the browser tests must run)", pytrace=False)
    pytest.skip(f"{reason}; run scripts/browser-up as root to enable the browser tests")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A headless Chromium WebDriver, shared by the session's browser tests."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed (pip install -e .[test])")
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        if os.geteuid() != 0:
            _unavailable("chromium and chromium-driver are not installed and this user is not root")
        up = subprocess.run([str(ROOT / "scripts" / "browser-up")], capture_output=True, text=True, timeout=900)
        if up.returncode != 0:
            _unavailable(f"scripts/browser-up failed: {up.stderr.strip()[-500:]}")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=shutil.which("chromedriver")))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
