"""The container controller's pure decision (observe -> decide -> act): each rule on a hand-made view."""

from __future__ import annotations

from tsm.schedulers.common.controller import Finish, Retry, RoleShape, decide, shapes
from tsm.schedulers.common.status import AppStatusView
from tsm.specs.api import AppState

SHAPE = shapes([["a", 2, 1, "ROLE"], ["b", 1, 2, "APPLICATION"], ["c", 1, 5, "REPLICA"]])


def view(state: AppState, failed: tuple[str, int] | None = None, *, started: bool = True, why: str = "") -> AppStatusView:
    return AppStatusView(state, "role failed" if failed else "", [], 0, failed, why, started)


def test_role_shapes_round_trip_and_default_to_no_retries() -> None:
    assert RoleShape.of(["a", 2, 1, "ROLE"]).row() == ["a", 2, 1, "ROLE"]
    assert RoleShape.of(["a", 3]) == RoleShape("a", 3, 0, "APPLICATION")
    assert RoleShape.of(["a", 1, 0, "bogus"]).policy == "APPLICATION"


def test_only_the_submitter_acts() -> None:
    assert decide(view(AppState.FAILED, ("a", 0)), SHAPE, {}, owned=False) is None
    assert decide(view(AppState.SUCCEEDED), SHAPE, {}, owned=False) is None


def test_role_and_application_retries_until_spent() -> None:
    assert decide(view(AppState.FAILED, ("a", 1)), SHAPE, {}, owned=True) == Retry(("a",), 1, "role failed")
    assert decide(view(AppState.FAILED, ("b", 0)), SHAPE, {}, owned=True) == Retry(("a", "b", "c"), 1, "role failed")
    assert decide(view(AppState.FAILED, ("b", 0)), SHAPE, {"c": 1}, owned=True) == Retry(("a", "b", "c"), 2, "role failed")
    spent = decide(view(AppState.FAILED, ("a", 0)), SHAPE, {"a": 1}, owned=True)
    assert spent == Finish(AppState.FAILED, "role failed", stop=True)
    # REPLICA retries are the engine's: a failure that reaches tsm is final
    assert decide(view(AppState.FAILED, ("c", 0)), SHAPE, {}, owned=True) == Finish(AppState.FAILED, "role failed", stop=True)


def test_ends_and_the_gang_timeout() -> None:
    assert decide(view(AppState.SUCCEEDED), SHAPE, {}, owned=True) == Finish(AppState.SUCCEEDED, "")
    pending = view(AppState.PENDING, started=False, why="role 'a' replica 0: Unschedulable")
    assert decide(pending, SHAPE, {}, owned=True, gang_timeout=10, waiting_since=100.0, now=105.0) is None
    late = decide(pending, SHAPE, {}, owned=True, gang_timeout=10, waiting_since=100.0, now=111.0)
    assert isinstance(late, Finish) and late.gang and late.stop and "Unschedulable" in late.msg
    assert decide(view(AppState.RUNNING), SHAPE, {}, owned=True, gang_timeout=10, waiting_since=1.0, now=99.0) is None
