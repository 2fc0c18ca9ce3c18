"""The policy decides the same whatever order concurrent events were recorded in (hypothesis replays them).

Two properties: a record's outcome does not depend on the order of its events (any permutation); and a
backend that records the events of a time limit one at a time, asking after each, ends the same way
whether a stopped replica's SIGTERM exit (143) arrives before or after the time-limit event, since the
clock it reads is past the limit either way.
"""

from __future__ import annotations

from hypothesis import given, settings as hsettings, strategies as st

from tsm.lifecycle.policy import (
    Cancel,
    Event,
    Exit,
    Fail,
    Keep,
    Lost,
    Outcome,
    Record,
    Restart,
    Rule,
    Settings,
    Spent,
    Stalled,
    TimeLimit,
    Warn,
    decide,
)

ROLES = [Rule("a", 2, max_retries=1, policy="ROLE"), Rule("b", 1, max_retries=2, policy="REPLICA"),
         Rule("c", 1, max_retries=0, policy="APPLICATION")]
REPLICAS = [(r.name, k) for r in ROLES for k in range(r.replicas)]

replica = st.sampled_from(REPLICAS)
when = st.one_of(st.none(), st.floats(0.0, 20.0))
event: st.SearchStrategy[Event] = st.one_of(
    st.builds(lambda rk, c, at: Exit(rk[0], rk[1], c, at=at), replica, st.sampled_from([0, 1, 3, 137, 143]), when),
    st.builds(lambda rk, at: Lost(rk[0], rk[1], "preempted: node lost", at=at), replica, when),
    st.builds(lambda rk: Stalled(rk[0], rk[1], "stalled for 2s, no output at all"), replica),
    st.builds(TimeLimit, when),
    st.just(Cancel()),
)
app_settings = st.builds(
    lambda limit, rq, budget, stall: Settings(ROLES, time_limit=limit, requeue_on_time_limit=rq, max_preemptions=budget,
                                              warn=True, warn_before=2.0, on_stall=stall),
    st.one_of(st.none(), st.floats(1.0, 15.0)), st.booleans(), st.integers(0, 2), st.sampled_from(["restart", "fail"]),
)
spent = st.builds(lambda r, p: Spent({"a": r, "b": r}, p), st.integers(0, 2), st.integers(0, 3))


def _unique(events: list[Event]) -> list[Event]:
    """One event per replica and kind (a backend records each replica's end of an attempt once)."""
    seen, out = set(), []
    for e in events:
        key = (type(e).__name__, getattr(e, "role", None), getattr(e, "replica", None))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


@hsettings(max_examples=300, deadline=None)
@given(app_settings, spent, st.lists(event, max_size=8).map(_unique), st.randoms(use_true_random=False),
       st.floats(0.0, 30.0))
def test_the_outcome_of_a_record_does_not_depend_on_its_order(s: Settings, used: Spent, events: list[Event],
                                                              rnd: object, now: float) -> None:
    shuffled = list(events)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    first = decide(s, Record(events, used, now=now, started=0.0))
    assert decide(s, Record(shuffled, used, now=now, started=0.0)) == first
    assert decide(s, Record(reversed(events), used, now=now, started=0.0)) == first


def _replay(s: Settings, arrivals: list[tuple[float, Event]], used: Spent) -> Outcome:
    """A backend's loop: record each event as it arrives (at its time), ask the policy, act on the first
    outcome that is not to keep running (a warning is sent and the run goes on)."""
    recorded: list[Event] = []
    warned = False
    for now, e in arrivals:
        recorded.append(e)
        out = decide(s, Record(recorded, used, now=now, started=0.0, warned=warned))
        if isinstance(out, Warn):
            warned = True
            continue
        if not isinstance(out, Keep):
            return out
    return decide(s, Record(recorded, used, now=arrivals[-1][0] if arrivals else 0.0, started=0.0, warned=warned))


@hsettings(max_examples=200, deadline=None)
@given(st.booleans(), st.integers(0, 2), st.integers(0, 3), st.sampled_from([143, 137, 1, 0]),
       st.floats(0.0, 5.0), st.floats(0.0, 5.0), st.booleans(), st.booleans())
def test_a_sigterm_exit_before_or_after_the_time_limit_event_is_the_limits(
        requeue: bool, budget: int, preemptions: int, code: int, lag_exit: float, lag_mark: float, exit_first: bool,
        mark_time_known: bool) -> None:
    limit = 10.0
    s = Settings([Rule("w", 1, max_retries=3, policy="APPLICATION")], time_limit=limit,
                 requeue_on_time_limit=requeue, max_preemptions=budget)
    used = Spent(preemptions=preemptions)
    stop = Exit("w", 0, code, who="role 'w' replica 0", at=limit + lag_exit)  # stopped at the limit
    mark = TimeLimit(limit if mark_time_known else None)
    arrivals: list[tuple[float, Event]] = [(limit + lag_exit, stop), (limit + lag_mark, mark)]
    if not exit_first:
        arrivals.reverse()
    arrivals = [(max(t for t, _ in arrivals[: i + 1]), e) for i, (_, e) in enumerate(arrivals)]  # a clock only grows
    out = _replay(s, arrivals, used)
    if requeue and preemptions < budget:
        assert isinstance(out, Restart) and out.time_limit and out.preemption and out.cause == "time_limit", out
    elif requeue:
        assert out == Fail(f"time limit 10s reached (no preemptions left: max_preemptions={budget})", time_limit=True)
    else:
        assert out == Fail("time limit 10s reached", time_limit=True)


@given(st.permutations([Exit("w", 0, 143), Lost("w", 0, "preempted: node lost"), Exit("v", 0, 0)]))
def test_a_lost_replicas_exit_is_its_preemption_in_any_order(events: list[Event]) -> None:
    s = Settings([Rule("w", 1, 0, "ROLE"), Rule("v", 1, 0, "ROLE")], max_preemptions=1)
    out = decide(s, Record(events))
    assert isinstance(out, Restart) and out.preemption and out.roles == ("w",) and out.cause == "preempted"


@given(st.permutations([Stalled("w", 0, "stalled for 2s, no output at all", who="w/0"), Exit("w", 0, 0, who="w/0")]))
def test_a_stalled_replicas_exit_is_its_failure_in_any_order(events: list[Event]) -> None:
    s = Settings([Rule("w", 1, 0, "ROLE")], stall_timeout=2.0)
    assert decide(s, Record(events)) == Fail("w/0 stalled for 2s, no output at all")
