"""The timer table every tsm timer server shares: armed timers, a heap of deadlines, reaping.

A timer is keyed by ``(worker_id, scope_id)`` and holds ``(expiration, seq, start_time, signal)``.  Worker ids
are whatever the client sent (torch's servers are pid-agnostic); only reaping needs a real process, and is
guarded then (:meth:`Guard.reapable`: a pid > 1, not the server or an ancestor, same user, and the same
process as when the timer was armed).  The heap holds ``(expiration, seq, key)``; a heap entry is live only
while the table still maps its key to the same ``seq``, so a release is a dict pop and stale heap entries
are dropped lazily (and the heap is rebuilt when stale entries outnumber live ones).  Acquires are first
collected in ``dirty`` and pushed on the heap at the end of a batch, so an acquire released within the same
batch never touches the heap.

Every request is validated on its own: a malformed one (wrong types, unhashable ids, a NaN, infinite or
absurd deadline) is refused, counted and logged at a limited rate, and the rest of its batch is applied.

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

from tsm.errors import TimerError, brief

from ._errors import InvalidTimerRequestError
from ._log import Lazy, LimitedLog
from ._proc import Guard, Reaper, process_start_time
from .api import TimerRequest, bounded_wait

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

logger = logging.getLogger("tsm.timer")

#: Waits on file descriptors round their timeout up to whole milliseconds; the last stretch before a deadline
#: is slept precisely instead (time.sleep has nanosecond resolution), which is what keeps reaping sub-ms.
FINE_WAIT = 0.0015

#: Latest deadline a server accepts: 9999-12-31T23:59:59Z in ``time.time()`` seconds.  Anything later (and
#: infinity, NaN, or a value that is not a number) is refused: it is a bug in the caller, not a deadline.
MAX_EXPIRATION = 253402300799.0


def check_expiration(value: object) -> float:
    """``value`` as a deadline or a release (negative), or InvalidTimerRequestError saying what is wrong."""
    if isinstance(value, (str, bytes, bytearray, bool)):
        raise InvalidTimerRequestError(f"expiration_time {brief(value)} is not a number")
    try:
        exp = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidTimerRequestError(f"expiration_time {brief(value)} is not a number ({e})") from None
    if exp != exp:
        raise InvalidTimerRequestError("expiration_time is NaN")
    if exp > MAX_EXPIRATION:
        raise InvalidTimerRequestError(
            f"expiration_time {brief(value)} is not a time.time() deadline (finite, before year 10000)"
        )
    return exp


def poll_until(ep: select.epoll, remaining: float | None) -> list[tuple[int, int]]:
    """``ep.poll`` until ``remaining`` seconds pass (None: forever), without overshooting the deadline.

    Far from the deadline it wakes up to a millisecond early (the loop comes back with a short remainder);
    within :data:`FINE_WAIT` of it, it sleeps exactly and then collects whatever is ready.  A single wait is
    at most an hour (the loop recomputes), so no deadline can overflow the kernel's timeout.
    """
    if remaining is None:
        return ep.poll(-1)
    if remaining > FINE_WAIT:
        return ep.poll(bounded_wait(remaining - 0.001))
    if remaining > 0:
        time.sleep(remaining)
    return ep.poll(0)


Key = tuple["Any", "Any"]
# expiration, seq, start_time (None: not a live pid when armed), signal (0 = the server's default, < 0 =
# expire without reaping)
Timer = tuple[float, int, "int | None", int]


class Core:
    """Armed timers, their deadline heap, the reaping guard and the reaper of one server."""

    def __init__(self, reaper: Reaper, guard: Guard | None = None) -> None:
        # Re-entrant: a subclass's reap hook may call back into the server's own methods.
        self.lock = threading.RLock()
        self.guard = guard if guard is not None else Guard()
        self.reaper = reaper
        self.stats = reaper.stats
        for key in ("requests", "acquired", "released", "refused", "reaped", "skipped"):
            self.stats.setdefault(key, 0)
        self.timers: dict[Key, Timer] = {}
        self.heap: list[tuple[float, int, Key]] = []
        self.dirty: list[tuple[float, int, Key]] = []
        self.seq = itertools.count(1)
        self.log = LimitedLog(logger)
        #: Called (lock held) once per round with the live expired timers of every worker whose reaping
        #: started (or was refused) in that round.
        self.on_expired: Callable[[dict[Any, list[tuple[Any, Timer]]]], None] | None = None
        #: A subclass's own ``_reap_worker(worker_id, signal)``, called (lock held) instead of the built-in
        #: reaper once the guard and the start time allowed the reap.
        self.reap_hook: Callable[[Any, int], bool] | None = None

    def refresh_identity(self) -> None:
        """Re-read the server's own pid, ancestors and process group (call when the loop starts: the server
        object may have been created in a parent process)."""
        with self.lock:
            self.guard = Guard()
            self.reaper.own_pgrp = os.getpgrp()

    # -- changing the table (lock held) -------------------------------------------------------------
    def arm_locked(self, worker_id: Any, scope_id: Any, expiration: float, start_time: int | None, sig: int = 0) -> None:
        """Arm (or re-arm) the timer ``(worker_id, scope_id)``; the caller validated the request."""
        s = next(self.seq)
        key = (worker_id, scope_id)
        self.timers[key] = (expiration, s, start_time, sig)
        self.dirty.append((expiration, s, key))

    def arm_checked(self, pid: int, scope_id: str, expiration: float, start_time: int | None = None) -> None:
        """Every server's ``arm``: admit ``pid`` now (TimerError if refused), check the deadline
        (InvalidTimerRequestError), arm with the given or current start time."""
        exp = check_expiration(expiration)
        with self.lock:
            verdict = self.guard.admit(pid)
            if isinstance(verdict, str):
                self.refuse(verdict, scope_id)
                raise TimerError(f"timer {scope_id!r} refused: {verdict}")
            self.stats["requests"] += 1
            if exp < 0:
                self.stats["released"] += 1
                self.timers.pop((pid, scope_id), None)
                return
            self.stats["acquired"] += 1
            self.arm_locked(pid, scope_id, exp, verdict if start_time is None else start_time)
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

    def register_locked(self, requests: Iterable[Any]) -> None:
        """Apply torch-style requests: negative expiration releases, anything else arms the timer.

        Worker ids are taken as sent (any hashable value); the process they name, if any, is checked only
        when the timer expires.  A request with a ``signal`` attribute (:class:`FileTimerRequest`) chooses
        its own reaping signal; a signal <= 0 means the timer expires without reaping anyone (torch's
        meaning).  Malformed requests are refused one by one; the others still apply.
        """
        n = 0
        timers = self.timers
        for r in requests:
            n += 1
            try:
                key = (r.worker_id, r.scope_id)
                hash(key)
                raw = r.expiration_time
                exp = raw if type(raw) is float and raw <= MAX_EXPIRATION else check_expiration(raw)
            except InvalidTimerRequestError as e:
                self.refuse(e, getattr(r, "scope_id", "?"))
                continue
            except Exception as e:  # noqa: BLE001 - anything a client can put on a queue is refused, not raised
                self.refuse(Lazy(_malformed, r, e), "?")
                continue
            if exp < 0:
                self.stats["released"] += 1
                timers.pop(key, None)
                continue
            sig = getattr(r, "signal", None)
            code = 0 if type(sig) is not int else sig if sig > 0 else -1
            self.stats["acquired"] += 1
            self.arm_locked(key[0], key[1], exp, self.guard.start_of(key[0]), code)
        self.stats["requests"] += n
        self.flush_locked()

    def refuse(self, reason: object, scope_id: object) -> None:
        """Count a refused request and log it (rate-limited: a client can send refused requests at will).

        ``reason`` is formatted with ``str()`` only if the line is written (pass a :class:`Lazy`).
        """
        self.stats["refused"] += 1
        self.log.log(logging.WARNING, "timer request for scope %s refused: %s", Lazy(brief, scope_id), reason)

    def clear_locked(self, worker_ids: Iterable[Any]) -> None:
        """Drop every timer of the given workers (heap entries go stale)."""
        gone = set(worker_ids)
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
        self, deadline: float, make: Callable[[Any, Any, Timer], TimerRequest]
    ) -> dict[Any, list[TimerRequest]]:
        """Every armed timer with expiration <= deadline, grouped by worker id (the table is not changed)."""
        out: dict[Any, list[TimerRequest]] = {}
        for key, t in self.timers.items():
            if t[0] <= deadline:
                out.setdefault(key[0], []).append(make(key[0], key[1], t))
        return out

    def start_time_of_locked(self, worker_id: Any) -> int | None:
        """The start time recorded with any armed timer of ``worker_id`` (None if it has none)."""
        for key, t in self.timers.items():
            if key[0] == worker_id:
                return t[2]
        return None

    # -- reaping (lock held) ----------------------------------------------------------------------
    def due_locked(self, now: float) -> dict[Any, list[tuple[Any, Timer]]]:
        """Pop every heap entry due at ``now``; return the live ones grouped by worker (still armed)."""
        heap = self.heap
        timers = self.timers
        due: dict[Any, list[tuple[Any, Timer]]] = {}
        while heap and heap[0][0] <= now:
            exp, s, key = heapq.heappop(heap)
            t = timers.get(key)
            if t is not None and t[1] == s:
                due.setdefault(key[0], []).append((key[1], t))
        return due

    def reap_locked(
        self, worker_id: Any, start_time: int | None, scope_id: Any, sig: int | None, use_hook: bool = True
    ) -> bool:
        """Reap ``worker_id`` if it names a process the server may signal; a refusal is counted and logged."""
        if sig is not None and sig <= 0:
            return self.reaper.reap(worker_id, start_time, scope_id, sig)
        reason = self.guard.reapable(worker_id)
        if reason is not None:
            self.stats["refused"] += 1
            self.log.log(logging.WARNING, "timer %s expired; not reaping: %s", brief(scope_id), reason)
            return False
        hook = self.reap_hook
        if hook is None or not use_hook:
            return self.reaper.reap(worker_id, start_time, scope_id, sig)
        try:
            current = process_start_time(worker_id)
        except OSError:
            current = None
        if start_time is None or current != start_time:
            self.stats["skipped"] += 1
            logger.info("timer %s expired but pid %d is gone or names another process now", brief(scope_id), worker_id)
            return False
        try:
            done = bool(hook(worker_id, self.reaper.sig if sig is None else sig))
        except Exception:
            self.log.log(logging.ERROR, "_reap_worker(%r) raised; treating it as reaped", worker_id, exc_info=True)
            done = True
        if done:
            self.reaper._done(worker_id, scope_id)
        return done

    def fire_locked(self, now: float, drain: Callable[[set[Any]], None] | None = None) -> None:
        """Reap every worker with an expired timer.

        ``drain(worker_ids)`` lets the server read what those workers already sent (a release written before
        the deadline must win over the reap); timers released or re-armed meanwhile are spared.
        """
        due = self.due_locked(now)
        if due:
            if drain is not None:
                drain(set(due))
                self.flush_locked()
            expired: dict[Any, list[tuple[Any, Timer]]] = {}
            for wid, items in due.items():
                live = [(scope, t) for scope, t in items if self.timers.get((wid, scope)) == t]
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
                self.reap_locked(wid, first[2], scope, sig)
                if logger.isEnabledFor(logging.INFO):
                    logger.info("worker %s had expired timers %s", brief(wid), brief([s for s, _ in live]))
                expired[wid] = live
                self.clear_locked([wid])
            if expired and self.on_expired is not None:
                try:
                    self.on_expired(expired)
                except Exception:
                    self.log.log(logging.ERROR, "on_expired hook raised", exc_info=True)
        self.reaper.run_due(now)


def _malformed(request: object, e: Exception) -> str:
    return f"malformed request {brief(request)} ({type(e).__name__}: {e})"


class ServerExtras:
    """What every tsm timer server adds to torch's: arming a timer from inside the server, and counters.

    Mixed into the Local, File and Socket servers, which provide ``_core`` and ``_wake``.
    """

    _core: Core

    def _wake(self) -> None:  # pragma: no cover - each server provides its own
        raise NotImplementedError

    def arm(self, worker_pid: int, scope_id: str, expiration_time: float, *, start_time: int | None = None) -> None:
        """Arm a timer for ``worker_pid`` from inside the server's process (a supervisor arming a child).

        Unlike a client's request, the pid is checked now (TimerError if it may never be reaped) and so is the
        deadline (InvalidTimerRequestError); ``start_time`` defaults to the current start time of the pid
        (``/proc/<pid>/stat`` field 22) and is compared again before any signal.
        """
        self._core.arm_checked(worker_pid, scope_id, expiration_time, start_time)
        self._wake()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests, acquired, released, refused (requests refused, and expired timers whose worker
        may not be reaped), reaped, skipped (gone or reused pids), and connections for the socket server."""
        with self._core.lock:
            return dict(self._core.stats)
