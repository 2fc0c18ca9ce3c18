"""The client-side controller of the container backends, as a pure decision: observe -> decide -> act.

Docker and Kubernetes run each replica as an object the engine restarts only by itself (REPLICA retries);
ROLE and APPLICATION retries, the gang timeout and "a replica failed for good, stop the others" are done by
tsm, in the process that looks at the app. Each look is three steps:

1. **observe** (the backend): one batched list of the app's containers or pods, read into an
   :class:`~tsm.schedulers.common.status.AppStatusView` (:func:`~tsm.schedulers.common.status.aggregate_roles`);
2. **decide** (here, pure, no I/O): :func:`decide` turns that view, the app's :class:`RoleShape` rows, the
   try each role is on and the clock into the lifecycle policy's record (:mod:`tsm.lifecycle.policy`, which
   holds the rules) and its answer into at most one :data:`Decision`;
3. **act** (the backend's ``act``): replace the objects of a :class:`Retry`, stop or delete what a
   :class:`Finish` says.

Only the submitter acts: an app whose request this ``$TSM_HOME`` does not hold (another user's, another
home's, another machine's) is observed and reported, never changed (``owned=False`` decides nothing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tsm.lifecycle import policy
from tsm.schedulers.common.lifecycle_opts import DEFAULT_MAX_PREEMPTIONS
from tsm.schedulers.common.status import AppStatusView
from tsm.specs.api import AppState

POLICIES = policy.POLICIES


@dataclass(frozen=True)
class RoleShape:
    """One role as the controller needs it: name, replicas, retries and their policy.

    Kept on the engine's objects (a label or an annotation ``[[name, replicas, max_retries, policy], ...]``)
    so an app can be shaped without the local request.
    """

    name: str
    replicas: int
    max_retries: int = 0
    policy: str = "APPLICATION"

    @classmethod
    def of(cls, row: Sequence[Any]) -> RoleShape:
        """A shape from a ``[name, replicas, max_retries, policy]`` row (missing fields: no retries)."""
        name, n, *rest = row
        retries = int(rest[0]) if rest else 0
        policy = str(rest[1]) if len(rest) > 1 else "APPLICATION"
        return cls(str(name), int(n), retries, policy if policy in POLICIES else "APPLICATION")

    def row(self) -> list[Any]:
        """The ``[name, replicas, max_retries, policy]`` row this shape is kept as."""
        return [self.name, self.replicas, self.max_retries, self.policy]


def shapes(rows: Iterable[Sequence[Any]]) -> list[RoleShape]:
    """:meth:`RoleShape.of` of each row."""
    return [RoleShape.of(r) for r in rows]


@dataclass(frozen=True)
class Retry:
    """Replace the objects of ``roles`` (every role for APPLICATION) by try ``attempt``."""

    roles: tuple[str, ...]
    attempt: int
    #: the failure retried after (the status says "retrying after <why>")
    why: str
    #: the cluster's decision, not the program's failure (a preemption, a lost node, a time limit with
    #: ``requeue_on_time_limit``): it spends ``max_preemptions``, never ``max_retries``, and the next attempt
    #: sees ``TSM_LAST_EXIT=preempted`` (``time_limit`` for a requeue at the limit)
    preemption: bool = False
    #: it restarts the app at its time limit (``requeue_on_time_limit``): the limit counts again from now
    time_limit: bool = False

    @property
    def last_exit(self) -> str | None:
        """``TSM_LAST_EXIT`` of the next attempt when the decision fixes it (None: the failed replica's
        ``failed:<code>``, which only the backend knows)."""
        if self.time_limit:
            return "time_limit"
        return "preempted" if self.preemption else None


@dataclass(frozen=True)
class Finish:
    """The app has ended: ``state`` with ``msg``. ``stop``: replicas still running are stopped (a final
    failure, a gang timeout); ``gang``: it ended because not every replica ran within the gang timeout."""

    state: AppState
    msg: str
    stop: bool = False
    gang: bool = False
    #: it ended at its time limit (the backend records that, so later looks keep this end)
    time_limit: bool = False


@dataclass(frozen=True)
class Warn:
    """Send the app's warning signal to every running replica, once (the backend records it was sent)."""

    why: str


