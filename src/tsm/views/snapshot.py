"""The :class:`Snapshot` model behind ``tsm top`` and ``tsm serve``, and the one batched refresh that fills it.

A snapshot lists the newest apps launched through tsm (the history) with their roles and replicas: state,
host, attempt, exit code, last log line, requested and used CPU / memory / GPU. The model's types
(:class:`~tsm.schedulers.common.viewmodel.AppSummary`, :class:`~tsm.schedulers.common.viewmodel.ReplicaSummary`)
live in the scheduler kit, so backends build them without importing this package; ``AppView`` and
``ReplicaView`` are their old names here.

The collector knows no backend. **Cost of a refresh** (:meth:`SnapshotCollector.refresh`), whatever the number
of apps and replicas:

* the history: one store query, and one more for apps held for others (:mod:`tsm.runner.after`) when the
  schedulers do not report some;
* each scheduler that declares :class:`~tsm.schedulers.api.BatchedViews`: one ``view_snapshot`` call, which
  makes one batched query of its backend (local: two store queries, :mod:`tsm.schedulers.local.view`; Slurm:
  one ``squeue`` plus one ``sstat``; Docker: one container list; Kubernetes: one pod list; Ray: one job list).
  One that declares :class:`~tsm.schedulers.api.DetailedViews` is told which apps need their last log lines;
* any other scheduler: one ``list()`` plus one ``describe()`` per *app* still running (never per replica); an
  ended app is described once and remembered, since terminal states are sticky;
* replicas that report a ``pid`` (processes on this host): one walk of the process table
  (:class:`~tsm.views.usage.UsageProbe`) for their CPU, memory and GPU use.

Usage and last log lines can be limited to the apps a view shows them for (``refresh(detail=...)``): ``tsm
top`` shows them for the selected app only.

:attr:`Snapshot.calls` counts these calls per source, so the cost is a figure a test can check.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from tsm.runner import after as _after
from tsm.schedulers.api import BatchedViews, DetailedViews
from tsm.schedulers.common.viewmodel import (
    AppSummary,
    LastLines as LastLines,
    ReplicaSummary,
    requests_of as requests_of,
    settled as settled,
    view_of_describe as view_of_describe,
)
from tsm.views.sweeps import SweepGroup, sweep_duration, sweep_error
from tsm.views.usage import Usage, UsageProbe

#: The view model under its earlier names (kept for code that imports them from here).
AppView = AppSummary
ReplicaView = ReplicaSummary
#: The batched-views capability under its earlier name (now declared: ``isinstance`` is nominal).
BatchSnapshot = BatchedViews

#: How many of the newest apps a snapshot shows by default.
DEFAULT_LIMIT = 200


@dataclass
class Snapshot:
    """Every app a view shows at one instant, and what the refresh cost."""

    taken: float
    apps: list[AppSummary]
    calls: dict[str, int] = field(default_factory=dict)  #: source -> calls made for this refresh
    errors: dict[str, str] = field(default_factory=dict)  #: scheduler -> why it could not be read
    #: the sweeps recorded here, newest first: their trials are apps of ``apps`` (see :mod:`tsm.views.sweeps`)
    sweeps: list[SweepGroup] = field(default_factory=list)

    def app(self, key: str) -> AppSummary | None:
        """The app whose handle or app id is ``key``."""
        return next((a for a in self.apps if key in (a.handle, a.app_id)), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``/api/apps`` returns)."""
        by = {a.handle: a for a in self.apps}
        return {
            "taken": self.taken, "calls": dict(self.calls), "errors": dict(self.errors),
            "apps": [a.to_dict(self.taken) for a in self.apps],
            "sweeps": [self._sweep_dict(g, by) for g in self.sweeps],
        }

    def _sweep_dict(self, g: SweepGroup, by: dict[str, AppSummary]) -> dict[str, Any]:
        """A sweep as JSON, with how long it ran and its last error (what ``tsm top`` shows on its line)."""
        trials = [by[h] for h in g.trials if h in by]
        return {**g.to_dict(), "duration": sweep_duration(g, trials, self.taken), "last_error": sweep_error(g, trials)}


