"""Docker's long runs (issue 25): the pure parts (a container ended by a daemon restart is a preemption, what
a stall check counts as progress, a replica stopped for a stall failed) and, on the fake engine
(``fake_docker.py``), what the scheduler does about them: preemptions counted per restart and per role, a
stalled REPLICA replica recreated in place within ``max_retries``, two processes looking at one stalled app.
The real engine's paths are in tests/integration/test_docker_long_runs.py."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from schedulers.docker.fake_docker import FakeDockerEngine, FakeImages, fake_client
from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common import container_lock, stall as common_stall
from tsm.schedulers.common.controller import Finish, Retry, decide, shapes
from tsm.schedulers.docker import scheduler as scheduler_module, stall
from tsm.schedulers.docker.request import LABEL_APP, LABEL_REPLICA, LABEL_ROLE, LABEL_ROLES
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.schedulers.docker.status import AppView, Observed, app_status, ended_by_daemon_restart, parse_time
from tsm.specs.api import AppDef, AppState, RetryPolicy, Role

PY = sys.executable
HANG = 60.0

START = "2026-11-25T16:32:22.589962254Z"  # the daemon's start, as its default bridge's Created says


def ended(code: int, finished: str = "2026-11-25T16:32:19.212050466Z", started: str = "2026-11-25T16:32:17.2Z",
          oom: bool = False) -> Observed:
    labels = {LABEL_APP: "a-1", LABEL_ROLE: "w", LABEL_REPLICA: "0", LABEL_ROLES: '[["w", 1, 0, "APPLICATION"]]'}
    return Observed(id="c1", name="a-1-w-0", state="exited", labels=labels, exit_code=code, oom_killed=oom,
                    finished_at=finished, started_at=started, final=True)


@pytest.mark.parametrize("obs, why", [
    (ended(143), "SIGTERM as the daemon stopped"),
    (ended(137), "SIGKILL after the stop timeout"),
])
def test_a_signal_exit_before_the_daemon_start_is_a_preemption(obs: Observed, why: str) -> None:
    reason = ended_by_daemon_restart(obs, parse_time(START))
    assert reason == f"the Docker daemon restarted (at 2026-11-25T16:32:22Z) and ended the container (exit code {obs.exit_code})", why


@pytest.mark.parametrize("obs, start", [
    (ended(1), START),  # the program's own failure
    (ended(0), START),
    (ended(137, oom=True), START),  # the OOM killer
    (ended(143, finished="2026-11-25T16:40:00Z"), START),  # stopped while this daemon ran (after its start)
    (ended(143, started="2026-11-25T16:33:00Z", finished="2026-11-25T16:33:01Z"), START),  # started after it
    (ended(143), None),  # a daemon without a default bridge: its start is unknown
    (ended(139), START),  # SIGSEGV: the program crashed, whatever the daemon did next
    (ended(134), START),  # SIGABRT
    (ended(130), START),  # SIGINT: not what a stopping daemon sends
    (ended(143, finished="2026-11-25T16:31:20Z"), START),  # 62 s before the daemon's start: not by it
])
def test_other_ends_are_not_preemptions(obs: Observed, start: str | None) -> None:
    assert ended_by_daemon_restart(obs, parse_time(start) if start else None) == ""


def test_a_preempted_replica_is_flagged_and_the_controller_spends_max_preemptions() -> None:
    obs = ended(143)
    obs.preempted = ended_by_daemon_restart(obs, parse_time(START))
    view = AppView("a-1", [["w", 1, 0, "APPLICATION"]], None, [obs])
    st = app_status(view)
    r = st.roles[0].replicas[0]
    assert r.preempted and r.error_msg.startswith("preempted: the Docker daemon restarted")
    assert st.msg.startswith("role 'w' replica 0 was preempted: the Docker daemon restarted")
    d = decide(st, shapes(view.roles), {"w": 0}, owned=True, preemptions=0, max_preemptions=1)
    assert isinstance(d, Retry) and d.preemption and d.last_exit == "preempted"  # max_retries=0 untouched
    spent = decide(st, shapes(view.roles), {"w": 1}, owned=True, preemptions=1, max_preemptions=1)
    assert isinstance(spent, Finish) and spent.msg.endswith("(no preemptions left: max_preemptions=1)")


def test_a_replica_stopped_for_a_stall_failed_even_when_it_exited_0() -> None:
    obs = ended(0, finished="2026-11-25T16:40:00Z")  # its SIGTERM handler exited cleanly
    obs.stalled = stall.stall_message(120, "step 41")
    st = app_status(AppView("a-1", [["w", 1, 0, "APPLICATION"]], None, [obs]))
    r = st.roles[0].replicas[0]
    assert (r.state, r.error_msg) == (AppState.FAILED, "stalled for 2m, last line: 'step 41'")
    assert st.state == AppState.FAILED and st.msg == "role 'w' replica 0 stalled for 2m, last line: 'step 41'"


def test_the_stall_helpers_are_the_common_ones() -> None:
    assert stall.tick is common_stall.tick and stall.stall_message is common_stall.stall_message
    assert stall.QUOTE_MAX is common_stall.QUOTE_MAX


def test_a_stalled_replica_fails_with_the_stall_message() -> None:
    obs = ended(143, finished="2026-11-25T16:40:00Z")
    obs.stalled = stall.stall_message(120, "step 41")
    st = app_status(AppView("a-1", [["w", 1, 0, "APPLICATION"]], None, [obs]))
    assert st.state == AppState.FAILED and st.msg == "role 'w' replica 0 stalled for 2m, last line: 'step 41'"
    assert not st.roles[0].replicas[0].preempted
    assert stall.stall_message(120, "") == "stalled for 2m, no output at all"


class Quiet:
    """A client whose container's last log line and CPU time are set by the test (no engine: a fake)."""

    def __init__(self) -> None:
        self.line = b"2026-11-25T16:00:00.000000001Z working\n"
        self.cpu = 1_000_000

    def logs(self, cid: str, out: bool, err: bool, **kw: Any) -> bytes:
        assert kw == {"timestamps": True, "tail": 1}
        return self.line

    def stats(self, cid: str) -> dict[str, Any]:
        return {"cpu_stats": {"cpu_usage": {"total_usage": self.cpu}}}


