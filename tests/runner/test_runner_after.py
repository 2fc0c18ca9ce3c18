"""Apps that wait for apps (:mod:`tsm.runner.after`) on the real local scheduler, through ``get_runner()``.

The dependencies are held by events (a replica blocked reading a fifo until the test writes to it), so no
test sleeps; the helper that holds the app is a real detached process, proven to outlive the process that
launched the app (killed with SIGKILL) and to read a secret at submission without storing it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testutil import everything_under, wait_until
from tsm.components.utils import sh
from tsm.errors import (
    AppStillRunningError,
    InvalidRunOptionError,
    MalformedAppHandleError,
    SubmissionError,
    UnknownAppError,
)
from tsm.runner import after as _after
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppState

HANG = 120.0  # seconds: a guard against a hang, never a performance claim


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner("after") as r:
        yield r


class Gate:
    """A local app blocked until :meth:`open` (its replica reads a fifo), then ending with ``code``."""

    def __init__(self, runner: Runner, folder: Path, code: int = 0) -> None:
        self.fifo = folder / f"gate-{os.urandom(3).hex()}"
        os.mkfifo(self.fifo)
        self.handle = runner.run(sh(f"read x < {self.fifo}; exit {code}"), "local")

    def open(self) -> None:
        with open(self.fifo, "w") as f:  # blocks until the replica has the fifo open: an event, not a sleep
            f.write("go\n")


def test_an_after_is_parsed_with_its_condition_and_refused_with_a_clear_error() -> None:
    h = "local://s/a-1"
    assert _after.parse_after(h) == _after.After(h, "ok")
    assert [_after.parse_after(f"{h}:{c}").condition for c in ("ok", "any", "fail")] == ["ok", "any", "fail"]
    with pytest.raises(InvalidRunOptionError, match="one of ok, any, fail"):
        _after.parse_after(f"{h}:bogus")
    with pytest.raises(MalformedAppHandleError):
        _after.parse_after("not a handle")
    with pytest.raises(InvalidRunOptionError, match="two conditions"):
        _after.parse_all([h, f"{h}:fail"])
    assert _after.parse_all([h, f"{h}:ok"]) == [_after.After(h)]


@pytest.mark.parametrize(("condition", "state", "met"), [
    ("ok", AppState.SUCCEEDED, True), ("ok", AppState.FAILED, False), ("ok", AppState.CANCELLED, False),
    ("any", AppState.FAILED, True), ("any", AppState.SUCCEEDED, True), ("any", AppState.CANCELLED, True),
    ("fail", AppState.FAILED, True), ("fail", AppState.CANCELLED, True), ("fail", AppState.SUCCEEDED, False),
    ("ok", AppState.RUNNING, None), ("fail", AppState.PENDING, None), ("any", AppState.UNKNOWN, None),
])
def test_each_condition_is_met_as_slurms_after_ok_any_notok(condition: str, state: AppState, met: bool | None) -> None:
    assert _after.After("local://s/a-1", condition).met_by(state) is met


def test_an_app_waits_pending_then_runs_once_its_dependency_succeeds(runner: Runner, tmp_path: Path) -> None:
    gate = Gate(runner, tmp_path)
    b = runner.run(sh("echo B ran"), "local", after=[gate.handle])
    status = runner.status(b)
    assert status is not None and status.state == AppState.PENDING
    assert status.msg == f"waiting for {gate.handle}:ok"
    assert runner.scheduler("local").describe(b.rsplit("/", 1)[1]) is None  # not submitted yet
    assert {a.app_handle: a.state for a in runner.list()}[b] == AppState.PENDING
    held = _after.find(runner.history.store, b)
    assert held is not None and stat.S_IMODE(os.stat(held.folder / _after.PAYLOAD).st_mode) == 0o600
    gate.open()
    final = runner.wait(b, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert list(runner.log_lines(b, "sh")) == ["B ran\n"]
    assert not (held.folder / _after.PAYLOAD).exists()  # nothing is left to submit
    assert not _after.alive(held.folder)


def test_a_dependency_that_fails_ends_the_waiting_app_cancelled_and_it_is_never_submitted(
    runner: Runner, tmp_path: Path
) -> None:
    gate = Gate(runner, tmp_path, code=3)
    b = runner.run(sh("echo never"), "local", after=[gate.handle])
    gate.open()
    final = runner.wait(b, timeout=HANG)
    assert final is not None and final.state == AppState.CANCELLED
    assert final.msg == (f"dependency {gate.handle} ended FAILED, and it had to succeed (--after {gate.handle}:ok)")
    assert runner.scheduler("local").describe(b.rsplit("/", 1)[1]) is None
    assert {a.app_handle: a.state for a in runner.list()}[b] == AppState.CANCELLED
    status = runner.status(b)
    assert status is not None and status.state == AppState.CANCELLED  # sticky, from the hold's record


def test_fail_and_any_run_after_a_failure_and_every_dependency_must_be_met(runner: Runner, tmp_path: Path) -> None:
    ok, bad = Gate(runner, tmp_path), Gate(runner, tmp_path, code=1)
    both = runner.run(sh("echo both"), "local", after=[ok.handle, f"{bad.handle}:fail"])
    anyway = runner.run(sh("echo anyway"), "local", after=[f"{bad.handle}:any"])
    bad.open()
    done = runner.wait(anyway, timeout=HANG)
    assert done is not None and done.state == AppState.SUCCEEDED
    st = runner.status(both)
    assert st is not None and st.state == AppState.PENDING, st  # still waits for ok
    ok.open()
    done = runner.wait(both, timeout=HANG)
    assert done is not None and done.state == AppState.SUCCEEDED
    assert list(runner.log_lines(both, "sh")) == ["both\n"]


def test_a_dependency_already_met_submits_at_once_and_one_that_never_can_be_is_refused(runner: Runner) -> None:
    a = runner.run(sh("exit 0"), "local")
    assert runner.wait(a, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    b = runner.run(sh("echo now"), "local", after=[a])
    assert _after.find(runner.history.store, b) is None  # nothing held
    assert runner.wait(b, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    before = {x.app_handle for x in runner.list()}
    with pytest.raises(SubmissionError, match=r"ended SUCCEEDED, and it had to fail .*nothing was submitted"):
        runner.run(sh("echo never"), "local", after=[f"{a}:fail"])
    with pytest.raises(UnknownAppError, match="unknown app"):
        runner.run(sh("echo never"), "local", after=["local://after/gone-1"])
    assert {x.app_handle for x in runner.list()} == before


def test_a_cancel_ends_the_wait_and_the_app_is_never_submitted_nor_removable_before(
    runner: Runner, tmp_path: Path
) -> None:
    gate = Gate(runner, tmp_path)
    b = runner.run(sh("echo never"), "local", after=[gate.handle])
    with pytest.raises(AppStillRunningError, match="PENDING"):
        runner.remove([b])
    held = _after.find(runner.history.store, b)
    assert held is not None
    runner.cancel(b)
    status = runner.status(b)
    assert status is not None and status.state == AppState.CANCELLED
    assert "cancelled while it waited" in status.msg
    wait_until(lambda: not _after.alive(held.folder), "the helper to end", HANG)
    runner.cancel(b)  # idempotent
    gate.open()
    assert runner.wait(gate.handle, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert runner.scheduler("local").describe(b.rsplit("/", 1)[1]) is None
    assert runner.remove([b]) == [b]
    assert runner.status(b) is None and not held.folder.exists()


LAUNCH = """
import os, signal, sys
from tsm.components.utils import sh
from tsm.runner.api import get_runner
code = 'import hashlib, os; print(hashlib.sha256(os.environ["TSM_AFTER_TOKEN"].encode()).hexdigest())'
r = get_runner("after")
h = r.run(sh(f"python3 -c '{code}'"), "local", cfg={"secrets": ["TSM_AFTER_TOKEN"]}, after=[sys.argv[1]])
print(h, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_helper_outlives_the_launcher_killed_with_sigkill_and_reads_the_secret_at_submission(
    runner: Runner, tmp_path: Path
) -> None:
    token = "tsm-after-canary-" + os.urandom(6).hex()
    gate = Gate(runner, tmp_path)
    proc = subprocess.run([sys.executable, "-c", LAUNCH, gate.handle], capture_output=True, text=True,
                          timeout=HANG, env={**os.environ, "TSM_AFTER_TOKEN": token})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    b = proc.stdout.strip()
    st = runner.status(b)
    assert st is not None and st.state == AppState.PENDING, st
    gate.open()
    final = runner.wait(b, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert list(runner.log_lines(b, "sh")) == [hashlib.sha256(token.encode()).hexdigest() + "\n"]
    home = Path(os.environ["TSM_HOME"])
    assert token not in everything_under(home)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TSM_CLI_SERVER": "0"}
    return subprocess.run([sys.executable, "-m", "tsm.cli.main", *args], capture_output=True, text=True,
                          timeout=HANG, env=env)


def test_the_command_line_waits_shows_the_hold_and_refuses_a_bad_after_in_one_line(
    runner: Runner, tmp_path: Path
) -> None:
    gate = Gate(runner, tmp_path)
    bad = _cli("run", "--after", f"{gate.handle}:soon", "utils.echo")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "one of ok, any, fail" in bad.stderr
    dry = _cli("dryrun", "--after", gate.handle, "utils.echo", "--msg", "hi")
    assert dry.returncode == 0 and f"# held by tsm until {gate.handle}:ok" in dry.stdout
    detached = _cli("run", "--detach", "--after", gate.handle, "utils.echo", "--msg", "later")
    b = detached.stdout.strip()
    status = _cli("status", "--json", b)
    assert json.loads(status.stdout)["state"] == "PENDING"
    attached = subprocess.Popen([sys.executable, "-m", "tsm.cli.main", "run", "--after", b, "utils.echo",
                                 "--msg", "last"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "TSM_CLI_SERVER": "0"})
    assert attached.stderr is not None
    first = [attached.stderr.readline(), attached.stderr.readline()]  # launched, then what it waits for
    assert f"waits for {b}:ok (Ctrl-C cancels it)" in first[1], first
    gate.open()
    out, err = attached.communicate(timeout=HANG)
    assert attached.returncode == 0, err
    assert "echo/0 last" in out


def test_the_views_show_a_held_app_pending_with_what_it_waits_for(runner: Runner, tmp_path: Path) -> None:
    from tsm.views.snapshot import SnapshotCollector

    gate = Gate(runner, tmp_path)
    b = runner.run(sh("echo later"), "local", after=[gate.handle])
    collector = SnapshotCollector()
    view = collector.refresh().app(b)
    assert view is not None and view.state == "PENDING" and view.last_error == f"waiting for {gate.handle}:ok"
    runner.cancel(b)
    view = collector.refresh().app(b)
    assert view is not None and view.state == "CANCELLED" and "cancelled while it waited" in view.last_error
    gate.open()