class SnapshotCollector:
    """Builds snapshots; keep one across ticks (it remembers CPU times and ended apps).

    ``store`` is the :class:`tsm.store.Store` holding the history (default: the one under ``$TSM_HOME``);
    ``runner`` gives the schedulers (default: :func:`tsm.runner.api.get_runner` on first use).
    """

    def __init__(
        self, store: Any = None, runner: Any = None, limit: int | None = DEFAULT_LIMIT, probe: UsageProbe | None = None
    ) -> None:
        if store is None:
            from tsm.store import Store

            store = Store()
        self.store = store
        self._runner = runner
        self.limit = limit
        self.probe = probe if probe is not None else UsageProbe()
        self._ended: dict[str, AppSummary] = {}  # handle -> view of an ended app on a scheduler without the hook
        self._host = socket.gethostname()

    @property
    def runner(self) -> Any:
        """The runner whose schedulers are asked (created on first use)."""
        if self._runner is None:
            from tsm.runner.api import get_runner

            self._runner = get_runner()
        return self._runner

    def refresh(self, detail: Collection[str] | None = None) -> Snapshot:
        """One snapshot of the ``limit`` newest apps: one batched call per scheduler (see the module doc).

        ``detail``: handles of the apps whose replicas need usage and last log lines (None: all). A view
        that shows them for one app at a time (``tsm top``) passes that app, so a tick with 1,000 running
        local replicas reads the process table and log files of that app's replicas only; the others keep
        their usage ``None`` and an empty last line.
        """
        from tsm.history import History

        calls: dict[str, int] = {"store": 0}
        errors: dict[str, str] = {}
        rows = History(self.store).recent(self.limit)
        calls["store"] += 1
        by_sched: dict[str, list[Any]] = {}
        for r in rows:
            by_sched.setdefault(r.scheduler, []).append(r)
        views: dict[str, AppSummary] = {}
        wanted = None if detail is None else {r.app_id for r in rows if r.handle in detail}
        for name, recs in by_sched.items():
            try:
                got = self._collect(name, recs, calls, wanted)
            except Exception as e:  # noqa: BLE001 - one unreachable backend must not hide the others
                errors[name] = f"{type(e).__name__}: {e}"
                got = {}
            unreported = [r.handle for r in recs if r.app_id not in got]
            held = {}
            if unreported:  # apps held for others (their scheduler does not know them yet)
                held = _after.messages(self.store, unreported)
                calls["store"] += 1
            for r in recs:
                v = got.get(r.app_id)
                if v is None:  # the scheduler no longer reports it: the history's record (an end when it ended)
                    state, msg = held.get(r.handle, (r.state, ""))
                    v = AppSummary(r.handle, r.scheduler, r.app_id, r.name, state.name, created=r.created,
                                   ended=r.updated if state.is_terminal else None, last_error=msg)
                v.handle, v.scheduler, v.name = r.handle, r.scheduler, v.name or r.name
                views[r.handle] = v
        self._usage([a for a in views.values() if detail is None or a.handle in detail], calls)
        self._ended = {k: v for k, v in self._ended.items() if k in views}
        sweeps = self._sweeps(calls, errors)
        return Snapshot(time.time(), [views[r.handle] for r in rows], calls, errors, sweeps)

    @staticmethod
    def _sweeps(calls: dict[str, int], errors: dict[str, str]) -> list[SweepGroup]:
        """The sweeps recorded here (``calls["sweeps"]``: how many state files were read; absent when none)."""
        from tsm.views.sweeps import sweep_groups

        try:
            groups = sweep_groups()
        except Exception as e:  # noqa: BLE001 - the apps are still shown, unfolded
            errors["sweeps"] = f"{type(e).__name__}: {e}"
            return []
        if groups:
            calls["sweeps"] = len(groups)
        return groups

    def _usage(self, apps: list[AppSummary], calls: dict[str, int]) -> None:
        """Fill in CPU / memory / GPU used by running replicas that are processes here: one process-table walk."""
        running = [r for a in apps for r in a.replicas if r.pid and r.host in ("", self._host)]
        if not running:
            return
        before = self.probe.scans
        usage = self.probe.sample(r.pid for r in running if r.pid)
        calls["proc"] = calls.get("proc", 0) + self.probe.scans - before
        for r in running:
            u = usage.get(r.pid or 0, Usage())
            r.cpu_used, r.mem_used_mb, r.gpu_mem_mb = u.cpu, u.mem_mb, u.gpu_mem_mb

    def _collect(
        self, name: str, recs: list[Any], calls: dict[str, int], detail: Collection[str] | None
    ) -> dict[str, AppSummary]:
        """Views from the scheduler's batched-views capability, else one list() plus one describe() per running app."""
        sched = self.runner.scheduler(name)
        ids = [r.app_id for r in recs]
        if isinstance(sched, BatchedViews):
            calls[f"{name}.view_snapshot"] = calls.get(f"{name}.view_snapshot", 0) + 1
            got = sched.view_snapshot(ids, detail) if isinstance(sched, DetailedViews) else sched.view_snapshot(ids)
            return {v.app_id: v for v in got}
        out: dict[str, AppSummary] = {}
        pending = [r for r in recs if r.handle not in self._ended]
        for r in recs:
            if r.handle in self._ended:
                out[r.app_id] = self._ended[r.handle]
        if not pending:
            return out
        calls[f"{name}.list"] = calls.get(f"{name}.list", 0) + 1
        listed = {a.app_id: a for a in sched.list()}
        for r in pending:
            if r.app_id not in listed and r.state.is_terminal:
                continue  # gone from the backend: the history's last state stands
            calls[f"{name}.describe"] = calls.get(f"{name}.describe", 0) + 1
            desc = sched.describe(r.app_id)
            if desc is None:
                continue
            view = view_of_describe(desc, r.scheduler, handle=r.handle, name=r.name)
            view.created = view.created or r.created
            if desc.state.is_terminal:
                self._ended[r.handle] = view
            out[r.app_id] = view
        return out
