"""Timers over a ``multiprocessing`` queue, for workers that are child processes of the server's process.

Same constructor and meaning as torch's ``LocalTimerServer(mp_queue, max_interval=60, daemon=True)`` and
``LocalTimerClient(mp_queue)``; the server blocks on the queue until the earliest deadline (woken by a
marker put on the queue for ``stop``/``arm``), validates every pid before arming, and reaps through the
shared safe reaper.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as _queue
import signal as _signal
import time

from ._core import FINE_WAIT, Core, ServerExtras, Timer
from ._proc import Guard, OnReap, Reaper
from .api import RequestQueue, TimerClient, TimerRequest, TimerServer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from multiprocessing.queues import Queue as MpQueue
    from typing import Any

__all__ = ["LocalTimerClient", "LocalTimerServer", "MultiprocessingRequestQueue"]

logger = logging.getLogger("tsm.timer")

_DRAIN_MAX = 100_000


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


class MultiprocessingRequestQueue(RequestQueue):
    """A :class:`RequestQueue` over a ``multiprocessing`` queue, with torch's contract: ``get(size, timeout)``
    waits for up to ``size`` requests until ``timeout`` runs out (for generic :class:`TimerServer` subclasses).
    """

    def __init__(self, mp_queue: MpQueue[Any]) -> None:
        super().__init__()
        self._mp_queue = mp_queue

    def size(self) -> int:
        """Requests waiting now."""
        return self._mp_queue.qsize()

    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds in all."""
        out: list[TimerRequest] = []
        end = time.monotonic() + max(timeout, 0.0)
        try:
            while len(out) < size:
                out.append(self._mp_queue.get(block=True, timeout=max(0.0, end - time.monotonic())))
        except _queue.Empty:
            pass
        return out


def _fetch(mp_queue: MpQueue[Any], timeout: float | None) -> list[Any]:
    """Wait up to about ``timeout`` (None: forever) for one item, then take whatever else is already there.

    Like :func:`~tsm.timer._core.poll_until`, it never sleeps past the deadline by the queue's millisecond
    rounding: it returns up to a millisecond early, and sleeps the last stretch precisely.
    """
    out: list[Any] = []
    try:
        if timeout is not None and timeout <= FINE_WAIT:
            if timeout > 0:
                time.sleep(timeout)  # the queue's own wait rounds up to whole milliseconds
            out.append(mp_queue.get_nowait())
        else:
            out.append(mp_queue.get(block=True, timeout=None if timeout is None else timeout - 0.001))
        while len(out) < _DRAIN_MAX:
            out.append(mp_queue.get_nowait())
    except _queue.Empty:
        pass
    return out


class LocalTimerServer(ServerExtras, TimerServer):
    """Reaps child-process workers whose timers expire; requests come over a ``multiprocessing`` queue.

    ``max_interval`` is accepted for compatibility and not used for waiting: the server sleeps until the
    earliest deadline or the next request.  Extra keyword options (tsm): ``signal`` sent at expiry (default
    SIGKILL), ``term_grace`` seconds of SIGTERM first (None: no SIGTERM), ``kill_group`` to signal the
    worker's process group, ``on_reap(pid, scope_id)`` called after a worker is reaped.
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
        self._token = os.urandom(8).hex()
        self._core = Core(Reaper(signal, term_grace, kill_group, on_reap, {}), Guard())

    def start(self) -> None:
        """Run the server loop in a background thread."""
        self._core.refresh_identity()
        super().start()

    # -- torch's contract ---------------------------------------------------------------------------
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply acquires (after checking the pid may be reaped) and releases."""
        with self._core.lock:
            self._core.register_locked(timer_requests)

    def clear_timers(self, worker_ids: set[Any]) -> None:
        """Drop every timer of these pids."""
        with self._core.lock:
            self._core.clear_locked(worker_ids)

    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """Armed timers with ``expiration_time <= deadline``, by pid."""
        with self._core.lock:
            return dict(self._core.expired_locked(deadline, _make_request))

    def _reap_worker(self, worker_id: Any) -> bool:
        """Signal ``worker_id`` now with the configured signal (start time checked against the current one)."""
        start = self._core.guard.admit(worker_id) if isinstance(worker_id, int) else "not a pid"
        if isinstance(start, str):
            logger.warning("not reaping %r: %s", worker_id, start)
            return True
        with self._core.lock:
            done = self._core.reaper.reap(worker_id, start, "<direct>")
        self._core.reaper.flush_callbacks()
        return done

    # -- loop ---------------------------------------------------------------------------------------------
    def _run_watchdog(self) -> None:
        core = self._core
        with core.lock:
            deadline = core.next_deadline_locked()
        timeout = None if deadline is None else deadline - time.time()
        batch = _fetch(self._mp_queue, timeout)
        with core.lock:
            core.register_locked(self._requests_only(batch))
            core.fire_locked(time.time(), self._drain)
        core.reaper.flush_callbacks()

    def _requests_only(self, batch: list[Any]) -> list[TimerRequest]:
        out: list[TimerRequest] = []
        for item in batch:
            if isinstance(item, _Wake):
                continue
            if hasattr(item, "worker_id") and hasattr(item, "scope_id") and hasattr(item, "expiration_time"):
                out.append(item)
            else:
                self._core.refuse(f"not a TimerRequest: {type(item).__name__}", "?")
        return out

    def _drain(self, pids: set[int]) -> None:
        """Apply everything already queued, so releases sent before the deadline win over reaping."""
        batch: list[Any] = []
        try:
            while len(batch) < _DRAIN_MAX:
                batch.append(self._mp_queue.get_nowait())
        except _queue.Empty:
            pass
        self._core.register_locked(self._requests_only(batch))

    def _wake(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: queue closed
            self._mp_queue.put(_Wake(self._token))

    def _join_timeout(self) -> float:
        return 10.0


def _make_request(pid: int, scope_id: str, t: Timer) -> TimerRequest:
    return TimerRequest(pid, scope_id, t[0])
