"""The views' batch hook for Slurm: every app of a ``tsm top`` / ``tsm serve`` tick from one ``squeue``.

:meth:`SlurmScheduler.view_snapshot <tsm.schedulers.slurm.scheduler.SlurmScheduler.view_snapshot>` hands the
app ids of a tick to :class:`SlurmView`, which makes, whatever the number of apps and replicas:

* **one** ``squeue --json --me`` (shared with ``describe`` through :class:`~.queries.SlurmQueries`; reused
  when younger than a second);
* **one** ``sacct`` for all the jobs the controller no longer holds and that are not yet known to have ended
  (none on most ticks: an ended app is described once and remembered, and each job is asked at most every
  5 s);
* **one** ``sstat`` for the steps of every running job, for usage; skipped for good when the cluster answers
  that it gathers no accounting (``JobAcctGatherType=jobacct_gather/none``): usage then stays n/a.

Replica states, hosts and exit codes come from the job directory's status files (file reads, no Slurm
command), the last log line from the tail of ``<role>/<k>.stdout``/``.stderr`` (re-read only when a file
grew). The job directory and the app of a job are looked up once and kept.

**Usage** is per role: Slurm accounts a step (one ``srun`` per role, one task per replica) as a whole, and
``sstat`` gives the average per task, so every running replica of a role shows its role's average CPU
(``AveCPU``: CPU seconds per task, turned into cores used between the two latest different figures, as
Slurm refreshes them every ``JobAcctGatherFrequency`` seconds) and memory (``AveRSS``). GPU usage is n/a.
"""

from __future__ import annotations

import functools
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tsm.errors import SchedulerUnavailableError
from tsm.schedulers.common.viewmodel import AppSummary, LastLines, requests_of, settled, view_of_describe
from tsm.schedulers.slurm import cli
from tsm.schedulers.slurm.parse import APP_ID, SlurmJob
from tsm.specs.api import AppDef, AppState

if TYPE_CHECKING:
    from tsm.schedulers.slurm.scheduler import SlurmScheduler

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


