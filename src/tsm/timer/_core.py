"""The timer table every tsm timer server shares: armed timers, a heap of deadlines, reaping.

A timer is keyed by ``(pid, scope_id)`` and holds ``(expiration, seq, start_time, signal)``.  The heap holds
``(expiration, seq, key)``; a heap entry is live only while the table still maps its key to the same
``seq``, so a release is a dict pop and stale heap entries are dropped lazily (and the heap is rebuilt when
stale entries outnumber live ones).  Acquires are first collected in ``dirty`` and pushed on the heap at the
end of a batch, so an acquire released within the same batch never touches the heap.

The owning server holds :attr:`Core.lock` while it changes the table; the ``*_locked`` methods expect that.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable

from tsm.errors import TimerError

from ._proc import Guard, Reaper
from .api import TimerRequest

logger = logging.getLogger("tsm.timer")

#: Waits on file descriptors round their timeout up to whole milliseconds; the last stretch before a deadline
#: is slept precisely instead (time.sleep has nanosecond resolution), which is what keeps reaping sub-ms.
FINE_WAIT = 0.0015


def poll_until(ep: select.epoll, remaining: float | None) -> list[tuple[int, int]]:
    """``ep.poll`` until ``remaining`` seconds pass (None: forever), without overshooting the deadline.

    Far from the deadline it wakes up to a millisecond early (the loop comes back with a short remainder);
    within :data:`FINE_WAIT` of it, it sleeps exactly and then collects whatever is ready.
    """
    if remaining is None:
        return ep.poll(-1)
    if remaining > FINE_WAIT:
        return ep.poll(remaining - 0.001)
    if remaining > 0:
        time.sleep(remaining)
    return ep.poll(0)


Key = tuple[int, str]
# expiration, seq, start_time, signal (0 = the server's default, < 0 = expire without reaping)
Timer = tuple[float, int, int, int]


class Core:
    """Armed timers, their deadline heap, the admission guard and the reaper of one server."""

    def __init__(self, reaper: Reaper, guard: Guard | None = None) -> None:
        self.lock = threading.Lock()
        self.guard = guard if guard is not None else Guard()
        self.reaper = reaper
        self.stats = reaper.stats
        for key in ("requests", "acquired", "released", "refused", "reaped", "skipped"):
            self.stats.setdefault(key, 0)
        self.timers: dict[Key, Timer] = {}
        self.heap: list[tuple[float, int, Key]] = []
        self.dirty: list[tuple[float, int, Key]] = []
        self.seq = itertools.count(1)
        #: Called (lock held) with the live expired timers of a pid right after its reaping started.
        self.on_expired: Callable[[int, list[tuple[str, Timer]]], None] | None = None

    def refresh_identity(self) -> None:
        """Re-read the server's own pid, ancestors and process group (call when the loop starts: the server
        object may have been created in a parent process)."""
        with self.lock:
            self.guard = Guard()
            self.reaper.own_pgrp = os.getpgrp()

    # -- changing the table (lock held) -------------------------------------------------------------
    def arm_locked(self, pid: int, scope_id: str, expiration: float, start_time: int, sig: int = 0) -> None:
        """Arm (or re-arm) the timer ``(pid, scope_id)``; the caller has admitted ``pid``."""
        s = next(self.seq)
        key = (pid, scope_id)
        self.timers[key] = (expiration, s, start_time, sig)
        self.dirty.append((expiration, s, key))

    def arm_checked(self, pid: int, scope_id: str, expiration: float, start_time: int | None = None) -> None:
        """Every server's ``arm``: admit ``pid`` (TimerError if refused), arm with the given or current start time."""
        with self.lock:
            verdict = self.guard.admit(pid)
            if isinstance(verdict, str):
                self.refuse(verdict, scope_id)
                raise TimerError(f"timer {scope_id!r} refused: {verdict}")
            self.stats["acquired"] += 1
            self.arm_locked(pid, scope_id, expiration, verdict if start_time is None else start_time)
            self.flush_locked()

    def flush_locked(self) -> None:
        """Push this batch's surviving acquires on the deadline heap; rebuild the heap if mostly stale."""
        timers = self.timers
        heap = self.heap
        for item in self.dirty:
            t = timers.get(item[2])
            if t is not None and t[1] == item[1]:
                heapq.heappush(heap, item)
        self.dirty.clear()
        if len(heap) > 2 * len(timers) + 1024:
            self.heap = [(t[0], t[1], k) for k, t in timers.items()]
            heapq.heapify(self.heap)

    def register_locked(self, requests: Iterable[TimerRequest]) -> None:
        """Apply torch-style requests: negative expiration releases, anything else arms after admission.

        A request with a ``signal`` attribute (:class:`FileTimerRequest`) chooses its own reaping signal;
        a signal <= 0 means the timer expires without reaping anyone (torch's meaning).
        """
        n = 0
        for r in requests:
            n += 1
            pid = r.worker_id
            exp = r.expiration_time
            if not isinstance(pid, int) or isinstance(pid, bool):
                self.refuse(f"worker_id {pid!r} is not a pid", r.scope_id)
                continue
            if exp < 0:
                self.stats["released"] += 1
                self.timers.pop((pid, r.scope_id), None)
                continue
            if exp != exp:  # NaN
                self.refuse("expiration_time is NaN", r.scope_id)
                continue
            verdict = self.guard.admit(pid)
            if isinstance(verdict, str):
                self.refuse(verdict, r.scope_id)
                continue
            self.stats["acquired"] += 1
            sig = getattr(r, "signal", None)
            self.arm_locked(
                pid, r.scope_id, exp, verdict, 0 if not isinstance(sig, int) else sig if sig > 0 else -1
            )
        self.stats["requests"] += n
        self.flush_locked()

    def refuse(self, reason: str, scope_id: str) -> None:
        """Log and count a refused request."""
        self.stats["refused"] += 1
        logger.warning("timer request for scope %r refused: %s", scope_id, reason)

    def clear_locked(self, pids: Iterable[int]) -> None:
        """Drop every timer of the given pids (heap entries go stale)."""
        gone = set(pids)
        if gone:
            for key in [k for k in self.timers if k[0] in gone]:
                del self.timers[key]

    # -- reading the table -----------------------------------------------------------------------------
    def next_deadline_locked(self) -> float | None:
        """The earliest live deadline (timer or pending final signal), or None."""
        heap = self.heap
        timers = self.timers
        while heap:
            exp, s, key = heap[0]
            t = timers.get(key)
            if t is not None and t[1] == s:
                break
            heapq.heappop(heap)
        d = heap[0][0] if heap else None
        r = self.reaper.next_deadline()
        if r is not None and (d is None or r < d):
            d = r
        return d

    def expired_locked(
        self, deadline: float, make: Callable[[int, str, Timer], TimerRequest]
    ) -> dict[int, list[TimerRequest]]:
        """Every armed timer with expiration <= deadline, grouped by pid (the table is not changed)."""
        out: dict[int, list[TimerRequest]] = {}
        for key, t in self.timers.items():
            if t[0] <= deadline:
                out.setdefault(key[0], []).append(make(key[0], key[1], t))
        return out

    # -- reaping (lock held) ----------------------------------------------------------------------
    def due_locked(self, now: float) -> dict[int, list[tuple[str, Timer]]]:
        """Pop every heap entry due at ``now``; return the live ones grouped by pid (still armed)."""
        heap = self.heap
        timers = self.timers
        due: dict[int, list[tuple[str, Timer]]] = {}
        while heap and heap[0][0] <= now:
            exp, s, key = heapq.heappop(heap)
            t = timers.get(key)
            if t is not None and t[1] == s:
                due.setdefault(key[0], []).append((key[1], t))
        return due

    def fire_locked(self, now: float, drain: Callable[[set[int]], None] | None = None) -> None:
        """Reap every worker with an expired timer.

        ``drain(pids)`` lets the server read what those workers already sent (a release written before the
        deadline must win over the reap); timers released or re-armed meanwhile are spared.
        """
        due = self.due_locked(now)
        if due:
            if drain is not None:
                drain(set(due))
                self.flush_locked()
            for pid, items in due.items():
                live = [(scope, t) for scope, t in items if self.timers.get((pid, scope)) == t]
                # Re-armed timers got a new heap entry; released ones are gone.  Both are spared.
                if not live:
                    continue
                live.sort(key=lambda st: st[1][0])
                scope, first = live[0]
                sig: int | None = None
                for _scope, t in live:
                    if t[3] > 0:
                        sig = t[3]
                        break
                else:
                    if any(t[3] < 0 for _scope, t in live):
                        sig = -1
                self.reaper.reap(pid, first[2], scope, sig)
                if logger.isEnabledFor(logging.INFO):
                    logger.info("pid %d had expired timers %s", pid, [s for s, _ in live])
                if self.on_expired is not None:
                    try:
                        self.on_expired(pid, live)
                    except Exception:
                        logger.exception("on_expired hook raised")
                self.clear_locked([pid])
        self.reaper.run_due(now)


class ServerExtras:
    """What every tsm timer server adds to torch's: arming a timer from inside the server, and counters.

    Mixed into the Local, File and Socket servers, which provide ``_core`` and ``_wake``.
    """

    _core: Core

    def _wake(self) -> None:  # pragma: no cover - each server provides its own
        raise NotImplementedError

    def arm(self, worker_pid: int, scope_id: str, expiration_time: float, *, start_time: int | None = None) -> None:
        """Arm a timer for ``worker_pid`` from inside the server's process (a supervisor arming a child).

        The pid is checked like a client's (TimerError if refused); ``start_time`` defaults to the current
        start time of the pid (``/proc/<pid>/stat`` field 22) and is compared again before any signal.
        """
        self._core.arm_checked(worker_pid, scope_id, expiration_time, start_time)
        self._wake()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests, acquired, released, refused, reaped, skipped (gone or reused pids), and
        connections for the socket server."""
        with self._core.lock:
            return dict(self._core.stats)
