"""Stall detection on Kubernetes (``-c stall_timeout=15m``, ``-c on_stall=restart|fail``), done by tsm when
it looks at an app, as the time limit's backstop is.

A replica is stalled when, for ``stall_timeout``, its pod's log has not grown and, where the cluster serves
the metrics API (``metrics.k8s.io``, metrics-server), its pod used no CPU. A check costs, per running pod,
one log read of the last line with the kubelet's timestamp (``tailLines=1, timestamps=true``: the line is
quoted in the message) and, only when some pod's log did not move since the previous check, ONE pod-metrics
list for the app (:meth:`~tsm.schedulers.kubernetes.client.KubeClient.pod_metrics`). metrics-server gives a
rate (cores, averaged over its window), not a CPU time: a pod counts as busy when it uses
:data:`CPU_BUSY_CORES` or more. **Without a metrics API (the test cluster of ``scripts/k8s-up`` runs no
metrics-server) the log alone decides**: a replica that computes for longer than ``stall_timeout`` without
writing a line is taken as stalled there.

Checks are spaced a tick apart (:func:`~tsm.schedulers.common.stall.tick`: a tenth of ``stall_timeout``,
0.2 s to 30 s) whoever looks: the marks of the previous check are kept in the app's directory
(``stall.json``), so ``tsm status`` from another process continues the same clock. A pod first seen, or
whose log (or CPU) moved, starts its quiet period at that check; a stall is reported between
``stall_timeout`` and ``stall_timeout`` + two ticks after the replica's last progress.

What a stall does is decided by the scheduler (:meth:`~tsm.schedulers.kubernetes.scheduler.KubernetesScheduler._look`):
the stalled pod is FAILED with "stalled for X, last line: ..." whatever its exit code, and then, with
``on_stall=restart``, retried as its own failure (the role's retry policy and ``max_retries``; the new try
sees ``TSM_LAST_EXIT=stalled``), its old pod deleted with the termination grace period, so the ``preStop``
hook warns it (``warn_signal``, ``warn_before``) before SIGTERM; or, with ``on_stall=fail``, the app fails
with that message and every pod is stopped the same way.

**Two processes.** A sweep's controller, ``tsm status`` and an attached ``tsm run`` may look at one app at
once: every look of an app this home submitted runs under an exclusive ``flock`` of the app directory's
``lock`` file (:func:`locked`), from the load of ``stall.json`` to its save and to what is done about it, so
a stall is acted on once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tsm.errors import SchedulerError
from tsm.schedulers.common.appdir import AppDir
from tsm.schedulers.common.stall import QUOTE_MAX, stall_message, tick
from tsm.schedulers.kubernetes.client import KubeClient
from tsm.schedulers.kubernetes.status import Pod

#: the file in the app's directory that keeps the checks' marks and the stalls found
STALL_FILE = "stall.json"
#: cores (metrics-server's rate) at or above which a pod counts as working: 10 millicores, a tenth of a
#: tenth of a core. An idle ``sleep`` reads 0 to 1 m; a replica at work reads hundreds.
CPU_BUSY_CORES = 0.01


@dataclass
class StallState:
    """What ``stall.json`` keeps: the last check's time, each running pod's marks (``log``: the last line's
    timestamp; ``since``: when its quiet period began), the stalls found (pod name -> message) and the
    app's failure with ``on_stall=fail``."""

    checked: float = 0.0
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    stalled: dict[str, str] = field(default_factory=dict)
    failed: str = ""

    @classmethod
    def load(cls, d: AppDir) -> StallState:
        try:
            data = json.loads(d.read(STALL_FILE) or "{}")
            return cls(float(data.get("checked", 0.0)), dict(data.get("marks", {})),
                       {str(k): str(v) for k, v in data.get("stalled", {}).items()}, str(data.get("failed", "")))
        except (ValueError, TypeError, AttributeError):
            return cls()

    def save(self, d: AppDir) -> None:
        d.write(STALL_FILE, json.dumps({"checked": self.checked, "marks": self.marks, "stalled": self.stalled,
                                        "failed": self.failed}, sort_keys=True))


def last_line(client: KubeClient, pod: str) -> tuple[str, str]:
    """``(timestamp, text)`` of the last line the kubelet keeps for ``pod`` (``("", "")`` when none)."""
    raw = client.log(pod, timestamps=True, tail=1).decode("utf-8", "replace").strip("\n")
    if not raw:
        return "", ""
    stamp, _, text = raw.rpartition("\n")[2].partition(" ")
    return stamp, text.rstrip("\r")


def _watched(p: Pod) -> bool:
    """A pod whose container runs now (not ended, not being deleted): the only ones a check reads."""
    return p.phase == "Running" and p.exit_code is None and not p.deleting and bool(p.started)


def check(client: KubeClient, app_id: str, state: StallState, pods: Sequence[Pod], timeout: float,
          now: float) -> list[tuple[Pod, str]]:
    """One check (when a tick has passed since the last): the running pods of ``pods`` that made no
    progress for ``timeout``, with their stall message. Updates ``state`` (the caller saves it)."""
    if now - state.checked < tick(timeout):
        return []
    state.checked = now
    quiet: list[tuple[Pod, str, dict[str, Any]]] = []
    marks: dict[str, dict[str, Any]] = {}
    for p in pods:
        if not _watched(p) or p.name in state.stalled:
            continue
        prev = state.marks.get(p.name)
        try:
            stamp, text = last_line(client, p.name)
        except SchedulerError:
            continue  # the pod went away under the read: the next look sees why
        mark: dict[str, Any] = {"log": stamp, "since": now}
        if prev is not None and prev.get("log") == stamp:
            mark["since"] = float(prev.get("since", now))
            quiet.append((p, text, mark))
        marks[p.name] = mark
    state.marks = marks
    if not quiet:
        return []
    usage = client.pod_metrics([app_id])  # one list for the app; None: no metrics API, the log alone decides
    found: list[tuple[Pod, str]] = []
    for p, text, mark in quiet:
        cores = (usage or {}).get(p.name, (0.0, 0.0))[0]
        if usage is not None and cores >= CPU_BUSY_CORES:
            mark["since"] = now  # it computes: its quiet period starts again
            continue
        if now - mark["since"] >= timeout:
            found.append((p, stall_message(timeout, text)))
    return found


__all__ = ["CPU_BUSY_CORES", "QUOTE_MAX", "STALL_FILE", "StallState", "check", "last_line"]
