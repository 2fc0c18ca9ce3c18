"""Talking to a local app's supervisor from any process: connecting, cancelling, and following its reports.

The supervisor serves a Unix socket (``APP_DIR/sock``, see :mod:`.supervisor`): a client is told of every
state change (``S``), log growth (``L``) and an end it could not record yet (``E``: the store refused it, a
full disk; it keeps trying), and may send ``cancel``. :func:`cancel` uses it and never waits
forever: a supervisor that does not end the app within its grace period plus :data:`CANCEL_MARGIN` seconds
(stopped with SIGSTOP, hung) is bypassed by :func:`force_cancel`. :class:`SupervisorEvents` is the event
source of a log follower (``tsm log -f``). Split from ``scheduler.py``, which keeps the scheduler's
interface and calls these.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from tsm.schedulers.local import _os
from tsm.specs.api import AppState

if TYPE_CHECKING:
    # imported where used: ``tsm status``/``tsm list`` import this module and never open a socket
    import socket

    from tsm.schedulers.api import DescribeAppResponse
    from tsm.store import Store


class LocalApps(Protocol):
    """What these functions ask of the local scheduler (:class:`~tsm.schedulers.local.scheduler.LocalScheduler`)."""

    @property
    def store(self) -> Store: ...

    def app_row(self, app_id: str) -> Any: ...

    def wait(self, app_id: str, timeout: float | None = ...) -> DescribeAppResponse | None: ...


#: terminal AppState values as stored, and as an SQL list
_TERMINAL = tuple(int(s) for s in AppState if s.is_terminal)
_TERMINAL_SQL = "(" + ", ".join(map(str, _TERMINAL)) + ")"

#: Seconds ``cancel`` waits past the grace period for the supervisor to end the app before it ends the
#: app's processes itself (a supervisor that is stopped with SIGSTOP, or hung).
CANCEL_MARGIN = 5.0

#: Seconds a connection to a supervisor may take before the caller treats it as not there for now.
CONNECT_TIMEOUT = 5.0


def ms(seconds: float) -> int:
    """A ``poll`` timeout in milliseconds, rounded up and kept inside what the kernel accepts."""
    return max(0, min(int(seconds * 1000) + 1, 2**31 - 1))


def connect(app_dir: str, timeout: float | None = CONNECT_TIMEOUT) -> socket.socket | None:
    """A connection to the app's supervisor, or None when it is not running or does not take the
    connection within ``timeout`` seconds (its backlog is full: a replica is flooding it). The
    socket returned is blocking."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    addr, dfd = _os.unix_address(os.path.join(app_dir, "sock"))
    try:
        sock.connect(addr)
        sock.settimeout(None)
        return sock
    except OSError:
        sock.close()
        return None
    finally:
        if dfd is not None:
            os.close(dfd)


def cancel(sched: LocalApps, app_id: str) -> None:
    """Ask the supervisor to stop the app and return once it has ended; nothing if it already has.

    Idempotent, and a no-op for an id this scheduler does not know (as TorchX's ``cancel``). Never
    waits forever: a supervisor that has not ended the app within its grace period plus
    :data:`CANCEL_MARGIN` seconds (stopped with SIGSTOP, hung) is bypassed, see :func:`force_cancel`.
    """
    row = sched.app_row(app_id)
    if row is None or row["state"] in _TERMINAL:
        return
    deadline = time.monotonic() + grace_of(row) + CANCEL_MARGIN
    sock = connect(row["app_dir"], timeout=CANCEL_MARGIN)
    while sock is None:
        if row["sup_pid"] is not None:
            # Its supervisor is on its way out (socket closed) or dead: wait() follows it, or its
            # watchdog, to the recorded end, so cancel never returns while the app still runs.
            wait_or_force(sched, app_id, deadline)
            return
        # No supervisor yet (still starting, or its launcher died before starting it): cancel in the
        # store. A supervisor registers only while the app is SUBMITTED, so one that starts later sees
        # the cancellation and launches nothing; if it registered first, connect to it instead.
        now = time.time()
        sched.store.write([
            (
                f"UPDATE local_replicas SET state={int(AppState.CANCELLED)}, ended=? WHERE app_id=? "
                f"AND state NOT IN {_TERMINAL_SQL} AND "
                "(SELECT sup_pid FROM local_apps WHERE app_id=?) IS NULL",
                (now, app_id, app_id),
            ),
            (
                f"UPDATE local_apps SET state={int(AppState.CANCELLED)}, ended=?, msg=? "
                f"WHERE app_id=? AND sup_pid IS NULL AND state NOT IN {_TERMINAL_SQL}",
                (now, "cancelled by user before its supervisor started", app_id),
            ),
        ])
        row = sched.app_row(app_id)
        if row["state"] in _TERMINAL:
            return
        sock = connect(row["app_dir"])
    unrecorded = False
    try:
        sock.sendall(b"cancel\n")
        # Stay connected until the supervisor exits (EOF): closing at once could race its
        # notifications and lose the request; waiting here also means cancel returns when it's done.
        while not unrecorded:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            data = sock.recv(65536)
            if not data:
                break
            unrecorded = b"E" in data
    except OSError:  # includes the timeout: _wait_or_force decides
        pass
    finally:
        sock.close()
    if unrecorded:  # every process of the app is gone; the supervisor holds its end until the store takes it
        from tsm._logging import warn

        warn("%s has stopped; its end is recorded once the store takes it again (%s is full or unwritable)",
             app_id, os.path.dirname(os.path.dirname(row["app_dir"])))
        return
    wait_or_force(sched, app_id, deadline)

