"""Issue 25 on the real Ray head of ``scripts/ray-up``: the driver's time limit (warning, then the stop, the
app FAILED "time limit X reached"), a cancel that warns first, and each attempt told its attempt. Asserted
from the recorded states and the replicas' own output.

The time limits leave a replica 10 s to start before its warning: on a loaded machine a Ray actor and the
program under it can take several seconds, and a warning sent before the program handles it is not one it
can answer."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from integration.ray_cluster import RayCluster, ray_cluster  # noqa: F401 (the fixture test modules ask for)
from tsm.schedulers.api import Stream
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.ray]
PY = sys.executable
HANG = 240.0

#: prints "warned" on USR1 (and keeps running), "term" on SIGTERM (then exits)
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
def sched(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tsm.schedulers.ray import create_scheduler

    monkeypatch.chdir(tmp_path_factory.mktemp("ray-lifecycle"))
    s = create_scheduler("ray-lifecycle", address=ray_cluster.address)
    yield s
    s.close()


def role(code: str, **kw: Any) -> Role:
    return Role("w", entrypoint=PY, args=["-c", code], resource=Resource(cpu=0.5, memMB=100), **kw)


def lines(sched: Any, app_id: str) -> list[str]:
    return [ln.rstrip("\n") for ln in sched.log_iter(app_id, "w", 0, streams=Stream.STDOUT)]


def test_time_limit_warns_then_stops_and_fails(sched: Any) -> None:
    app = AppDef("tl", [role(WARNABLE, max_retries=2, retry_policy=RetryPolicy.APPLICATION)])
    app_id = sched.submit(app, {"time_limit": "14s", "warn_signal": "USR1", "warn_before": "4s", "grace_period": 5})
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "time limit 14s reached"
    assert final.num_restarts == 0
    assert lines(sched, app_id) == ["up", "warned", "term"]


def test_the_warning_reaches_the_program_under_a_launcher_and_spares_the_launcher(sched: Any) -> None:
    # bash over python, as torchrun over its workers: bash does not handle USR1 (it would end at it, and the
    # replica with it), python does. Only python is warned; the time limit, not the warning, ends the app
    wrapped = Role("w", entrypoint="bash", args=["-c", f'{PY} -c "$0"; echo "bash went on"', WARNABLE],
                   resource=Resource(cpu=0.5, memMB=100))
    app_id = sched.submit(AppDef("wrapped", [wrapped]),
                          {"time_limit": "14s", "warn_signal": "USR1", "warn_before": "4s", "grace_period": 5})
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "time limit 14s reached"
    assert lines(sched, app_id)[:2] == ["up", "warned"]


def test_cancel_warns_then_stops(sched: Any) -> None:
    app_id = sched.submit(AppDef("c", [role(WARNABLE)]), {"warn_signal": "USR1", "warn_before": "2s", "grace_period": 5})
    deadline = time.monotonic() + HANG
    while "up" not in lines(sched, app_id):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    sched.cancel(app_id)
    final = sched.describe(app_id)
    assert final is not None and final.state == AppState.CANCELLED, final
    assert lines(sched, app_id) == ["up", "warned", "term"]


def test_retried_attempt_is_told_why(sched: Any) -> None:
    code = ("import os\n"
            "print(os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'], repr(os.environ['TSM_LAST_EXIT']))\n"
            "raise SystemExit(0 if os.environ['TSM_ATTEMPT'] == '1' else 7)\n")
    app_id = sched.submit(AppDef("a", [role(code, max_retries=1, retry_policy=RetryPolicy.APPLICATION)]))
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert lines(sched, app_id)[-1] == "1 1 'failed:7'"
