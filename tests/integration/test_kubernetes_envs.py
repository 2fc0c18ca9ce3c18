"""Lockfile environments on the real Kubernetes cluster: the same image layer as Docker, on the kubelet's engine.

Offline from a wheelhouse the test makes: two roles x two replicas run ``/opt/tsm-env/<key>/bin/python`` with
the package in it, and a second launch builds nothing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tsm
from envkit import make_wheel, uv_lock
from integration.k8s_cluster import K8sCluster
from tsm.env.build import EnvCache
from tsm.runner.api import get_runner
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import AppState, Resource

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

HANG = 300.0  # seconds: a guard against a hang, never a performance claim
SESSION = "k8senv"
PRINT = "import sys, tsmenvdemo; print(sys.executable, tsmenvdemo.__version__)"
SMALL = Resource(cpu=1, memMB=200)
CFG: dict[str, Any] = {"request_fraction": 0.1, "gang_timeout": 120.0, "grace_period": 2}


@pytest.fixture
def cluster(k8s_cluster: K8sCluster) -> Iterator[tuple[K8sCluster, list[str]]]:
    made: list[str] = []
    yield k8s_cluster, made
    s = KubernetesScheduler(SESSION)
    s.cleanup(include_running=True)
    s.close()
    for tag in made:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_two_roles_of_two_replicas_run_in_one_built_image(cluster: tuple[K8sCluster, list[str]], tsm_home: Path,
                                                          tmp_path: Path) -> None:
    k8s, made = cluster
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    lock = uv_lock(tmp_path / "proj", wheels, "tsmenvdemo==1.0")
    env = tsm.Environment(str(lock), python="3.11")
    app = tsm.AppDef("envs", roles=[
        tsm.Role(n, image=k8s.python_image, entrypoint="python", args=["-c", PRINT], num_replicas=2, resource=SMALL,
                 environment=env) for n in ("a", "b")
    ])
    with get_runner(SESSION) as runner:
        for attempt in range(2):
            info = runner.dryrun(app, "kubernetes", cfg={**CFG, "find_links": [str(wheels)]})
            tag = info.request.spec["roles"][0]["image"]
            made.append(tag)
            key = tag.rpartition(":")[2]
            assert f"{key} ({'not cached: built at submit' if attempt == 0 else 'cached'})" in str(info)
            handle = runner.schedule(info)
            status = runner.wait(handle, wait_interval=0.5, timeout=HANG)
            assert status is not None and status.state == AppState.SUCCEEDED, status
            lines = [ln.strip() for r in ("a", "b") for i in range(2) for ln in runner.log_lines(handle, r, i)]
            assert lines == [f"/opt/tsm-env/{key}/bin/python 1.0"] * 4, lines
    assert [b["key"] for b in EnvCache(tsm_home / "envs").builds()] == [key]
