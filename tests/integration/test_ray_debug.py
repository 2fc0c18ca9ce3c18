"""``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on the real Ray head of ``scripts/ray-up`` (one node: this
machine, so exec and stack run here, beside the replica actors' processes)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from integration.debug_checks import check_all, debug_app, tsm
from integration.ray_cluster import RayCluster, ray_cluster  # noqa: F401 (the fixture)
from tsm.cli import _exits
from tsm.runner.api import Runner, get_runner

pytestmark = [pytest.mark.integration, pytest.mark.ray]


@pytest.fixture
def runner(ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:  # noqa: F811
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)  # for the tsm commands the checks run
    with get_runner() as r:
        yield r


def test_exec_stack_and_port_forward_reach_the_replica(runner: Runner, ray_cluster: RayCluster) -> None:  # noqa: F811
    handle = runner.run(debug_app("", python=sys.executable), "ray", {"address": ray_cluster.address})
    try:
        check_all(runner, handle)
    finally:
        runner.cancel(handle)
    r = tsm("exec", f"{handle}/trainer/0", "--", "true")
    assert r.returncode == _exits.NOT_RUNNING and r.stderr.count("\n") == 1, r.stderr
