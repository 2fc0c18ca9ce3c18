"""Sweeps on the local scheduler, end to end through the Runner and the detached controller.

The cap is checked from the controller's recorded transitions (every trial's LAUNCHING .. end, in order),
never by timing; "exactly once" is checked from the marker file each trial appends to.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tsm import get_runner
from tsm.sweep import controller, run_sweep, sweep_cancel, sweep_status, sweep_trials, sweep_wait
from tsm.sweep.api import SweepStatus, sweep_metric
from tsm.sweep.results import read_metrics, rows, sort_rows
from tsm.sweep.state import (
    LAUNCHING,
    MalformedSweepHandleError,
    SweepState,
    UnknownSweepError,
    max_concurrent,
    parse_sweep_handle,
    sweep_dir,
)


def _state(handle: str) -> SweepState:
    return SweepState.open(parse_sweep_handle(handle))


def _markers(markers: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().splitlines()) for p in markers.iterdir()}


def _until(what: str, check: object, limit: float = 60.0) -> None:
    """Poll ``check()`` (a test's observation, not an assertion on time) until true."""
    deadline = time.monotonic() + limit
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never saw: {what}"
        time.sleep(0.05)


def test_grid_of_12_never_runs_more_than_3_and_sorts_by_the_recorded_loss(train_component: tuple[str, Path]) -> None:
    comp, markers = train_component
    with get_runner() as runner:
        handle = run_sweep(runner, comp, {"lr": "0.1,0.03,0.01", "batch": "16,32,64,128"}, scheduler="local",
                                  parallel=3, args=["--markers", str(markers), "--sleep", "0.2"], metric="loss")
        assert handle.startswith("sweep://default/train-")
        status: SweepStatus = sweep_wait(handle, timeout=240)
        assert status.state == "SUCCEEDED", status.summary()
        assert status.counts == {"SUCCEEDED": 12}
        trials = sweep_trials(handle)
        # each trial is an ordinary app: its own handle, status through the runner
        for t in trials:
            st = runner.status(t.handle)
            assert st is not None and st.state.name == "SUCCEEDED"
    state = _state(handle)
    events = state.events()
    state.close()
    assert max_concurrent(events) == 3  # the cap held, and was used
    assert sum(1 for e in events if e[2] == LAUNCHING) == 12
    assert sorted(_markers(markers).values()) == [1] * 12
    table = sort_rows(rows(trials, read_metrics([t.handle for t in trials if t.handle])), sweep_metric(handle))
    losses = [r.metrics["loss"] for r in table]
    assert losses == sorted(losses)  # type: ignore[type-var]
    assert table[0].params == {"lr": "0.01", "batch": "128"}
    assert table[-1].params == {"lr": "0.1", "batch": "16"}
    assert sort_rows(table, "-loss")[0].params == {"lr": "0.1", "batch": "16"}


def test_killed_controller_resumes_and_runs_every_trial_exactly_once(train_component: tuple[str, Path]) -> None:
    comp, markers = train_component
    with get_runner() as runner:
        handle = run_sweep(runner, comp, {"lr": "0.1,0.01", "batch": "16,32,64,128"}, scheduler="local", parallel=2,
                                  args=["--markers", str(markers), "--sleep", "0.5"])
    state = _state(handle)
    _until("a trial ended while others wait", lambda: state.counts().get("SUCCEEDED", 0) >= 1
           and state.counts().get("PENDING", 0) >= 2)
    pid = state.meta()["controller_pid"]
    assert os.getsid(pid) == pid != os.getsid(0)  # its own session: closing the terminal does not reach it
    # Kill it between submissions: stopped, with no trial half-submitted (a local app whose submitter dies
    # inside schedule() never gets its supervisor; see the LAUNCHING test below for the intent record).
    while True:
        os.kill(pid, signal.SIGSTOP)
        if not state.counts().get(LAUNCHING):
            break
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    _until("the controller gone", lambda: not controller.alive(state.dir))
    assert state.meta()["state"] == "RUNNING"  # killed mid-sweep
    with get_runner() as runner:
        status = sweep_wait(handle, timeout=240)  # restarts the controller
    assert status.state == "SUCCEEDED", status.summary()
    assert state.meta()["controller_pid"] != pid
    state.close()
    assert sorted(_markers(markers).values()) == [1] * 8


def test_a_trial_left_launching_is_adopted_if_submitted_and_launched_once_if_not(train_component: tuple[str, Path]) -> None:
    """The intent record: a controller killed between LAUNCHING and the handle never causes a second submit."""
    from tsm.sweep.api import plan_sweep

    comp, markers = train_component
    args = ["--markers", str(markers)]
    with get_runner() as runner:
        plan = plan_sweep(runner, comp, {"lr": "0.1,0.01"}, scheduler="local", args=args)
        handle = parse_sweep_handle("sweep://default/train-deadbeef")
        names = [f"{handle.sweep_id}-{i}" for i in range(2)]
        state = SweepState(sweep_dir(handle), create=True)
        state.init({"handle": str(handle), "session": "default", "component": comp, "args": args, "scheduler": "local",
                    "cfg": {}, "parallel": 2, "max_failures": None, "cwd": os.getcwd(), "created": time.time(),
                    "state": "RUNNING", "total": 2, "name": "train"}, plan.trials, names)
        state.set_trial(0, LAUNCHING)
        state.set_trial(1, LAUNCHING)
        # trial 0 was submitted just before the (simulated) kill; trial 1 was not
        app = runner.component_app(comp, ["--lr", "0.1", *args])
        app.name = names[0]
        submitted = runner.run(app, "local")
        status = sweep_wait(str(handle), timeout=120)
    assert status.state == "SUCCEEDED", status.summary()
    trials = state.trials()
    state.close()
    assert trials[0].handle == submitted and trials[0].msg == "adopted on resume"
    assert _markers(markers) == {"lr0.1-b32": 1, "lr0.01-b32": 1}


def test_max_failures_stops_launching_and_fails_the_sweep(train_component: tuple[str, Path]) -> None:
    comp, markers = train_component
    with get_runner() as runner:
        handle = run_sweep(runner, comp, {"fail": "1,1,0,0,0", "batch": "32"}, scheduler="local", parallel=1,
                                  max_failures=2, args=["--markers", str(markers)])
        status = sweep_wait(handle, timeout=120)
    assert status.state == "FAILED"
    assert "max_failures=2" in status.reason
    assert status.counts == {"FAILED": 2, "SKIPPED": 3}
    assert sum(_markers(markers).values()) == 2


def test_cancel_ends_running_trials_and_launches_nothing_more(train_component: tuple[str, Path]) -> None:
    comp, markers = train_component
    with get_runner() as runner:
        handle = run_sweep(runner, comp, {"lr": "0.1,0.2,0.3,0.4,0.5"}, scheduler="local", parallel=2,
                                  args=["--markers", str(markers), "--sleep", "60"])
        state = _state(handle)
        _until("two trials running", lambda: state.counts().get("RUNNING", 0) == 2)
        status = sweep_cancel(runner, handle)
        assert status.state == "CANCELLED"
        assert status.counts == {"CANCELLED": 2, "SKIPPED": 3}
        for t in state.trials():
            if t.handle:
                st = runner.status(t.handle)
                assert st is not None and st.state.name == "CANCELLED"
        state.close()
    assert not list(markers.iterdir())  # cancelled during their sleep: none got as far as its marker


def test_handles_are_checked() -> None:
    for bad in ("sweep://", "sweep://a/B C", "local://default/x", "sweep://a/../../etc"):
        with pytest.raises(MalformedSweepHandleError):
            sweep_status(bad)
    with pytest.raises(UnknownSweepError):
        sweep_status("sweep://default/nope-00000000")


def test_state_is_private(train_component: tuple[str, Path]) -> None:
    comp, markers = train_component
    with get_runner() as runner:
        handle = run_sweep(runner, comp, {"lr": "0.1"}, scheduler="local", args=["--markers", str(markers)])
        sweep_wait(handle, timeout=60)
    d = sweep_dir(parse_sweep_handle(handle))
    assert d.stat().st_mode & 0o777 == 0o700
    for f in d.iterdir():
        assert f.stat().st_mode & 0o077 == 0, f


def test_a_component_function_is_swept_by_its_file_and_a_nested_one_is_refused(
    train_component: tuple[str, Path],
) -> None:
    from tsm.components import get_component
    from tsm.sweep.api import component_ref
    from tsm.sweep.space import InvalidSweepError

    comp, markers = train_component
    fn = get_component(comp).fn
    assert component_ref(fn) == comp
    with get_runner() as runner:
        handle = run_sweep(runner, fn, {"lr": [0.1, 0.01]}, scheduler="local", parallel=2,
                                  args=["--markers", str(markers)])
        assert sweep_wait(handle, timeout=120).state == "SUCCEEDED"
    assert sorted(_markers(markers)) == ["lr0.01-b32", "lr0.1-b32"]

    def nested(lr: float = 0.1) -> None: ...

    for bad in (nested, lambda lr: None, print):
        with pytest.raises(InvalidSweepError):
            component_ref(bad)


RACE_COMPONENT = '''
import os, sys, time
from tsm import AppDef, Role

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def fit(which: str = "pkg") -> AppDef:
    """Import ``racepkg`` (slowly) or its submodule first, as a component or a scheduler's client may."""
    if which == "pkg":
        import racepkg  # noqa: F401
    else:
        time.sleep(0.2)  # while the other trial's import of the package is under way
        import racepkg.mod  # noqa: F401
    return AppDef(name="fit", roles=[Role(name="trainer", image="", entrypoint="true")])
'''


def test_the_first_submissions_imports_are_not_raced_by_the_other_workers(tmp_path: Path) -> None:
    """Python's imports are not safe on several threads at once (CPython gh-83065): a package whose
    ``__init__`` imports its submodule, imported by one worker while another imports the submodule, fails one
    of them (a deadlock error, or a "partially initialized module" as a Docker sweep's client import did).
    The controller makes its first submission before the other workers start, so they find it imported."""
    pkg = tmp_path / "racepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import time\ntime.sleep(1.0)\nfrom racepkg.mod import VALUE\n")
    (pkg / "mod.py").write_text("import racepkg\nVALUE = 1\n")
    (tmp_path / "fit.py").write_text(RACE_COMPONENT)
    with get_runner() as runner:
        handle = run_sweep(runner, f"{tmp_path / 'fit.py'}:fit", {"which": "pkg,mod"}, scheduler="local",
                                  parallel=2)
        status = sweep_wait(handle, timeout=120)
        trials = sweep_trials(handle)
    assert status.state == "SUCCEEDED", [(t.params, t.state, t.msg) for t in trials]
