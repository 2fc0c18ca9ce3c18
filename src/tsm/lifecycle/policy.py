"""The one supervision policy: what an app's recorded events mean for its life.

Every backend enforces it and none re-decides it: the local supervisor, the Ray driver and the container
controllers (Docker, Kubernetes) record what happened to an app, ask :func:`decide`, and carry out the one
:data:`Outcome` it returns. Slurm's batch programs enforce the same rules in bash and report through the
message functions below.

**Input.** :class:`Settings` (the app's lifecycle run options and each role's retry rule, :class:`Rule`)
and a :class:`Record`: the events of the app's current run (:class:`Exit`, :class:`Lost`, :class:`Stalled`,
:class:`TimeLimit`, :class:`Cancel`), what earlier runs spent (:class:`Spent`) and the clock.

**Rules**, strongest first; the events are a set, so the same record decides the same whatever order
concurrent events were recorded in:

1. a :class:`Cancel` ends the app CANCELLED;
2. the time limit (a :class:`TimeLimit`, or the clock past ``started + time_limit``): every exit of the run
   is the limit's stop, not the replica's failure, unless it is known to have come before the limit. With
   ``requeue_on_time_limit`` and ``max_preemptions`` left the whole app restarts as a preemption
   (``TSM_LAST_EXIT=time_limit``, the limit counts again); else the app fails ``time limit 2h reached``
   (``... (no preemptions left: max_preemptions=N)`` when the requeues ran out);
3. a stall with ``on_stall=fail`` fails the app ``<replica> stalled for 15m, last line: ...``;
4. a :class:`Lost` replica (the cluster's decision: a preemption, an eviction, a lost node) restarts its
   scope as a preemption while ``max_preemptions`` lasts (``max_retries`` untouched,
   ``TSM_LAST_EXIT=preempted``); past it the app fails ``... (no preemptions left: max_preemptions=N)``;
5. a failed replica (non-zero exit, or any exit of a replica stopped for a stall: ``TSM_LAST_EXIT=stalled``)
   restarts its scope by its role's policy (REPLICA: the replica, ROLE: its role, APPLICATION: every role)
   while the role's ``max_retries`` lasts; else the app fails with the replica's failure (with ``wait_all``,
   once every replica has exited, with the failure of the first replica in the app's order: submitit's
   tasks each run to their own end);
6. every replica exited 0: the app SUCCEEDS;
7. within ``warn_before`` of the time limit with a warning signal asked for and not sent: :class:`Warn`;
8. else :class:`Keep`.

Pure and light: no I/O, no clock of its own, and no import beyond the standard library (it runs inside the
local supervisor, whose start-up counts milliseconds).
"""

from __future__ import annotations

from tsm.lifecycle import PREEMPTED_PREFIX

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

__all__ = [
    "POLICIES", "Cancel", "Cancelled", "Exit", "Fail", "Keep", "Lost", "Record", "Restart", "Rule", "Settings",
    "Spent", "Stalled", "Succeed", "TimeLimit", "Warn", "budget_spent", "deadlines", "decide", "format_duration",
    "preemption_restart", "retry_note", "time_limit_message", "warning_message",
]

#: The retry policies, as :class:`tsm.specs.RetryPolicy` names them.
POLICIES = ("REPLICA", "ROLE", "APPLICATION")


class _Plain:
    """A small frozen-in-spirit record: equality, hash and repr from its slots (no dataclasses import)."""

    __slots__: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, s) for s in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, *(repr(v) for v in self._values())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{s}={getattr(self, s)!r}' for s in self.__slots__)})"


# -- messages: the one vocabulary ------------------------------------------------------------------------
def format_duration(seconds: float) -> str:
    """``seconds`` as run options write it, in the largest units that are exact: 900 -> ``15m``."""
    s = round(seconds)
    if s != seconds or s <= 0:
        return f"{seconds:g}s"
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out


def time_limit_message(limit: float) -> str:
    """The app's end at its limit: ``time limit 2h reached``."""
    return f"time limit {format_duration(limit)} reached"


