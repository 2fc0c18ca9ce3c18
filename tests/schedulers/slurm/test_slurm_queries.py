"""The status batcher: many describe calls share one squeue; forgotten jobs go to sacct in one batch."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from slurm_util import DATA, JOBS, FakeSlurm

from tsm.errors import (
    SchedulerUnavailableError,
)
from tsm.schedulers.slurm import SlurmQueries, SlurmScheduler, sacct_args
from tsm.specs.api import AppDef, AppState, Role


def test_many_threads_share_one_squeue_call() -> None:
    fake = FakeSlurm(delay=0.05)
    q = SlurmQueries(runner=fake)
    ids = [JOBS[c] for c in ("running", "pending", "timeout")] * 34
    results: list[Any] = []
    threads = [threading.Thread(target=lambda i=i: results.append(q.job(i, max_age=5))) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 102 and all(results)
    assert fake.count("squeue") == 1
    assert fake.count("sacct") == 0


def test_a_job_just_submitted_is_never_looked_for_in_an_older_snapshot() -> None:
    fake = FakeSlurm(squeue="", sacct="")
    q = SlurmQueries(runner=fake)
    assert q.job(JOBS["running"], max_age=60) is None
    fake.squeue = (DATA / "squeue_22.05.txt").read_text()  # sbatch has run since
    q.submitted(JOBS["running"])
    recs = q.job(JOBS["running"], max_age=60)
    assert recs is not None and recs[0].state == AppState.RUNNING
    assert fake.count("squeue") == 2


def test_forgotten_jobs_go_to_sacct_in_one_batch_and_ended_ones_are_cached() -> None:
    fake = FakeSlurm(squeue="")
    q = SlurmQueries(runner=fake)
    first = q.job(JOBS["failed"], max_age=10)
    assert first is not None and first[0].state == AppState.FAILED
    assert fake.count("sacct") == 1
    assert fake.calls[-1] == sacct_args("-D", "-j", JOBS["failed"])
    for _ in range(5):
        assert q.job(JOBS["failed"], max_age=0) == first  # ended: cached for good
    assert fake.count("sacct") == 1 and fake.count("squeue") == 1
    assert q.job("999999", max_age=10) is None  # unknown to both


def test_sacct_batches_every_recently_wanted_id() -> None:
    fake = FakeSlurm(squeue="", sacct="")
    q = SlurmQueries(runner=fake)
    q.job("1001", max_age=0)
    q.job("1002", max_age=0)
    time.sleep(0.01)
    q._lookup_at.clear()  # as if both were last asked long ago
    q.job("1003", max_age=0)
    assert fake.calls[-1][-1] == "1001,1002,1003"


def test_no_accounting_is_not_an_error() -> None:
    def runner(args: list[str]) -> subprocess.CompletedProcess[str]:
        if "squeue" in args:
            return subprocess.CompletedProcess(args, 0, "", "")
        return subprocess.CompletedProcess(
            args, 1, "", "sacct: error: Slurm accounting storage is disabled\n"
        )

    q = SlurmQueries(runner=runner)
    assert q.job("5", max_age=0) is None
    assert q.sacct_available is False


def test_unreachable_controller_says_what_to_do() -> None:
    def runner(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            args, 1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
        )

    with pytest.raises(SchedulerUnavailableError, match="slurmctld"):
        SlurmQueries(runner=runner).job("5")


def test_missing_sbatch_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    s = SlurmScheduler("t")
    info = s.submit_dryrun(AppDef("x", [Role("w", entrypoint="true")]), {"job_dir": str(tmp_path / "j")})
    with pytest.raises(SchedulerUnavailableError, match="apt-get install slurm-client"):
        s.schedule(info)
    assert not (tmp_path / "j").exists()  # nothing submitted, nothing left behind
