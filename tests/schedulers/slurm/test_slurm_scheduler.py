"""The scheduler against captured answers: describe, wait, cancel, list, schedule, remove, logs, import cost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from slurm_util import JOBS, FakeSlurm, dryrun, squeue_with, two_role_app

from tsm.errors import (
    InvalidAppError,
    SubmissionError,
    UnknownAppError,
)
from tsm.schedulers.api import Stream
from tsm.schedulers.slurm import (
    SlurmQueries,
    SlurmScheduler,
    cli as slurm_cli,
)
from tsm.schedulers.slurm.cli import command_name
from tsm.schedulers.slurm.host import LocalHost
from tsm.specs.api import AppDef, AppState, Role

# -- describe / wait / cancel / list against captured answers ---------------------------------------------


def write_job_dir(s: SlurmScheduler, app: AppDef, app_id: str, tmp_path: Path) -> Path:
    """A job directory as schedule() leaves it, indexed under the test's TSM_HOME."""
    req = dryrun(s, app, {"job_dir": str(tmp_path / f"job-{app_id}")})
    job_dir = Path(req.job_dir)
    job_dir.mkdir()
    (job_dir / "app.json").write_text(req.app_json)
    for role in req.roles:
        (job_dir / role).mkdir()
    index = LocalHost.index()
    index.mkdir(parents=True, exist_ok=True)
    (index / app_id).write_text(str(job_dir) + "\n")
    return job_dir


def test_describe_failed_app_per_replica(tmp_path: Path) -> None:
    fake = FakeSlurm()
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=fake))
    app_id = JOBS["failed"]
    job_dir = write_job_dir(s, two_role_app(), app_id, tmp_path)
    (job_dir / "trainer" / "0.status").write_text("exited 143 1795275229 0 TERM\n")
    (job_dir / "trainer" / "1.status").write_text("exited 3 1795275229 0 -\n")
    (job_dir / "ps" / "0.status").write_text("running node4 1795275229 0\n")
    d = s.describe(app_id)
    assert d is not None
    assert d.state == AppState.FAILED
    assert "role 'trainer' replica 1 exited with code 3" in d.msg
    assert "NonZeroExitCode" in d.msg
    reps = {(r.role, r.id): r for rs in d.roles_statuses for r in rs.replicas}
    assert reps["trainer", 1].state == AppState.FAILED and reps["trainer", 1].exit_code == 3
    assert reps["trainer", 0].state == AppState.CANCELLED and "SIGTERM" in reps["trainer", 0].error_msg
    assert reps["ps", 0].state == AppState.CANCELLED and reps["ps", 0].hostname == "node4"
    assert reps["trainer", 1].hostname == "node2"  # from the node list: replica k is on the k-th node
    assert d.app is not None and d.app.roles[0].args == ["train.py", "--lr", "0.1"]


def test_describe_rebuilds_the_app_without_its_files(sched: SlurmScheduler) -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    d = s.describe(JOBS["running"])
    assert d is not None and d.state == AppState.RUNNING
    assert d.app is not None and d.app.name == "busy"
    assert [(r.name, r.num_replicas) for r in d.app.roles] == [("trainer", 2), ("ps", 1)]
    assert [len(rs.replicas) for rs in d.roles_statuses] == [2, 1]


def test_describe_pending_and_requeued(sched: SlurmScheduler) -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    pending = s.describe(JOBS["pending"])
    assert pending is not None and pending.state == AppState.PENDING and "Resources" in pending.msg
    requeued = s.describe(JOBS["requeued"])
    assert requeued is not None and requeued.state == AppState.PENDING and requeued.num_restarts == 1


def test_describe_unknown_and_malformed_ids() -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(sacct="")))
    assert s.describe("424242") is None
    assert s.describe("../etc") is None


def test_describe_from_the_sacct_record_after_squeue_forgot() -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(squeue="")))
    d = s.describe(JOBS["requeued"])
    assert d is not None and d.state == AppState.FAILED and d.num_restarts == 1
    assert "BeginTime" not in d.msg  # a stale pending reason is not shown for an ended job
    t = s.describe(JOBS["timeout"])
    assert t is not None and t.state == AppState.FAILED and t.msg.startswith("TIMEOUT")
    (rep,) = replicas_of(t)
    assert rep.state == AppState.FAILED and rep.error_msg.startswith("job ended by Slurm: TIMEOUT")


def replicas_of(desc: Any) -> list[Any]:
    return [r for rs in desc.roles_statuses for r in rs.replicas]


def test_wait_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    states = iter([AppState.PENDING] * 10 + [AppState.SUCCEEDED])

    def describe(app_id: str, max_age: float = 1.0) -> Any:
        from tsm.schedulers.api import DescribeAppResponse

        return DescribeAppResponse(app_id=app_id, state=next(states))

    monkeypatch.setattr(s, "describe", describe)
    d = s.wait("1")
    assert d is not None and d.state == AppState.SUCCEEDED
    assert sleeps[0] == 0.5
    assert all(b >= a for a, b in zip(sleeps, sleeps[1:], strict=False))
    assert max(sleeps) == 5.0


