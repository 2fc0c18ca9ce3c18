"""The local supervisor under the attacks of issue 11: retries, escaping process trees, hostile replicas.

Every case runs real processes. Clocks appear only as hang guards (a test that would hang on a regression
fails at the guard instead); measured times are figures, never assertions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from testutil import HANG, procs_with, py, sleep_marker, wait_all_gone, wait_until
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.api import Stream
from tsm.schedulers.local import _os
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState, RetryPolicy, Role

PY = sys.executable

#: seconds: a guard for cases that hung before their fix (an app stuck RUNNING forever)
GUARD = 60.0


def replica(desc, role: str, k: int):  # type: ignore[no-untyped-def]
    return next(r for rs in desc.roles_statuses if rs.role == role for r in rs.replicas if r.id == k)


def finished(sched: LocalScheduler, app_id: str, timeout: float = GUARD):  # type: ignore[no-untyped-def]
    desc = sched.wait(app_id, timeout=timeout)
    assert desc is not None and desc.state.is_terminal, f"app still not terminal after {timeout}s: {desc}"
    return desc


# -- item 1: a restarted attempt runs to its own end ----------------------------------------------------
#: Fails on attempt 0 for a/1 only; every other attempt runs for LONG seconds (far past the grace period)
#: and succeeds. Each run appends one byte to a file per replica, so the test can count attempts.
FAILS_ONCE = """
    import os, sys, time
    me = os.environ["TSM_ROLE_NAME"] + os.environ["TSM_REPLICA_ID"]
    runs = os.path.join(sys.argv[1], me)
    attempt = os.path.getsize(runs) if os.path.exists(runs) else 0
    with open(runs, "a") as f:
        f.write("x")
    print("attempt", attempt, flush=True)
    if me == "a1" and attempt == 0:
        # fail once every other replica is running (and has counted its attempt)
        while not all(os.path.exists(os.path.join(sys.argv[1], n)) for n in ("a0", "b0", "b1")):
            time.sleep(0.01)
        sys.exit(7)
    time.sleep(float(sys.argv[2]))
    print("done", attempt, flush=True)
