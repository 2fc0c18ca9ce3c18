"""``structured_error_msg`` specified once (tsm.schedulers.common.failure), and a failing local app's as specified."""

from __future__ import annotations

import json
import sys

from tsm.runner.api import get_runner
from tsm.schedulers.common.failure import KEYS, failure_of, parse_structured_error, structured_error
from tsm.specs.api import AppDef, AppState, ReplicaStatus, Role, RoleStatus


def test_structured_error_has_exactly_the_specified_keys() -> None:
    data = json.loads(structured_error("w/1 exited with 3", "w/1", 3, None, ["a", "b"]))
    assert tuple(data) == KEYS
    assert data == {"replica": "w/1", "exit_code": 3, "signal": None, "message": "w/1 exited with 3",
                    "stderr_tail": ["a", "b"]}
    assert json.loads(structured_error(""))["message"] == "the app failed"  # never an empty message


def _roles(*reps: ReplicaStatus) -> list[RoleStatus]:
    return [RoleStatus("w", list(reps))]


def test_failure_of_names_the_replica_that_failed_by_itself() -> None:
    roles = _roles(
        ReplicaStatus(0, AppState.FAILED, "w", error_msg="stopped"),
        ReplicaStatus(1, AppState.FAILED, "w", exit_code=-9, error_msg=""),
    )
    data = parse_structured_error(failure_of(AppState.FAILED, "app failed", roles, lambda r, k: [f"{r}/{k} tail"]))
    assert data == {"replica": "w/1", "exit_code": -9, "signal": "SIGKILL", "message": "app failed",
                    "stderr_tail": ["w/1 tail"]}


def test_failure_of_is_empty_unless_failed_and_speaks_without_replicas() -> None:
    assert failure_of(AppState.SUCCEEDED, "", _roles(ReplicaStatus(0, AppState.SUCCEEDED, "w", exit_code=0))) == ""
    data = parse_structured_error(failure_of(AppState.FAILED, "job ended by Slurm: TIMEOUT", []))
    assert data is not None and data["replica"] is None and data["message"] == "job ended by Slurm: TIMEOUT"
    sig = parse_structured_error(failure_of(
        AppState.FAILED, "m", _roles(ReplicaStatus(0, AppState.FAILED, "w", error_msg="killed by SIGTERM"))))
    assert sig is not None and sig["signal"] == "SIGTERM"


def test_parse_accepts_only_the_specified_object() -> None:
    assert parse_structured_error("") is None
    assert parse_structured_error("role 'w' replica 0 exited with code 3") is None  # a sentence is not one
    assert parse_structured_error('["x"]') is None
    assert parse_structured_error('{"message": "m"}') == {
        "replica": None, "exit_code": None, "signal": None, "message": "m", "stderr_tail": []}


def test_a_failing_local_app_reports_the_specified_structured_error() -> None:
    code = "import sys; sys.stderr.write('first\\nboom\\n'); sys.exit(3)"
    app = AppDef("bad", [Role("w", image=".", entrypoint=sys.executable, args=["-c", code])])
    with get_runner() as r:
        handle = r.run(app, "local")
        status = r.wait(handle, timeout=60)
    assert status is not None and status.state == AppState.FAILED
    data = json.loads(status.structured_error_msg)
    assert tuple(data) == KEYS
    assert data["replica"] == "w/0" and data["exit_code"] == 3 and data["signal"] is None
    assert data["message"] and data["stderr_tail"][-2:] == ["first", "boom"]
