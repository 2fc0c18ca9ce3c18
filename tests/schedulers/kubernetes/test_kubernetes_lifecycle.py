"""Issue 25 on Kubernetes, on the fake cluster: the time limit as each pod's ``activeDeadlineSeconds``, the
warning as a ``preStop`` hook inside a lengthened grace period (before the limit and before a cancel), what
each attempt is told, and the options not carried out yet refused.

Each case asserts from the recorded states and the replica's own output (never from timing).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from schedulers.kubernetes.fake_kube import FakeCluster
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.kubernetes.request import KubernetesOptions, build_request
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import AppDef, AppState, RetryPolicy, Role

PY = sys.executable
CFG = {"dns": "yes"}

#: a replica that prints "warned" on USR1 and then keeps running until stopped
WARNABLE = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def role(code: str, **kw: object) -> Role:
    return Role("w", image="fake/python", entrypoint=PY, args=["-c", code], **kw)  # type: ignore[arg-type]


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster()
    yield c
    c.close()


def wait_for(pred: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


def test_manifests_carry_the_deadline_the_hook_and_the_attempt() -> None:
    opts = KubernetesOptions.from_cfg({"time_limit": "2h", "warn_signal": "USR1", "warn_before": "5m",
                                       "grace_period": 10})
    req = build_request(AppDef("m", [role("pass")]), opts, "s", "/tmp", 0.0)
    pod = req.jobs[0]["spec"]["template"]["spec"]
    assert pod["activeDeadlineSeconds"] == 7200 - 300  # warned at 1h55m, SIGTERM at 2h
    assert pod["terminationGracePeriodSeconds"] == 10 + 300
    assert req.grace_period == 310  # a delete (cancel) leaves the hook its time too
    hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"] and "kill -USR1 1" in hook[2]
    env = {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}
    assert (env["TSM_ATTEMPT"], env["TSM_RESTART_COUNT"], env["TSM_LAST_EXIT"], env["TSM_WARN_SIGNAL"]) == (
        "0", "0", "", "USR1")
    plain = build_request(AppDef("m", [role("pass")]), KubernetesOptions.from_cfg({}), "s", "/tmp", 0.0)
    plain_pod = plain.jobs[0]["spec"]["template"]["spec"]
    assert "activeDeadlineSeconds" not in plain_pod and "lifecycle" not in plain_pod["containers"][0]


def test_time_limit_warns_then_ends_the_pod_and_fails_with_the_limit(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app = AppDef("tl", [role(WARNABLE, max_retries=3, retry_policy=RetryPolicy.APPLICATION)])
    app_id = s.submit(app, {**CFG, "time_limit": "3s", "warn_signal": "USR1", "warn_before": "1s", "grace_period": 1})
    final = s.wait(app_id, timeout=60)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "time limit 3s reached"
    assert final.num_restarts == 0  # not a failure to retry
    assert final.roles_statuses[0].replicas[0].error_msg == "time limit 3s reached"
    assert [c[1]["signal"] for c in cluster.calls if c[0] == "preStop"] == ["USR1"]
    assert "warned" in "".join(s.log_iter(app_id, "w", 0))


def test_cancel_runs_the_warning_hook_first(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    exit_on_warn = WARNABLE.replace("print('warned', flush=True)", "(print('warned', flush=True), sys.exit(0))")
    app_id = s.submit(AppDef("c", [role(exit_on_warn)]), {**CFG, "warn_signal": "USR1", "warn_before": "30s"})
    wait_for(lambda: "up" in "".join(s.log_iter(app_id, "w", 0)))
    s.cancel(app_id)
    assert [c[1]["signal"] for c in cluster.calls if c[0] == "preStop"] == ["USR1"]
    final = s.describe(app_id)
    assert final is not None and final.state == AppState.CANCELLED
    # the kept log is snapshotted before the delete (what the replica writes after the warning is not in it
    # yet): the process's own exit on the warning is what shows it got the signal
    assert any(c[0] == "preStop" for c in cluster.calls)


def test_every_attempt_sees_its_attempt_and_last_exit(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    code = ("import os\n"
            "print('attempt', os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'],"
            " repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
            "raise SystemExit(0 if os.environ['TSM_ATTEMPT'] == '2' else 3)\n")
    app_id = s.submit(AppDef("a", [role(code, max_retries=2, retry_policy=RetryPolicy.APPLICATION)]), CFG)
    final = s.wait(app_id, timeout=60)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert "attempt 2 2 'failed:3'" in "".join(s.log_iter(app_id, "w", 0))


@pytest.mark.parametrize("cfg", [{"stall_timeout": "5m"}, {"exclude_nodes": "n1"}, {"max_preemptions": 5},
                                 {"time_limit": "1h", "requeue_on_time_limit": True}])
def test_options_not_carried_out_are_refused(cfg: dict[str, object]) -> None:
    with pytest.raises(InvalidRunOptionError, match="not supported on kubernetes yet"):
        KubernetesOptions.from_cfg(cfg)  # type: ignore[arg-type]