"""


def attempts(tmp_path: Path, name: str) -> int:
    p = tmp_path / name
    return p.stat().st_size if p.exists() else 0


@pytest.mark.parametrize(
    "policy, restarted",
    [
        (RetryPolicy.REPLICA, {"a1"}),
        (RetryPolicy.ROLE, {"a0", "a1"}),
        (RetryPolicy.APPLICATION, {"a0", "a1", "b0", "b1"}),
    ],
)
def test_retried_attempt_outlives_the_grace_period(
    sched: LocalScheduler, tmp_path: Path, policy: RetryPolicy, restarted: set[str]
) -> None:
    grace, long = 0.2, 2.0  # each retried attempt runs 10 grace periods
    roles = []
    for name in ("a", "b"):
        role = py(FAILS_ONCE, name, num_replicas=2, max_retries=1, retry_policy=policy)
        role.args += [str(tmp_path), str(long)]
        roles.append(role)
    app_id = sched.submit(AppDef("retry", roles), {"grace_period": grace})
    desc = finished(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts == 1
    for name in ("a0", "a1", "b0", "b1"):
        role, k = name[0], int(name[1])
        runs = 2 if name in restarted else 1
        assert attempts(tmp_path, name) == runs, name
        assert replica(desc, role, k).restarts == runs - 1, name
        # the last attempt ran to its end, it was not killed by a deadline left from the one before
        out = list(sched.log_iter(app_id, role, k, streams=Stream.STDOUT))
        assert out[-1] == f"done {runs - 1}\n", (name, out)


# -- item 13: terminal is terminal -------------------------------------------------------------------
def test_no_launch_after_a_restart_failed_the_app(sched: LocalScheduler, tmp_path: Path) -> None:
    # a/0 fails once and removes its own program, so the group restart cannot launch it again:
    # with its retries spent the app is FAILED, and b/0 (next in the group) must not be launched.
    prog, runs = tmp_path / "prog", tmp_path / "b-runs"
    prog.write_text(f"#!/bin/sh\nwhile [ ! -s {runs} ]; do sleep 0.01; done\nrm -f {prog}\nexit 3\n")
    prog.chmod(0o755)
    code = f"open({str(runs)!r}, 'a').write('x'); import time; time.sleep(300)"
    a = Role("a", entrypoint=str(prog), max_retries=1, retry_policy=RetryPolicy.APPLICATION)
    b = py(code, "b")
    app_id = sched.submit(AppDef("t", [a, b]), {"grace_period": 0.2})
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED
    assert "a/0 cannot start" in desc.msg, desc.msg
    time.sleep(0.5)  # b/0 would have been launched right away; give it the chance to show up
    assert runs.read_text() == "x"  # launched once, never after the app failed
    b0 = replica(desc, "b", 0)
    assert b0.state.is_terminal and b0.restarts == 0


# -- item 4: processes that escape with setsid never hang an app ------------------------------------------
def escaping(marker: str, leader_sleep: str) -> Role:
    """A replica whose child and grandchild leave its session (a two-level setsid chain)."""
    script = f"setsid sh -c 'setsid sleep {marker} & sleep {marker}' & sleep {leader_sleep}"
    return Role("r", entrypoint="sh", args=["-c", script])


@pytest.mark.parametrize("ending", ["cancel", "exit"])
def test_setsid_grandchildren_end_with_their_replica(sched: LocalScheduler, ending: str) -> None:
    marker = sleep_marker()
    leader = marker if ending == "cancel" else "1"
    app_id = sched.submit(AppDef("setsid", [escaping(marker, leader)]), {"grace_period": 1.0})
    expected = 3 if ending == "cancel" else 2
    wait_until(lambda: len(procs_with(marker)) >= expected, "the escaped sleeps", timeout=HANG)
    pids = procs_with(marker)
    if ending == "cancel":
        canceller = subprocess.Popen([PY, "-c", f"from tsm.schedulers.local.scheduler import LocalScheduler as L; "
                                               f"L('x').cancel({app_id!r})"])
        try:
            assert canceller.wait(timeout=GUARD) == 0
        finally:
            canceller.kill()
    desc = finished(sched, app_id)
    assert desc.state == (AppState.CANCELLED if ending == "cancel" else AppState.SUCCEEDED), desc
    assert procs_with(marker) == [], "an escaped process outlived its app"
    wait_all_gone(pids, timeout=1.0)


def test_watchdog_ends_setsid_grandchildren_after_the_supervisor_is_killed(sched: LocalScheduler) -> None:
    marker = sleep_marker()
    app_id = sched.submit(AppDef("setsid", [escaping(marker, marker)]), {"grace_period": 1.0})
    wait_until(lambda: len(procs_with(marker)) >= 3, "the escaped sleeps", timeout=HANG)
    row = sched.store.query("SELECT sup_pid FROM local_apps WHERE app_id=?", (app_id,))[0]
    os.kill(row["sup_pid"], signal.SIGKILL)
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED and "supervisor died" in desc.msg, desc
    assert procs_with(marker) == []


# -- item 9: a replica cannot destroy its earlier output ---------------------------------------------------
def test_reopening_stdout_and_stderr_keeps_every_line(sched: LocalScheduler) -> None:
    script = "echo a; echo b > /dev/stderr; echo c > /dev/stdout; echo d >&2; echo e > /proc/self/fd/1"
    app_id = sched.submit(AppDef("reopen", [Role("r", entrypoint="sh", args=["-c", script])]), {})
    assert finished(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == ["a\n", "c\n", "e\n"]
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDERR)) == ["b\n", "d\n"]


def test_output_of_every_attempt_is_kept_when_a_retry_truncates(sched: LocalScheduler, tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import os, sys
        first = not os.path.exists({str(tmp_path / 'm')!r})
        open({str(tmp_path / 'm')!r}, "a").write("x")
        print("first" if first else "second", flush=True)
        with open("/dev/stdout", "w") as f:  # O_TRUNC through /proc
            f.write("reopened\\n")
        sys.exit(1 if first else 0)
    """)
    app_id = sched.submit(AppDef("t", [py(code, max_retries=1)]), {})
    assert finished(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == [
        "first\n", "reopened\n", "second\n", "reopened\n",
    ]


def test_output_written_by_a_replica_that_exits_at_once_is_complete(sched: LocalScheduler) -> None:
    # 4 MB in one burst: far more than a pipe holds, all of it in the file once the replica is SUCCEEDED
    code = "import sys; sys.stdout.write(''.join(f'{i:07d}\\n' for i in range(500_000)))"
    app_id = sched.submit(AppDef("burst", [py(code)]), {})
    assert finished(sched, app_id).state == AppState.SUCCEEDED
    lines = list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT))
    assert len(lines) == 500_000 and lines[-1] == "0499999\n"


