"""Faults around the local scheduler: dead supervisors, dead launchers, stubborn replicas, escaping daemons.

Every case is a row of the README's Reliability table (``make harden``). Times are measured with pidfds on the
real processes and recorded as figures; the only clocks in assertions are hang guards.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from testutil import HANG, assert_all_end, procs_with, py, sleep_marker, wait_all_gone, wait_until
from tsm.runner.api import get_runner
from tsm.schedulers.api import Stream
from tsm.schedulers.local import _os, spawn
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState, Role

PY = sys.executable
FAULTS = "Faults"

#: a replica that records each SIGTERM it gets and carries on, so only SIGKILL ends it
STUBBORN = """
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, lambda s, f: print("got SIGTERM", flush=True))
    print("ready", os.getpid(), flush=True)
    while True:
        time.sleep(1)
"""




def ready_pid(sched: LocalScheduler, app_id: str, role: str = "r", k: int = 0) -> int:
    """The pid a replica printed as ``ready <pid>`` (so the test knows it is past its setup)."""
    lines: list[str] = []

    def ready() -> bool:
        lines[:] = [ln for ln in sched.log_iter(app_id, role, k, streams=Stream.STDOUT) if ln.startswith("ready")]
        return bool(lines)

    wait_until(ready, "the replica to print ready", timeout=HANG)
    return int(lines[0].split()[1])


def gone(pid: int) -> bool:
    return _os.start_time(pid) is None


def app_row(sched: LocalScheduler, app_id: str) -> dict[str, object]:
    return dict(sched.store.query("SELECT * FROM local_apps WHERE app_id=?", (app_id,))[0])


# -- the supervisor dies ------------------------------------------------------------------------------
@pytest.mark.reliability(
    "supervisor killed with SIGKILL mid-run",
    expect="replicas (even SIGTERM-ignoring, with children) end ≤ 1 s; app FAILED with the reason; waiters wake",
    group=FAULTS,
)
def test_supervisor_sigkill_ends_replicas_and_fails_the_app(sched: LocalScheduler, figure) -> None:  # type: ignore[no-untyped-def]
    marker = sleep_marker()
    code = STUBBORN.replace("while True:", f"import subprocess; subprocess.Popen(['sleep', '{marker}'])\n    while True:")
    app_id = sched.submit(AppDef("orphan", [py(code, num_replicas=3)]), {"grace_period": 30.0})
    pids = [ready_pid(sched, app_id, "r", k) for k in range(3)]
    wait_until(lambda: len(set(procs_with(marker)) - set(pids)) == 3, "the replicas' children")
    pids = procs_with(marker)  # the replicas (their code names the marker) and their children
    waiter = subprocess.Popen(
        [PY, "-c", f"from tsm.schedulers.local.scheduler import LocalScheduler as L; "
                   f"print(L('w').wait({app_id!r}, timeout={HANG}).state.name)"],
        stdout=subprocess.PIPE, text=True,
    )
    wait_until(lambda: len(_os.children(os.getpid())) > 0, "the waiter")
    time.sleep(0.3)  # let the waiter connect and block
    killed = time.monotonic()
    os.kill(int(app_row(sched, app_id)["sup_pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    all_gone = wait_all_gone(pids)
    out, _ = waiter.communicate(timeout=HANG)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED
    assert "supervisor died (killed by SIGKILL)" in desc.msg
    assert all(r.state == AppState.FAILED for r in desc.roles_statuses[0].replicas)
    assert out.strip() == "FAILED"
    figure("replicas and their children ended after", all_gone - killed, "s", limit=1.0)


def test_dead_supervisor_and_watchdog_detected_by_a_reader(sched: LocalScheduler) -> None:
    """Both owner processes gone (kill -9 of the pair): the next status query records why and ends replicas."""
    app_id = sched.submit(AppDef("both", [py(STUBBORN)]), {})
    pid = ready_pid(sched, app_id)
    row = app_row(sched, app_id)
    os.kill(row["watchdog_pid"], signal.SIGKILL)  # type: ignore[call-overload]
    os.kill(row["sup_pid"], signal.SIGKILL)  # type: ignore[call-overload]
    wait_all_gone([row["sup_pid"], row["watchdog_pid"]])  # type: ignore[list-item]
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED and "supervisor died" in desc.msg
    assert desc.roles_statuses[0].replicas[0].error_msg == "supervisor died"
    wait_all_gone([pid], timeout=10)


# -- the launcher dies --------------------------------------------------------------------------------
LAUNCHER = """
    import os, signal, sys, time
    from tsm.runner.api import get_runner
    from tsm.specs import AppDef, Role
    code = "import time\\nfor i in range(20):\\n    print('line', i, flush=True); time.sleep(0.05)"
    handle = get_runner().run(AppDef("survivor", [Role("r", entrypoint=sys.executable, args=["-c", code], num_replicas=2)]))
    print(handle, flush=True)
    if sys.argv[1] == "self":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)
