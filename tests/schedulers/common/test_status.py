"""StateTable and failure attribution."""

from __future__ import annotations

from tsm.schedulers.common.status import StateTable, attribute_failure
from tsm.specs.api import AppState, ReplicaStatus, RoleStatus

TABLE = StateTable(
    {AppState.PENDING: {"queued"}, AppState.RUNNING: {"Running"}, AppState.SUCCEEDED: {"DONE"},
     AppState.FAILED: {"error"}},
    flags={"finishing": AppState.RUNNING},
)  # fmt: skip


def rep(replica_id: int, role: str, state: AppState, exit_code: int | None = None) -> ReplicaStatus:
    return ReplicaStatus(id=replica_id, role=role, state=state, exit_code=exit_code)


def test_names_map_case_insensitively_and_unknown_is_unknown() -> None:
    assert TABLE.state("QUEUED") == AppState.PENDING
    assert TABLE.state("running") == AppState.RUNNING
    assert TABLE.state("whatever") == AppState.UNKNOWN
    assert TABLE.state([]) == AppState.UNKNOWN
    assert TABLE.names(AppState.SUCCEEDED) == {"DONE"}


def test_flags_after_the_base_state_override_it() -> None:
    assert TABLE.state(["DONE", "finishing"]) == AppState.RUNNING
    assert TABLE.state(["finishing"]) == AppState.UNKNOWN  # a flag alone is no state


def test_first_failure_is_named_and_the_stopped_ones_are_cancelled() -> None:
    roles = [
        RoleStatus(role="a", replicas=[rep(0, "a", AppState.SUCCEEDED, exit_code=0), rep(1, "a", AppState.FAILED, exit_code=3)]),
        RoleStatus(role="b", replicas=[rep(0, "b", AppState.FAILED), rep(1, "b", AppState.FAILED, exit_code=9)]),
    ]  # fmt: skip
    failure = attribute_failure(roles)
    assert failure == "role 'a' replica 1 exited with code 3"
    b0 = roles[1].replicas[0]
    assert b0.state == AppState.CANCELLED and b0.error_msg == f"stopped after {failure}"
    assert roles[1].replicas[1].state == AppState.FAILED  # failed by itself too: stays FAILED


def test_no_failure_changes_nothing() -> None:
    roles = [RoleStatus(role="a", replicas=[rep(0, "a", AppState.FAILED)])]
    assert attribute_failure(roles) == ""
    assert roles[0].replicas[0].state == AppState.FAILED
