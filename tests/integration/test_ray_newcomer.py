"""Issue 30 (items 1, 3, 6, 10) and issue 29 (item 20) on the real Ray head (``scripts/ray-up``): the README's
``dist.ddp`` example run from a project directory with no workspace, ``-c address=`` against a bad
``$RAY_ADDRESS``, a role without a resource, no SDK chatter, and a log follow that streams."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from integration.ray_cluster import RayCluster, ray_cluster  # noqa: F401 (fixture)
from tsm.schedulers.ray import create_scheduler
from tsm.specs.api import AppDef, AppState, Role

pytestmark = [pytest.mark.integration, pytest.mark.ray]
TSM = os.path.join(os.path.dirname(sys.executable), "tsm")

TRAIN = textwrap.dedent("""\
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    print("rank", dist.get_rank(), "sum", t.item(), flush=True)
    dist.destroy_process_group()
""")


@pytest.fixture
def project(tmp_path: Path, tsm_home: Path) -> Path:
    """A project directory holding train.py (``$TSM_HOME`` lies elsewhere)."""
    proj = tmp_path / "project"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN)
    return proj


@pytest.mark.torch
def test_readme_ddp_example_runs_without_a_workspace_and_c_address_wins(
    ray_cluster: RayCluster, project: Path  # noqa: F811
) -> None:
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:9"}  # a bad $RAY_ADDRESS; -c address is good
    out = subprocess.run([TSM, "run", "-s", "ray", "-c", f"address={ray_cluster.address},placement_strategy=PACK",
                          "dist.ddp", "-j", "2x1", "--script", "train.py"],
                         capture_output=True, text=True, cwd=project, env=env, timeout=400)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "State: SUCCEEDED" in out.stderr, out.stderr
    assert "rank 0 sum 3.0" in out.stdout and "rank 1 sum 3.0" in out.stdout  # replicas ran train.py from here
    assert "INFO" not in out.stderr and "already exists" not in out.stderr  # no Ray SDK chatter


def test_role_without_resource_runs(ray_cluster: RayCluster, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from tsm.runner.api import get_runner

    monkeypatch.chdir(project)
    with get_runner("it") as runner:
        handle = runner.run(AppDef("plain", [Role("hello", entrypoint="echo", args=["hi"])]), "ray",
                            cfg={"address": ray_cluster.address})
        d = runner.wait(handle, timeout=300)
    assert d is not None and d.state == AppState.SUCCEEDED


def test_log_follow_streams_instead_of_downloading_the_file_again(
    ray_cluster: RayCluster, project: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.chdir(project)
    sched = create_scheduler("it", address=ray_cluster.address)
    app = AppDef("ticker", [Role("w", entrypoint="bash",
                                 args=["-c", "for i in $(seq 1 8); do echo tick $i; sleep 0.5; done"])])
    app_id = sched.submit(app, {})
    client = sched.client(ray_cluster.address)
    whole_reads: list[str] = []
    real_read = client.read

    def read(node: str, filename: str) -> Any:
        if filename.endswith(".log"):
            whole_reads.append(filename)
        return real_read(node, filename)

    monkeypatch.setattr(client, "read", read)
    lines = list(sched.log_iter(app_id, "w", 0, should_tail=True))
    assert lines == [f"tick {i}\n" for i in range(1, 9)]
    # the followed attempt was streamed: at most one whole read of its file, for what the stream had not sent
    assert len(whole_reads) <= 1, whole_reads
    assert sched.wait(app_id, timeout=60).state == AppState.SUCCEEDED  # type: ignore[union-attr]
