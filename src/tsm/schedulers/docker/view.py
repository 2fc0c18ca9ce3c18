"""The views' batch hook for Docker: every app of a ``tsm top`` / ``tsm serve`` tick from one container list.

:meth:`DockerScheduler.view_snapshot <tsm.schedulers.docker.scheduler.DockerScheduler.view_snapshot>` hands
the app ids of a tick to :class:`DockerView`, which makes, whatever the number of apps and replicas:

* **one** label-filtered ``containers.list`` (the scheduler's
  :meth:`~tsm.schedulers.common.container.ContainerScheduler.live_statuses`, reused for ``MAX_AGE`` seconds;
  an ended container is inspected once in its life for its exit code and cached);
* for apps whose containers are gone (cancelled or removed), a read of their ``final.json`` in the store,
  once: an ended app is remembered.

**Usage** (CPU cores, memory) comes from Docker's container stats, which the API gives only one container
at a time: a call with ``stream=False`` waits for two samples (about 2 s each, measured on dockerd 20.10),
while ``one_shot=True`` answers at once (about 12 ms and 2 ms of client CPU per container, measured on a
2-core host) but with no previous sample to compute a CPU rate from. So the calls are kept off the refresh:
one background thread (:class:`StatsSampler`) asks ``one_shot`` stats of at most
:data:`MAX_CONTAINERS` running containers every :data:`INTERVAL` seconds (round robin when there are more)
and turns the difference between its own two latest samples into cores; the hook reads its latest
figures. A container not sampled yet, an engine older than API 1.41 (no ``one_shot``) or any failure
shows ``n/a``, never an error. Memory is the container's usage less its inactive file cache (what
``docker stats`` shows). The last log line is not shown for Docker (a ``logs`` call per container).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tsm.schedulers.common.viewmodel import AppSummary, requests_of, settled, view_of_describe
from tsm.specs.api import AppState

if TYPE_CHECKING:
    from tsm.schedulers.common.container import ContainerScheduler
    from tsm.schedulers.docker.client import DockerClient

#: Seconds between two stats rounds of the sampler.
INTERVAL = 5.0
#: Containers sampled per round at most (round robin beyond), so a round stays under a second.
MAX_CONTAINERS = 64
#: A sampler nobody asked for figures for this many seconds stops (a view that was closed).
IDLE_STOP = 60.0


@dataclass(frozen=True)
class ContainerUsage:
    """A container's figures from its latest stats sample; cpu is None until two samples exist."""

    cpu: float | None
    mem_mb: float | None
    taken: float


def memory_mb(stats: dict[str, Any]) -> float | None:
    """Memory in MiB as ``docker stats`` shows it: usage less inactive file cache (cgroup v1 and v2)."""
    mem = stats.get("memory_stats") or {}
    usage = mem.get("usage")
    if not isinstance(usage, (int, float)):
        return None
    inner = mem.get("stats") or {}
    cache = inner.get("total_inactive_file", inner.get("inactive_file", 0))
    return round(max(0.0, float(usage) - float(cache or 0)) / 2**20, 1)


def cpu_ns(stats: dict[str, Any]) -> int | None:
    """The container's total CPU time in nanoseconds, or None when the sample has none."""
    total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    return int(total) if isinstance(total, (int, float)) else None