def warning_message(limit: float, lead: float) -> str:
    """Why the warning goes out before the limit: ``time limit 2h in 2m``."""
    return f"time limit {format_duration(limit)} in {format_duration(lead)}"


def budget_spent(what: str, max_preemptions: int) -> str:
    """The app's end when a preemption (or a requeue at the limit) finds the budget spent:
    ``time limit 2h reached (no preemptions left: max_preemptions=3)``."""
    return f"{what} (no preemptions left: max_preemptions={max_preemptions})"


def preemption_restart(what: str, n: int, max_preemptions: int, how: str = "the app restarts") -> str:
    """A replica's record when a preemption restarts it: ``preempted: time limit 2h reached; the app restarts
    (preemption 1 of max_preemptions=3; max_retries untouched)``."""
    return f"{PREEMPTED_PREFIX}{what}; {how} (preemption {n} of max_preemptions={max_preemptions}; max_retries untouched)"


def retry_note(who: str, what: str, n: int, max_retries: int, policy: str) -> str:
    """The supervisor's note of a failure's restart: ``r/0 exited with code 3; restart 1 of 2 (ROLE)``."""
    return f"{_said(who, what)}; restart {n} of {max_retries} ({policy})"


def _said(who: str, what: str) -> str:
    return f"{who} {what}" if who else what


# -- input -----------------------------------------------------------------------------------------------
class Rule(_Plain):
    """One role's retry rule: its replicas, ``max_retries`` and retry policy (unknown policies: APPLICATION)."""

    __slots__ = ("max_retries", "name", "policy", "replicas")

    def __init__(self, name: str, replicas: int = 1, max_retries: int = 0, policy: str = "APPLICATION") -> None:
        self.name, self.replicas, self.max_retries = name, int(replicas), max(0, int(max_retries))
        self.policy = policy if policy in POLICIES else "APPLICATION"


class Settings(_Plain):
    """An app's lifecycle settings: its roles' rules and the long-run options, in seconds (None: not set).

    ``warn``: a warning signal was asked for. ``slack``: seconds past the limit before tsm stops what still
    runs, where the engine enforces the limit itself (a backstop); an exit after the limit is the limit's
    whatever the slack."""

    __slots__ = ("max_preemptions", "on_stall", "requeue_on_time_limit", "roles", "slack", "stall_timeout",
                 "time_limit", "wait_all", "warn", "warn_before")

    def __init__(self, roles: Iterable[Rule], *, max_preemptions: int = 3, time_limit: float | None = None,
                 requeue_on_time_limit: bool = False, warn_before: float = 120.0, warn: bool = False,
                 stall_timeout: float | None = None, on_stall: str = "restart", slack: float = 0.0,
                 wait_all: bool = False) -> None:
        self.roles = tuple(roles)
        self.max_preemptions, self.time_limit = max(0, int(max_preemptions)), time_limit or None
        self.requeue_on_time_limit, self.warn_before, self.warn = bool(requeue_on_time_limit), float(warn_before), bool(warn)
        self.stall_timeout, self.on_stall, self.slack = stall_timeout or None, on_stall, float(slack)
        self.wait_all = bool(wait_all)

    def rule(self, role: str) -> Rule:
        """The rule of ``role`` (a role the settings do not name: one replica, no retries)."""
        return next((r for r in self.roles if r.name == role), Rule(role))


class Exit(_Plain):
    """A replica's attempt ended with ``code`` (0: it succeeded). ``why``: its failure in words (``exited
    with code 3``); ``who``: its name in messages (``role 'w' replica 0``, ``w/0``); ``at``: when, on the
    clock of :attr:`Record.now` (None: unknown)."""

    __slots__ = ("at", "code", "replica", "role", "who", "why")

    def __init__(self, role: str, replica: int, code: int, why: str = "", who: str = "", at: float | None = None) -> None:
        self.role, self.replica, self.code, self.at = role, replica, int(code), at
        self.why, self.who = why or f"exited with code {code}", who


class Lost(_Plain):
    """The cluster ended a replica's attempt (a preemption, an eviction, its node lost): ``why`` in words."""

    __slots__ = ("at", "replica", "role", "who", "why")

    def __init__(self, role: str, replica: int, why: str, who: str = "", at: float | None = None) -> None:
        self.role, self.replica, self.why, self.who, self.at = role, replica, why, who, at


