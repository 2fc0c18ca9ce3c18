"""``tsm top`` folds a sweep's trials under one line that expands: a real local sweep, read back through the
snapshot (the link is the sweep's own state), shown by the text view and by the Textual app (headless pilot)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, Role
from tsm.views.snapshot import SnapshotCollector
from tsm.views.text import FOLDED, TRIAL_INDENT, fold_rows, render_text

pytest.importorskip("textual", reason="the views extra (textual) is installed by `pip install -e .[test]`")

from textual.widgets import DataTable  # noqa: E402

from tsm.views.top import TopApp  # noqa: E402

COMPONENT = '''
from tsm import AppDef, Role


def tiny(lr: float = 0.1) -> AppDef:
    return AppDef(name="tiny", roles=[Role(name="t", entrypoint="true")])
'''


@pytest.fixture
def sweep(tmp_path: Path) -> Iterator[tuple[Runner, str, list[str]]]:
    """A finished 3-trial local sweep and one plain app: ``(runner, sweep handle, trial handles)``."""
    (tmp_path / "tiny.py").write_text(COMPONENT)
    with get_runner() as runner:
        handle = runner.run_sweep(f"{tmp_path / 'tiny.py'}:tiny", {"lr": "0.1,0.01,0.001"}, scheduler="local",
                                  parallel=3)
        status = runner.sweep_wait(handle, timeout=120)
        assert status.state == "SUCCEEDED", status.summary()
        trials = [t.handle for t in runner.sweep_list(handle)]
        plain = runner.run(AppDef("plain", [Role("p", entrypoint="true")]), "local")
        runner.wait(plain, timeout=60)
        yield runner, handle, trials


def test_snapshot_links_trials_to_their_sweep_and_text_folds_them(sweep: tuple[Runner, str, list[str]]) -> None:
    _, handle, trials = sweep
    snap = SnapshotCollector().refresh()
    assert [g.handle for g in snap.sweeps] == [handle]
    assert sorted(snap.sweeps[0].trials) == sorted(trials)
    assert snap.calls.get("sweeps") == 1
    assert {t: snap.sweeps[0].params[t]["lr"] for t in trials} == dict(zip(trials, ["0.1", "0.01", "0.001"],
                                                                            strict=True))

    folded = render_text(snap, replicas=False)
    lines = folded.splitlines()[1:]
    assert len(lines) == 2  # the sweep's one line, and the plain app
    assert any(line.startswith(FOLDED + "tiny (sweep: 3 trials: 3 succeeded)") for line in lines)
    assert not any(t in folded for t in trials)

    expanded = render_text(snap, replicas=False, expanded={handle})
    assert all(t in expanded for t in trials)
    assert sum(line.startswith(TRIAL_INDENT + "tiny-") for line in expanded.splitlines()) == 3
    # a filter matching one trial keeps the sweep line and, expanded, only that trial
    one = trials[0].rpartition("/")[2]
    rows = fold_rows(snap, one, {handle})
    assert [r.key for r in rows] == [handle, trials[0]]


def test_top_folds_a_sweep_and_expands_it_with_a_key(sweep: tuple[Runner, str, list[str]]) -> None:
    _, handle, trials = sweep
    top = TopApp(interval=0.2)

    def keys() -> list[str]:
        table = top.query_one("#apps", DataTable)
        return [str(k.value) for k in table.rows]

    async def until(pilot: Any, cond: Any, what: str) -> None:
        deadline = time.monotonic() + 60
        while not cond():
            assert time.monotonic() < deadline, f"{what} not seen"
            await pilot.pause(0.1)

    async def script(pilot: Any) -> None:
        await until(pilot, lambda: handle in keys() and len(keys()) == 2, "the folded sweep line")
        table = top.query_one("#apps", DataTable)
        table.move_cursor(row=keys().index(handle))
        assert top.snapshot is not None
        top.show(top.snapshot)  # a refresh landing before the move's highlight event: the move must stay
        await until(pilot, lambda: top.selected == handle, "the sweep selected")
        await pilot.press("e")
        await until(pilot, lambda: len(keys()) == 5, "the sweep expanded")
        at = keys().index(handle)
        assert sorted(keys()[at + 1:at + 4]) == sorted(trials)  # its trials right under its line
        await pilot.press("e")
        await until(pilot, lambda: len(keys()) == 2, "the sweep folded again")
        await pilot.press("q")

    async def main() -> None:
        async with top.run_test(size=(170, 48)) as pilot:
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 180))


def test_a_sweep_without_trials_yet_is_a_line_at_the_top() -> None:
    from tsm.schedulers.common.viewmodel import AppSummary
    from tsm.views.snapshot import Snapshot
    from tsm.views.sweeps import SweepGroup

    plain = AppSummary("local://s/a-1", "local", "a-1", "a", "RUNNING", created=1.0)
    starting = SweepGroup("sweep://s/new-1", "new", "PENDING", "2 trials: 2 pending", created=2.0)
    ended = SweepGroup("sweep://s/old-1", "old", "SUCCEEDED", "1 trials: 1 succeeded", created=0.5,
                       trials=["local://s/gone"])
    snap = Snapshot(3.0, [plain], sweeps=[starting, ended])
    assert [r.key for r in fold_rows(snap)] == [starting.handle, plain.handle]  # an ended sweep with no app: none
    assert [r.key for r in fold_rows(snap, "state:RUNNING")] == [plain.handle]
    assert render_text(snap, replicas=False).splitlines()[1].startswith(FOLDED + "new (sweep: 2 trials: 2 pending)")
