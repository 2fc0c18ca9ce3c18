"""Issue 25 on real Docker engines: preemption by a daemon restart, requeue at the time limit, stalls.

The daemon-restart test runs its **own** dockerd (the shared one of ``scripts/docker-up`` also runs the
Kubernetes test cluster's pods and other tests, so it is never restarted): its own socket, data root, exec
root and pidfile under a temporary directory, ``--iptables=false``, in a network namespace of its own
(``ip netns``), so its default ``bridge`` (which tells a client when the daemon started: see
:mod:`tsm.schedulers.docker.status`) and the app's network live there and clash with nothing on the host.
The test image is loaded into it from the shared engine (``docker save | docker load``); the scheduler
reaches it through ``DOCKER_HOST``. Everything is asserted from the recorded states and the replicas' own
output, never from timing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from integration.docker_engine import PYTHON_IMAGE, DockerEngine, unavailable
from tsm.errors import SchedulerError
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.docker]
HANG = 180.0
T = TypeVar("T")

#: prints its attempt and why the one before ended, then works (sleeps) until stopped
ATTEMPT = (
    "import os, time\n"
    "print('attempt', os.environ['TSM_ATTEMPT'], 'restarts', os.environ['TSM_RESTART_COUNT'],"
    " 'last', repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "while True: time.sleep(0.2)\n"
)


def py(code: str, max_retries: int = 0, retry_policy: RetryPolicy = RetryPolicy.APPLICATION) -> Role:
    return Role("w", image=PYTHON_IMAGE, entrypoint="python3", args=["-c", code], resource=Resource(cpu=1, memMB=256),
                max_retries=max_retries, retry_policy=retry_policy)


def until(what: str, fn: Callable[[], T | None], timeout: float = HANG) -> T:
    """Poll ``fn`` until it returns something; an engine that is restarting (an error) is asked again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = fn()
        except SchedulerError:
            got = None
        if got is not None:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def lines(s: DockerScheduler, app_id: str) -> list[str]:
    return [ln.rstrip("\n") for ln in s.log_iter(app_id, "w", 0)]


class PrivateDockerd:
    """A dockerd of the test's own (see the module docstring): ``start``, ``stop``, ``host``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tsmpd-", dir="/tmp"))  # short: containerd's socket path
        self.netns = f"tsm-pd-{os.getpid()}"
        self.host = f"unix://{self.dir}/docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def docker(self, *args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["docker", "-H", self.host, *args], capture_output=True, timeout=120, **kw)  # type: ignore[call-overload, no-any-return]

    def start(self) -> None:
        log = open(self.dir / "dockerd.log", "ab")  # noqa: SIM115 (kept open by the daemon)
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.netns}", "dockerd", "-H", self.host,
             "--data-root", str(self.dir / "data"), "--exec-root", str(self.dir / "exec"),
             "--pidfile", str(self.dir / "docker.pid"), "--iptables=false", "--ip-masq=false", "--log-level=warn"],
            stdout=log, stderr=log, start_new_session=True)
        until("the private dockerd", lambda: True if self.docker("info").returncode == 0 else None, 60)

    def stop(self) -> None:
        """Stop the daemon as a service manager would (SIGTERM): it stops every running container first."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        self.proc = None