@dataclass(frozen=True)
class Limits:
    """An app's time limit as :func:`decide` needs it: seconds (None: no limit), the warning lead, whether a
    warning signal was asked for, when the limit counts from (the submission), and what was already done."""

    time_limit: float | None
    warn_before: float = 120.0
    warn: bool = False
    started: float | None = None
    #: the warning was sent already
    warned: bool = False
    #: the limit was reached on an earlier look (or the engine reports it reached)
    reached: bool = False
    #: seconds past the limit before a look enforces it, where the engine enforces it first (a backstop)
    slack: float = 0.0
    #: ``requeue_on_time_limit``: the limit restarts the app as a preemption while the budget lasts
    requeue: bool = False
    #: what the look that found the limit reached said (recorded by the backend): later looks say the same
    reached_msg: str = ""

    @property
    def message(self) -> str:
        """The app's failure at its limit: ``time limit 2h reached``."""
        return policy.time_limit_message(self.time_limit or 0)


#: What one look decides: nothing to do (None), a retry, a warning, or the end.
Decision = Retry | Finish | Warn | None


def decide(
    view: AppStatusView,
    shape: Sequence[RoleShape],
    attempts: Mapping[str, int],
    *,
    owned: bool,
    gang_timeout: float | None = None,
    waiting_since: float | None = None,
    now: float = 0.0,
    limits: Limits | None = None,
    preemptions: int = 0,
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS,
    role_preemptions: Mapping[str, int] | None = None,
    hopeless: str = "",
) -> Decision:
    """What to do about an app after one look (pure: same inputs, same answer): the lifecycle policy's
    outcome (:func:`tsm.lifecycle.policy.decide`, whose docstring states the rules) for what the look saw.

    The look becomes the policy's record: the replicas that succeeded, the replica to blame for a FAILED
    app (:class:`~tsm.lifecycle.policy.Lost` when the cluster ended it, its ``ReplicaStatus.preempted``), a
    time limit already reached (``limits.reached``: the app ended at it, and later looks say what that look
    said), the clock, and what was spent: ``preemptions`` (app-wide) and the failure restarts of the failed
    role's scope (``attempts``: role -> try, less the tries of that role that were preemption restarts,
    ``role_preemptions``, see :func:`count_preemptions`; the highest in scope counts). A REPLICA role's
    failure reaches the look only once the engine spent its restarts, so tsm never retries it.

    Besides the policy, for the container engines: nothing unless ``owned`` (only the submitter acts); not
    every replica running ``gang_timeout`` seconds after ``waiting_since`` (the current try's start):
    :class:`Finish` FAILED with the first reason a replica gives (``gang``), at once when a replica can never
    start by itself (``hopeless``: the engine's reason, e.g. an image no registry has); a terminal view the
    policy has nothing to say about: :class:`Finish` in it.
    """
    if not owned:
        return None
    if limits is not None and limits.time_limit is not None and limits.reached:
        return Finish(AppState.FAILED, limits.reached_msg or limits.message, stop=True, time_limit=True)
    settings = policy.Settings(
        [policy.Rule(r.name, r.replicas, r.max_retries, r.policy) for r in shape], max_preemptions=max_preemptions,
        time_limit=limits.time_limit if limits is not None else None,
        requeue_on_time_limit=limits is not None and limits.requeue,
        warn_before=limits.warn_before if limits is not None else 120.0, warn=limits is not None and limits.warn,
        slack=limits.slack if limits is not None else 0.0,
    )
    events, retries = _events(view, shape, attempts, preemptions, role_preemptions)
    record = policy.Record(events, policy.Spent(retries, preemptions), now=now, attempts=attempts,
                           started=limits.started if limits is not None else None,
                           warned=limits is not None and limits.warned)
    outcome = policy.decide(settings, record)
    if isinstance(outcome, policy.Restart):
        return Retry(outcome.roles, outcome.attempt, outcome.why, preemption=outcome.preemption,
                     time_limit=outcome.time_limit)
    if isinstance(outcome, policy.Fail):
        return Finish(AppState.FAILED, outcome.msg, stop=True, time_limit=outcome.time_limit)
    if isinstance(outcome, policy.Warn):
        return Warn(outcome.why)
    if isinstance(outcome, (policy.Succeed, policy.Cancelled)) or view.state.is_terminal:
        return Finish(view.state, view.msg)
    if hopeless and not view.all_started:
        return Finish(AppState.FAILED, f"a replica cannot start: {hopeless}", stop=True, gang=True)
    if gang_timeout is not None and waiting_since and not view.all_started and now - waiting_since > gang_timeout:
        why = view.pending_reason or "not scheduled"
        return Finish(AppState.FAILED, f"not every replica was Running within gang_timeout={gang_timeout:g}s: {why}",
                      stop=True, gang=True)
    return None


