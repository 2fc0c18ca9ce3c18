"""Slurm job arrays (issue 24): a sweep of single-role trials is one ``--array=0-(N-1)%P`` job.

Fast: the generated scripts (run with bash where it matters, with a stand-in for Slurm's task variables),
the parsing of array rows in squeue/sacct (JSON and text), and ``schedule_sweep`` with ``sbatch`` faked.
The real cluster runs the same in ``tests/integration/test_slurm_sweep.py``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from slurm_util import FakeSlurm, directives, sacct_line, squeue_line

from tsm.errors import InvalidRunOptionError, SubmissionError
from tsm.schedulers.common.quoting import shell_quote
from tsm.schedulers.slurm import SlurmQueries, SlurmScheduler, cli as slurm_cli
from tsm.schedulers.slurm.array import array_task_script, build_array_script
from tsm.schedulers.slurm.parse import array_tasks, id_key, parse_sacct_text, parse_squeue_text
from tsm.specs.api import AppDef, AppState, Resource, Role
from tsm.sweep.api import SweepNative

HOSTILE_DIR = "dir with 'quote' $HOME `x` ; rm"


def _app(name: str, *args: str, memMB: int = 200, roles: int = 1) -> AppDef:
    return AppDef(name, roles=[
        Role(f"r{i}", entrypoint="python", args=list(args), resource=Resource(cpu=1, memMB=memMB))
        for i in range(roles)
    ])  # fmt: skip


def _infos(s: SlurmScheduler, apps: list[AppDef]) -> list[Any]:
    return [s.submit_dryrun(a, {"slurm_version": "22.05"}) for a in apps]


# -- parsing ------------------------------------------------------------------------------------------------
#: ``squeue`` (the columns tsm asks for) of ``--array=0-5%2`` with tasks 0 and 1 running, and a plain job, as
#: Slurm 22.05 writes them: ``JobID`` is each job's own id, ``JobArrayID`` names the task.
SQUEUE_ARRAY = "".join([
    squeue_line(JobID=3429, JobArrayID="3428_0", HetJobID="N/A", State="RUNNING", Name="sw.trainer", WorkDir="/j/a"),
    squeue_line(JobID=3430, JobArrayID="3428_1", HetJobID="N/A", State="RUNNING", Name="sw.trainer", WorkDir="/j/a"),
    squeue_line(JobID=3428, JobArrayID="3428_[2-5%2]", HetJobID="N/A", State="PENDING", Reason="JobArrayTaskLimit",
                Name="sw.trainer", WorkDir="/j/a"),
    squeue_line(JobID=3176, JobArrayID="3176", HetJobID="N/A", State="PENDING", Name="plain.r"),
])  # fmt: skip

#: ``sacct`` of the same array once it ended (the last task keeps the array's own job id).
SACCT_ARRAY = "".join([
    sacct_line(JobIDRaw=3428, JobID="3428_5", State="COMPLETED", ExitCode="0:0", Submit=1795617597,
               Start=1795617606, End=1795617609, JobName="sw.trainer"),
    sacct_line(JobIDRaw=3429, JobID="3428_0", State="FAILED", ExitCode="1:0", Submit=1795617597, Start=1795617598,
               End=1795617601, JobName="sw.trainer"),
    sacct_line(JobIDRaw=3500, JobID="3500", State="COMPLETED", ExitCode="0:0", Submit=1, Start=2, End=3,
               JobName="plain.r"),
])  # fmt: skip


def test_array_task_strings_expand_to_every_task() -> None:
    assert array_tasks("2-5%2") == [2, 3, 4, 5]
    assert array_tasks("[0,3-9:2%4]") == [0, 3, 5, 7, 9]
    assert array_tasks("7") == [7]
    assert array_tasks("garbage") == []


def test_squeue_gives_each_array_task_its_own_app_id_and_expands_the_pending_row() -> None:
    found = parse_squeue_text(SQUEUE_ARRAY)
    assert sorted(found, key=id_key) == ["3176", "3428_0", "3428_1", "3428_2", "3428_3", "3428_4", "3428_5"]
    assert found["3428_0"][0].job_id == "3429" and found["3428_0"][0].state == AppState.RUNNING
    pending = found["3428_4"][0]
    assert (pending.state, pending.reason, pending.job_id) == (AppState.PENDING, "JobArrayTaskLimit", "3428")
    assert found["3176"][0].app_id == "3176"


def test_sacct_names_array_tasks_by_array_and_task() -> None:
    found = parse_sacct_text(SACCT_ARRAY)
    assert set(found) == {"3428_5", "3428_0", "3500"}
    assert found["3428_0"][0].state == AppState.FAILED
    assert (found["3428_5"][0].start_time, found["3428_5"][0].end_time) == (1795617606, 1795617609)
    sa = [sacct_line(JobIDRaw=42, JobID="40_0", State="COMPLETED", ExitCode="0:0"),
          sacct_line(JobIDRaw=40, JobID="40_[1-2]", State="PENDING"), sacct_line(JobIDRaw=43, JobID="43", State="FAILED")]
    found = parse_sacct_text("".join(sa))
    assert set(found) == {"40_0", "40_1", "40_2", "43"} and found["40_0"][0].state == AppState.SUCCEEDED


# -- scripts ------------------------------------------------------------------------------------------------
def test_slurm_declares_sweep_native() -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    assert isinstance(s, SweepNative)
    assert "SweepNative" in (SlurmScheduler.__doc__ or "")


def test_array_script_caps_the_array_and_keeps_the_trials_shared_directives(sched: SlurmScheduler) -> None:
    reqs = [i.request for i in _infos(sched, [_app(f"sw-{i}", "--lr", str(i)) for i in range(20)])]
    script = build_array_script([array_task_script(r.script) for r in reqs], "/jobs/sw-array", "sw.r0", 4)
    lines = directives(script)
    assert "#SBATCH --array=0-19%4" in lines
    assert "#SBATCH --output=/jobs/sw-array/%a/batch.out" in lines
    assert "#SBATCH --job-name=sw.r0" in lines
    assert "#SBATCH --mem=200M" in lines and "#SBATCH --cpus-per-task=1" in lines
    assert sum(1 for line in lines if line.startswith("#SBATCH --job-name")) == 1  # not each trial's
    assert '$SLURM_ARRAY_TASK_ID' in script


def test_trials_asking_for_different_resources_cannot_share_an_array(sched: SlurmScheduler) -> None:
    reqs = [i.request for i in _infos(sched, [_app("a"), _app("b", memMB=400)])]
    with pytest.raises(InvalidRunOptionError, match="trial 1"):
        build_array_script([r.script for r in reqs], "/jobs/x", "x.r0", 2)


def test_array_task_script_names_the_trial_by_array_and_task(sched: SlurmScheduler) -> None:
    req = _infos(sched, [_app("a")])[0].request
    task = array_task_script(req.script)
    assert 'export TSM_APP_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in task
    assert 'export TSM_APP_ID="$SLURM_JOB_ID"' not in task
    with pytest.raises(ValueError):
        array_task_script("#!/bin/bash\necho not ours\n")


def test_each_task_runs_its_own_trial_from_a_hostile_path(tmp_path: Path) -> None:
    """The array script, run by bash as Slurm would (only the task id set), runs trial i's script in its
    own directory, whatever characters the path holds."""
    links = tmp_path / HOSTILE_DIR / "sw-array"
    links.mkdir(parents=True)
    for i in range(3):
        trial = tmp_path / HOSTILE_DIR / f"trial {i}"
        trial.mkdir()
        (trial / "job.sbatch").write_text(f'echo "trial {i} in $(basename "$(pwd -P)")"\n')
        os.symlink(trial, links / str(i))
    script = build_array_script(["#!/bin/bash\n#SBATCH --mem=1M\n"] * 3, str(links), "sw.r", 2)
    (tmp_path / "array.sbatch").write_text(script)
    for i in range(3):
        out = subprocess.run(["bash", str(tmp_path / "array.sbatch")], capture_output=True, text=True,
                             env={**os.environ, "SLURM_ARRAY_TASK_ID": str(i)}, check=True)
        assert out.stdout == f"trial {i} in trial {i}\n"


# -- schedule_sweep -----------------------------------------------------------------------------------------
def test_schedule_sweep_submits_one_array_and_indexes_each_trial(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[list[str]] = []

    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, "900\n", "")

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    infos = _infos(s, [_app(f"sw-{i}", "--tag", f"it's {i}") for i in range(3)])
    assert s.accepts_sweep(infos)
    ids = s.schedule_sweep(infos, 2, "sw")
    assert ids == ["900_0", "900_1", "900_2"]
    assert len(calls) == 1 and calls[0][0] == "sbatch"
    array_script = Path(calls[0][-1])
    assert "#SBATCH --array=0-2%2" in array_script.read_text()
    for i, info in enumerate(infos):
        job_dir = Path(info.request.job_dir)
        assert (array_script.parent / str(i)).resolve() == job_dir.resolve()
        assert (job_dir / "job_id").read_text().strip() == f"900_{i}"
        assert shell_quote(f"it's {i}") in (job_dir / "job.sbatch").read_text()  # its own args, quoted
        assert s.local.where(f"900_{i}").job_dir == str(job_dir)
        assert oct((job_dir / "job.sbatch").stat().st_mode & 0o777) == "0o600"


def test_a_refused_array_leaves_no_files(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "sbatch: error: Batch job submission failed\n")

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    infos = _infos(s, [_app(f"sw-{i}") for i in range(2)])
    with pytest.raises(SubmissionError, match="refused"):
        s.schedule_sweep(infos, 1, "sw")
    for info in infos:
        assert not Path(info.request.job_dir).exists()
    assert not Path(infos[0].request.job_dir + "-array").exists()


def test_multi_role_trials_are_not_an_array(sched: SlurmScheduler) -> None:
    infos = _infos(sched, [_app("a", roles=2), _app("b", roles=2)])
    assert not sched.accepts_sweep(infos)
    with pytest.raises(SubmissionError):
        sched.schedule_sweep(infos, 1, "sw")


def test_trial_states_come_from_one_squeue(sched: SlurmScheduler) -> None:
    fake = FakeSlurm(squeue=SQUEUE_ARRAY, sacct="")
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=fake))
    states = s.trial_states(["3428_0", "3428_1", "3428_2", "3428_5"])
    assert {k: v.state for k, v in states.items()} == {
        "3428_0": AppState.RUNNING, "3428_1": AppState.RUNNING, "3428_2": AppState.PENDING,
        "3428_5": AppState.PENDING,
    }
    assert fake.count("squeue") == 1 and fake.count("sacct") == 0


def test_tasks_that_never_started_end_with_a_cancelled_array() -> None:
    """After ``scancel``, Slurm keeps the tasks that never started only as the array's own record (no task
    id, no task string): they are CANCELLED too, not left waiting for ever."""
    squeue = squeue_line(JobID=3563, JobArrayID="3562_0", State="CANCELLED") + squeue_line(
        JobID=3562, JobArrayID="3562", State="CANCELLED")
    assert set(parse_squeue_text(squeue)) == {"3562_0", "3562"}
    fake = FakeSlurm(squeue=squeue, sacct="")
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=fake))
    states = s.trial_states(["3562_0", "3562_1", "3562_2"])
    assert {k: v.state for k, v in states.items()} == dict.fromkeys(("3562_0", "3562_1", "3562_2"), AppState.CANCELLED)
    assert "never started" in states["3562_2"].msg