def test_a_stall_needs_a_quiet_log_and_idle_cpu_for_the_timeout() -> None:
    client, state = Quiet(), stall.StallState()
    running = [Observed(id="c1", name="n", state="running", labels={})]
    timeout = 10.0

    def at(now: float) -> list[str]:
        return [why for _, why in stall.check(client, state, running, timeout, 1000 + now)]  # type: ignore[arg-type]

    assert at(0) == [] and at(0.5) == []  # within a tick: not checked again
    assert at(1) == []  # the log did not move: the CPU is read (its quiet period starts here)
    client.cpu += 25_000  # what docker-init's reaping uses: idle
    assert at(2) == [] and at(10) == []
    assert at(11) == ["stalled for 10s, last line: 'working'"]
    # progress of either kind restarts the clock
    state = stall.StallState()
    assert at(0) == [] and at(1) == []
    client.cpu += stall.CPU_MOVED_NS
    assert at(2) == [] and at(11) == [] and at(12) == ["stalled for 10s, last line: 'working'"]
    state = stall.StallState()
    assert at(0) == [] and at(1) == []
    client.line = b"2026-11-25T16:00:05Z step 2\n"
    assert at(2) == [] and at(3) == [] and at(12) == [] and at(13) == ["stalled for 10s, last line: 'step 2'"]


def test_the_tick_is_a_tenth_of_the_timeout_within_bounds() -> None:
    assert (stall.tick(1), stall.tick(60), stall.tick(3600)) == (0.2, 6.0, 30.0)


# -- on the fake engine --------------------------------------------------------------------------------------
@pytest.fixture
def engine() -> Iterator[FakeDockerEngine]:
    e = FakeDockerEngine()
    yield e
    for c in list(e.by_id.values()):
        if c.current is not None:
            c.current.signal(9)


def sched_on(engine: FakeDockerEngine) -> DockerScheduler:
    return DockerScheduler("t", client=fake_client(engine), images=FakeImages())


def role(name: str, code: str, **kw: object) -> Role:
    return Role(name, image="fake/python", entrypoint=PY, args=["-c", code], **kw)  # type: ignore[arg-type]


