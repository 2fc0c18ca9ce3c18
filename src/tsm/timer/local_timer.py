"""Timers over a ``multiprocessing`` queue, for workers that are child processes of the server's process.

Same constructor and meaning as torch's ``LocalTimerServer(mp_queue, max_interval=60, daemon=True)``,
``LocalTimerClient(mp_queue)`` and ``MultiprocessingRequestQueue(mp_queue)``.

Two loops, one server
---------------------
tsm's headline is event-driven reaping: a worker is dead about a millisecond after its deadline, whatever
``max_interval`` is, while torch's loop waits up to ``max_interval`` for requests before it looks at the
deadlines.  But code written for torch subclasses ``LocalTimerServer`` (or ``TimerServer``) and overrides
the hooks ``register_timers``, ``clear_timers``, ``get_expired_timers`` and ``_reap_worker``, or swaps
``_request_queue``; a fast loop that went straight to the internal table would silently ignore them.  So
each ``_run_watchdog`` round picks its shape:

* **fast path** (no hook overridden, on the class or the instance, and the queue is the server's own): wait
  on the queue only until the earliest deadline (a heap) or ``max_interval``, whichever comes first, apply
  the batch, then reap what is due.  Before reaping, what the expiring workers already put on the queue is
  applied, so a release sent before the deadline always wins.  ``max_interval`` keeps torch's meaning (the
  longest wait for requests; an idle server still runs one round per ``max_interval``) without delaying
  any reap.
* **torch's shape** (any hook overridden): :meth:`TimerServer._run_watchdog` exactly as torch runs it --
  ``get(size, max_interval)``, ``register_timers``, ``get_expired_timers(now)``, ``_reap_worker`` per worker,
  ``clear_timers`` -- so the subclass sees every call it expects, with torch's timing.

The check costs a few attribute lookups per round, is made every round (so ``mock.patch.object`` on a
running server takes effect), and needs no configuration.  ``stop()`` wakes either loop at once by putting a
private marker on the queue, which :class:`MultiprocessingRequestQueue` never hands to a caller.

Worker ids are taken as the client sends them (torch's servers are pid-agnostic).  Reaping is where the
guard sits: only a pid > 1 that is not the server or one of its ancestors, of the server's user, and still
the process that was running when the timer was armed, is ever signalled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as _queue
import signal as _signal
import time

from ._core import FINE_WAIT, Core, ServerExtras, Timer
from ._log import LimitedLog
from ._proc import Guard, OnReap, Reaper
from .api import RequestQueue, TimerClient, TimerRequest, TimerServer, bounded_wait

TYPE_CHECKING = False
if TYPE_CHECKING:
    from multiprocessing.queues import Queue as MpQueue
    from typing import Any

__all__ = ["LocalTimerClient", "LocalTimerServer", "MultiprocessingRequestQueue"]

logger = logging.getLogger("tsm.timer")
_queue_errors = LimitedLog(logger)

_DRAIN_MAX = 100_000

#: Requests one round of the fast loop takes before it applies them and looks at the deadlines: under a flood
#: of requests a round that drained up to :data:`_DRAIN_MAX` ran for seconds, reaping nothing and counting
#: nothing, before it applied any (16 client processes on 2 cores: 3-5 s rounds).
_FETCH_MAX = 4096


class _Wake:
    """Marker a server puts on its own queue to interrupt its wait (for stop or a new earlier deadline)."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Wake, (self.token,))