class StatsSampler:
    """One daemon thread sampling container stats at a coarse interval, off every refresh's path."""

    def __init__(self, client: DockerClient, interval: float = INTERVAL, limit: int = MAX_CONTAINERS) -> None:
        self.client = client
        self.interval = interval
        self.limit = limit
        self._lock = threading.Lock()
        self._wanted: list[str] = []
        self._asked = time.monotonic()
        self._prev: dict[str, tuple[int, float]] = {}  # container id -> (cpu ns, monotonic time)
        self._usage: dict[str, ContainerUsage] = {}
        self._cursor = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: False once the engine refused ``one_shot`` (API older than 1.41): usage stays n/a.
        self.available = True
        #: stats rounds made (for tests and benchmarks)
        self.rounds = 0

    def want(self, container_ids: Sequence[str]) -> dict[str, ContainerUsage]:
        """Ask for figures of ``container_ids`` from now on; returns the latest figures of those known."""
        with self._lock:
            self._wanted = list(dict.fromkeys(container_ids))
            self._asked = time.monotonic()
            got = {c: self._usage[c] for c in self._wanted if c in self._usage}
            start = bool(self._wanted) and self.available and (self._thread is None or not self._thread.is_alive())
            if start:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,), daemon=True,
                                                name="tsm docker stats")
                self._thread.start()
        return got

    def stop(self) -> None:
        """Stop the thread (it ends within one stats call)."""
        self._stop.set()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._lock:
                wanted = list(self._wanted)
                idle = time.monotonic() - self._asked > IDLE_STOP
            if idle or not self.available:
                return
            if wanted:
                self.sample(wanted)
            stop.wait(self.interval)

    def _batch(self, wanted: list[str]) -> list[str]:
        if len(wanted) <= self.limit:
            return wanted
        start = self._cursor % len(wanted)
        self._cursor = start + self.limit
        return (wanted[start:] + wanted[:start])[: self.limit]

    def sample(self, wanted: list[str]) -> None:
        """One round: ``one_shot`` stats of (at most ``limit`` of) ``wanted``; failures leave figures n/a."""
        self.rounds += 1
        batch = self._batch(wanted)
        for cid in batch:
            try:
                stats = self.client.stats(cid)
            except Exception as e:  # noqa: BLE001 - usage is never an error
                if "one_shot" in str(e) or "1.41" in str(e):
                    self.available = False
                    return
                continue
            now = time.monotonic()
            total = cpu_ns(stats)
            prev = self._prev.get(cid)
            cores = None
            if total is not None and prev is not None and total >= prev[0] and now > prev[1]:
                cores = round((total - prev[0]) / 1e9 / (now - prev[1]), 3)
            if total is not None:
                self._prev[cid] = (total, now)
            with self._lock:
                self._usage[cid] = ContainerUsage(cores, memory_mb(stats), time.time())
        with self._lock:
            keep = set(wanted)
            for cache in (self._usage, self._prev):
                for k in [k for k in cache if k not in keep]:
                    del cache[k]


class DockerView:
    """Builds the views of Docker apps for a tick; one per scheduler, kept across ticks (see the module doc).

    ``sched`` answers the statuses, ``client`` is its engine (stats), ``times`` gives an app's start and end."""

    def __init__(self, sched: ContainerScheduler[Any, Any], client: DockerClient,
                 times: Callable[[str], tuple[float | None, float | None]], usage: bool = True) -> None:
        self.sched = sched
        self.times = times
        self._ended: dict[str, AppSummary] = {}
        self._reqs: dict[str, dict[str, tuple[float | None, float | None, int | None]]] = {}
        #: the stats sampler (None with ``usage=False``: usage n/a)
        self.sampler: StatsSampler | None = StatsSampler(client) if usage else None

    def snapshot(self, app_ids: Sequence[str]) -> list[AppSummary]:
        """Views of the apps of ``app_ids`` Docker (or the store) knows; see the module doc."""
        ids = list(dict.fromkeys(app_ids))
        out = [self._ended[i] for i in ids if i in self._ended]
        live = [i for i in ids if i not in self._ended]
        if not live:
            return out
        listed = self.sched.live_statuses()  # one containers.list for every app, reused for the scheduler's max_age
        views = []
        for app_id in live:
            # its containers are gone (or it is being cancelled): the store has its end
            desc = listed.get(app_id) or self.sched.kept_status(app_id)
            if desc is None:
                continue
            reqs = self._reqs.get(app_id)
            if reqs is None:
                record = self.sched.app_record(app_id)
                reqs = self._reqs[app_id] = requests_of(record.app.to_dict()) if record is not None else {}
            view = view_of_describe(desc, "docker", name=app_id.rsplit("-", 1)[0], reqs=reqs)
            view.started, ended = self.times(app_id)  # a fixed DURATION once the app has ended
            view.ended = ended if view.terminal else None
            if settled(view):
                self._ended[app_id] = view
            views.append(view)
        self._fill_usage(views)
        keep = set(ids)
        for cache in (self._ended, self._reqs):
            for k in [k for k in cache if k not in keep]:
                del cache[k]
        return out + views

    def _fill_usage(self, views: list[AppSummary]) -> None:
        """Usage of running replicas from the sampler's latest figures (containers are named by host)."""
        if self.sampler is None:
            return
        running = [r for v in views for r in v.replicas if r.state == AppState.RUNNING.name and r.host]
        got = self.sampler.want([r.host for r in running])
        for r in running:
            u = got.get(r.host)
            if u is not None:
                r.cpu_used, r.mem_used_mb = u.cpu, u.mem_mb

    def close(self) -> None:
        """Stop the sampler."""
        if self.sampler is not None:
            with contextlib.suppress(Exception):
                self.sampler.stop()