# -- item 10: grace periods the supervisor can keep -------------------------------------------------------
@pytest.mark.parametrize("grace", [-1.0, 86400.5, 30 * 86400.0, float("inf"), float("nan")])
def test_grace_period_out_of_range_is_refused_at_dryrun(sched: LocalScheduler, grace: float) -> None:
    # inf and nan are refused by the option parser ("finite"), the rest by the local scheduler's range check
    with pytest.raises(InvalidRunOptionError, match="grace_period must be >= 0 and <= 86400|finite float"):
        sched.submit_dryrun(AppDef("g", [Role("r", entrypoint="true")]), {"grace_period": grace})


def test_longest_grace_period_runs(sched: LocalScheduler) -> None:
    app_id = sched.submit(AppDef("g", [Role("r", entrypoint="true")]), {"grace_period": 86400.0})
    assert finished(sched, app_id).state == AppState.SUCCEEDED


#: under bash, which ends at SIGTERM at once (the "echo" keeps bash from exec'ing python): python saves a
#: checkpoint in its SIGTERM handler (SAVE seconds) and exits, or with IGNORE ignores SIGTERM
WRAPPED = """# {marker}
import signal, sys, time
def save(s, f):
    time.sleep({save})
    print("saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if {ignore} else save)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def wrapped(marker: str, save: float, ignore: bool = False) -> Role:
    inner = WRAPPED.format(marker=marker, save=save, ignore=ignore)
    return Role("r", entrypoint="bash", args=["-c", f'{PY} -c "$0"; echo "bash went on"', inner])


def stdout(sched: LocalScheduler, app_id: str) -> list[str]:
    return [ln.rstrip("\n") for ln in sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)]


def test_a_wrapper_ending_at_sigterm_leaves_its_program_the_grace_period(sched: LocalScheduler) -> None:
    # The grace period is the program's, not its wrapper's: bash ends at SIGTERM, the python under it still
    # has its grace period to save a checkpoint (it used to get SIGKILL the moment bash ended)
    marker = sleep_marker()
    app_id = sched.submit(AppDef("wrapped", [wrapped(marker, save=1.0)]), {"grace_period": 60.0})
    wait_until(lambda: "ready" in stdout(sched, app_id), "the program's start", timeout=HANG)
    sched.cancel(app_id)
    desc = finished(sched, app_id)
    assert desc.state == AppState.CANCELLED, desc
    assert stdout(sched, app_id) == ["ready", "saved"]
    assert procs_with(marker) == []


def test_a_wrapped_program_ignoring_sigterm_is_killed_when_the_grace_period_ends(sched: LocalScheduler) -> None:
    marker = sleep_marker()
    app_id = sched.submit(AppDef("wrapped", [wrapped(marker, save=0, ignore=True)]), {"grace_period": 1.0})
    wait_until(lambda: "ready" in stdout(sched, app_id), "the program's start", timeout=HANG)
    sched.cancel(app_id)
    desc = finished(sched, app_id)
    assert desc.state == AppState.CANCELLED, desc
    assert replica(desc, "r", 0).exit_code == 128 + signal.SIGTERM  # bash's end is the replica's
    assert stdout(sched, app_id) == ["ready"]
    assert procs_with(marker) == []  # SIGKILL came at the grace period's end, before the end was recorded


#: counts the SIGTERMs the kernel delivers (one byte each on the wakeup fd, not merged by Python's handler)
COUNTER = """
import os, select, signal, sys
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(signal.SIGTERM, lambda s, f: None)
print("ready", flush=True)
while True:
    select.select([r], [], [])
    for b in os.read(r, 64):
        print("got", signal.Signals(b).name, flush=True)