class LocalTimerClient(TimerClient):
    """Client of :class:`LocalTimerServer`: puts :class:`TimerRequest` (pid, scope, expiration) on the queue."""

    def __init__(self, mp_queue: MpQueue[Any]) -> None:
        super().__init__()
        self._mp_queue = mp_queue

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm ``scope_id`` for this process until ``expiration_time``."""
        self._mp_queue.put(TimerRequest(os.getpid(), scope_id, expiration_time))

    def release(self, scope_id: str) -> None:
        """Release ``scope_id`` for this process."""
        self._mp_queue.put(TimerRequest(os.getpid(), scope_id, -1))


_UNREADABLE = object()


def _get_one(mp_queue: MpQueue[Any], timeout: float | None) -> Any:
    """One item (``queue.Empty`` when none came in time).  An item that cannot be unpickled is logged and
    reported as ``_UNREADABLE``: a bad object on the queue must not take the items around it along."""
    try:
        if timeout is None:
            return mp_queue.get_nowait()
        return mp_queue.get(block=True, timeout=timeout)
    except _queue.Empty:
        raise
    except (OSError, ValueError):
        raise  # the queue itself is closed or broken
    except Exception as e:  # noqa: BLE001 - e.g. an unpicklable object put by a client
        _queue_errors.log(
            logging.WARNING, "dropped an unreadable item from the timer queue: %s: %s", type(e).__name__, e
        )
        return _UNREADABLE


class MultiprocessingRequestQueue(RequestQueue):
    """A :class:`RequestQueue` over a ``multiprocessing`` queue, with torch's contract: ``get(size, timeout)``
    waits for up to ``size`` requests until ``timeout`` runs out.  The server's wake-up marker ends the wait
    early and is never returned; so is an item that cannot be unpickled (logged).
    """

    def __init__(self, mp_queue: MpQueue[Any]) -> None:
        super().__init__()
        self._mp_queue = mp_queue

    def size(self) -> int:
        """Requests waiting now."""
        return self._mp_queue.qsize()

    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds in all (at most an hour per call)."""
        out: list[TimerRequest] = []
        end = time.monotonic() + bounded_wait(timeout)
        try:
            while len(out) < size:
                item = _get_one(self._mp_queue, max(0.0, end - time.monotonic()))
                if isinstance(item, _Wake):
                    break
                if item is not _UNREADABLE:
                    out.append(item)
        except (_queue.Empty, OSError, ValueError):
            pass
        return out


def _take_ready(mp_queue: MpQueue[Any], limit: int, out: list[Any]) -> bool:
    """Append to ``out`` up to ``limit`` items already in ``mp_queue``, under one hold of its read lock; False
    when the queue is not CPython's ``multiprocessing.Queue`` layout (the caller then takes them one by one).

    ``Queue.get_nowait`` takes the read lock, builds a selector to poll the pipe, reads one item and lets
    go, for every item: most of a server's time under a flood of requests. This does what it does (the same
    lock, pipe and semaphore, in the same order) for a run of items, with one ``poll`` object.
    """
    reader, rlock, sem = (getattr(mp_queue, name, None) for name in ("_reader", "_rlock", "_sem"))
    if reader is None or rlock is None or sem is None or not hasattr(mp_queue, "_after_fork"):
        return False
    if getattr(mp_queue, "_closed", False):
        raise ValueError("queue closed")
    import select
    from multiprocessing.reduction import ForkingPickler

    poller = select.poll()
    poller.register(reader.fileno(), select.POLLIN)
    raw: list[bytes] = []
    if not rlock.acquire(False):
        return True  # another reader holds it: nothing taken now, the next round tries again
    try:
        while len(raw) < limit and poller.poll(0):
            raw.append(reader.recv_bytes())
            with contextlib.suppress(ValueError):  # an item written to the pipe without put(): nothing to give back
                sem.release()
    finally:
        rlock.release()
    for data in raw:
        try:
            out.append(ForkingPickler.loads(data))
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable object put by a client
            _queue_errors.log(
                logging.WARNING, "dropped an unreadable item from the timer queue: %s: %s", type(e).__name__, e
            )
            out.append(_UNREADABLE)
    return True


def _fetch(mp_queue: MpQueue[Any], timeout: float) -> list[Any]:
    """Wait up to about ``timeout`` for one item, then take whatever else is already there.

    Like :func:`~tsm.timer._core.poll_until`, it never sleeps past the deadline by the queue's millisecond
    rounding: it returns up to a millisecond early, and sleeps the last stretch precisely.
    """
    out: list[Any] = []
    try:
        if timeout <= FINE_WAIT:
            if timeout > 0:
                time.sleep(timeout)  # the queue's own wait rounds up to whole milliseconds
            out.append(_get_one(mp_queue, None))
        else:
            out.append(_get_one(mp_queue, bounded_wait(timeout - 0.001)))
        if not _take_ready(mp_queue, _FETCH_MAX - len(out), out):
            while len(out) < _FETCH_MAX:
                out.append(_get_one(mp_queue, None))
    except (_queue.Empty, OSError, ValueError):
        pass
    return out


_HOOKS = ("register_timers", "clear_timers", "get_expired_timers", "_reap_worker", "_reap_worker_no_throw")


