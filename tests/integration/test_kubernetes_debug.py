"""``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on the real cluster of ``scripts/k8s-up``, through its API.

The pods run ``tsm-test/python`` (busybox and python3, no py-spy): the first ``tsm stack`` writes this host's
py-spy into each pod through an exec's stdin.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from integration.debug_checks import check_all, debug_app, tsm
from integration.k8s_cluster import K8sCluster
from tsm.cli import _exits
from tsm.runner.api import Runner, get_runner

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

CFG: dict[str, Any] = {"request_fraction": 0.1, "gang_timeout": 120.0, "grace_period": 2}


@pytest.fixture
def runner(k8s_cluster: K8sCluster) -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def test_exec_stack_and_port_forward_reach_the_pod(runner: Runner, k8s_cluster: K8sCluster) -> None:
    handle = runner.run(debug_app(k8s_cluster.python_image), "kubernetes", CFG)
    try:
        check_all(runner, handle, stdin_eof=False)  # an API server before 1.30 cannot pass stdin's end
    finally:
        runner.cancel(handle)
    r = tsm("exec", f"{handle}/trainer/0", "--", "true")
    assert r.returncode == _exits.NOT_RUNNING and r.stderr.count("\n") == 1, r.stderr