@pytest.fixture
def private_dockerd(docker_engine: DockerEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[PrivateDockerd]:
    if os.geteuid() != 0 or not shutil.which("nsenter") or not shutil.which("ip"):
        unavailable("a private dockerd needs root, nsenter and ip")
    d = PrivateDockerd()
    subprocess.run(["ip", "netns", "add", d.netns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", d.netns, "ip", "link", "set", "lo", "up"], check=True)
        d.start()
        save = subprocess.Popen(["docker", "save", PYTHON_IMAGE], stdout=subprocess.PIPE)
        loaded = d.docker("load", stdin=save.stdout)
        save.wait()
        assert loaded.returncode == 0, loaded.stderr
        monkeypatch.setenv("DOCKER_HOST", d.host)
        yield d
    finally:
        if d.proc is None and (d.dir / "data").exists():
            d.start()  # stopped by the test: start it to remove what the test left
        if d.proc is not None:
            ids = d.docker("ps", "-aq").stdout.split()
            if ids:
                d.docker("rm", "-f", *[i.decode() for i in ids])
            d.stop()
        subprocess.run(["ip", "netns", "delete", d.netns], capture_output=True)
        for mounted in ("exec", "data"):  # dockerd bind-mounts its roots onto themselves
            subprocess.run(["umount", "-R", str(d.dir / mounted)], capture_output=True)
        shutil.rmtree(d.dir, ignore_errors=True)


def test_daemon_restart_restarts_the_app_as_a_preemption(private_dockerd: PrivateDockerd) -> None:
    s = DockerScheduler("itest-preempt")
    try:
        app = AppDef("pre", [py(ATTEMPT, max_retries=0, retry_policy=RetryPolicy.APPLICATION)])
        app_id = s.schedule(s.submit_dryrun(app, {"max_preemptions": 2}))  # type: ignore[arg-type]
        until("the first attempt's line", lambda: True if any(ln.startswith("attempt 0") for ln in lines(s, app_id))
              else None)

        private_dockerd.stop()  # the cluster's decision: the daemon goes down and stops the container
        private_dockerd.start()

        def restarted() -> str | None:
            s.describe(app_id)  # a look: the controller step that restarts the app
            return next((ln for ln in lines(s, app_id) if ln.startswith("attempt 1")), None)

        second = until("the restarted attempt's line", restarted)
        assert second == "attempt 1 restarts 1 last 'preempted'"
        d = s.describe(app_id)
        assert d is not None and d.state == AppState.RUNNING, d
        assert d.num_restarts == 1
        kept = Path(os.environ["TSM_HOME"]) / "docker" / app_id / "preemptions.json"
        assert json.loads(kept.read_text()) == [[1, ["w"]]]  # one preemption; max_retries=0 was not needed
        s.cancel(app_id)
        final = s.describe(app_id)
        assert final is not None and final.state == AppState.CANCELLED
    finally:
        s.close()


@pytest.fixture
def sched(docker_engine: DockerEngine) -> Iterator[DockerScheduler]:
    """A scheduler whose apps are all cancelled and removed (containers, network, kept files) after the
    test, whether it passed or not."""
    s = DockerScheduler("itest-longruns")
    try:
        yield s
    finally:
        try:
            s.cleanup(include_running=True, session="itest-longruns")
            for row in s.list():
                s.remove(row.app_id)
        finally:
            s.close()


def test_requeue_on_time_limit_restarts_as_a_preemption_then_fails(sched: DockerScheduler) -> None:
    app = AppDef("rq", [py(ATTEMPT, max_retries=0)])
    cfg = {"time_limit": "3s", "requeue_on_time_limit": True, "max_preemptions": 1}
    app_id = sched.schedule(sched.submit_dryrun(app, cfg))  # type: ignore[arg-type]
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "time limit 3s reached (no preemptions left: max_preemptions=1)"
    assert final.num_restarts == 1
    out = lines(sched, app_id)
    assert "attempt 1 restarts 1 last 'time_limit'" in out, out


def _containers(app_id: str) -> list[tuple[str, str]]:
    """``(attempt, state)`` of each container of the app, from Docker itself (not a look of tsm's)."""
    out = subprocess.run(["docker", "ps", "-a", "--filter", f"label=tsm.app-id={app_id}", "--format",
                          '{{.Label "tsm.attempt"}} {{.State}}'], capture_output=True, text=True, timeout=60)  # fmt: skip
    return sorted(tuple(ln.split()) for ln in out.stdout.splitlines() if ln.strip())  # type: ignore[misc]


@pytest.mark.parametrize("case", ["time_limit", "retry"])
def test_what_a_look_decides_happens_though_nobody_looks(sched: DockerScheduler, case: str) -> None:
    """Submitted and never described, waited for or listed by the test: the home's keeper looks (issue 25).
    Before it, a detached app's time limit never stopped it and a failed replica was never retried."""
    if case == "time_limit":
        app, cfg = AppDef("kt", [py(ATTEMPT)]), {"time_limit": "3s", "grace_period": 1}
        want = [("0", "exited")]  # stopped at its limit
    else:
        app, cfg = AppDef("kr", [py("raise SystemExit(3)", max_retries=1)]), {}
        want = [("1", "exited")]  # the failure retried once (attempt 0's container replaced by attempt 1's)
    app_id = sched.schedule(sched.submit_dryrun(app, cfg))  # type: ignore[arg-type]
    until(f"the containers {want}", lambda: True if _containers(app_id) == want else None)
    final = sched.describe(app_id)
    assert final is not None and final.state == AppState.FAILED, final
    if case == "time_limit":
        assert final.msg.startswith("time limit 3s reached"), final.msg
    else:
        assert final.num_restarts == 1, final


STALLS = (
    "import os, time\n"
    "print('attempt', os.environ['TSM_ATTEMPT'], 'last', repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "print('working', flush=True)\n"
    "time.sleep(3600)\n"  # silent and idle: a stall
)


def test_stall_restarts_the_replica_as_its_failure(sched: DockerScheduler) -> None:
    app = AppDef("st", [py(STALLS, max_retries=1, retry_policy=RetryPolicy.APPLICATION)])
    app_id = sched.schedule(sched.submit_dryrun(app, {"stall_timeout": "2s", "grace_period": 1}))  # type: ignore[arg-type]
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    # the first stall spent max_retries=1 (a failure, not a preemption); the second one failed the app
    assert final.msg == "role 'w' replica 0 stalled for 2s, last line: 'working'", final.msg
    assert final.num_restarts == 1
    out = lines(sched, app_id)
    assert "attempt 1 last 'stalled'" in out, out


def test_stall_fails_the_app_with_on_stall_fail(sched: DockerScheduler) -> None:
    app = AppDef("sf", [py(STALLS, max_retries=3, retry_policy=RetryPolicy.APPLICATION)])
    cfg = {"stall_timeout": "2s", "on_stall": "fail", "grace_period": 1}
    app_id = sched.schedule(sched.submit_dryrun(app, cfg))  # type: ignore[arg-type]
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "role 'w' replica 0 stalled for 2s, last line: 'working'"
    assert final.num_restarts == 0  # never retried, max_retries=3 notwithstanding


#: prints "warned" on USR1 and stays silent and idle
WARNED_STALL = (
    "import signal, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
    "print('working', flush=True)\n"
    "while True: time.sleep(3600)\n"
)


def test_a_stalled_replica_is_warned_before_it_is_stopped(sched: DockerScheduler) -> None:
    app = AppDef("sw", [py(WARNED_STALL)])
    cfg = {"stall_timeout": "2s", "on_stall": "fail", "warn_signal": "USR1", "warn_before": "1s", "grace_period": 1}
    app_id = sched.schedule(sched.submit_dryrun(app, cfg))  # type: ignore[arg-type]
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "role 'w' replica 0 stalled for 2s, last line: 'working'"
    until("the stopped replica", lambda: True if all(
        c.state == "exited" for c in sched.client.list_containers(app_id)) else None)
    assert lines(sched, app_id) == ["working", "warned"]  # warned once, then stopped


def test_a_stalled_replica_role_is_restarted_in_place_within_max_retries(sched: DockerScheduler) -> None:
    app = AppDef("sr", [py(STALLS, max_retries=1, retry_policy=RetryPolicy.REPLICA)])
    app_id = sched.schedule(sched.submit_dryrun(app, {"stall_timeout": "2s", "grace_period": 1}))  # type: ignore[arg-type]
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "role 'w' replica 0 stalled for 2s, last line: 'working'"
    # one restart in place (a new container, told it follows a stall), then the stall failed it
    assert lines(sched, app_id) == ["attempt 0 last ''", "working", "attempt 1 last 'stalled'", "working"]


def test_a_status_look_returns_before_the_stop_it_decides(sched: DockerScheduler, tmp_path: Path) -> None:
    """``tsm status`` in its own process finds the stall and exits; the replica, warned, is still running
    then (the look did not wait warn_before for it) and is stopped afterwards by the helper the look
    started: no survivor, no status blocked for warn_before + grace."""
    app = AppDef("sl", [py(WARNED_STALL)])
    cfg = {"stall_timeout": "2s", "on_stall": "fail", "warn_signal": "USR1", "warn_before": "20s", "grace_period": 1}
    app_id = sched.schedule(sched.submit_dryrun(app, cfg))  # type: ignore[arg-type]
    look = ("import sys, time\nfrom tsm.schedulers.docker.scheduler import DockerScheduler\n"
            "s = DockerScheduler('itest-longruns')\n"
            "while (d := s.describe(sys.argv[1])) is None or not d.state.is_terminal: time.sleep(0.2)\n"
            "print(d.state, d.msg, flush=True)\n")
    done = subprocess.run([sys.executable, "-c", look, app_id], capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "FAILED role 'w' replica 0 stalled for 2s, last line: 'working'", done.stdout
    after_exit = [c.state for c in sched.client.list_containers(app_id)]
    assert after_exit == ["running"]  # the status process has exited; the stop is still to come
    until("the stopped replica", lambda: True if all(
        c.state == "exited" for c in sched.client.list_containers(app_id)) else None)
    assert lines(sched, app_id) == ["working", "warned"]  # warned once, then stopped by the helper


def test_a_daemon_restart_past_max_preemptions_fails_the_app(private_dockerd: PrivateDockerd) -> None:
    s = DockerScheduler("itest-preempt")
    try:
        app = AppDef("pre0", [py(ATTEMPT, max_retries=3, retry_policy=RetryPolicy.APPLICATION)])
        app_id = s.schedule(s.submit_dryrun(app, {"max_preemptions": 0}))  # type: ignore[arg-type]
        until("the first attempt's line", lambda: True if any(ln.startswith("attempt 0") for ln in lines(s, app_id))
              else None)
        private_dockerd.stop()
        private_dockerd.start()
        final = until("the app's end", lambda: d if (d := s.describe(app_id)) is not None and d.state.is_terminal
                      else None)
        assert final.state == AppState.FAILED, final
        assert final.msg.startswith("role 'w' replica 0 was preempted: the Docker daemon restarted"), final.msg
        assert final.msg.endswith("(no preemptions left: max_preemptions=0)"), final.msg
        replica = final.roles_statuses[0].replicas[0]
        assert replica.preempted and replica.error_msg.startswith("preempted: ")
        assert final.num_restarts == 0  # max_retries=3 was not spent on the cluster's decision
    finally:
        s.close()