def grace_of(row: Any) -> float:
    """How long a cancel may take: the app's grace period, plus ``warn_before`` when its replicas are warned
    first (see :mod:`.deadlines`); the default grace period when the request cannot be read."""
    from tsm.schedulers.local.request import MAX_GRACE_PERIOD  # only a cancel asks: kept out of `tsm status`

    try:
        with open(os.path.join(row["app_dir"], "request.json"), "rb") as f:
            req = json.load(f)
        grace = min(max(float(req["grace_period"]), 0.0), MAX_GRACE_PERIOD)
        lc = req.get("lifecycle") or {}
        if lc.get("warn_signal"):
            grace += min(max(float(lc.get("warn_before") or 0), 0.0), MAX_GRACE_PERIOD)
        return grace
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 10.0

def wait_or_force(sched: LocalApps, app_id: str, deadline: float) -> None:
    """Wait for the app's recorded end until ``deadline``, then end its processes directly."""
    desc = sched.wait(app_id, timeout=max(0.0, deadline - time.monotonic()))
    if desc is None or desc.state.is_terminal:
        return
    force_cancel(sched, app_id)

def force_cancel(sched: LocalApps, app_id: str) -> None:
    """SIGKILL the app's watchdog, supervisor and every process of the app, then record CANCELLED.

    For a supervisor that does not answer (SIGSTOPped, hung): the watchdog goes first so it records
    nothing, then the supervisor, then every process under them and every process started with this
    app's ``TSM_APP_ID`` (escaped ``setsid`` children that re-parented elsewhere).
    """
    row = sched.app_row(app_id)
    if row is None or row["state"] in _TERMINAL:
        return
    owners = [(row["watchdog_pid"], row["watchdog_start"]), (row["sup_pid"], row["sup_start"])]
    victims: list[int] = []
    for pid, started in owners:
        if pid and started is not None and _os.alive_for_sure(pid, started):
            victims += [pid, *_os.descendants(pid)]
    victims += _os.app_processes(app_id)
    order = list(dict.fromkeys(victims))
    for pid in order:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in order:
        _os.wait_exit(pid, None, 5.0)
    now = time.time()
    grace = grace_of(row)
    sched.store.write([
        (
            f"UPDATE local_replicas SET state={int(AppState.CANCELLED)}, ended=COALESCE(ended, ?) "
            f"WHERE app_id=? AND state NOT IN {_TERMINAL_SQL}",
            (now, app_id),
        ),
        (
            f"UPDATE local_apps SET state={int(AppState.CANCELLED)}, ended=?, msg=? "
            f"WHERE app_id=? AND state NOT IN {_TERMINAL_SQL}",
            (now, f"cancelled by user; the supervisor did not end the app within {grace + CANCEL_MARGIN:g}s "
                  f"(stopped or hung), so its {len(order)} process(es) were killed directly", app_id),
        ),
    ])


#: The longest a log follower's wait lasts without an event: it then returns "" (nothing happened), so the
#: follower calls its ``idle`` hook again. A consumer that went away (a closed dashboard stream) thus ends its
#: follower within this time even while the replica is silent, releasing the thread and this connection.
WAKE_SECONDS = 1.0


class SupervisorEvents:
    """The ``wait_event`` of a log follower: blocks for the app supervisor's next report on its socket.

    Connected at once, before the follower's first pass, so nothing that happens after that pass is
    missed. Returns what the supervisor reported (``S`` a state changed, ``L`` logs grew). Once the
    supervisor is gone it waits for the app's recorded end (its watchdog may still be writing it) and
    reports ``S``; while the supervisor is still starting (or alive but refusing connections) it retries
    the connection every 5 ms (50 ms), reporting ``S`` each time so the follower reads on meanwhile.
    With nothing reported for :data:`WAKE_SECONDS` it returns ``""``, so the follower's ``idle`` hook can
    stop a follower whose consumer is gone.
    """

    def __init__(self, sched: LocalApps, app_id: str, app_dir: str) -> None:
        self.sched, self.app_id, self.app_dir = sched, app_id, app_dir
        self.sock = connect(app_dir)

    def __call__(self) -> str:
        if self.sock is None:
            row = self.sched.app_row(self.app_id)
            if row is None or row["state"] in _TERMINAL:
                return "S"
            try:
                up = row["sup_pid"] is None or _os.is_alive(row["sup_pid"], row["sup_start"])
            except OSError:  # cannot tell (our fd table is full): it may well be alive
                up = True
            if up:
                # starting (its socket is moments away), or alive but not taking us now: try again shortly
                time.sleep(0.005 if row["sup_pid"] is None else 0.05)
                self.sock = connect(self.app_dir)
                return "S"
            self.sched.wait(self.app_id)
            return "S"
        try:
            if not select.select([self.sock], [], [], WAKE_SECONDS)[0]:
                return ""  # nothing happened: the follower calls idle() and waits again
            data = self.sock.recv(65536)
        except OSError:
            data = b""
        if not data:  # the supervisor exited: its last state is in the store, or its watchdog's soon
            self.close()
            self.sched.wait(self.app_id)
            return "S"
        return data.decode("ascii", "replace")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def closing(events: Iterator[Any], waiter: SupervisorEvents) -> Iterator[Any]:
    """``events``, then the follower's connection closed (also when the consumer stops early)."""
    try:
        yield from events
    finally:
        close = getattr(events, "close", None)  # a Lines (text_only) is walked in C: close it as yield from would
        if close is not None:
            close()
        waiter.close()
