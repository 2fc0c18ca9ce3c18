"""SocketTimerServer / SocketTimerClient with real processes and real signals."""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import tsm.timer as timer
from testutil import spawn, wait_until
from tsm.errors import TimerError
from tsm.timer._proc import process_start_time, read_stat

CTX = mp.get_context("fork")
WAIT = 30.0  # liveness bound for waits; never a performance assertion


def dead(pid: int) -> bool:
    st = read_stat(pid)
    return st is None or st.state == "Z"


@pytest.fixture
def sock_path(tmp_path: Path) -> str:
    return str(tmp_path / "timers.sock")


@pytest.fixture
def servers() -> Iterator[list[timer.SocketTimerServer]]:
    made: list[timer.SocketTimerServer] = []
    yield made
    for s in made:
        s.stop()


def start(servers: list[timer.SocketTimerServer], path: str, **kw: Any) -> timer.SocketTimerServer:
    s = timer.SocketTimerServer(path, **kw)
    servers.append(s)
    s.start()
    return s


# -- child process bodies (fork context: plain functions) -------------------------------------------------------
def hang_in_timer(path: str, after: float, ready: Connection | None = None) -> None:
    client = timer.SocketTimerClient(path)
    with timer.expires(after=after, client=client):
        client.sync()
        if ready is not None:
            ready.send(os.getpid())
        time.sleep(60)


def release_in_time(path: str, after: float, ready: Connection) -> None:
    client = timer.SocketTimerClient(path)
    with timer.expires(after=after, client=client):
        pass
    client.sync()
    ready.send("released")
    time.sleep(60)


def sleeper() -> None:
    time.sleep(60)


def reap_canary(path: str, after: float) -> None:
    """A worker that hangs past a later deadline: once it is dead, the server is past every earlier one."""
    p = spawn(hang_in_timer, path, after)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL


# -- tests --------------------------------------------------------------------------------------------------------
def test_hung_worker_is_reaped_and_on_reap_called(
    servers: list[timer.SocketTimerServer], sock_path: str
) -> None:
    reaped: list[tuple[int, str]] = []
    srv = start(servers, sock_path, max_interval=60, on_reap=lambda pid, scope: reaped.append((pid, scope)))
    p = spawn(hang_in_timer, sock_path, 0.2)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL
    wait_until(lambda: bool(reaped), "on_reap")
    assert reaped[0][0] == p.pid and reaped[0][1].startswith("expires#")
    assert srv.stats["reaped"] == 1
    assert srv.get_expired_timers(float("inf")) == {}


