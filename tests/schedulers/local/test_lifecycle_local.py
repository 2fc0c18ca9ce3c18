"""Long runs on the local scheduler (issue 25): time limit, warning, requeue, stall, restart variables.

Every assertion reads the recorded states and what the replica itself printed, never a clock; the
durations given are only what makes each case happen.
"""

from __future__ import annotations

import shlex
import sys
import textwrap

from testutil import HANG, py, wait_until
from tsm.lifecycle import PREEMPTED_PREFIX
from tsm.schedulers.api import Stream
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState, Role

#: prints what the attempt knows; registers a warning handler that says so; SIGTERM is reported and ignored
REPORTER = """
    import os, signal, sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: print("warned", flush=True))
    signal.signal(signal.SIGTERM, lambda s, f: print("got SIGTERM", flush=True))
    # one write of the whole line: a warning handled while it is printed must not split it
    sys.stdout.write(" ".join(map(str, ["attempt", lc.attempt(), "restarts", lc.restart_count(), "last",
        lc.last_exit(), "env", os.environ["TSM_ATTEMPT"], os.environ["TSM_RESTART_COUNT"],
        repr(os.environ["TSM_LAST_EXIT"])])) + "\\n")
    sys.stdout.flush()
"""


def out(sched: LocalScheduler, app_id: str, k: int = 0) -> list[str]:
    return [ln.rstrip("\n") for ln in sched.log_iter(app_id, "r", k, streams=Stream.STDOUT)]


def finished(sched: LocalScheduler, app_id: str):  # type: ignore[no-untyped-def]
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state.is_terminal, desc
    return desc


def test_time_limit_warns_every_replica_then_stops_the_app(sched: LocalScheduler) -> None:
    code = REPORTER + "\n    while True:\n        time.sleep(0.05)\n"
    cfg = {"time_limit": "2s", "warn_signal": "USR1", "warn_before": "1s", "grace_period": 3}
    app_id = sched.submit(AppDef("tl", [py(code, num_replicas=2)]), cfg)
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED
    assert desc.msg == "time limit 2s reached"
    for k, rep in enumerate(desc.roles_statuses[0].replicas):
        assert rep.error_msg == "time limit 2s reached" and not rep.preempted
        lines = out(sched, app_id, k)
        # one warning, before the SIGTERM that the ignored limit brought, and SIGKILL ended it (grace)
        assert lines.count("warned") == 1
        assert lines.index("warned") < lines.index("got SIGTERM")
        assert rep.exit_code == 128 + 9


def test_a_replica_handling_the_warning_late_still_gets_it_and_a_wrapper_that_does_not_is_spared(
    sched: LocalScheduler,
) -> None:
    # bash (which does not handle USR1: its default action would end the replica) runs python, which
    # registers its handler only after a while: the warning waits for it, reaches python alone, once. The
    # limit leaves python (its start, the 1.5 s sleep, tsm's import) time to set its SIGTERM handler too on a
    # loaded machine: the warning comes at 0.5 s, the stop at 10 s
    inner = "import time; time.sleep(1.5)\n" + textwrap.dedent(REPORTER) + "while True:\n    time.sleep(0.05)\n"
    role = Role("r", entrypoint="bash", args=["-c", f'{shlex.quote(sys.executable)} -c "$0"; echo "bash went on"', inner])
    cfg = {"time_limit": "10s", "warn_signal": "USR1", "warn_before": "9.5s", "grace_period": 3}
    app_id = sched.submit(AppDef("late", [role]), cfg)
    desc = finished(sched, app_id)
    assert desc.msg == "time limit 10s reached"
    lines = out(sched, app_id)
    assert lines.count("warned") == 1
    assert lines.count("got SIGTERM") == 1, lines  # once: the group's, not the group's and then python's own
    assert lines.index("warned") < lines.index("got SIGTERM")


