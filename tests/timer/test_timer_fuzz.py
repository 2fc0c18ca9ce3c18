"""Hostile and broken clients against every timer server (issue 11, item 5).

A timer with an absurd deadline (``inf``, ``1e308``) used to be armed and then make the socket server loop
on OverflowError, writing ~430 KB/s to the supervisor's log and never reaping again.  Here every server is
fed truncated, oversized, garbage and wrongly typed requests and absurd numbers, from many clients at once;
afterwards it must still reap an ordinary worker on time, and what it logged must stay small.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import random
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tsm.timer as timer
from testutil import spawn, wait_until
from tsm.errors import TimerError
from tsm.timer import _wire as proto
from tsm.timer._core import MAX_EXPIRATION

CTX = mp.get_context("fork")
WAIT = 30.0
#: Every refusal is counted, but the log gets a burst and then a line per 10 s: thousands of bad requests
#: must not write more than this (the old server wrote ~430 KB per second).
LOG_BUDGET = 32 * 1024
#: Deadlines a server must refuse, and one that means "release" (negative, as in torch).
ABSURD = [math.inf, math.nan, 1e308, 3e11, 1.7976931348623157e308, -math.inf]
FAR = 4e9  # a valid deadline (year 2096) for requests whose other fields are under test
NO_PID = 2**22 + 17  # above the kernel's largest pid: never a process


class LogBytes(logging.Handler):
    """Counts what the ``tsm.timer`` logger writes at WARNING and above (what the supervisor's log gets)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.bytes = 0
        self.records = 0
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.bytes += len(self.format(record)) + 1
        self.records += 1


@pytest.fixture
def log_bytes() -> Iterator[LogBytes]:
    handler = LogBytes()
    lg = logging.getLogger("tsm.timer")
    lg.addHandler(handler)
    try:
        yield handler
    finally:
        lg.removeHandler(handler)


# -- an ordinary worker, reaped on time after the abuse -----------------------------------------------------
def hang_socket(path: str, after: float) -> None:
    with timer.expires(after=after, client=timer.SocketTimerClient(path)):
        time.sleep(60)


def hang_fifo(path: str, after: float) -> None:
    with timer.expires(after=after, client=timer.FileTimerClient(path)):
        time.sleep(60)


def hang_queue(q: Any, after: float) -> None:
    with timer.expires(after=after, client=timer.LocalTimerClient(q)):
        time.sleep(60)


def assert_reaps(target: Any, *args: Any) -> None:
    """The issue's check: a later 0.5 s timer is reaped (the worker dies of SIGKILL)."""
    p = spawn(target, *args, 0.5)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL, "the server stopped reaping after the bad requests"


# -- raw socket protocol ---------------------------------------------------------------------------------
def raw_connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(WAIT)
    kind, _, n, _pid = proto._REP.unpack(_recv_exact(s, proto._REP.size))
    _recv_exact(s, n)
    assert kind == proto.WELCOME
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def record(kind: int, exp: float, scope: bytes = b"s", seq: int = 0, flags: int = 0, pid: int = 0) -> bytes:
    return proto._REQ.pack(kind, flags, len(scope), seq, pid, exp) + scope


def read_reply(s: socket.socket) -> tuple[int, int, str]:
    kind, _, n, value = proto._REP.unpack(_recv_exact(s, proto._REP.size))
    return kind, value, _recv_exact(s, n).decode()


@pytest.fixture
def sock_server(tmp_path: Path) -> Iterator[timer.SocketTimerServer]:
    srv = timer.SocketTimerServer(str(tmp_path / "t.sock"))
    srv.start()
    yield srv
    srv.stop()


def absurd_client(path: str, conn: Any) -> None:
    """Arms absurd deadlines over the raw protocol (as a client without tsm's checks would) and reports
    the server's answers."""
    s = raw_connect(path)
    answers = []
    for i, exp in enumerate(ABSURD):
        s.sendall(record(proto.ACQUIRE, exp, f"absurd{i}".encode(), seq=i + 1, flags=proto.FLAG_ACK))
        answers.append(read_reply(s)[:2])
    conn.send(answers)
    time.sleep(60)


def test_absurd_deadlines_are_refused_and_reaping_goes_on(
    sock_server: timer.SocketTimerServer, log_bytes: LogBytes
) -> None:
    path = sock_server.path
    here, there = CTX.Pipe()
    p = spawn(absurd_client, path, there)
    assert here.poll(WAIT), "the server did not answer (it used to loop on OverflowError here)"
    answers = here.recv()
    assert answers == [(proto.REFUSED, i) for i in range(1, 6)] + [(proto.ACK, 6)]
    assert sock_server.get_expired_timers(float("inf")) == {}
    assert_reaps(hang_socket, path)  # the check: a later 0.5 s timer is still reaped
    assert p.is_alive()
    assert sock_server.stats["refused"] == 5
    assert log_bytes.bytes < LOG_BUDGET
    p.kill()
    p.join()


def test_client_refuses_absurd_deadlines_before_sending(sock_server: timer.SocketTimerServer) -> None:
    here, there = CTX.Pipe()

    def worker(conn: Any) -> None:
        client = timer.SocketTimerClient(sock_server.path)
        out = []
        for exp in (math.inf, math.nan, 1e308, "soon", None):
            try:
                client.acquire("x", exp)  # type: ignore[arg-type]
                out.append("sent")
            except timer.InvalidTimerRequestError as e:
                out.append("ValueError" if isinstance(e, ValueError) else "?")
        try:
            with timer.expires(after=math.inf, client=client):
                out.append("entered")
        except TimerError:
            out.append("expires refused")
        client.sync()
        conn.send(out)

    p = spawn(worker, there)
    assert here.recv() == ["ValueError"] * 5 + ["expires refused"]
    p.join(WAIT)
    assert sock_server.stats["requests"] == 0 and sock_server.stats["refused"] == 0


GARBAGE: list[bytes] = [
    b"",  # connect and leave
    b"\x01",  # truncated header
    record(proto.ACQUIRE, FAR)[:-3],  # truncated scope
    proto._REQ.pack(proto.ACQUIRE, 0, 65535, 0, 0, FAR),  # scope length beyond MAX_SCOPE
    proto._REQ.pack(proto.ACQUIRE, 0, proto.MAX_SCOPE, 0, 0, FAR) + b"x" * 100,  # promised, never sent
    record(99, FAR),  # unknown kind
    record(0, FAR),
    record(proto.ACQUIRE, FAR, b"\xff\xfe\x00bad utf-8"),
    record(proto.ACQUIRE, FAR, pid=1, flags=proto.FLAG_ACK, seq=7),  # naming pid 1
    record(proto.ACQUIRE, FAR, pid=-(2**31), flags=proto.FLAG_ACK, seq=8),
    *(record(proto.ACQUIRE, exp, b"absurd", flags=proto.FLAG_ACK) for exp in ABSURD),
    record(proto.RELEASE, math.nan, b"never-armed"),
    record(proto.PING, math.inf, flags=0xFF, seq=2**32 - 1),
    bytes(range(256)) * 40,  # noise
    b"\x00" * 100_000,  # kind 0 records: closed at the first one
]


def garbage_client(path: str, payloads: list[bytes], rounds: int) -> None:
    for _ in range(rounds):
        for payload in payloads:
            try:
                s = raw_connect(path)
            except OSError:
                continue
            try:
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(2.0)
                while s.recv(65536):  # read whatever the server answers until it closes or we time out
                    pass
            except OSError:
                pass
            finally:
                s.close()


def test_many_concurrent_garbage_clients(sock_server: timer.SocketTimerServer, log_bytes: LogBytes) -> None:
    path = sock_server.path
    rng = random.Random(11)
    payloads = [*GARBAGE, *(rng.randbytes(rng.randrange(1, 3000)) for _ in range(30))]
    procs = [spawn(garbage_client, path, payloads, 3) for _ in range(12)]
    for p in procs:
        p.join(WAIT * 4)
        # random bytes may well hold an acquire with a deadline in the past: then the client was reaped,
        # which is what it asked for
        assert p.exitcode in (0, -signal.SIGKILL)
    assert_reaps(hang_socket, path)
    assert sock_server.stats["refused"] > 12  # refusals are all counted ...
    assert log_bytes.bytes < LOG_BUDGET  # ... but not all logged


def connection_hog(path: str, conn: Any) -> None:
    socks = []
    rejected = 0
    for _ in range(proto.MAX_CONNS_PER_PID + 10):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        kind, _, n, _ = proto._REP.unpack(_recv_exact(s, proto._REP.size))
        _recv_exact(s, n)
        if kind == proto.WELCOME:
            socks.append(s)
        else:
            rejected += 1
            s.close()
    conn.send((len(socks), rejected))
    time.sleep(60)


def test_one_process_cannot_hold_unbounded_connections(sock_server: timer.SocketTimerServer) -> None:
    here, there = CTX.Pipe()
    p = spawn(connection_hog, sock_server.path, there)
    assert here.recv() == (proto.MAX_CONNS_PER_PID, 10)
    assert_reaps(hang_socket, sock_server.path)  # others are still served
    p.kill()
    p.join()


def send_chunks(path: str, chunks: list[bytes]) -> None:
    try:
        bad = raw_connect(path)
        for chunk in chunks:
            bad.sendall(chunk)
        bad.close()
    except OSError:
        pass  # the server closed the connection on a protocol error


def good_client(path: str, conn: Any) -> None:
    """Answers each request of the test with the server's reply to a ping on a fresh connection."""
    while conn.recv():
        s = raw_connect(path)
        s.sendall(record(proto.PING, 0.0, b"", seq=5, flags=proto.FLAG_ACK))
        conn.send(read_reply(s)[:2])
        s.close()


@pytest.fixture
def good(sock_server: timer.SocketTimerServer) -> Iterator[Any]:
    here, there = CTX.Pipe()
    p = spawn(good_client, sock_server.path, there)
    yield here
    here.send(False)
    p.join(WAIT)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=200),
            st.builds(
                lambda k, f, seq, pid, exp, scope: proto._REQ.pack(k, f, len(scope), seq, pid, exp) + scope,
                st.integers(0, 255),
                st.integers(0, 255),
                st.integers(0, 2**32 - 1),
                st.integers(-(2**31), 2**31 - 1),
                st.floats(allow_nan=True, allow_infinity=True),
                st.binary(max_size=64),
            ),
        ),
        max_size=8,
    )
)
def test_any_bytes_leave_the_server_serving(
    sock_server: timer.SocketTimerServer, good: Any, chunks: list[bytes]
) -> None:
    """Whatever a client sends, the server answers the next well-behaved client at once."""
    p = spawn(send_chunks, sock_server.path, chunks)
    p.join(WAIT)
    assert p.exitcode in (0, -signal.SIGKILL)  # killed: it armed a deadline in the past
    good.send(True)
    assert good.recv() == (proto.ACK, 5)
    with sock_server._core.lock:
        assert all(0 <= t[0] <= MAX_EXPIRATION for t in sock_server._core.timers.values())


