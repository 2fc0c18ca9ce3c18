"""``tsm top`` driven by Textual's headless pilot (keys, filters, log pane, cancel of a real app), and its
plain-text fallback in a real process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, AppState, Resource, Role
from tsm.store import Store
from tsm.views.snapshot import SnapshotCollector

pytest.importorskip("textual", reason="the views extra (textual) is installed by `pip install -e .[test]`")

from textual.widgets import DataTable, Log  # noqa: E402

from tsm.views.top import ConfirmCancel, TopApp  # noqa: E402

#: Where the screenshot goes: docs/ with ``make screenshots``, else a scratch folder (as tests/views/browsing.py)
DOCS = Path(os.environ.get("SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / f"tsm-screenshots-{os.getuid()}")


def py(code: str, name: str = "r", replicas: int = 1) -> Role:
    return Role(name, image=".", entrypoint=sys.executable, args=["-u", "-c", code], num_replicas=replicas,
                resource=Resource(cpu=1, gpu=0, memMB=256))


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner() as r:
        yield r


async def until(pilot: Any, cond: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        await pilot.pause(0.1)
    raise AssertionError(f"{what} not met in {timeout}s")


def names(app: TopApp) -> list[str]:
    table = app.query_one("#apps", DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


def state_of(app: TopApp, handle: str) -> str:
    table = app.query_one("#apps", DataTable)
    try:
        return str(table.get_row(handle)[3])
    except Exception:  # noqa: BLE001 - not shown (yet)
        return ""


def log_text(app: TopApp) -> str:
    return "\n".join(app.query_one("#log", Log).lines)


def run_pilot(top: TopApp, script: Callable[[Any], Awaitable[None]], timeout: float = 240) -> None:
    async def main() -> None:
        async with top.run_test(size=(170, 48)) as pilot:
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), timeout))


def test_keys_filters_log_pane_and_cancel_of_a_real_app(runner: Runner) -> None:
    talk = ("import time\nfor i in range(10**6):\n    print(f'alpha line {i}', flush=True)\n    t=time.time()\n"
            "    while time.time()-t<0.1: pass\n    time.sleep(0.1)")
    alpha = runner.run(AppDef("alpha", [py(talk, "talker", replicas=2)]), "local")
    beta = runner.run(AppDef("beta", [py("import sys; print('beta fails'); sys.exit(4)", "w")]), "local")
    runner.wait(beta, timeout=60)
    top = TopApp(SnapshotCollector(runner=runner), runner, interval=0.2)

    async def script(pilot: Any) -> None:
        await until(pilot, lambda: sorted(names(top)) == ["alpha", "beta"], "both apps listed")
        assert state_of(top, beta) == "FAILED" and state_of(top, alpha) == "RUNNING"
        await pilot.press("f")  # RUNNING only
        await until(pilot, lambda: names(top) == ["alpha"], "state filter RUNNING")
        await pilot.press("f")  # FAILED only
        await until(pilot, lambda: names(top) == ["beta"], "state filter FAILED")
        await pilot.press("f", "f", "f")  # SUCCEEDED, CANCELLED, then all again
        await until(pilot, lambda: len(names(top)) == 2, "filter off")
        await pilot.press("slash", *"state:RUNNING", "enter")
        await until(pilot, lambda: names(top) == ["alpha"], "typed filter")
        assert top.focused is top.query_one("#apps", DataTable)  # enter went back to the table
        assert top.selected == alpha
        await until(pilot, lambda: "alpha line 2" in log_text(top), "the log pane follows talker/0")
        assert top.following == (alpha, "talker", 0)
        await pilot.press("tab")  # to the replica table, second replica, follow its log
        replicas = top.query_one("#replicas", DataTable)
        replicas.focus()
        await pilot.press("down", "l")
        await until(pilot, lambda: top.following == (alpha, "talker", 1) and "alpha line 1" in log_text(top),
                    "the log pane follows talker/1")
        await pilot.pause(1.0)  # a few ticks: sparklines and the log fill in
        DOCS.mkdir(parents=True, exist_ok=True)
        top.save_screenshot("top.svg", str(DOCS))
        top.query_one("#apps", DataTable).focus()
        await pilot.press("c")
        await until(pilot, lambda: isinstance(top.screen, ConfirmCancel), "confirmation asked")
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(top.screen, ConfirmCancel), "confirmation closed")
        await pilot.pause(0.5)
        assert runner.status(alpha).state == AppState.RUNNING  # "n" cancels nothing
        await pilot.press("slash", *(["backspace"] * 13), "enter")  # clear the filter
        await until(pilot, lambda: len(names(top)) == 2, "filter cleared")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(top.screen, ConfirmCancel), "confirmation asked")
        await pilot.press("y")
        await until(pilot, lambda: state_of(top, alpha) == "CANCELLED", "CANCELLED shown")
        assert runner.status(alpha).state == AppState.CANCELLED
        await until(pilot, lambda: "replica ended" in log_text(top), "the followed log ends")
        await pilot.press("q")

    try:
        run_pilot(top, script)
    finally:
        runner.cancel(alpha)
    assert (DOCS / "top.svg").read_text().startswith("<svg")


def test_quit_while_following_a_silent_replica_does_not_wait_for_it(runner: Runner) -> None:
    silent = runner.run(AppDef("silent", [py("import time; time.sleep(300)", "s")]), "local")
    top = TopApp(SnapshotCollector(runner=runner), runner, interval=0.2)

    async def script(pilot: Any) -> None:
        await until(pilot, lambda: top.following == (silent, "s", 0), "following the silent replica")
        await pilot.pause(0.5)
        await pilot.press("q")

    try:
        started = time.monotonic()
        run_pilot(top, script, timeout=60)  # a TimeoutError here is the bug this guards against
        assert time.monotonic() - started < 60
        assert runner.status(silent).state == AppState.RUNNING  # quitting the view leaves apps alone
    finally:
        runner.cancel(silent)


def test_markup_in_names_is_shown_as_text() -> None:
    name = "[bold red]boom[/] [link=http://x]y[/link]"
    with Store() as s:
        s.write([(
            "INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated) VALUES (?,?,?,?,?,?,?,?)",
            ("local://default/gone-1", "local", "default", "gone-1", name, int(AppState.FAILED), 1.0, 1.0),
        )])
    top = TopApp(interval=0.2)

    async def script(pilot: Any) -> None:
        await until(pilot, lambda: names(top) == [name], "the name, verbatim")
        await pilot.press("q")

    run_pilot(top, script)


def test_plain_text_when_not_a_terminal(runner: Runner) -> None:
    ok = runner.run(AppDef("quick", [py("print('all\\x1b[31m done')", "w")]), "local")
    runner.wait(ok, timeout=60)
    out = subprocess.run([sys.executable, "-m", "tsm.cli.main", "top"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["APP", "HANDLE", "SCHED", "STATE"]
    assert lines[1].split()[:4] == ["quick", ok, "local", "SUCCEEDED"]
    assert "w/0" in lines[3] and "all\\x1b[31m done" in lines[3] and "\x1b" not in out.stdout
    none = subprocess.run([sys.executable, "-m", "tsm.cli.main", "top", "--filter", "state:FAILED"],
                          capture_output=True, text=True, timeout=60)
    assert none.stdout == "no apps match 'state:FAILED'\n"
    bad = subprocess.run([sys.executable, "-m", "tsm.cli.main", "top", "--interval", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