"""


@pytest.mark.reliability(
    "launching process killed with SIGKILL right after run()",
    expect="app unaffected (own session): runs to SUCCEEDED, every log line kept, status/logs/list from another process",
    group=FAULTS,
)
@pytest.mark.parametrize("how", ["self", "group"])
def test_launcher_killed_right_after_run(how: str, figure) -> None:  # type: ignore[no-untyped-def]
    """``self``: the launcher SIGKILLs itself; ``group``: its whole process group gets SIGHUP then SIGKILL
    (a closed terminal, a killed job step), which must not reach the app's processes."""
    launcher = subprocess.Popen([PY, "-c", textwrap.dedent(LAUNCHER), how], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    assert launcher.stdout is not None
    handle = launcher.stdout.readline().strip()
    if how == "group":
        os.killpg(launcher.pid, signal.SIGHUP)
        os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.wait(timeout=HANG) in (-signal.SIGHUP, -signal.SIGKILL)
    runner = get_runner()
    start = time.monotonic()
    status = runner.wait(handle, timeout=HANG)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    for k in (0, 1):
        assert list(runner.log_lines(handle, "r", k)) == [f"line {i}\n" for i in range(20)]
    assert handle in {a.app_handle for a in runner.list("local")}
    assert runner.describe(handle) is not None
    figure("app ran on for", time.monotonic() - start, "s")


KILLED_MID_RUN = """
    import sys
    from tsm.runner.api import get_runner
    from tsm.specs import AppDef, Role
    runner = get_runner()
    while True:
        print(runner.run(AppDef("midrun", [Role("r", entrypoint="sleep", args=[sys.argv[1]])])), flush=True)
"""


@pytest.mark.reliability(
    "launching process killed with SIGKILL at random points inside run()",
    expect="every started app is recorded and stoppable; no process outlives its record",
    group=FAULTS,
)
def test_launcher_killed_inside_run_leaves_nothing_unrecorded(tsm_home: Path, figure) -> None:  # type: ignore[no-untyped-def]
    marker = sleep_marker()
    rng = random.Random(6)
    kills = 12
    for _ in range(kills):
        launcher = subprocess.Popen([PY, "-c", textwrap.dedent(KILLED_MID_RUN), marker], stdout=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 0.6))
        launcher.kill()
        launcher.wait(timeout=HANG)
    sched = LocalScheduler("check")
    rows = sched.store.query("SELECT app_id, sup_pid, app_dir FROM local_apps")
    started = [r for r in rows if r["sup_pid"] is not None]
    # A supervisor that is not recorded yet may still be starting; it records itself within its start-up.
    for r in rows:
        if r["sup_pid"] is None:
            wait_until(lambda r=r: app_row(sched, r["app_id"])["sup_pid"] is not None or not procs_with(r["app_dir"]),
                       "an unrecorded supervisor to record itself or be absent", timeout=HANG)
    for r in sched.store.query("SELECT app_id, state FROM local_apps"):
        if not AppState(r["state"]).is_terminal:
            sched.cancel(r["app_id"])
    left = [dict(r) for r in sched.store.query("SELECT app_id, state, sup_pid, msg FROM local_apps")
            if not AppState(r["state"]).is_terminal]
    assert left == [], "cancel left apps running"
    # none failed: a supervisor whose launcher vanished while it started runs the app as usual
    failed = [dict(r) for r in sched.store.query("SELECT app_id, msg FROM local_apps WHERE state != ?",
                                                  (int(AppState.CANCELLED),))]
    assert failed == []
    assert_all_end(marker)
    sched.close()
    figure("apps recorded across kills", len(rows), "")
    figure("of which supervised", len(started), "")


