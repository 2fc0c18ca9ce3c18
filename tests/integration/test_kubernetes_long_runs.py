"""Issue 25's preemption on the real single-node cluster of ``scripts/k8s-up`` (Kubernetes 1.20).

A pod evicted through the eviction API (``policy/v1beta1`` Eviction: on 1.20 it only deletes the pod, with its
grace period, and the Job makes another pod) is the cluster's decision: tsm's controller replaces the try as a
preemption, on ``max_preemptions``, with ``max_retries=0`` untouched; the new try is told
``TSM_LAST_EXIT=preempted``. The cluster has
one node, so node exclusion is checked in the objects a retry creates on the fake cluster
(``tests/schedulers/kubernetes/test_kubernetes_lifecycle.py``). A replica that goes silent past
``stall_timeout`` is warned and restarted as stalled (the cluster has no metrics-server: the log alone
decides). Asserted from the recorded states and the replica's own output.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from integration.k8s_cluster import K8sCluster
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.schedulers.kubernetes.status import from_json
from tsm.specs.api import AppDef, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]
HANG = 300.0

#: says which attempt it is and why the last ended; "warned" on USR1; attempt 1 ends, attempt 0 runs on
ATTEMPTS = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
    "print('attempt', os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'],"
    " repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "if os.environ['TSM_ATTEMPT'] == '1': sys.exit(0)\n"
    "while True: time.sleep(0.1)\n"
)


@pytest.fixture
def sched(k8s_cluster: K8sCluster) -> Iterator[KubernetesScheduler]:
    s = KubernetesScheduler("itest-long-runs")
    yield s
    s.cleanup(include_running=True)
    s.close()


def evict(s: KubernetesScheduler, pod: str) -> None:
    """``POST /api/v1/namespaces/<ns>/pods/<pod>/eviction`` with a ``policy/v1beta1`` Eviction (1.20's)."""
    c = s.client
    body = {"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": pod, "namespace": c.namespace}}
    c.core.create_namespaced_pod_eviction(pod, c.namespace, body, _preload_content=False)


