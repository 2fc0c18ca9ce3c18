"""Native sweeps (:class:`tsm.sweep.api.SweepNative`): a scheduler that takes the whole sweep, no controller.

The scheduler here is a stand-in that records what it is asked and answers the states the test sets (the
real one, a Slurm job array, runs in ``tests/integration/test_slurm_sweep.py``); what is checked is the
sweep's side: every trial handed over at once with its own parameters, the handles recorded, no controller
started, the trials' states and times brought up to date on status/show/wait, ``max_failures`` and cancel.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from tsm import get_runner
from tsm.runner.api import Runner
from tsm.specs.api import AppState
from tsm.sweep import api, controller
from tsm.sweep.api import SweepNative, TrialState
from tsm.sweep.state import SweepState, parse_sweep_handle


class FakeNative(SweepNative):
    """Takes sweeps whole; every trial starts SUBMITTED and moves as the test says."""

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.sweeps: list[tuple[list[Any], int, str]] = []
        self.states: dict[str, TrialState] = {}
        self.cancelled: list[list[str]] = []

    def run_opts(self) -> dict[str, Any]:
        return {}  # no run options (no ``queue``)

    def accepts_sweep(self, trials: Sequence[Any]) -> bool:
        return self.accept

    def schedule_sweep(self, trials: Sequence[Any], parallel: int, name: str) -> list[str]:
        self.sweeps.append((list(trials), parallel, name))
        ids = [f"77_{i}" for i in range(len(trials))]
        self.states = {i: TrialState(AppState.PENDING) for i in ids}
        return ids

    def trial_states(self, app_ids: Sequence[str]) -> dict[str, TrialState]:
        return {i: self.states[i] for i in app_ids if i in self.states}

    def cancel_trials(self, app_ids: Sequence[str]) -> None:
        self.cancelled.append(list(app_ids))
        for i in app_ids:
            if not self.states[i].state.is_terminal:
                self.states[i] = TrialState(AppState.CANCELLED, "cancelled")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNative:
    sched = FakeNative()
    monkeypatch.setattr(Runner, "scheduler", lambda self, name: sched)

    def dryrun(self: Runner, app: Any, scheduler: str | None = None, cfg: Any = None, **kw: Any) -> Any:
        return SimpleNamespace(app=app, cfg=dict(cfg or {}), request=[list(r.args) for r in app.roles],
                               scheduler=scheduler or "local")

    monkeypatch.setattr(Runner, "dryrun", dryrun)
    started: list[object] = []
    monkeypatch.setattr(controller, "start", lambda *a, **k: started.append(a))
    sched.controller_starts = started  # type: ignore[attr-defined]
    return sched


def _state(handle: str) -> SweepState:
    return SweepState.open(parse_sweep_handle(handle))


def _run(**kw: Any) -> str:
    with get_runner("nat") as runner:
        return api.run_sweep(runner, "utils.echo", {"msg": ["a b", "it's", "$HOME"]}, scheduler="local",
                             parallel=2, **kw)


def test_a_native_scheduler_gets_every_trial_at_once_and_no_controller_starts(fake: FakeNative) -> None:
    handle = _run()
    assert fake.controller_starts == []  # type: ignore[attr-defined]
    [(trials, parallel, name)] = fake.sweeps
    assert parallel == 2 and name == parse_sweep_handle(handle).sweep_id
    assert [t.app.name for t in trials] == [f"{name}-{i}" for i in range(3)]
    assert [t.request for t in trials] == [[["a b"]], [["it's"]], [["$HOME"]]]  # each trial its own command
    state = _state(handle)
    try:
        assert state.meta()["native"] is True and state.meta()["array"] == "77"
        assert [t.handle for t in state.trials()] == [f"local://nat/77_{i}" for i in range(3)]
        assert {t.state for t in state.trials()} == {"SUBMITTED"}
    finally:
        state.close()
    assert api.resume(handle) is False  # nothing of ours to restart
    with get_runner("nat") as runner:  # the runner recorded each trial as it records an app it scheduled
        assert {r.handle for r in runner.history.recent(None)} == {f"local://nat/77_{i}" for i in range(3)}


def test_status_and_show_follow_the_scheduler_and_the_sweep_ends_with_its_trials(fake: FakeNative) -> None:
    handle = _run()
    fake.states["77_0"] = TrialState(AppState.RUNNING, started=100.0)
    st = api.sweep_status(handle)
    assert st.state == "RUNNING" and st.counts == {"RUNNING": 1, "SUBMITTED": 2}
    fake.states["77_0"] = TrialState(AppState.SUCCEEDED, started=100.0, ended=103.5)
    fake.states["77_1"] = TrialState(AppState.SUCCEEDED, started=101.0, ended=102.0)
    fake.states["77_2"] = TrialState(AppState.SUCCEEDED, started=104.0, ended=105.0)
    trials = api.sweep_trials(handle)
    assert [(t.state, t.launched, t.ended) for t in trials] == [
        ("SUCCEEDED", 100.0, 103.5), ("SUCCEEDED", 101.0, 102.0), ("SUCCEEDED", 104.0, 105.0)]
    st = api.sweep_wait(handle, timeout=5)
    assert st.state == "SUCCEEDED" and st.reason == "3 trial(s) succeeded"


def test_max_failures_cancels_the_trials_not_started(fake: FakeNative) -> None:
    handle = _run(max_failures=1)
    fake.states["77_0"] = TrialState(AppState.FAILED, "exited with code 1")
    fake.states["77_1"] = TrialState(AppState.RUNNING)
    api.sweep_status(handle)
    assert fake.cancelled == [["77_2"]]
    fake.states["77_1"] = TrialState(AppState.SUCCEEDED)
    st = api.sweep_wait(handle, timeout=5)
    assert st.state == "FAILED" and "max_failures=1" in st.reason
    assert [t.state for t in api.sweep_trials(handle)] == ["FAILED", "SUCCEEDED", "SKIPPED"]


def test_cancel_ends_every_unfinished_trial_in_one_call(fake: FakeNative) -> None:
    handle = _run()
    fake.states["77_0"] = TrialState(AppState.SUCCEEDED)
    api.sweep_status(handle)
    with get_runner("nat") as runner:
        st = api.sweep_cancel(runner, handle, timeout=5)
    assert fake.cancelled == [["77_1", "77_2"]]
    assert st.state == "CANCELLED"
    assert [t.state for t in api.sweep_trials(handle)] == ["SUCCEEDED", "CANCELLED", "CANCELLED"]


def test_trials_the_scheduler_refuses_as_one_go_through_the_controller(fake: FakeNative) -> None:
    fake.accept = False
    handle = _run()
    assert fake.sweeps == [] and len(fake.controller_starts) == 1  # type: ignore[attr-defined]
    state = _state(handle)
    try:
        assert state.meta()["native"] is False
    finally:
        state.close()
