"""The supervision policy's rules, one by one, on small records (pure: no process, no clock)."""

from __future__ import annotations

from tsm.lifecycle.policy import (
    Cancel,
    Cancelled,
    Exit,
    Fail,
    Keep,
    Lost,
    Record,
    Restart,
    Rule,
    Settings,
    Spent,
    Stalled,
    Succeed,
    TimeLimit,
    Warn,
    budget_spent,
    decide,
    format_duration,
    preemption_restart,
)

ONE = [Rule("w", 1, max_retries=2, policy="APPLICATION")]
TWO = [Rule("a", 2, max_retries=1, policy="ROLE"), Rule("b", 1, max_retries=0, policy="REPLICA")]


def test_nothing_recorded_keeps_running_and_every_success_succeeds() -> None:
    s = Settings(TWO)
    assert decide(s, Record()) == Keep()
    assert decide(s, Record([Exit("a", 0, 0), Exit("a", 1, 0)])) == Keep()  # b still runs
    assert decide(s, Record([Exit("a", 0, 0), Exit("a", 1, 0), Exit("b", 0, 0)])) == Succeed()


def test_a_failure_restarts_its_scope_while_max_retries_lasts() -> None:
    s = Settings(TWO)
    d = decide(s, Record([Exit("a", 1, 3, who="a/1")], attempts={"a": 0}))
    assert d == Restart("ROLE", ("a",), 1, "failed:3", "exited with code 3", "a/1 exited with code 3; restart 1 of 1 (ROLE)")
    spent = decide(s, Record([Exit("a", 1, 3, who="a/1")], Spent({"a": 1})))
    assert spent == Fail("a/1 exited with code 3")
    assert decide(s, Record([Exit("b", 0, 4)])) == Fail("exited with code 4")  # max_retries=0
    replica = decide(Settings([Rule("r", 3, 1, "REPLICA")]), Record([Exit("r", 2, 1)]))
    assert isinstance(replica, Restart) and replica.scope == "REPLICA" and replica.replica == 2 and replica.roles == ("r",)
    app = decide(Settings([Rule("x", 1, 1), Rule("y", 1, 0)]), Record([Exit("x", 0, 1)]))
    assert isinstance(app, Restart) and app.scope == "APPLICATION" and app.roles == ("x", "y")


def test_a_spent_budget_names_who_spent_it_when_known() -> None:
    s = Settings([Rule("r", 2, 1, "REPLICA")])
    d = decide(s, Record([Exit("r", 0, 5, who="r/0")], Spent({"r": 1}, last_by={"r": "r/1"})))
    assert d == Fail("r/0 exited with code 5 after 1 restart(s); role r's retry budget (max_retries=1, shared by its "
                     "replicas) was used up, the last retry by r/1")


def test_the_time_limit_fails_the_app_or_requeues_it_as_a_preemption() -> None:
    plain = Settings(ONE, time_limit=7200.0)
    assert decide(plain, Record([TimeLimit()])) == Fail("time limit 2h reached", time_limit=True)
    assert decide(plain, Record(now=7199.0, started=0.0)) == Keep()
    assert decide(plain, Record(now=7200.0, started=0.0)) == Fail("time limit 2h reached", time_limit=True)
    rq = Settings(ONE, time_limit=3.0, requeue_on_time_limit=True, max_preemptions=1)
    d = decide(rq, Record([TimeLimit()], attempts={"w": 0}))
    assert d == Restart("APPLICATION", ("w",), 1, "time_limit", "time limit 3s reached",
                        preemption_restart("time limit 3s reached", 1, 1), preemption=True, time_limit=True)
    assert d.note == ("preempted: time limit 3s reached; the app restarts (preemption 1 of max_preemptions=1; "  # type: ignore[union-attr]
                      "max_retries untouched)")
    spent = decide(rq, Record([TimeLimit()], Spent(preemptions=1)))
    assert spent == Fail("time limit 3s reached (no preemptions left: max_preemptions=1)", time_limit=True)


def test_a_success_before_the_limit_stands_and_a_failure_known_before_it_too() -> None:
    s = Settings(ONE, time_limit=10.0)
    assert decide(s, Record([Exit("w", 0, 0)], now=20.0, started=0.0)) == Succeed()
    early = decide(s, Record([Exit("w", 0, 3, at=5.0), TimeLimit(at=10.0)]))
    assert isinstance(early, Restart) and early.cause == "failed:3"


def test_the_engines_stop_at_the_limit_is_the_limit_without_waiting_for_the_slack() -> None:
    s = Settings(ONE, time_limit=10.0, slack=30.0)
    assert decide(s, Record(now=15.0, started=0.0)) == Keep()  # the engine's backstop has time yet
    d = decide(s, Record([Exit("w", 0, 143)], now=15.0, started=0.0))
    assert d == Fail("time limit 10s reached", time_limit=True)