# -- the batch parser against a model (issue 19: many records per read, acquire+release pairs skipped) ----------
SCOPES = [b"a", b"b", b"", b"\xff\xfe", "\u00e9t\u00e9".encode(), b"a" * 300]
#: Valid far deadlines, releases (negative) and absurd values the server must refuse.
EXPIRATIONS = [FAR, FAR + 1.5, 5e9, MAX_EXPIRATION, -1.0, -math.inf, math.inf, math.nan, 1e308]


def batch_client(path: str, blob: bytes, cuts: list[int], conn: Any) -> None:
    """Sends ``blob`` cut at ``cuts`` (each piece may reach the server in a read of its own), then a ping,
    and reports its pid and every reply up to the ping's ack; stays alive until told to go."""
    s = raw_connect(path)
    last = 0
    for cut in [*sorted(cuts), len(blob)]:
        s.sendall(blob[last:cut])
        last = cut
    s.sendall(record(proto.PING, 0.0, b"", seq=2**32 - 1, flags=proto.FLAG_ACK))
    replies = []
    while True:
        kind, value, _text = read_reply(s)
        if kind == proto.ACK and value == 2**32 - 1:
            break
        replies.append((kind, value))
    conn.send((os.getpid(), replies))
    conn.recv()


def model(records: list[tuple[int, int, int, bool, float]], pid: int) -> tuple[dict[str, float], list[Any]]:
    """What the server must hold and answer after ``records`` (kind, scope index, seq, names another pid,
    expiration), applied one by one as the protocol defines them."""
    table: dict[str, float] = {}
    replies: list[tuple[int, int]] = []
    for kind, si, seq, other, exp in records:
        scope = SCOPES[si].decode("utf-8", "replace")
        if other:
            replies.append((proto.REFUSED, seq))
            continue
        if kind == proto.RELEASE or (kind == proto.ACQUIRE and exp < 0):
            table.pop(scope, None)
        elif kind == proto.ACQUIRE and not exp <= MAX_EXPIRATION:
            replies.append((proto.REFUSED, seq))
            continue
        elif kind == proto.ACQUIRE:
            table[scope] = exp
        if seq:
            replies.append((proto.ACK, seq))
    return table, replies


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([proto.ACQUIRE, proto.ACQUIRE, proto.RELEASE, proto.PING]),
            st.integers(0, len(SCOPES) - 1),
            st.sampled_from([0, 0, 0, 7]),  # 7: ask for an ack
            st.sampled_from([False, False, False, True]),  # True: name pid 1, which is always refused
            st.sampled_from(EXPIRATIONS),
        ),
        max_size=40,
    ),
    st.lists(st.integers(0, 10_000), max_size=6),
)
def test_batched_records_match_the_model(
    sock_server: timer.SocketTimerServer, records: list[tuple[int, int, int, bool, float]], cuts: list[int]
) -> None:
    """However records are grouped into reads, the table and the answers are those of one-by-one processing
    (in particular an acquire directly followed by its release, which the server skips as a pair)."""
    check_against_model(sock_server, records, cuts)


