"""Functions as jobs on the real engines: a function across 2 replicas returns every rank's result on Slurm,
Docker and Ray (Kubernetes: test_functions_kubernetes.py; local: tests/functions), and on Slurm a
Checkpointable function is warned, preempted by a job of the high partition, requeued, and resumes from its
checkpoint.

Each engine runs one small job (two on Slurm). On Docker the replicas run the functions image (the test
Python image plus tsm and cloudpickle, :mod:`integration.functions_image`) and the outcome comes back in each
container's output; on Slurm through the job's directory; on Ray through Ray's log channel. Functions are
defined inside the tests, so cloudpickle sends them by value (the containers do not have this module).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from integration.test_slurm_lifecycle import high_jobs as high_jobs  # the high-priority jobs a test submits
from tsm import Resource, get_runner
from tsm.functions import Call, Checkpointable, environment

pytestmark = pytest.mark.integration

WAIT = 600.0
#: the CPUs each node of scripts/slurm-up has: a job asking for them all holds its node alone
NODE_CPUS = 2


def ranks() -> Any:
    def where(tag: str) -> tuple[str, int, int]:
        env = environment()
        return tag, env.rank, env.world_size

    return where


def wait_fifo(path: Path, timeout: float) -> str:
    """What a job writes into the FIFO ``path``: the event that it runs (or TimeoutError). Opened read-write, so
    the wait is for data, not for a writer (Linux)."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        got = b""
        while not got.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError(f"nothing came through {path} in {timeout:g} s")
            got += os.read(fd, 4096)
        return got.decode().strip()
    finally:
        os.close(fd)


@pytest.mark.slurm
def test_two_ranks_on_slurm(slurm_cluster: object) -> None:
    with get_runner("fnit") as runner:
        job = runner.submit(ranks(), "slurm", replicas=2, scheduler="slurm", resource=Resource(cpu=1, memMB=200))
        assert job.result(WAIT) == [("slurm", 0, 2), ("slurm", 1, 2)]
        runner.delete(job.handle)


@pytest.mark.docker
def test_two_ranks_on_docker(docker_engine: Any) -> None:
    from integration.functions_image import functions_image

    with get_runner("fnit") as runner:
        job = runner.submit(ranks(), "docker", replicas=2, scheduler="docker",
                            image=functions_image(docker_engine.python_image))
        assert job.result(WAIT) == [("docker", 0, 2), ("docker", 1, 2)]
        runner.delete(job.handle)


@pytest.mark.ray
def test_two_ranks_on_ray(ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with get_runner("fnit") as runner:
        job = runner.submit(ranks(), "ray", replicas=2, scheduler="ray", address=ray_cluster.address, ship_cwd=False)
        assert job.result(WAIT) == [("ray", 0, 2), ("ray", 1, 2)]
        runner.delete(job.handle)


class Preemptible(Checkpointable):
    """Says it started through a FIFO, then waits; warned, it checkpoints; resumed, it says what it kept."""

    def __init__(self) -> None:
        self.kept: str | None = None

    def __call__(self, fifo: str) -> tuple[str, str, int]:
        if self.kept is not None:
            return "resumed", self.kept, environment().attempt
        with open(fifo, "w") as f:
            f.write("started\n")
        while True:
            signal.pause()  # the warning's handler checkpoints; the preemption then stops this attempt

    def checkpoint(self, fifo: str) -> Call:
        self.kept = f"checkpoint of attempt {environment().attempt}"
        return Call(self, fifo)


@pytest.mark.slurm
def test_a_checkpointable_function_preempted_on_slurm_resumes_from_its_checkpoint(
    slurm_cluster: object, tmp_path: Path, high_jobs: list[str]
) -> None:
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    with get_runner("fnit") as runner:
        job = runner.submit(Preemptible(), str(fifo), scheduler="slurm", partition="low",
                            resource=Resource(cpu=NODE_CPUS, memMB=200), warn_signal="USR1", warn_before="60s",
                            max_preemptions=1)
        try:
            assert wait_fifo(fifo, WAIT) == "started"
            status = job.status()
            assert status is not None
            node = status.roles[0].replicas[0].hostname
            proc = subprocess.run(["sbatch", "--parsable", "--partition=high", f"--nodelist={node}", "--ntasks=1",
                                   "--cpus-per-task=1", "--output=/dev/null", "--wrap=sleep 1"],
                                  capture_output=True, text=True, check=True)
            high_jobs.append(proc.stdout.strip().split(";")[0])
            assert job.result(WAIT) == ("resumed", "checkpoint of attempt 0", 1)
        finally:
            job.cancel()
        final = job.final_status()
        assert final is not None and final.num_restarts == 1
        runner.delete(job.handle)
