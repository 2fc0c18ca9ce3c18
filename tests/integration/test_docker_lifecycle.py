"""Issue 25 on the real Docker engine of ``scripts/docker-up``: a time limit that warns every container with
the warning signal, then stops it and fails the app with "time limit X reached"; a cancel that warns first;
each attempt told its attempt. Asserted from the recorded states and the replicas' own output."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from integration.docker_engine import PYTHON_IMAGE, DockerEngine
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.docker]
HANG = 240.0

#: prints "warned" on USR1 (and keeps running), "term" on SIGTERM (and exits 0... after the line)
WARNABLE = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
    "def term(*a):\n"
    "    print('term', flush=True); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


@pytest.fixture
def sched(docker_engine: DockerEngine) -> Iterator[DockerScheduler]:
    s = DockerScheduler("itest-lifecycle")
    yield s
    s.cleanup(include_running=True, session="itest-lifecycle")
    s.close()


def py(code: str, **kw: object) -> Role:
    return Role("w", image=PYTHON_IMAGE, entrypoint="python3", args=["-c", code],  # type: ignore[arg-type]
                resource=Resource(cpu=1, memMB=256), **kw)


def output(s: DockerScheduler, app_id: str) -> list[str]:
    return [ln.rstrip("\n") for ln in s.log_iter(app_id, "w", 0)]


def test_time_limit_warns_then_stops_and_fails(sched: DockerScheduler) -> None:
    app = AppDef("tl", [py(WARNABLE, max_retries=2, retry_policy=RetryPolicy.APPLICATION)])
    app_id = sched.schedule(sched.submit_dryrun(app, {"time_limit": "6s", "warn_signal": "USR1",
                                                      "warn_before": "3s", "grace_period": 5}))
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "time limit 6s reached"
    assert final.num_restarts == 0
    deadline = time.monotonic() + 30
    while "term" not in output(sched, app_id) and time.monotonic() < deadline:
        time.sleep(0.2)  # the stop runs beside the look that decided it
    assert output(sched, app_id) == ["up", "warned", "term"]  # warned once, then SIGTERM


@pytest.mark.parametrize("wrapped", [False, True])
def test_cancel_warns_then_stops(sched: DockerScheduler, wrapped: bool) -> None:
    # wrapped: sh over python, as torchrun over its workers. `docker kill --signal` reached sh alone (the
    # container's init forwards to its child), which ended at it, and the container with it, unwarned python
    # too; the warning now goes to python alone (SIGTERM then reaches sh, whose end ends the container)
    role = py(WARNABLE) if not wrapped else Role(
        "w", image=PYTHON_IMAGE, entrypoint="/bin/sh", args=["-c", 'python3 -c "$0"; echo "sh went on"', WARNABLE],
        resource=Resource(cpu=1, memMB=256))  # type: ignore[arg-type]
    app_id = sched.schedule(sched.submit_dryrun(AppDef("c", [role]),
                                                {"warn_signal": "USR1", "warn_before": "2s", "grace_period": 5}))
    deadline = time.monotonic() + HANG
    while "up" not in output(sched, app_id):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    sched.cancel(app_id)
    final = sched.describe(app_id)
    assert final is not None and final.state == AppState.CANCELLED
    assert output(sched, app_id)[:2] == ["up", "warned"]
    if not wrapped:
        assert output(sched, app_id) == ["up", "warned", "term"]


def test_retried_attempt_is_told_why(sched: DockerScheduler) -> None:
    code = ("import os\n"
            "print(os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'], repr(os.environ['TSM_LAST_EXIT']))\n"
            "raise SystemExit(0 if os.environ['TSM_ATTEMPT'] == '1' else 7)\n")
    app_id = sched.schedule(sched.submit_dryrun(
        AppDef("a", [py(code, max_retries=1, retry_policy=RetryPolicy.APPLICATION)]), {}))
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert output(sched, app_id) == ["0 0 ''", "1 1 'failed:7'"]  # both attempts' output, in order
