"""The views' batch hook for Slurm: every app of a ``tsm top`` / ``tsm serve`` tick from one ``squeue``.

:meth:`SlurmScheduler.view_snapshot <tsm.schedulers.slurm.scheduler.SlurmScheduler.view_snapshot>` hands the
app ids of a tick to :class:`SlurmView`, which asks each app's host and makes, whatever the number of apps
and replicas:

* **one** ``squeue`` per host (shared with ``describe`` through its :class:`~.queries.SlurmQueries`; reused
  when younger than a second);
* **one** ``sacct`` for all the jobs the controller no longer holds and that are not yet known to have ended
  (none on most ticks: an ended app is described once and remembered, and each job is asked at most every
  5 s);
* **one** ``sstat`` for the steps of every running job, for usage; skipped for good when the cluster answers
  that it gathers no accounting (``JobAcctGatherType=jobacct_gather/none``): usage then stays n/a.

Replica states, hosts and exit codes come from the job directory's status files (file reads, no Slurm
command; a login node's job directories are copied here in the same round trip as its ``squeue``), the last
log line from the tail of ``<role>/<k>.stdout``/``.stderr`` (re-read only when a file grew). The job
directory and the app of a job are looked up once and kept.

**Usage** is per role: Slurm accounts a step (one ``srun`` per role, one task per replica) as a whole, and
``sstat`` gives the average per task, so every running replica of a role shows its role's average CPU
(``AveCPU``: CPU seconds per task, turned into cores used between the two latest different figures, as
Slurm refreshes them every ``JobAcctGatherFrequency`` seconds) and memory (``AveRSS``). GPU usage is n/a.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tsm.errors import SchedulerUnavailableError
from tsm.schedulers.common.ssh import SshError
from tsm.schedulers.common.viewmodel import AppSummary, LastLines, requests_of, settled, view_of_describe
from tsm.schedulers.slurm.describe import describe_records
from tsm.schedulers.slurm.host import Host, Where
from tsm.schedulers.slurm.parse import SlurmJob
from tsm.specs.api import AppState

#: ``sstat`` columns read for usage.
SSTAT_FIELDS = ("JobID", "NTasks", "AveCPU", "AveRSS", "MaxRSS")
#: Seconds of accounting figures a CPU rate is taken over.
RATE_WINDOW = 30.0
_UNITS = {"": 1.0 / 2**20, "K": 1.0 / 2**10, "M": 1.0, "G": 2.0**10, "T": 2.0**20}


def cpu_seconds(text: str) -> float | None:
    """Seconds from a Slurm duration: ``[D-]HH:MM:SS``, ``MM:SS.mmm`` or ``SS.mmm``; None when unreadable."""
    text = text.strip()
    if not text:
        return None
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        return None
    if not 1 <= len(parts) <= 3:
        return None
    secs = 0.0
    for p in parts:
        secs = secs * 60 + p
    return days * 86400 + secs


def mem_mb(text: str) -> float | None:
    """MiB from a Slurm size such as ``64614K``, ``1.5G`` or ``0`` (bytes when it has no unit)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)\s*", text)
    if not m:
        return None
    try:
        return float(m.group(1)) * _UNITS[m.group(2)]
    except ValueError:
        return None


@dataclass(frozen=True)
class StepUsage:
    """What ``sstat`` says of one step: tasks, average CPU seconds and resident memory per task."""

    job: str  #: the job part of the step id: ``352`` or, for a het-job component, ``351+1``
    step: str
    tasks: int
    cpu_s: float | None
    rss_mb: float | None


