"""Reading Slurm's answers: squeue/sacct JSON (22.05 as captured from the real cluster by
``data/capture_slurm_data.py``, and the newer format derived from it by :func:`_to_newer_format`), their
text columns, state names, host lists and replica status files."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from slurm_util import DATA, JOBS

from tsm.schedulers.slurm import (
    SlurmQueries,
    expand_hostlist,
    parse_sacct_json,
    parse_sacct_text,
    parse_squeue_json,
    parse_squeue_text,
    read_status,
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


def _to_newer_format(obj: Any, key: str = "") -> Any:
    """The 22.05 capture as Slurm 23.02+ writes it: state lists and ``{"set", "infinite", "number"}`` numbers."""
    if isinstance(obj, dict):
        return {k: _to_newer_format(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_newer_format(v) for v in obj]
    if key == "job_state" and isinstance(obj, str):
        return [obj]
    if key == "current" and isinstance(obj, str):
        return [obj]
    if isinstance(obj, int) and not isinstance(obj, bool) and key in {
        "job_id", "het_job_id", "het_job_offset", "restart_cnt", "submit_time", "start_time", "end_time", "tasks",
        "job_offset", "submission", "start", "end", "return_code",
    }:  # fmt: skip
        return {"set": True, "infinite": False, "number": obj}
    if key == "exit_code" and isinstance(obj, int):  # newer squeue: a structured exit code
        return {"status": ["SIGNALED"] if obj & 0x7F else ["SUCCESS" if obj == 0 else "FAILED"],
                "return_code": {"set": True, "number": (obj >> 8) & 0xFF},
                "signal": {"id": {"set": True, "number": obj & 0x7F}, "name": ""}}  # fmt: skip
    return obj


SQUEUE_EXPECTED = {
    "completed": (AppState.SUCCEEDED, ["ok.trainer", "ok.ps"], "node[1-2]"),
    "failed": (AppState.FAILED, ["bad.trainer", "bad.ps"], "node[1-2]"),
    "requeued": (AppState.PENDING, ["retry.w"], ""),
    "timeout": (AppState.RUNNING, ["slow.w"], "node4"),
    "cancelled": (AppState.CANCELLED, ["stop.w"], "node[1-2]"),
    "running": (AppState.RUNNING, ["busy.trainer", "busy.ps"], "node[1-2]"),
    "pending": (AppState.PENDING, ["big.w"], ""),
}


@pytest.mark.parametrize("newer", [False, True], ids=["22.05", "newer"])
def test_parse_squeue(newer: bool) -> None:
    text = (DATA / "squeue_22.05.json").read_text()
    if newer:
        text = json.dumps(_to_newer_format(json.loads(text)))
    jobs = parse_squeue_json(text)
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


@pytest.mark.parametrize("newer", [False, True], ids=["22.05", "newer"])
def test_parse_sacct(newer: bool) -> None:
    text = (DATA / "sacct_22.05.json").read_text()
    if newer:
        text = json.dumps(_to_newer_format(json.loads(text)))
    jobs = parse_sacct_json(text)
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


def _by_case(jobs: dict[str, list[Any]]) -> dict[str, list[tuple[Any, ...]]]:
    return {
        case: [
            (r.job_id, r.offset, r.name, r.state, r.nodes, r.restarts, r.work_dir) for r in jobs[JOBS[case]]
        ]
        for case in JOBS
        if JOBS[case] in jobs
    }


def test_squeue_text_columns_say_what_the_json_says() -> None:
    from_json = parse_squeue_json((DATA / "squeue_22.05.json").read_text())
    from_text = parse_squeue_text((DATA / "squeue_22.05.txt").read_text())
    assert _by_case(from_text) == _by_case(from_json)
    assert set(from_text) == set(from_json)
    run = from_text[JOBS["running"]][0]
    assert run.num_tasks == 2 and run.submit_time == from_json[JOBS["running"]][0].submit_time


def test_sacct_text_columns_say_what_the_json_says() -> None:
    from_json = parse_sacct_json((DATA / "sacct_22.05.json").read_text())
    from_text = parse_sacct_text((DATA / "sacct_22.05.txt").read_text())
    assert _by_case(from_text) == _by_case(from_json)
    assert (
        from_text[JOBS["requeued"]][0].exit_code == 5
    )  # the text columns keep exit codes 22.05's JSON drops
    assert from_text[JOBS["requeued"]][0].restarts == 1


def test_slurm_without_json_is_read_from_text_columns() -> None:
    calls: list[list[str]] = []

    def runner(args: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        if "--json" in args:
            return subprocess.CompletedProcess(args, 1, "", f"{args[0]}: unrecognized option '--json'\n")
        name = "squeue_22.05.txt" if args[0] == "squeue" else "sacct_22.05.txt"
        return subprocess.CompletedProcess(args, 0, (DATA / name).read_text(), "")

    q = SlurmQueries(runner=runner)
    assert q.job(JOBS["running"])[0].state == AppState.RUNNING  # type: ignore[index]
    assert q.json is False
    q._snapshot = {}
    q._snapshot_at = time.monotonic()
    failed = q.job(JOBS["failed"], max_age=60)
    assert failed is not None and failed[0].state == AppState.FAILED
    assert [c[0] for c in calls] == ["squeue", "squeue", "sacct"]
    assert calls[-1][:3] == ["sacct", "-P", "-n"]


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
