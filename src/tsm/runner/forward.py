"""``tsm port-forward``'s local end: a loopback listener whose every connection is relayed into a replica.

The listener binds 127.0.0.1 only, so nothing off this machine can reach it; and, because any local user
can connect to a loopback port, each connection's peer is checked before a byte is relayed: the kernel's
socket table (``/proc/net/tcp``) names the user owning the connecting socket, and a connection from another
user is closed at once. Each accepted connection gets a fresh stream from the scheduler
(``ReplicaPorts.connect_replica_port``) and two copying threads; the listener runs until ``stop`` is set or
Ctrl-C (the threads never take SIGINT: see :func:`tsm.runner.logs.start_thread`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable

from tsm._logging import warn as _warn
from tsm.runner.logs import start_thread

#: Bytes moved per read in each direction.
CHUNK = 65536


def peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the other end of a loopback TCP connection ``conn``, from ``/proc/net/tcp``; None if unknown."""
    host, port = conn.getpeername()[:2]
    local_port = conn.getsockname()[1]
    want_local = f"{socket.htonl(int.from_bytes(socket.inet_aton(host), 'big')):08X}:{port:04X}"
    want_remote_port = f":{local_port:04X}"
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1] == want_local and fields[2].endswith(want_remote_port):
                    return int(fields[7])
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return None


def _pipe(src: socket.socket, dst: socket.socket, done: Callable[[], None]) -> None:
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        done()


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways between ``a`` and ``b`` on two threads; both are closed when both directions ended."""
    left = [2]
    lock = threading.Lock()

    def done() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            a.close()
            b.close()

    start_thread(_pipe, a, b, done)
    start_thread(_pipe, b, a, done)


def listen(local_port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``local_port`` (0: a free port)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind(("127.0.0.1", local_port))
    except OSError:
        srv.close()
        raise
    srv.listen(64)
    return srv


def serve(srv: socket.socket, connect: Callable[[], socket.socket], stop: threading.Event | None = None) -> None:
    """Accept on ``srv`` until ``stop`` is set (checked every half second) or Ctrl-C; relay each connection of
    this user to a new ``connect()`` stream. A stream that cannot be opened closes that connection with a warning."""
    srv.settimeout(0.5 if stop is not None else None)
    me = os.getuid()
    try:
        while stop is None or not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            if peer_uid(conn) != me:  # another local user: loopback is not private, this check is
                conn.close()
                continue
            try:
                remote = connect()
            except OSError as e:
                _warn("port-forward: could not reach the replica's port: %s", e)
                conn.close()
                continue
            remote.settimeout(None)
            relay(conn, remote)
    finally:
        srv.close()
