"""The Snapshot over a real Slurm cluster: one ``squeue`` (and one ``sstat``) per refresh, however many apps and replicas."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.slurm_cluster import SlurmCluster, slurm_cluster
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, Resource, Role
from tsm.views.snapshot import SnapshotCollector

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
__all__ = ["slurm_cluster"]


@pytest.fixture
def runner(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    with get_runner("views") as r:
        yield r


def test_slurm_apps_refresh_with_one_squeue_per_tick(runner: Runner) -> None:
    from tsm.schedulers import slurm

    small = Resource(cpu=1, gpu=0, memMB=64)
    handles = [runner.run(AppDef(f"sl{i}", [Role("w", entrypoint="sleep", args=["60"], num_replicas=2,
                                                  resource=small)]), "slurm") for i in range(4)]
    try:
        col = SnapshotCollector(runner=runner)
        deadline = time.monotonic() + 120
        while True:
            snap = col.refresh()
            apps = [snap.app(h) for h in handles]
            if all(a is not None and a.state == "RUNNING" and len(a.replicas) == 2 for a in apps):
                break
            assert time.monotonic() < deadline, [a.state if a else None for a in apps]
            time.sleep(1)
        assert all(r.host for a in apps if a for r in a.replicas)
        time.sleep(1.5)  # older than the shared squeue answer may be: the next refresh asks Slurm again
        before = slurm.command_counts()
        snap = col.refresh()
        after = slurm.command_counts()
        used = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
        assert used.get("squeue", 0) == 1, used  # 4 apps, 8 replicas: one queue listing
        assert used.get("sacct", 0) == 0 and used.get("sstat", 0) <= 1, used  # sstat: usage of all 4 jobs
        assert set(used) <= {"squeue", "sstat"}, used
        assert snap.calls == {"store": 1, "slurm.view_snapshot": 1}, snap.calls  # the batch hook, once
    finally:
        for h in handles:
            runner.cancel(h)
