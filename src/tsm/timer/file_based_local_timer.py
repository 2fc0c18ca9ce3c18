"""Timers over a named pipe (FIFO) that any process of the same user on the host can write to.

Wire-compatible with torch: one JSON object per line, ``{"version": 1, "pid": ..., "scope_id": ...,
"expiration_time": ..., "signal": ...}``, each line at most ``PIPE_BUF`` bytes so that a write is atomic.
Differences from torch:

* the client keeps the FIFO open and never drops a request: a full pipe makes it wait (back-pressure);
* the server sleeps until the earliest deadline or the next request, instead of polling;
* the server never kills itself, and arms timers only for pids > 1 that are not the server or one of its
  ancestors and that belong to the server's user; refusals are logged (the FIFO is one-way, so the client
  is not told); the FIFO is created 0600 in a directory only the user (or root, for sticky ``/tmp``) controls;
* a reused pid is never signalled (start time recorded when the timer is armed);
* a malformed line (not JSON, wrong types, a NaN, infinite or absurd deadline) is refused on its own --
  counted, logged at a limited rate, reported to ``log_event`` as "request refused" -- and the lines around
  it still apply; a client with no server gets :class:`~tsm.timer.TimerServerUnavailableError`, a
  ``BrokenPipeError`` as torch raises.

``log_debug_info_for_expired_timers`` is torch's function of that name (see :mod:`.debug_info_logging`); the
server calls it through this module, once per round in which timers expired.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import select
import signal as _signal
import threading
import time
import weakref
from collections.abc import Callable

from tsm.errors import TimerError, brief

from ._core import Core, ServerExtras, Timer, check_expiration, poll_until
from ._errors import TimerServerUnavailableError
from ._fs import Ident, make_fifo, remove_if_ours
from ._log import Lazy
from ._proc import Guard, OnReap, Reaper
from .api import TimerClient, TimerRequest
from .debug_info_logging import log_debug_info_for_expired_timers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FileTimerClient", "FileTimerRequest", "FileTimerServer", "log_debug_info_for_expired_timers"]

logger = logging.getLogger("tsm.timer")

#: Bytes read per round: one default pipe buffer.  A writer flooding the FIFO cannot hold the loop away
#: from the deadlines for longer than it takes to parse this much.
_READ_MAX = 1 << 16
_LINE_MAX = 1 << 16

LogEvent = Callable[[str, "FileTimerRequest | None"], None]


class FileTimerRequest(TimerRequest):
    """A :class:`TimerRequest` carrying the signal to reap with (<= 0: do not reap) and a format version."""

    __slots__ = ("version", "signal")

    def __init__(self, worker_pid: int, scope_id: str, expiration_time: float, signal: int = 0) -> None:
        super().__init__(worker_id=worker_pid, scope_id=scope_id, expiration_time=expiration_time)
        self.version = 1
        self.signal = signal

    @property
    def worker_pid(self) -> int:
        """The pid of the worker the request is about."""
        return int(self.worker_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileTimerRequest):
            return super().__eq__(other) and self.version == other.version and self.signal == other.signal
        return False

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.worker_id, self.scope_id, self.expiration_time, self.signal))

    def to_json(self) -> str:
        """The request as one line of the FIFO protocol (without the newline)."""
        return json.dumps(
            {
                "version": self.version,
                "pid": self.worker_pid,
                "scope_id": self.scope_id,
                "expiration_time": self.expiration_time,
                "signal": self.signal,
            }
        )


_file_clients: weakref.WeakSet[FileTimerClient] = weakref.WeakSet()


def _reset_locks_in_child() -> None:
    for client in list(_file_clients):
        client._lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_locks_in_child)


class FileTimerClient(TimerClient):
    """Client of :class:`FileTimerServer`: writes JSON lines to the FIFO at ``file_path``.

    ``signal`` is what the server sends when this client's timers expire (<= 0: expire without reaping).
    Writes never get lost: the FIFO stays open and a full pipe blocks the caller until the server reads.
    :class:`~tsm.timer.TimerServerUnavailableError` (a ``BrokenPipeError``, as torch raises) if no server
    has the FIFO open after about a second of retries.
    """

    def __init__(self, file_path: str, signal: int = _signal.SIGKILL) -> None:
        super().__init__()
        self._file_path = file_path
        self.signal = signal
        self._fd: int | None = None
        self._lock = threading.Lock()
        _file_clients.add(self)

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm ``scope_id`` for this process until ``expiration_time``."""
        self.send_request(FileTimerRequest(os.getpid(), scope_id, expiration_time, int(self.signal)))

    def release(self, scope_id: str) -> None:
        """Release ``scope_id`` of this process."""
        self.send_request(FileTimerRequest(os.getpid(), scope_id, -1, 0))

    def send_request(self, request: FileTimerRequest) -> None:
        """Write one request line, waiting while the pipe is full; TimerServerUnavailableError (a
        BrokenPipeError) if no server reads the FIFO."""
        exp = request.expiration_time
        exp_text = repr(exp) if isinstance(exp, (int, float)) and math.isfinite(exp) else json.dumps(exp)
        line = (
            f'{{"version": {request.version}, "pid": {request.worker_pid}, "scope_id": {json.dumps(request.scope_id)}, '
            f'"expiration_time": {exp_text}, "signal": {int(request.signal)}}}\n'
        ).encode()
        if len(line) > select.PIPE_BUF:
            raise ValueError(
                f"timer request of {len(line)} bytes exceeds PIPE_BUF ({select.PIPE_BUF}); shorten scope_id"
            )
        with self._lock:
            self._write_locked(line)

    _send_request = send_request  # torch's name

    def close(self) -> None:
        """Close the FIFO (it is reopened by the next request)."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)

    def _open_locked(self) -> int:
        # Non-blocking open: fails with ENXIO at once when no server has the FIFO open for reading.
        for attempt in range(11):
            try:
                self._fd = os.open(self._file_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                return self._fd
            except OSError as e:
                if attempt == 10:
                    raise TimerServerUnavailableError(
                        f"no FileTimerServer reads {self._file_path} ({e.strerror}); request not delivered"
                    ) from e
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def _write_locked(self, line: bytes) -> None:
        reopened = False
        fd = self._fd if self._fd is not None else self._open_locked()
        poller: select.poll | None = None
        while True:
            try:
                os.write(fd, line)  # <= PIPE_BUF: all or nothing
                return
            except BlockingIOError:
                if poller is None:
                    poller = select.poll()
                    poller.register(fd, select.POLLOUT)
                poller.poll()  # the pipe is full: wait for the server (back-pressure, never drop)
            except BrokenPipeError as e:
                os.close(fd)
                self._fd = None
                if reopened:
                    raise TimerServerUnavailableError(
                        f"FileTimerServer at {self._file_path} is gone; request not delivered"
                    ) from e
                reopened = True
                poller = None
                fd = self._open_locked()


class FileTimerServer(ServerExtras):
    """Reaps workers whose timers expire; workers reach it through the FIFO ``file_path``.

    Same constructor as torch's (``run_id`` tags log messages, ``log_event(name, request)`` receives
    "watchdog started", "timer expired", "kill worker process", "request refused" and "watchdog stopped").
    ``max_interval`` is accepted and unused: the loop sleeps until the earliest deadline or the next request.
    Extra keyword options as for :class:`SocketTimerServer`: ``term_grace``, ``kill_group``, ``on_reap``; the
    signal itself comes from each request, as in torch.  The FIFO is created (0600) and opened by the
    constructor, so clients can write before :meth:`start`.  ``start()`` on a started server and ``stop()``
    on a stopped one do nothing (as in torch); starting again after ``stop()`` is a TimerError (the FIFO is
    gone; torch's thread would die on it).  A subclass's ``_reap_worker(worker_pid, signal)`` is called for
    each worker to reap, as torch's loop does, once the guard allowed it.
    """

    def __init__(
        self,
        file_path: str,
        run_id: str,
        max_interval: float = 10,
        daemon: bool = True,
        log_event: LogEvent | None = None,
        *,
        term_grace: float | None = None,
        kill_group: bool = False,
        on_reap: OnReap | None = None,
    ) -> None:
        self._file_path = file_path
        self._run_id = run_id
        self._max_interval = max_interval
        self._daemon = daemon
        self._log_event: LogEvent = log_event if log_event is not None else (lambda name, request: None)
        self._user_on_reap = on_reap
        self._core = Core(Reaper(_signal.SIGKILL, term_grace, kill_group, self._reaped, {}), Guard())
        self._core.on_expired = self._expired
        self._ident: Ident | None = make_fifo(file_path)
        self._rfd = os.open(file_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        # Our own writer keeps the FIFO from reporting end-of-file whenever the last client closes it.
        self._keep_wfd = os.open(file_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ep = select.epoll()
        self._ep.register(self._rfd, select.EPOLLIN)
        try:
            self._pipe_size = max(_READ_MAX, fcntl.fcntl(self._rfd, fcntl.F_GETPIPE_SZ))
        except OSError:
            self._pipe_size = 1 << 20  # the largest a user may set without privileges
        self._ep.register(self._wake_r, select.EPOLLIN)
        self._partial = b""
        self._discarding = False
        self._watchdog_thread: threading.Thread | None = None
        self._stop_signaled = False
        self._run_once = False
        self._closed = False
        self._is_client_started = False
        self._busy_since: float | None = None
        self._last_progress_time = int(time.time())

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Run the server loop in a background thread."""
        if self._closed:
            raise TimerError("this FileTimerServer was stopped; create a new one")
        thread = self._watchdog_thread
        if thread is not None and thread.is_alive():
            logger.info("FileTimerServer (run %s) is already started", self._run_id)
            return
        self._stop_signaled = False
        self._core.refresh_identity()
        self._watchdog_thread = threading.Thread(
            target=self._watchdog_loop, name="tsm-FileTimerServer", daemon=self._daemon
        )
        self._watchdog_thread.start()
        self._is_client_started = True
        logger.info("FileTimerServer (run %s) reading %s", self._run_id, self._file_path)
        self._event("watchdog started", None)

    def stop(self) -> None:
        """Stop the loop and remove the FIFO (if it is still ours)."""
        self._stop_signaled = True
        self._join()
        self._close()
        self._event("watchdog stopped", None)

    def run_once(self) -> None:
        """Process every request already written, reap what is due, then stop (torch's test helper)."""
        self._run_once = True
        if self._watchdog_thread is None:
            self._iterate(0.0)
        self._join()
        self._close()

    @staticmethod
    def is_process_running(pid: int) -> bool:
        """True if ``pid`` exists and may be signalled by us."""
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def get_last_progress_time(self) -> int:
        """Now while the loop is healthy (waiting or busy for under max_interval); else when it last progressed."""
        now = time.time()
        busy = self._busy_since
        thread = self._watchdog_thread
        if thread is None or not self._is_client_started:
            return int(now) if not self._is_client_started else self._last_progress_time
        if thread.is_alive() and (busy is None or now - busy < max(self._max_interval, 1.0)):
            return int(now)
        return self._last_progress_time

    # -- torch's table API ------------------------------------------------------------------------------
    def register_timers(self, timer_requests: list[FileTimerRequest]) -> None:
        """Apply requests from inside the server's process (pids checked as for FIFO requests)."""
        with self._core.lock:
            self._core.register_locked(timer_requests)
        self._wake()

    def clear_timers(self, worker_pids: set[int]) -> None:
        """Drop the timers of these pids, and of every pid that no longer runs."""
        with self._core.lock:
            armed = {k[0] for k in self._core.timers}
            self._core.clear_locked(set(worker_pids) | {p for p in armed if not self.is_process_running(p)})

    def get_expired_timers(self, deadline: float) -> dict[int, list[FileTimerRequest]]:
        """Armed timers with ``expiration_time <= deadline``, by pid."""
        with self._core.lock:
            expired = self._core.expired_locked(deadline, _make_request)
        return {pid: [r for r in rs if isinstance(r, FileTimerRequest)] for pid, rs in expired.items()}

    def _reap_worker(self, worker_pid: int, signal: int) -> bool:
        """Signal ``worker_pid`` now if the guard allows it (start time as recorded with its timers).

        True whether it was signalled or can never be (refused, gone, reused): retrying changes nothing.
        """
        core = self._core
        with core.lock:
            start = core.start_time_of_locked(worker_pid)
            if start is None:
                start = core.guard.start_of(worker_pid)
            core.reap_locked(worker_pid, start, "<direct>", signal if signal > 0 else -1, use_hook=False)
        core.reaper.flush_callbacks()
        return True

    @property
    def _timers(self) -> dict[tuple[int, str], FileTimerRequest]:
        """A snapshot of the armed timers as torch's server keeps them: ``(pid, scope_id) -> request``."""
        with self._core.lock:
            return {k: _make_request_typed(k[0], k[1], t) for k, t in self._core.timers.items()}

    @property
    def _request_count(self) -> int:
        return self._core.stats["requests"]

    # -- loop ----------------------------------------------------------------------------------------------
    def _watchdog_loop(self) -> None:
        """The server thread (torch's name): rounds of :meth:`_iterate` until stopped."""
        while not self._stop_signaled:
            try:
                with self._core.lock:
                    deadline = self._core.next_deadline_locked()
                remaining = None if deadline is None else deadline - time.time()
                if self._run_watchdog_replaced():
                    # A subclass's (or a mock's) _run_watchdog may do periodic work of its own: give it torch's
                    # cadence, a round at least every max_interval, instead of rounds only on events.
                    if not self._run_once:
                        cap = max(self._max_interval, 0.001)
                        poll_until(self._ep, cap if remaining is None else max(0.0, min(remaining, cap)))
                    self._run_watchdog(None)
                else:
                    self._iterate(0.0 if self._run_once else remaining)
                if self._run_once:
                    return
            except Exception:
                self._core.log.log(
                    logging.ERROR, "error in the FileTimerServer loop (run %s)", self._run_id, exc_info=True
                )
                time.sleep(0.01)

    def _iterate(self, remaining: float | None) -> None:
        events = poll_until(self._ep, remaining)
        self._busy_since = time.time()
        core = self._core
        core.reap_hook = self._call_reap_worker if self._reap_worker_replaced() else None
        with core.lock:
            for fd, _ev in events:
                if fd == self._wake_r:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                elif fd == self._rfd:
                    self._read_locked()
            core.fire_locked(time.time(), self._drain_locked)
        core.reaper.flush_callbacks()
        self._busy_since = None
        self._last_progress_time = int(time.time())

    def _read_locked(self, limit: int = _READ_MAX) -> None:
        total = 0
        while total < limit:
            try:
                data = os.read(self._rfd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            total += len(data)
            self._consume_locked(data)

    def _drain_locked(self, pids: set[int]) -> None:
        # Everything written before the deadline is already in the pipe: at most its capacity.
        self._read_locked(self._pipe_size)

    def _consume_locked(self, data: bytes) -> None:
        if self._discarding:  # the rest of an over-long line: drop it up to its end
            cut = data.find(b"\n")
            if cut < 0:
                return
            self._discarding = False
            data = data[cut + 1 :]
        buf = self._partial + data if self._partial else data
        lines = buf.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > _LINE_MAX:
            self._refuse_line(f"request line longer than {_LINE_MAX} bytes")
            self._partial = b""
            self._discarding = True
        requests: list[TimerRequest] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                req = _parse_line(line)
            except Exception as e:  # noqa: BLE001 - anything a client writes is refused, never raised
                self._refuse_line(Lazy(_bad_line, line, e))
                continue
            requests.append(req)
        if requests:
            before = self._core.stats["refused"]
            self._core.register_locked(requests)
            if self._core.stats["refused"] != before:
                self._event("request refused", None)

    def _refuse_line(self, reason: object) -> None:
        self._core.refuse(reason, "?")
        self._event("request refused", None)

    def _reap_worker_replaced(self) -> bool:
        """True when ``_reap_worker`` is not this class's own: a subclass's, or a mock set on the class or instance.

        Then each expired worker goes through it (after the guard's checks) instead of the built-in reaper, so
        the subclass or mock sees every ``(worker_pid, signal)``.
        """
        return getattr(self._reap_worker, "__func__", None) is not _OWN_REAP_WORKER

    def _run_watchdog_replaced(self) -> bool:
        """True when ``_run_watchdog`` is a subclass's or a mock's: the loop then calls it every round."""
        return getattr(self._run_watchdog, "__func__", None) is not _OWN_RUN_WATCHDOG

    def _run_watchdog(self, fd: Any = None) -> None:
        """One round of the loop, as torch's ``_run_watchdog(fd)``: read what workers wrote, reap the expired.

        ``fd`` is accepted for torch's signature and not used (the server reads its FIFO through its own
        descriptor); this does not block. Tests and subclasses call it to drive the server step by step.
        """
        self._iterate(0.0)

    def _call_reap_worker(self, worker_id: Any, sig: int) -> bool:
        return self._reap_worker(worker_id, sig)

    def _expired(self, expired: dict[Any, list[tuple[Any, Timer]]]) -> None:
        requests = {pid: [_make_request_typed(pid, s, t) for s, t in live] for pid, live in expired.items()}
        log_debug_info_for_expired_timers(self._run_id, {pid: [r.to_json() for r in rs] for pid, rs in requests.items()})
        for rs in requests.values():
            for r in rs:
                self._event("timer expired", r)

    def _reaped(self, pid: int, scope_id: str) -> None:
        self._event("kill worker process", FileTimerRequest(pid, scope_id, -1, 0))
        if self._user_on_reap is not None:
            self._user_on_reap(pid, scope_id)

    def _event(self, name: str, request: FileTimerRequest | None) -> None:
        try:
            self._log_event(name, request)
        except Exception:
            logger.exception("log_event(%r) raised", name)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    def _join(self) -> None:
        self._wake()
        thread, self._watchdog_thread = self._watchdog_thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(10.0)
            if thread.is_alive():
                logger.warning("FileTimerServer loop did not stop within 10 s")

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        remove_if_ours(self._file_path, self._ident)
        self._ident = None
        for fd in (self._rfd, self._keep_wfd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ep.close()


_OWN_REAP_WORKER = FileTimerServer._reap_worker
_OWN_RUN_WATCHDOG = FileTimerServer._run_watchdog


def _bad_line(line: bytes, e: Exception) -> str:
    return f"malformed request line {brief(line, 60)} ({type(e).__name__}: {e})"


def _parse_line(line: bytes) -> FileTimerRequest:
    """One JSON line of the FIFO protocol as a request; any exception means the line is malformed."""
    d = json.loads(line.decode())  # str: the decoder skips guessing the encoding of bytes
    if not isinstance(d, dict):
        raise TypeError("not a JSON object")
    pid, scope, sig = d["pid"], d["scope_id"], d.get("signal", 0)
    if type(pid) is not int:
        raise TypeError(f"pid {brief(pid)} is not an integer")
    if not isinstance(scope, str):
        raise TypeError(f"scope_id {brief(scope)} is not a string")
    if type(sig) is not int or sig >= _signal.NSIG:
        raise TypeError(f"signal {brief(sig)} is not a signal number")
    return FileTimerRequest(pid, scope, check_expiration(d["expiration_time"]), sig)


def _make_request_typed(pid: int, scope_id: str, t: Timer) -> FileTimerRequest:
    return FileTimerRequest(pid, scope_id, t[0], t[3] if t[3] > 0 else 0)


def _make_request(pid: int, scope_id: str, t: Timer) -> TimerRequest:
    return _make_request_typed(pid, scope_id, t)
