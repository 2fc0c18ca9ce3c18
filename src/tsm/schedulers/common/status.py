"""Backend states as :class:`AppState`, and which replica an app's failure belongs to.

A backend writes its state names down once, as a :class:`StateTable`::

    TABLE = StateTable(
        {AppState.PENDING: {"PENDING", "QUEUED"}, AppState.RUNNING: {"RUNNING"}, ...},
        flags={"COMPLETING": AppState.RUNNING},   # names that override the base state when they follow it
    )
    TABLE.state("RUNNING")                        # -> AppState.RUNNING; an unknown name -> UNKNOWN

:func:`attribute_failure` then reads per-replica status and says which replica failed first: the app's
message names it, and replicas that were only stopped because of it are CANCELLED, not FAILED.

A backend that sees each replica's own object (a container, a pod) gives :func:`aggregate_roles` the app's
shape and how to read one replica; it returns the roles in the app's order and the app's state
(:class:`AppStatusView`), the first failure named and the replicas stopped after it CANCELLED.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tsm.specs.api import AppState, ReplicaStatus, RoleStatus

#: Checked in this order when a name is in several sets (a job COMPLETED is not also RUNNING).
_PRECEDENCE = (
    AppState.SUCCEEDED,
    AppState.CANCELLED,
    AppState.FAILED,
    AppState.RUNNING,
    AppState.PENDING,
    AppState.SUBMITTED,
    AppState.UNSUBMITTED,
)


class StateTable:
    """A backend's state names mapped to :class:`AppState` (names compared upper-case)."""

    def __init__(
        self, states: Mapping[AppState, Iterable[str]], flags: Mapping[str, AppState] | None = None
    ) -> None:
        self._by_name: dict[str, AppState] = {}
        for app_state in reversed(_PRECEDENCE):  # earlier in the precedence wins: written last
            for name in states.get(app_state, ()):
                self._by_name[name.upper()] = app_state
        self._flags = {k.upper(): v for k, v in (flags or {}).items()}

    def names(self, app_state: AppState) -> set[str]:
        """The backend names that map to ``app_state``."""
        return {n for n, s in self._by_name.items() if s == app_state}

    def state(self, names: str | Iterable[str]) -> AppState:
        """The :class:`AppState` of a base state name, optionally followed by flag names that override it."""
        items = [names.upper()] if isinstance(names, str) else [n.upper() for n in names]
        for name in items[1:]:
            if name in self._flags:
                return self._flags[name]
        for name in items:
            if name in self._by_name:
                return self._by_name[name]
        return AppState.UNKNOWN


def attribute_failure(roles_statuses: list[RoleStatus]) -> str:
    """Name the first replica that failed with an exit code of its own; mark those stopped after it.

    Returns ``"role 'r' replica k exited with code c"`` (or ``""`` when no replica failed by itself). Every
    other replica that is FAILED without an exit code was stopped because of that failure, so it becomes
    CANCELLED with ``error_msg`` ``"stopped after <failure>"``.
    """
    failure = ""
    for rs in roles_statuses:
        for r in rs.replicas:
            if r.state == AppState.FAILED and r.exit_code not in (None, 0):
                failure = f"role '{rs.role}' replica {r.id} exited with code {r.exit_code}"
                break
        if failure:
            break
    if failure:
        for rs in roles_statuses:
            for r in rs.replicas:
                if r.state == AppState.FAILED and r.exit_code is None:
                    r.state = AppState.CANCELLED
                    r.error_msg = f"stopped after {failure}"
    return failure


@dataclass
class AppStatusView:
    """An app's state as computed from one refresh (:func:`aggregate_roles`)."""

    state: AppState
    msg: str
    roles: list[RoleStatus]
    num_restarts: int
    #: (role, replica) of the first replica that failed for good, if any
    first_failure: tuple[str, int] | None = None
    #: the first reason a replica gives for not running yet (for a gang timeout)
    pending_reason: str = ""
    #: True when every replica has run (Running, or already ended)
    all_started: bool = False


#: What a backend reads of one replica: its status, when it ended (comparable with the other replicas'
#: values: the earliest failure is the app's), and the phrase the app's failure message ends with.
Seen = tuple[ReplicaStatus, Any, str]


def aggregate_roles(
    shape: Iterable[Sequence[Any]], seen: Callable[[Sequence[Any], int], Seen | None], attempt: int = 0
) -> AppStatusView:
    """Roles and replicas in the app's order, the app's state, and which replica failed first.

    ``shape`` is the app's ``[role, replicas, ...]`` rows; ``seen(row, k)`` reads replica ``k`` of a row
    (None: the engine shows nothing of it yet, so it is PENDING). The app is FAILED when a replica is
    (``role 'r' replica k <phrase>``, the earliest to end; the other FAILED ones become CANCELLED, "stopped
    after" it), SUCCEEDED when every replica is, RUNNING when one runs or is done, else PENDING; the message
    of the last two is the first PENDING replica's reason. Restarts add up the replicas' and ``attempt``
    (the app's ROLE/APPLICATION retries).
    """
    roles: list[RoleStatus] = []
    states: list[AppState] = []
    failures: list[tuple[Any, str, int, str]] = []
    pending_reason = ""
    started = True
    for row in shape:
        role_name, n = row[0], row[1]
        rs = RoleStatus(role_name)
        for k in range(int(n)):
            got = seen(row, k)
            r = got[0] if got is not None else ReplicaStatus(id=k, state=AppState.PENDING, role=role_name)
            rs.replicas.append(r)
            states.append(r.state)
            if r.state == AppState.PENDING:
                started = False
                if r.error_msg and not pending_reason:
                    pending_reason = f"role '{role_name}' replica {k}: {r.error_msg}"
            if r.state == AppState.FAILED and got is not None:
                failures.append((got[1], role_name, k, got[2]))
        roles.append(rs)
    restarts = sum(r.restarts for rs in roles for r in rs.replicas) + attempt
    if failures:
        _, role_name, k, why = min(failures, key=lambda f: f[0])
        for rs in roles:
            for r in rs.replicas:
                if r.state == AppState.FAILED and (rs.role, r.id) != (role_name, k):
                    r.state = AppState.CANCELLED
                    r.error_msg = f"stopped after role '{role_name}' replica {k} failed"
        return AppStatusView(AppState.FAILED, f"role '{role_name}' replica {k} {why}", roles, restarts,
                             (role_name, k), pending_reason, started)
    if states and all(s == AppState.SUCCEEDED for s in states):
        return AppStatusView(AppState.SUCCEEDED, "", roles, restarts, None, "", True)
    if any(s in (AppState.RUNNING, AppState.SUCCEEDED) for s in states):
        return AppStatusView(AppState.RUNNING, pending_reason, roles, restarts, None, pending_reason, started)
    return AppStatusView(AppState.PENDING, pending_reason, roles, restarts, None, pending_reason, started)
