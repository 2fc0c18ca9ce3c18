"""The controller's time-limit decisions (issue 25), pure: a warning in the window, the end at the limit,
and that end kept over the stopped replicas' own failures (no retry after a time limit)."""

from __future__ import annotations

from tsm.schedulers.common.controller import Finish, Limits, Retry, RoleShape, Warn, decide
from tsm.schedulers.common.status import AppStatusView
from tsm.specs.api import AppState

SHAPE = [RoleShape("w", 1, max_retries=3, policy="APPLICATION")]


def view(state: AppState, msg: str = "") -> AppStatusView:
    failure = ("w", 0) if state == AppState.FAILED else None
    return AppStatusView(state, msg, [], 0, first_failure=failure)


def test_no_limit_nothing_and_before_the_window_nothing() -> None:
    assert decide(view(AppState.RUNNING), SHAPE, {}, owned=True, now=100.0, limits=Limits(None)) is None
    lim = Limits(60.0, warn_before=10.0, warn=True, started=0.0)
    assert decide(view(AppState.RUNNING), SHAPE, {}, owned=True, now=49.0, limits=lim) is None


def test_warning_in_the_window_once() -> None:
    lim = Limits(60.0, warn_before=10.0, warn=True, started=0.0)
    d = decide(view(AppState.RUNNING), SHAPE, {}, owned=True, now=51.0, limits=lim)
    assert isinstance(d, Warn) and d.why == "time limit 1m in 10s"
    warned = Limits(60.0, warn_before=10.0, warn=True, started=0.0, warned=True)
    assert decide(view(AppState.RUNNING), SHAPE, {}, owned=True, now=51.0, limits=warned) is None
    unasked = Limits(60.0, warn_before=10.0, warn=False, started=0.0)
    assert decide(view(AppState.RUNNING), SHAPE, {}, owned=True, now=51.0, limits=unasked) is None


def test_limit_reached_stops_and_fails_with_its_message() -> None:
    lim = Limits(7200.0, started=0.0)
    d = decide(view(AppState.RUNNING), SHAPE, {}, owned=True, now=7200.0, limits=lim)
    assert d == Finish(AppState.FAILED, "time limit 2h reached", stop=True, time_limit=True)


def test_reached_limit_wins_over_a_retry_of_the_stopped_replica() -> None:
    failed = view(AppState.FAILED, "exited with code 143")
    assert isinstance(decide(failed, SHAPE, {}, owned=True, now=1.0), Retry)
    d = decide(failed, SHAPE, {}, owned=True, now=1.0, limits=Limits(60.0, started=0.0, reached=True))
    assert isinstance(d, Finish) and d.time_limit and d.msg == "time limit 1m reached"


def test_not_owned_decides_nothing_even_past_the_limit() -> None:
    assert decide(view(AppState.RUNNING), SHAPE, {}, owned=False, now=100.0, limits=Limits(1.0, started=0.0)) is None


def test_an_app_that_ended_before_its_limit_keeps_its_end() -> None:
    d = decide(view(AppState.SUCCEEDED), SHAPE, {}, owned=True, now=100.0, limits=Limits(1.0, started=0.0))
    assert d == Finish(AppState.SUCCEEDED, "")