def _events(
    view: AppStatusView, shape: Sequence[RoleShape], attempts: Mapping[str, int], preemptions: int,
    role_preemptions: Mapping[str, int] | None,
) -> tuple[list[policy.Event], dict[str, int]]:
    """The policy's events of one look (the replicas that succeeded, the one to blame for a failure, a cancel)
    and the failure restarts its role has spent."""
    events: list[policy.Event] = [policy.Exit(rs.role, r.id, 0) for rs in view.roles for r in rs.replicas
                                  if r.state == AppState.SUCCEEDED]
    retries: dict[str, int] = {}
    if view.state == AppState.SUCCEEDED:  # the engine says every replica did
        events = [policy.Exit(r.name, k, 0) for r in shape for k in range(r.replicas)]
    elif view.state == AppState.CANCELLED:
        events.append(policy.Cancel(view.msg))
    elif view.state == AppState.FAILED and view.first_failure is not None:
        role_name, k = view.first_failure
        role = next((r for r in shape if r.name == role_name), RoleShape(role_name, 1))
        if _preempted(view, role_name, k):
            events.append(policy.Lost(role_name, k, view.msg))
        else:
            events.append(policy.Exit(role_name, k, 1, view.msg))  # the code is the backend's to read
        scope = [r.name for r in shape] if role.policy == "APPLICATION" else [role_name]
        by_role = role_preemptions if role_preemptions is not None else dict.fromkeys(scope, preemptions)
        failed_tries = max((attempts.get(r, 0) - by_role.get(r, 0) for r in scope), default=0)
        retries[role_name] = role.max_retries if role.policy == "REPLICA" else max(0, failed_tries)
    return events, retries


def count_preemptions(events: Iterable[Iterable[str]]) -> tuple[int, dict[str, int]]:
    """The ``preemptions`` and ``role_preemptions`` of :func:`decide` from an app's preemption restarts,
    each given as the roles it restarted (a :class:`Retry` with ``preemption``: its ``roles``).

    Two ROLE-scope preemptions of different roles are two restarts even when both start try 1, which
    counting try numbers alone would merge; a restart of every role counts once for the app and once for
    each role."""
    total, by_role = 0, dict[str, int]()
    for roles in events:
        total += 1
        for r in set(roles):
            by_role[r] = by_role.get(r, 0) + 1
    return total, by_role


def _preempted(view: AppStatusView, role: str, k: int) -> bool:
    """Whether replica ``k`` of ``role`` was ended by the cluster (its status's ``preempted`` flag)."""
    for rs in view.roles:
        if rs.role == role:
            return any(r.id == k and r.preempted for r in rs.replicas)
    return False
