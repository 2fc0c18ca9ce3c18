"""Backend states as :class:`AppState`, and which replica an app's failure belongs to.

A backend writes its state names down once, as a :class:`StateTable`::

    TABLE = StateTable(
        {AppState.PENDING: {"PENDING", "QUEUED"}, AppState.RUNNING: {"RUNNING"}, ...},
        flags={"COMPLETING": AppState.RUNNING},   # names that override the base state when they follow it
    )
    TABLE.state("RUNNING")                        # -> AppState.RUNNING; an unknown name -> UNKNOWN

:func:`attribute_failure` then reads per-replica status and says which replica failed first: the app's
message names it, and replicas that were only stopped because of it are CANCELLED, not FAILED.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tsm.specs.api import AppState, RoleStatus

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