def _in_background(fn: Callable[[], None]) -> Callable[[], None]:
    """Start ``fn`` in a thread; the callable returned waits for it and raises what it raised."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread by join()
            failed.append(e)

    t = threading.Thread(target=run, name="tsm-slurm-mirror", daemon=True)
    t.start()

    def join() -> None:
        t.join()
        if failed:
            raise failed[0]

    return join


class SlurmView:
    """Builds the views of Slurm apps for a tick; one per scheduler, kept across ticks (see the module doc)."""

    def __init__(self, sched: SlurmScheduler) -> None:
        self.sched = sched
        self._dirs: dict[str, Path] = {}
        self._apps: dict[str, AppDef] = {}
        self._reqs: dict[str, dict[str, tuple[float | None, float | None, int | None]]] = {}
        self._ended: dict[str, AppSummary] = {}
        self._tails = LastLines()
        self._rates: dict[tuple[str, str], _Rate] = {}  # (component, step) -> its CPU rate
        #: False once ``sstat`` said this cluster gathers no accounting: usage stays n/a.
        self.sstat_available = True

    def snapshot(self, app_ids: Sequence[str]) -> list[AppSummary]:
        """Views of the apps of ``app_ids`` Slurm (or their job directory) knows; see the module doc."""
        ids = [i for i in dict.fromkeys(app_ids) if APP_ID.fullmatch(i)]
        out = [self._ended[i] for i in dict.fromkeys(app_ids) if i in self._ended]
        live = [i for i in ids if i not in self._ended]
        remote_live = [i for i in dict.fromkeys(app_ids) if i not in self._ended and i not in ids]
        if remote_live:
            out += self._remote_views(remote_live)
        if live:
            records = self.sched.queries.jobs(live)
            usage = self._usage([r for i in live for r in records.get(i) or [] if r.state == AppState.RUNNING])
            for app_id in live:
                view = self._view(app_id, records.get(app_id), usage)
                if view is not None:
                    out.append(view)
        keep = set(app_ids)  # forget apps that left the view
        for cache in (self._dirs, self._apps, self._reqs, self._ended):
            for k in [k for k in cache if k not in keep]:
                del cache[k]
        self._tails.prune()
        return out

    def _remote_views(self, app_ids: Sequence[str]) -> list[AppSummary]:
        """Apps on login nodes reached over SSH: per host, one ``squeue`` and, at the same time, one call that
        mirrors the job directories' small files and the logs' last 4 KiB
        (:meth:`tsm.schedulers.slurm.remote.Remote.mirror`), then, while some run, one ``sstat``; each app is
        then viewed from its local mirror as a local one is.
        A host that does not answer leaves its apps out of this tick."""
        from tsm.schedulers.common.ssh import SshError
        from tsm.schedulers.slurm.remote import Remote, RemoteRecord, remote_of

        groups: dict[int, tuple[Remote, list[RemoteRecord]]] = {}
        for app_id in app_ids:
            rec = RemoteRecord.load(app_id)
            if rec is not None:
                rem = remote_of(rec)
                groups.setdefault(id(rem), (rem, []))[1].append(rec)
        out = []
        for rem, recs in groups.values():
            # the mirror does not depend on the queue: both go over the master at once (one round trip)
            mirrored = _in_background(functools.partial(rem.mirror, recs, tails=True))
            jobs: dict[str, list[SlurmJob]] | None
            try:
                jobs = rem.queries.jobs([r.job_id for r in recs])
            except SshError:
                jobs = None
            try:
                mirrored()
            except SshError:
                jobs = None
            if jobs is None:
                continue
            running = [j for r in recs for j in jobs.get(r.job_id) or [] if j.state == AppState.RUNNING]
            usage = self._usage(running, run=rem.run)
            for rec in recs:
                if (rec.mirror / "app.json").is_file():
                    self._dirs[rec.app_id] = rec.mirror
                view = self._view(rec.app_id, jobs.get(rec.job_id), usage, rem.run)
                if view is not None:
                    out.append(view)
        return out

    def _view(self, app_id: str, recs: list[SlurmJob] | None, usage: dict[str, tuple[float | None, float | None]],
              run: Callable[[list[str]], object] | None = None) -> AppSummary | None:
        """One app's summary from its records; ``run`` runs a Slurm command where the app is (its login node's
        for an app submitted over SSH)."""
        job_dir = self._dirs.get(app_id)
        if job_dir is None:
            job_dir = self.sched._job_dir(app_id, recs)
            if job_dir is not None:
                self._dirs[app_id] = job_dir
        app = self._apps.get(app_id)
        if app is None and job_dir is not None:
            app = self.sched._load_app(job_dir)
            if app is not None:
                self._apps[app_id] = app
        self.sched.requeue_stranded(app_id, recs, run)
        desc = self.sched.describe_records(app_id, recs, job_dir, app)
        if desc is None:
            return None
        reqs = self._reqs.get(app_id)
        if reqs is None and desc.app is not None:
            reqs = self._reqs[app_id] = requests_of(desc.app.to_dict())
        view = view_of_describe(desc, self.sched.backend, reqs=reqs or {})
        if recs:
            view.started = recs[0].start_time
            view.ended = recs[0].end_time if desc.state.is_terminal else None
        by_offset = {r.offset: r for r in recs or []}
        roles = [rs.role for rs in desc.roles_statuses]
        for r in view.replicas:
            if job_dir is not None:
                r.last_line = self._tails.last_of(str(job_dir / r.role / f"{r.idx}.stdout"),
                                                  str(job_dir / r.role / f"{r.idx}.stderr"),
                                                  final=r.state in _ENDED)
            rec = by_offset.get(roles.index(r.role)) if r.role in roles else None
            if r.state == "RUNNING" and rec is not None:
                got = usage.get(rec.job_id) or usage.get(f"{app_id}+{rec.offset}")
                if got is not None:
                    r.cpu_used, r.mem_used_mb = got
        if settled(view):
            self._ended[app_id] = view
        return view

    def _usage(
        self, running: list[SlurmJob], run: Callable[..., subprocess.CompletedProcess[str]] | None = None
    ) -> dict[str, tuple[float | None, float | None]]:
        """component (job id, or ``leader+offset``) -> (cores, MiB) per task, from one ``sstat`` (run by
        ``run``: a login node's over SSH, else :func:`.cli.run`)."""
        if not running or not self.sstat_available:
            return {}
        fields = ",".join(SSTAT_FIELDS)
        ids = ",".join(sorted({r.job_id for r in running}))
        try:
            proc = (run or cli.run)(["sstat", "-a", "--noheader", "--parsable2", "-o", fields, "-j", ids], timeout=20)
        except SchedulerUnavailableError:  # no sstat on this host: usage stays n/a
            self.sstat_available = False
            return {}
        except Exception:  # noqa: BLE001 - usage is never an error: n/a this tick
            return {}
        if proc.returncode != 0 and not proc.stdout.strip() and "jobacct_gather/none" in proc.stderr.lower():
            self.sstat_available = False
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
