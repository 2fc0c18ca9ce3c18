"""The controller's time-limit decisions (issue 25), pure: a warning in the window, the end at the limit,
and that end kept over the stopped replicas' own failures (no retry after a time limit)."""

from __future__ import annotations

from tsm.schedulers.common.controller import Finish, Limits, Retry, RoleShape, Warn, count_preemptions, decide
from tsm.schedulers.common.status import AppStatusView
from tsm.specs.api import AppState, ReplicaStatus, RoleStatus

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


def preempted_view(role: str = "w", k: int = 0, preempted: bool = True) -> AppStatusView:
    r = ReplicaStatus(id=k, state=AppState.FAILED, role=role, error_msg="preempted: evicted", preempted=preempted)
    return AppStatusView(AppState.FAILED, f"role '{role}' replica {k} preempted: evicted",
                         [RoleStatus(role, [r])], 0, first_failure=(role, k))


def test_a_preemption_restarts_without_spending_max_retries() -> None:
    no_retries = [RoleShape("w", 1, max_retries=0, policy="APPLICATION")]
    d = decide(preempted_view(), no_retries, {"w": 0}, owned=True, preemptions=0, max_preemptions=2)
    assert d == Retry(("w",), 1, "role 'w' replica 0 preempted: evicted", preemption=True)
    assert d.last_exit == "preempted"
    # the same failure without the flag is the program's: no retries left
    assert isinstance(decide(preempted_view(preempted=False), no_retries, {}, owned=True), Finish)


def test_preemptions_have_their_own_budget() -> None:
    d = decide(preempted_view(), SHAPE, {"w": 2}, owned=True, preemptions=2, max_preemptions=2)
    assert isinstance(d, Finish) and d.state == AppState.FAILED and d.stop
    assert d.msg.endswith("(no preemptions left: max_preemptions=2)")


def test_retries_made_for_preemptions_do_not_count_as_failures() -> None:
    one_retry = [RoleShape("w", 1, max_retries=1, policy="APPLICATION")]
    failed = view(AppState.FAILED, "exited with code 1")
    # tried 3 times, 3 of them preemptions: the one failure retry is still there
    d = decide(failed, one_retry, {"w": 3}, owned=True, preemptions=3)
    assert isinstance(d, Retry) and not d.preemption and d.attempt == 4 and d.last_exit is None
    assert isinstance(decide(failed, one_retry, {"w": 4}, owned=True, preemptions=3), Finish)


def test_a_preemption_restarts_its_role_or_every_role_as_the_policy_says() -> None:
    two = [RoleShape("a", 1, policy="ROLE"), RoleShape("b", 1, policy="ROLE")]
    d = decide(preempted_view("b"), two, {}, owned=True)
    assert isinstance(d, Retry) and d.roles == ("b",)
    app = [RoleShape("a", 1), RoleShape("b", 1)]
    d = decide(preempted_view("b"), app, {"a": 1}, owned=True)
    assert isinstance(d, Retry) and d.roles == ("a", "b") and d.attempt == 2


def test_requeue_on_time_limit_restarts_as_a_preemption_until_the_budget_is_spent() -> None:
    lim = Limits(60.0, started=0.0, requeue=True)
    d = decide(view(AppState.RUNNING), SHAPE, {"w": 1}, owned=True, now=61.0, limits=lim, preemptions=1)
    assert d == Retry(("w",), 2, "time limit 1m reached", preemption=True, time_limit=True)
    assert d.last_exit == "time_limit"
    d = decide(view(AppState.RUNNING), SHAPE, {"w": 3}, owned=True, now=61.0, limits=lim, preemptions=3,
               max_preemptions=3)
    assert isinstance(d, Finish) and d.time_limit and d.msg == "time limit 1m reached (no preemptions left: max_preemptions=3)"
    # an end at the limit already recorded stays an end
    done = Limits(60.0, started=0.0, requeue=True, reached=True)
    assert isinstance(decide(view(AppState.RUNNING), SHAPE, {}, owned=True, now=61.0, limits=done), Finish)
    # in the words the look that found it recorded, whichever process looks later
    spent = "time limit 1m reached (no preemptions left: max_preemptions=3)"
    said = Limits(60.0, started=0.0, requeue=True, reached=True, reached_msg=spent)
    d = decide(view(AppState.FAILED), SHAPE, {}, owned=True, now=900.0, limits=said)
    assert isinstance(d, Finish) and d.msg == spent and d.time_limit


def test_one_roles_preemptions_do_not_enlarge_another_roles_retries() -> None:
    two = [RoleShape("a", 1, policy="ROLE"), RoleShape("b", 1, max_retries=1, policy="ROLE")]
    failed_b = AppStatusView(AppState.FAILED, "role 'b' replica 0 exited with code 1", [], 0, first_failure=("b", 0))
    total, by_role = count_preemptions([("a",)])
    assert (total, by_role) == (1, {"a": 1})
    # b failed once already (try 1) and a was preempted once: b has no retry left
    d = decide(failed_b, two, {"a": 1, "b": 1}, owned=True, preemptions=total, role_preemptions=by_role)
    assert isinstance(d, Finish)
    assert isinstance(decide(failed_b, two, {"a": 1, "b": 0}, owned=True, preemptions=total,
                             role_preemptions=by_role), Retry)


def test_count_preemptions_counts_restarts_not_try_numbers() -> None:
    assert count_preemptions([("a",), ("b",), ("a", "b")]) == (3, {"a": 2, "b": 2})
    assert count_preemptions([]) == (0, {})
