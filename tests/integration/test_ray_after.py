"""``--after`` on a real Ray cluster: a job submitted only once its local dependency succeeded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from integration.after_checks import waits_for_local_apps
from integration.ray_cluster import RayCluster, ray_cluster  # noqa: F401 (the fixture test modules ask for)
from tsm.runner.api import get_runner
from tsm.specs.api import Resource, Role

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def test_a_ray_job_waits_for_local_apps_through_tsms_watcher(ray_cluster: RayCluster, tmp_path: Path) -> None:  # noqa: F811
    role = Role("r", entrypoint=sys.executable, args=["-c", "print('ran')"], resource=Resource(cpu=1, memMB=100))
    with get_runner("rayafter") as runner:
        waits_for_local_apps(runner, "ray", role, {"address": ray_cluster.address}, tmp_path)