def test_time_limit_requeue_restarts_as_a_preemption_and_the_attempt_knows(sched: LocalScheduler) -> None:
    code = REPORTER + """
    if lc.restart_count() >= 1:
        sys.exit(0)
    while True:
        time.sleep(0.05)
"""
    cfg = {"time_limit": "1s", "requeue_on_time_limit": True, "grace_period": 0.5}
    app_id = sched.submit(AppDef("rq", [py(code, max_retries=0)]), cfg)
    desc = finished(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc.msg
    assert desc.num_restarts == 1  # with max_retries=0: the requeue did not spend it
    lines = [ln for ln in out(sched, app_id) if ln.startswith("attempt")]
    assert lines == [
        "attempt 0 restarts 0 last None env 0 0 ''",
        "attempt 1 restarts 1 last time_limit env 1 1 'time_limit'",
    ]


def test_requeues_stop_at_max_preemptions(sched: LocalScheduler) -> None:
    code = REPORTER + "\n    while True:\n        time.sleep(0.05)\n"
    cfg = {"time_limit": "1s", "requeue_on_time_limit": True, "max_preemptions": 1, "grace_period": 0.2}
    app_id = sched.submit(AppDef("rqmax", [py(code, max_retries=5)]), cfg)
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED
    assert desc.msg == "time limit 1s reached (no preemptions left: max_preemptions=1)"
    assert desc.num_restarts == 1
    assert [ln.split(" env ")[0] for ln in out(sched, app_id) if ln.startswith("attempt")] == [
        "attempt 0 restarts 0 last None", "attempt 1 restarts 1 last time_limit",
    ]


def test_preempted_flag_comes_from_the_recorded_error(sched: LocalScheduler) -> None:
    app_id = sched.submit(AppDef("flag", [py("pass")]), {})
    finished(sched, app_id)
    sched.store.write([(
        "UPDATE local_replicas SET error=? WHERE app_id=?", (PREEMPTED_PREFIX + "time limit 1s reached", app_id),
    )])
    desc = sched.describe(app_id)
    assert desc is not None and desc.roles_statuses[0].replicas[0].preempted
    assert desc.roles_statuses[0].replicas[0].error_msg.startswith("preempted: ")


def test_silent_replica_is_stalled_warned_and_failed_with_its_last_line(sched: LocalScheduler) -> None:
    code = REPORTER + """
    print("step 1 done", flush=True)
    time.sleep(1000)
"""
    cfg = {"stall_timeout": "1s", "on_stall": "fail", "warn_signal": "USR1", "warn_before": "1s", "grace_period": 3}
    app_id = sched.submit(AppDef("stall", [py(code)]), cfg)
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED
    assert desc.msg == "r/0 stalled for 1s, last line: 'step 1 done'"
    rep = desc.roles_statuses[0].replicas[0]
    assert rep.error_msg == "stalled for 1s, last line: 'step 1 done'"
    lines = out(sched, app_id)
    assert lines.index("warned") < lines.index("got SIGTERM")


def test_stall_restart_spends_max_retries_and_the_next_attempt_reads_stalled(sched: LocalScheduler) -> None:
    code = REPORTER + """
    if lc.last_exit() == "stalled":
        sys.exit(0)
    time.sleep(1000)
"""
    cfg = {"stall_timeout": "1s", "grace_period": 0.2}  # on_stall=restart is the default
    app_id = sched.submit(AppDef("stall2", [py(code, max_retries=1)]), cfg)
    desc = finished(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc.msg
    assert desc.num_restarts == 1
    assert [ln for ln in out(sched, app_id) if ln.startswith("attempt")][-1] == (
        "attempt 1 restarts 1 last stalled env 1 1 'stalled'"
    )


def test_stall_without_retries_fails_the_app(sched: LocalScheduler) -> None:
    app_id = sched.submit(AppDef("stall3", [py("import time; time.sleep(1000)")]), {"stall_timeout": "1s", "grace_period": 0.2})
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED
    assert desc.msg == "r/0 stalled for 1s, no output at all"


def test_failed_attempts_read_the_restart_count_and_their_last_exit(sched: LocalScheduler) -> None:
    code = REPORTER + """
    sys.exit(0 if lc.restart_count() == 2 else 3)
"""
    app_id = sched.submit(AppDef("resume", [py(code, max_retries=2)]), {})
    desc = finished(sched, app_id)
    assert desc.state == AppState.SUCCEEDED
    assert [ln for ln in out(sched, app_id) if ln.startswith("attempt")] == [
        "attempt 0 restarts 0 last None env 0 0 ''",
        "attempt 1 restarts 1 last failed:3 env 1 1 'failed:3'",
        "attempt 2 restarts 2 last failed:3 env 2 2 'failed:3'",
    ]


def test_cancel_delivers_the_warning_first(sched: LocalScheduler) -> None:
    code = REPORTER + """
    signal.signal(signal.SIGTERM, lambda s, f: (print("got SIGTERM", flush=True), sys.exit(0)))
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
"""
    cfg = {"warn_signal": "USR2", "warn_before": "1s", "grace_period": 5}
    app_id = sched.submit(AppDef("cw", [py(code, num_replicas=2)]), cfg)
    for k in (0, 1):
        wait_until(lambda k=k: "ready" in out(sched, app_id, k), "the replica to be ready", timeout=HANG)
    sched.cancel(app_id)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    for k in (0, 1):
        lines = out(sched, app_id, k)
        assert lines.count("warned") == 1
        assert lines.index("warned") < lines.index("got SIGTERM")


def test_dry_run_shows_the_lifecycle_and_refuses_bad_values(sched: LocalScheduler) -> None:
    import pytest

    from tsm.errors import InvalidRunOptionError

    info = sched.submit_dryrun(AppDef("d", [py("pass")]), {"time_limit": "2h", "warn_signal": "USR1",
                                                             "stall_timeout": "15m"})
    assert "# lifecycle: time limit 2h, warning USR1 2m before, stall after 15m quiet: restart" in str(info)
    assert info.request.lifecycle["time_limit"] == 7200.0
    for bad in ({"time_limit": "2 hours"}, {"warn_signal": "KILL"}, {"on_stall": "ignore"},
                {"requeue_on_time_limit": True}, {"max_preemptions": -1}):
        with pytest.raises(InvalidRunOptionError):
            sched.submit_dryrun(AppDef("d", [py("pass")]), bad)


def test_on_failure_wait_lets_every_replica_end_and_fails_with_the_first_in_rank_order(
    sched: LocalScheduler, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # rank 2 fails at once; rank 1 fails only once rank 2 has ended (a file says so), rank 0 once rank 1 has
    code = f"""
    import os, pathlib, sys, time
    k = int(os.environ["TSM_REPLICA_ID"])
    d = pathlib.Path({str(tmp_path)!r})
    if k < 2:
        while not (d / f"ended-{{k + 1}}").exists():
            time.sleep(0.02)
    print("rank", k, "ran to its end", flush=True)
    (d / f"ended-{{k}}").touch()
    sys.exit(0 if k == 0 else 3)
    """
    app_id = sched.submit(AppDef("wait", [py(code, num_replicas=3)]), {"on_failure": "wait"})
    desc = finished(sched, app_id)
    assert desc.state == AppState.FAILED
    assert desc.msg == "r/1 exited with code 3"  # rank 1, though rank 2 failed first
    assert [out(sched, app_id, k) for k in range(3)] == [[f"rank {k} ran to its end"] for k in range(3)]
    assert [r.exit_code for r in desc.roles_statuses[0].replicas] == [0, 3, 3]


def test_on_failure_takes_stop_or_wait(sched: LocalScheduler) -> None:
    import pytest

    from tsm.errors import InvalidRunOptionError

    with pytest.raises(InvalidRunOptionError, match="on_failure='later' must be one of stop, wait"):
        sched.submit_dryrun(AppDef("x", [py("pass")]), {"on_failure": "later"})
