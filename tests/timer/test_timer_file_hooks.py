"""torch's ``FileTimerServer`` hooks that subclasses and tests drive: ``_run_watchdog()`` and ``_reap_worker``.

torch's own tests step the server with ``_run_watchdog(fd)`` and watch the reaping through a mocked
``_reap_worker`` or ``os.kill``; tsm's server keeps its guard (never pid 1, the server, another user's or a
reused pid) and routes every allowed reap through those same hooks.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

import tsm.timer as timer
from testutil import spawn


def sleeper() -> None:
    time.sleep(60)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[timer.FileTimerServer]:
    srv = timer.FileTimerServer(str(tmp_path / "timers.fifo"), "hooks")
    yield srv
    srv.stop()


def _arm(srv: timer.FileTimerServer, pid: int, after: float, sig: int = signal.SIGKILL) -> None:
    client = timer.FileTimerClient(srv._file_path)
    client.send_request(timer.FileTimerRequest(pid, "scope", time.time() + after, sig))
    client.close()


def test_run_watchdog_reads_requests_and_reaps_through_os_kill(server: timer.FileTimerServer) -> None:
    p = spawn(sleeper)
    try:
        _arm(server, p.pid, 600)
        server._run_watchdog()  # one step, no thread: the request is read and the timer armed
        assert list(server.get_expired_timers(float("inf"))) == [p.pid]
        _arm(server, p.pid, -600)  # re-armed as already expired
        with mock.patch("os.kill") as kill:
            server._run_watchdog()
        kill.assert_called_once_with(p.pid, signal.SIGKILL)
        assert server.get_expired_timers(float("inf")) == {}
    finally:
        p.kill()
        p.join()


def test_a_mocked_reap_worker_on_the_instance_sees_the_call(server: timer.FileTimerServer) -> None:
    p = spawn(sleeper)
    try:
        _arm(server, p.pid, -1, signal.SIGTERM)
        with mock.patch.object(server, "_reap_worker", return_value=True) as reap:
            server._run_watchdog()
        reap.assert_called_once_with(p.pid, signal.SIGTERM)
        assert p.is_alive()  # the mock stood in for the kill
        assert server.stats["reaped"] == 1
    finally:
        p.kill()
        p.join()


def test_a_subclass_reap_worker_is_used_and_the_guard_still_applies(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []

    class Recording(timer.FileTimerServer):
        def _reap_worker(self, worker_pid: int, signal: int) -> bool:
            seen.append((worker_pid, signal))
            return True

    srv = Recording(str(tmp_path / "fifo"), "sub")
    p = spawn(sleeper)
    try:
        for pid in (1, os.getpid(), p.pid):
            _arm(srv, pid, -1)
        srv._run_watchdog()
        assert seen == [(p.pid, signal.SIGKILL)]  # pid 1 and the server itself are refused before the hook
        assert srv.stats["refused"] == 2
    finally:
        srv.stop()
        p.kill()
        p.join()


def test_a_subclass_run_watchdog_is_called_every_round_at_torchs_cadence(tmp_path: Path) -> None:
    rounds: list[float] = []

    class Periodic(timer.FileTimerServer):
        def _run_watchdog(self, fd: object = None) -> None:
            rounds.append(time.monotonic())
            super()._run_watchdog(fd)

    srv = Periodic(str(tmp_path / "fifo"), "periodic", max_interval=0.01)
    p = spawn(sleeper)
    try:
        srv.start()
        deadline = time.monotonic() + 30
        while len(rounds) < 5:  # no request at all: rounds still come, one per max_interval at most
            assert time.monotonic() < deadline
            time.sleep(0.01)
        _arm(srv, p.pid, 0.05)
        p.join(30)
        assert p.exitcode == -signal.SIGKILL  # the rounds it drives still reap
    finally:
        srv.stop()
        p.kill()
        p.join()
