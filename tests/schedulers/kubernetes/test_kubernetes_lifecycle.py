"""Issue 25 on Kubernetes, on the fake cluster: the time limit as each pod's ``activeDeadlineSeconds``, the
warning as a ``preStop`` hook inside a lengthened grace period (before the limit and before a cancel), what
each attempt is told, preemptions (an evicted pod, a node lost) restarted on their own budget with the lost
node excluded, a requeue at the time limit, and the stall options carried in the request (stalls
themselves: test_kubernetes_stall.py).

Each case asserts from the recorded states and the replica's own output (never from timing).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from schedulers.kubernetes.fake_kube import FakeCluster
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.kubernetes.request import (
    REQUEUE_BACKSTOP,
    KubernetesOptions,
    build_request,
    with_excluded_nodes,
)
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role

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
    assert hook[:2] == ["/bin/sh", "-c"] and "kill -s USR1" in hook[2] and "SigCgt" in hook[2]
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
    # the lines the replica writes after the warning are kept too (its log is followed through the stop)
    assert "".join(s.log_iter(app_id, "w", 0)) == "up\nwarned\n"


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


def test_stall_options_are_carried_in_the_request_and_checked() -> None:
    app = AppDef("a", [role("pass")])
    req = build_request(app, KubernetesOptions.from_cfg({"stall_timeout": "5m", "on_stall": "fail"}), "s", "/tmp/x", 0.0, "me")
    assert (req.stall_timeout, req.on_stall) == (300.0, "fail")
    assert (build_request(app, KubernetesOptions.from_cfg({}), "s", "/tmp/x", 0.0, "me").stall_timeout) is None
    with pytest.raises(InvalidRunOptionError, match="on_stall"):
        KubernetesOptions.from_cfg({"stall_timeout": "5m", "on_stall": "ignore"})


# -- preemption (issue 25): the cluster's decisions spend max_preemptions, never max_retries -----------------

#: a replica that says which attempt it is and why the last one ended, then ends on attempt ``END`` (else runs)
ATTEMPTS = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
    "print('attempt', os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'],"
    " repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "if os.environ['TSM_ATTEMPT'] == 'END': raise SystemExit(0)\n"
    "while True: time.sleep(0.05)\n"
)


def looks(s: KubernetesScheduler, app_id: str, during: object = None, timeout: float = 60.0) -> list[tuple[str, str]]:
    """Look at the app until it ends (each look is a controller step); the distinct (state, msg) seen, in order.
    ``during(desc)`` runs at each look (to act on the cluster at a given state)."""
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    while True:
        desc = s.describe(app_id)
        assert desc is not None
        if not seen or seen[-1] != (desc.state.name, desc.msg):
            seen.append((desc.state.name, desc.msg))
        if desc.state.is_terminal:
            return seen
        if during is not None:
            during(desc)  # type: ignore[operator]
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)


def running_pod(cluster: FakeCluster, attempt: int) -> str | None:
    """The name of the running pod of try ``attempt`` (None while there is none)."""
    with cluster.lock:
        return next((n for n, p in cluster.pods.items() if p.phase == "Running" and not p.deleted
                     and p.obj["metadata"]["labels"]["tsm/attempt"] == str(attempt)), None)


def first_retry_jobs(cluster: FakeCluster) -> list[dict[str, object]]:
    """The Jobs of try 1 now (taken at each look: the app's end deletes them)."""
    with cluster.lock:
        return [j for j in cluster.jobs.values() if j["metadata"]["labels"]["tsm/attempt"] == "1"]


def test_an_evicted_pod_is_restarted_as_a_preemption_not_a_failure(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("ev", [role(ATTEMPTS.replace("END", "1"))]),  # max_retries=0
                      {**CFG, "warn_signal": "USR1", "warn_before": "1s", "grace_period": 1})
    evicted: list[str] = []

    def evict_once(desc: object) -> None:
        pod = running_pod(cluster, 0)
        if not evicted and pod is not None and "attempt 0" in "".join(s.log_iter(app_id, "w", 0)):
            evicted.append(pod)
            cluster.evict(pod)

    seen = looks(s, app_id, evict_once)
    assert seen[-1] == ("SUCCEEDED", ""), seen
    retry = [m for st, m in seen if m.startswith("retrying after")]
    assert retry and retry[0].startswith("retrying after role 'w' replica 0 preempted: evicted"), seen
    log = "".join(s.log_iter(app_id, "w", 0))
    assert "attempt 0 0 ''" in log and "attempt 1 1 'preempted'" in log, log
    assert [c[1]["signal"] for c in cluster.calls if c[0] == "preStop"][:1] == ["USR1"]  # the evicted pod was warned
    final = s.describe(app_id)
    assert final is not None and final.num_restarts == 1
    assert final.metadata.get("preemptions") == "1 of max_preemptions=3"


def test_a_preemption_past_max_preemptions_fails_the_app(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("ev", [role(ATTEMPTS.replace("END", "9"), max_retries=5,
                                         retry_policy=RetryPolicy.APPLICATION)]), {**CFG, "max_preemptions": 0})
    states: list[object] = []

    def evict_and_record(desc: object) -> None:
        states.append(desc)
        pod = running_pod(cluster, 0)
        if pod is not None and "attempt 0" in "".join(s.log_iter(app_id, "w", 0)):
            cluster.evict(pod)

    seen = looks(s, app_id, evict_and_record)
    state, msg = seen[-1]
    assert state == "FAILED" and "preempted: evicted" in msg and "no preemptions left: max_preemptions=0" in msg, seen
    assert not any(m.startswith("retrying") for _, m in seen)  # max_retries=5 was not spent on it


def test_a_replica_lost_with_its_node_is_retried_off_that_node(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("nl", [role(ATTEMPTS.replace("END", "1"))]), {**CFG, "exclude_nodes": "node-9"})
    lost: list[bool] = []
    retried_jobs: list[dict[str, object]] = []

    def lose_node_once(desc: object) -> None:
        if not lost and running_pod(cluster, 0) is not None and "attempt 0" in "".join(s.log_iter(app_id, "w", 0)):
            lost.append(True)
            cluster.lose_node("node-1")
        retried_jobs[:] = first_retry_jobs(cluster)

    seen = looks(s, app_id, lose_node_once)
    assert seen[-1] == ("SUCCEEDED", ""), seen
    retry = next(m for _, m in seen if m.startswith("retrying after"))
    assert "preempted: node lost: node-1 is gone" in retry and retry.endswith("excluding node(s) node-1"), retry
    assert "attempt 1 1 'preempted'" in "".join(s.log_iter(app_id, "w", 0))
    # the retry's Job carries the term (the fake runs it anyway: its one node is "gone")
    job: Any = retried_jobs[0]
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                            "values": ["node-1", "node-9"]}]}]
    final = s.describe(app_id)
    assert final is not None
    excluded = final.metadata["excluded_nodes"]
    assert "node-1: role 'w' replica 0 was lost with it (node lost: node-1 is gone)" in excluded
    assert "node-9: exclude_nodes" in excluded


