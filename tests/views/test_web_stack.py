"""The dashboard's Stack tab and ``GET /api/apps/{id}/stack``: a real ``tsm serve``, real local apps, py-spy, and
headless Chromium for the tab itself.

Rank 1 of the app blocks in a function named for the test; the tab must show it in the group that differs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, Role

from .serving import auth, base, tsm_serve, wait_for

pytest.importorskip("starlette", reason="the web extra is installed by `pip install -e .[test]`")

PROGRAM = """
import os, sys, time
def rank_one_is_stuck_here():
    while True:
        time.sleep(3600)
def everyone_else_waits_here():
    while True:
        time.sleep(3600)
open(sys.argv[1] + "." + os.environ["TSM_REPLICA_ID"], "w").close()
rank_one_is_stuck_here() if os.environ["TSM_REPLICA_ID"] == "1" else everyone_else_waits_here()
"""


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner() as r:
        yield r


@pytest.fixture
def stuck(runner: Runner, tmp_path: Path) -> Iterator[str]:
    """Three replicas of PROGRAM, running; cancelled afterwards."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    started = tmp_path / "started"
    handle = runner.run(AppDef("stuck", [Role("trainer", image=str(tmp_path), entrypoint=sys.executable,
                                              args=["prog.py", str(started)], num_replicas=3)]), "local")
    try:
        deadline = time.monotonic() + 120  # a hang guard only
        while not all(Path(f"{started}.{k}").exists() for k in range(3)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield handle
    finally:
        runner.cancel(handle)


def stack_url(url: str, handle: str, query: str = "") -> str:
    return base(url) + "api/apps/" + quote(handle, safe="") + "/stack" + query


def test_the_stack_endpoint_answers_the_page_only_and_groups_the_ranks(stuck: str, runner: Runner) -> None:
    with tsm_serve() as url:
        wait_for(lambda: httpx.get(base(url) + "api/apps/" + quote(stuck, safe=""), headers=auth(url)).status_code == 200,
                 what="the app in the snapshot")
        # attack: another page (or a plain link) that has the token but cannot send the header is refused
        r = httpx.get(stack_url(url, stuck), headers=auth(url), timeout=120)
        assert r.status_code == 403 and "X-TSM" in r.json()["error"]
        r = httpx.get(stack_url(url, stuck), headers={"X-TSM": "1"}, timeout=120)
        assert r.status_code == 401  # and without the token, nothing
        r = httpx.get(stack_url(url, stuck, "?role=trainer"), headers={**auth(url), "X-TSM": "1"}, timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        assert [g["replicas"] for g in body["groups"]] == [["trainer/0", "trainer/2"], ["trainer/1"]]
        assert [g["outlier"] for g in body["groups"]] == [False, True]
        assert "rank_one_is_stuck_here" in body["text"].split("== trainer/1")[1]
        assert "rank_one_is_stuck_here" not in body["text"].split("== trainer/1")[0]
        for bad in ("?role=../x", "?k=1", "?role=trainer&k=x"):
            assert httpx.get(stack_url(url, stuck, bad), headers={**auth(url), "X-TSM": "1"}).status_code == 400
        assert httpx.get(stack_url(url, stuck, "?role=nosuch"), headers={**auth(url), "X-TSM": "1"},
                         timeout=120).status_code == 400
        runner.cancel(stuck)
        r = httpx.get(stack_url(url, stuck), headers={**auth(url), "X-TSM": "1"}, timeout=120)
        assert r.status_code == 409 and "has ended" in r.json()["error"]


@pytest.mark.integration
@pytest.mark.browser
def test_the_stack_tab_shows_the_rank_that_differs(browser: Any, stuck: str) -> None:
    pytest.importorskip("selenium", reason="selenium is installed by `pip install -e .[test]`")
    from selenium.webdriver.common.by import By

    from .browsing import open_page, route

    def text(css: str) -> str:
        return str(browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';", css))

    def shown(css: str) -> bool:
        return bool(browser.execute_script(
            "const e = document.querySelector(arguments[0]); return !!e && e.getClientRects().length > 0;", css))

    with tsm_serve() as url:
        open_page(browser, url)
        link = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'#apps tr.app[data-handle="{stuck}"] a.open'),
                        what="the app listed")
        link[0].click()
        wait_for(lambda: route(browser).startswith(f"#/app/{stuck}"), what="the app's page")
        assert shown("#tab-stack") and shown("#log") and not shown("#stack")
        browser.find_element(By.ID, "tab-stack").click()
        wait_for(lambda: "groups" in text("#stack-title"), what="the stacks taken", timeout=120)
        assert shown("#stack") and not shown("#log")
        dump = text("#stack")
        odd = dump.split("== trainer/1 (1 replica)  <-- differs")
        assert len(odd) == 2, dump
        assert "rank_one_is_stuck_here" in odd[1] and "rank_one_is_stuck_here" not in odd[0]
        assert "everyone_else_waits_here" in odd[0]
        browser.find_element(By.ID, "tab-log").click()
        assert shown("#log") and not shown("#stack")
