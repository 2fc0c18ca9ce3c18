"""Helpers the Slurm unit tests share: captured answers, a two-role app, the dry run, a stand-in for Slurm."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import hostile
from tsm.schedulers.slurm import (
    SlurmBatchRequest,
    SlurmScheduler,
)
from tsm.specs.api import AppDef, Resource, Role

DATA = Path(__file__).resolve().parents[1] / "data"
JOBS = json.loads((DATA / "jobs_22.05.json").read_text())["apps"]

#: Arguments and env values a replica must receive exactly as given: the shared corpus (tests/hostile.py).
HOSTILE = hostile.args()
HOSTILE_ENV = hostile.env()


def two_role_app(**trainer: Any) -> AppDef:
    return AppDef(
        "hello",
        roles=[
            Role("trainer", entrypoint="python", args=["train.py", "--lr", "0.1"], num_replicas=2,
                 resource=Resource(cpu=2, memMB=1000), **trainer),
            Role("ps", entrypoint="echo", args=["ps"], num_replicas=1, resource=Resource(cpu=1, memMB=500)),
        ],
    )  # fmt: skip


def no_slurm(args: list[str]) -> subprocess.CompletedProcess[str]:
    raise AssertionError(f"unexpected Slurm command {args}")


def dryrun(s: SlurmScheduler, app: AppDef, cfg: dict[str, Any] | None = None) -> SlurmBatchRequest:
    cfg = {"slurm_version": "22.05", **(cfg or {})}
    req = s.submit_dryrun(app, cfg).request
    assert isinstance(req, SlurmBatchRequest)
    return req


def directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


class FakeSlurm:
    """Answers squeue/sacct from the captured JSON and counts the calls."""

    def __init__(self, squeue: str | None = None, sacct: str | None = None, delay: float = 0.0) -> None:
        self.squeue = squeue if squeue is not None else (DATA / "squeue_22.05.json").read_text()
        self.sacct = sacct if sacct is not None else (DATA / "sacct_22.05.json").read_text()
        self.calls: list[list[str]] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        with self.lock:
            self.calls.append(args)
        time.sleep(self.delay)
        if args[0] == "squeue":
            return subprocess.CompletedProcess(args, 0, self.squeue, "")
        if args[0] == "sacct":
            return subprocess.CompletedProcess(args, 0, self.sacct, "")
        raise AssertionError(args)

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)