def check_against_model(
    sock_server: timer.SocketTimerServer, records: list[tuple[int, int, int, bool, float]], cuts: list[int]
) -> None:
    blob = b"".join(
        record(kind, exp, SCOPES[si], seq=seq, flags=proto.FLAG_ACK if seq else 0, pid=1 if other else 0)
        for kind, si, seq, other, exp in records
    )
    before = dict(sock_server.stats)
    here, there = CTX.Pipe()
    p = spawn(batch_client, sock_server.path, blob, [c % (len(blob) + 1) for c in cuts], there)
    assert here.poll(WAIT)
    pid, replies = here.recv()
    table, expected_replies = model(records, pid)
    try:
        held = sock_server.get_expired_timers(math.inf).get(pid, [])
        assert {r.scope_id: r.expiration_time for r in held} == table
        assert replies == expected_replies
        refused = sum(1 for kind, _v in expected_replies if kind == proto.REFUSED)
        assert sock_server.stats["refused"] - before["refused"] == refused
        applied = sum(1 for kind, *_ in records if kind != proto.PING) - sum(
            1 for kind, _si, _seq, other, exp in records if kind != proto.PING and (other or (
                kind == proto.ACQUIRE and not exp <= MAX_EXPIRATION))
        )
        assert sock_server.stats["requests"] - before["requests"] == applied
    finally:
        sock_server.clear_timers({pid})
        here.send("go")
        p.join(WAIT)