DIES_BEFORE_SUPERVISOR = """
    import os, signal, sys
    from tsm.schedulers.local import spawn
    from tsm.schedulers.local.scheduler import LocalScheduler
    from tsm.specs import AppDef, Role
    # crash exactly between recording the app and starting its supervisor (connected to the launcher)
    spawn.start_supervisor = lambda store, launchers, req, conn: os.kill(os.getpid(), signal.SIGKILL)
    LocalScheduler("crash").submit(AppDef("early", [Role("r", entrypoint="touch", args=[sys.argv[1]])]), {})
"""


@pytest.mark.reliability(
    "launcher killed after recording the app, before its supervisor starts",
    expect="cancel takes effect at once; a supervisor that starts late launches nothing",
    group=FAULTS,
)
def test_launcher_dead_before_the_supervisor_started(sched: LocalScheduler, tmp_path: Path) -> None:
    ran = tmp_path / "replica-ran"
    proc = subprocess.run([PY, "-c", textwrap.dedent(DIES_BEFORE_SUPERVISOR), str(ran)], timeout=HANG)
    assert proc.returncode == -signal.SIGKILL
    (row,) = sched.store.query("SELECT * FROM local_apps")
    assert row["state"] == AppState.SUBMITTED and row["sup_pid"] is None
    sched.cancel(row["app_id"])
    desc = sched.describe(row["app_id"])
    assert desc is not None and desc.state == AppState.CANCELLED, desc
    assert "before its supervisor started" in desc.msg
    assert all(r.state == AppState.CANCELLED for r in desc.roles_statuses[0].replicas)
    # the late supervisor (its request was written before the crash) sees the cancellation and stops
    late = SimpleNamespace(app_id=row["app_id"], app_dir=row["app_dir"], queue={})
    spawn.start_supervisor(sched.store, [], late, spawn.connect())  # type: ignore[arg-type]
    assert sched.describe(row["app_id"]).state == AppState.CANCELLED  # type: ignore[union-attr]
    wait_all_gone(procs_with(row["app_dir"]))  # the supervisor and its watchdog exit right after
    assert not ran.exists()


