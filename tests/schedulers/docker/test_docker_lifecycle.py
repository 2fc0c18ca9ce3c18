"""Issue 25 on Docker, on the fake engine: time limits enforced by tsm's looks, the warning before a time
limit and a cancel, what each attempt is told, and the options not carried out yet refused.

Each case asserts from the recorded states and the replica's own output (never from timing).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from schedulers.docker.fake_docker import FakeDockerEngine, FakeImages, fake_client
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, AppState, RetryPolicy, Role

PY = sys.executable

#: a replica that prints "warned" on USR1 and then keeps running until stopped
WARNABLE = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


@pytest.fixture
def engine() -> Iterator[FakeDockerEngine]:
    e = FakeDockerEngine()
    yield e
    for c in list(e.by_id.values()):
        if c.current is not None:
            c.current.signal(9)


def sched(engine: FakeDockerEngine) -> DockerScheduler:
    return DockerScheduler("t", client=fake_client(engine), images=FakeImages())


def role(code: str, **kw: object) -> Role:
    return Role("w", image="fake/python", entrypoint=PY, args=["-c", code], **kw)  # type: ignore[arg-type]


def output(s: DockerScheduler, app_id: str) -> str:
    return "".join(s.log_iter(app_id, "w", 0))


def wait_for(pred: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


def test_time_limit_warns_then_stops_and_fails_with_the_limit(engine: FakeDockerEngine) -> None:
    s = sched(engine)
    app = AppDef("tl", [role(WARNABLE, max_retries=3, retry_policy=RetryPolicy.APPLICATION)])
    app_id = s.schedule(s.submit_dryrun(app, {"time_limit": "2s", "warn_signal": "USR1", "warn_before": "1s",
                                              "grace_period": 1}))
    wait_for(lambda: "up" in output(s, app_id))
    final = s.wait(app_id, timeout=60)
    assert final is not None and final.state == AppState.FAILED
    assert final.msg == "time limit 2s reached"
    assert final.roles_statuses[0].replicas[0].error_msg == "time limit 2s reached"
    assert final.num_restarts == 0  # a time limit is not a failure to retry
    assert engine.warnings() == ["USR1"]  # warned exactly once
    wait_for(lambda: "warned" in output(s, app_id))
    again = s.describe(app_id)
    assert again is not None and again.msg == "time limit 2s reached"  # stays the app's end


def test_a_spent_requeue_budget_stays_the_apps_end_at_every_later_look(engine: FakeDockerEngine) -> None:
    # the look that found the limit said "(no preemptions left: ...)"; a later look (another process: the
    # keeper, a `tsm status`) said only "time limit 2s reached" before
    s = sched(engine)
    app = AppDef("rq", [role(WARNABLE)])
    cfg = {"time_limit": "2s", "requeue_on_time_limit": True, "max_preemptions": 0, "grace_period": 1}
    app_id = s.schedule(s.submit_dryrun(app, cfg))  # type: ignore[arg-type]
    final = s.wait(app_id, timeout=60)
    want = "time limit 2s reached (no preemptions left: max_preemptions=0)"
    assert final is not None and (final.state, final.msg) == (AppState.FAILED, want), final
    later = sched(engine).describe(app_id)  # a look of its own, with no cache of the first one's
    assert later is not None and (later.state, later.msg) == (AppState.FAILED, want), later


def test_a_look_that_listed_containers_a_retry_then_replaced_acts_on_the_new_ones(engine: FakeDockerEngine) -> None:
    # Two processes look at once: the first retries the failed try (replaces its container) while the second
    # has already listed the old container and waits for the app's lock. The second must see the new try,
    # not retry the old one a second time (it did: two retries, max_retries=1 spent twice)
    first, second = sched(engine), sched(engine)
    app = AppDef("rt", [role("import os, sys; print('try', os.environ['TSM_ATTEMPT'], flush=True); "
                             "sys.exit(3 if os.environ['TSM_ATTEMPT'] == '0' else 0)",
                             max_retries=1, retry_policy=RetryPolicy.APPLICATION)])
    app_id = first.schedule(first.submit_dryrun(app, {}))  # type: ignore[arg-type]
    wait_for(lambda: all(c.state == "exited" for c in engine.by_id.values()))  # try 0 failed
    listed = second._snapshot  # the second look lists, then the first one acts before it takes the lock
    from tsm.schedulers.docker import scheduler as docker_scheduler

    real_look = docker_scheduler.DockerScheduler.look

    def late_look(self: DockerScheduler, view: object, *rest: object) -> object:
        assert first.describe(app_id) is not None  # the first look retries meanwhile
        return real_look(self, view, *rest)  # type: ignore[arg-type]

    second.look = late_look.__get__(second)  # type: ignore[method-assign]
    seen = listed()[app_id]
    assert not seen.msg.startswith("retrying"), seen  # the retry was the first look's, made once
    final = first.wait(app_id, timeout=60)
    assert final is not None and final.state == AppState.SUCCEEDED and final.num_restarts == 1, final
    assert output(first, app_id).count("try 1") == 1, output(first, app_id)


def test_an_image_without_a_shell_is_warned_through_its_main_process(engine: FakeDockerEngine) -> None:
    # the warning's script needs /bin/sh in the image; without one, `docker kill --signal` (its main process)
    engine.shell = False
    s = sched(engine)
    app_id = s.schedule(s.submit_dryrun(AppDef("c", [role(WARNABLE)]),
                                        {"warn_signal": "USR1", "warn_before": "1s", "grace_period": 1}))
    wait_for(lambda: "up" in output(s, app_id))
    s.cancel(app_id)
    wait_for(lambda: "warned" in output(s, app_id))
    assert [c[2] for c in engine.calls if c[0] == "kill"] == ["SIGUSR1"]
    assert engine.warnings() == ["USR1"]  # the script was tried first


def test_cancel_warns_first(engine: FakeDockerEngine) -> None:
    s = sched(engine)
    exit_on_warn = WARNABLE.replace("print('warned', flush=True)", "(print('warned', flush=True), sys.exit(0))")
    app_id = s.schedule(s.submit_dryrun(AppDef("c", [role(exit_on_warn)]),
                                        {"warn_signal": "USR1", "warn_before": "30s", "grace_period": 1}))
    wait_for(lambda: "up" in output(s, app_id))
    s.cancel(app_id)
    final = s.describe(app_id)
    assert final is not None and final.state == AppState.CANCELLED
    assert "warned" in output(s, app_id)
    names = [c[0] for c in engine.calls]
    assert names.index("exec_create") < names.index("stop")


def test_every_attempt_sees_its_attempt_and_last_exit(engine: FakeDockerEngine) -> None:
    s = sched(engine)
    code = ("import os\n"
            "print('attempt', os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'],"
            " repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
            "raise SystemExit(0 if os.environ['TSM_ATTEMPT'] == '2' else 3)\n")
    app_id = s.schedule(s.submit_dryrun(AppDef("a", [role(code, max_retries=2,
                                                          retry_policy=RetryPolicy.APPLICATION)]), {}))
    final = s.wait(app_id, timeout=60)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    out = output(s, app_id)
    assert "attempt 2 2 'failed:3'" in out


def test_first_attempt_env_and_warn_signal_in_dry_run(engine: FakeDockerEngine) -> None:
    s = sched(engine)
    info = s.submit_dryrun(AppDef("d", [role("pass")]), {"time_limit": "1h30m", "warn_signal": "SIGUSR2"})
    c = info.request.containers[0]
    assert (c.env["TSM_ATTEMPT"], c.env["TSM_RESTART_COUNT"], c.env["TSM_LAST_EXIT"]) == ("0", "0", "")
    assert c.env["TSM_WARN_SIGNAL"] == "USR2"
    assert "# time limit 1h30m, enforced by tsm" in str(info)


def test_exclude_nodes_is_refused(engine: FakeDockerEngine) -> None:
    s = sched(engine)
    with pytest.raises(InvalidRunOptionError, match="exclude_nodes is not supported on docker yet"):
        s.submit_dryrun(AppDef("r", [role("pass")]), {"exclude_nodes": "n1"})  # type: ignore[arg-type]


def test_long_run_options_reach_the_request_and_the_dry_run(engine: FakeDockerEngine) -> None:
    s = sched(engine)
    cfg = {"time_limit": "1h", "requeue_on_time_limit": True, "max_preemptions": 5, "stall_timeout": "5m",
           "on_stall": "fail"}
    info = s.submit_dryrun(AppDef("r", [role("pass")]), cfg)  # type: ignore[arg-type]
    req = info.request
    assert (req.max_preemptions, req.requeue_on_time_limit, req.stall_timeout, req.on_stall) == (5, True, 300.0, "fail")
    assert "the app restarts, as a preemption (max_preemptions=5)" in str(info)
    assert "stall_timeout 5m" in str(info) and "on_stall=fail" in str(info)
    assert type(req).from_json(req.to_json()) == req
