"""Stall detection on Docker (``-c stall_timeout=15m``, ``-c on_stall=restart|fail``), done by tsm when it
looks at an app, as the time limit is.

A replica is stalled when, for ``stall_timeout``, its log has not grown and its container used no CPU time.
Docker has no call that answers either for many containers at once, so a check costs, per running
container: one ``logs(tail=1, timestamps=True)`` (the timestamp of the last line Docker recorded, and the
line quoted in the message) and, only for a container whose log did not move since the previous check, one
``one_shot`` stats read (``cpu_stats.cpu_usage.total_usage``; moving means :data:`CPU_MOVED_NS` or more
since the previous check). Checks are spaced a tick apart (a tenth of
``stall_timeout``, 0.2 s to 30 s) whoever looks, however often: the marks of the previous check are kept in
the app's directory (``stall.json``), so a ``tsm status`` from another process continues the same clock. A
container first seen, or whose log or CPU time moved, starts its quiet period at that check, so a stall is
reported between ``stall_timeout`` and ``stall_timeout`` + two ticks after the replica's last progress.

What a stall does is decided by the scheduler (:meth:`~tsm.schedulers.docker.scheduler.DockerScheduler`):
the replica is warned (``warn_signal``; ``warn_before`` later it is stopped) and then ``on_stall=restart``:
stopped as its own failure (its role's retry policy and ``max_retries``, ``TSM_LAST_EXIT=stalled``; a
REPLICA role's replica, once stopped, is recreated in place with ``TSM_LAST_EXIT=stalled`` while the restarts
it had, Docker's and the stall restarts together, are fewer than ``max_retries``: Docker's own restart policy
does not restart a container that was stopped, and ``docker restart`` would keep the first attempt's
environment), or ``on_stall=fail``: the app fails with "stalled for 15m, last line: ...". A replica tsm
stopped for a stall is FAILED whatever its exit code.

**Two processes.** ``tsm status`` may look at an app while an attached ``tsm run`` does: the check, what it
decides and the save of ``stall.json`` run under an exclusive ``flock`` of the app's ``lock`` file
(:func:`locked`), so a stall is acted on once and no count is lost; one-time markers are created with
``O_CREAT | O_EXCL`` (:func:`claim`), so exactly one process sends a warning.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tsm.schedulers.common.appdir import AppDir
from tsm.schedulers.common.stall import QUOTE_MAX, TICK_MAX, TICK_MIN, stall_message, tick
from tsm.schedulers.docker.client import DockerClient
from tsm.schedulers.docker.status import Observed

#: the file in the app's directory that keeps the checks' marks and the stalls found
STALL_FILE = "stall.json"
#: the CPU mark of a container whose stats could not be read (the log alone decides)
NO_CPU = -1
#: CPU time (ns) a container must use between two checks to count as moving: 10 ms, a clock tick of
#: ``/proc`` (what the local scheduler's check can see). The container's init (``docker-init``, which wakes
#: every second to reap) uses about 25 us a second (measured), under a millisecond per 30 s tick, so an idle
#: replica reads as idle; a replica at work uses far more than 10 ms in a tick of 0.2 s or more.
CPU_MOVED_NS = 10_000_000


def _idle(before: int | None, now: int | None) -> bool:
    """Whether the CPU time from one check to the next did not move: by less than :data:`CPU_MOVED_NS`
    (both unknown counts as idle: the log alone decides)."""
    if before is None or now is None:
        return False
    if before == NO_CPU or now == NO_CPU:
        return before == now
    return now - before < CPU_MOVED_NS


@dataclass
class StallState:
    """What ``stall.json`` keeps: the last check's time, each running container's marks, the stalls found
    (container id -> message), the REPLICA replicas to recreate once their stopped container has ended
    (container id -> message), the restarts each REPLICA replica (``role/k``) spent on the containers it
    had before (Docker's and the stall restarts), and the app's failure with ``on_stall=fail``."""

    checked: float = 0.0
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    stalled: dict[str, str] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    failed: str = ""
    in_place: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, d: AppDir) -> StallState:
        try:
            data = json.loads(d.read(STALL_FILE) or "{}")
            return cls(float(data.get("checked", 0.0)), dict(data.get("marks", {})), dict(data.get("stalled", {})),
                       {str(k): int(v) for k, v in data.get("restarts", {}).items()}, str(data.get("failed", "")),
                       {str(k): str(v) for k, v in data.get("in_place", {}).items()})
        except (ValueError, TypeError, AttributeError):
            return cls()

    def save(self, d: AppDir) -> None:
        d.write(STALL_FILE, json.dumps({"checked": self.checked, "marks": self.marks, "stalled": self.stalled,
                                        "restarts": self.restarts, "failed": self.failed,
                                        "in_place": self.in_place}, sort_keys=True))


def last_line(client: DockerClient, container_id: str) -> tuple[str, str]:
    """``(timestamp, text)`` of the last line Docker recorded for a container (``("", "")`` when none)."""
    raw = client.logs(container_id, True, True, timestamps=True, tail=1).decode("utf-8", "replace").strip("\n")
    if not raw:
        return "", ""
    stamp, _, text = raw.rpartition("\n")[2].partition(" ")
    return stamp, text.rstrip("\r")


def cpu_ns(client: DockerClient, container_id: str) -> int:
    """The container's CPU time so far (ns), or :data:`NO_CPU` when Docker does not say."""
    try:
        return int(client.stats(container_id)["cpu_stats"]["cpu_usage"]["total_usage"])
    except Exception:  # noqa: BLE001 (no figure: an old engine, a container that just ended, ...)
        return NO_CPU


def check(client: DockerClient, state: StallState, containers: Sequence[Observed], timeout: float,
          now: float) -> list[tuple[Observed, str]]:
    """One check (when a tick has passed since the last): the running containers of ``containers`` that made
    no progress for ``timeout``, with their stall message. Updates ``state`` (the caller saves it)."""
    if now - state.checked < tick(timeout):
        return []
    state.checked = now
    found: list[tuple[Observed, str]] = []
    marks: dict[str, dict[str, Any]] = {}
    for c in containers:
        if c.state != "running" or c.id in state.stalled or c.id in state.in_place:
            continue
        prev = state.marks.get(c.id)
        stamp, text = last_line(client, c.id)
        same_log = prev is not None and prev.get("log") == stamp
        cpu = cpu_ns(client, c.id) if same_log else None
        mark: dict[str, Any] = {"log": stamp, "cpu": cpu, "since": now}
        if same_log and prev is not None and _idle(prev.get("cpu"), cpu):
            mark["since"] = float(prev.get("since", now))
            if now - mark["since"] >= timeout:
                found.append((c, stall_message(timeout, text)))
        marks[c.id] = mark
    state.marks = marks
    return found


__all__ = ["QUOTE_MAX", "STALL_FILE", "TICK_MAX", "TICK_MIN", "StallState", "check", "cpu_ns",
           "last_line", "stall_message", "tick"]
