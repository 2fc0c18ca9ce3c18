"""Run tracking on the real Slurm cluster: a Slurm job records metadata and an artifact, and launches a
child Slurm job from inside itself, which is recorded as its child (lineage both ways).

Uses a cluster that is already running (``scripts/slurm-up``, owned by the integration setup) and never
starts or stops it; skips without one (fails under ``CI=true``).
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.slurm_cluster import cluster_up, unavailable
from integration.tracker_attempts import PREEMPTED, assert_one_run_across_attempts, offline_wandb_env
from testutil import HANG
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, AppState, Resource, Role
from tsm.tracker.store import StoreTracker

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

PARENT = textwrap.dedent(
    """
    import sys
    from tsm.runner.api import get_runner
    from tsm.specs.api import AppDef, Resource, Role
    from tsm.tracker import AppRun

    run = AppRun.run_from_env()
    run.add_metadata(where="slurm", step=1)
    run.add_artifact("weights", "/shared/w.pt")
    code = "from tsm.tracker import AppRun; AppRun.run_from_env().add_metadata(where='slurm-child')"
    with get_runner() as runner:
        child = runner.run(
            AppDef("child", roles=[Role("child", entrypoint=sys.executable, args=["-c", code],
                                        resource=Resource(cpu=1, memMB=200))]),
            scheduler="slurm",
        )
        print("CHILD", child, flush=True)
        status = runner.wait(child, timeout=300)
        print("CHILD_STATE", status.state.name, flush=True)
    """
)


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    if not cluster_up():
        unavailable("no Slurm cluster is running")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for k in ("TSM_JOB_ID", "TORCHX_JOB_ID", "TSM_TRACKERS", "TORCHX_TRACKERS", "TSM_PARENT_RUN_ID", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    with get_runner() as r:
        yield r


def test_slurm_job_records_and_its_child_slurm_job_is_linked_both_ways(runner: Runner) -> None:
    app = AppDef("tparent", roles=[Role("tparent", entrypoint=sys.executable, args=["-c", PARENT],
                                        resource=Resource(cpu=1, memMB=200))])
    parent = runner.run(app, scheduler="slurm")
    child = None
    try:
        status = runner.wait(parent, timeout=HANG * 3)
        lines = [line.rstrip("\n") for line in runner.log_lines(parent, "tparent", 0)]
        assert status.state == AppState.SUCCEEDED, (status, lines)
        child = next(line.split()[1] for line in lines if line.startswith("CHILD "))
        assert "CHILD_STATE SUCCEEDED" in lines
    finally:
        runner.cancel(parent)
        if child:
            runner.cancel(child)
    tracker = StoreTracker()
    assert tracker.metadata(parent) == {"where": "slurm", "step": 1}
    assert tracker.artifacts(parent)["weights"].path == "/shared/w.pt"
    assert tracker.metadata(child) == {"where": "slurm-child"}
    assert [s.source_run_id for s in tracker.sources(child)] == [parent]
    assert list(tracker.children(parent)) == [child]


def test_a_preempted_slurm_replica_is_one_mlflow_run_and_one_wandb_id(
    runner: Runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_uri: str
) -> None:
    import subprocess
    import time

    monkeypatch.setenv("TSM_TRACKERS", "tsm,mlflow,wandb")
    monkeypatch.setenv("TSM_TRACKER_MLFLOW_CONFIG", mlflow_uri)
    out = tmp_path / "out"
    out.mkdir()
    wdir = tmp_path / "wandb"
    env = {"OUT": str(out), **offline_wandb_env(wdir)}
    wdir.mkdir()
    app = AppDef("tpreempt", roles=[Role("w", entrypoint=sys.executable, args=["-c", PREEMPTED], env=env, max_retries=0,
                                         resource=Resource(cpu=2, memMB=400))])
    handle = runner.run(app, scheduler="slurm", cfg={"partition": "low", "max_preemptions": 1})
    high: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while not (out / "attempt-0").exists():
            assert time.monotonic() < deadline, "the first attempt never logged"
            time.sleep(0.2)
        now = runner.status(handle)
        assert now is not None
        node = now.roles[0].replicas[0].hostname
        proc = subprocess.run(["sbatch", "--parsable", "--partition=high", f"--nodelist={node}", "--ntasks=1",
                               "--cpus-per-task=1", "--output=/dev/null", "--wrap=sleep 1"],
                              capture_output=True, text=True, check=True)
        high.append(proc.stdout.strip().split(";")[0])
        status = runner.wait(handle, timeout=HANG * 4)
    finally:
        runner.cancel(handle)
        if high:
            subprocess.run(["scancel", *high], capture_output=True, check=False)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    assert status.num_restarts == 1, status
    assert_one_run_across_attempts(mlflow_uri, handle, out, wdir)
