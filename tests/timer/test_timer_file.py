"""FileTimerServer / FileTimerClient (FIFO) with real processes and real signals."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import tsm.timer as timer
from testutil import spawn, wait_until
from tsm.errors import TimerError

CTX = mp.get_context("fork")
WAIT = 30.0


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "timers.fifo")


@pytest.fixture
def servers() -> Iterator[list[timer.FileTimerServer]]:
    made: list[timer.FileTimerServer] = []
    yield made
    for s in made:
        s.stop()


def start(servers: list[timer.FileTimerServer], path: str, **kw: Any) -> timer.FileTimerServer:
    s = timer.FileTimerServer(path, "run-1", **kw)
    servers.append(s)
    s.start()
    return s


def hang(path: str, after: float, sig: int = signal.SIGKILL) -> None:
    client = timer.FileTimerClient(path, signal=sig)
    with timer.expires(after=after, client=client):
        time.sleep(60)


def sleeper() -> None:
    time.sleep(60)


def canary(path: str, after: float) -> None:
    p = spawn(hang, path, after)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL


def test_fifo_is_private_and_removed_on_stop(fifo: str) -> None:
    srv = timer.FileTimerServer(fifo, "run-1", max_interval=10, daemon=True, log_event=None)
    st = os.lstat(fifo)
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    srv.start()
    srv.stop()
    assert not os.path.exists(fifo)


def test_refuses_unsafe_places(tmp_path: Path) -> None:
    regular = tmp_path / "file"
    regular.write_text("keep")
    with pytest.raises(TimerError, match="not a FIFO"):
        timer.FileTimerServer(str(regular), "r")
    assert regular.read_text() == "keep"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(TimerError, match="world-writable"):
        timer.FileTimerServer(str(shared / "f"), "r")


def test_hung_worker_is_reaped_and_events_logged(servers: list[timer.FileTimerServer], fifo: str) -> None:
    events: list[tuple[str, Any]] = []
    reaped: list[tuple[int, str]] = []
    srv = start(
        servers,
        fifo,
        max_interval=60,
        log_event=lambda name, req: events.append((name, req)),
        on_reap=lambda pid, scope: reaped.append((pid, scope)),
    )
    p = spawn(hang, fifo, 0.2)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL
    wait_until(lambda: bool(reaped), "on_reap")
    names = [n for n, _ in events]
    assert names[0] == "watchdog started"
    assert "timer expired" in names and "kill worker process" in names
    expired = next(r for n, r in events if n == "timer expired")
    assert isinstance(expired, timer.FileTimerRequest) and expired.worker_pid == p.pid
    assert expired.signal == signal.SIGKILL
    assert srv._request_count == 1  # torch's test counter
    assert srv.get_last_progress_time() >= int(time.time()) - 1


def test_release_in_time_and_signal_zero_do_not_reap(servers: list[timer.FileTimerServer], fifo: str) -> None:
    start(servers, fifo)
    here, there = CTX.Pipe()

    def released(conn: Connection) -> None:
        with timer.expires(after=0.2, client=timer.FileTimerClient(fifo)):
            pass
        conn.send("released")
        time.sleep(60)

    p = spawn(released, there)
    assert here.recv() == "released"
    q = spawn(hang, fifo, 0.2, 0)  # torch's meaning: signal <= 0 never reaps
    canary(fifo, 0.5)  # FIFO order: requests written before the canary's are processed first
    assert p.is_alive() and q.is_alive()
    for proc in (p, q):
        proc.kill()
        proc.join()


def test_torch_wire_format_is_accepted(servers: list[timer.FileTimerServer], fifo: str) -> None:
    start(servers, fifo)

    def torch_style_client() -> None:
        # what torch's FileTimerClient writes: open, one JSON line, close
        line = json.dumps(
            {
                "version": 1,
                "pid": os.getpid(),
                "scope_id": "train.py#12",
                "expiration_time": time.time() + 0.1,
                "signal": signal.SIGKILL,
            }
        )
        with open(fifo, "w") as f:
            f.write(line + "\n")
        time.sleep(60)

    p = spawn(torch_style_client)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL


def test_request_roundtrip_and_equality() -> None:
    r = timer.FileTimerRequest(123, "s", 5.0, signal.SIGKILL)
    assert r.worker_pid == 123 and r.version == 1
    assert json.loads(r.to_json()) == {
        "version": 1,
        "pid": 123,
        "scope_id": "s",
        "expiration_time": 5.0,
        "signal": signal.SIGKILL,
    }
    assert r == timer.FileTimerRequest(123, "s", 5.0, signal.SIGKILL)
    assert r != timer.FileTimerRequest(123, "s", 5.0, signal.SIGTERM)
    assert r != timer.TimerRequest(123, "s", 5.0)


@pytest.mark.parametrize("whom", ["pid1", "server", "ancestor", "missing"])
def test_dangerous_pids_are_armed_but_never_signalled(
    servers: list[timer.FileTimerServer], fifo: str, whom: str, caplog: pytest.LogCaptureFixture
) -> None:
    """torch's servers take any worker id; tsm's too, and guard the reaping instead (pid 1, itself, ...)."""
    srv = start(servers, fifo)
    target = {"pid1": 1, "server": os.getpid(), "ancestor": os.getppid(), "missing": 2**22 + 17}[whom]
    got: list[int] = []
    old = signal.signal(signal.SIGURG, lambda signum, frame: got.append(signum))
    client = timer.FileTimerClient(fifo)
    try:
        with caplog.at_level(logging.INFO, logger="tsm.timer"):
            # SIGURG is ignored by default: even a broken guard could not hurt anyone in this test.
            client.send_request(timer.FileTimerRequest(target, "evil", time.time() + 600, signal.SIGURG))
            wait_until(lambda: target in srv.get_expired_timers(float("inf")), "the timer to be armed")
            client.send_request(timer.FileTimerRequest(target, "evil", time.time() + 0.05, signal.SIGURG))
            wait_until(lambda: srv.stats["refused"] + srv.stats["skipped"] == 1, "the expiry")
        assert srv.stats["reaped"] == 0 and got == []
        assert srv.get_expired_timers(float("inf")) == {}
        kind = "skipped" if whom == "missing" else "refused"
        assert srv.stats[kind] == 1
        text = "did not exist when it was armed" if whom == "missing" else "not reaping"
        assert any(text in r.getMessage() for r in caplog.records if r.name == "tsm.timer")
    finally:
        client.close()
        signal.signal(signal.SIGURG, old)


def test_the_server_never_kills_itself(servers: list[timer.FileTimerServer], fifo: str) -> None:
    start(servers, fifo)
    client = timer.FileTimerClient(fifo)  # a client in the server's own process
    with timer.expires(after=0.05, client=client):
        canary(fifo, 0.3)  # torch's server would SIGKILL its own process here
    assert os.getpid() > 0  # still here


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another user")
def test_other_users_process_is_refused(servers: list[timer.FileTimerServer], fifo: str) -> None:
    srv = start(servers, fifo)
    other = subprocess.Popen(["sleep", "60"], user=65534)
    try:
        sender = spawn(_send_for, fifo, other.pid)
        sender.join(WAIT)
        wait_until(lambda: srv.stats["refused"] == 1, "the refusal")
        canary(fifo, 0.3)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def _send_for(path: str, pid: int) -> None:
    timer.FileTimerClient(path).send_request(
        timer.FileTimerRequest(pid, "x", time.time() + 0.05, signal.SIGKILL)
    )


def flood(path: str, pairs: int, go: Any) -> None:
    client = timer.FileTimerClient(path)
    go.wait()
    exp = time.time() + 600
    for i in range(pairs):
        client.acquire(f"scope-{i % 5}", exp)
        client.release(f"scope-{i % 5}")


def test_sixteen_clients_lose_nothing_under_back_pressure(fifo: str) -> None:
    # The server is created but not started: nobody reads, so the 64 KiB pipe fills and every client
    # must wait (torch's client raises BlockingIOError and loses the request here).
    srv = timer.FileTimerServer(fifo, "flood")
    try:
        pairs = 400
        go = CTX.Event()
        procs = [spawn(flood, fifo, pairs, go) for _ in range(16)]
        go.set()
        time.sleep(0.2)
        srv.start()
        for p in procs:
            p.join(WAIT)
            assert p.exitcode == 0
        expected = 16 * pairs * 2
        wait_until(lambda: srv.stats["requests"] >= expected, "every request")
        st = srv.stats
        assert st["requests"] == expected and st["refused"] == 0
        assert srv.get_expired_timers(float("inf")) == {}
    finally:
        srv.stop()


def test_client_without_server_raises_broken_pipe(fifo: str) -> None:
    with pytest.raises(BrokenPipeError, match="no FileTimerServer") as info:
        timer.FileTimerClient(fifo).acquire("x", time.time() + 1)
    assert isinstance(info.value, TimerError)


def test_run_once_processes_pending_requests(fifo: str) -> None:
    srv = timer.FileTimerServer(fifo, "once")
    p = spawn(sleeper)
    client = timer.FileTimerClient(fifo)
    client.send_request(timer.FileTimerRequest(p.pid, "a", time.time() + 600, signal.SIGKILL))
    client.send_request(timer.FileTimerRequest(p.pid, "b", time.time() + 600, signal.SIGKILL))
    client.send_request(timer.FileTimerRequest(p.pid, "a", -1, 0))
    client.close()
    srv.start()
    srv.run_once()
    assert srv._request_count == 3
    assert [r.scope_id for r in srv.get_expired_timers(float("inf"))[p.pid]] == ["b"]
    assert not os.path.exists(fifo)
    p.kill()
    p.join()
