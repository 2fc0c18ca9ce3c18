"""StateTable and failure attribution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tsm.schedulers.common.status import Seen, StateTable, aggregate_roles, attribute_failure
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


def _seen(replicas: dict[tuple[str, int], tuple[AppState, float, str]]) -> Any:
    """A ``seen`` over ``{(role, k): (state, ended, error)}``; a replica not in it is not shown yet."""

    def seen(row: Sequence[Any], k: int) -> Seen | None:
        got = replicas.get((row[0], k))
        if got is None:
            return None
        state, ended, error = got
        r = ReplicaStatus(id=k, role=row[0], state=state, error_msg=error, restarts=1)
        return r, ended, f"said {error or 'nothing'}"

    return seen


def test_aggregate_roles_keeps_the_shape_and_fills_what_is_not_shown() -> None:
    st = aggregate_roles([["w", 2, 0, "APPLICATION"], ["ps", "1"]], _seen({("w", 0): (AppState.RUNNING, 0.0, "")}), 2)
    assert [(rs.role, [(r.id, r.state) for r in rs.replicas]) for rs in st.roles] == [
        ("w", [(0, AppState.RUNNING), (1, AppState.PENDING)]), ("ps", [(0, AppState.PENDING)])]
    assert (st.state, st.msg, st.num_restarts, st.first_failure, st.all_started) == (AppState.RUNNING, "", 3, None, False)
    assert aggregate_roles([["w", 1]], _seen({})).state == AppState.PENDING
    assert aggregate_roles([], _seen({})).state == AppState.PENDING


def test_aggregate_roles_names_the_earliest_failure_and_cancels_the_rest() -> None:
    seen = _seen({("w", 0): (AppState.FAILED, 9.0, "late"), ("w", 1): (AppState.FAILED, 2.0, "first"),
                  ("ps", 0): (AppState.SUCCEEDED, 1.0, "")})
    st = aggregate_roles([["w", 2], ["ps", 1]], seen)
    assert (st.state, st.msg, st.first_failure) == (AppState.FAILED, "role 'w' replica 1 said first", ("w", 1))
    w0, w1 = st.roles[0].replicas
    assert (w0.state, w0.error_msg) == (AppState.CANCELLED, "stopped after role 'w' replica 1 failed")
    assert (w1.state, w1.error_msg) == (AppState.FAILED, "first")
    assert st.roles[1].replicas[0].state == AppState.SUCCEEDED


def test_aggregate_roles_success_and_the_first_pending_reason() -> None:
    done = _seen({("w", 0): (AppState.SUCCEEDED, 1.0, ""), ("w", 1): (AppState.SUCCEEDED, 2.0, "")})
    st = aggregate_roles([["w", 2]], done)
    assert (st.state, st.all_started) == (AppState.SUCCEEDED, True)
    waiting = _seen({("w", 0): (AppState.RUNNING, 0.0, ""), ("w", 1): (AppState.PENDING, 0.0, "ErrImagePull: no"),
                     ("w", 2): (AppState.PENDING, 0.0, "Unschedulable")})
    st = aggregate_roles([["w", 3]], waiting)
    assert (st.state, st.msg) == (AppState.RUNNING, "role 'w' replica 1: ErrImagePull: no")
    assert st.pending_reason == st.msg and not st.all_started
