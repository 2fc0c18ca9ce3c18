"""``tsm.schedulers.common.replica_tools``, what ``tsm exec``/``tsm stack`` run on a replica's node (Slurm,
Ray), run here on a real process that carries a replica's ``TSM_*`` environment (on the cluster:
tests/integration/test_slurm_debug.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.schedulers.common.pyspy import local_pyspy
from tsm.schedulers.common.replica_tools import source
from tsm.schedulers.slurm.debug import _SRUN_EXIT

TOOLS = [sys.executable, "-I", "-c", source()]


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Path]:
    """A process of replica trainer/1 of app 4242, blocked in a named function, in ``tmp_path``."""
    ready = tmp_path / "ready"
    code = f"import time\ndef waiting_in_the_replica():\n    open({str(ready)!r}, 'w').close()\n    time.sleep(600)\nwaiting_in_the_replica()\n"
    env = {**os.environ, "TSM_APP_ID": "4242", "TSM_ROLE_NAME": "trainer", "TSM_REPLICA_ID": "1", "ONLY_HERE": "x y"}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 60  # a hang guard only
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        yield tmp_path
    finally:
        proc.kill()
        proc.wait()


def test_exec_takes_the_replicas_cwd_and_environment(replica: Path) -> None:
    r = subprocess.run([*TOOLS, "exec", "4242", "trainer", "1", "sh", "-c", 'echo "$ONLY_HERE|$TSM_REPLICA_ID"; pwd; exit 4',
                        ], capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert r.returncode == 4, r.stderr
    assert r.stdout.splitlines() == ["x y|1", str(replica)]


def test_no_such_replica_here_is_one_line_and_exit_3(replica: Path) -> None:
    r = subprocess.run([*TOOLS, "exec", "4242", "trainer", "0", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "trainer/0 of 4242" in r.stderr


def test_dump_runs_pyspy_on_the_replicas_python_processes(replica: Path) -> None:
    exe = local_pyspy()
    assert exe is not None, "make test installs py-spy (the test extra includes tsm[debug])"
    r = subprocess.run([*TOOLS, "dump", "4242", "trainer", "1", "0", exe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    assert row["code"] == 0, row["err"]
    frames = [f["name"] for t in json.loads(row["out"]) for f in t["frames"]]
    assert "waiting_in_the_replica" in frames


def test_only_sruns_exit_code_line_is_filtered() -> None:
    assert _SRUN_EXIT.match("srun: error: node1: task 0: Exited with exit code 5")
    assert not _SRUN_EXIT.match("srun: error: Unable to create step for job 12: Invalid job id specified")