"""


@pytest.mark.parametrize("wrapper", [False, True])
def test_a_stop_sends_each_process_one_sigterm(sched: LocalScheduler, wrapper: bool) -> None:
    # The group is signalled, and the processes that left it by pid: a process in the group also signalled by
    # pid got two SIGTERMs whenever it took the first before the second came (the scan of the replica's tree
    # between them leaves time), and many programs read a second SIGTERM as "stop now, skip the checkpoint"
    args = ["-c", f'{PY} -c "$0"; echo "bash went on"', COUNTER] if wrapper else ["-c", COUNTER]
    role = Role("r", entrypoint="bash" if wrapper else PY, args=args)
    for _ in range(3):  # the second SIGTERM was lost whenever it came before the first was taken: try thrice
        app_id = sched.submit(AppDef("once", [role]), {"grace_period": 1.0})
        wait_until(lambda a=app_id: "ready" in stdout(sched, a), "the program's start", timeout=HANG)
        sched.cancel(app_id)
        finished(sched, app_id)
        assert stdout(sched, app_id) == ["ready", "got SIGTERM"]


# -- item 8: callers holding more than 1024 descriptors ------------------------------------------------------
LAUNCH_WITH_MANY_FDS = """
    import os, resource, sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    assert max(held) > 1024
    from tsm.schedulers.local.scheduler import LocalScheduler
    from tsm.specs import AppDef, Role
    s = LocalScheduler("many")
    app_id = s.submit(AppDef("fds", [Role("r", entrypoint="echo", args=["hello"])]), {})
    desc = s.wait(app_id, timeout=60)
    print(desc.state.name, "".join(s.log_iter(app_id, "r", 0)).strip())
"""


def test_launch_and_wait_from_a_process_holding_1100_fds() -> None:
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1200:
        pytest.skip("the hard RLIMIT_NOFILE here is below 1200: no process can hold 1,100 descriptors")
    out = subprocess.run([PY, "-c", textwrap.dedent(LAUNCH_WITH_MANY_FDS)], capture_output=True, text=True,
                         timeout=HANG)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["SUCCEEDED", "hello"]


LAUNCH_WITH_SIGNALS_BLOCKED = """
    import signal
    from tsm.schedulers.local.scheduler import LocalScheduler
    from tsm.specs import AppDef, Role
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})  # a thread that blocked them
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR2, signal.SIGQUIT):  # nohup, `&` in a script, ...
        signal.signal(sig, signal.SIG_IGN)
    s = LocalScheduler("masked")
    app_id = s.submit(AppDef("sig", [Role("r", entrypoint="grep", args=["^Sig[BI]", "/proc/self/status"])]), {})
    s.wait(app_id, timeout=60)
    print("".join(s.log_iter(app_id, "r", 0)))
"""


def test_replicas_start_with_no_signal_blocked_or_ignored_whatever_the_caller_had() -> None:
    # A blocked mask and ignored signals pass through fork and exec: a replica started by such a caller never
    # saw tsm's SIGTERM (its grace period wasted) nor a warning, and Python gave it no KeyboardInterrupt
    out = subprocess.run([PY, "-c", textwrap.dedent(LAUNCH_WITH_SIGNALS_BLOCKED)], capture_output=True, text=True,
                         timeout=HANG)
    assert out.returncode == 0, out.stderr[-3000:]
    masks = {k: int(v, 16) for k, _, v in (line.partition(":") for line in out.stdout.splitlines() if line)}
    usable = sum(1 << (s - 1) for s in signal.valid_signals())  # not 32 and 33: glibc's own, out of any program's reach
    assert {k: v & usable for k, v in masks.items()} == {"SigBlk": 0, "SigIgn": 0}, out.stdout


# -- item 12 (second half): a reader never changes an app on evidence it could not read ---------------------
READ_WITH_A_FULL_FD_TABLE = """
    import os, resource, sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    from tsm.schedulers.local.scheduler import LocalScheduler
    s = LocalScheduler("reader")
    s.describe(sys.argv[1])  # the store is open
    held = []
    try:
        while True:
            held.append(os.dup(0))
    except OSError:
        pass
    for call in (lambda: s.describe(sys.argv[1]), s.list, lambda: s.wait(sys.argv[1], timeout=0.1)):
        try:
            call()
        except Exception as e:  # a reader may fail; it must not write
            pass
    for fd in held:
        os.close(fd)
    print("done")
