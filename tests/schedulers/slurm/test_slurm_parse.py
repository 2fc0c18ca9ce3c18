"""Reading Slurm's answers: squeue/sacct in the columns tsm asks for (22.05 as captured from the real cluster
by ``data/capture_slurm_data.py``), state names, host lists and replica status files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from slurm_util import DATA, JOBS, squeue_line

from tsm.schedulers.slurm import (
    SQUEUE_ARGS,
    expand_hostlist,
    parse_sacct_text,
    parse_squeue_text,
    read_status,
    sacct_args,
    slurm_state,
)
from tsm.specs.api import AppState

# -- parsing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "state"),
    [
        ("PENDING", AppState.PENDING),
        ("REQUEUED", AppState.PENDING),
        ("SUSPENDED", AppState.PENDING),
        ("CONFIGURING", AppState.PENDING),
        ("RUNNING", AppState.RUNNING),
        ("COMPLETING", AppState.RUNNING),
        ("COMPLETED", AppState.SUCCEEDED),
        ("FAILED", AppState.FAILED),
        ("CANCELLED", AppState.CANCELLED),
        ("CANCELLED by 0", AppState.CANCELLED),
        ("TIMEOUT", AppState.FAILED),
        ("PREEMPTED", AppState.FAILED),
        ("NODE_FAIL", AppState.FAILED),
        ("OUT_OF_MEMORY", AppState.FAILED),
        ("BOOT_FAIL", AppState.FAILED),
        ("DEADLINE", AppState.FAILED),
        ("WHATEVER", AppState.UNKNOWN),
        (["RUNNING"], AppState.RUNNING),
        (["COMPLETED", "COMPLETING"], AppState.RUNNING),
        (["PENDING", "REQUEUED"], AppState.PENDING),
        (["FAILED", "REQUEUED"], AppState.PENDING),
        (["CANCELLED"], AppState.CANCELLED),
        ([], AppState.UNKNOWN),
    ],
)
def test_state_mapping(names: Any, state: AppState) -> None:
    assert slurm_state(names) == state


SQUEUE_EXPECTED = {
    "completed": (AppState.SUCCEEDED, ["ok.trainer", "ok.ps"], "node[1-2]"),
    "failed": (AppState.FAILED, ["bad.trainer", "bad.ps"], "node[1-2]"),
    "requeued": (AppState.PENDING, ["retry.w"], ""),
    "timeout": (AppState.RUNNING, ["slow.w"], "node4"),
    "cancelled": (AppState.CANCELLED, ["stop.w"], "node[1-2]"),
    "running": (AppState.RUNNING, ["busy.trainer", "busy.ps"], "node[1-2]"),
    "pending": (AppState.PENDING, ["big.w"], ""),
}


def test_parse_squeue() -> None:
    jobs = parse_squeue_text((DATA / "squeue_22.05.txt").read_text())
    for case, (state, names, nodes) in SQUEUE_EXPECTED.items():
        recs = jobs[JOBS[case]]
        assert [r.name for r in recs] == names, case
        assert [r.offset for r in recs] == list(range(len(names)))
        assert recs[0].state == state, case
        assert recs[0].nodes == nodes
    failed = jobs[JOBS["failed"]][0]
    assert (failed.exit_code, failed.reason) == (143, "NonZeroExitCode")
    assert jobs[JOBS["cancelled"]][0].signal == 15
    assert jobs[JOBS["requeued"]][0].restarts == 1
    assert jobs[JOBS["requeued"]][0].reason == "BeginTime"
    assert jobs[JOBS["pending"]][0].reason == "Resources"
    assert jobs[JOBS["running"]][1].job_id == str(
        int(JOBS["running"]) + 1
    )  # component ids follow the leader's
    assert jobs[JOBS["running"]][0].work_dir.endswith(
        "/slurm/jobs/" + jobs[JOBS["running"]][0].work_dir.rsplit("/", 1)[1]
    )


def test_parse_sacct() -> None:
    jobs = parse_sacct_text((DATA / "sacct_22.05.txt").read_text())
    expected = {
        "completed": AppState.SUCCEEDED,
        "failed": AppState.FAILED,
        "requeued": AppState.FAILED,
        "timeout": AppState.FAILED,
        "cancelled": AppState.CANCELLED,
        "running": AppState.SUCCEEDED,
        "pending": AppState.SUCCEEDED,
    }
    for case, state in expected.items():
        assert jobs[JOBS[case]][0].state == state, case
    assert jobs[JOBS["timeout"]][0].states == ["TIMEOUT"]
    assert [r.name for r in jobs[JOBS["completed"]]] == ["ok.trainer", "ok.ps"]
    assert jobs[JOBS["requeued"]][0].restarts == 1  # one REQUEUED record before the last run
    assert len(jobs[JOBS["requeued"]]) == 1
    assert jobs[JOBS["pending"]][0].nodes == "node[1-4]"


def test_times_are_epoch_seconds_whatever_the_time_zone() -> None:
    """tsm asks for epoch seconds (``SLURM_TIME_FORMAT=%s``): a login node in another time zone than this
    machine still gives the right times."""
    assert SQUEUE_ARGS[:2] == ["env", "SLURM_TIME_FORMAT=%s"] and sacct_args()[:2] == SQUEUE_ARGS[:2]
    line = squeue_line(JobID=7, JobArrayID=7, State="COMPLETED", SubmitTime=1700000000, StartTime=1700000005,
                       EndTime=1700000065, exit_code=36608)
    rec = parse_squeue_text(line)["7"][0]
    assert (rec.submit_time, rec.start_time, rec.end_time, rec.exit_code) == (1700000000, 1700000005, 1700000065, 143)
    assert parse_squeue_text(squeue_line(JobID=8, JobArrayID=8, StartTime="N/A"))["8"][0].start_time is None


def test_names_and_paths_with_separators_stay_whole() -> None:
    line = squeue_line(JobID=9, JobArrayID=9, State="RUNNING", Name="a|b c", WorkDir="/x|y/ z")
    rec = parse_squeue_text(line)["9"][0]
    assert (rec.name, rec.work_dir) == ("a|b c", "/x|y/ z")


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[1-2,5],gpu07", ["node1", "node2", "node5", "gpu07"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("", []),
    ],
)
def test_expand_hostlist(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


def test_read_status_tolerates_garbage(tmp_path: Path) -> None:
    p = tmp_path / "s"
    assert read_status(p) is None
    p.write_text("running")
    assert read_status(p) is None
    p.write_text("exited x 1 0 -")
    assert read_status(p) is None
