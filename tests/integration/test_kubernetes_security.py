"""Issue 29's Kubernetes items (and issue 30's durations and Ctrl-C noise) on the real cluster of ``scripts/k8s-up``.

The same cases run on the fake cluster in the fast suite (``tests/schedulers/kubernetes/test_kubernetes_controller.py``);
these are the final proof, on the API server and a kubelet on Docker.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.k8s_cluster import K8sCluster, kubectl
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import AppDef, AppState, Resource, Role

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

SECURITY = "Security"
HANG = 240.0
CFG: dict[str, Any] = {"request_fraction": 0.1, "gang_timeout": 120.0, "grace_period": 2}


@pytest.fixture
def sched(k8s_cluster: K8sCluster) -> Iterator[KubernetesScheduler]:
    s = KubernetesScheduler("isec")
    yield s
    s.cleanup(include_running=True)
    s.close()


def py(k8s: K8sCluster, name: str, code: str, **kw: Any) -> Role:
    return Role(name, image=k8s.python_image, entrypoint="python3", args=["-c", code],
                resource=Resource(cpu=1, memMB=200), **kw)


def get_json(*args: str) -> Any:
    out = kubectl("get", *args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.reliability(
    "Kubernetes env values live in a Secret per app, deleted with it (real cluster)",
    expect="the API server's Jobs hold no env value of a role; the app's Secret holds them and is deleted with the app",
    group=SECURITY,
)
def test_env_values_are_in_a_secret_deleted_with_the_app(sched: KubernetesScheduler, k8s_cluster: K8sCluster,
                                                         figure) -> None:  # type: ignore[no-untyped-def]
    token = "hunter2-" + os.urandom(4).hex()
    app = AppDef("sec", [py(k8s_cluster, "r", "import os, time; print(os.environ['TOKEN']); time.sleep(3)",
                            env={"TOKEN": token, "YES": "yes"})])
    app_id = sched.submit(app, CFG)
    jobs = get_json("jobs", "-l", f"tsm/app-id={app_id}")
    assert jobs["items"] and token not in json.dumps(jobs)
    secret = get_json("secret", app_id)
    assert secret["metadata"]["ownerReferences"][0]["name"] == app_id
    assert sched.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert "".join(sched.log_iter(app_id, "r", 0)) == token + "\n"
    left = kubectl("get", "secrets", "-l", f"tsm/app-id={app_id}", "-o", "name").stdout.split()
    figure("Secrets of the app left after it ended", len(left), "", limit=0)
    assert left == []


@pytest.mark.reliability(
    "Kubernetes list, cancel and cleanup touch only the caller's apps (real cluster)",
    expect="every object carries the owner label; another user's list, cancel and cleanup(include_running) leave the app running",
    group=SECURITY,
)
def test_another_owner_neither_sees_nor_deletes_the_app(sched: KubernetesScheduler, k8s_cluster: K8sCluster,
                                                        tmp_path: Path, tsm_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch, figure) -> None:  # type: ignore[no-untyped-def]
    app_id = sched.submit(AppDef("mine", [py(k8s_cluster, "r", "import time; time.sleep(600)")]), CFG)
    objs = get_json("jobs,services,secrets", "-l", f"tsm/app-id={app_id}")["items"]
    assert len(objs) == 3 and {o["metadata"]["labels"]["tsm/owner"] for o in objs} == {sched.client.owner}
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "mallory"))
    monkeypatch.setenv("TSM_OWNER", "mallory")
    mallory = KubernetesScheduler("isec")
    try:
        assert app_id not in [r.app_id for r in mallory.list()]
        mallory.cancel(app_id)
        assert app_id not in mallory.cleanup(include_running=True)
    finally:
        mallory.close()
    monkeypatch.setenv("TSM_HOME", str(tsm_home))
    monkeypatch.delenv("TSM_OWNER")
    still = get_json("jobs,services,secrets", "-l", f"tsm/app-id={app_id}")["items"]
    figure("objects of the app left by the other user", len(still), "")
    assert len(still) == 3
    sched.cancel(app_id)


@pytest.mark.reliability(
    "Kubernetes keeps an app's files private even in a world-readable $TSM_HOME (real cluster)",
    expect="with $TSM_HOME 0755 and umask 022: request, record, final status and log snapshots 0600, folders 0700",
    group=SECURITY,
)
def test_every_file_is_private_whatever_tsm_homes_mode(sched: KubernetesScheduler, k8s_cluster: K8sCluster,
                                                       tsm_home: Path, figure) -> None:  # type: ignore[no-untyped-def]
    tsm_home.chmod(0o755)
    old = os.umask(0o022)
    try:
        app_id = sched.submit(AppDef("priv", [py(k8s_cluster, "r", "print('out')", env={"TOKEN": "x"})]), CFG)
        assert sched.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    finally:
        os.umask(old)
    root = tsm_home / "kubernetes"
    paths = list(root.rglob("*"))
    assert {"request.json", "app.json", "final.json"} <= {p.name for p in paths}
    loose = [f"{p} {oct(stat.S_IMODE(p.stat().st_mode))}" for p in paths
             if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)]
    assert loose == [] and stat.S_IMODE(root.stat().st_mode) == 0o700
    figure("paths checked", len(paths), "")


def test_cancel_while_following_adds_no_runtime_error(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    """Issue 30 item 10: Ctrl-C of an attached run (a cancel) while its log is followed: only the replica's lines."""
    app_id = sched.submit(AppDef("follow", [py(k8s_cluster, "r", "import time\nprint('up', flush=True)\ntime.sleep(600)")]),
                          CFG)
    lines: list[str] = []
    t = threading.Thread(target=lambda: lines.extend(sched.log_iter(app_id, "r", 0, should_tail=True)), daemon=True)
    t.start()
    deadline = time.monotonic() + HANG
    while "up\n" not in lines:
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)
    sched.cancel(app_id)
    t.join(timeout=HANG)
    assert not t.is_alive() and lines == ["up\n"], lines


def test_an_ended_app_reports_when_it_started_and_ended(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    """Issue 30 item 4: a fixed DURATION for an ended app (started/ended not null) once its pods are deleted."""
    app_id = sched.submit(AppDef("timed", [py(k8s_cluster, "r", "import time; time.sleep(2)")]), CFG)
    assert sched.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    (view,) = sched.view_snapshot([app_id])
    assert view.started is not None and view.ended is not None and 1.0 <= view.ended - view.started < 60
