"""Pure: Docker's container records -> replica and app statuses.

Input is what one ``containers.list(all=True, sparse=True)`` by label gives (``State``, ``Status``,
``Labels``), completed for ended containers by one ``inspect`` each, made once per container and cached
by the client (:class:`Observed`): exit code, ``OOMKilled``, ``RestartCount``, ``FinishedAt``. Nothing here
blocks on ``wait()``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tsm.schedulers.common.status import AppStatusView, Seen, StateTable, aggregate_roles
from tsm.schedulers.docker.request import (
    LABEL_APP,
    LABEL_ATTEMPT,
    LABEL_CREATED,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_ROLES,
)
from tsm.specs.api import AppState, ReplicaStatus

#: Docker's container states (``State.Status``).
STATES = StateTable({
    AppState.PENDING: {"created"},
    AppState.RUNNING: {"running", "restarting", "paused", "removing"},
    AppState.FAILED: {"dead"},
    AppState.SUCCEEDED: set(),
})

_EXITED = re.compile(r"Exited \((-?\d+)\)")


@dataclass
class Observed:
    """One container as seen by a refresh: summary fields, plus the inspected end when it has ended."""

    id: str
    name: str
    state: str
    labels: dict[str, str]
    exit_code: int | None = None
    oom_killed: bool = False
    restarts: int = 0
    finished_at: str = ""
    started_at: str = ""
    error: str = ""
    #: set when the container ended and will not be restarted by Docker (its record no longer changes)
    final: bool = False

    @property
    def app_id(self) -> str:
        return self.labels.get(LABEL_APP, "")

    @property
    def role(self) -> str:
        return self.labels.get(LABEL_ROLE, "")

    @property
    def replica_id(self) -> int:
        return int(self.labels.get(LABEL_REPLICA, "0"))

    @property
    def attempt(self) -> int:
        return int(self.labels.get(LABEL_ATTEMPT, "0"))


def from_summary(summary: dict[str, Any]) -> Observed:
    """An :class:`Observed` from a ``/containers/json`` entry (exit code read from its ``Status`` text)."""
    names = summary.get("Names") or [""]
    status = str(summary.get("Status", ""))
    m = _EXITED.search(status)
    return Observed(
        id=str(summary.get("Id", "")),
        name=str(names[0]).lstrip("/"),
        state=str(summary.get("State", "")).lower(),
        labels=dict(summary.get("Labels") or {}),
        exit_code=int(m.group(1)) if m else None,
    )


def complete(obs: Observed, attrs: dict[str, Any]) -> Observed:
    """Fill the end of ``obs`` from ``inspect``'s ``attrs``: exit code, OOM, restarts, whether it is final."""
    st = attrs.get("State", {})
    obs.state = str(st.get("Status", obs.state)).lower()
    obs.exit_code = int(st.get("ExitCode", 0))
    obs.oom_killed = bool(st.get("OOMKilled", False))
    obs.restarts = int(attrs.get("RestartCount", 0))
    obs.finished_at = str(st.get("FinishedAt", ""))
    obs.started_at = str(st.get("StartedAt", ""))
    obs.error = str(st.get("Error", "") or "")
    # Docker decides whether to restart a container as it records the exit (under the container's lock):
    # one it will restart is "restarting", so an "exited" one is final (retries spent, or stopped by hand)
    obs.final = obs.state in ("exited", "dead") and not st.get("Restarting", False)
    return obs


@dataclass
class AppView:
    """Everything a refresh saw of one app: its shape (from labels) and its containers."""

    app_id: str
    roles: list[list[Any]]
    created: float | None
    containers: list[Observed] = field(default_factory=list)

    @property
    def attempt(self) -> int:
        return max((c.attempt for c in self.containers), default=0)


def group(observed: list[Observed]) -> dict[str, AppView]:
    """Containers by app id (labels give each app's roles and creation time)."""
    apps: dict[str, AppView] = {}
    for o in observed:
        if not o.app_id:
            continue
        view = apps.get(o.app_id)
        if view is None:
            try:
                roles = json.loads(o.labels.get(LABEL_ROLES, "[]"))
            except ValueError:
                roles = []
            created = o.labels.get(LABEL_CREATED)
            view = apps[o.app_id] = AppView(o.app_id, roles, float(created) if created else None)
        view.containers.append(o)
    return apps


def replica_state(o: Observed) -> AppState:
    """The state of one replica's container."""
    if o.state in ("exited",):
        if not o.final:
            return AppState.RUNNING  # Docker restarts it (REPLICA retries)
        return AppState.SUCCEEDED if o.exit_code == 0 else AppState.FAILED
    return STATES.state(o.state)


def replica_status(o: Observed) -> ReplicaStatus:
    """A :class:`ReplicaStatus` of one container, with the OOM reason when the kernel killed it."""
    state = replica_state(o)
    msg = ""
    if state == AppState.FAILED:
        msg = f"exited with code {o.exit_code}"
        if o.oom_killed:
            msg = f"killed by the kernel: out of memory (its memory limit) -- exit code {o.exit_code}"
        elif o.error:
            msg = f"{msg}: {o.error}"
    return ReplicaStatus(
        id=o.replica_id, state=state, role=o.role, hostname=o.name, exit_code=o.exit_code if o.final else None,
        error_msg=msg, restarts=o.restarts,
    )


def app_status(view: AppView) -> AppStatusView:
    """Roles and replicas in the app's order, its state, and which replica failed first
    (:func:`~tsm.schedulers.common.status.aggregate_roles` over the app's containers)."""
    by_key = {(c.role, c.replica_id): c for c in view.containers}

    def seen(row: Sequence[Any], k: int) -> Seen | None:
        c = by_key.get((row[0], k))
        if c is None:
            return None
        why = "ran out of memory" if c.oom_killed else f"exited with code {c.exit_code}"
        return replica_status(c), c.finished_at, why

    return aggregate_roles(view.roles or [[c.role, 1] for c in view.containers], seen, view.attempt)


def parse_time(text: str) -> float | None:
    """Docker's RFC 3339 time with nanoseconds (``2026-11-25T13:19:04.123456789Z``) as epoch seconds;
    None for an empty one or Docker's "never" (``0001-01-01T00:00:00Z``)."""
    if not text or text.startswith("0001-"):
        return None
    base, _, frac = text.rstrip("Z").partition(".")
    try:
        when = datetime.fromisoformat(base + "+00:00").timestamp()
        return when + (float("0." + frac[:6]) if frac and frac[:6].isdigit() else 0.0)
    except ValueError:
        return None


def app_times(containers: Sequence[Observed]) -> tuple[float | None, float | None]:
    """``(started, ended)`` of an app from its inspected containers: the first start, and the last end once
    every container has ended for good (None while one still runs or nothing is known)."""
    starts = [t for c in containers if (t := parse_time(c.started_at)) is not None]
    ends = [parse_time(c.finished_at) for c in containers]
    ended = max(e for e in ends if e is not None) if containers and all(c.final for c in containers) and any(
        e is not None for e in ends) else None
    return (min(starts) if starts else None), ended