class Stalled(_Plain):
    """tsm found a replica stalled (``why``: ``stalled for 15m, last line: ...``) and stops it."""

    __slots__ = ("replica", "role", "who", "why")

    def __init__(self, role: str, replica: int, why: str, who: str = "") -> None:
        self.role, self.replica, self.why, self.who = role, replica, why, who


class TimeLimit(_Plain):
    """The app's time limit was reached (``at``: when, None: unknown)."""

    __slots__ = ("at",)

    def __init__(self, at: float | None = None) -> None:
        self.at = at


class Cancel(_Plain):
    """The app was cancelled (``why``: in words)."""

    __slots__ = ("why",)

    def __init__(self, why: str = "cancelled by user") -> None:
        self.why = why


#: One recorded event of the app's current run.
Event = Exit | Lost | Stalled | TimeLimit | Cancel


class Spent(_Plain):
    """What the app spent before this run: the failure restarts that count against each role's
    ``max_retries`` (``retries``), preemption restarts (``preemptions``, app-wide; ``role_preemptions``, per
    role it restarted), and who made each role's last failure restart (``last_by``, for the message; empty:
    not said).

    Each backend counts ``retries`` as it can see them: the local supervisor per role (shared by its
    replicas), the Ray driver per failed replica, the container controllers by the tries of the failed
    role's scope less its preemption restarts."""

    __slots__ = ("last_by", "preemptions", "retries", "role_preemptions")

    def __init__(self, retries: Mapping[str, int] | None = None, preemptions: int = 0,
                 role_preemptions: Mapping[str, int] | None = None, last_by: Mapping[str, str] | None = None) -> None:
        self.retries, self.preemptions = dict(retries or {}), int(preemptions)
        self.role_preemptions, self.last_by = dict(role_preemptions or {}), dict(last_by or {})


class Record(_Plain):
    """What :func:`decide` reads: the events of the current run, what was spent, and the clock.

    ``now`` and ``started`` (when the time limit counts from) share one clock; ``warned``: the warning of this
    run was sent; ``attempts``: the try each role is on (a :class:`Restart` names the next)."""

    __slots__ = ("attempts", "events", "now", "spent", "started", "warned")

    def __init__(self, events: Iterable[Event] = (), spent: Spent | None = None, *, now: float | None = None,
                 started: float | None = None, warned: bool = False, attempts: Mapping[str, int] | None = None) -> None:
        self.events, self.spent = tuple(events), spent or Spent()
        self.now, self.started, self.warned, self.attempts = now, started, warned, dict(attempts or {})


# -- outcomes --------------------------------------------------------------------------------------------
class Keep(_Plain):
    """Nothing to do: the app keeps running."""

    __slots__ = ()


