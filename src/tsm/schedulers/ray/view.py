"""The views' batch hook for Ray: every app of a ``tsm top`` / ``tsm serve`` tick from one job-list call.

:meth:`RayScheduler.view_snapshot <tsm.schedulers.ray.scheduler.RayScheduler.view_snapshot>` hands the app
ids of a tick to :class:`RayView`, which makes, whatever the number of apps and replicas:

* **one** ``list_jobs`` call to the cluster's job API (one per cluster when apps were submitted with
  ``-c address=`` to several): every app's state, message and shape (roles and replica counts are in the
  job's metadata);
* reads of the driver's status record (``tsm/<app>/status.json``, through the dashboard's log API: one
  HTTP call per *app*, never per replica), which refines the replicas (state, node, exit code, error,
  restarts): an app's record is read when its job's status changed since the last read (so a failure
  shows with its reason on the tick that sees it) and otherwise at most every :data:`RECORD_INTERVAL`
  seconds, at most :data:`MAX_READS` apps per tick (those read longest ago first); an ended app is read
  once more and then remembered.

Usage (CPU, memory, GPU) and the last log line are n/a for Ray: the State API has no per-actor usage, and a
replica's log is one read per replica.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from tsm.schedulers.common.record import AppRecord
from tsm.schedulers.common.viewmodel import AppSummary, requests_of, settled, view_of_describe
from tsm.schedulers.ray import status as st
from tsm.schedulers.ray.request import META_APP


class RaySource(Protocol):
    """What the view asks of the Ray scheduler (:class:`~tsm.schedulers.ray.scheduler.RayScheduler`)."""

    def address_of(self, app_id: str) -> str: ...

    def client(self, address: str = "") -> Any: ...

    def record_of(self, job: Any, address: str = "") -> dict[str, Any] | None: ...

    def app_record(self, app_id: str) -> AppRecord | None: ...


#: Seconds between two reads of a running app's status record when its job's status has not changed.
RECORD_INTERVAL = 5.0
#: Status records read per tick at most (beyond it, the ones read longest ago go first next tick).
MAX_READS = 8


class RayView:
    """Builds the views of Ray apps for a tick; one per scheduler, kept across ticks (see the module doc)."""

    def __init__(self, sched: RaySource) -> None:
        self.sched = sched
        self._ended: dict[str, AppSummary] = {}
        self._records: dict[str, tuple[str, float, dict[str, Any] | None]] = {}  # app -> (job status, when, record)
        self._reqs: dict[str, dict[str, tuple[float | None, float | None, int | None]]] = {}

    def snapshot(self, app_ids: Sequence[str]) -> list[AppSummary]:
        """Views of the apps of ``app_ids`` the cluster knows; see the module doc."""
        ids = list(dict.fromkeys(app_ids))
        out = [self._ended[i] for i in ids if i in self._ended]
        live = set(ids) - set(self._ended)
        if not live:
            return out
        # one job list per cluster the apps were submitted to (one, unless some used -c address=)
        where = {i: self.sched.address_of(i) for i in live}
        jobs = {str(j.submission_id): j for addr in sorted(set(where.values()))
                for j in self.sched.client(addr).list_jobs()
                if j.submission_id and where.get(str(j.submission_id)) == addr and st.is_tsm_job(j.metadata)}
        now = time.monotonic()
        due = []
        for app_id, job in jobs.items():
            status = st.job_status(job)
            seen = self._records.get(app_id)
            if seen is None or seen[0] != status:
                due.append((0.0, app_id))  # new, or its job changed: read first
            elif now - seen[1] > RECORD_INTERVAL:
                due.append((seen[1], app_id))
        for _, app_id in sorted(due)[:MAX_READS]:
            job = jobs[app_id]
            self._records[app_id] = (st.job_status(job), now, self.sched.record_of(job, where[app_id]))
        for app_id in [i for i in ids if i in jobs]:
            job = jobs[app_id]
            status = st.job_status(job)
            seen = self._records.get(app_id)
            record = seen[2] if seen is not None else None
            meta = dict(job.metadata or {})
            desc = st.describe(app_id, status, str(job.message or ""), meta, record)
            reqs = self._reqs.get(app_id)
            if reqs is None:
                rec = self.sched.app_record(app_id)
                reqs = self._reqs[app_id] = requests_of(rec.app.to_dict()) if rec is not None else {}
            view = view_of_describe(desc, "ray", name=meta.get(META_APP, ""), reqs=reqs)
            view.started, view.ended = _seconds(job.start_time), _seconds(job.end_time)
            if settled(view) and seen is not None and seen[0] == status:
                self._ended[app_id] = view  # its record was read after it ended: it will not change
            out.append(view)
        keep = set(ids)
        for cache in (self._ended, self._records, self._reqs):
            for k in [k for k in cache if k not in keep]:
                del cache[k]
        return out


def _seconds(ms: Any) -> float | None:
    """Unix seconds from the job API's milliseconds (None or 0: not yet)."""
    return ms / 1000.0 if isinstance(ms, (int, float)) and ms > 0 else None
