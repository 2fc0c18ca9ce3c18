"""``tsm serve`` in a real browser: headless Chromium driven by Selenium, against real local apps.

The page is loaded once per test and never reloaded: a marker put on ``window`` at the start is checked
at the end, so every change seen (apps appearing, FAILED, log lines, CANCELLED) came over the event stream.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, AppState, Resource, Role
from tsm.store import Store

from .serving import base, tsm_serve, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.browser]
pytest.importorskip("selenium", reason="selenium is installed by `pip install -e .[test]`")

from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs"
EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"><b>bold</b>'


def py(code: str, name: str = "r", replicas: int = 1) -> Role:
    return Role(name, image=".", entrypoint=sys.executable, args=["-u", "-c", code], num_replicas=replicas,
                resource=Resource(cpu=1, gpu=0, memMB=256))


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def open_page(browser: Any, url: str) -> None:
    browser.get(url)
    wait_for(lambda: browser.find_element(By.ID, "status").text.startswith("live"), what="page live")
    browser.execute_script("window.__loadedOnce = 42;")


def not_reloaded(browser: Any) -> bool:
    return bool(browser.execute_script("return window.__loadedOnce === 42 && window.__pwned === undefined;"))


def row(browser: Any, handle: str) -> Any:
    rows = browser.find_elements(By.CSS_SELECTOR, f'#apps tr.app[data-handle="{handle}"]')
    return rows[0] if rows else None


def cell(browser: Any, handle: str, cls: str) -> str:
    try:
        r = row(browser, handle)
        return "" if r is None else str(r.find_element(By.CSS_SELECTOR, f"td.{cls}").text)
    except StaleElementReferenceException:  # the table was redrawn between the two look-ups
        return ""


def log_lines(browser: Any) -> list[str]:
    return list(browser.execute_script(
        "return Array.from(document.querySelectorAll('#log .logline')).map(d => d.textContent);"))


def test_apps_appear_fail_live_and_a_log_is_followed(browser: Any, runner: Runner) -> None:
    busy = ("import time\nkeep=[]\nfor epoch in range(10**6):\n    t=time.time()\n"
            "    while time.time()-t<0.15: x=[0]*10000\n    keep.append(bytearray(2**20) if len(keep)<40 else b'')\n"
            "    print(f'epoch {epoch} loss {1/(epoch+1):.4f}', flush=True)\n    time.sleep(0.15)")
    worker = ("import sys, time\nfor i in range(12):\n    print(f'step {i}', flush=True)\n    time.sleep(0.5)\n"
              f"print({EVIL!r}, flush=True)\nprint('loss went to nan', file=sys.stderr, flush=True)\nsys.exit(3)")
    with tsm_serve() as url:
        open_page(browser, url)
        busy_h = runner.run(AppDef("trainer", [py(busy, "trainer", replicas=2)]), "local")
        try:
            bad = runner.run(AppDef("flaky", [py(worker, "worker")]), "local")
            wait_for(lambda: row(browser, bad) and row(browser, busy_h), what="both apps listed")
            row(browser, bad).click()
            wait_for(lambda: "step 1" in log_lines(browser), what="first lines of the followed log")
            first = len(log_lines(browser))
            wait_for(lambda: len(log_lines(browser)) > first + 2, what="more lines arriving while followed")
            assert log_lines(browser)[:3] == ["step 0", "step 1", "step 2"]

            wait_for(lambda: cell(browser, bad, "state") == "FAILED", what="FAILED shown without reload")
            assert "3" in cell(browser, bad, "err")  # the reason names the exit code
            rep = browser.find_element(By.CSS_SELECTOR, '#replicas tr.replica[data-replica="worker/0"]')
            assert "FAILED" in rep.text and ("loss went to nan" in rep.text or EVIL in rep.text)  # its last line
            wait_for(lambda: EVIL in log_lines(browser), what="the HTML line, as text")
            assert not browser.find_elements(By.CSS_SELECTOR, "#log img, #log script, #log b")
            wait_for(lambda: "ended" in browser.find_element(By.ID, "log-title").text, what="log end")

            search = browser.find_element(By.ID, "log-search")
            search.send_keys("step 1")
            shown = browser.execute_script(
                "return Array.from(document.querySelectorAll('#log .logline')).filter(d => !d.hidden)"
                ".map(d => d.textContent);")
            assert shown == ["step 1", "step 10", "step 11"]
            assert browser.find_element(By.ID, "log-count").text == "3 matching lines"
            search.send_keys(Keys.CONTROL, "a")
            search.send_keys(Keys.BACKSPACE)  # typing the query away shows every line again
            assert len([d for d in log_lines(browser)]) == 14
            assert browser.find_element(By.ID, "log-count").text == "14 lines"

            # the charts of the busy app, then the screenshot the README shows
            row(browser, busy_h).click()
            wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#charts figure")) == 2
                     and all("no samples" not in browser.execute_script(
                         "return arguments[0].getAttribute('data-replica')", f) for f in
                         browser.find_elements(By.CSS_SELECTOR, "#charts figure")), what="charts")
            wait_for(lambda: len(log_lines(browser)) >= 10, what="the trainer's log followed")
            time.sleep(3)  # a few more samples and ticks so the curves fill in
            browser.execute_script("drawCharts();")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#charts canvas"), what="canvases")
            DOCS.mkdir(exist_ok=True)
            assert browser.save_screenshot(str(DOCS / "serve.png"))
            assert not_reloaded(browser)
        finally:
            runner.cancel(busy_h)


def test_cancel_from_the_page_with_confirmation(browser: Any, runner: Runner) -> None:
    handle = runner.run(AppDef("sleeper", [py("import time; time.sleep(300)", "s")]), "local")
    try:
        with tsm_serve() as url:
            open_page(browser, url)
            wait_for(lambda: cell(browser, handle, "state") == "RUNNING", what="RUNNING")
            row(browser, handle).find_element(By.CSS_SELECTOR, "button.cancel").click()
            alert = wait_for(lambda: _alert(browser), what="confirmation dialog")
            assert "sleeper" in alert.text
            alert.dismiss()  # say no: nothing happens
            time.sleep(1)
            assert runner.status(handle).state == AppState.RUNNING
            row(browser, handle).find_element(By.CSS_SELECTOR, "button.cancel").click()
            wait_for(lambda: _alert(browser), what="confirmation dialog").accept()
            wait_for(lambda: cell(browser, handle, "state") == "CANCELLED", what="CANCELLED on the page")
            assert runner.status(handle).state == AppState.CANCELLED
            assert not row(browser, handle).find_elements(By.CSS_SELECTOR, "button.cancel")
            assert not_reloaded(browser)
    finally:
        runner.cancel(handle)


def _alert(browser: Any) -> Any:
    try:
        alert = browser.switch_to.alert
        _ = alert.text
        return alert
    except NoAlertPresentException:
        return None


def test_token_refused_without_and_accepted_with(browser: Any) -> None:
    with tsm_serve("--token", "t0ken-xyz") as url:
        browser.delete_all_cookies()
        browser.get(base(url))
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "token is required" in body and not browser.find_elements(By.ID, "apps")
        browser.get(base(url) + "api/apps?token=nope")
        assert "token is required" in browser.find_element(By.TAG_NAME, "body").text
        open_page(browser, url)  # with ?token=: the page and its event stream work (cookie)
        assert browser.find_elements(By.ID, "apps")
        browser.delete_all_cookies()


def test_html_in_names_and_errors_is_shown_as_text(browser: Any) -> None:
    """A backend may report any name: the history row here holds HTML, and the page must show it verbatim."""
    name = '<img src=x onerror="window.__pwned=3">evil'
    with Store() as s:
        s.write([(
            "INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated) VALUES (?,?,?,?,?,?,?,?)",
            ("local://default/gone-1", "local", "default", "gone-1", name, int(AppState.FAILED), time.time(),
             time.time()),
        )])
    with tsm_serve() as url:
        open_page(browser, url)
        wait_for(lambda: cell(browser, "local://default/gone-1", "name") == name, what="name shown as text")
        assert not browser.find_elements(By.CSS_SELECTOR, "#apps img")
        assert not_reloaded(browser)
        assert json.loads(json.dumps(name)) == name
