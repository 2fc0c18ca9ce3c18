"""The timer API shared by every client and server: requests, abstract client and server, ``expires``.

Names and meanings follow ``torch.distributed.elastic.timer.api`` so that code written against it keeps
working; the differences are in :class:`TimerServer`'s loop (it sleeps until the earliest deadline instead
of polling every ``max_interval``) and in :func:`expires` (no stack inspection without a scope, and a
``TSM_TIMER_SOCKET`` default client).
"""

from __future__ import annotations

import abc
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

from tsm.errors import TimerError

TYPE_CHECKING = False  # `typing` costs ~2 ms to import and is only needed by type checkers
if TYPE_CHECKING:
    from typing import Any, ParamSpec, TypeVar

    _P = ParamSpec("_P")
    _R = TypeVar("_R")

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

#: Environment variable naming a :class:`~tsm.timer.SocketTimerServer` socket; :func:`expires` uses it
#: when :func:`configure` was never called.
TIMER_SOCKET_ENV = "TSM_TIMER_SOCKET"


class _NotConfiguredError(TimerError, RuntimeError):
    """``expires`` found no client (a RuntimeError too, as torch raises)."""


class TimerRequest:
    """One acquire or release sent from a :class:`TimerClient` to a :class:`TimerServer`.

    ``worker_id`` identifies the worker (a pid for every tsm server), ``scope_id`` the timer within it and
    ``expiration_time`` the absolute deadline in ``time.time()`` seconds; a negative expiration means
    "release".
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
    :meth:`_reap_worker` (torch's contract).  The loop waits on the request queue only until the earliest
    deadline (found with :meth:`_next_deadline`), so reaping happens at the deadline, not on the next
    ``max_interval`` tick; ``max_interval`` only bounds how long an idle generic loop waits before checking
    whether it was stopped.  tsm's own servers override the loop and never poll at all.
    """

    def __init__(self, request_queue: RequestQueue, max_interval: float, daemon: bool = True) -> None:
        super().__init__()
        self._request_queue = request_queue
        self._max_interval = max_interval
        self._daemon = daemon
        self._watchdog_thread: threading.Thread | None = None
        self._stop_signaled = False
        self._reap_failed = False

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
            logger.exception("_reap_worker(%r) raised; treating the worker as reaped", worker_id)
            return True

    def _next_deadline(self) -> float | None:
        """Earliest armed expiration time, or None.  Generic O(n) fallback; tsm servers keep a heap."""
        times = [r.expiration_time for rs in self.get_expired_timers(float("inf")).values() for r in rs]
        return min(times) if times else None

    def _wait_timeout(self) -> float:
        """How long the generic loop may block on the queue: until the earliest deadline, at most max_interval."""
        cap = max(self._max_interval, 0.0)
        if self._reap_failed:
            return cap
        deadline = self._next_deadline()
        if deadline is None:
            return cap
        return max(0.0, min(cap, deadline - time.time()))

    def _run_watchdog(self) -> None:
        """One round: wait for requests or the earliest deadline, apply requests, reap what expired."""
        size = max(1, self._request_queue.size())
        self.register_timers(self._request_queue.get(size, self._wait_timeout()))
        reaped: set[Any] = set()
        failed = False
        for worker_id, expired in self.get_expired_timers(time.time()).items():
            logger.info("reaping worker %r, expired timers %s", worker_id, [r.scope_id for r in expired])
            if self._reap_worker_no_throw(worker_id):
                reaped.add(worker_id)
            else:
                failed = True
                logger.error("could not reap worker %r; will retry", worker_id)
        self._reap_failed = failed
        self.clear_timers(reaped)

    def _watchdog_loop(self) -> None:
        while not self._stop_signaled:
            try:
                self._run_watchdog()
            except Exception:
                logger.exception("error in the timer server loop")

    def start(self) -> None:
        """Run the server loop in a background thread (a daemon thread unless ``daemon=False``)."""
        if self._watchdog_thread is not None:
            raise TimerError(f"{type(self).__name__} is already started")
        self._stop_signaled = False
        self._watchdog_thread = threading.Thread(
            target=self._watchdog_loop, name=f"tsm-{type(self).__name__}", daemon=self._daemon
        )
        self._watchdog_thread.start()
        logger.info("%s started", type(self).__name__)

    def stop(self) -> None:
        """Ask the loop to stop and wait for it (at most ``max_interval`` for a generic server)."""
        self._stop_signaled = True
        self._wake()
        thread, self._watchdog_thread = self._watchdog_thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._join_timeout())
            if thread.is_alive():
                logger.warning("%s loop did not stop in time", type(self).__name__)
        logger.info("%s stopped", type(self).__name__)

    def _wake(self) -> None:
        """Interrupt the loop's wait (tsm servers override; a generic queue cannot be interrupted)."""
        return None

    def _join_timeout(self) -> float:
        return max(self._max_interval, 0.0) + 1.0


_timer_client: TimerClient | None = None
_env_client: tuple[str, TimerClient] | None = None
_scope_ids = itertools.count(1)


def configure(timer_client: TimerClient) -> None:
    """Make ``timer_client`` the client :func:`expires` uses when it is given none."""
    global _timer_client
    _timer_client = timer_client
    logger.info("timer client configured: %s", type(timer_client).__name__)


def _default_client() -> TimerClient:
    """The configured client, else a SocketTimerClient for ``$TSM_TIMER_SOCKET`` (built once per path)."""
    global _env_client
    if _timer_client is not None:
        return _timer_client
    path = os.environ.get(TIMER_SOCKET_ENV)
    if path:
        env = _env_client
        if env is None or env[0] != path:
            from .socket_timer import SocketTimerClient

            env = _env_client = (path, SocketTimerClient(path))
        return env[1]
    raise _NotConfiguredError(
        f"no timer client: call tsm.timer.configure(client) or set {TIMER_SOCKET_ENV} before using expires()"
    )


class _Expires:
    """The context manager (and decorator) :func:`expires` returns."""

    __slots__ = ("_after", "_scope", "_client", "_held", "_held_client")

    def __init__(self, after: float, scope: str | None, client: TimerClient | None) -> None:
        self._after = after
        self._scope = scope
        self._client = client
        self._held = ""
        self._held_client: TimerClient | None = None

    def __enter__(self) -> None:
        client = self._client if self._client is not None else _default_client()
        scope = self._scope if self._scope is not None else f"expires#{next(_scope_ids)}"
        client.acquire(scope, time.time() + self._after)
        self._held = scope
        self._held_client = client

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        client, self._held_client = self._held_client, None
        if client is not None:
            client.release(self._held)

    def __call__(self, func: Callable[_P, _R]) -> Callable[_P, _R]:
        after, scope, client = self._after, self._scope, self._client

        @functools.wraps(func)
        def timed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with _Expires(after, scope, client):
                return func(*args, **kwargs)

        return timed


def expires(after: float, scope: str | None = None, client: TimerClient | None = None) -> _Expires:
    """Arm a countdown timer of ``after`` seconds around a block; release it when the block exits.

    If the block is still running at the deadline, the server may reap this worker.  Without ``scope`` a
    cheap unique one (``expires#<n>``) is generated, so nested and recursive blocks get distinct timers.
    Without ``client`` the one given to :func:`configure` is used, else a :class:`SocketTimerClient` for
    ``$TSM_TIMER_SOCKET``.  Works as ``with expires(after=60): ...`` and as a decorator.
    """
    return _Expires(after, scope, client)
