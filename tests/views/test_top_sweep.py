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
from tsm.views.text import APP_COLUMNS, FOLDED, TRIAL_INDENT, fold_rows, render_text, row_cells

pytest.importorskip("textual", reason="the views extra (textual) is installed by `pip install -e .[test]`")

from textual.widgets import DataTable  # noqa: E402

from tsm.sweep import run_sweep, sweep_trials, sweep_wait
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
        handle = run_sweep(runner, f"{tmp_path / 'tiny.py'}:tiny", {"lr": "0.1,0.01,0.001"}, scheduler="local",
                                  parallel=3)
        status = sweep_wait(handle, timeout=120)
        assert status.state == "SUCCEEDED", status.summary()
        trials = [t.handle for t in sweep_trials(handle)]
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
    # the sweep's line says how long it ran, and a sweep that succeeded has no "last error"
    sweep_row = next(r for r in fold_rows(snap) if r.sweep is not None)
    line = dict(zip(APP_COLUMNS, row_cells(sweep_row, snap.taken), strict=True))
    assert line["DURATION"] and line["DURATION"].endswith("s"), line
    assert line["LAST ERROR"] == "", line

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


def test_a_sweep_line_has_its_duration_and_only_a_failure_as_its_error() -> None:
    from tsm.schedulers.common.viewmodel import AppSummary
    from tsm.views.snapshot import Snapshot
    from tsm.views.sweeps import SweepGroup

    ok = [AppSummary(f"local://s/ok-{i}", "local", f"ok-{i}", "ok", "SUCCEEDED", created=100.0 + i) for i in range(4)]
    bad = [AppSummary("local://s/bad-0", "local", "bad-0", "bad", "FAILED", created=100.0, last_error="r/0: exit 3"),
           AppSummary("local://s/bad-1", "local", "bad-1", "bad", "SUCCEEDED", created=101.0)]
    run = [AppSummary("local://s/run-0", "local", "run-0", "run", "RUNNING", created=290.0)]
    groups = [
        SweepGroup("sweep://s/ok-1", "ok", "SUCCEEDED", "4 trials: 4 succeeded", created=100.0, ended=225.0,
                   reason="4 trial(s) succeeded", trials=[a.handle for a in ok]),
        SweepGroup("sweep://s/bad-1", "bad", "FAILED", "2 trials: 1 succeeded, 1 failed", created=100.0, ended=130.0,
                   reason="1 of 2 trial(s) did not succeed", trials=[a.handle for a in bad]),
        SweepGroup("sweep://s/run-1", "run", "RUNNING", "1 trials: 1 running", created=280.0,
                   trials=[a.handle for a in run]),
    ]
    snap = Snapshot(300.0, ok + bad + run, sweeps=groups)
    lines = {r.key: dict(zip(APP_COLUMNS, row_cells(r, snap.taken), strict=True)) for r in fold_rows(snap)}
    assert (lines["sweep://s/ok-1"]["DURATION"], lines["sweep://s/ok-1"]["LAST ERROR"]) == ("2m05s", "")
    assert lines["sweep://s/bad-1"]["DURATION"] == "30s"
    assert lines["sweep://s/bad-1"]["LAST ERROR"] == "1 of 2 trial(s) did not succeed: r/0: exit 3"
    assert (lines["sweep://s/run-1"]["DURATION"], lines["sweep://s/run-1"]["LAST ERROR"]) == ("20s", "")
    # tsm serve's list shows the same, from the snapshot's JSON
    as_json = {g["handle"]: (g["duration"], g["last_error"]) for g in snap.to_dict()["sweeps"]}
    assert as_json == {"sweep://s/ok-1": (125.0, ""), "sweep://s/bad-1": (30.0, lines["sweep://s/bad-1"]["LAST ERROR"]),
                       "sweep://s/run-1": (20.0, "")}