def test_an_evicted_pod_is_restarted_as_a_preemption(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    role = Role("w", image=k8s_cluster.python_image, entrypoint="python3", args=["-c", ATTEMPTS],
                resource=Resource(cpu=0.5, memMB=128))  # max_retries=0
    app_id = sched.submit(AppDef("ev", [role]), {"warn_signal": "USR1", "warn_before": "3s", "grace_period": 3,
                                                 "request_fraction": 0.1})
    seen: list[tuple[str, str]] = []
    evicted = ""
    deadline = time.monotonic() + HANG
    while True:
        desc = sched.describe(app_id)
        assert desc is not None
        if not seen or seen[-1] != (desc.state.name, desc.msg):
            seen.append((desc.state.name, desc.msg))
        if desc.state.is_terminal:
            break
        if not evicted and "attempt 0" in "".join(sched.log_iter(app_id, "w", 0)):
            pods: list[Any] = [from_json(p) for p in sched.client.list_pods(app_id)]
            evicted = next(p.name for p in pods if p.phase == "Running" and p.attempt == 0)
            evict(sched, evicted)
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    assert seen[-1] == ("SUCCEEDED", ""), seen
    # "retrying after" from the look that made the retry, "restarting after" from a later one (the home's
    # keeper may be the one that made it)
    retry = [m for _, m in seen if m.startswith(("retrying after", "restarting after"))]
    assert retry and retry[0].split(" after ", 1)[1].startswith("role 'w' replica 0 preempted: evicted"), seen
    # on 1.20 the kubelet removes an evicted pod's container with it: its own lines are only in what tsm
    # kept of it before; never the kubelet's "unable to retrieve container logs" in their place
    log = "".join(sched.log_iter(app_id, "w", 0))
    assert "attempt 1 1 'preempted'" in log and "unable to retrieve" not in log, log
    final = sched.describe(app_id)
    assert final is not None and final.num_restarts == 1
    assert final.metadata.get("preemptions") == "1 of max_preemptions=3"


#: prints "warned" on USR1, then "bye" and exits; runs as the pod's PID 1
CANCELLABLE = (
    "import signal, sys, time\n"
    "def warned(*a):\n"
    "    print('warned', flush=True); time.sleep(0.5); print('bye', flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGUSR1, warned)\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


def test_cancel_keeps_the_lines_written_after_the_warning(sched: KubernetesScheduler,
                                                          k8s_cluster: K8sCluster) -> None:
    role = Role("w", image=k8s_cluster.python_image, entrypoint="python3", args=["-c", CANCELLABLE],
                resource=Resource(cpu=0.5, memMB=128))
    app_id = sched.submit(AppDef("cw", [role]), {"warn_signal": "USR1", "warn_before": "10s", "grace_period": 3,
                                                 "request_fraction": 0.1})
    deadline = time.monotonic() + HANG
    while "up" not in "".join(sched.log_iter(app_id, "w", 0)):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    sched.cancel(app_id)
    final = sched.describe(app_id)
    assert final is not None and final.state.name == "CANCELLED", final
    assert [ln.rstrip("\n") for ln in sched.log_iter(app_id, "w", 0)] == ["up", "warned", "bye"]
    # and in the stamped copy that tsm log --since/--until reads
    since = datetime.fromtimestamp(0, tz=timezone.utc)
    assert [ln.rstrip("\n") for ln in sched.log_iter(app_id, "w", 0, since=since)] == ["up", "warned", "bye"]


#: attempt 0 writes "working" and goes silent (a hang) until stopped, printing "warned" on USR1; attempt 1
#: says why the last ended and succeeds
HANGS_ONCE = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
    "print('attempt', os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'],"
    " repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "if os.environ['TSM_ATTEMPT'] != '0': sys.exit(0)\n"
    "print('working', flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


def test_a_silent_replica_is_warned_then_restarted_as_stalled(sched: KubernetesScheduler,
                                                             k8s_cluster: K8sCluster) -> None:
    """stall_timeout on the real cluster (no metrics-server: its log alone decides): the replica that went
    silent is found by tsm's looks, warned by the preStop hook, and its role retried as a failure
    (``max_retries=1`` spent, not ``max_preemptions``), the new try told ``TSM_LAST_EXIT=stalled``."""
    role = Role("w", image=k8s_cluster.python_image, entrypoint="python3", args=["-c", HANGS_ONCE],
                resource=Resource(cpu=0.5, memMB=128), max_retries=1, retry_policy=RetryPolicy.ROLE)
    app_id = sched.submit(AppDef("st", [role]), {"stall_timeout": "3s", "warn_signal": "USR1", "warn_before": "2s",
                                                 "grace_period": 2, "request_fraction": 0.1})
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + HANG
    while True:
        desc = sched.describe(app_id)
        assert desc is not None
        if not seen or seen[-1] != (desc.state.name, desc.msg):
            seen.append((desc.state.name, desc.msg))
        if desc.state.is_terminal:
            break
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    assert seen[-1] == ("SUCCEEDED", ""), seen
    # the look that decides the retry says "retrying after ..."; the later ones, until the old pod has ended,
    # "restarting after ...: waiting for ..." (the home's keeper may make the deciding look between two of ours)
    why = "after role 'w' replica 0 stalled for 3s, last line: 'working'"
    assert any(state == "RUNNING" and (msg == f"retrying {why}" or msg.startswith(f"restarting {why}: waiting for "))
               for state, msg in seen), seen
    log = [ln.rstrip("\n") for ln in sched.log_iter(app_id, "w", 0)]
    assert log == ["attempt 0 0 ''", "working", "warned", "attempt 1 1 'stalled'"], log
    final = sched.describe(app_id)
    assert final is not None and final.num_restarts == 1 and "preemptions" not in final.metadata


def test_a_failure_is_retried_though_nobody_looks(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    """Submitted, then never described, waited for or listed by the test (it reads pods from the API): the
    home's keeper looks (issue 25), so the failed try is retried. Before it, a detached app was retried only
    once some process looked at it."""
    code = "import os, sys; print('attempt', os.environ['TSM_ATTEMPT'], flush=True); sys.exit(3 if os.environ['TSM_ATTEMPT'] == '0' else 0)"
    role = Role("w", image=k8s_cluster.python_image, entrypoint="python3", args=["-c", code],
                resource=Resource(cpu=0.5, memMB=128), max_retries=1, retry_policy=RetryPolicy.ROLE)
    app_id = sched.submit(AppDef("kk", [role]), {"request_fraction": 0.1})
    # the look that sees the app end deletes its objects and records its end: wait for that record
    final_json = sched.app_dir(app_id).path / "final.json"
    deadline = time.monotonic() + HANG
    while not final_json.exists():
        assert time.monotonic() < deadline, [(p.attempt, p.phase) for p in map(from_json, sched.client.list_pods(app_id))]
        time.sleep(0.5)
    final = sched.describe(app_id)
    assert final is not None and final.state.name == "SUCCEEDED" and final.num_restarts == 1, final
    assert "".join(sched.log_iter(app_id, "w", 0)) == "attempt 0\nattempt 1\n"