def until(what: str, fn: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + HANG
    while (got := fn()) is None or got is False:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def running(engine: FakeDockerEngine, role_name: str) -> str:
    """The id of ``role_name``'s running container (waited for)."""
    return str(until(f"a running {role_name}", lambda: next(
        (c.id for c in engine.by_id.values() if c.labels.get(LABEL_ROLE) == role_name and c.state == "running"), None)))


#: prints its attempt and why the one before ended, then works until stopped
WORK = "import os, time\nprint('attempt', os.environ['TSM_ATTEMPT'], os.environ['TSM_LAST_EXIT'], flush=True)\n" \
       "while True: time.sleep(0.05)\n"


def test_preemptions_of_two_roles_into_the_same_try_are_two(engine: FakeDockerEngine, tsm_home: Path) -> None:
    """Role a then role b are preempted (each into its try 1), then a again: with max_preemptions=2 the third
    is one too many. Counting try numbers alone saw {1} after two preemptions and restarted a third time."""
    s = sched_on(engine)
    roles = [role(n, WORK, max_retries=0, retry_policy=RetryPolicy.ROLE) for n in ("a", "b")]
    app_id = s.schedule(s.submit_dryrun(AppDef("pre", roles), {"max_preemptions": 2}))  # type: ignore[arg-type]

    def preempt(name: str) -> DescribeAppResponse:
        engine.daemon_restart([running(engine, name)])
        return until("the look after the preemption", lambda: d if (d := s.describe(app_id)) is not None and (
            d.state.is_terminal or d.msg.startswith(f"retrying after role '{name}'")) else None)

    first, second = preempt("a"), preempt("b")
    assert first.msg.startswith("retrying after role 'a' replica 0 was preempted: the Docker daemon restarted"), first
    assert second.msg.startswith("retrying after role 'b' replica 0 was preempted"), second
    kept = json.loads((tsm_home / "docker" / app_id / "preemptions.json").read_text())
    assert kept == [[1, ["a"]], [1, ["b"]]]
    third = preempt("a")
    assert third.state == AppState.FAILED, third
    assert third.msg.endswith("(no preemptions left: max_preemptions=2)"), third.msg


#: works until the file ``<argv[1]>-<its attempt>`` exists, then fails (exit 1)
FAIL_ON_CUE = "import os, sys, time\ncue = f\"{sys.argv[1]}-{os.environ['TSM_ATTEMPT']}\"\n" \
              "while not os.path.exists(cue): time.sleep(0.05)\nsys.exit(1)\n"


def test_one_roles_preemptions_do_not_enlarge_another_roles_max_retries(engine: FakeDockerEngine,
                                                                         tmp_path: Path) -> None:
    """Role a is preempted twice; role b (max_retries=1) then fails twice: its second failure ends the app.
    Taking a's preemptions off b's tries gave b a second retry."""
    s = sched_on(engine)
    cue = str(tmp_path / "b")
    roles = [role("a", WORK, max_retries=1, retry_policy=RetryPolicy.ROLE),
             Role("b", image="fake/python", entrypoint=PY, args=["-c", FAIL_ON_CUE, cue], max_retries=1,
                  retry_policy=RetryPolicy.ROLE)]
    app_id = s.schedule(s.submit_dryrun(AppDef("rp", roles), {"max_preemptions": 5}))  # type: ignore[arg-type]

    def look_after(what: str, prefix: str) -> DescribeAppResponse:
        return until(what, lambda: d if (d := s.describe(app_id)) is not None and (
            d.state.is_terminal or d.msg.startswith(prefix)) else None)

    for n in (1, 2):
        engine.daemon_restart([running(engine, "a")])
        until(f"a's try {n}", lambda n=n: any(c.labels.get("tsm.attempt") == str(n) and c.labels.get(LABEL_ROLE) == "a"
                                               for c in engine.by_id.values()) or s.describe(app_id) is None)
    running(engine, "b")
    Path(f"{cue}-0").touch()
    first = look_after("b's retry", "retrying after role 'b'")
    assert first.state == AppState.RUNNING, first  # max_retries=1: one retry
    until("b's try 1", lambda: s.describe(app_id) is not None and any(
        c.labels.get("tsm.attempt") == "1" and c.labels.get(LABEL_ROLE) == "b" and c.state == "running"
        for c in engine.by_id.values()))
    Path(f"{cue}-1").touch()
    final = look_after("the app's end", "no such message")
    assert final.state == AppState.FAILED, final
    assert final.msg == "role 'b' replica 0 exited with code 1", final.msg


def test_a_preemption_recorded_twice_counts_once(engine: FakeDockerEngine) -> None:
    """Two processes deciding the same preemption restart record it once; another role's is another."""
    s = sched_on(engine)
    d = s.app_dir("app-1")
    for _ in range(2):
        s._record_preemption(d, 1, ["b", "a"])
    s._record_preemption(d, 1, ["c"])
    assert s._preemptions(d) == [(1, ("a", "b")), (1, ("c",))]


#: prints its attempt, restart count and last exit, then stays silent and idle (a stall)
STALLS = "import os, time\nprint('attempt', os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'], " \
         "repr(os.environ['TSM_LAST_EXIT']), flush=True)\nprint('idle', flush=True)\ntime.sleep(3600)\n"


def test_a_stalled_replica_role_is_recreated_with_last_exit_stalled(engine: FakeDockerEngine) -> None:
    s = sched_on(engine)
    app = AppDef("sr", [role("w", STALLS, max_retries=1, retry_policy=RetryPolicy.REPLICA)])
    app_id = s.schedule(s.submit_dryrun(app, {"stall_timeout": "1s", "grace_period": 1}))  # type: ignore[arg-type]
    final = s.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "role 'w' replica 0 stalled for 1s, last line: 'idle'", final.msg
    out = "".join(s.log_iter(app_id, "w", 0)).splitlines()
    assert out == ["attempt 0 0 ''", "idle", "attempt 1 1 'stalled'", "idle"], out  # a new attempt, told it follows a stall
    assert len([c for c in engine.calls if c[0] == "create_container"]) == 2  # max_retries=1: one restart


#: exits 1 on its first run (Docker's restart policy restarts it), then stalls
CRASH_THEN_STALL = "import os, sys, time\nmark = sys.argv[1]\nif not os.path.exists(mark):\n" \
                   "    open(mark, 'w').close(); print('crash', flush=True); sys.exit(1)\n" \
                   "print('up', flush=True)\ntime.sleep(3600)\n"


def test_docker_restarts_and_stall_restarts_share_max_retries(engine: FakeDockerEngine, tmp_path: Path) -> None:
    """A replica Docker restarted once after a crash has spent max_retries=1: its stall fails it (counting
    the stall restarts apart from Docker's gave it a second restart)."""
    s = sched_on(engine)
    r = Role("w", image="fake/python", entrypoint=PY, args=["-c", CRASH_THEN_STALL, str(tmp_path / "crashed")],
             max_retries=1, retry_policy=RetryPolicy.REPLICA)
    app_id = s.schedule(s.submit_dryrun(AppDef("cs", [r]), {"stall_timeout": "1s", "grace_period": 1}))  # type: ignore[arg-type]
    final = s.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "role 'w' replica 0 stalled for 1s, last line: 'up'", final.msg
    assert len([c for c in engine.calls if c[0] == "create_container"]) == 1  # never recreated
    assert final.roles_statuses[0].replicas[0].restarts == 1  # Docker's one restart


def test_two_processes_act_on_one_stall_once(engine: FakeDockerEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two schedulers (a ``tsm status`` beside an attached ``tsm run``) look at one stalled app at once: both
    looks reach the stall check together (a barrier: both loaded stall.json, neither saved) unless the app's
    lock keeps them apart. The stalled replica is warned once, stopped once, and the app fails."""
    s1, s2 = sched_on(engine), sched_on(engine)
    app = AppDef("two", [role("w", "import signal, time\nsignal.signal(signal.SIGUSR1, lambda *a: print("
                                   "'warned', flush=True))\nprint('up', flush=True)\ntime.sleep(3600)\n")])
    cfg = {"stall_timeout": "1s", "warn_signal": "USR1", "warn_before": "1s", "grace_period": 1}
    app_id = s1.schedule(s1.submit_dryrun(app, cfg))  # type: ignore[arg-type]
    barrier = threading.Barrier(2)

    def together(*args: Any) -> list[tuple[Observed, str]]:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=2)  # both looks loaded stall.json: only without the lock (with it, one waits)
        return stall.check(*args)

    monkeypatch.setattr(scheduler_module, "check", together)
    finals: list[DescribeAppResponse] = []

    def look(s: DockerScheduler) -> None:
        finals.append(until("the app's end", lambda: d if (d := s.describe(app_id)) is not None and
                            d.state.is_terminal else None))

    threads = [threading.Thread(target=look, args=(s,)) for s in (s1, s2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [f.state for f in finals] == [AppState.FAILED] * 2, finals
    warnings = engine.warnings()
    assert len(warnings) == 1, warnings
    until("the stopped replica", lambda: all(c.state == "exited" for c in engine.by_id.values()))
    assert "".join(s1.log_iter(app_id, "w", 0)).splitlines() == ["up", "warned"]


def test_a_marker_is_claimed_by_one_caller_only(engine: FakeDockerEngine) -> None:
    d = sched_on(engine).app_dir("app-1")
    assert [container_lock.claim(d, "warned", "1\n") for _ in range(3)] == [True, False, False]
    assert d.read("warned") == "1\n"
