"""The local scheduler's batched-views hook: every local app of a ``tsm top``/``tsm serve`` tick from two store queries.

:class:`LocalViews` is the :class:`~tsm.schedulers.api.DetailedViews` capability of
:class:`~tsm.schedulers.local.scheduler.LocalScheduler`: ``view_snapshot(app_ids, detail)`` reads the
scheduler's own tables (``local_apps``, ``local_replicas``) once each, whatever the number of apps and
replicas, and the last line of each replica's log files for the apps in ``detail`` (re-read only when a file
grew, see :class:`~tsm.schedulers.common.viewmodel.LastLines`). A running replica's summary carries its
``pid``, so the views can measure its CPU and memory on this host.

An app whose supervisor and watchdog are both gone has a stale state: such an app is described once
(which records why it ended) and the tables are read again. Rare; the cost stays two queries otherwise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from tsm.schedulers.api import DetailedViews
from tsm.specs.api import AppState

if TYPE_CHECKING:
    from tsm.schedulers.common.viewmodel import AppSummary

#: AppState by its stored value (a dict lookup: 1,000 replicas a tick make ``AppState(v)`` show in profiles).
_STATE = {s.value: s for s in AppState}

Requests = dict[str, tuple[float | None, float | None, int | None]]


class LocalView:
    """Builds the summaries of local apps; one per scheduler, kept across ticks (log tails, parsed requests)."""

    def __init__(self, sched: Any) -> None:
        # imported here, not at module level: the scheduler mixes this class in, and `tsm status`/`list`
        # (which build no summaries) should not pay for the view model's dataclasses
        from tsm.schedulers.common.viewmodel import LastLines

        self.sched = sched
        self.tails = LastLines()
        self._reqs: dict[str, Requests] = {}  # app id -> role requests (an app's spec never changes)
        self._host = os.uname().nodename  # what socket.gethostname() returns on Linux
        #: store queries made by :meth:`snapshot` so far (a figure a test can check)
        self.queries = 0

    def snapshot(self, app_ids: Sequence[str], detail: Collection[str] | None = None) -> list[AppSummary]:
        """A summary of each of ``app_ids`` the scheduler knows; last log lines for the ids in ``detail``."""
        out = self._read(list(app_ids), detail, retry=True)
        shown = set(app_ids)
        self._reqs = {k: v for k, v in self._reqs.items() if k in shown}
        self.tails.prune()
        return out

    def _read(self, app_ids: list[str], detail: Collection[str] | None, retry: bool) -> list[AppSummary]:
        if not app_ids:
            return []
        store = self.sched.store
        marks = ",".join("?" * len(app_ids))
        apps = store.query(f"SELECT * FROM local_apps WHERE app_id IN ({marks})", tuple(app_ids))
        reps = store.query(
            f"SELECT * FROM local_replicas WHERE app_id IN ({marks}) ORDER BY app_id, rowid", tuple(app_ids)
        )
        self.queries += 2
        stale = [a["app_id"] for a in apps if _supervisor_gone(a)]
        if stale and retry:  # let the scheduler record why (one describe per such app, once)
            for app_id in stale:
                self.sched.describe(app_id)
            return self._read(app_ids, detail, retry=False)
        by_app: dict[str, list[Any]] = {}
        for rep in reps:
            by_app.setdefault(rep["app_id"], []).append(rep)
        from tsm.schedulers.common.viewmodel import AppSummary, ReplicaSummary, requests_of
        from tsm.schedulers.local.logs import replica_dir

        out = []
        for a in apps:
            req = self._reqs.get(a["app_id"])
            if req is None:
                req = self._reqs[a["app_id"]] = requests_of(json.loads(a["spec"]))
            state = _STATE[a["state"]]
            view = AppSummary(
                handle="", scheduler=self.sched.backend, app_id=a["app_id"], name=a["name"], state=state.name,
                created=a["created"], started=a["started"], ended=a["ended"], restarts=a["num_restarts"],
                last_error=a["msg"] if state == AppState.FAILED else "",
            )
            tails = detail is None or a["app_id"] in detail
            for rep in by_app.get(a["app_id"], []):
                cpu, mem, gpu = req.get(rep["role"], (None, None, None))
                rstate = _STATE[rep["state"]]
                view.replicas.append(ReplicaSummary(
                    role=rep["role"], idx=rep["idx"], state=rstate.name, host=self._host, attempt=rep["restarts"],
                    exit_code=rep["exit_code"], error=rep["error"], pid=None if rstate.is_terminal else rep["pid"],
                    cpu_req=cpu, mem_req_mb=mem, gpu_req=gpu,
                    last_line=self.tails.last(replica_dir(a["log_dir"], rep["role"], rep["idx"]), rstate.is_terminal)
                    if tails else "",
                ))
            if view.state == "FAILED" and not view.last_error:
                view.last_error = next((r.error for r in view.replicas if r.error), "")
            out.append(view)
        return out


def _supervisor_gone(row: Any) -> bool:
    """True when a running app's supervisor and watchdog are both known to be gone (its state is stale)."""
    from tsm.schedulers.local import _os

    if _STATE[row["state"]].is_terminal or not row["sup_pid"]:
        return False
    try:
        return not (_os.is_alive(row["sup_pid"], row["sup_start"])
                    or _os.is_alive(row["watchdog_pid"], row["watchdog_start"]))
    except OSError:
        return False


class LocalViews(DetailedViews):
    """The :class:`~tsm.schedulers.api.DetailedViews` capability, mixed into the local scheduler."""

    _local_view: LocalView | None = None

    def view_snapshot(self, app_ids: Sequence[str], detail: Collection[str] | None = None) -> list[AppSummary]:
        """Every app of ``app_ids`` from two store queries (see the module docstring)."""
        if self._local_view is None:
            self._local_view = LocalView(self)
        return self._local_view.snapshot(app_ids, detail)
