"""The directory workspace on the real Slurm cluster (``scripts/slurm-up``, owned by the integration setup).

These tests use a cluster that is already running and never start or stop it; without one they skip
(under ``CI=true`` they fail, as every integration test does).
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.slurm_cluster import cluster_up, unavailable
from testutil import HANG, wait_until
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, AppState, Resource, Role
from tsm.workspace import DirWorkspace, apply_workspace

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

SMALL = Resource(cpu=1, memMB=200)

JOB = textwrap.dedent(
    """
    import os, sys, time
    go = sys.argv[1]
    open(go + ".started", "w").close()
    while not os.path.exists(go):
        time.sleep(0.05)
    import mod
    print("cwd", os.getcwd(), "mod", mod.X, flush=True)
    """
)


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    if not cluster_up():
        unavailable("no Slurm cluster is running")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    with get_runner() as r:
        yield r


def test_slurm_job_runs_in_the_snapshot_and_ignores_edits_after_submit(runner: Runner, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_text(JOB)
    (ws / "mod.py").write_text("X = 1\n")
    old = time.time() - 10
    for p in ws.iterdir():
        os.utime(p, (old, old))
    go = tmp_path / "go"
    app = AppDef("wsslurm", roles=[Role("main", entrypoint=sys.executable, args=["main.py", str(go)], resource=SMALL)])
    report = apply_workspace(app, str(ws))
    assert report is not None
    handle = runner.run(app, scheduler="slurm")
    try:
        wait_until(lambda: Path(str(go) + ".started").exists(), "the Slurm job to start", timeout=HANG)
        (ws / "mod.py").write_text("X = 'edited'\n")
        go.touch()
        status = runner.wait(handle, timeout=HANG)
    finally:
        runner.cancel(handle)  # only this test's job; idempotent once it ended
    lines = [line.rstrip("\n") for line in runner.log_lines(handle, "main", 0)]
    assert status.state == AppState.SUCCEEDED, (status, lines)
    assert f"cwd {report.snapshot} mod 1" in lines
    # the edited tree is a new snapshot of one copied file; the old one is untouched
    again = DirWorkspace().build(ws)
    assert again.snapshot != report.snapshot and again.files_copied == 1
