"""``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on the real Slurm cluster of ``scripts/slurm-up``: from
this machine, and over SSH (``-c ssh=``) through the real OpenSSH server of ``scripts/sshd-up``.

Each runs a step overlapping the app's job on the replica's node (``srun --overlap``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.debug_checks import check_all, check_exec, check_port_forward, debug_app, tsm, wait_ready
from tsm.cli import _exits
from tsm.runner.api import Runner, get_runner

from .conftest import SlurmCluster, SshServer

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


@pytest.fixture
def runner(slurm_cluster: SlurmCluster) -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def test_exec_stack_and_port_forward_reach_the_node(runner: Runner, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the replicas run in the submitting directory
    handle = runner.run(debug_app("", python=sys.executable), "slurm")
    try:
        check_all(runner, handle, cwd=os.fspath(tmp_path))
    finally:
        runner.cancel(handle)
    r = tsm("exec", f"{handle}/trainer/0", "--", "true")
    assert r.returncode == _exits.NOT_RUNNING and r.stderr.count("\n") == 1, r.stderr


def test_exec_and_port_forward_over_ssh(runner: Runner, ssh_server: SshServer) -> None:
    handle = runner.run(debug_app("", python="python3"), "slurm", ssh_server.cfg())
    try:
        wait_ready(runner, handle)
        check_exec(handle)
        check_port_forward(handle)
        r = tsm("stack", f"{handle}/trainer/1")  # py-spy is not installed for the remote user: one line says so
        assert r.returncode == 1 and r.stderr.count("\n") == 1
        assert "py-spy is not installed" in r.stderr and "tsm[debug]" in r.stderr, r.stderr
    finally:
        runner.cancel(handle)
