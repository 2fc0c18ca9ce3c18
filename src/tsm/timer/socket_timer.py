"""Timers over a Unix stream socket whose server learns each client's pid from the kernel (SO_PEERCRED).

A request can only arm a timer for the process that sent it, so a client can never get another process
killed.  The protocol is binary and small:

* client -> server, one record per call: ``<BBHIid`` = kind (1 acquire, 2 release, 3 ping), flags (1 = reply
  with an ack), scope length, sequence number, pid (0 = "the sender", anything else must equal the kernel's
  pid for the connection), expiration (``time.time()`` seconds; negative = release); then the UTF-8 scope.
* server -> client: ``<BBHI`` = kind (1 welcome, 2 ack, 3 refused, 4 connection rejected), 0, text length,
  value (welcome: the client's pid as the server sees it; ack/refused: the sequence number); then the text.

Delivery: on connect the server checks the peer (pid > 1, not the server, not its ancestor, same user, at
most :data:`MAX_CONNS_PER_PID` connections) and answers *welcome* or *rejected*; the client waits for that
answer, so a refused process gets a TimerError at its first ``acquire``.  After that, ``acquire``/``release`` are fire-and-forget writes on a blocking socket
(back-pressure, never a drop) that cannot be refused, because they name no pid.  Requests that do name a pid
(:meth:`SocketTimerClient.send_request`) and every request of a client made with ``ack=True`` wait for the
server's answer; a refusal raises TimerError.  :meth:`SocketTimerClient.sync` waits until the server has
processed everything sent before it.

Throughput (issue 19): every call is still one write, so that a worker that hangs right after ``acquire`` has
its timer armed, and a release is on the socket (where the server's drain before a reap finds it) as soon as
``release`` returns; batching writes in the client would trade that away.  What is cheap instead: the client
keeps a ready-made record per recent scope (one struct call per acquire, none per release), and the server
parses all whole records of a read in one pass with local names, decodes a scope once for a run of records
naming it, and skips arming a timer whose exact release record follows it in the same read (the table ends
the same, and nothing fires in the middle of a read).

Hostile or broken clients: an acquire whose deadline is NaN, infinite or after year 9999 is answered
*refused* (the client's next ``sync``/ack raises TimerError; :class:`SocketTimerClient` refuses such values
itself with :class:`~tsm.timer.InvalidTimerRequestError` before sending); a record of an unknown kind or with
a scope longer than :data:`MAX_SCOPE` closes that client's connection.  Refusals are counted in ``stats`` and
logged at a limited rate, and no request, however malformed, stops the server from serving the others or
from reaping on time.  When the process runs out of file descriptors, the server stops accepting for a
moment instead of spinning.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import select
import signal as _signal
import socket
import struct
import threading
import time
import weakref
from types import TracebackType

from tsm.errors import TimerError

from ._core import MAX_EXPIRATION, Core, ServerExtras, Timer, check_expiration, poll_until
from ._errors import InvalidTimerRequestError, TimerServerUnavailableError
from ._fs import Ident, bind_socket, connect_socket, remove_if_ours
from ._proc import Guard, OnReap, Reaper
from .api import TimerClient, TimerRequest

__all__ = ["SocketTimerClient", "SocketTimerServer"]

logger = logging.getLogger("tsm.timer")

_REQ = struct.Struct("<BBHIid")
_REP = struct.Struct("<BBHI")
_PEERCRED = struct.Struct("3i")
ACQUIRE, RELEASE, PING = 1, 2, 3
_KINDS = frozenset((ACQUIRE, RELEASE, PING))
FLAG_ACK = 1
WELCOME, ACK, REFUSED, REJECTED = 1, 2, 3, 4
MAX_SCOPE = 4096  # bytes of UTF-8; keeps every record small
#: Connections one process may hold open at once; more are rejected (each costs the server a descriptor).
MAX_CONNS_PER_PID = 64
_ACCEPT_PAUSE = 0.1  # seconds without accepting after the process ran out of descriptors
_READ = 1 << 16
_DRAIN_MAX = 1 << 22
_OUT_MAX = 1 << 20
_NOSIGNAL = socket.MSG_NOSIGNAL
_HEAD = 12  # bytes of a request record before its expiration
_FRAMES_MAX = 256  # scopes a client keeps ready-made records for
_Frame = tuple[struct.Struct, bytes, bytes, bytes]

_clients: weakref.WeakSet[SocketTimerClient] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class SocketTimerClient(TimerClient):
    """Client of :class:`SocketTimerServer`; one connection per process, made on first use.

    ``ack=True`` makes every acquire/release wait until the server processed it (slower, one round trip);
    by default they return once written.  A child created by ``fork`` opens its own connection, so its
    timers are its own.  ``connect_timeout`` bounds how long the first call waits for the server to appear.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, ack: bool = False, connect_timeout: float = 10.0
    ) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self._ack = ack
        self._connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._seq = 0
        self._rbuf = b""
        self._refusals: list[str] = []
        #: Fire-and-forget records of recently used scopes (none when ``ack``): the acquire's struct, its
        #: first 12 bytes, the UTF-8 scope, and the whole release record.  They name no pid, so they stay
        #: valid in a forked child.
        self._frames: dict[str, _Frame] = {}
        #: This process's pid as the server sees it (differs from os.getpid() across pid namespaces).
        self.server_view_pid: int | None = None
        _clients.add(self)

    # -- TimerClient ------------------------------------------------------------------------------------
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm ``scope_id`` for this process until ``expiration_time``; TimerError if the server refuses us.

        InvalidTimerRequestError (a ValueError) at once, with nothing sent, for a deadline that is not a
        number, NaN, infinite or after year 9999; a negative one releases, as in torch.
        """
        # A fire-and-forget client sends a ready-made record per scope (made on the scope's first use, then
        # packed by one struct call); the checks are those of check_expiration, in their cheapest form.
        frame = self._frames.get(scope_id) if type(scope_id) is str else None
        if frame is None or not (type(expiration_time) is float and 0.0 <= expiration_time <= MAX_EXPIRATION):
            exp = check_expiration(expiration_time)
            if exp < 0 or self._ack or type(scope_id) is not str:
                self._send(ACQUIRE if exp >= 0 else RELEASE, scope_id, exp, 0, self._ack)
                return
            frame = frame or self._frame(scope_id)
            expiration_time = exp
        data = frame[0].pack(frame[1], expiration_time, frame[2])
        with self._lock:  # _write, inlined: this is the hot path of every ``expires`` block
            sock = self._sock
            if sock is not None:
                try:
                    sent = sock.send(data, _NOSIGNAL)  # all of it (blocking socket): sendall's loop is slower
                    if sent < len(data):
                        sock.sendall(data[sent:], _NOSIGNAL)
                except OSError as e:
                    raise self._lost_locked(e) from e
                return
        self._write(data)

    def release(self, scope_id: str) -> None:
        """Release ``scope_id`` of this process (unknown scopes are ignored by the server)."""
        frame = self._frames.get(scope_id) if type(scope_id) is str else None
        if frame is None:
            if self._ack or type(scope_id) is not str:
                self._send(RELEASE, scope_id, -1.0, 0, self._ack)
                return
            frame = self._frame(scope_id)
        with self._lock:
            sock = self._sock
            if sock is not None:
                data = frame[3]
                try:
                    sent = sock.send(data, _NOSIGNAL)
                    if sent < len(data):
                        sock.sendall(data[sent:], _NOSIGNAL)
                except OSError as e:
                    raise self._lost_locked(e) from e
                return
        self._write(frame[3])

    # -- tsm additions ----------------------------------------------------------------------------------
    def send_request(self, request: TimerRequest) -> None:
        """Send one request naming ``request.worker_id`` (None = this process) and wait for the answer.

        The server refuses any pid other than the sender's own (and pid 1, its own pid, ...): TimerError.
        """
        wid = request.worker_id
        if wid is not None and (type(wid) is not int or not -(2**31) <= wid < 2**31):
            raise InvalidTimerRequestError(f"worker_id {wid!r} is not a pid")
        exp = check_expiration(request.expiration_time)
        self._send(RELEASE if exp < 0 else ACQUIRE, request.scope_id, exp, wid or 0, True)

    def sync(self) -> None:
        """Return once the server has processed every request this client sent before; TimerError on refusals."""
        self._send(PING, "", 0.0, 0, True)

    def close(self) -> None:
        """Close the connection (timers stay armed on the server, as with every client)."""
        with self._lock:
            self._drop_locked()

    def __enter__(self) -> SocketTimerClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------------------
    def _send(self, kind: int, scope_id: str, exp: float, pid: int, wait: bool) -> None:
        if not isinstance(scope_id, str):
            raise InvalidTimerRequestError(f"scope_id {scope_id!r} is not a string")
        raw = scope_id.encode(errors="surrogatepass")
        if len(raw) > MAX_SCOPE:
            raise InvalidTimerRequestError(f"scope_id is {len(raw)} bytes; the limit is {MAX_SCOPE}")
        with self._lock:
            sock = self._sock if self._sock is not None else self._connect_locked()
            if wait:
                self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
                data = _REQ.pack(kind, FLAG_ACK, len(raw), seq, pid, exp) + raw
            else:
                seq = 0
                data = _REQ.pack(kind, 0, len(raw), 0, pid, exp) + raw
            try:
                sock.sendall(data, socket.MSG_NOSIGNAL)
            except OSError as e:
                raise self._lost_locked(e) from e
            if wait:
                self._wait_locked(sock, seq, scope_id)

    def _frame(self, scope_id: str) -> _Frame:
        """The ready-made records of ``scope_id`` (InvalidTimerRequestError for a scope over MAX_SCOPE bytes)."""
        raw = scope_id.encode(errors="surrogatepass")
        if len(raw) > MAX_SCOPE:
            raise InvalidTimerRequestError(f"scope_id is {len(raw)} bytes; the limit is {MAX_SCOPE}")
        frames = self._frames
        if len(frames) >= _FRAMES_MAX:  # many distinct scopes (``expires`` without scope): start over
            frames.clear()
        packer, head = _acquire_packer(len(raw))
        frame = frames[scope_id] = (packer, head, raw, _REQ.pack(RELEASE, 0, len(raw), 0, 0, -1.0) + raw)
        return frame

    def _write(self, data: bytes) -> None:
        """Write one fire-and-forget record (connecting first if needed)."""
        with self._lock:
            sock = self._sock if self._sock is not None else self._connect_locked()
            try:
                sock.sendall(data, socket.MSG_NOSIGNAL)
            except OSError as e:
                raise self._lost_locked(e) from e

    def _lost_locked(self, e: OSError) -> TimerServerUnavailableError:
        """Forget the broken connection (the next call reconnects); the error to raise for the lost write."""
        self._drop_locked()
        return TimerServerUnavailableError(f"timer server at {self.path} is gone ({e}); request not delivered")

    def _connect_locked(self) -> socket.socket:
        deadline = time.monotonic() + self._connect_timeout
        while True:
            try:
                sock = connect_socket(self.path, self._connect_timeout)
                break
            except (FileNotFoundError, ConnectionRefusedError) as e:
                if time.monotonic() >= deadline:
                    raise TimerServerUnavailableError(
                        f"no timer server at {self.path} ({e.strerror}); is it started?"
                    ) from e
                time.sleep(0.02)
            except OSError as e:
                raise TimerServerUnavailableError(f"cannot connect to the timer server at {self.path}: {e}") from e
        try:
            kind, value, text = self._read_reply(sock)
        except (OSError, TimerError) as e:
            sock.close()
            raise TimerServerUnavailableError(f"timer server at {self.path} did not greet us: {e}") from e
        if kind != WELCOME:
            sock.close()
            raise TimerError(f"timer server at {self.path} refused this process: {text}")
        sock.settimeout(None)
        self.server_view_pid = value
        self._sock = sock
        return sock

    def _read_reply(self, sock: socket.socket) -> tuple[int, int, str]:
        while True:
            if len(self._rbuf) >= _REP.size:
                kind, _, n, value = _REP.unpack_from(self._rbuf)
                if len(self._rbuf) >= _REP.size + n:
                    text = self._rbuf[_REP.size : _REP.size + n].decode(errors="replace")
                    self._rbuf = self._rbuf[_REP.size + n :]
                    return kind, value, text
            chunk = sock.recv(4096)
            if not chunk:
                raise TimerError(f"timer server at {self.path} closed the connection")
            self._rbuf += chunk

    def _wait_locked(self, sock: socket.socket, seq: int, scope_id: str) -> None:
        while True:
            try:
                kind, value, text = self._read_reply(sock)
            except (OSError, TimerError) as e:
                self._drop_locked()
                raise TimerServerUnavailableError(
                    f"timer server at {self.path} is gone ({e}); no answer received"
                ) from e
            if kind == REFUSED:
                if value == seq:
                    raise TimerError(f"timer {scope_id!r} refused by the server: {text}")
                self._refusals.append(text)
            elif kind == ACK and value == seq:
                break
        if self._refusals:
            reasons, self._refusals = self._refusals, []
            raise TimerError(f"timer server refused {len(reasons)} earlier request(s): {reasons[0]}")

    def _drop_locked(self) -> None:
        sock, self._sock = self._sock, None
        self._rbuf = b""
        if sock is not None:
            sock.close()

    def _forget_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._rbuf = b""
        sock, self._sock = self._sock, None
        self.server_view_pid = None
        if sock is not None:
            sock.close()


@functools.lru_cache(maxsize=64)
def _acquire_packer(size: int) -> tuple[struct.Struct, bytes]:
    """A struct packing a whole fire-and-forget acquire of a ``size``-byte scope, and its fixed first bytes."""
    return struct.Struct(f"<{_HEAD}sd{size}s"), _REQ.pack(ACQUIRE, 0, size, 0, 0, 0.0)[:_HEAD]


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
        """Apply every whole record in ``conn.buf + data``; keep the incomplete tail for the next read.

        One pass over the block with local names only.  The scope of a record is decoded once for a run of
        records naming the same scope (the usual acquire, release, acquire, ... of one worker): comparing
        its bytes in place costs less than cutting and decoding them again, and the key tuple is reused.
        """
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
                core.log.log(
                    logging.WARNING,
                    "pid %d broke the timer protocol (record kind %d, scope of %d bytes); closing its connection",
                    pid,
                    kind,
                    slen,
                )
                core.stats["refused"] += 1
                self._close_conn(conn)
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
                reason = (
                    f"pid {rpid} named by pid {pid}: a client may only arm timers for itself"
                    if rpid > 1 and rpid != core.guard.own_pid
                    else f"pid {rpid} may never be reaped (named by pid {pid})"
                )
                core.refuse(reason, key[1])
                text = reason.encode()
                replies.append(_REP.pack(REFUSED, 0, len(text), seq) + text)
                continue
            if kind == RELEASE or (kind == ACQUIRE and exp < 0):
                pop(key, None)
                released += 1
            elif kind == ACQUIRE:
                if not exp <= MAX_EXPIRATION:  # NaN, infinite or after year 9999
                    reason = f"expiration_time {exp!r} is not a time.time() deadline (finite, before year 10000)"
                    core.refuse(f"{reason} (pid {pid})", key[1])
                    text = reason.encode()
                    replies.append(_REP.pack(REFUSED, 0, len(text), seq) + text)
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