# -- the disk fills up ----------------------------------------------------------------------------------
@pytest.fixture
def small_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_ci: bool) -> Iterator[Path]:
    """``$TSM_HOME`` on its own 8 MB tmpfs, so the test can fill that disk without touching others."""
    if os.geteuid() != 0:
        if in_ci:
            pytest.fail("needs root to mount a small tmpfs (CI runs as root)")
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)], check=True)
    monkeypatch.setenv("TSM_HOME", str(mnt / "home"))
    try:
        yield mnt
    finally:
        # free the disk and stop whatever still runs on it, so no supervisor retries on a vanished mount
        (mnt / "filler").unlink(missing_ok=True)
        with contextlib.suppress(Exception):
            s = LocalScheduler("cleanup")
            for r in s.store.query("SELECT app_id, state FROM local_apps"):
                if not AppState(r["state"]).is_terminal:
                    s.cancel(r["app_id"])
            s.close()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it (remove it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        chunk = b"\0" * (1 << 16)
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
                f.flush()
    return filler


GATED = "import os, sys, time\nprint('started', os.getpid(), flush=True)\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)"


def run_gated(sched: LocalScheduler, go: Path) -> tuple[str, int, int]:
    """Start an app whose replica ends once ``go`` exists; returns (app id, supervisor pid, replica pid)."""
    app_id = sched.submit(AppDef("gated", [Role("r", entrypoint=PY, args=["-c", GATED, str(go)])]), {})
    wait_until(lambda: any(sched.log_iter(app_id, "r", 0)), "the replica to start", timeout=HANG)
    rep = int(next(iter(sched.log_iter(app_id, "r", 0))).split()[1])
    return app_id, int(app_row(sched, app_id)["sup_pid"]), rep  # type: ignore[call-overload]


def check_recorded_late(sched: LocalScheduler, app_id: str, sup: int, figure, what: str) -> None:  # type: ignore[no-untyped-def]
    freed = time.monotonic()
    desc = sched.wait(app_id, timeout=HANG)
    recorded = time.monotonic()
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    assert desc.roles_statuses[0].replicas[0].exit_code == 0
    wait_all_gone([sup])
    figure(f"state recorded after {what}", recorded - freed, "s", limit=6.0)


@pytest.mark.reliability(
    "$TSM_HOME's disk fills up while an app runs",
    expect="the supervisor outlives it and the app's outcome is recorded once space is freed",
    group=FAULTS,
)
def test_disk_full_mid_run_loses_no_state(small_home: Path, tmp_path: Path, figure) -> None:  # type: ignore[no-untyped-def]
    sched = LocalScheduler("full")
    app_id, sup, rep = run_gated(sched, tmp_path / "go")
    filler = fill(small_home)
    (tmp_path / "go").touch()
    wait_all_gone([rep])
    time.sleep(0.5)  # the supervisor's attempts to record the end meet the full disk (or a reused WAL page)
    assert not gone(sup), "the supervisor must outlive a full disk"
    filler.unlink()
    check_recorded_late(sched, app_id, sup, figure, "space was freed")
    sched.close()


@pytest.mark.reliability(
    "the store is locked by another process when an app ends",
    expect="the supervisor keeps the outcome, notes it in supervisor.log, and records it once the lock goes",
    group=FAULTS,
)
def test_store_locked_when_the_app_ends(tmp_path: Path, tsm_home: Path, monkeypatch: pytest.MonkeyPatch, figure) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TSM_STORE_TIMEOUT", "0.3")  # the supervisor inherits it: give up on each write quickly
    sched = LocalScheduler("locked")
    app_id, sup, rep = run_gated(sched, tmp_path / "go")
    holder = sqlite3.connect(tsm_home / "tsm.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        (tmp_path / "go").touch()
        wait_all_gone([rep])
        log = tsm_home / "local" / app_id / "supervisor.log"
        wait_until(lambda: "state not recorded yet" in log.read_text(), "the supervisor to note the locked store")
        assert not gone(sup)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    check_recorded_late(sched, app_id, sup, figure, "the lock was released")
    sched.close()


@pytest.mark.reliability(
    "a half-written log-index record (a crash or full disk mid-append)",
    expect="readers skip it, the next append drops it, every line comes back once and in order",
    group=FAULTS,
)
def test_torn_index_record_is_dropped(sched: LocalScheduler, tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = f"import os, time\nprint('a', flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\nprint('b', flush=True)"
    app_id = sched.submit(AppDef("torn", [py(code)]), {})
    wait_until(lambda: list(sched.log_iter(app_id, "r", 0)) == ["a\n"], "the first line", timeout=HANG)
    index = Path(str(app_row(sched, app_id)["log_dir"])) / "r" / "0" / "index"
    with open(index, "ab") as f:
        f.write(b"\x01\xff\xfe" * 5)  # 15 bytes: part of a record, as a crash mid-append leaves it
    assert list(sched.log_iter(app_id, "r", 0)) == ["a\n"]
    go.touch()
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r", 0)) == ["a\n", "b\n"]
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == ["a\n", "b\n"]
    assert index.stat().st_size % 24 == 0


# -- stubborn replicas ------------------------------------------------------------------------------
@pytest.mark.reliability(
    "replica that ignores SIGTERM",
    expect="gets SIGTERM, then SIGKILL when the grace period (0.5 s here) ends; cancel returns once it is gone",
    group=FAULTS,
)
def test_replica_ignoring_sigterm_is_killed_after_the_grace_period(sched: LocalScheduler, figure) -> None:  # type: ignore[no-untyped-def]
    grace = 0.5
    app_id = sched.submit(AppDef("stubborn", [py(STUBBORN, num_replicas=2)]), {"grace_period": grace})
    pids = [ready_pid(sched, app_id, "r", k) for k in (0, 1)]
    start = time.monotonic()
    sched.cancel(app_id)
    returned = time.monotonic()
    assert all(gone(p) for p in pids)  # cancel returned only after they were gone
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    assert all(r.state == AppState.CANCELLED for r in desc.roles_statuses[0].replicas)
    for k in (0, 1):
        assert "got SIGTERM\n" in list(sched.log_iter(app_id, "r", k))
    sched.cancel(app_id)  # idempotent
    figure("cancel returned after", returned - start, "s", limit=grace + 0.5)


@pytest.mark.reliability(
    "replica that double-forks a daemon or calls setsid",
    expect="the escaped processes end with their app, whether it succeeds or is cancelled",
    group=FAULTS,
)
@pytest.mark.parametrize("ending", ["succeeds", "cancelled"])
def test_double_forked_daemon_and_setsid_children_end_with_the_app(  # type: ignore[no-untyped-def]
    sched: LocalScheduler, tmp_path: Path, ending: str, figure
) -> None:
    code = f"""
        import os, signal, subprocess, sys, time
        # a grandchild that escapes with setsid, and a classic double-forked daemon that ignores SIGTERM
        p = subprocess.Popen([{PY!r}, "-c", "import time; time.sleep(300)"], start_new_session=True)
        open({str(tmp_path / 'setsid')!r}, "w").write(str(p.pid))
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                open({str(tmp_path / 'daemon')!r}, "w").write(str(os.getpid()))
                time.sleep(300)
            os._exit(0)
        while not os.path.exists({str(tmp_path / 'daemon')!r}):
            time.sleep(0.01)
        print("ready", os.getpid(), flush=True)
        time.sleep({0.2 if ending == "succeeds" else 300})
    """
    app_id = sched.submit(AppDef("daemons", [py(code)]), {"grace_period": 0.2})
    ready_pid(sched, app_id)
    escaped = [int((tmp_path / name).read_text()) for name in ("setsid", "daemon")]
    assert not any(gone(p) for p in escaped)
    if ending == "cancelled":
        sched.cancel(app_id)
        desc = sched.describe(app_id)
        expected = AppState.CANCELLED
    else:
        desc = sched.wait(app_id, timeout=HANG)
        expected = AppState.SUCCEEDED
    assert desc is not None and desc.state == expected
    # the terminal state is recorded only after every escaped process was killed and reaped
    assert all(gone(p) for p in escaped)
    figure("escaped processes left running", sum(not gone(p) for p in escaped), "", limit=0)


def test_app_survives_a_caller_that_exits_and_is_cancelled_from_a_third_process(tmp_path: Path) -> None:
    launcher = textwrap.dedent("""
        from tsm.schedulers.local.scheduler import LocalScheduler
        from tsm.specs import AppDef, Role
        s = LocalScheduler("other")
        print(s.submit(AppDef("owned", [Role("r", entrypoint="sleep", args=["300"], num_replicas=2)]), {}))
    """)
    out = subprocess.run([PY, "-c", launcher], capture_output=True, text=True, timeout=HANG, check=True)
    app_id = out.stdout.strip()
    sched = LocalScheduler("test")

    def started() -> bool:  # the app is RUNNING from its first replica's start; the second may follow a moment later
        d = sched.describe(app_id)
        return d is not None and all(r.pid for r in d.roles_statuses[0].replicas)

    wait_until(started, "both replicas to start", HANG)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING
    pids = [r.pid for r in desc.roles_statuses[0].replicas]
    assert all(p and not gone(p) for p in pids)
    canceller = f"from tsm.schedulers.local.scheduler import LocalScheduler; LocalScheduler('x').cancel({app_id!r})"
    subprocess.run([PY, "-c", canceller], timeout=HANG, check=True)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    assert all(gone(p) for p in pids if p)
    sched.close()
