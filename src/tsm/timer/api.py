"""torch's timer contract: requests, the abstract client, request queue and server (``tsm.timer.api``).

Names, signatures and meanings follow ``torch.distributed.elastic.timer.api``, so code written against it
(including a ``TimerServer`` or ``RequestQueue`` subclass) works after changing the import.
:class:`TimerServer`'s loop has torch's shape: ``_watchdog_loop`` calls ``_run_watchdog`` until stopped, and
one round asks the queue for ``get(size, max_interval)``, registers what came, then reaps and clears every
worker whose timers expired, through the four hooks a subclass overrides.  tsm's own servers are faster
(they sleep until the earliest deadline; see :mod:`tsm.timer.local_timer` for how they keep a torch
subclass working).  ``configure``/``expires`` live in :mod:`tsm.timer._expires` and are re-exported here,
as torch's ``api`` module has them.
"""

from __future__ import annotations

import abc
import logging
import threading
import time

from ._expires import TIMER_SOCKET_ENV, configure, expires
from ._log import LimitedLog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "TimerRequest",
    "TimerClient",
    "RequestQueue",
    "TimerServer",
    "configure",
    "expires",
    "TIMER_SOCKET_ENV",
]

logger = logging.getLogger("tsm.timer")

#: Longest single wait of a server loop or of a join; longer waits are taken in pieces (the OS timeouts
#: overflow around 24.8 days for epoll and 292 years for locks).
MAX_WAIT = 3600.0


def bounded_wait(seconds: float) -> float:
    """``seconds`` limited to ``[0, MAX_WAIT]`` (NaN counts as 0), safe for any OS timeout."""
    if seconds > MAX_WAIT:
        return MAX_WAIT
    return seconds if seconds > 0 else 0.0


class TimerRequest:
    """One acquire or release sent from a :class:`TimerClient` to a :class:`TimerServer`.

    ``worker_id`` identifies the worker: whatever the client and server agree on (tsm's clients send a
    pid); ``scope_id`` the timer within it and ``expiration_time`` the absolute deadline in ``time.time()``
    seconds; a negative expiration means "release".
    """

    __slots__ = ("worker_id", "scope_id", "expiration_time")

    def __init__(self, worker_id: Any, scope_id: str, expiration_time: float) -> None:
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.expiration_time = expiration_time

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TimerRequest):
            return (
                self.worker_id == other.worker_id
                and self.scope_id == other.scope_id
                and self.expiration_time == other.expiration_time
            )
        return False

    __hash__ = None  # type: ignore[assignment]  # mutable value object, like torch's

    def __repr__(self) -> str:
        return f"{type(self).__name__}(worker_id={self.worker_id!r}, scope_id={self.scope_id!r}, expiration_time={self.expiration_time!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.worker_id, self.scope_id, self.expiration_time))


