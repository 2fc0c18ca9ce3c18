"""LocalTimerServer / LocalTimerClient over a multiprocessing queue, and a user-written TimerServer."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest

import tsm.timer as timer
from testutil import spawn, wait_until
from tsm.timer._proc import process_start_time

CTX = mp.get_context("fork")
WAIT = 30.0


@pytest.fixture
def queue_and_server() -> Iterator[tuple[Any, timer.LocalTimerServer]]:
    q = CTX.Queue()
    srv = timer.LocalTimerServer(q, max_interval=60, daemon=True)
    srv.start()
    yield q, srv
    srv.stop()


def hang(q: Any, after: float) -> None:
    timer.configure(timer.LocalTimerClient(q))
    with timer.expires(after=after):
        time.sleep(60)


def sleeper() -> None:
    time.sleep(60)


def canary(q: Any, after: float) -> None:
    p = spawn(hang, q, after)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL


def test_hung_worker_is_reaped(queue_and_server: tuple[Any, timer.LocalTimerServer]) -> None:
    q, srv = queue_and_server
    p = spawn(hang, q, 0.2)
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL
    wait_until(lambda: srv.stats["reaped"] == 1, "the reap to be counted")
    assert srv.get_expired_timers(float("inf")) == {}


def test_release_in_time_prevents_reaping(queue_and_server: tuple[Any, timer.LocalTimerServer]) -> None:
    q, _ = queue_and_server
    here, there = CTX.Pipe()

    def released(conn: Connection) -> None:
        with timer.expires(after=0.2, client=timer.LocalTimerClient(q)):
            pass
        conn.send("released")
        time.sleep(60)

    p = spawn(released, there)
    assert here.recv() == "released"
    canary(q, 0.5)
    assert p.is_alive()
    p.kill()
    p.join()


def test_nested_scopes(queue_and_server: tuple[Any, timer.LocalTimerServer]) -> None:
    q, srv = queue_and_server
    here, there = CTX.Pipe()

    def nested(conn: Connection) -> None:
        client = timer.LocalTimerClient(q)
        with timer.expires(after=600, client=client), timer.expires(after=600, client=client):
            conn.send("inside")
            conn.recv()
        with timer.expires(after=0.1, client=client):
            time.sleep(60)

    p = spawn(nested, there)
    assert here.recv() == "inside"
    wait_until(lambda: len(srv.get_expired_timers(float("inf")).get(p.pid, [])) == 2, "two timers armed")
    here.send("go")
    p.join(WAIT)
    assert p.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("whom", ["pid1", "server", "ancestor", "negative", "not-a-pid"])
def test_any_worker_id_is_armed_but_only_safe_pids_are_signalled(whom: str, caplog: pytest.LogCaptureFixture) -> None:
    """pid-agnostic like torch: the timer is armed for whatever id was sent; the reap is what is guarded."""
    target: Any = {"pid1": 1, "server": os.getpid(), "ancestor": os.getppid(), "negative": -3, "not-a-pid": "w-1"}[
        whom
    ]
    q = CTX.Queue()
    # SIGURG is ignored by default: even a broken guard could not hurt anyone in this test.
    srv = timer.LocalTimerServer(q, max_interval=60, signal=signal.SIGURG)
    got: list[int] = []
    old = signal.signal(signal.SIGURG, lambda signum, frame: got.append(signum))
    srv.start()
    try:
        with caplog.at_level(logging.WARNING, logger="tsm.timer"):
            q.put(timer.TimerRequest(target, "evil", time.time() + 600))
            wait_until(lambda: target in srv.get_expired_timers(float("inf")), "the timer to be armed")
            assert (target, "evil") in srv._timers  # torch's table, as torch-written tests read it
            q.put(timer.TimerRequest(target, "evil", time.time() + 0.05))
            wait_until(lambda: srv.stats["refused"] == 1, "the refused reap")
        assert srv.stats["reaped"] == 0 and got == []
        assert srv.get_expired_timers(float("inf")) == {}
        assert any("not reaping" in r.getMessage() for r in caplog.records)
    finally:
        srv.stop()
        signal.signal(signal.SIGURG, old)


def test_client_in_server_process_cannot_get_it_killed(
    queue_and_server: tuple[Any, timer.LocalTimerServer],
) -> None:
    q, srv = queue_and_server
    with timer.expires(after=0.05, client=timer.LocalTimerClient(q)):
        canary(q, 0.3)
    assert srv.stats["refused"] == 1


def test_reused_pid_is_not_signalled(queue_and_server: tuple[Any, timer.LocalTimerServer]) -> None:
    _, srv = queue_and_server
    p = spawn(sleeper)
    real = process_start_time(p.pid)
    assert real is not None
    srv.arm(p.pid, "reused", time.time() + 0.1, start_time=real - 1)
    wait_until(lambda: srv.stats["skipped"] == 1, "the skipped reap")
    assert p.is_alive()
    p.kill()
    p.join()


def test_sigterm_grace_then_kill() -> None:
    q = CTX.Queue()
    reaped: list[tuple[int, str]] = []
    srv = timer.LocalTimerServer(q, term_grace=0.2, on_reap=lambda pid, scope: reaped.append((pid, scope)))
    srv.start()
    try:
        here, there = CTX.Pipe()

        def stubborn(conn: Connection) -> None:
            signal.signal(signal.SIGTERM, lambda *_: conn.send("SIGTERM"))
            hang(q, 0.1)

        p = spawn(stubborn, there)
        assert here.recv() == "SIGTERM"
        p.join(WAIT)
        assert p.exitcode == -signal.SIGKILL
        wait_until(lambda: bool(reaped), "on_reap")
        assert reaped[0][0] == p.pid
    finally:
        srv.stop()


def pump(q: Any, pairs: int) -> None:
    client = timer.LocalTimerClient(q)
    for i in range(pairs):
        client.acquire(f"s{i % 3}", time.time() + 600)
        client.release(f"s{i % 3}")


def test_sixteen_clients_lose_nothing(queue_and_server: tuple[Any, timer.LocalTimerServer]) -> None:
    q, srv = queue_and_server
    pairs = 300
    procs = [spawn(pump, q, pairs) for _ in range(16)]
    for p in procs:
        p.join(WAIT)
        assert p.exitcode == 0
    wait_until(lambda: srv.stats["requests"] >= 16 * pairs * 2, "every request")
    assert srv.stats["requests"] == 16 * pairs * 2
    assert srv.get_expired_timers(float("inf")) == {}


def test_a_flood_of_requests_is_applied_a_bounded_round_at_a_time() -> None:
    """Requests queued faster than the server applies them are applied a bounded round at a time, so its
    counters (what a benchmark or a caller watching ``stats`` sees) move while it works: a round that drained
    up to 100,000 requests before applying any showed no progress for seconds, which the timer benchmark
    read as requests lost."""
    from tsm.timer import local_timer

    q = CTX.Queue()
    srv = timer.LocalTimerServer(q, max_interval=60, daemon=True)
    flood = 3 * local_timer._DRAIN_MAX
    for i in range(flood):  # releases of scopes never armed: each is one request to apply, none arms a timer
        q.put(timer.TimerRequest(os.getpid(), f"s{i}", -1))
    seen: set[int] = set()

    def done() -> bool:
        n = srv.stats["requests"]
        seen.add(n)
        return n >= flood

    srv.start()
    try:
        wait_until(done, "the whole flood", timeout=WAIT * 4)
    finally:
        srv.stop()
    assert srv.stats["requests"] == flood
    assert len([n for n in seen if 0 < n < flood]) >= 10, sorted(seen)


def _refuse() -> None:
    raise RuntimeError("this object cannot be unpickled")


class Unreadable:
    """Pickled fine by a client, refused when the server unpickles it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, ())


