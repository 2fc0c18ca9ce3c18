"""Issue 25 on the real single-node cluster of ``scripts/k8s-up``: a time limit as each pod's
``activeDeadlineSeconds`` with the warning from a ``preStop`` hook (the replica's own output shows the warning,
then SIGTERM), the app FAILED "time limit X reached"; each attempt told its attempt. Asserted from the
recorded states and the replicas' own output."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from integration.k8s_cluster import K8sCluster
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]
HANG = 300.0

#: prints "warned" on USR1 (and keeps running), "term" on SIGTERM (then exits); runs as the pod's PID 1
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
def sched(k8s_cluster: K8sCluster) -> Iterator[KubernetesScheduler]:
    s = KubernetesScheduler("itest-lifecycle")
    yield s
    s.cleanup(include_running=True)
    s.close()


def py(image: str, code: str, **kw: Any) -> Role:
    return Role("w", image=image, entrypoint="python3", args=["-c", code], resource=Resource(cpu=0.5, memMB=128),
                **kw)


def lines(s: KubernetesScheduler, app_id: str) -> list[str]:
    return [ln.rstrip("\n") for ln in s.log_iter(app_id, "w", 0)]


def test_time_limit_warns_through_the_pre_stop_hook_then_fails(sched: KubernetesScheduler,
                                                                k8s_cluster: K8sCluster) -> None:
    app = AppDef("tl", [py(k8s_cluster.python_image, WARNABLE, max_retries=2, retry_policy=RetryPolicy.APPLICATION)])
    app_id = sched.submit(app, {"time_limit": "12s", "warn_signal": "USR1", "warn_before": "4s", "grace_period": 5})
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "time limit 12s reached"
    assert final.num_restarts == 0
    assert lines(sched, app_id) == ["up", "warned", "term"]


def test_the_warning_reaches_the_program_under_a_launcher(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    # sh over python, as torchrun over its workers, sh as the pod's PID 1: the hook used to signal PID 1 only,
    # which sh (without a handler, as PID 1) ignored, so the program was never warned
    wrapped = Role("w", image=k8s_cluster.python_image, entrypoint="/bin/sh",
                   args=["-c", 'python3 -c "$0"; echo "sh went on"', WARNABLE], resource=Resource(cpu=0.5, memMB=128))
    app_id = sched.submit(AppDef("wrapped", [wrapped]),
                          {"time_limit": "12s", "warn_signal": "USR1", "warn_before": "4s", "grace_period": 3})
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.FAILED, final
    assert final.msg == "time limit 12s reached"
    assert lines(sched, app_id)[:2] == ["up", "warned"]


def test_retried_attempt_is_told_why(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    code = ("import os\n"
            "print(os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'], repr(os.environ['TSM_LAST_EXIT']))\n"
            "raise SystemExit(0 if os.environ['TSM_ATTEMPT'] == '1' else 7)\n")
    app = AppDef("a", [py(k8s_cluster.python_image, code, max_retries=1, retry_policy=RetryPolicy.APPLICATION)])
    app_id = sched.submit(app, {})
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert lines(sched, app_id)[-1] == "1 1 'failed:7'"
