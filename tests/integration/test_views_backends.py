"""The views' batch hooks against the real engines: a tick of Slurm, Docker, Kubernetes or Ray apps is one hook call.

Each test runs, through the runner (so the history holds them as ``tsm run`` would), an app of two sleeping
replicas and an app of three replicas where replica 1 fails with exit code 3, and checks that:

* a refresh makes exactly one ``view_snapshot`` call for the backend (:attr:`Snapshot.calls`), and the
  backend's own counter shows no per-replica (nor per-app status) call: one ``squeue`` (plus at most one
  ``sstat``), one container list, one pod list (plus at most one pod-metrics list), one job list;
* the failed replica is FAILED with its exit code and reason, the app FAILED naming it, and its siblings
  stopped because of it (not failed themselves);
* usage is measured where the backend offers it (Slurm ``sstat``, Docker stats), n/a for Ray.

Waiting loops have deadlines for hangs only; nothing asserts on time.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integration.docker_engine import PYTHON_IMAGE, DockerEngine, docker_engine
from integration.k8s_cluster import K8sCluster, k8s_cluster
from integration.ray_cluster import RayCluster, ray_cluster
from integration.slurm_cluster import SlurmCluster, slurm_cluster
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, Resource, Role
from tsm.views.snapshot import AppView, Snapshot, SnapshotCollector

pytestmark = [pytest.mark.integration]
__all__ = ["docker_engine", "k8s_cluster", "ray_cluster", "slurm_cluster"]

DEADLINE = 240.0
#: replica 1 says why and fails; the others sleep (and use some memory, so usage has something to show)
FAILING = ('import os, sys, time\nif os.environ["TSM_REPLICA_ID"] == "1":\n    time.sleep(2)\n'
           '    print("replica 1 gives up", flush=True)\n    sys.exit(3)\ntime.sleep(300)\n')
SLEEPING = "import time\nx = bytearray(20 * 2**20)\nt = time.time()\nwhile time.time() - t < 300:\n    sum(range(10000))\n"


def _apps(runner: Runner, scheduler: str, role: Callable[[str, str, int], Role]) -> tuple[str, str]:
    ok = runner.run(AppDef("vok", [role("w", SLEEPING, 2)]), scheduler)
    bad = runner.run(AppDef("vbad", [role("w", FAILING, 3)]), scheduler)
    return ok, bad


def _until(col: SnapshotCollector, ok: str, bad: str, done: Callable[[AppView, AppView], bool]) -> Snapshot:
    end = time.monotonic() + DEADLINE
    while True:
        snap = col.refresh()
        a, b = snap.app(ok), snap.app(bad)
        if a is not None and b is not None and done(a, b):
            return snap
        assert time.monotonic() < end, (snap.errors, a, b)
        time.sleep(1)


def _settled(a: AppView, b: AppView) -> bool:
    """The good app runs every replica and the bad one has failed, its siblings stopped."""
    return (a.state == "RUNNING" and all(r.state == "RUNNING" for r in a.replicas) and len(a.replicas) == 2
            and b.state == "FAILED" and len(b.replicas) == 3 and all(r.state != "RUNNING" for r in b.replicas))


def _check_failure(b: AppView, last_line: bool = True) -> None:
    failed = [r for r in b.replicas if r.state == "FAILED"]
    assert [(r.idx, r.exit_code) for r in failed] == [(1, 3)], b.replicas
    assert "3" in failed[0].error, failed[0]
    assert "1" in b.last_error, b.last_error
    assert all(r.state == "CANCELLED" for r in b.replicas if r.idx != 1), b.replicas
    if last_line:
        assert failed[0].last_line == "replica 1 gives up", failed[0]


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


@pytest.fixture
def path_with_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm jobs keep the submitter's environment: ``python3`` must be this venv's."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.slurm
def test_slurm_tick_is_one_squeue_and_one_sstat(slurm_cluster: SlurmCluster, path_with_venv: None) -> None:
    from tsm.schedulers import slurm

    small = Resource(cpu=1, gpu=0, memMB=128)
    with get_runner("views") as runner:
        ok, bad = _apps(runner, "slurm", lambda n, code, k: Role(n, entrypoint="python3", args=["-c", code],
                                                                 num_replicas=k, resource=small))
        try:
            col = SnapshotCollector(runner=runner)
            snap = _until(col, ok, bad, _settled)
            assert not snap.errors
            time.sleep(1.2)  # older than a shared squeue answer may be: the next refresh asks Slurm
            before = slurm.command_counts()
            snap = col.refresh()
            used = _delta(before, slurm.command_counts())
            assert snap.calls == {"store": 1, "slurm.view_snapshot": 1}, snap.calls
            # 2 apps, 5 replicas: one queue listing, one sstat for the running job's steps, nothing else
            assert used == {"squeue": 1, "sstat": 1}, used
            a, b = snap.app(ok), snap.app(bad)
            assert a is not None and b is not None
            assert all(r.host for r in a.replicas) and a.replicas[0].cpu_req == 1 and a.replicas[0].mem_req_mb == 128
            _check_failure(b)
            # the cluster gathers accounting (scripts/slurm-up): memory of the running replicas is measured
            snap = _until(col, ok, bad, lambda a, b: all(r.mem_used_mb is not None for r in a.replicas))
            a = snap.app(ok)
            assert a is not None and all(r.mem_used_mb and r.mem_used_mb > 10 for r in a.replicas), a.replicas
            snap = _until(col, ok, bad, lambda a, b: all(r.cpu_used is not None for r in a.replicas))
            b = snap.app(bad)
            assert b is not None and all(r.cpu_used is None for r in b.replicas)  # ended: n/a
            # an ended app is remembered: with only ended apps a tick asks Slurm nothing
            runner.cancel(ok)
            _until(col, ok, bad, lambda a, b: a.state == "CANCELLED" and all(r.state == "CANCELLED" for r in a.replicas))
            time.sleep(1.2)
            before = slurm.command_counts()
            col.refresh()
            assert _delta(before, slurm.command_counts()) == {}
        finally:
            runner.cancel(ok)


@pytest.mark.docker
def test_docker_tick_is_one_container_list(docker_engine: DockerEngine) -> None:
    with get_runner("views") as runner:
        ok, bad = _apps(runner, "docker", lambda n, code, k: Role(
            n, image=PYTHON_IMAGE, entrypoint="python3", args=["-c", code], num_replicas=k,
            resource=Resource(cpu=0.5, gpu=0, memMB=128)))
        sched: Any = runner._scheduler("docker")
        try:
            col = SnapshotCollector(runner=runner)
            snap = _until(col, ok, bad, _settled)
            assert not snap.errors
            time.sleep(0.5)  # older than a shared container list may be
            before = dict(sched.client.calls)
            snap = col.refresh()
            used = _delta(before, sched.client.calls)
            used.pop("stats", None)  # the sampler's background thread, off the refresh
            assert snap.calls == {"store": 1, "docker.view_snapshot": 1}, snap.calls
            assert used == {"list": 1}, used  # ended containers were inspected once, on an earlier tick
            b = snap.app(bad)
            assert b is not None
            _check_failure(b, last_line=False)
            a = snap.app(ok)
            assert a is not None and a.replicas[0].cpu_req == 0.5 and a.replicas[0].mem_req_mb == 128
            # usage from container stats, sampled in the background: two samples give a CPU rate
            snap = _until(col, ok, bad, lambda a, b: all(r.cpu_used is not None for r in a.replicas))
            a = snap.app(ok)
            assert a is not None and all(r.mem_used_mb and r.mem_used_mb > 10 for r in a.replicas), a.replicas
            assert all(r.cpu_used is not None and r.cpu_used > 0 for r in a.replicas), a.replicas
        finally:
            runner.cancel(ok)
            sched.cleanup(include_running=True, session="views")


@pytest.mark.kubernetes
def test_kubernetes_tick_is_one_pod_list(k8s_cluster: K8sCluster) -> None:
    cfg = {"request_fraction": 0.1, "gang_timeout": 120.0, "grace_period": 2}
    with get_runner("views") as runner:
        def role(n: str, code: str, k: int) -> Role:
            return Role(n, image=k8s_cluster.python_image, entrypoint="python3", args=["-c", code], num_replicas=k,
                        resource=Resource(cpu=0.5, gpu=0, memMB=128))

        ok = runner.run(AppDef("vok", [role("w", SLEEPING, 2)]), "kubernetes", cfg)
        bad = runner.run(AppDef("vbad", [role("w", FAILING, 3)]), "kubernetes", cfg)
        sched: Any = runner._scheduler("kubernetes")
        try:
            col = SnapshotCollector(runner=runner)
            snap = _until(col, ok, bad, _settled)
            assert not snap.errors
            before = dict(sched.client.calls)
            snap = col.refresh()
            used = _delta(before, sched.client.calls)
            assert snap.calls == {"store": 1, "kubernetes.view_snapshot": 1}, snap.calls
            # the ended app answers from its final status (its objects are deleted): no call for it
            assert used.get("list pods") == 1 and set(used) <= {"list pods", "list pod metrics"}, used
            assert all(n == 1 for n in used.values()), used
            b = snap.app(bad)
            assert b is not None
            _check_failure(b, last_line=False)
            a = snap.app(ok)
            assert a is not None and all(r.host for r in a.replicas), a.replicas  # each pod's IP
        finally:
            runner.cancel(ok)


@pytest.mark.ray
def test_ray_tick_is_one_job_list(ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    res = Resource(cpu=1, gpu=0, memMB=100)
    with get_runner("views") as runner:
        ok, bad = _apps(runner, "ray", lambda n, code, k: Role(n, entrypoint=sys.executable, args=["-c", code],
                                                               num_replicas=k, resource=res))
        sched: Any = runner._scheduler("ray")
        try:
            col = SnapshotCollector(runner=runner)
            snap = _until(col, ok, bad, _settled)
            assert not snap.errors
            client = sched.client()
            before = dict(client.calls)
            snap = col.refresh()
            used = _delta(before, client.calls)
            assert snap.calls == {"store": 1, "ray.view_snapshot": 1}, snap.calls
            # one job list; status records are read per app (never per replica), and only when due
            assert used.pop("list_jobs") == 1 and used.get("read", 0) <= 1 and not set(used) - {"read"}, used
            b = snap.app(bad)
            assert b is not None
            _check_failure(b, last_line=False)
            a = snap.app(ok)
            assert a is not None and all(r.host for r in a.replicas) and a.replicas[0].cpu_req == 1
            assert all(r.cpu_used is None and r.mem_used_mb is None for r in a.replicas)  # n/a for Ray
            before = dict(client.calls)
            for _ in range(3):
                col.refresh()
            used = _delta(before, client.calls)
            assert used.pop("list_jobs") == 3 and used.get("read", 0) <= 3 and not set(used) - {"read"}, used
        finally:
            runner.cancel(ok)