class LocalTimerServer(ServerExtras, TimerServer):
    """Reaps child-process workers whose timers expire; requests come over a ``multiprocessing`` queue.

    Reaps at the deadline (not on the next ``max_interval`` tick) unless a subclass overrides torch's hooks,
    in which case it runs torch's loop (see the module's docstring).  ``start()`` on a started server and
    ``stop()`` on a stopped one do nothing, as in torch.  Extra keyword options (tsm): ``signal`` sent at
    expiry (default SIGKILL), ``term_grace`` seconds of SIGTERM first (None: no SIGTERM), ``kill_group`` to
    signal the worker's process group, ``on_reap(pid, scope_id)`` called after a worker is reaped.
    """

    def __init__(
        self,
        mp_queue: MpQueue[Any],
        max_interval: float = 60,
        daemon: bool = True,
        *,
        signal: int = _signal.SIGKILL,
        term_grace: float | None = None,
        kill_group: bool = False,
        on_reap: OnReap | None = None,
    ) -> None:
        super().__init__(MultiprocessingRequestQueue(mp_queue), max_interval, daemon)
        self._mp_queue = mp_queue
        self._own_queue: RequestQueue = self._request_queue
        self._token = os.urandom(8).hex()
        self._core = Core(Reaper(signal, term_grace, kill_group, on_reap, {}), Guard())

    def start(self) -> None:
        """Run the server loop in a background thread (no-op if it runs already)."""
        self._core.refresh_identity()
        super().start()

    # -- torch's contract ---------------------------------------------------------------------------
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply acquires and releases; worker ids are taken as sent, malformed requests refused."""
        with self._core.lock:
            self._core.register_locked(timer_requests)

    def clear_timers(self, worker_ids: set[Any]) -> None:
        """Drop every timer of these workers."""
        with self._core.lock:
            self._core.clear_locked(worker_ids)

    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """Armed timers with ``expiration_time <= deadline``, by worker id."""
        with self._core.lock:
            return self._core.expired_locked(deadline, _make_request)

    def _reap_worker(self, worker_id: Any) -> bool:
        """Signal ``worker_id`` with the configured signal if it may be (guarded, start time checked).

        True whether it was signalled or can never be (not a pid, refused, gone, reused): retrying would
        change nothing, so its timers are cleared either way.
        """
        core = self._core
        with core.lock:
            start = core.start_time_of_locked(worker_id)
            if start is None:
                start = core.guard.start_of(worker_id)
            core.reap_locked(worker_id, start, "<direct>", None, use_hook=False)
        core.reaper.flush_callbacks()
        return True

    @property
    def _timers(self) -> dict[tuple[Any, Any], TimerRequest]:
        """A snapshot of the armed timers as torch's server keeps them: ``(worker_id, scope_id) -> request``."""
        with self._core.lock:
            return {k: _make_request(k[0], k[1], t) for k, t in self._core.timers.items()}

    # -- loop ---------------------------------------------------------------------------------------------
    def _torch_shaped(self) -> bool:
        """True when a hook or the request queue was replaced: then torch's loop runs, calling them."""
        for name in _HOOKS:
            if getattr(getattr(self, name), "__func__", None) is not _OWN_HOOKS[name]:
                return True
        return self._request_queue is not self._own_queue

    def _run_watchdog(self) -> None:
        core = self._core
        if self._torch_shaped():
            super()._run_watchdog()
            with core.lock:
                core.reaper.run_due(time.time())  # final signals after a term_grace
            core.reaper.flush_callbacks()
            return
        with core.lock:
            deadline = core.next_deadline_locked()
        timeout = max(bounded_wait(self._max_interval), 0.001)
        if deadline is not None:
            timeout = min(timeout, deadline - time.time())
        batch = _fetch(self._mp_queue, timeout)
        with core.lock:
            core.register_locked(self._requests_only(batch))
            core.fire_locked(time.time(), self._drain)
        core.reaper.flush_callbacks()

    def _requests_only(self, batch: list[Any]) -> list[Any]:
        return [item for item in batch if item is not _UNREADABLE and not isinstance(item, _Wake)]

    def _drain(self, pids: set[Any]) -> None:
        """Apply everything already queued, so releases sent before the deadline win over reaping."""
        batch: list[Any] = []
        try:
            if not _take_ready(self._mp_queue, _DRAIN_MAX, batch):
                while len(batch) < _DRAIN_MAX:
                    batch.append(_get_one(self._mp_queue, None))
        except (_queue.Empty, OSError, ValueError):
            pass
        self._core.register_locked(self._requests_only(batch))

    def _wake(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: queue closed
            self._mp_queue.put(_Wake(self._token))

    def _join_timeout(self) -> float:
        return 10.0


_OWN_HOOKS = {name: getattr(LocalTimerServer, name) for name in _HOOKS}


def _make_request(worker_id: Any, scope_id: Any, t: Timer) -> TimerRequest:
    return TimerRequest(worker_id, scope_id, t[0])