"""


def test_reader_with_a_full_fd_table_leaves_a_live_app_alone(sched: LocalScheduler) -> None:
    marker = sleep_marker()
    app_id = sched.submit(AppDef("live", [Role("r", entrypoint="sleep", args=[marker])]), {"grace_period": 0.0})
    wait_until(lambda: len(procs_with(marker)) == 1, "the replica", timeout=HANG)
    out = subprocess.run([PY, "-c", textwrap.dedent(READ_WITH_A_FULL_FD_TABLE), app_id], capture_output=True,
                         text=True, timeout=HANG)
    assert out.stdout.strip() == "done", out.stderr[-3000:]
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING, desc
    assert len(procs_with(marker)) == 1, "the reader killed the replica"
    sched.cancel(app_id)


# -- cancel never waits forever -------------------------------------------------------------------------------
def test_cancel_of_a_stopped_supervisor_ends_the_app(sched: LocalScheduler) -> None:
    marker = sleep_marker()
    role = Role("r", entrypoint="sh", args=["-c", f"setsid sleep {marker} & sleep {marker}"], num_replicas=2)
    app_id = sched.submit(AppDef("stopped", [role]), {"grace_period": 0.2})
    wait_until(lambda: len(procs_with(marker)) >= 4, "the replicas", timeout=HANG)
    row = sched.store.query("SELECT sup_pid, watchdog_pid FROM local_apps WHERE app_id=?", (app_id,))[0]
    owners = [row["sup_pid"], row["watchdog_pid"]]
    pids = procs_with(marker) + owners
    os.kill(row["sup_pid"], signal.SIGSTOP)
    try:
        start = time.monotonic()
        canceller = subprocess.run([PY, "-c", "from tsm.schedulers.local.scheduler import LocalScheduler as L; "
                                              f"L('x').cancel({app_id!r})"], timeout=HANG)
        assert canceller.returncode == 0
        took = time.monotonic() - start
    finally:
        with contextlib.suppress(OSError):
            os.kill(row["sup_pid"], signal.SIGCONT)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED, desc
    assert "killed directly" in desc.msg
    wait_all_gone(pids, timeout=5.0)
    assert procs_with(marker) == [] and all(_os.start_time(p) is None for p in owners)
    assert took < HANG


def test_cancel_of_an_unknown_app_is_a_no_op(sched: LocalScheduler) -> None:
    sched.cancel("never-launched-1234")
    assert sched.describe("never-launched-1234") is None


# -- item 6: a replica exhausting the supervisor's descriptors -------------------------------------------------
#: Forks workers that each hold as many connections as they can get to the timer socket (half of them) or
#: the supervisor's own socket (the other half), until the supervisor (run under a 1024-descriptor limit)
#: has none left; waits for the test's go-ahead, then exits 0.
FLOOD = """
    import os, socket, sys, time
    timer, go = os.environ["TSM_TIMER_SOCKET"], sys.argv[1]
    sup = os.path.join(os.path.dirname(timer), "sock")
    def hold(path):
        socks = []
        for _ in range(200):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
            except OSError:
                s.close()
                break
            socks.append(s)
        return socks
    kids = []
    for i in range(16):
        pid = os.fork()
        if pid == 0:
            held = hold(timer if i % 2 else sup)  # noqa: F841 - held open until the go-ahead
            while not os.path.exists(go):
                time.sleep(0.05)
            os._exit(0)
        kids.append(pid)
    time.sleep(2.0)  # the connections are made (or refused) by now
    print("flooded", flush=True)
    for pid in kids:
        os.waitpid(pid, 0)
"""

LAUNCH_UNDER_1024 = """
    import sys
    from tsm.schedulers.local.scheduler import LocalScheduler
    from tsm.specs import AppDef, Role
    flood = Role("flood", entrypoint=sys.executable, args=["-c", sys.argv[1], sys.argv[2]])
    innocent = Role("innocent", entrypoint="sh", args=["-c", f"while [ ! -e {sys.argv[2]} ]; do sleep 0.05; done"])
    print(LocalScheduler("flood").submit(AppDef("flood", [flood, innocent]), {}))