def test_cancel_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([
        subprocess.CompletedProcess(["scancel"], 0, "", ""),
        subprocess.CompletedProcess(["scancel"], 1, "", "scancel: error: Kill job error on job id 5: Job/step already completing or completed\n"),
        subprocess.CompletedProcess(["scancel"], 1, "", "scancel: error: Kill job error on job id 5: Invalid job id specified\n"),
    ])  # fmt: skip
    calls: list[list[str]] = []

    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return next(answers)

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    for _ in range(3):
        s.cancel("5")
    assert calls == [["scancel", "5"]] * 3
    s.cancel("not-a-job")  # never reaches scancel
    assert len(calls) == 3


def test_list_merges_queue_and_accounting_newest_first() -> None:
    s = SlurmScheduler("sess", queries_=SlurmQueries(runner=FakeSlurm()))
    rows = s.list()
    ids = [r.app_id for r in rows]
    assert JOBS["running"] in ids and JOBS["completed"] in ids
    assert len(ids) == len(set(ids))
    created = [r.created or 0 for r in rows]
    assert created == sorted(created, reverse=True)
    row = next(r for r in rows if r.app_id == JOBS["running"])
    assert (row.name, row.state, row.app_handle) == (
        "busy",
        AppState.RUNNING,
        f"slurm://sess/{JOBS['running']}",
    )


def test_list_asks_squeue_and_sacct_at_once() -> None:
    """A list waits for the slower of its two commands, not for both one after the other: each answers only
    once the other has been asked."""
    fake = FakeSlurm()
    asked = {"squeue": threading.Event(), "sacct": threading.Event()}

    def runner(args: list[str]) -> subprocess.CompletedProcess[str]:
        name = command_name(args)
        asked[name].set()
        other = "sacct" if name == "squeue" else "squeue"
        assert asked[other].wait(timeout=60), f"{name} answered before {other} was asked"
        return fake(args)

    rows = SlurmScheduler("sess", queries_=SlurmQueries(runner=runner)).list()
    assert JOBS["running"] in {r.app_id for r in rows} and fake.count("squeue") == fake.count("sacct") == 1


def test_schedule_writes_private_files_and_indexes_the_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.update(args=args, **kw)
        return subprocess.CompletedProcess(args, 0, "777;cluster\n", "")

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    info = s.submit_dryrun(two_role_app(), {"slurm_version": "22.05"})
    assert s.schedule(info) == "777"
    job_dir = Path(info.request.job_dir)
    assert seen["args"] == ["sbatch", "--parsable", str(job_dir / "job.sbatch")]
    assert seen["umask"] == 0o077
    assert (job_dir / "job.sbatch").read_text() == info.request.script
    assert (job_dir.stat().st_mode & 0o777) == 0o700
    assert (job_dir.parent.stat().st_mode & 0o777) == 0o700
    assert ((job_dir / "app.json").stat().st_mode & 0o777) == 0o600
    assert (LocalHost.index() / "777").read_text().strip() == str(job_dir)
    with pytest.raises(SubmissionError, match="already holds an app"):
        s.schedule(info)


def test_sbatch_refusal_is_a_submission_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            args,
            1,
            "",
            "sbatch: error: Batch job submission failed: Requested node configuration is not available\n",
        )

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    s = SlurmScheduler("t")
    with pytest.raises(SubmissionError, match="Requested node configuration is not available"):
        s.submit(two_role_app(), {"slurm_version": "22.05", "job_dir": str(tmp_path / "j")})


def test_remove_deletes_only_what_tsm_wrote(tmp_path: Path) -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    job_dir = write_job_dir(s, two_role_app(), "9002", tmp_path)
    for name in ("job.sbatch", "batch.out", "exit", "restarts", "trainer/0.stdout", "trainer/1.status",
                 "failures", "moves", "requeue_cause", "last_exit", "excluded", "stalled", "cancel"):
        (job_dir / name).write_text("x")
    (job_dir / "ps" / "mine.txt").write_text("user file")
    assert s.remove("9002") is True
    assert sorted(p.relative_to(job_dir).as_posix() for p in job_dir.rglob("*")) == ["ps", "ps/mine.txt"]
    assert not (LocalHost.index() / "9002").exists()
    assert s.remove("9002") is False  # nothing of ours is left


# -- logs ------------------------------------------------------------------------------------------------


def logs_app(tmp_path: Path) -> tuple[SlurmScheduler, Path]:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(squeue=squeue_with("9001"))))
    job_dir = write_job_dir(s, two_role_app(), "9001", tmp_path)
    (job_dir / "trainer" / "1.stdout").write_bytes(b"epoch 1\nloss 0.5\nepoch 2\nno newline at end")
    (job_dir / "trainer" / "1.stderr").write_bytes("warn é\n".encode())
    return s, job_dir