def parse_sstat(text: str) -> list[StepUsage]:
    """Parse ``sstat --noheader --parsable2 -o <SSTAT_FIELDS>``; the batch and extern steps are left out."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < len(SSTAT_FIELDS):
            continue
        job, _, step = parts[0].partition(".")
        if not step or not step.isdigit():
            continue  # 123.batch, 123.extern: not a role's srun
        out.append(StepUsage(job=job, step=step, tasks=int(parts[1]) if parts[1].isdigit() else 0,
                             cpu_s=cpu_seconds(parts[2]), rss_mb=mem_mb(parts[3]) or mem_mb(parts[4])))
    return out


_ENDED = {s.name for s in AppState if s.is_terminal}


class _Rate:
    """Cores used from a growing CPU-seconds figure that Slurm refreshes only every few seconds, in whole seconds.

    The rate is taken between the newest figure and the oldest one seen within the last :data:`RATE_WINDOW`
    seconds, each timed when it first appeared; it is held between two accounting samples (a 1 Hz view does
    not show 0 between them) and the window keeps the one-second resolution of ``AveCPU`` from making it jump.
    """

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []  # (cpu seconds, when first seen), oldest first
        self.cores: float | None = None

    def update(self, cpu_s: float, now: float) -> float | None:
        if self.points and cpu_s < self.points[-1][0]:
            self.points, self.cores = [], None  # a new step (requeued job): start again
        if not self.points or cpu_s > self.points[-1][0]:
            self.points.append((cpu_s, now))
            keep = [p for p in self.points if now - p[1] <= RATE_WINDOW]
            self.points = keep if len(keep) >= 2 else self.points[-2:]
            if len(self.points) >= 2:
                (c0, t0), (c1, t1) = self.points[0], self.points[-1]
                self.cores = round((c1 - c0) / max(t1 - t0, 1e-3), 3)
        return self.cores


class SlurmView:
    """Builds the views of Slurm apps for a tick; one per scheduler, kept across ticks (see the module doc)."""

    def __init__(self, where: Callable[[str], Where | None], backend: str) -> None:
        self.where = where  #: where an app lives (:meth:`.scheduler.SlurmScheduler.where`)
        self.backend = backend
        self._reqs: dict[str, dict[str, tuple[float | None, float | None, int | None]]] = {}
        self._ended: dict[str, AppSummary] = {}
        self._tails = LastLines()
        self._rates: dict[tuple[str, str], _Rate] = {}  # (component, step) -> its CPU rate
        #: hosts whose ``sstat`` said the cluster gathers no accounting (or has no sstat): usage stays n/a
        self._no_sstat: set[int] = set()

    def snapshot(self, app_ids: Sequence[str]) -> list[AppSummary]:
        """Views of the apps of ``app_ids`` Slurm (or their job directory) knows; see the module doc."""
        ids = list(dict.fromkeys(app_ids))
        out = [self._ended[i] for i in ids if i in self._ended]
        by_host: dict[int, tuple[Host, list[Where]]] = {}
        for app_id in ids:
            where = self.where(app_id) if app_id not in self._ended else None
            if where is not None:
                by_host.setdefault(id(where.host), (where.host, []))[1].append(where)
        for host, wheres in by_host.values():
            out += self._host_views(host, wheres)
        keep = set(app_ids)  # forget apps that left the view
        for cache in (self._reqs, self._ended):
            for k in [k for k in cache if k not in keep]:
                del cache[k]
        self._tails.prune()
        return out

    def _host_views(self, host: Host, wheres: list[Where]) -> list[AppSummary]:
        """The apps of one host: one ``squeue`` and, at the same time, the refresh of the job directories'
        copies here with their logs' last 4 KiB (a login node's: one call, :meth:`.ssh_host.SshHost.sync`), then,
        while some run, one ``sstat``. A login node that does not answer leaves its apps out of this tick."""
        joined = host.sync_in_background(wheres, tails=True)  # independent of the queue: one round trip for both
        records: dict[str, list[SlurmJob]] | None
        try:
            records = host.queries.jobs([w.job_id for w in wheres])
        except SshError:
            records = None
        try:
            joined()
        except SshError:
            records = None
        if records is None:
            return []
        running = [r for w in wheres for r in records.get(w.job_id) or [] if r.state == AppState.RUNNING]
        usage = self._usage(running, host)
        views = (self._view(w, records.get(w.job_id), usage) for w in wheres)
        return [v for v in views if v is not None]

    def _view(self, where: Where, recs: list[SlurmJob] | None,
              usage: dict[str, tuple[float | None, float | None]]) -> AppSummary | None:
        """One app's summary from its records and its job directory (as this machine reads it)."""
        job_dir, app = where.host.job_files(where, recs)
        where.host.requeue_stranded(where, recs)
        desc = describe_records(where.job_id, recs, job_dir, app)
        if desc is None:
            return None
        desc.app_id = where.app_id
        reqs = self._reqs.get(where.app_id)
        if reqs is None and desc.app is not None:
            reqs = self._reqs[where.app_id] = requests_of(desc.app.to_dict())
        view = view_of_describe(desc, self.backend, reqs=reqs or {})
        if recs:
            view.started = recs[0].start_time
            view.ended = recs[0].end_time if desc.state.is_terminal else None
        by_offset = {r.offset: r for r in recs or []}
        roles = [rs.role for rs in desc.roles_statuses]
        ran = bool(recs and (recs[0].restarts > 0 or recs[0].state != AppState.PENDING))
        for r in view.replicas:
            if job_dir is not None and ran:  # a job that never ran wrote no log
                base = job_dir.replica(r.role, r.idx)
                r.last_line = self._tails.last_of(f"{base}.stdout", f"{base}.stderr", final=r.state in _ENDED)
            rec = by_offset.get(roles.index(r.role)) if r.role in roles else None
            if r.state == "RUNNING" and rec is not None:
                got = usage.get(rec.job_id) or usage.get(f"{where.job_id}+{rec.offset}")
                if got is not None:
                    r.cpu_used, r.mem_used_mb = got
        if settled(view):
            self._ended[where.app_id] = view
        return view

    def _usage(self, running: list[SlurmJob], host: Host) -> dict[str, tuple[float | None, float | None]]:
        """component (job id, or ``leader+offset``) -> (cores, MiB) per task, from one ``sstat`` on ``host``."""
        if not running or id(host) in self._no_sstat:
            return {}
        fields = ",".join(SSTAT_FIELDS)
        ids = ",".join(sorted({r.job_id for r in running}))
        try:
            proc = host.run(["sstat", "-a", "--noheader", "--parsable2", "-o", fields, "-j", ids], timeout=20)
        except SchedulerUnavailableError as e:  # no sstat on this host: usage stays n/a
            if not isinstance(e, SshError):
                self._no_sstat.add(id(host))
            return {}
        except Exception:  # noqa: BLE001 - usage is never an error: n/a this tick
            return {}
        if proc.returncode != 0 and not proc.stdout.strip() and "jobacct_gather/none" in proc.stderr.lower():
            self._no_sstat.add(id(host))
            return {}
        now = time.monotonic()
        latest: dict[str, StepUsage] = {}
        for s in parse_sstat(proc.stdout):  # the newest step of each component: that attempt's srun
            if s.job not in latest or int(s.step) > int(latest[s.job].step):
                latest[s.job] = s
        out: dict[str, tuple[float | None, float | None]] = {}
        for job, s in latest.items():
            rate = self._rates.setdefault((job, s.step), _Rate())
            cores = rate.update(s.cpu_s, now) if s.cpu_s is not None else None
            out[job] = (cores, round(s.rss_mb, 1) if s.rss_mb is not None else None)
        for k in [k for k in self._rates if (k[0] not in latest or latest[k[0]].step != k[1])]:
            del self._rates[k]
        return out
