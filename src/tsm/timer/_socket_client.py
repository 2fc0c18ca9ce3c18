"""The client of the socket timer server: one connection per process, one write per call
(the protocol: :mod:`tsm.timer._wire`)."""

from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from types import TracebackType

from tsm.errors import TimerError

from ._core import MAX_EXPIRATION, check_expiration
from ._errors import InvalidTimerRequestError, TimerServerUnavailableError
from ._fs import connect_socket
from ._wire import (
    _FRAMES_MAX,
    _NOSIGNAL,
    _REP,
    _REQ,
    ACK,
    ACQUIRE,
    FLAG_ACK,
    MAX_SCOPE,
    PING,
    REFUSED,
    RELEASE,
    WELCOME,
    _acquire_packer,
    _Frame,
)
from .api import TimerClient, TimerRequest

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