class TimerClient(abc.ABC):
    """Acquires and releases countdown timers on behalf of the worker process that holds it."""

    @abc.abstractmethod
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm the timer ``scope_id`` of this worker to expire at ``expiration_time`` (``time.time()`` s)."""

    @abc.abstractmethod
    def release(self, scope_id: str) -> None:
        """Disarm the timer ``scope_id`` of this worker; releasing an unknown scope does nothing."""


class RequestQueue(abc.ABC):
    """Where a generic :class:`TimerServer` reads its requests from (torch's consumer-queue contract)."""

    @abc.abstractmethod
    def size(self) -> int:
        """Number of requests waiting now; it does not shrink until :meth:`get` is called."""

    @abc.abstractmethod
    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting no more than ``timeout`` seconds."""


class TimerServer(abc.ABC):
    """Watches armed timers and reaps the workers whose timers expire.

    Subclasses implement :meth:`register_timers`, :meth:`clear_timers`, :meth:`get_expired_timers` and
    :meth:`_reap_worker` (torch's contract).  :meth:`start` runs :meth:`_watchdog_loop` in a thread; each
    :meth:`_run_watchdog` round waits up to ``max_interval`` for requests (``get(size, max_interval)``, as
    torch calls it), so a worker is reaped up to ``max_interval`` after its deadline.  Starting a started
    server or stopping a stopped one does nothing.  Errors raised by a round are logged (rate-limited) and
    the loop goes on.
    """

    def __init__(self, request_queue: RequestQueue, max_interval: float, daemon: bool = True) -> None:
        super().__init__()
        self._request_queue = request_queue
        self._max_interval = max_interval
        self._daemon = daemon
        self._watchdog_thread: threading.Thread | None = None
        self._stop_signaled = False
        self._errors = LimitedLog(logger)

    @abc.abstractmethod
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply acquire and release (negative expiration) requests."""

    @abc.abstractmethod
    def clear_timers(self, worker_ids: set[Any]) -> None:
        """Drop every timer of the given workers."""

    @abc.abstractmethod
    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """Timers with ``expiration_time <= deadline``, grouped by worker id."""

    @abc.abstractmethod
    def _reap_worker(self, worker_id: Any) -> bool:
        """Reap one worker; True if it was reaped (its timers are then cleared)."""

    def _reap_worker_no_throw(self, worker_id: Any) -> bool:
        """:meth:`_reap_worker`, counting an exception as reaped (so a broken worker is not retried forever)."""
        try:
            return self._reap_worker(worker_id)
        except Exception:
            self._errors.log(
                logging.ERROR, "_reap_worker(%r) raised; treating the worker as reaped", worker_id, exc_info=True
            )
            return True

    def _get_scopes(self, timer_requests: list[TimerRequest]) -> list[Any]:
        return [r.scope_id for r in timer_requests]

    def _run_watchdog(self) -> None:
        """One round: take what the queue holds (waiting up to ``max_interval``), register it, reap what
        expired and clear the timers of the workers reaped."""
        size = max(1, self._request_queue.size())
        self.register_timers(self._request_queue.get(size, self._max_interval))
        reaped: set[Any] = set()
        for worker_id, expired in self.get_expired_timers(time.time()).items():
            logger.info("reaping worker %r: expired timers %s", worker_id, self._get_scopes(expired))
            if self._reap_worker_no_throw(worker_id):
                reaped.add(worker_id)
            else:
                self._errors.log(logging.ERROR, "could not reap worker %r; will retry next round", worker_id)
        self.clear_timers(reaped)

    def _watchdog_loop(self) -> None:
        while not self._stop_signaled:
            try:
                self._run_watchdog()
            except Exception:
                self._errors.log(logging.ERROR, "error in the %s loop", type(self).__name__, exc_info=True)
                time.sleep(0.01)  # a round that fails at once must not spin

    def start(self) -> None:
        """Run the loop in a background thread (daemon unless ``daemon=False``); no-op if it runs already."""
        thread = self._watchdog_thread
        if thread is not None and thread.is_alive():
            logger.info("%s is already started", type(self).__name__)
            return
        self._stop_signaled = False
        self._watchdog_thread = threading.Thread(
            target=self._watchdog_loop, name=f"tsm-{type(self).__name__}", daemon=self._daemon
        )
        self._watchdog_thread.start()
        logger.info("%s started (max_interval=%s)", type(self).__name__, self._max_interval)

    def stop(self) -> None:
        """Ask the loop to stop and wait for it (up to about ``max_interval``); no-op if not started."""
        self._stop_signaled = True
        thread, self._watchdog_thread = self._watchdog_thread, None
        if thread is None:
            logger.info("%s is not running; nothing to stop", type(self).__name__)
            return
        self._wake()
        if thread is not threading.current_thread():
            thread.join(self._join_timeout())
            if thread.is_alive():
                logger.warning("%s loop did not stop in time", type(self).__name__)
        logger.info("%s stopped", type(self).__name__)

    def _wake(self) -> None:
        """Interrupt the loop's wait (tsm servers override; a generic queue cannot be interrupted)."""
        return None

    def _join_timeout(self) -> float:
        return bounded_wait(self._max_interval + 1.0 if self._max_interval == self._max_interval else 1.0)