A, R, P = proto.ACQUIRE, proto.RELEASE, proto.PING
PAIR_CASES = {
    "pair": [(A, 0, 0, False, FAR), (R, 0, 0, False, -1.0)],
    "pair then acquire": [(A, 0, 0, False, FAR), (R, 0, 0, False, -1.0), (A, 0, 0, False, 5e9)],
    "armed, then a pair": [(A, 0, 0, False, 5e9), (A, 0, 0, False, FAR), (R, 0, 0, False, -1.0)],
    "release of another scope": [(A, 0, 0, False, FAR), (R, 1, 0, False, -1.0)],
    "same length, other bytes": [(A, 0, 0, False, FAR), (R, 1, 0, False, -1.0), (A, 1, 0, False, FAR)],
    "acked acquire": [(A, 0, 7, False, FAR), (R, 0, 0, False, -1.0)],
    "acked release": [(A, 0, 0, False, FAR), (R, 0, 7, False, -1.0)],
    "release naming pid 1": [(A, 0, 0, False, FAR), (R, 0, 0, True, -1.0)],
    "absurd acquire, release": [(A, 0, 0, False, math.inf), (R, 0, 0, False, -1.0)],
    "release with another expiration": [(A, 0, 0, False, FAR), (R, 0, 0, False, math.nan)],
    "nested": [(A, 0, 0, False, FAR), (A, 1, 0, False, 5e9), (R, 1, 0, False, -1.0), (R, 0, 0, False, -1.0)],
    "empty scope pairs": [(A, 2, 0, False, FAR), (R, 2, 0, False, -1.0)] * 3 + [(A, 2, 0, False, FAR)],
    "long scope pairs": [(A, 5, 0, False, FAR), (R, 5, 0, False, -1.0)] * 50 + [(P, 0, 7, False, 0.0)],
}