#: attempt 0 fails once the file argv[1] exists (its GPU fell off the bus meanwhile); attempt 1 succeeds
GPU_FAILS = (
    "import os, sys, time\n"
    "print('attempt', os.environ['TSM_ATTEMPT'], flush=True)\n"
    "while os.environ['TSM_ATTEMPT'] == '0' and not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
    "raise SystemExit(3 if os.environ['TSM_ATTEMPT'] == '0' else 0)\n"
)


@pytest.mark.parametrize("case", ["withdrawn", "healthy"])
def test_a_gpu_replica_failed_on_a_node_whose_gpus_turned_unhealthy_is_retried_off_it(
        cluster: FakeCluster, case: str, tmp_path: Path) -> None:
    # NVIDIA's device plugin takes an unhealthy GPU (an XID: fallen off the bus, ECC) out of the node's
    # allocatable; a GPU replica that failed there is retried off the node. With every GPU healthy the
    # failure is the program's own: retried wherever the scheduler likes
    gpus = {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110",
                                                                 "nvidia.com/gpu": "2"}}  # fmt: skip
    cluster.nodes[0]["status"].update(json.loads(json.dumps(gpus)))
    cluster.nodes.append({"metadata": {"name": "node-2"}, "spec": {}, "status": {
        **json.loads(json.dumps(gpus)), "conditions": [{"type": "Ready", "status": "True"}]}})
    flag = tmp_path / "fail-now"
    s = KubernetesScheduler("t", client=cluster.client())
    r = Role("w", image="fake/python", entrypoint=sys.executable, args=["-c", GPU_FAILS, str(flag)], max_retries=1,
             resource=Resource(cpu=1, gpu=1, memMB=0))
    app_id = s.submit(AppDef("gpu", [r]), CFG)
    retried_jobs: list[dict[str, object]] = []

    def fail_once(desc: object) -> None:
        if not flag.exists() and running_pod(cluster, 0) is not None:
            if case == "withdrawn":
                with cluster.lock:
                    cluster.nodes[0]["status"]["allocatable"]["nvidia.com/gpu"] = "1"
            flag.write_text("")
        retried_jobs[:] = first_retry_jobs(cluster)

    seen = looks(s, app_id, fail_once)
    assert seen[-1] == ("SUCCEEDED", ""), seen
    retry = next(m for _, m in seen if m.startswith("retrying after"))
    affinity: Any = retried_jobs[0]["spec"]["template"]["spec"].get("affinity")  # type: ignore[index]
    final = s.describe(app_id)
    assert final is not None
    if case == "healthy":
        assert "excluding" not in retry and affinity is None, (retry, affinity)
        assert "excluded_nodes" not in final.metadata
        return
    assert retry.endswith("excluding node(s) node-1"), retry
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-1"]}]}]
    assert final.metadata["excluded_nodes"] == (
        "node-1: a GPU fault under role 'w' replica 0 (attempt 0): the device plugin withdrew 1 of the node's 2 GPUs "
        "as unhealthy")


