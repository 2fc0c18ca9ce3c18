"""Timers over a Unix stream socket whose server learns each client's pid from the kernel (SO_PEERCRED).

A request can only arm a timer for the process that sent it, so a client can never get another process
killed. The wire format, delivery and what hostile clients get: :mod:`tsm.timer._wire`; the client:
:mod:`tsm.timer._socket_client` (re-exported here).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal as _signal
import socket
import threading
import time
from types import TracebackType

from tsm.errors import TimerError

from ._core import MAX_EXPIRATION, Core, ServerExtras, Timer, poll_until
from ._fs import Ident, bind_socket, remove_if_ours
from ._proc import Guard, OnReap, Reaper
from ._socket_client import SocketTimerClient
from ._wire import (
    _ACCEPT_PAUSE,
    _DRAIN_MAX,
    _KINDS,
    _OUT_MAX,
    _PEERCRED,
    _READ,
    _REP,
    _REQ,
    ACK,
    ACQUIRE,
    FLAG_ACK,
    MAX_CONNS_PER_PID,
    MAX_SCOPE,
    REFUSED,
    REJECTED,
    RELEASE,
    WELCOME,
)
from .api import TimerRequest

__all__ = ["SocketTimerClient", "SocketTimerServer"]

logger = logging.getLogger("tsm.timer")


class _Conn:
    __slots__ = ("sock", "fd", "pid", "uid", "start", "buf", "out")

    def __init__(self, sock: socket.socket, pid: int, uid: int, start: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.pid = pid
        self.uid = uid
        self.start = start
        self.buf = b""
        self.out = b""


class SocketTimerServer(ServerExtras):
    """Reaps workers whose timers expire; workers reach it through a Unix socket at ``path``.

    The socket is created (mode 0600, in a directory only you or root can change; paths longer than
    ``sun_path`` work) by the constructor, so clients may connect before :meth:`start`.  :meth:`start` runs
    the loop in a thread (daemon unless ``daemon=False``); :meth:`stop` stops it and removes the socket.
    Starting a started server or stopping a stopped one does nothing; starting after ``stop()`` is a
    TimerError (the socket is gone: create a new server).

    Options: ``signal`` sent at expiry (default SIGKILL); ``term_grace`` seconds between a first SIGTERM
    and ``signal`` (None: no SIGTERM); ``kill_group`` signals the worker's process group (never the
    server's own); ``on_reap(pid, scope_id)`` is called in the server thread after a worker was reaped
    (keep it short; exceptions are logged).  ``max_interval`` is accepted for torch compatibility and unused:
    the loop sleeps exactly until the earliest deadline or the next request.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_interval: float = 60.0,
        daemon: bool = True,
        *,
        signal: int = _signal.SIGKILL,
        term_grace: float | None = None,
        kill_group: bool = False,
        on_reap: OnReap | None = None,
        backlog: int = 512,
    ) -> None:
        self.path = os.fspath(path)
        self._max_interval = max_interval
        self._daemon = daemon
        self._core = Core(Reaper(signal, term_grace, kill_group, on_reap, {}), Guard())
        self._core.stats.setdefault("connections", 0)
        self._lsock: socket.socket | None = None
        self._ident: Ident | None = None
        self._lsock, self._ident = bind_socket(self.path, backlog)
        self._lsock.setblocking(False)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ep = select.epoll()
        self._ep.register(self._lsock.fileno(), select.EPOLLIN)
        self._ep.register(self._wake_r, select.EPOLLIN)
        self._conns: dict[int, _Conn] = {}
        self._by_pid: dict[int, list[_Conn]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        self._accept_paused_until: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Run the server loop in a background thread."""
        if self._closed:
            raise TimerError("this SocketTimerServer was stopped; create a new one")
        if self._thread is not None and self._thread.is_alive():
            logger.info("SocketTimerServer on %s is already started", self.path)
            return
        self._stopping = False
        self._core.refresh_identity()
        self._thread = threading.Thread(target=self._loop, name="tsm-SocketTimerServer", daemon=self._daemon)
        self._thread.start()
        logger.info("SocketTimerServer listening on %s", self.path)

    def deliver_reaps(self) -> None:
        """Call ``on_reap`` now for every worker already signalled (after a reap in progress completes).

        The server thread signals a worker, then calls ``on_reap`` once it has let go of its lock; an owner
        that sees the worker die in between (SIGCHLD) calls this to learn at once whether a timer killed it.
        """
        with self._core.lock:
            pass  # a reap under way has signalled and queued its callback when the lock is free
        self._core.reaper.flush_callbacks()

    def stop(self) -> None:
        """Stop the loop, close every connection and remove the socket file (if it is still ours)."""
        self._stopping = True
        self._wake()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(10.0)
            if thread.is_alive():
                logger.warning("SocketTimerServer loop did not stop within 10 s")
        self._close_all()
        logger.info("SocketTimerServer on %s stopped", self.path)

    def __enter__(self) -> SocketTimerServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- torch-style table access -----------------------------------------------------------------------
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply requests from inside the server's process (pids checked as for any request)."""
        with self._core.lock:
            self._core.register_locked(timer_requests)
        self._wake()

    def clear_timers(self, worker_ids: set[int]) -> None:
        """Drop every timer of these pids."""
        with self._core.lock:
            self._core.clear_locked(worker_ids)

    def get_expired_timers(self, deadline: float) -> dict[int, list[TimerRequest]]:
        """Armed timers with ``expiration_time <= deadline``, by pid."""
        with self._core.lock:
            return self._core.expired_locked(deadline, _make_request)

    # -- loop ------------------------------------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # pipe full (a wake is pending anyway) or closed
            os.write(self._wake_w, b"!")

    def _loop(self) -> None:
        core = self._core
        lfd = self._lsock.fileno() if self._lsock is not None else -1
        wake_r = self._wake_r
        conns = self._conns
        while not self._stopping:
            try:
                with core.lock:
                    deadline = core.next_deadline_locked()
                paused = self._accept_paused_until
                if paused is not None:
                    if time.monotonic() >= paused:
                        self._resume_accepting()
                    else:
                        wait = paused - time.monotonic() + time.time()
                        deadline = wait if deadline is None else min(deadline, wait)
                events = poll_until(self._ep, None if deadline is None else deadline - time.time())
                with core.lock:
                    for fd, ev in events:
                        if fd == lfd:
                            self._accept_locked()
                        elif fd == wake_r:
                            try:
                                while os.read(wake_r, 4096):
                                    pass
                            except BlockingIOError:
                                pass
                        else:
                            conn = conns.get(fd)
                            if conn is None:
                                continue
                            if ev & select.EPOLLOUT:
                                self._flush_out(conn)
                            if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                                self._read_locked(conn, _READ)
                            core.flush_locked()
                            if core.heap and core.heap[0][0] <= time.time():
                                core.fire_locked(time.time(), self._drain_locked)
                    core.flush_locked()
                    core.fire_locked(time.time(), self._drain_locked)
                core.reaper.flush_callbacks()
            except Exception:
                core.log.log(logging.ERROR, "error in the SocketTimerServer loop", exc_info=True)
                time.sleep(0.01)  # never spin on a persistent error

    def _accept_locked(self) -> None:
        assert self._lsock is not None
        core = self._core
        while True:
            try:
                sock, _ = self._lsock.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors or memory: the pending connection stays queued and the listener stays
                    # readable, so stop watching it for a moment rather than spin on it.
                    core.log.log(logging.ERROR, "cannot accept timer clients for now: %s", e)
                    self._pause_accepting()
                return
            try:
                sock.setblocking(False)
                pid, uid, _gid = _PEERCRED.unpack(
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
                )
            except OSError:
                sock.close()
                continue
            verdict: int | str = core.guard.admit(pid, uid)
            if not isinstance(verdict, str) and len(self._by_pid.get(pid, ())) >= MAX_CONNS_PER_PID:
                verdict = f"pid {pid} already holds {MAX_CONNS_PER_PID} connections to the timer server"
            if isinstance(verdict, str):
                core.refuse(verdict, "<connection>")
                text = verdict.encode()
                with contextlib.suppress(OSError):
                    sock.send(_REP.pack(REJECTED, 0, len(text), 0) + text)
                sock.close()
                continue
            conn = _Conn(sock, pid, uid, verdict)
            self._conns[conn.fd] = conn
            self._by_pid.setdefault(pid, []).append(conn)
            core.stats["connections"] += 1
            self._ep.register(conn.fd, select.EPOLLIN)
            self._reply(conn, _REP.pack(WELCOME, 0, 0, pid))

    def _pause_accepting(self) -> None:
        if self._lsock is None or self._accept_paused_until is not None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._ep.modify(self._lsock.fileno(), 0)
        self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE

    def _resume_accepting(self) -> None:
        self._accept_paused_until = None
        if self._lsock is not None:
            with contextlib.suppress(OSError, ValueError):
                self._ep.modify(self._lsock.fileno(), select.EPOLLIN)

    def _read_locked(self, conn: _Conn, limit: int) -> None:
        total = 0
        while total < limit:
            try:
                data = conn.sock.recv(_READ)
            except BlockingIOError:
                return
            except OSError:
                self._close_conn(conn)
                return
            if not data:
                self._close_conn(conn)
                return
            got = len(data)
            total += got
            self._consume_locked(conn, data)
            if got < _READ or conn.fd not in self._conns:  # drained (epoll reports what comes next) or closed
                return

    def _consume_locked(self, conn: _Conn, data: bytes) -> None:
        """Apply every whole record in ``conn.buf + data`` (keeping an incomplete tail), in one pass with local
        names; a run of records naming one scope (acquire, release, ... of one worker) decodes it once."""
        buf = conn.buf + data if conn.buf else data
        n = len(buf)
        off = 0
        hdr = _REQ.size
        unpack = _REQ.unpack_from
        startswith = buf.startswith
        core = self._core
        timers = core.timers
        pop = timers.pop
        dirty = core.dirty
        push = dirty.append
        seqgen = core.seq
        pid = conn.pid
        start = conn.start
        acquired = released = 0
        replies: list[bytes] = []
        kraw = b"\0"  # the scope bytes of ``key`` (never matches: the length check below comes first)
        klen = -1
        key: tuple[int, str] = (pid, "")
        krel: bytes | None = None  # the release record of ``key`` (made when first needed)
        while n - off >= hdr:
            kind, flags, slen, seq, rpid, exp = unpack(buf, off)
            if slen > MAX_SCOPE or kind not in _KINDS:
                self._broken(conn, kind, slen)
                return
            first = off + hdr
            end = first + slen
            if end > n:
                break
            off = end
            if slen != klen or not startswith(kraw, first):
                kraw = buf[first:end]
                klen = slen
                key = (pid, kraw.decode("utf-8", "replace"))
                krel = None
            if kind == ACQUIRE and not (flags or rpid) and 0.0 <= exp <= MAX_EXPIRATION:
                # An acquire whose release follows in the same block (a short ``expires`` body): the pair leaves
                # the table as the release alone would, and nothing can fire in between (firing waits for the
                # whole block), so skip arming a timer only to drop it.
                if krel is None:
                    krel = _REQ.pack(RELEASE, 0, slen, 0, 0, -1.0) + kraw
                after = end + hdr + slen
                if after <= n and startswith(krel, end):
                    off = after
                    pop(key, None)
                    acquired += 1
                    released += 1
                    continue
                sq = next(seqgen)
                timers[key] = (exp, sq, start, 0)
                push((exp, sq, key))
                acquired += 1
                continue
            if rpid and rpid != pid:
                replies.append(self._refuse_other(rpid, pid, seq, key[1]))
                continue
            if kind == RELEASE or (kind == ACQUIRE and exp < 0):
                pop(key, None)
                released += 1
            elif kind == ACQUIRE:
                if not exp <= MAX_EXPIRATION:  # NaN, infinite or after year 9999
                    replies.append(self._refuse_expiration(exp, pid, seq, key[1]))
                    continue
                sq = next(seqgen)
                timers[key] = (exp, sq, start, 0)
                push((exp, sq, key))
                acquired += 1
            if flags & FLAG_ACK:
                replies.append(_REP.pack(ACK, 0, 0, seq))
        conn.buf = buf[off:] if off < n else b""
        stats = core.stats
        stats["requests"] += acquired + released
        stats["acquired"] += acquired
        stats["released"] += released
        if replies:
            self._reply(conn, b"".join(replies))

    def _refuse_other(self, rpid: int, pid: int, seq: int, scope: str) -> bytes:
        """Refuse a request of ``pid`` naming another process ``rpid``: a client arms timers for itself only."""
        if rpid > 1 and rpid != self._core.guard.own_pid:
            reason = f"pid {rpid} named by pid {pid}: a client may only arm timers for itself"
        else:
            reason = f"pid {rpid} may never be reaped (named by pid {pid})"
        return self._refuse(seq, scope, reason, reason)

    def _refuse_expiration(self, exp: float, pid: int, seq: int, scope: str) -> bytes:
        """Refuse an acquire whose deadline is NaN, infinite or after year 9999."""
        reason = f"expiration_time {exp!r} is not a time.time() deadline (finite, before year 10000)"
        return self._refuse(seq, scope, reason, f"{reason} (pid {pid})")

    def _refuse(self, seq: int, scope: str, reason: str, logged: str) -> bytes:
        """Count and log (as ``logged``) a refused request; the *refused* reply saying ``reason``."""
        self._core.refuse(logged, scope)
        text = reason.encode()
        return _REP.pack(REFUSED, 0, len(text), seq) + text

    def _broken(self, conn: _Conn, kind: int, slen: int) -> None:
        """Close the connection of a client whose record is of an unknown kind or has too long a scope."""
        self._core.log.log(logging.WARNING, "pid %d broke the timer protocol (record kind %d, scope of %d bytes); "
                           "closing its connection", conn.pid, kind, slen)  # fmt: skip
        self._core.stats["refused"] += 1
        self._close_conn(conn)

    def _drain_locked(self, pids: set[int]) -> None:
        """Read what the expiring workers already sent: a release written before the deadline wins."""
        for pid in pids:
            for conn in list(self._by_pid.get(pid, ())):
                self._read_locked(conn, _DRAIN_MAX)

    def _reply(self, conn: _Conn, data: bytes) -> None:
        if conn.out:
            conn.out += data
        else:
            conn.out = data
        self._flush_out(conn)

    def _flush_out(self, conn: _Conn) -> None:
        if conn.fd not in self._conns:
            return
        try:
            while conn.out:
                sent = conn.sock.send(conn.out, socket.MSG_NOSIGNAL)
                conn.out = conn.out[sent:]
        except BlockingIOError:
            if len(conn.out) > _OUT_MAX:
                logger.warning("pid %d does not read the server's replies; closing its connection", conn.pid)
                self._close_conn(conn)
                return
        except OSError:
            self._close_conn(conn)
            return
        self._ep.modify(conn.fd, select.EPOLLIN | (select.EPOLLOUT if conn.out else 0))

    def _close_conn(self, conn: _Conn) -> None:
        if self._conns.pop(conn.fd, None) is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._ep.unregister(conn.fd)
        same = self._by_pid.get(conn.pid)
        if same is not None:
            same[:] = [c for c in same if c is not conn]
            if not same:
                del self._by_pid[conn.pid]
        conn.sock.close()

    def _close_all(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._core.lock:
            for conn in list(self._conns.values()):
                self._close_conn(conn)
        if self._lsock is not None:
            self._lsock.close()
            self._lsock = None
        remove_if_ours(self.path, self._ident)
        self._ep.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and self._thread is None:
            with contextlib.suppress(Exception):
                self._close_all()


def _make_request(pid: int, scope_id: str, t: Timer) -> TimerRequest:
    return TimerRequest(pid, scope_id, t[0])