@pytest.mark.parametrize("case", list(PAIR_CASES))
def test_acquire_release_pairs_in_one_read(sock_server: timer.SocketTimerServer, case: str) -> None:
    """The pair shortcut applies only to an exact release record right after a plain acquire."""
    check_against_model(sock_server, PAIR_CASES[case], [])


# -- FIFO protocol ------------------------------------------------------------------------------------------
FIFO_GARBAGE: list[bytes] = [
    b"not json\n",
    b"{}\n",
    b"[1, 2, 3]\n",
    b'"a string"\n',
    b"null\n",
    b'{"pid": 1}\n',
    b'{"pid": "4194321", "scope_id": "s", "expiration_time": 4e9, "signal": 9}\n',
    b'{"pid": true, "scope_id": "s", "expiration_time": 4e9, "signal": 9}\n',
    b'{"pid": 4194321, "scope_id": ["x"], "expiration_time": 4e9, "signal": 9}\n',
    b'{"pid": 4194321, "scope_id": "s", "expiration_time": "soon", "signal": 9}\n',
    b'{"pid": 4194321, "scope_id": "s", "expiration_time": 4e9, "signal": 9.5}\n',
    b'{"pid": 4194321, "scope_id": "s", "expiration_time": Infinity, "signal": 9}\n',
    b'{"pid": 4194321, "scope_id": "s", "expiration_time": NaN, "signal": 9}\n',
    b'{"pid": 4194321, "scope_id": "s", "expiration_time": 1e308, "signal": 9}\n',
    b'{"pid": 4194321, "scope_id": "s", "expiration_time": 1' + b"0" * 400 + b', "signal": 9}\n',
    b'{"pid": 4194321, "scope_id": "s", "expiration_time": 4e9, "signal": 1' + b"0" * 30 + b"}\n",
    b"[" * 4000 + b"\n",  # deep nesting: RecursionError in the JSON parser
    b"\xff\xfe invalid utf-8\n",
]
# Lines longer than PIPE_BUF are not written atomically, so concurrent writers would interleave them: these
# come from one writer after the others.
FIFO_LONG: list[bytes] = [
    b'{"pid": 1' + b"0" * 5000 + b', "scope_id": "s", "expiration_time": 4e9, "signal": 9}\n',
    b"x" * 70_000 + b'{"pid": 5}\n',
    b"y" * 300_000 + b"\n",  # beyond the server's line limit: refused once, the rest skipped
]