def test_release_in_time_prevents_reaping(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    start(servers, sock_path)
    here, there = CTX.Pipe()
    p = spawn(release_in_time, sock_path, 0.2, there)
    assert here.recv() == "released"
    reap_canary(sock_path, 0.4)
    assert p.is_alive()
    p.kill()
    p.join()


def test_nested_scopes_are_independent(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    srv = start(servers, sock_path)
    here, there = CTX.Pipe()

    def nested(conn: Connection) -> None:
        client = timer.SocketTimerClient(sock_path)
        timer.configure(client)
        with timer.expires(after=600):
            with timer.expires(after=600), timer.expires(after=600, scope="named"):
                client.sync()
                conn.send("inner")
                conn.recv()
            client.sync()
            conn.send("outer")
            conn.recv()
            with timer.expires(after=0.2):  # a short inner timer expires although the outer one does not
                time.sleep(60)

    p = spawn(nested, there)
    assert here.recv() == "inner"
    scopes = sorted(r.scope_id for r in srv.get_expired_timers(float("inf"))[p.pid])
    assert len(scopes) == 3 and "named" in scopes
    here.send("go")
    assert here.recv() == "outer"
    assert len(srv.get_expired_timers(float("inf"))[p.pid]) == 1
    here.send("go")
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL


def test_ack_mode_and_sync(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    srv = start(servers, sock_path)
    here, there = CTX.Pipe()

    def acked(conn: Connection) -> None:
        client = timer.SocketTimerClient(sock_path, ack=True)
        client.acquire("a", time.time() + 600)
        conn.send("armed")  # ack mode: already processed by the server
        conn.recv()
        client.release("a")
        conn.send("released")
        conn.recv()

    p = spawn(acked, there)
    assert here.recv() == "armed"
    assert [r.scope_id for r in srv.get_expired_timers(float("inf"))[p.pid]] == ["a"]
    here.send("go")
    assert here.recv() == "released"
    assert p.pid not in srv.get_expired_timers(float("inf"))
    here.send("go")
    p.join(WAIT)
    assert p.exitcode == 0


def test_client_in_server_process_is_refused(
    servers: list[timer.SocketTimerServer], sock_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    srv = start(servers, sock_path)
    with (
        caplog.at_level(logging.WARNING, logger="tsm.timer"),
        pytest.raises(TimerError, match="server itself"),
    ):
        timer.SocketTimerClient(sock_path).acquire("x", time.time() + 0.1)
    assert srv.stats["refused"] == 1
    assert any("server itself" in r.getMessage() for r in caplog.records if r.name == "tsm.timer")


@pytest.mark.parametrize("whom", ["sibling", "pid1", "server"])
def test_request_naming_another_pid_is_refused(
    servers: list[timer.SocketTimerServer], sock_path: str, whom: str, caplog: pytest.LogCaptureFixture
) -> None:
    srv = start(servers, sock_path)
    victim = spawn(sleeper)
    target = {"sibling": victim.pid, "pid1": 1, "server": os.getpid()}[whom]
    here, there = CTX.Pipe()

    def naughty(conn: Connection) -> None:
        client = timer.SocketTimerClient(sock_path)
        try:
            client.send_request(timer.TimerRequest(target, "evil", time.time() + 0.05))
        except TimerError as e:
            conn.send(f"TimerError: {e}")
        else:
            conn.send("accepted")
        client.send_request(timer.TimerRequest(None, "mine", time.time() + 600))  # None = myself: fine
        client.send_request(timer.TimerRequest(os.getpid(), "mine2", time.time() + 600))
        conn.send("ok")
        time.sleep(60)

    with caplog.at_level(logging.WARNING, logger="tsm.timer"):
        p = spawn(naughty, there)
        answer = here.recv()
        assert answer.startswith("TimerError"), answer
        assert here.recv() == "ok"
    assert srv.stats["refused"] == 1
    armed = srv.get_expired_timers(float("inf"))
    assert sorted(r.scope_id for r in armed[p.pid]) == ["mine", "mine2"]
    assert target not in armed
    assert any("refused" in r.getMessage() for r in caplog.records if r.name == "tsm.timer")
    reap_canary(sock_path, 0.2)
    assert victim.is_alive()
    for proc in (p, victim):
        proc.kill()
        proc.join()


def test_reused_pid_is_not_signalled(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    srv = start(servers, sock_path)
    p = spawn(sleeper)
    real = process_start_time(p.pid)
    assert real is not None
    # The pid now "belongs" to a process with another start time: exactly what pid reuse looks like.
    srv.arm(p.pid, "reused", time.time() + 0.1, start_time=real + 1)
    wait_until(lambda: srv.stats["skipped"] == 1, "the skipped reap")
    assert p.is_alive()
    srv.arm(p.pid, "same", time.time() + 0.1)  # positive control: the true start time
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL


def test_arm_refuses_pid1_self_and_ancestors(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    # signal=0 and a far deadline: even a broken guard could not signal pytest's parent here.
    srv = start(servers, sock_path, signal=0)
    for pid in (1, 0, -5, os.getpid(), os.getppid()):
        with pytest.raises(TimerError):
            srv.arm(pid, "x", time.time() + 600)
    assert srv.stats["refused"] == 5


def term_handler_worker(path: str, ready: Connection, die_on_term: bool) -> None:
    def on_term(signum: int, frame: Any) -> None:
        ready.send("SIGTERM")
        if die_on_term:
            os._exit(3)

    signal.signal(signal.SIGTERM, on_term)
    hang_in_timer(path, 0.2)


@pytest.mark.parametrize("die_on_term", [False, True])
def test_sigterm_then_sigkill_after_grace(
    servers: list[timer.SocketTimerServer], sock_path: str, die_on_term: bool
) -> None:
    reaped: list[tuple[int, str]] = []
    start(servers, sock_path, term_grace=0.3, on_reap=lambda pid, scope: reaped.append((pid, scope)))
    here, there = CTX.Pipe()
    p = spawn(term_handler_worker, sock_path, there, die_on_term)
    assert here.recv() == "SIGTERM"
    p.join(WAIT)
    assert p.exitcode == (3 if die_on_term else -signal.SIGKILL)
    wait_until(lambda: bool(reaped), "on_reap")


def test_custom_signal_without_grace(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    start(servers, sock_path, signal=signal.SIGTERM)
    p = spawn(hang_in_timer, sock_path, 0.1)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGTERM


def group_leader(path: str, ready: Connection) -> None:
    os.setsid()
    child = subprocess.Popen(["sleep", "60"])
    ready.send(child.pid)
    hang_in_timer(path, 0.3)


def test_kill_group_kills_the_whole_group(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    start(servers, sock_path, kill_group=True)
    here, there = CTX.Pipe()
    p = spawn(group_leader, sock_path, there)
    grandchild = here.recv()
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL
    wait_until(lambda: dead(grandchild), "the grandchild in the worker's group to die")


def test_kill_group_never_signals_the_servers_own_group(
    servers: list[timer.SocketTimerServer], sock_path: str
) -> None:
    start(servers, sock_path, kill_group=True)
    bystander = spawn(sleeper)  # same process group as the server (the test process)
    assert os.getpgid(bystander.pid) == os.getpgrp()
    p = spawn(hang_in_timer, sock_path, 0.1)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL
    assert bystander.is_alive()
    bystander.kill()
    bystander.join()


def test_long_socket_path(servers: list[timer.SocketTimerServer], tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "timers.sock")
    assert len(path.encode()) > 107
    srv = start(servers, path)
    assert os.path.exists(path)
    p = spawn(hang_in_timer, path, 0.1)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL
    srv.stop()
    assert not os.path.exists(path)


def test_socket_file_is_private_and_removed_on_stop(sock_path: str) -> None:
    srv = timer.SocketTimerServer(sock_path)
    assert os.stat(sock_path).st_mode & 0o777 == 0o600
    srv.start()
    thread = srv._thread
    srv.start()  # tolerated, as torch's servers tolerate it: still one loop
    assert srv._thread is thread
    srv.stop()
    assert not os.path.exists(sock_path)
    srv.stop()  # idempotent
    with pytest.raises(TimerError, match="was stopped"):
        srv.start()


def test_existing_files_at_the_path(tmp_path: Path, sock_path: str) -> None:
    regular = tmp_path / "regular"
    regular.write_text("keep me")
    with pytest.raises(TimerError, match="not a socket"):
        timer.SocketTimerServer(str(regular))
    assert regular.read_text() == "keep me"
    with timer.SocketTimerServer(sock_path), pytest.raises(TimerError, match="listening"):
        timer.SocketTimerServer(sock_path)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock_path)  # a socket nobody listens on, as a crashed server leaves it
    stale.close()
    with timer.SocketTimerServer(sock_path) as srv:
        assert srv.stats["connections"] == 0


def test_unsafe_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(TimerError, match="world-writable"):
        timer.SocketTimerServer(str(shared / "t.sock"))


def test_stop_closes_connections_and_client_gets_timer_error(sock_path: str) -> None:
    srv = timer.SocketTimerServer(sock_path)
    srv.start()
    here, there = CTX.Pipe()

    def worker(conn: Connection) -> None:
        client = timer.SocketTimerClient(sock_path, connect_timeout=1.0)
        client.sync()
        conn.send("connected")
        conn.recv()
        try:
            for _ in range(100):
                client.acquire("x", time.time() + 600)
                client.sync()
        except TimerError as e:
            conn.send(f"TimerError: {e}")
        else:
            conn.send("no error")

    p = spawn(worker, there)
    assert here.recv() == "connected"
    srv.stop()
    here.send("go")
    assert here.recv().startswith("TimerError")
    p.join(WAIT)


def test_forked_child_gets_its_own_connection(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    start(servers, sock_path)
    here, there = CTX.Pipe()

    def parent_worker(conn: Connection) -> None:
        client = timer.SocketTimerClient(sock_path)
        client.sync()  # connected as this process
        child = os.fork()
        if child == 0:
            with timer.expires(after=0.1, client=client):  # same object, new process: its own timer
                time.sleep(60)
            os._exit(0)
        _, status = os.waitpid(child, 0)
        conn.send(os.waitstatus_to_exitcode(status))

    p = spawn(parent_worker, there)
    assert here.recv() == -signal.SIGKILL
    p.join(WAIT)
    assert p.exitcode == 0


def hammer(path: str, pairs: int, go: Any) -> None:
    client = timer.SocketTimerClient(path)
    go.wait()
    exp = time.time() + 600
    for i in range(pairs):
        client.acquire(f"s{i % 7}", exp)
        client.release(f"s{i % 7}")
    client.close()  # no sync: everything written must still be processed


def test_sixteen_clients_lose_nothing(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    srv = start(servers, sock_path)
    pairs = 3000
    go = CTX.Event()
    procs = [spawn(hammer, sock_path, pairs, go) for _ in range(16)]
    go.set()
    for p in procs:
        p.join(WAIT)
        assert p.exitcode == 0
    expected = 16 * pairs * 2
    wait_until(lambda: srv.stats["requests"] >= expected, "every request to be processed")
    st = srv.stats
    assert st["requests"] == expected
    assert st["acquired"] == st["released"] == 16 * pairs
    assert st["refused"] == 0
    assert srv.get_expired_timers(float("inf")) == {}


def test_env_socket_default_in_a_fresh_process(
    servers: list[timer.SocketTimerServer], sock_path: str
) -> None:
    srv = start(servers, sock_path)
    src = str(Path(timer.__file__).resolve().parents[2])
    env = dict(os.environ, TSM_TIMER_SOCKET=sock_path, PYTHONPATH=src)
    ok = subprocess.run(
        [sys.executable, "-c", "import tsm.timer as t\nwith t.expires(after=60):\n    pass\nprint('done')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "done"
    hung = subprocess.run(
        [sys.executable, "-c", "import time, tsm.timer as t\nwith t.expires(after=0.2):\n    time.sleep(60)"],
        env=env,
        timeout=WAIT,
    )
    assert hung.returncode == -signal.SIGKILL
    wait_until(lambda: srv.stats["requests"] >= 3, "the requests of both processes")


def test_in_process_table_api(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    srv = start(servers, sock_path)
    p = spawn(sleeper)
    far = time.time() + 600
    srv.register_timers([timer.TimerRequest(p.pid, "a", far), timer.TimerRequest(p.pid, "b", far)])
    srv.register_timers([timer.TimerRequest(p.pid, "b", -1), timer.TimerRequest(1, "evil", far)])
    assert [r.scope_id for r in srv.get_expired_timers(float("inf"))[p.pid]] == ["a"]
    assert [r.scope_id for r in srv.get_expired_timers(float("inf"))[1]] == ["evil"]  # armed, never reaped
    assert srv.get_expired_timers(far - 1) == {}
    srv.clear_timers({1})
    srv.clear_timers({p.pid})
    assert srv.get_expired_timers(float("inf")) == {}
    assert timer.FileTimerServer.is_process_running(p.pid)
    p.kill()
    p.join()
    assert not timer.FileTimerServer.is_process_running(p.pid)


def test_client_records_are_the_protocols_on_every_path(tmp_path: Path) -> None:
    """Repeated scopes go out as ready-made records (issue 19); byte for byte the records of the slow path,
    and the fast path refuses the same absurd values."""
    from tsm.timer import _wire as proto

    path = str(tmp_path / "raw.sock")
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(1)
    client = timer.SocketTimerClient(path)

    def rec(kind: int, scope: bytes, exp: float) -> bytes:
        return proto._REQ.pack(kind, 0, len(scope), 0, 0, exp) + scope

    try:
        here, there = CTX.Pipe()
        p = spawn(_welcome_then_read, lsock, there)
        client.acquire("s", 5e9)  # slow path, connects and remembers "s"
        client.acquire("s", 6e9)  # fast path
        client.release("s")  # fast path
        client.acquire("s", -1.0)  # a release, slow path
        client.acquire("s", 7)  # an int: slow path
        client.acquire("\udcff", 5e9)  # a lone surrogate, sent as its bytes
        client.release("\udcff")
        for bad in (math.inf, math.nan, 1e308, True):
            with pytest.raises(timer.InvalidTimerRequestError):
                client.acquire("s", bad)
        client.close()
        assert here.recv() == b"".join(
            [
                rec(proto.ACQUIRE, b"s", 5e9),
                rec(proto.ACQUIRE, b"s", 6e9),
                rec(proto.RELEASE, b"s", -1.0),
                rec(proto.RELEASE, b"s", -1.0),
                rec(proto.ACQUIRE, b"s", 7.0),
                rec(proto.ACQUIRE, b"\xed\xb3\xbf", 5e9),
                rec(proto.RELEASE, b"\xed\xb3\xbf", -1.0),
            ]
        )
        p.join(WAIT)
    finally:
        lsock.close()


def _welcome_then_read(lsock: socket.socket, conn: Connection) -> None:
    from tsm.timer import _wire as proto

    s, _ = lsock.accept()
    s.sendall(proto._REP.pack(proto.WELCOME, 0, 0, 1))
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    conn.send(data)


def test_client_keeps_few_ready_made_records(servers: list[timer.SocketTimerServer], sock_path: str) -> None:
    """Thousands of distinct scopes neither grow the client's record cache without bound nor lose a request."""
    from tsm.timer import _wire as proto

    srv = start(servers, sock_path)
    here, there = CTX.Pipe()

    def worker(conn: Connection) -> None:
        client = timer.SocketTimerClient(sock_path)
        exp = time.time() + 600
        most = 0
        for i in range(3 * proto._FRAMES_MAX):
            for _ in range(2):
                client.acquire(f"scope-{i}", exp)
                client.release(f"scope-{i}")
            most = max(most, len(client._frames))
        client.sync()
        conn.send(most)

    p = spawn(worker, there)
    assert here.recv() <= proto._FRAMES_MAX
    p.join(WAIT)
    assert srv.stats["requests"] == 3 * proto._FRAMES_MAX * 4
    assert srv.get_expired_timers(float("inf")) == {}
