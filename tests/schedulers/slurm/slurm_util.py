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
    SlurmQueries,
    SlurmScheduler,
)
from tsm.schedulers.slurm.cli import command_name
from tsm.schedulers.slurm.host import LocalHost
from tsm.schedulers.slurm.parse import SACCT_FIELDS, SEP, SQUEUE_FIELDS
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


def squeue_line(**fields: object) -> str:
    """One line of ``squeue`` in the columns tsm asks for (:data:`SQUEUE_FIELDS`; the others empty)."""
    return "".join(f"{fields.get(k, '')}{SEP}" for k in SQUEUE_FIELDS) + "\n"


def sacct_line(**fields: object) -> str:
    """One line of ``sacct`` in the columns tsm asks for (:data:`SACCT_FIELDS`; the others empty)."""
    return SEP.join(str(fields.get(k, "")) for k in SACCT_FIELDS) + "\n"


def captured_squeue() -> str:
    return (DATA / "squeue_22.05.txt").read_text()


def squeue_with(app_id: str, like: str = JOBS["timeout"], **fields: object) -> str:
    """The captured squeue answer plus a job ``app_id``: a copy of the real record of job ``like``."""
    text = captured_squeue()
    line = next(ln for ln in text.splitlines() if ln.split(SEP)[0] == like)
    rec = dict(zip(SQUEUE_FIELDS, line.split(SEP), strict=False))
    rec.update(JobID=app_id, HetJobID="0", HetJobOffset="0", **{k: str(v) for k, v in fields.items()})
    return text + squeue_line(**rec)


class FakeSlurm:
    """Answers squeue/sacct from the captured answers and counts the calls (by the command they run)."""

    def __init__(self, squeue: str | None = None, sacct: str | None = None, delay: float = 0.0) -> None:
        self.squeue = squeue if squeue is not None else captured_squeue()
        self.sacct = sacct if sacct is not None else (DATA / "sacct_22.05.txt").read_text()
        self.calls: list[list[str]] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        with self.lock:
            self.calls.append(args)
        time.sleep(self.delay)
        if command_name(args) == "squeue":
            return subprocess.CompletedProcess(args, 0, self.squeue, "")
        if command_name(args) == "sacct":
            return subprocess.CompletedProcess(args, 0, self.sacct, "")
        raise AssertionError(args)

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if command_name(c) == name)


class RecordingHost(LocalHost):
    """A fake login node for the code that only runs Slurm commands on an app's host: records each command."""

    def __init__(self) -> None:
        super().__init__(SlurmQueries(runner=no_slurm))
        self.calls: list[list[str]] = []

    def run(self, args: list[str], *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")
