"""A sweep in ``tsm serve``: its API (token, Host check, 404), and the page in headless Chromium showing the sweep
(its trials table and scatter charts, filled live as a real local sweep's trials finish) beside the list."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, Role
from tsm.sweep import run_sweep, sweep_trials, sweep_wait

from .serving import auth, base, token, tsm_serve, wait_for

EVIL = '<img src=x onerror="window.__pwned=2"><b>b</b>'

COMPONENT = '''
import sys
from tsm import AppDef, Role


def fit(lr: float = 0.1, opt: str = "sgd", sleep: float = 0.0) -> AppDef:
    code = (
        "import time\\n"
        "from tsm.tracker import AppRun\\n"
        f"time.sleep({sleep})\\n"
        f"AppRun.run_from_env().add_metadata(loss=abs({lr} - 0.01) * 100 + (1 if {opt!r} == 'sgd' else 0))\\n"
    )
    return AppDef(name="fit", roles=[Role(name="t", entrypoint=sys.executable, args=["-c", code])])
'''


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner() as r:
        yield r


@pytest.fixture
def component(tmp_path: Path) -> str:
    (tmp_path / "fit.py").write_text(COMPONENT)
    return f"{tmp_path / 'fit.py'}:fit"


def sweep_url(url: str, handle: str) -> str:
    return f"{base(url)}sweep?id={urllib.parse.quote(handle, safe='')}&token={token(url)}"


def test_sweep_api_and_page_keep_the_dashboards_guards(runner: Runner, component: str) -> None:
    httpx = pytest.importorskip("httpx")
    handle = run_sweep(runner, component, {"lr": "0.1,0.01", "opt": f"sgd,{EVIL}"}, scheduler="local", parallel=2,
                              metric="loss")
    assert sweep_wait(handle, timeout=120).state == "SUCCEEDED"
    with tsm_serve() as url:
        api = f"{base(url)}api/sweeps/{urllib.parse.quote(handle, safe='')}"
        assert httpx.get(api).status_code == 401  # no token
        assert httpx.get(api, headers={**auth(url), "Host": "evil.example"}).status_code == 421
        assert httpx.get(sweep_url(url, handle).split("&token=")[0]).status_code == 401
        r = httpx.get(api, headers=auth(url))
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["axes"] == ["lr", "opt"] and data["metrics"] == ["loss"]
        assert sorted((t["params"]["lr"], t["params"]["opt"]) for t in data["trials"]) == sorted(
            (lr, opt) for lr in ("0.1", "0.01") for opt in ("sgd", EVIL))
        assert all(t["state"] == "SUCCEEDED" and float(t["metrics"]["loss"]) >= 0 for t in data["trials"])
        unknown = httpx.get(f"{base(url)}api/sweeps/{urllib.parse.quote('sweep://default/nope-1', safe='')}",
                            headers=auth(url))
        assert unknown.status_code == 404
        page = httpx.get(sweep_url(url, handle))
        assert page.status_code == 200 and "static/app.js" in page.text  # the one page, opened on the sweep
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-frame-options"] == "DENY"


@pytest.mark.integration
@pytest.mark.browser
def test_a_sweep_beside_the_list_live_in_a_browser(browser: Any, runner: Runner, component: str) -> None:
    pytest.importorskip("selenium", reason="selenium is installed by `pip install -e .[test]`")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from .browsing import in_view, not_reloaded, route, screen, shot

    handle = run_sweep(runner, component, {"lr": "0.1,0.03,0.01", "opt": f"adam,{EVIL}"}, scheduler="local",
                              parallel=2, metric="loss", args=["--sleep", "1.5"])
    with tsm_serve() as url:
        screen(browser)
        browser.get(sweep_url(url, handle))  # the sweep's old address opens the page on it
        wait_for(lambda: browser.find_element(By.ID, "status").text.startswith("live"), what="page live")
        browser.execute_script("window.__loadedOnce = 42;")
        assert route(browser) == f"#/sweep/{handle}" and "token=" not in browser.current_url

        def rows() -> list[list[str]]:
            return list(browser.execute_script(
                "return Array.from(document.querySelectorAll('#trials tbody tr'))"
                ".map(r => Array.from(r.cells).map(c => c.textContent));"))

        wait_for(lambda: len(rows()) == 6, what="six trial rows")
        # live: the table fills in as trials finish, with no reload
        wait_for(lambda: [r[3] for r in rows()] == ["SUCCEEDED"] * 6, timeout=180, what="every trial SUCCEEDED")
        wait_for(lambda: all(r[5] for r in rows()), what="every trial's loss in the table")
        assert {r[2] for r in rows()} == {"adam", EVIL}  # the parameter shown verbatim, as text
        heads = browser.execute_script(
            "return Array.from(document.querySelectorAll('#trials thead th')).map(c => c.textContent);")
        assert heads[:6] == ["Trial", "lr", "opt", "State", "Ran", "loss"]
        assert Select(browser.find_element(By.ID, "metric")).first_selected_option.text == "loss"
        charts = browser.execute_script(
            "return Array.from(document.querySelectorAll('#scatter figure'))"
            ".map(f => [f.dataset.axis, f.querySelector('canvas').dataset.points]);")
        assert charts == [["lr", "6"], ["opt", "6"]]
        painted = browser.execute_script(
            "const c = document.querySelector('#scatter canvas');"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] === 0x15 && d[i+1] === 0x65 && d[i+2] === 0xc0) n++;"
            "return n;")
        assert painted > 20  # blue points drawn on the lr chart

        # beside it, the list: the sweep's line, open, with its six trials under it
        trials = [t.handle for t in sweep_trials(handle)]
        listed = browser.execute_script(
            "return Array.from(document.querySelectorAll('#apps tbody tr')).map(r => r.dataset.handle || r.dataset.sweep);")
        at = listed.index(handle)
        assert sorted(listed[at + 1:at + 7]) == sorted(trials)
        assert "selected" in browser.find_element(By.CSS_SELECTOR, f'#apps tr.sweep[data-sweep="{handle}"]'
                                                  ).get_attribute("class")
        assert "6 succeeded" in browser.find_element(By.CSS_SELECTOR, f'#apps tr.sweep[data-sweep="{handle}"]').text
        assert handle in [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "f-sweep")).options]
        assert in_view(browser, "#sweep-title")
        shot(browser, "serve-sweep")

        # a trial's link opens its app; the back button comes back to the sweep
        browser.find_element(By.CSS_SELECTOR, '#trials tbody tr[data-trial="0"] a').click()
        wait_for(lambda: route(browser).startswith("#/app/") and "SUCCEEDED" in
                 browser.find_element(By.ID, "detail-title").text, what="the trial's app")
        assert route(browser).split("/app/")[1] in trials
        browser.back()
        wait_for(lambda: route(browser) == f"#/sweep/{handle}" and len(rows()) == 6, what="back to the sweep")

        # the sweep filter: only its trials in the list
        plain = runner.run(AppDef("plain", [Role("p", entrypoint="true")]), "local")
        runner.wait(plain, timeout=60)
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'#apps tr.app[data-handle="{plain}"]'),
                 what="an app outside the sweep, listed")
        Select(browser.find_element(By.ID, "f-sweep")).select_by_value(handle)
        wait_for(lambda: not browser.find_elements(By.CSS_SELECTOR, f'#apps tr.app[data-handle="{plain}"]'),
                 what="only the sweep's trials")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#apps tr.app")) == 6 and "sweep=" in route(browser)
        Select(browser.find_element(By.ID, "f-sweep")).select_by_value("none")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'#apps tr.app[data-handle="{plain}"]'),
                 what="the app outside the sweep")
        assert not browser.find_elements(By.CSS_SELECTOR, "#apps tr.sweep")
        assert browser.execute_script("return window.__loadedOnce === 42 && window.__pwned === undefined;")
        assert not_reloaded(browser)
