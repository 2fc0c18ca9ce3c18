"""Expiration timers: a worker about to enter a block that may hang arms a countdown; if it has not
released it by the deadline, a timer server reaps (signals) the worker.

This is a drop-in for ``torch.distributed.elastic.timer``: same classes, signatures and meanings, so code
written against it works after changing only the import.  It needs nothing outside the standard library
(Linux: it reads ``/proc``).

Quick example (one server per host, workers in other processes)::

    import tsm.timer as timer

    # in the supervisor
    server = timer.SocketTimerServer("/run/user/1000/job/timers.sock", on_reap=lambda pid, scope: ...)
    server.start()                           # daemon thread; server.stop() removes the socket

    # in a worker (or just export TSM_TIMER_SOCKET=<path> and skip configure)
    timer.configure(timer.SocketTimerClient("/run/user/1000/job/timers.sock"))
    with timer.expires(after=60):            # reaped if still inside after 60 s
        all_reduce(...)

The classes
-----------
``TimerRequest(worker_id, scope_id, expiration_time)``
    One acquire, or a release when ``expiration_time`` is negative.  Deadlines are ``time.time()`` seconds.
``TimerClient`` (abstract: ``acquire(scope_id, expiration_time)``, ``release(scope_id)``)
``TimerServer(request_queue, max_interval, daemon=True)`` and ``RequestQueue``
    Abstract bases for your own server (``register_timers``, ``clear_timers``, ``get_expired_timers``,
    ``_reap_worker``; ``start``, ``stop``), run by torch's loop (``_watchdog_loop`` -> ``_run_watchdog`` ->
    ``get(size, max_interval)``), so a subclass written for torch works unchanged.
``configure(client)`` and ``expires(after, scope=None, client=None)``
    ``expires`` is a context manager (and decorator) that always releases.  Without ``client`` it uses the
    configured one, else a ``SocketTimerClient`` for ``$TSM_TIMER_SOCKET`` (see :data:`TIMER_SOCKET_ENV`).
``LocalTimerServer(mp_queue, max_interval=60, daemon=True)`` / ``LocalTimerClient(mp_queue)``
    Over a ``multiprocessing`` queue, for workers that are children of the server's process.
``FileTimerServer(file_path, run_id, max_interval=10, daemon=True, log_event=None)`` /
``FileTimerClient(file_path, signal=SIGKILL)``
    Over a FIFO any process of the same user on the host can write to; torch's JSON-lines wire format.
``SocketTimerServer(path, max_interval=60, daemon=True)`` / ``SocketTimerClient(path, ack=False)``
    Over a Unix socket; the kernel tells the server each client's pid (SO_PEERCRED), so a client can only
    arm timers for itself.  The fastest and the safest; use it unless you need torch's wire formats.
``TimerServerUnavailableError`` (a ``BrokenPipeError``, as torch raises) and ``InvalidTimerRequestError``
    (a ``ValueError``): both ``tsm.errors.TimerError``.

Modules carry torch's names: ``tsm.timer.api``, ``tsm.timer.local_timer``, ``tsm.timer.file_based_local_timer``
(with ``log_debug_info_for_expired_timers``) and ``tsm.timer.debug_info_logging``.

Every server also takes keyword options ``term_grace`` (SIGTERM first, the final signal that many seconds
later), ``kill_group`` (signal the worker's process group) and ``on_reap(pid, scope_id)``; the Local and
Socket servers take ``signal`` (default SIGKILL; the FIFO protocol carries it per request).  Every server
has ``arm(pid, scope_id, expiration_time, start_time=None)`` to time a process from inside the server's
process, and ``stats`` (requests processed, refused, reaped, ...).

What is the same as in PyTorch
------------------------------
Names, signatures and meanings of every public class and function; ``start()`` on a started server and
``stop()`` on a stopped one do nothing; a client with no server raises ``BrokenPipeError``; worker ids are
whatever the client sends (the table is pid-agnostic); a ``TimerServer`` subclass sees the same hook calls
in the same order; a ``LocalTimerServer`` or ``FileTimerServer`` subclass that overrides a hook has it
called.  ``tests/timer/test_timer_torch_compat.py`` runs one user program against both and compares.

How it differs from PyTorch
---------------------------
* Event-driven reaping: tsm's servers sleep until the earliest deadline (a heap) or the next request, so a
  worker is dead about a millisecond after its deadline whatever ``max_interval`` is (it only bounds how
  long an idle round waits); torch's servers look at deadlines every ``max_interval`` (a 1 s interval means
  0.5-1.5 s late).  A ``LocalTimerServer`` subclass that overrides torch's hooks gets torch's loop and
  timing instead (see :mod:`tsm.timer.local_timer`).  Before reaping, a server reads what the worker
  already sent: a release written in time always wins.
* No lost requests: the FIFO client keeps the pipe open and waits when it is full (torch's drops requests
  with BlockingIOError); socket clients write on a blocking socket.  Nothing is ever dropped.
* Reaping is guarded, arming is not: the server never kills itself (torch's FileTimerServer kills its own
  process after reaping) and never signals pid <= 1, itself, its ancestors or another user's process; an
  expired timer of such an id is dropped, counted in ``stats["refused"]`` and logged on ``tsm.timer``.
  The socket server only arms timers for the connecting pid (a request naming another pid gets a
  TimerError).  The FIFO/socket is created 0600 in a directory that you own (or a root-owned sticky one
  such as ``/tmp``, where nobody else can replace it).
* A pid reused by another process is never signalled: the start time (``/proc/<pid>/stat`` field 22) is
  recorded when the timer is armed and checked before every signal.
* Bad requests cannot hurt the server: a deadline that is NaN, infinite or after year 9999, a wrong type,
  garbage bytes or a truncated record is refused on its own (the socket client raises
  ``InvalidTimerRequestError`` before sending; the socket server answers *refused*), every refusal is
  counted, and the log gets a burst and then one line per 10 s.  Waits are cut into pieces of at most an
  hour, so no value overflows an OS timeout.  One process may hold at most 64 socket connections.
* ``expires()`` without a scope does no stack inspection (~1 µs of overhead instead of ~200-350 µs); the
  scope is generated (``expires#<n>``), so nested and recursive blocks never share a timer.
* ``import tsm.timer`` takes ~20 ms (mostly ``logging``) and imports only the standard library and
  ``tsm.errors``; importing torch's module takes about a second.
* Socket delivery: a refused process learns it at connect (first call raises TimerError); ordinary
  acquire/release are fire-and-forget writes that cannot be refused; ``ack=True`` or ``sync()`` wait for
  the server.  Unix socket paths longer than 107 bytes work.
"""

from __future__ import annotations

from . import _expires
from ._errors import InvalidTimerRequestError, TimerServerUnavailableError
from ._expires import TIMER_SOCKET_ENV, configure, expires
from .api import RequestQueue, TimerClient, TimerRequest, TimerServer
from .file_based_local_timer import FileTimerClient, FileTimerRequest, FileTimerServer
from .local_timer import LocalTimerClient, LocalTimerServer, MultiprocessingRequestQueue
from .socket_timer import SocketTimerClient, SocketTimerServer

_expires._set_env_client_factory(SocketTimerClient)

__all__ = [
    "TIMER_SOCKET_ENV",
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "InvalidTimerRequestError",
    "LocalTimerClient",
    "LocalTimerServer",
    "MultiprocessingRequestQueue",
    "RequestQueue",
    "SocketTimerClient",
    "SocketTimerServer",
    "TimerClient",
    "TimerRequest",
    "TimerServer",
    "TimerServerUnavailableError",
    "configure",
    "expires",
]
