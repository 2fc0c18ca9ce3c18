"""The Slurm views hook's pure parts: sstat's answer, Slurm durations and sizes, the CPU rate, and the batch
lookup of many jobs (one squeue, one sacct) behind it."""

from __future__ import annotations

import time

import pytest
from slurm_util import JOBS, FakeSlurm, RecordingHost, squeue_line

from tsm.schedulers.slurm import SlurmQueries, SlurmScheduler, cli as slurm_cli
from tsm.schedulers.slurm.host import Where
from tsm.schedulers.slurm.parse import SlurmJob
from tsm.schedulers.slurm.view import SlurmView, StepUsage, _Rate, cpu_seconds, mem_mb, parse_sstat
from tsm.specs.api import AppState

# what sstat -a --noheader --parsable2 -o JobID,NTasks,AveCPU,AveRSS,MaxRSS printed on scripts/slurm-up's cluster
SSTAT = "352.batch|1|00:00:00|10836K|10836K\n352.0|2|00:00:10|64614K|64628K\n353+1.0|1|1-00:00:01|1.5G|2G\n"


def test_sstat_steps_of_sruns_only() -> None:
    assert parse_sstat(SSTAT) == [
        StepUsage("352", "0", 2, 10.0, pytest.approx(64614 / 1024)),
        StepUsage("353+1", "0", 1, 86401.0, 1536.0),
    ]
    assert parse_sstat("garbage\n\n") == []


@pytest.mark.parametrize(("text", "secs"), [
    ("00:00:10", 10.0), ("01:02:03", 3723.0), ("02:03.500", 123.5), ("7.25", 7.25), ("2-00:00:00", 172800.0),
    ("", None), ("x:y", None), ("a-00:00:01", None),
])  # fmt: skip
def test_slurm_durations(text: str, secs: float | None) -> None:
    assert cpu_seconds(text) == secs


@pytest.mark.parametrize(("text", "mib"), [("2048K", 2.0), ("3M", 3.0), ("1.5G", 1536.0), ("1048576", 1.0),
                                           ("", None), ("12Q", None)])
def test_slurm_sizes(text: str, mib: float | None) -> None:
    assert mem_mb(text) == mib


def test_cpu_rate_is_held_between_accounting_samples_and_restarts_with_a_new_step() -> None:
    rate = _Rate()
    assert rate.update(10.0, 100.0) is None  # one figure: no rate yet
    assert rate.update(10.0, 101.0) is None
    assert rate.update(15.0, 105.0) == 1.0  # 5 CPU seconds in 5 s
    assert rate.update(15.0, 106.0) == 1.0  # Slurm has not refreshed: the rate is held
    assert rate.update(25.0, 110.0) == 1.5  # over the window: (25 - 10) / (110 - 100)
    assert rate.update(1.0, 111.0) is None  # lower: a new step (requeued job)


def test_many_jobs_cost_one_squeue_and_one_sacct() -> None:
    fake = FakeSlurm()
    q = SlurmQueries(runner=fake)
    ids = list(JOBS.values())
    got = q.jobs(ids, max_age=10)
    assert fake.count("squeue") == 1 and fake.count("sacct") <= 1
    assert got[JOBS["running"]][0].state == AppState.RUNNING
    assert got[JOBS["failed"]][0].state == AppState.FAILED
    for _ in range(3):  # within max_age, ended jobs remembered: nothing more is asked
        assert q.jobs(ids, max_age=10).keys() == got.keys()
    assert fake.count("squeue") == 1 and fake.count("sacct") <= 1


def test_jobs_the_controller_forgot_are_looked_up_together() -> None:
    fake = FakeSlurm(squeue="")
    q = SlurmQueries(runner=fake)
    got = q.jobs([JOBS["failed"], JOBS["completed"], "999999"], max_age=0)
    assert got[JOBS["failed"]][0].state == AppState.FAILED and "999999" not in got
    assert fake.count("sacct") == 1
    assert fake.calls[-1][-1] == ",".join(sorted([JOBS["failed"], JOBS["completed"], "999999"], key=int))
    q.jobs([JOBS["failed"], JOBS["completed"]], max_age=0)  # ended: cached for good
    assert fake.count("sacct") == 1


def test_a_view_requeues_a_stranded_app_where_it_runs(sched: SlurmScheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    """A heterogeneous app Slurm requeued in part (see ``test_a_look_requeues_the_components_slurm_left_behind_once``)
    is requeued whole by the view's look too: by the app's own login node for one submitted over SSH, never
    by a local ``scontrol`` (the same job id may name another job on this machine's cluster)."""
    local: list[list[str]] = []
    monkeypatch.setattr(slurm_cli, "run", lambda args, **_: local.append(args))
    recs = [SlurmJob(job_id=str(41 + k), app_id="41", offset=k, name=f"a.r{k}", states=[state], restarts=n)
            for k, (state, n) in enumerate([("PENDING", 1), ("FAILED", 0)])]  # fmt: skip
    login = RecordingHost()
    view = SlurmView(sched.where, sched.backend)
    view._view(Where("login-41", "41", login), recs, {})
    assert login.calls == [["scontrol", "requeue", "41"]] and local == []
    view._view(sched.local.where("41"), [SlurmJob(**{**r.__dict__, "restarts": r.restarts + 1}) for r in recs], {})
    assert local == [["scontrol", "requeue", "41"]]


def test_a_pending_job_has_not_started_whatever_start_slurm_expects() -> None:
    """Slurm's StartTime of a pending job is when it expects to start it (a ``--begin`` time, the backfill's
    estimate): the view and a sweep's trial say it has not started, and its duration counts from its
    submission, not 0.0s from a start in the future."""
    now = time.time()
    squeue = squeue_line(JobID=9100, JobArrayID="9100_3", HetJobID="N/A", State="PENDING", Reason="JobArrayTaskLimit",
                         SubmitTime=int(now - 60), StartTime=int(now + 3600), EndTime=int(now + 7200), Name="sw.r")
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(squeue=squeue, sacct="")))
    (view,) = s.view_snapshot(["9100_3"])
    assert view.started is None and (view.duration(now) or 0) >= 59
    assert s.trial_states(["9100_3"])["9100_3"].started is None