"""


def test_replica_exhausting_the_supervisors_descriptors_does_not_kill_it(sched: LocalScheduler, tmp_path: Path) -> None:
    import resource

    go = tmp_path / "go"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    out = subprocess.run([PY, "-c", textwrap.dedent(LAUNCH_UNDER_1024), textwrap.dedent(FLOOD), str(go)],
                         capture_output=True, text=True, timeout=HANG, preexec_fn=limit, check=True)
    app_id = out.stdout.strip()
    try:
        flooded(sched, app_id, go)
    finally:
        go.touch()  # the flood ends, whatever happened
        sched.cancel(app_id)


def flooded(sched: LocalScheduler, app_id: str, go: Path) -> None:
    wait_until(lambda: "flooded\n" in list(sched.log_iter(app_id, "flood", 0)), "the flood", timeout=HANG)
    app_dir = Path(sched.store.query("SELECT app_dir FROM local_apps WHERE app_id=?", (app_id,))[0]["app_dir"])
    # clients arrive while the descriptors are gone: each is refused or served, the supervisor lives on
    held = []
    for _ in range(8):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2.0)  # the backlog may be full of the flood's connections
        held.append(s)
        with contextlib.suppress(OSError):
            s.connect(str(app_dir / "sock"))
    for _ in range(5):
        desc = sched.wait(app_id, timeout=0.2)
        assert desc is not None and desc.state == AppState.RUNNING, desc
    for s in held:
        s.close()
    go.touch()
    desc = finished(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    log = (app_dir / "supervisor.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "refused a client" in log  # the flood did exhaust the supervisor's descriptors


# -- item 7: hundreds of concurrent apps; failed launches are listed ---------------------------------------------
def test_300_concurrent_apps(sched: LocalScheduler) -> None:
    marker = sleep_marker()
    n = 300
    ids = []
    try:
        for _ in range(n):
            ids.append(sched.submit(AppDef("many", [Role("r", entrypoint="sleep", args=[marker])]),
                                    {"grace_period": 0.0, "timers": False}))
        # a replica between fork and exec does not show the marker yet: wait for all of them
        wait_until(lambda: len(procs_with(marker)) == n, f"all {n} replicas running", timeout=120)
        states = {a.app_id: a.state for a in sched.list()}
        assert all(states[i] == AppState.RUNNING for i in ids)
    finally:
        from concurrent.futures import ThreadPoolExecutor

        def cancel(chunk: list[str]) -> None:
            own = LocalScheduler("cancel")  # a store connection per thread
            for app_id in chunk:
                own.cancel(app_id)
            own.close()

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(cancel, [ids[i::4] for i in range(4)]))
    assert procs_with(marker) == []
    assert all(a.state == AppState.CANCELLED for a in sched.list())


def test_launch_failure_is_recorded_and_listed(sched: LocalScheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    from tsm.errors import SubmissionError

    monkeypatch.setattr(sys, "executable", "/bin/false")  # the supervisor's interpreter exits at once
    with pytest.raises(SubmissionError, match="failed to start"):
        sched.submit(AppDef("broken", [Role("r", entrypoint="true")]), {})
    monkeypatch.undo()
    (listed,) = sched.list()
    assert listed.state == AppState.FAILED and listed.name == "broken"
    desc = sched.describe(listed.app_id)
    assert desc is not None and desc.state == AppState.FAILED and "supervisor failed to start" in desc.msg


# -- failure reports -----------------------------------------------------------------------------------------
def test_failed_app_reports_the_replica_its_exit_and_last_stderr_lines(sched: LocalScheduler) -> None:
    import json

    code = "import sys\nfor i in range(8): print('err', i, file=sys.stderr)\nsys.exit(3)"
    app_id = sched.submit(AppDef("bad", [py(code, "bad"), Role("ok", entrypoint="sleep", args=["300"])]),
                          {"grace_period": 0.0})
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED and desc.msg.startswith("bad/0 exited with code 3")
    report = json.loads(desc.structured_error_msg)
    assert report == {"replica": "bad/0", "exit_code": 3, "signal": None, "message": "exited with code 3",
                      "stderr_tail": [f"err {i}" for i in range(3, 8)]}
    assert replica(desc, "bad", 0).error_msg == "exited with code 3"


def test_failure_report_names_the_signal(sched: LocalScheduler) -> None:
    import json

    app_id = sched.submit(AppDef("sig", [Role("r", entrypoint="sh", args=["-c", "echo dying >&2; kill -9 $$"])]), {})
    desc = finished(sched, app_id)
    report = json.loads(desc.structured_error_msg)
    assert report["replica"] == "r/0" and report["signal"] == "SIGKILL" and report["stderr_tail"] == ["dying"]
    assert sched.describe(app_id) is not None
    ok = sched.submit(AppDef("fine", [Role("r", entrypoint="true")]), {})
    assert finished(sched, ok).structured_error_msg == ""


def test_replica_retry_budget_is_the_roles_and_the_message_names_who_used_it(sched: LocalScheduler,
                                                                             tmp_path: Path) -> None:
    # r/0 fails at once and uses the role's only retry; r/1 fails later and finds the budget spent
    code = f"""
        import os, sys, time
        if os.environ["TSM_REPLICA_ID"] == "1":
            while not os.path.exists({str(tmp_path / 'retried')!r}):
                time.sleep(0.01)
            sys.exit(5)
        if os.path.exists({str(tmp_path / 'first')!r}):
            open({str(tmp_path / 'retried')!r}, "w").close()
            time.sleep(300)
        open({str(tmp_path / 'first')!r}, "w").close()
        sys.exit(4)
    """
    app_id = sched.submit(AppDef("budget", [py(code, num_replicas=2, max_retries=1,
                                                retry_policy=RetryPolicy.REPLICA)]), {"grace_period": 0.0})
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED and desc.num_restarts == 1
    assert desc.msg.startswith("r/1 exited with code 5 after 1 restart(s)"), desc.msg
    assert "the last retry by r/0" in desc.msg and "shared by its replicas" in desc.msg
    assert replica(desc, "r", 0).restarts == 1 and replica(desc, "r", 1).restarts == 0


def test_replicas_keep_the_callers_open_file_limit(tmp_path: Path) -> None:
    # the supervisor raises its own soft limit to the hard one for its pipes; a replica must not see that
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1000:
        pytest.skip(f"the hard RLIMIT_NOFILE here ({hard}) leaves no room below it for a lower soft limit")
    launcher = textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (900, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from tsm.schedulers.local.scheduler import LocalScheduler
        from tsm.specs import AppDef, Role
        s = LocalScheduler("limits")
        code = "import resource; print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
        app_id = s.submit(AppDef("limits", [Role("r", entrypoint=sys.executable, args=["-c", code])]), {})
        print(s.wait(app_id, timeout=60).state.name, "".join(s.log_iter(app_id, "r", 0)).strip())
    """)
    out = subprocess.run([PY, "-c", launcher], capture_output=True, text=True, timeout=HANG)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["SUCCEEDED", "900", str(hard)]