def test_a_lost_replica_spends_the_preemption_budget_never_max_retries() -> None:
    s = Settings([Rule("w", 2, 0, "ROLE")], max_preemptions=2)
    d = decide(s, Record([Lost("w", 1, "preempted: evicted", who="role 'w' replica 1")], Spent(preemptions=1)))
    assert isinstance(d, Restart) and d.preemption and d.cause == "preempted" and d.roles == ("w",)
    assert d.note == preemption_restart("evicted", 2, 2, "restarted elsewhere")
    assert d.note == "preempted: evicted; restarted elsewhere (preemption 2 of max_preemptions=2; max_retries untouched)"
    spent = decide(s, Record([Lost("w", 1, "preempted: evicted")], Spent(preemptions=2)))
    assert spent == Fail(budget_spent("preempted: evicted", 2))
    assert spent.msg == "preempted: evicted (no preemptions left: max_preemptions=2)"  # type: ignore[union-attr]


def test_a_lost_replicas_own_exit_is_the_preemption() -> None:
    s = Settings(ONE, max_preemptions=1)
    d = decide(s, Record([Exit("w", 0, 143), Lost("w", 0, "node lost")]))
    assert isinstance(d, Restart) and d.preemption


def test_stalls_restart_as_the_replicas_failure_or_fail_the_app() -> None:
    s = Settings(ONE, stall_timeout=2.0)
    why = "stalled for 2s, last line: 'working'"
    d = decide(s, Record([Stalled("w", 0, why, who="w/0"), Exit("w", 0, 0, who="w/0")]))
    assert isinstance(d, Restart) and d.cause == "stalled" and d.why == why and not d.preemption
    assert decide(s, Record([Stalled("w", 0, why)])) == Keep()  # warned, being stopped
    fail = Settings(ONE, stall_timeout=2.0, on_stall="fail")
    assert decide(fail, Record([Stalled("w", 0, why, who="w/0")])) == Fail(f"w/0 {why}", stall=True)


def test_a_cancel_wins_over_everything() -> None:
    s = Settings(ONE, time_limit=1.0)
    assert decide(s, Record([Exit("w", 0, 143), TimeLimit(), Cancel()])) == Cancelled("cancelled by user")


def test_the_warning_comes_once_within_warn_before() -> None:
    s = Settings(ONE, time_limit=60.0, warn_before=10.0, warn=True)
    assert decide(s, Record(now=49.0, started=0.0)) == Keep()
    assert decide(s, Record(now=51.0, started=0.0)) == Warn("time limit 1m in 10s")
    assert decide(s, Record(now=51.0, started=0.0, warned=True)) == Keep()
    assert decide(Settings(ONE, time_limit=60.0, warn_before=10.0), Record(now=51.0, started=0.0)) == Keep()


def test_durations_are_written_as_run_options_read_them() -> None:
    assert [format_duration(x) for x in (900, 5400, 1.5, 3)] == ["15m", "1h30m", "1.5s", "3s"]


def test_unknown_policy_is_application_and_records_compare_by_value() -> None:
    assert Rule("r", policy="NONSENSE").policy == "APPLICATION"
    assert Exit("r", 0, 1) == Exit("r", 0, 1) and Exit("r", 0, 1) != Exit("r", 0, 2)
    assert hash(Fail("x")) == hash(Fail("x")) and "msg='x'" in repr(Fail("x"))


def test_wait_all_lets_every_replica_end_then_fails_with_the_first_in_rank_order() -> None:
    s = Settings([Rule("w", 3, max_retries=0)], wait_all=True)
    late = Exit("w", 2, 1, who="w/2", at=1.0)  # rank 2 failed first
    assert decide(s, Record([late])) == Keep()  # ranks 0 and 1 still run
    assert decide(s, Record([late, Exit("w", 0, 0, at=2.0)])) == Keep()
    every = [late, Exit("w", 0, 0, at=2.0), Exit("w", 1, 1, who="w/1", at=3.0)]
    assert decide(s, Record(every)) == Fail("w/1 exited with code 1")  # rank 1's, though it failed later
    assert decide(s, Record(list(reversed(every)))) == Fail("w/1 exited with code 1")  # whatever the order
    assert decide(Settings([Rule("w", 3, max_retries=0)]), Record([late])) == Fail("w/2 exited with code 1")
    retried = decide(Settings([Rule("w", 3, max_retries=1)], wait_all=True), Record([late]))
    assert isinstance(retried, Restart)  # a retry left restarts at once, as without wait_all
