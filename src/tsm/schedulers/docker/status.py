"""Pure: Docker's container records -> replica and app statuses.

Input is what one ``containers.list(all=True, sparse=True)`` by label gives (``State``, ``Status``,
``Labels``), completed for ended containers by one ``inspect`` each, made once per container and cached
by the client (:class:`Observed`): exit code, ``OOMKilled``, ``RestartCount``, ``FinishedAt``. Nothing here
blocks on ``wait()``.

**Preemption: a container ended by a daemon restart.** Without ``live-restore``, a dockerd that stops (a
restart, an upgrade, a reboot) stops every running container first (SIGTERM, SIGKILL after its stop timeout)
and one that dies leaves its containers to be killed when it starts again; neither is the program's failure.
The client learns when the daemon it talks to started: the default ``bridge`` network is deleted and made
again at every daemon start (measured on dockerd 20.10: its ``Created`` is the start, within 0.2 s, after a
clean stop and after a ``kill -9``), so a container that ended by the signals a stopping daemon sends (exit
143 SIGTERM or 137 SIGKILL; not the OOM killer) within :data:`DAEMON_WINDOW` seconds before that start,
having started before it, was ended by the daemon going down: :func:`ended_by_daemon_restart`. Any other exit
is the program's: a crash by its own signal (139 SIGSEGV, 134 SIGABRT, ...) stays a failure even when an
unrelated daemon restart follows before tsm's next look, and so does a SIGTERM/SIGKILL end long before the
daemon went down. Such a replica's status is ``preempted`` with the reason in its error, and the controller
restarts it on the ``max_preemptions`` budget. A container a person stopped by hand within the window before a
daemon restart is taken for preempted too (nothing Docker keeps tells the two apart); a daemon run with
``--bridge=none`` has no default bridge, so its restarts are not recognised (the replica fails as the
program's own failure). A container with Docker's restart policy
(REPLICA retries) is started again by the daemon itself as it starts (``RestartCount`` unchanged, so
``max_retries`` is untouched), with its first attempt's environment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tsm.lifecycle import PREEMPTED_PREFIX
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
#: the exits of a container a stopping daemon ends: SIGTERM (143), then SIGKILL (137) after its stop timeout
DAEMON_EXITS = (128 + 15, 128 + 9)
#: seconds before the daemon's start within which such an end counts as the daemon's: a daemon stops its
#: containers as it goes down (at most their stop timeout, 10 s by default, before it exits) and a service
#: manager starts it again within seconds; an end earlier than this was not caused by that restart
DAEMON_WINDOW = 60.0


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
    #: it was ended by the daemon going down (:func:`ended_by_daemon_restart`): the reason, else ""
    preempted: str = ""
    #: tsm stopped it as stalled (:mod:`tsm.schedulers.docker.stall`): the message, else ""
    stalled: str = ""

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


def ended_by_daemon_restart(obs: Observed, daemon_started: float | None) -> str:
    """Why ``obs`` counts as preempted by a restart of the daemon that started at ``daemon_started`` (see
    the module docstring), or "" when it does not: it ended for good by SIGTERM or SIGKILL (143, 137; not
    the OOM killer) within :data:`DAEMON_WINDOW` seconds before that start, after starting before it."""
    if daemon_started is None or not obs.final or obs.oom_killed or obs.exit_code not in DAEMON_EXITS:
        return ""
    ended, started = parse_time(obs.finished_at), parse_time(obs.started_at)
    if ended is None or started is None or not started <= ended <= daemon_started:
        return ""
    if daemon_started - ended > DAEMON_WINDOW:
        return ""  # it ended well before the daemon went down: not by that restart
    when = datetime.fromtimestamp(daemon_started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"the Docker daemon restarted (at {when}) and ended the container (exit code {obs.exit_code})"


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
        # a replica tsm stopped for a stall failed, whatever its exit code (a program may exit 0 on SIGTERM)
        return AppState.SUCCEEDED if o.exit_code == 0 and not o.stalled else AppState.FAILED
    return STATES.state(o.state)


def replica_status(o: Observed) -> ReplicaStatus:
    """A :class:`ReplicaStatus` of one container, with the OOM reason when the kernel killed it."""
    state = replica_state(o)
    msg = ""
    if state == AppState.FAILED:
        msg = f"exited with code {o.exit_code}"
        if o.stalled:
            msg = o.stalled
        elif o.preempted:
            msg = PREEMPTED_PREFIX + o.preempted
        elif o.oom_killed:
            msg = f"killed by the kernel: out of memory (its memory limit) -- exit code {o.exit_code}"
        elif o.error:
            msg = f"{msg}: {o.error}"
    return ReplicaStatus(
        id=o.replica_id, state=state, role=o.role, hostname=o.name, exit_code=o.exit_code if o.final else None,
        error_msg=msg, restarts=o.restarts, preempted=bool(o.preempted) and state == AppState.FAILED,
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
        if c.preempted:
            why = f"was preempted: {c.preempted}"
        if c.stalled:
            why = c.stalled
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