def fifo_garbage_client(path: str, lines: list[bytes], rounds: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        for _ in range(rounds):
            for line in lines:
                os.write(fd, line)
    finally:
        os.close(fd)


def test_fifo_garbage_from_many_writers(tmp_path: Path, log_bytes: LogBytes) -> None:
    path = str(tmp_path / "t.fifo")
    events: list[str] = []
    srv = timer.FileTimerServer(path, "fuzz", log_event=lambda name, req: events.append(name))
    srv.start()
    try:
        procs = [spawn(fifo_garbage_client, path, FIFO_GARBAGE, 5) for _ in range(8)]
        for p in procs:
            p.join(WAIT * 2)
            assert p.exitcode == 0
        long_writer = spawn(fifo_garbage_client, path, FIFO_LONG, 2)
        long_writer.join(WAIT * 2)
        assert long_writer.exitcode == 0
        expected = 8 * 5 * len(FIFO_GARBAGE) + 2 * len(FIFO_LONG)
        wait_until(lambda: srv.stats["refused"] >= expected, "every line to be refused")
        assert srv.stats["refused"] == expected
        assert_reaps(hang_fifo, path)
        assert srv.get_expired_timers(float("inf")) == {}  # none of the bad lines armed anything
        assert "request refused" in events
        assert log_bytes.bytes < LOG_BUDGET
    finally:
        srv.stop()


# -- multiprocessing queue ------------------------------------------------------------------------------------
def _explode() -> None:
    raise RuntimeError("this object cannot be unpickled")


class Unpicklable:
    def __reduce__(self) -> tuple[Any, ...]:
        return (_explode, ())


QUEUE_GARBAGE: list[Any] = [
    "a string",
    None,
    42,
    {"pid": 1},
    Unpicklable(),
    timer.TimerRequest([1, 2], "unhashable worker id", FAR),
    timer.TimerRequest(NO_PID, {"unhashable": "scope"}, FAR),
    timer.TimerRequest(NO_PID, "s", "soon"),
    timer.TimerRequest(NO_PID, "s", None),
    timer.TimerRequest(NO_PID, "s", math.inf),
    timer.TimerRequest(NO_PID, "s", math.nan),
    timer.TimerRequest(NO_PID, "s", 1e308),
    timer.TimerRequest(NO_PID, "s", 10**400),
    timer.TimerRequest(NO_PID, "s", True),
]


def queue_garbage_client(q: Any, rounds: int) -> None:
    for _ in range(rounds):
        for item in QUEUE_GARBAGE:
            q.put(item)
    q.close()
    q.join_thread()


@pytest.mark.parametrize("max_interval", [60.0, math.inf, 1e308])
def test_queue_garbage_and_absurd_max_interval(max_interval: float, log_bytes: LogBytes) -> None:
    q = CTX.Queue()
    srv = timer.LocalTimerServer(q, max_interval=max_interval)
    srv.start()
    try:
        procs = [spawn(queue_garbage_client, q, 5) for _ in range(4)]
        for p in procs:
            p.join(WAIT)
            assert p.exitcode == 0
        per_round = len(QUEUE_GARBAGE) - 1  # all refused; the unpicklable one is dropped by the queue
        wait_until(lambda: srv.stats["refused"] >= 4 * 5 * per_round, "the bad requests to be refused")
        assert srv.stats["refused"] == 4 * 5 * per_round
        assert_reaps(hang_queue, q)
        assert srv.get_expired_timers(float("inf")) == {}
        assert log_bytes.bytes < LOG_BUDGET
    finally:
        thread = srv._watchdog_thread
        srv.stop()
        assert thread is not None and not thread.is_alive()


def test_arm_refuses_absurd_deadlines(sock_server: timer.SocketTimerServer) -> None:
    p = spawn(time.sleep, 60)
    try:
        for exp in (math.inf, math.nan, 1e308):
            with pytest.raises(timer.InvalidTimerRequestError):
                sock_server.arm(p.pid, "x", exp)
        assert sock_server.get_expired_timers(float("inf")) == {}
    finally:
        p.kill()
        p.join()


def test_generic_server_with_absurd_max_interval_does_not_spin(log_bytes: LogBytes) -> None:
    """A user's TimerServer whose queue rejects the timeout: errors are logged at a limited rate."""

    class Picky(timer.RequestQueue):
        calls = 0

        def size(self) -> int:
            return 0

        def get(self, size: int, timeout: float) -> list[timer.TimerRequest]:
            Picky.calls += 1
            threading.Event().wait(timeout)  # OverflowError for 1e308, as torch's queue would raise
            return []

    class Server(timer.TimerServer):
        def register_timers(self, timer_requests: list[timer.TimerRequest]) -> None:
            pass

        def clear_timers(self, worker_ids: set[Any]) -> None:
            pass

        def get_expired_timers(self, deadline: float) -> dict[Any, list[timer.TimerRequest]]:
            return {}

        def _reap_worker(self, worker_id: Any) -> bool:
            return True

    srv = Server(Picky(), max_interval=1e308)
    srv.start()
    wait_until(lambda: Picky.calls >= 30, "the loop to go round")
    srv._max_interval = 0.01
    srv.stop()
    assert log_bytes.records <= 21  # one burst, then one line per 10 s
    assert log_bytes.bytes < LOG_BUDGET


def test_wire_format_of_a_valid_fifo_line_still_works(tmp_path: Path) -> None:
    """Positive control for the FIFO garbage above: the same server takes a well-formed torch line."""
    path = str(tmp_path / "t.fifo")
    srv = timer.FileTimerServer(path, "ok")
    srv.start()
    try:
        p = spawn(time.sleep, 60)
        line = {"version": 1, "pid": p.pid, "scope_id": "s", "expiration_time": time.time() + 0.1, "signal": 9}
        fd = os.open(path, os.O_WRONLY)
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.close(fd)
        p.join(WAIT)
        assert p.exitcode == -signal.SIGKILL
    finally:
        srv.stop()


def test_struct_sizes_are_what_the_fuzz_assumes() -> None:
    assert proto._REQ.size == struct.calcsize("<BBHIid") and proto._REP.size == 8


# -- the reproduction, inside the local scheduler's supervisor ------------------------------------------
ABUSIVE_REPLICA = """
    import os, socket, struct, time
    import tsm.timer
    path = os.environ["TSM_TIMER_SOCKET"]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.recv(4096)  # welcome
    for i, exp in enumerate([float("inf"), 1e308, float("nan"), 3e11] * 50):
        scope = b"absurd%d" % i
        s.sendall(struct.pack("<BBHIid", 1, 0, len(scope), 0, 0, exp) + scope)
    s.sendall(b"\\x07garbage" * 1000)
    s.close()
    with tsm.timer.expires(after=0.5, scope="later"):
        time.sleep(300)
"""


@pytest.mark.reliability(
    "a replica arming absurd timers (inf, 1e308, NaN, year 11000) and sending garbage to its app's timer server",
    expect="each request refused and counted; a later 0.5 s timer still reaps the replica; supervisor.log stays small",
    group="Hostile input",
)
def test_supervisor_survives_absurd_timers_and_still_reaps(tmp_path: Path, figure: Any) -> None:
    from testutil import py
    from tsm.schedulers.local.scheduler import LocalScheduler
    from tsm.specs import AppDef, AppState

    sched = LocalScheduler("fuzz")
    try:
        app_id = sched.submit(AppDef("absurd", [py(ABUSIVE_REPLICA)]), {"grace_period": 1.0})
        desc = sched.wait(app_id, timeout=120)
        assert desc is not None and desc.state == AppState.FAILED, desc
        assert "expired timer later" in desc.msg  # the later 0.5 s timer was reaped
        app_dir = Path(sched.store.query("SELECT app_dir FROM local_apps WHERE app_id=?", (app_id,))[0]["app_dir"])
        log = app_dir / "supervisor.log"
        size = log.stat().st_size if log.exists() else 0
        figure("supervisor.log after 200 absurd requests and a garbage stream", size / 1024, "KiB", 32)
        assert size < LOG_BUDGET, log.read_text(errors="replace")[-2000:]
    finally:
        sched.close()


# -- a server out of descriptors -------------------------------------------------------------------------------
SERVER_UNDER_LIMIT = """
    import json, logging, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
    import tsm.timer as t
    lines = []
    class Count(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    logging.getLogger("tsm.timer").addHandler(Count())
    srv = t.SocketTimerServer(sys.argv[1])
    srv.start()
    print("ready", flush=True)
    sys.stdin.readline()  # the descriptors are exhausted now
    sys.stdin.readline()  # the hogs are gone and an ordinary worker was reaped
    print(json.dumps({"stats": srv.stats, "lines": lines}), flush=True)
    srv.stop()
"""


def hog(path: str, conn: Any) -> None:
    socks = []
    for _ in range(proto.MAX_CONNS_PER_PID):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
        except OSError:
            s.close()
            break
        socks.append(s)
    conn.send(len(socks))
    conn.recv()


def test_server_out_of_descriptors_recovers(tmp_path: Path) -> None:
    """Clients hold every descriptor the server has: it refuses or pauses accepting (no spin, a few log
    lines, never "pid does not exist" for a pid it could not look up), and serves again once they let go."""
    import subprocess
    import sys
    import textwrap

    path = str(tmp_path / "t.sock")
    env = dict(os.environ, PYTHONPATH=str(Path(timer.__file__).resolve().parents[2]))
    server = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SERVER_UNDER_LIMIT), path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None and server.stdin is not None
        assert server.stdout.readline() == "ready\n"
        pipes = [CTX.Pipe() for _ in range(2)]
        hogs = [spawn(hog, path, there) for _here, there in pipes]
        assert sum(here.recv() for here, _there in pipes) > 48  # connected (queued) beyond the server's limit
        time.sleep(0.5)  # let the server run out of descriptors and back off
        server.stdin.write("exhausted\n")
        server.stdin.flush()
        for here, _there in pipes:
            here.send("go")
        for p in hogs:
            p.join(WAIT)
        assert_reaps(hang_socket, path)
        server.stdin.write("done\n")
        server.stdin.flush()
        report = json.loads(server.stdout.readline())
        assert report["stats"]["reaped"] == 1
        lines = report["lines"]
        # it says what happened (no descriptor to accept with, or none to read /proc with) ...
        assert any("cannot accept timer clients" in line or "Too many open files" in line for line in lines), lines
        # ... and never mistakes "cannot look" for "the process is gone"
        assert not any("does not exist" in line for line in lines), lines
        assert len(lines) <= 25, lines[:30]
        assert server.wait(WAIT) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