def test_a_round_takes_what_the_queue_holds_keeping_order_and_dropping_the_unreadable() -> None:
    """The fast path of a round (``_take_ready``) gives the items in queue order and drops one it cannot
    unpickle without losing those around it, as ``Queue.get`` one at a time does."""
    from tsm.timer import local_timer

    q = CTX.Queue()
    for i in range(50):
        q.put(("item", i))
    q.put(Unreadable())
    q.put(("item", 50))
    time.sleep(0.2)  # the queue's feeder thread has written them to the pipe
    out: list[Any] = []
    assert local_timer._take_ready(q, 1000, out)
    assert [x for x in out if x is not local_timer._UNREADABLE] == [("item", i) for i in range(51)]
    assert out[50] is local_timer._UNREADABLE
    assert q.empty()


def test_stop_is_prompt_and_clean() -> None:
    q = CTX.Queue()
    srv = timer.LocalTimerServer(q, max_interval=3600)
    srv.start()
    thread = srv._watchdog_thread
    srv.stop()  # woken by a marker on the queue, not after max_interval
    assert thread is not None and not thread.is_alive()


# -- a server written against torch's abstract API keeps working --------------------------------------------------
class DictServer(timer.TimerServer):
    """What a user's own TimerServer subclass looks like (torch's contract, nothing tsm-specific)."""

    def __init__(self, q: Any, max_interval: float) -> None:
        super().__init__(timer.MultiprocessingRequestQueue(q), max_interval)
        self.timers: dict[tuple[int, str], timer.TimerRequest] = {}

    def register_timers(self, timer_requests: list[timer.TimerRequest]) -> None:
        for r in timer_requests:
            if r.expiration_time < 0:
                self.timers.pop((r.worker_id, r.scope_id), None)
            else:
                self.timers[(r.worker_id, r.scope_id)] = r

    def clear_timers(self, worker_ids: set[Any]) -> None:
        self.timers = {k: v for k, v in self.timers.items() if k[0] not in worker_ids}

    def get_expired_timers(self, deadline: float) -> dict[Any, list[timer.TimerRequest]]:
        out: dict[Any, list[timer.TimerRequest]] = {}
        for r in self.timers.values():
            if r.expiration_time <= deadline:
                out.setdefault(r.worker_id, []).append(r)
        return out

    def _reap_worker(self, worker_id: Any) -> bool:
        os.kill(worker_id, signal.SIGKILL)
        return True


def test_user_subclass_of_timer_server_runs_torchs_loop() -> None:
    """A torch-style subclass is served by torch's loop: reaped within about max_interval, stop() prompt."""
    q = CTX.Queue()
    srv = DictServer(q, max_interval=0.05)
    srv.start()
    try:
        p = spawn(hang, q, 0.2)
        p.join(WAIT)
        assert p.exitcode == -signal.SIGKILL
        wait_until(lambda: srv.timers == {}, "the reaped worker's timers to be cleared")
    finally:
        thread = srv._watchdog_thread
        srv.stop()  # the loop waits at most max_interval on the queue, so this returns
        assert thread is not None and not thread.is_alive()