def test_every_replica_keeps_the_callers_open_file_limit_past_it(tmp_path: Path) -> None:
    # Below the caller's limit the supervisor lowers its own soft limit around each start so the replica
    # inherits it (and subprocess can vfork); once its descriptors pass that limit it sets the replica's
    # limit in the child instead. Both ways, every replica sees exactly the caller's limits, and the
    # supervisor keeps its own raised limit (else the later replicas' pipes could not be opened).
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2000:
        pytest.skip(f"the hard RLIMIT_NOFILE here ({hard}) leaves no room above the caller's 300")
    n = 150  # 4 descriptors each in the supervisor while they start: well past 300
    launcher = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from tsm.schedulers.local.scheduler import LocalScheduler
        from tsm.specs import AppDef, Role
        s = LocalScheduler("limits")
        role = Role("r", entrypoint="sh", args=["-c", "echo $(ulimit -Sn) $(ulimit -Hn)"], num_replicas={n})
        app_id = s.submit(AppDef("limits", [role]), {{}})
        print(s.wait(app_id, timeout=120).state.name)
        for k in range({n}):
            print("".join(s.log_iter(app_id, "r", k)).strip())
    """)
    out = subprocess.run([PY, "-c", launcher], capture_output=True, text=True, timeout=HANG * 2)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "SUCCEEDED", out.stdout[-2000:]
    assert lines[1:] == [f"300 {hard}"] * n
