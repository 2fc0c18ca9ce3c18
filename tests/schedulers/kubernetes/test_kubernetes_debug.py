"""The Kubernetes exec, stack and port-forward on the fake cluster: finding the replica's pod (the streams
themselves need a real API server: tests/integration/test_kubernetes_debug.py)."""

from __future__ import annotations

import sys

import pytest

from schedulers.kubernetes.fake_kube import FakeCluster
from tsm.errors import ReplicaNotRunningError
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import AppDef, AppState, Role


def test_a_replica_whose_pod_ended_is_not_running_for_exec_stack_and_port_forward(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("done", [Role("w", image="fake/python", entrypoint=sys.executable, args=["-c", "pass"])]),
                      {"dns": "yes"})
    final = s.wait(app_id, timeout=60)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    with pytest.raises(ReplicaNotRunningError, match=rf"replica w/0 of {app_id} (is not running|has no pod)"):
        s.exec_in_replica(app_id, "w", 0, ["true"])
    with pytest.raises(ReplicaNotRunningError, match=rf"replica w/0 of {app_id}"):
        s.connect_replica_port(app_id, "w", 0, 80)
    with pytest.raises(ReplicaNotRunningError, match=r"replica w/1 of .* has no pod yet"):
        s.exec_in_replica(app_id, "w", 1, ["true"])
