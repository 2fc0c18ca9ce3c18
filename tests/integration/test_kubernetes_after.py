"""``--after`` on the real Kubernetes cluster: a Job created only once its local dependency succeeded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.after_checks import waits_for_local_apps
from integration.k8s_cluster import K8sCluster
from tsm.runner.api import get_runner
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import Resource, Role

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

SESSION = "k8safter"
CFG: dict[str, Any] = {"request_fraction": 0.1, "gang_timeout": 120.0, "grace_period": 2}


@pytest.fixture
def cluster(k8s_cluster: K8sCluster) -> Iterator[K8sCluster]:
    yield k8s_cluster
    s = KubernetesScheduler(SESSION)
    s.cleanup(include_running=True)
    s.close()


def test_a_kubernetes_job_waits_for_local_apps_through_tsms_watcher(cluster: K8sCluster, tmp_path: Path) -> None:
    role = Role("r", image=cluster.python_image, entrypoint="python3", args=["-c", "print('ran')"],
                resource=Resource(cpu=1, memMB=200))
    with get_runner(SESSION) as runner:
        waits_for_local_apps(runner, "kubernetes", role, CFG, tmp_path)