def test_log_iter_streams_and_regex(tmp_path: Path) -> None:
    s, _ = logs_app(tmp_path)
    out = list(s.log_iter("9001", "trainer", 1, streams=Stream.STDOUT))
    assert out == ["epoch 1\n", "loss 0.5\n", "epoch 2\n", "no newline at end"]
    assert list(s.log_iter("9001", "trainer", 1, streams=Stream.STDERR)) == ["warn é\n"]
    assert list(s.log_iter("9001", "trainer", 1, regex=r"^epoch")) == ["epoch 1\n", "epoch 2\n"]
    assert len(list(s.log_iter("9001", "trainer", 1))) == 5  # COMBINED: stdout then stderr
    assert list(s.log_iter("9001", "trainer", 0)) == []  # no output yet


def test_log_iter_found_from_another_directory_via_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, job_dir = logs_app(tmp_path)
    (LocalHost.index() / "9001").unlink()  # another TSM_HOME: only Slurm's WorkDir leads there
    squeue = squeue_with("9001", WorkDir=str(job_dir))
    s2 = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(squeue=squeue)))
    monkeypatch.chdir(tmp_path)
    assert list(s2.log_iter("9001", "trainer", 1, streams=Stream.STDERR)) == ["warn é\n"]


def test_log_iter_since_until_select_whole_files(tmp_path: Path) -> None:
    s, job_dir = logs_app(tmp_path)
    later = datetime.now() + timedelta(hours=1)
    assert list(s.log_iter("9001", "trainer", 1, since=later)) == []
    (job_dir / "trainer" / "1.status").write_text(f"running node2 {time.time():.0f} 0\n")
    assert list(s.log_iter("9001", "trainer", 1, until=datetime.now() - timedelta(hours=1))) == []
    assert len(list(s.log_iter("9001", "trainer", 1, since=datetime.now() - timedelta(hours=1)))) == 5


def test_log_iter_unknowns(tmp_path: Path) -> None:
    s, _ = logs_app(tmp_path)
    with pytest.raises(UnknownAppError, match="no role 'nope'"):
        list(s.log_iter("9001", "nope", 0))
    with pytest.raises(UnknownAppError, match="replicas 0..1"):
        list(s.log_iter("9001", "trainer", 2))
    s2 = SlurmScheduler(
        "t", queries_=SlurmQueries(runner=FakeSlurm(squeue="", sacct=""))
    )
    with pytest.raises(UnknownAppError):
        list(s2.log_iter("31337", "trainer", 0))


def test_log_follow_stops_when_the_replica_exits(tmp_path: Path) -> None:
    s, job_dir = logs_app(tmp_path)
    out_path = job_dir / "ps" / "0.stdout"
    status = job_dir / "ps" / "0.status"
    status.write_text("running node3 1 0\n")

    def writer() -> None:
        with open(out_path, "ab") as f:
            for i in range(5):
                f.write(f"tick {i}\n".encode())
                f.flush()
                time.sleep(0.1)
            f.write(b"partial")
        status.write_text("exited 0 2 0 -\n")

    t = threading.Thread(target=writer)
    t.start()
    start = time.monotonic()
    lines = list(s.log_iter("9001", "ps", 0, should_tail=True, streams=Stream.STDOUT))
    t.join()
    assert lines == [f"tick {i}\n" for i in range(5)] + ["partial"]
    assert time.monotonic() - start < 10


# -- import cost ---------------------------------------------------------------------------------------------


def test_import_tsm_does_not_load_the_slurm_module() -> None:
    code = textwrap.dedent(
        """
        import sys, tsm, tsm.schedulers
        tsm.schedulers.scheduler_names()
        assert "tsm.schedulers.slurm" not in sys.modules
        import tsm.schedulers.slurm
        heavy = {"requests", "yaml", "numpy", "torch", "asyncio"} & set(sys.modules)
        assert not heavy, heavy
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry_creates_the_slurm_scheduler() -> None:
    from tsm.schedulers import get_scheduler

    s = get_scheduler("slurm", "sess")
    assert isinstance(s, SlurmScheduler) and s.session_name == "sess" and s.backend == "slurm"


def test_replica_command_must_fit_arg_max_with_the_submitters_environment(
    sched: SlurmScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job keeps the submitter's environment, so a command that fits alone may not fit with it."""
    from tsm.specs.validate import exec_limit

    args = ["x" * 100_000] * (exec_limit() // 100_000 - 2)  # fits on its own (validation passes)
    app = AppDef("big", [Role("r", entrypoint="true", args=args)])
    dryrun(sched, app)
    for i in range(4):
        monkeypatch.setenv(f"TSM_TEST_BIG_{i}", "y" * 100_000)
    with pytest.raises(
        InvalidAppError, match=r"role 'r': the command line and environment take \d+ bytes.*ARG_MAX"
    ):
        dryrun(sched, app)