class Warn(_Plain):
    """Send the warning signal to every running replica, once (``why``: ``time limit 2h in 2m``)."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class Restart(_Plain):
    """Restart ``scope`` (REPLICA: ``replica`` of ``roles[0]``; ROLE: ``roles``; APPLICATION: every role) as
    try ``attempt``. ``cause``: the next attempt's ``TSM_LAST_EXIT``; ``preemption``: it spends
    ``max_preemptions``, never ``max_retries``; ``time_limit``: the limit counts again from the restart;
    ``why``: the failure restarted after; ``note``: the restart in words (a log line, a replica's record)."""

    __slots__ = ("attempt", "cause", "note", "preemption", "replica", "roles", "scope", "time_limit", "why")

    def __init__(self, scope: str, roles: tuple[str, ...], attempt: int, cause: str, why: str, note: str = "", *,
                 replica: int | None = None, preemption: bool = False, time_limit: bool = False) -> None:
        self.scope, self.roles, self.attempt, self.cause, self.why = scope, roles, attempt, cause, why
        self.note, self.replica, self.preemption, self.time_limit = note or why, replica, preemption, time_limit


class Fail(_Plain):
    """The app fails with ``msg``; what still runs is stopped. ``time_limit``: it ended at its limit;
    ``stall``: a stall ended it (the replicas are warned first)."""

    __slots__ = ("msg", "stall", "time_limit")

    def __init__(self, msg: str, *, time_limit: bool = False, stall: bool = False) -> None:
        self.msg, self.time_limit, self.stall = msg, time_limit, stall


class Succeed(_Plain):
    """Every replica succeeded: the app SUCCEEDS."""

    __slots__ = ()


class Cancelled(_Plain):
    """The app was cancelled: it ends CANCELLED with ``msg`` (what runs is stopped, warned first)."""

    __slots__ = ("msg",)

    def __init__(self, msg: str) -> None:
        self.msg = msg


#: What :func:`decide` returns: one of these.
Outcome = Keep | Warn | Restart | Fail | Succeed | Cancelled


# -- the decision ----------------------------------------------------------------------------------------
def decide(settings: Settings, record: Record) -> Outcome:
    """The one outcome of ``record`` under ``settings`` (pure: same inputs, same answer, whatever the order of
    ``record.events``); the rules are the module docstring's."""
    events = record.events
    cancel = [e for e in events if isinstance(e, Cancel)]
    if cancel:
        return Cancelled(min(c.why for c in cancel))
    exits = {(e.role, e.replica): e for e in events if isinstance(e, Exit)}
    done = bool(settings.roles) and all(
        (r.name, k) in exits and exits[(r.name, k)].code == 0 for r in settings.roles for k in range(r.replicas))
    limit_at = _limit_reached(settings, record, done)
    if limit_at is not None and not _failed_before(record, limit_at):
        return _at_limit(settings, record)
    stalled = {(e.role, e.replica): e for e in events if isinstance(e, Stalled)}
    if stalled and settings.on_stall == "fail":
        first = stalled[_first(settings, stalled)]
        return Fail(_said(first.who, first.why), stall=True)
    lost = {(e.role, e.replica): e for e in events if isinstance(e, Lost)}
    if lost:
        return _preempted(settings, record, lost[_first(settings, lost)])
    failed = {k: e for k, e in exits.items() if e.code != 0 or k in stalled}
    if failed:
        key = _first(settings, failed)
        outcome = _failed(settings, record, failed[key], stalled.get(key))
        if settings.wait_all and isinstance(outcome, Fail):  # the app fails once every replica has ended,
            if not all((r.name, k) in exits for r in settings.roles for k in range(r.replicas)):
                return _warning(settings, record)
            key = min(failed, key=lambda k: _order(settings, k))  # with the first failure in the app's order
            outcome = _failed(settings, record, failed[key], stalled.get(key))
        return outcome
    if done:
        return Succeed()
    return _warning(settings, record)


def deadlines(settings: Settings, started: float) -> tuple[float | None, float | None]:
    """When a run that started at ``started`` is due its warning and its time limit (None: never), on the
    caller's clock: the moments a backend that keeps its own clock wakes at to ask :func:`decide`."""
    if settings.time_limit is None:
        return None, None
    limit_at = started + settings.time_limit
    return (max(started, limit_at - settings.warn_before) if settings.warn else None), limit_at


def _limit_reached(settings: Settings, record: Record, done: bool) -> float | None:
    """When the time limit was reached in this run (-1.0: reached, when unknown), None while it was not.

    A recorded :class:`TimeLimit` reached it. The clock alone reaches it ``slack`` seconds late (the engine
    enforces it first), and never for an app whose every replica succeeded (``done``), none known to have
    ended after the limit (a replica that exits 0 on the limit's SIGTERM is stopped, not done); a failed or lost
    replica not known to have ended before the limit (the engine's stop) reaches it at once."""
    marks = [e.at for e in record.events if isinstance(e, TimeLimit)]
    if marks:
        known = [a for a in marks if a is not None]
        return min(known) if known else -1.0
    if settings.time_limit is None or record.started is None or record.now is None:
        return None
    deadline = record.started + settings.time_limit
    if done and not any(isinstance(e, Exit) and e.at is not None and e.at >= deadline for e in record.events):
        return None
    if record.now >= deadline + settings.slack:
        return deadline
    ended = any(isinstance(e, (Exit, Lost)) and (e.at >= deadline if e.at is not None else not isinstance(e, Exit) or e.code)
                for e in record.events)
    return deadline if record.now >= deadline and ended else None


def _at_limit(settings: Settings, record: Record) -> Outcome:
    limit = time_limit_message(settings.time_limit or 0)
    if not settings.requeue_on_time_limit:
        return Fail(limit, time_limit=True)
    budget = settings.max_preemptions
    if record.spent.preemptions >= budget:
        return Fail(budget_spent(limit, budget), time_limit=True)
    every = tuple(r.name for r in settings.roles)
    return Restart("APPLICATION", every, _next(record, every), "time_limit", limit,
                   preemption_restart(limit, record.spent.preemptions + 1, budget), preemption=True, time_limit=True)


def _preempted(settings: Settings, record: Record, lost: Lost) -> Outcome:
    rule = settings.rule(lost.role)
    budget = settings.max_preemptions
    what = _said(lost.who, lost.why)
    if record.spent.preemptions >= budget:
        return Fail(budget_spent(what, budget))
    scope, roles = _scope(settings, rule)
    note = preemption_restart(lost.why.removeprefix(PREEMPTED_PREFIX), record.spent.preemptions + 1, budget,
                              "restarted elsewhere")
    return Restart(scope, roles, _next(record, roles), "preempted", lost.why, note,
                   replica=lost.replica if scope == "REPLICA" else None, preemption=True)


def _failed(settings: Settings, record: Record, e: Exit, stall: Stalled | None) -> Outcome:
    rule = settings.rule(e.role)
    scope, roles = _scope(settings, rule)
    why, cause = (stall.why, "stalled") if stall is not None else (e.why, f"failed:{e.code}")
    used = record.spent.retries.get(e.role, 0)
    if used < rule.max_retries:
        return Restart(scope, roles, _next(record, roles), cause, why,
                       retry_note(e.who, why, used + 1, rule.max_retries, rule.policy),
                       replica=e.replica if scope == "REPLICA" else None)
    what = _said(e.who, why)
    by = record.spent.last_by.get(e.role)
    if used and by:
        what += (f" after {used} restart(s); role {e.role}'s retry budget (max_retries={rule.max_retries}, shared by "
                 f"its replicas) was used up, the last retry by {'it' if by == e.who else by}")
    return Fail(what)


def _failed_before(record: Record, limit_at: float) -> bool:
    """Whether a replica failed before the limit was reached (both times known): that failure stands."""
    return limit_at >= 0 and any(isinstance(e, Exit) and e.code != 0 and e.at is not None and e.at < limit_at
                                 for e in record.events)


def _warning(settings: Settings, record: Record) -> Outcome:
    limit = settings.time_limit
    if (limit is not None and settings.warn and not record.warned and record.started is not None
            and record.now is not None and record.now >= record.started + limit - settings.warn_before):
        return Warn(warning_message(limit, settings.warn_before))
    return Keep()


def _scope(settings: Settings, rule: Rule) -> tuple[str, tuple[str, ...]]:
    if rule.policy == "APPLICATION":
        return "APPLICATION", tuple(r.name for r in settings.roles) or (rule.name,)
    return rule.policy, (rule.name,)


def _next(record: Record, roles: tuple[str, ...]) -> int:
    return max((record.attempts.get(r, 0) for r in roles), default=0) + 1


def _at(e: Exit | Lost) -> float:
    return e.at if e.at is not None else float("inf")


def _order(settings: Settings, key: tuple[str, int]) -> tuple[int, str, int]:
    """A replica's place in the app (its role's, then its index): ties between events break by it."""
    names = [r.name for r in settings.roles]
    return (names.index(key[0]) if key[0] in names else len(names), key[0], key[1])


def _first(settings: Settings, found: Mapping[tuple[str, int], Any]) -> tuple[str, int]:
    """The event of ``found`` that decides: the earliest known, ties (and unknown times) in the app's order."""
    return min(found, key=lambda k: (_at(found[k]) if isinstance(found[k], (Exit, Lost)) else 0.0,
                                     _order(settings, k)))