@pytest.mark.parametrize("case", ["unlimited", "limited", "last node"])
def test_a_replica_the_nodes_oom_killer_ended_is_retried_off_that_node(cluster: FakeCluster, case: str) -> None:
    # no memory limit of its own: the node ran out, so the retry avoids it; with one (memMB), OOMKilled is the
    # program outgrowing its limit: retried (max_retries) where the scheduler likes, no node excluded; nor is
    # the only Ready node (the retry would wait for a node that does not exist)
    limited = case == "limited"
    if case != "last node":  # a second Ready node (the fake runs every pod on node-1 whatever it is told)
        cluster.nodes.append({"metadata": {"name": "node-2"}, "spec": {}, "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}})
    s = KubernetesScheduler("t", client=cluster.client())
    resource = Resource(cpu=1, memMB=256) if limited else Resource(cpu=1, memMB=0)
    app_id = s.submit(AppDef("oom", [role(ATTEMPTS.replace("END", "1"), max_retries=1, resource=resource)]), CFG)
    killed: list[bool] = []
    retried_jobs: list[dict[str, object]] = []

    def oom_once(desc: object) -> None:
        pod = running_pod(cluster, 0)
        if not killed and pod is not None and "attempt 0" in "".join(s.log_iter(app_id, "w", 0)):
            killed.append(True)
            cluster.oom_kill(pod)
        retried_jobs[:] = first_retry_jobs(cluster)

    seen = looks(s, app_id, oom_once)
    assert seen[-1] == ("SUCCEEDED", ""), seen
    retry = next(m for _, m in seen if m.startswith("retrying after"))
    assert "exited with code 137 (OOMKilled" in retry, retry
    assert "attempt 1 1 'failed:137'" in "".join(s.log_iter(app_id, "w", 0))
    job: Any = retried_jobs[0]
    affinity = job["spec"]["template"]["spec"].get("affinity")
    final = s.describe(app_id)
    assert final is not None
    if case != "unlimited":
        assert "excluding" not in retry and affinity is None, (retry, affinity)
        assert "excluded_nodes" not in final.metadata
        if case == "last node":
            assert retry.endswith("; node(s) node-1 not excluded: no other Ready node"), retry
        return
    assert "the kernel's OOM killer on node node-1, the pod having no memory limit of its own" in retry, retry
    assert retry.endswith("; excluding node(s) node-1"), retry
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                            "values": ["node-1"]}]}]
    assert final.metadata["excluded_nodes"] == ("node-1: the kernel's OOM killer ended role 'w' replica 0 (attempt 0; "
                                                "no memory limit of its own: the node ran out)")


def test_requeue_on_time_limit_restarts_the_app_and_its_clock(cluster: FakeCluster) -> None:
    # 6 s a try: each try's replica (a Python start) must print its first line before its limit, on a loaded
    # machine too
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("rq", [role(ATTEMPTS.replace("END", "9"))]),
                      {**CFG, "time_limit": "6s", "requeue_on_time_limit": True, "max_preemptions": 1,
                       "warn_signal": "USR1", "warn_before": "1s", "grace_period": 1})
    seen = looks(s, app_id)
    state, msg = seen[-1]
    assert state == "FAILED" and msg == "time limit 6s reached (no preemptions left: max_preemptions=1)", seen
    assert any(m == "retrying after time limit 6s reached" for _, m in seen), seen
    log = "".join(s.log_iter(app_id, "w", 0))
    assert "attempt 0 0 ''" in log and "attempt 1 1 'time_limit'" in log, log


def test_manifests_carry_the_excluded_nodes_and_the_requeue_backstop() -> None:
    opts = KubernetesOptions.from_cfg({"exclude_nodes": "n1,n2", "time_limit": "1h", "requeue_on_time_limit": True,
                                       "max_preemptions": 5})
    app = AppDef("m", [role("pass", resource=Resource(cpu=1, memMB=64, capabilities={"zone": "a"}))])
    req = build_request(app, opts, "s", "/tmp", 0.0)
    pod = req.jobs[0]["spec"]["template"]["spec"]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n2"]}]}]
    assert pod["nodeSelector"] == {"zone": "a"}  # kept beside the term
    assert pod["activeDeadlineSeconds"] == 3600 + REQUEUE_BACKSTOP  # tsm requeues at the limit; this is a backstop
    assert (req.max_preemptions, req.requeue_on_time_limit, req.exclude_nodes) == (5, True, ["n1", "n2"])
    overlaid = with_excluded_nodes({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]}]}}}},
        ["n3"])
    terms = overlaid["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n3"]} in t["matchExpressions"]
               for t in terms)  # terms are ORed: each one keeps the node out
