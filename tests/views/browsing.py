"""What the browser tests share: opening the page at a screen size, where things are, screenshots for the docs.

The page is opened once per test and never reloaded unless a test says so: :func:`not_reloaded` checks a
marker :func:`open_page` put on ``window``, so every change a test saw came over the page's event streams.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from .serving import wait_for

#: Where the screenshots go: the docs' pictures with ``make screenshots`` (SCREENSHOTS_DIR=docs), else a
#: scratch folder, so a test run leaves the working tree as it was.
DOCS = Path(os.environ.get("SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / f"tsm-screenshots-{os.getuid()}")
DESKTOP, PHONE = (1280, 800), (390, 844)


def screen(browser: Any, size: tuple[int, int] = DESKTOP, mobile: bool = False) -> None:
    """Make the page's viewport ``size`` CSS pixels (a phone's with ``mobile``), at one device pixel each."""
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": mobile})


def open_page(browser: Any, url: str, size: tuple[int, int] = DESKTOP) -> None:
    screen(browser, size)
    browser.get(url)
    wait_for(lambda: browser.find_element("id", "status").text.startswith("live"), what="page live")
    browser.execute_script("window.__loadedOnce = 42;")


def not_reloaded(browser: Any) -> bool:
    return bool(browser.execute_script("return window.__loadedOnce === 42 && window.__pwned === undefined;"))


def route(browser: Any) -> str:
    """The page's address after its ``#`` (what it shows), decoded."""
    from urllib.parse import unquote

    return unquote(str(browser.execute_script("return location.hash;")))


def in_view(browser: Any, css: str) -> bool:
    """Whether the element is shown and its top edge lies inside the window (seen without scrolling)."""
    return bool(browser.execute_script(
        "const e = document.querySelector(arguments[0]); if (!e || !e.getClientRects().length) return false;"
        "const r = e.getBoundingClientRect(); return r.top >= 0 && r.top < window.innerHeight - 40;", css))


def shot(browser: Any, name: str) -> Path:
    """Save what the window shows as ``DOCS/NAME.png`` (docs/views.md shows them): one device pixel per CSS pixel."""
    DOCS.mkdir(parents=True, exist_ok=True)
    path = DOCS / f"{name}.png"
    assert browser.save_screenshot(str(path)), f"no screenshot for {path}"
    return path
