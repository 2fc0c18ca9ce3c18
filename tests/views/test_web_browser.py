"""``tsm serve`` in a real browser: headless Chromium driven by Selenium, against real local apps.

Each test drives one state of the page (an app running, one failing, many apps filtered, the cancel
confirmation, a phone's screen, no apps, the server gone) and the screenshots docs/views.md shows are taken
here (:func:`.browsing.shot`; into docs/ with `make screenshots`). The page is opened once per test and not reloaded unless the test says so
(:func:`.browsing.not_reloaded`): what it saw change came over the event streams.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, AppState, Resource, Role
from tsm.store import Store

from .browsing import PHONE, in_view, not_reloaded, open_page, route, screen, shot
from .serving import base, token, tsm_serve, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.browser]
pytest.importorskip("selenium", reason="selenium is installed by `pip install -e .[test]`")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"><b>bold</b>'
BUSY = ("import time\nkeep=[]\nfor epoch in range(10**6):\n    t=time.time()\n"
        "    while time.time()-t<0.15: x=[0]*10000\n    keep.append(bytearray(2**20) if len(keep)<40 else b'')\n"
        "    print(f'epoch {epoch} loss {1/(epoch+1):.4f}', flush=True)\n    time.sleep(0.15)")


def py(code: str, name: str = "r", replicas: int = 1) -> Role:
    return Role(name, image=".", entrypoint=sys.executable, args=["-u", "-c", code], num_replicas=replicas,
                resource=Resource(cpu=1, gpu=0, memMB=256))


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def row(browser: Any, handle: str) -> Any:
    rows = browser.find_elements(By.CSS_SELECTOR, f'#apps tr.app[data-handle="{handle}"]')
    return rows[0] if rows else None


def cell(browser: Any, handle: str, css: str) -> str:
    """The text of ``css`` in the list row of ``handle`` ("" while it is not shown)."""
    try:
        r = row(browser, handle)
        return "" if r is None else str(r.find_element(By.CSS_SELECTOR, css).get_attribute("textContent"))
    except StaleElementReferenceException:  # the table was redrawn between the two look-ups
        return ""


def text(browser: Any, css: str) -> str:
    got = browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.textContent : '';", css)
    return str(got)


def shown(browser: Any, css: str) -> bool:
    return bool(browser.execute_script(
        "const e = document.querySelector(arguments[0]); return !!e && e.getClientRects().length > 0;", css))


def log_lines(browser: Any, only_shown: bool = False) -> list[str]:
    return list(browser.execute_script(
        "return Array.from(document.querySelectorAll('#log .logline')).filter(d => !arguments[0] || !d.hidden)"
        ".map(d => d.textContent);", only_shown))


def list_handles(browser: Any) -> list[str]:
    return list(browser.execute_script(
        "return Array.from(document.querySelectorAll('#apps tbody tr')).map(r => r.dataset.handle || r.dataset.sweep);"))


def open_app(browser: Any, handle: str) -> None:
    row(browser, handle).find_element(By.CSS_SELECTOR, "a.open").click()
    wait_for(lambda: route(browser).startswith(f"#/app/{handle}"), what=f"the route of {handle}")


def chart_points(browser: Any) -> dict[str, int]:
    return dict(browser.execute_script(
        "return Object.fromEntries(Array.from(document.querySelectorAll('#charts figure'))"
        ".map(f => [f.dataset.metric, Number(f.dataset.points)]));"))


def test_a_failed_app_says_why_at_its_top_and_a_running_one_charts_and_follows(browser: Any, runner: Runner) -> None:
    worker = ("import sys, time\nfor i in range(12):\n    print(f'step {i}', flush=True)\n    time.sleep(0.5)\n"
              f"print({EVIL!r}, flush=True)\nprint('loss went to nan', file=sys.stderr, flush=True)\nsys.exit(3)")
    with tsm_serve() as url:
        open_page(browser, url)
        assert "token=" not in browser.current_url  # the address is shareable: the page keeps the token in a cookie
        busy = runner.run(AppDef("trainer", [py(BUSY, "trainer", replicas=2)]), "local")
        try:
            bad = runner.run(AppDef("flaky", [py(worker, "worker")]), "local")
            wait_for(lambda: row(browser, bad) and row(browser, busy), what="both apps listed")
            open_app(browser, bad)
            wait_for(lambda: "step 1" in log_lines(browser), what="first lines of the followed log")
            first = len(log_lines(browser))
            wait_for(lambda: len(log_lines(browser)) > first + 2, what="more lines arriving while followed")
            assert log_lines(browser)[:3] == ["step 0", "step 1", "step 2"]

            # it fails: the list, the title and the box at the top of the app say so, with the last lines
            wait_for(lambda: cell(browser, bad, "td.state") == "FAILED", what="FAILED shown without reload")
            assert "3" in cell(browser, bad, ".err")  # the reason names the exit code
            wait_for(lambda: shown(browser, "#failure") and "loss went to nan" in text(browser, "#failure-lines"),
                     what="the failure box with the replica's last lines")
            assert "FAILED" in text(browser, "#detail-title")
            assert "3" in text(browser, "#failure-reason") and "worker/0" in text(browser, "#failure-replica")
            assert EVIL in text(browser, "#failure-lines")  # the HTML line, as text
            assert browser.execute_script(  # above the replicas, and seen without scrolling
                "return document.querySelector('#failure').getBoundingClientRect().bottom <="
                " document.querySelector('#replicas').getBoundingClientRect().top;")
            assert in_view(browser, "#failure")
            wait_for(lambda: EVIL in log_lines(browser), what="the HTML line in the log, as text")
            assert not browser.find_elements(By.CSS_SELECTOR, "#log img, #log script, #log b, #failure img")
            wait_for(lambda: "ended" in text(browser, "#log-title"), what="log end")
            shot(browser, "serve-failed")

            search = browser.find_element(By.ID, "log-search")
            search.send_keys("step 1")
            assert log_lines(browser, only_shown=True) == ["step 1", "step 10", "step 11"]
            assert text(browser, "#log-count") == "3 matching lines"
            search.send_keys(Keys.CONTROL, "a")
            search.send_keys(Keys.BACKSPACE)  # typing the query away shows every line again
            assert len(log_lines(browser, only_shown=True)) == 14 and text(browser, "#log-count") == "14 lines"

            # the running app: each replica's CPU and memory over time, its log followed live
            open_app(browser, busy)
            assert not shown(browser, "#failure")
            wait_for(lambda: (p := chart_points(browser)).get("cpu", 0) >= 6 and p.get("mem", 0) >= 6,
                     what="CPU and memory charted for both replicas")
            assert "gpu" not in chart_points(browser)  # no GPU measured: no GPU chart
            wait_for(lambda: len(log_lines(browser)) >= 10, what="the trainer's log followed")
            assert log_lines(browser)[0] == "epoch 0 loss 1.0000" and "following trainer/0" in text(browser, "#log-title")
            follow = len(log_lines(browser))
            wait_for(lambda: len(log_lines(browser)) > follow + 3, what="the log growing live")
            assert browser.execute_script(  # following: the pane stays scrolled to its end
                "const l = document.querySelector('#log'); return l.scrollTop + l.clientHeight >= l.scrollHeight - 30;")
            shot(browser, "serve")

            # a replica has its own address: its log, its row picked; the back button returns
            browser.find_element(By.CSS_SELECTOR, '#replicas tr[data-replica="trainer/1"] a').click()
            wait_for(lambda: route(browser) == f"#/app/{busy}/trainer/1", what="the replica's route")
            wait_for(lambda: "following trainer/1" in text(browser, "#log-title"), what="trainer/1 followed")
            wait_for(lambda: log_lines(browser)[:1] == ["epoch 0 loss 1.0000"], what="trainer/1's log")
            assert "selected" in browser.find_element(
                By.CSS_SELECTOR, '#replicas tr[data-replica="trainer/1"]').get_attribute("class")
            browser.back()
            wait_for(lambda: route(browser) == f"#/app/{busy}", what="back to the app")
            wait_for(lambda: "following trainer/0" in text(browser, "#log-title"), what="trainer/0 again")
            browser.back()
            wait_for(lambda: route(browser) == f"#/app/{bad}" and shown(browser, "#failure"), what="back to flaky")
            assert not_reloaded(browser)
        finally:
            runner.cancel(busy)


def test_cancel_asks_in_the_page_then_cancels(browser: Any, runner: Runner) -> None:
    handle = runner.run(AppDef("sleeper", [py("import time; time.sleep(300)", "s")]), "local")
    try:
        with tsm_serve() as url:
            open_page(browser, url)
            wait_for(lambda: cell(browser, handle, "td.state") == "RUNNING", what="RUNNING")
            open_app(browser, handle)
            browser.find_element(By.ID, "cancel").click()
            wait_for(lambda: shown(browser, "#confirm"), what="the confirmation")
            assert "sleeper" in text(browser, "#confirm-text") and handle in text(browser, "#confirm-text")
            shot(browser, "serve-cancel")
            browser.find_element(By.ID, "confirm-no").click()  # say no: nothing happens
            assert not shown(browser, "#confirm")
            browser.find_element(By.TAG_NAME, "body").send_keys("c")  # the key asks again; Escape says no
            wait_for(lambda: shown(browser, "#confirm"), what="the confirmation from the key")
            browser.switch_to.active_element.send_keys(Keys.ESCAPE)
            wait_for(lambda: not shown(browser, "#confirm"), what="Escape closes it")
            time.sleep(1)
            assert runner.status(handle).state == AppState.RUNNING
            browser.find_element(By.TAG_NAME, "body").send_keys("c")
            wait_for(lambda: shown(browser, "#confirm"), what="the confirmation")
            browser.find_element(By.ID, "confirm-yes").click()
            wait_for(lambda: cell(browser, handle, "td.state") == "CANCELLED", what="CANCELLED on the page")
            assert runner.status(handle).state == AppState.CANCELLED
            wait_for(lambda: not shown(browser, "#cancel"), what="no Cancel button once it ended")
            assert not_reloaded(browser)
    finally:
        runner.cancel(handle)


def test_token_refused_without_and_accepted_with(browser: Any) -> None:
    with tsm_serve("--token", "t0ken-xyz") as url:
        browser.delete_all_cookies()
        browser.get(base(url))
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "token is required" in body and not browser.find_elements(By.ID, "apps")
        browser.get(base(url) + "api/apps?token=nope")
        assert "token is required" in browser.find_element(By.TAG_NAME, "body").text
        open_page(browser, url)  # with ?token=: the page and its event stream work (cookie)
        assert browser.find_elements(By.ID, "apps") and "t0ken" not in browser.current_url
        browser.refresh()  # the address without the token still opens: the cookie carries it
        wait_for(lambda: text(browser, "#status").startswith("live"), what="live again after a reload")
        browser.delete_all_cookies()


def test_html_in_names_is_shown_as_text(browser: Any) -> None:
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
        wait_for(lambda: cell(browser, "local://default/gone-1", "a.open") == name, what="name shown as text")
        open_app(browser, "local://default/gone-1")
        wait_for(lambda: name in text(browser, "#detail-title"), what="the title, as text")
        assert browser.execute_script("return document.title").startswith(name)
        assert not browser.find_elements(By.CSS_SELECTOR, "#apps img, #detail img")
        assert not_reloaded(browser)


def _many_history_rows(n: int) -> list[str]:
    """``n`` ended apps in the history (as a long-used home has; every 7th failed); handles newest first."""
    now = time.time()
    rows = [(f"local://default/old-{i}", "local", "default", f"old-{i}", f"job-{i:03d}",
             int(AppState.SUCCEEDED if i % 7 else AppState.FAILED), now - 3600 + i, now - 3600 + i) for i in range(n)]
    with Store() as s:
        s.write([("INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated) "
                  "VALUES (?,?,?,?,?,?,?,?)", r) for r in rows])
    return [r[0] for r in reversed(rows)]


def test_with_132_apps_the_detail_of_a_clicked_app_is_in_view(browser: Any) -> None:
    handles = _many_history_rows(132)
    with tsm_serve() as url:
        open_page(browser, url)
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#apps tr.app")) >= 132, what="132 rows")
        for handle in (handles[0], handles[5], handles[-1]):  # the top of the list, near it, its very end
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", row(browser, handle))
            row(browser, handle).click()
            wait_for(lambda h=handle: h.rpartition("-")[2] in browser.find_element(By.ID, "detail-title").text,
                     what=f"the detail of {handle}")
            assert in_view(browser, "#detail-title"), f"the detail of {handle} is out of view"
            assert in_view(browser, f'#apps tr.app[data-handle="{handle}"]')  # and the row clicked stays in view
        assert not_reloaded(browser)


def test_filters_keys_and_a_shared_address(browser: Any) -> None:
    handles = _many_history_rows(132)
    failed = [h for h in handles if int(h.rpartition("-")[2]) % 7 == 0]
    with tsm_serve() as url:
        open_page(browser, url)
        wait_for(lambda: len(list_handles(browser)) == 132, what="132 rows")
        Select(browser.find_element(By.ID, "f-state")).select_by_value("FAILED")
        wait_for(lambda: list_handles(browser) == failed, what="only the failed apps")
        assert "state=FAILED" in route(browser)
        assert Select(browser.find_element(By.ID, "f-scheduler")).options[1].get_attribute("value") == "local"

        # keys: j / k walk the list (each app's address), / filters, Escape goes back to the list
        body = browser.find_element(By.TAG_NAME, "body")
        body.send_keys("j")
        wait_for(lambda: route(browser).startswith(f"#/app/{failed[0]}?"), what="j opens the first app")
        wait_for(lambda: "Why it failed" in text(browser, "#failure"), what="its failure box")
        shot(browser, "serve-filter")
        body.send_keys("/")
        assert browser.switch_to.active_element.get_attribute("id") == "filter"
        browser.switch_to.active_element.send_keys("job-1", Keys.ENTER)
        first = [h for h in failed if int(h.rpartition("-")[2]) >= 100]  # named job-1NN
        wait_for(lambda: list_handles(browser) == first, what="the words filter too")
        assert first[0] == failed[0]  # still the one shown
        body.send_keys("j")
        wait_for(lambda: route(browser).startswith(f"#/app/{first[1]}?"), what="j opens the next")
        body.send_keys("k")
        wait_for(lambda: route(browser).startswith(f"#/app/{first[0]}?"), what="k the one before")
        assert "FAILED" in text(browser, "#detail-title") and in_view(browser, "#detail-title")
        assert "q=job-1" in route(browser) and "state=FAILED" in route(browser)
        body.send_keys(Keys.ESCAPE)
        wait_for(lambda: route(browser).startswith("#/?"), what="Escape: back to the list")
        assert not shown(browser, "#detail")
        assert not_reloaded(browser)

        # the address of an app, with its filters, opens the same view in another window
        shared = f"{base(url)}#/app/{quote(failed[1], safe='')}?state=FAILED"
        browser.get(shared)
        wait_for(lambda: "job-119" in text(browser, "#detail-title"), what="the shared app's detail")
        assert Select(browser.find_element(By.ID, "f-state")).first_selected_option.get_attribute("value") == "FAILED"
        wait_for(lambda: row(browser, failed[1]), what="its row")
        assert "selected" in row(browser, failed[1]).get_attribute("class")


def test_on_a_phone_one_pane_at_a_time(browser: Any, runner: Runner) -> None:
    code = "import sys\nprint('reading shard 7', flush=True)\nprint('OSError: disk full', file=sys.stderr)\nsys.exit(2)"
    bad = runner.run(AppDef("prep", [py(code, "prep")]), "local")
    runner.wait(bad, timeout=60)
    busy = runner.run(AppDef("trainer", [py(BUSY, "trainer")]), "local")
    try:
        with tsm_serve() as url:
            open_page(browser, url, PHONE)
            screen(browser, PHONE, mobile=True)
            wait_for(lambda: row(browser, bad) and row(browser, busy), what="both listed")
            assert not shown(browser, "#detail-pane") and shown(browser, "#list-pane")
            assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1;")
            shot(browser, "serve-phone-list")
            open_app(browser, bad)
            wait_for(lambda: shown(browser, "#failure") and "disk full" in text(browser, "#failure-lines"),
                     what="why it failed")
            assert not shown(browser, "#list-pane") and shown(browser, "#back") and in_view(browser, "#failure")
            assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1;")
            shot(browser, "serve-phone-app")
            browser.find_element(By.ID, "back").click()
            wait_for(lambda: shown(browser, "#list-pane") and not shown(browser, "#detail-pane"), what="the list again")
            assert not_reloaded(browser)
    finally:
        runner.cancel(busy)


def test_no_apps_yet_and_the_server_gone(browser: Any) -> None:
    with tsm_serve() as url:
        open_page(browser, url)
        wait_for(lambda: "No apps yet" in text(browser, "#list-empty"), what="the empty list says what to do")
        assert shown(browser, "#nothing")
        served = token(url)
    # the server stopped: the page says so, and keeps what it showed
    wait_for(lambda: "disconnected" in text(browser, "#status"), what="disconnected shown")
    assert served and not_reloaded(browser)


def test_an_ended_app_keeps_its_curves_gpu_memory_included(browser: Any) -> None:
    """Samples the server recorded while an app ran (here through the recorder itself, GPU memory included, as
    nvidia-smi reports it where there is one) are charted after it ended: a line per replica in each chart."""
    from tsm.schedulers.common.viewmodel import AppSummary, ReplicaSummary
    from tsm.views.samples import SampleRecorder
    from tsm.views.snapshot import Snapshot

    handle, now = "local://default/gpu-1", time.time()
    with Store() as s:
        s.write([("INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated) "
                  "VALUES (?,?,?,?,?,?,?,?)", (handle, "local", "default", "gpu-1", "gpu", int(AppState.SUCCEEDED),
                                               now - 120, now - 60))])
        rec = SampleRecorder(s, interval=0)
        for i in range(6):
            reps = [ReplicaSummary("w", k, "RUNNING", cpu_used=0.5 + i / 10, mem_used_mb=900.0 + 10 * i + k,
                                   gpu_mem_mb=2048.0 * i + k) for k in range(2)]
            assert rec.record(Snapshot(now - 110 + 10 * i, [AppSummary(handle, "local", "gpu-1", "gpu", "RUNNING",
                                                                        replicas=reps)])) == 2
    with tsm_serve() as url:
        open_page(browser, f"{url}#/app/{quote(handle, safe='')}")  # the token, then what to show
        wait_for(lambda: chart_points(browser) == {"cpu": 12, "mem": 12, "gpu": 12}, what="three charts of 2 x 6 points")
        assert "gpu" in text(browser, "#detail-title") and shown(browser, "#no-replicas")
        assert not_reloaded(browser)
