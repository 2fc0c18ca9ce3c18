#!/usr/bin/env python3
"""Benchmark tsm.timer, side by side with torch.distributed.elastic.timer when torch is importable.

Prints one JSON object per line:

* ``import``: wall time of ``import tsm.timer`` (and of torch's module) in a fresh interpreter, with a warm
  bytecode cache (``cold_compile_ms``: no bytecode cache at all, as under PYTHONDONTWRITEBYTECODE);
* ``expires``: cost of one ``with expires(...)`` block, with and without ``scope``, on a no-op client (the
  API's own overhead) and on a real socket client;
* ``reap_latency``: time from a worker's deadline to the worker being dead (its pidfd turns readable), for
  randomised deadlines, per server and ``max_interval`` (0.01 / 0.1 / 1.0); each worker arms its timer and
  then execs ``sleep`` so that its teardown is negligible;
* ``throughput``: acquire+release pairs per second from 1 and 16 worker processes: calls returned and
  requests processed by the server, and requests lost; and the CPU each processed pair cost in the server's
  process and in the clients (steadier than pairs/s on a shared machine).
* ``abuse`` (tsm only): reap latency of ordinary workers while a hostile client floods the server with
  absurd deadlines (``inf``, ``1e308``, NaN, year 11000) and garbage, and how many bytes the server logged
  meanwhile (issue 11: such requests used to stop reaping and log ~430 KB/s).

Run: ``python benchmarks/timer_bench.py`` (``--quick`` for a shorter run, ``--only throughput`` etc. for one
section).  Linux, about a minute.  Figures depend on load: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import tsm.timer as tt  # noqa: E402

try:
    import torch.distributed.elastic.timer as torch_timer  # noqa: E402

    TORCH: str | None = None
except ImportError as e:  # pragma: no cover - depends on the machine
    torch_timer = None
    TORCH = f"torch not importable ({e}); torch rows skipped"

CTX = mp.get_context("fork")
OURS = ["tsm-local", "tsm-file", "tsm-socket"]
THEIRS = ["torch-local", "torch-file"]


def emit(**row: Any) -> None:
    print(json.dumps(row), flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


# -- servers under test ----------------------------------------------------------------------------------------
class Setup:
    """One server of one implementation plus a factory for clients (called in the worker process)."""

    def __init__(self, impl: str, max_interval: float, tmpdir: str) -> None:
        self.impl = impl
        path = os.path.join(tmpdir, f"{impl}-{os.getpid()}-{random.randrange(1 << 30)}")
        self.server: Any
        self.client: Callable[[], Any]
        if impl == "tsm-local":
            q = CTX.Queue()
            self.server = tt.LocalTimerServer(q, max_interval)
            self.client = lambda: tt.LocalTimerClient(q)
        elif impl == "tsm-file":
            self.server = tt.FileTimerServer(path, "bench", max_interval)
            self.client = lambda: tt.FileTimerClient(path)
        elif impl == "tsm-socket":
            self.server = tt.SocketTimerServer(path, max_interval)
            self.client = lambda: tt.SocketTimerClient(path)
        elif impl == "torch-local":
            assert torch_timer is not None
            q = CTX.Queue()
            self.server = _counting_torch_local(q, max_interval)
            self.client = lambda: torch_timer.LocalTimerClient(q)
        elif impl == "torch-file":
            assert torch_timer is not None
            self.server = torch_timer.FileTimerServer(path, "bench", max_interval)
            # SIGTERM, not SIGKILL: torch's server sends the reaping signal to itself too (see latency_host).
            self.client = lambda: torch_timer.FileTimerClient(path, signal=signal.SIGTERM)
        else:
            raise ValueError(impl)

    def processed(self) -> int:
        if self.impl.startswith("tsm"):
            return int(self.server.stats["requests"])
        if self.impl == "torch-local":
            return int(self.server.count)
        return int(self.server._request_count)


def _counting_torch_local(q: Any, max_interval: float) -> Any:
    assert torch_timer is not None

    class Counting(torch_timer.LocalTimerServer):  # type: ignore[misc, name-defined]
        count = 0

        def register_timers(self, timer_requests: list[Any]) -> None:
            self.count += len(timer_requests)
            super().register_timers(timer_requests)

    return Counting(q, max_interval)


# -- reap latency ---------------------------------------------------------------------------------------------
SLEEP = shutil.which("sleep") or "/bin/sleep"


def latency_worker(make_client: Callable[[], Any], deadline: float) -> None:
    """Arm a timer, then become ``sleep``: same pid and start time, but a tiny process.

    Process teardown then takes microseconds, so "worker dead" measures the server, not the kernel freeing
    a big address space (the benchmark process has torch loaded when torch rows are run).
    """
    client = make_client()
    client.acquire("hang", deadline)
    queue = getattr(client, "_mp_queue", None)
    if queue is not None:  # multiprocessing queues send from a feeder thread: flush before exec
        queue.close()
        queue.join_thread()
    os.execv(SLEEP, ["sleep", "60"])


def latency_host(impl: str, max_interval: float, n: int, tmpdir: str, out: Connection) -> None:
    # torch's FileTimerServer signals its own process after reaping; survive that (exec resets it in workers).
    signal.signal(signal.SIGTERM, lambda *_: None)
    setup = Setup(impl, max_interval, tmpdir)
    setup.server.start()
    time.sleep(0.05)
    rng = random.Random(1234)
    poller = select.poll()
    pending: dict[int, tuple[Any, float]] = {}
    for _ in range(n):
        deadline = time.time() + 0.25 + rng.random() * 0.35
        p = CTX.Process(target=latency_worker, args=(setup.client, deadline), daemon=True)
        p.start()
        pidfd = os.pidfd_open(p.pid)  # readable once the process has exited
        poller.register(pidfd, select.POLLIN)
        pending[pidfd] = (p, deadline)
    latencies: list[float] = []
    end = time.time() + 0.6 + max_interval * 2 + 5
    while pending and time.time() < end:
        for fd, _ev in poller.poll(500):
            latencies.append(time.time() - pending.pop(fd)[1])
            poller.unregister(fd)
            os.close(fd)
    for fd, (p, _) in pending.items():
        p.kill()
        os.close(fd)
    missed = len(pending)
    with contextlib.suppress(Exception):
        setup.server.stop()
    out.send((latencies, missed))


def bench_latency(impls: list[str], intervals: list[float], n: int, tmpdir: str) -> None:
    for impl in impls:
        for mi in intervals:
            here, there = CTX.Pipe()
            host = CTX.Process(target=latency_host, args=(impl, mi, n, tmpdir, there))
            host.start()
            lat, missed = here.recv() if here.poll(60) else ([], n)
            host.join(10)
            if host.is_alive():
                host.kill()
            row: dict[str, Any] = {"bench": "reap_latency", "impl": impl, "max_interval": mi, "workers": n}
            if lat:
                row.update(
                    median_ms=round(statistics.median(lat) * 1e3, 2),
                    p95_ms=round(pct(lat, 0.95) * 1e3, 2),
                    max_ms=round(max(lat) * 1e3, 2),
                )
            row["not_reaped"] = missed
            emit(**row)


# -- abuse: reaping while a hostile client floods the server ------------------------------------------------------
ABSURD = [float("inf"), 1e308, float("nan"), 3e11]


def abuser(impl: str, target: Any, stop: Any) -> None:
    """Sends absurd deadlines and garbage as fast as the server takes them until ``stop`` is set."""

    parent = os.getppid()

    class Until:  # the host set the event, or died without setting it
        @staticmethod
        def is_set() -> bool:
            return bool(stop.is_set()) or os.getppid() != parent

    with contextlib.suppress(OSError):  # the server went away at the end
        _abuse(impl, target, Until)


def _abuse(impl: str, target: Any, stop: Any) -> None:
    import socket
    import struct

    i = 0
    if impl == "tsm-socket":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(target)
        s.recv(4096)  # welcome
        batch = b"".join(struct.pack("<BBHIid", 1, 0, 1, 0, 0, exp) + b"x" for exp in ABSURD * 64)
        while not stop.is_set():
            s.sendall(batch)
            i += 1
            if i % 64 == 0:  # and now and then a connection that breaks the protocol
                bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                bad.connect(target)
                bad.sendall(b"\x07garbage" * 100)
                bad.close()
    elif impl == "tsm-file":
        lines = b"".join(
            b'{"pid": 4194321, "scope_id": "s", "expiration_time": %s, "signal": 9}\n' % v
            for v in (b"Infinity", b"1e308", b"NaN", b"3e11", b"\"soon\"")
        ) + b"garbage\n[[[[\n"
        fd = os.open(target, os.O_WRONLY)
        while not stop.is_set():
            os.write(fd, lines)
    else:
        while not stop.is_set():
            for exp in ABSURD:
                target.put(tt.TimerRequest(os.getpid(), "absurd", exp))
            time.sleep(0.0005)  # a multiprocessing queue has no back-pressure: do not fill memory


class _LogBytes:
    def __init__(self) -> None:
        import logging

        self.bytes = 0
        handler = logging.Handler(logging.WARNING)
        handler.emit = self._emit  # type: ignore[method-assign]
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.handler = handler
        logging.getLogger("tsm.timer").addHandler(handler)

    def _emit(self, record: Any) -> None:
        self.bytes += len(self.handler.format(record)) + 1


def abuse_host(impl: str, n: int, tmpdir: str, out: Connection) -> None:
    setup = Setup(impl, 1.0, tmpdir)
    logged = _LogBytes()
    setup.server.start()
    target: Any = setup.server.path if impl == "tsm-socket" else getattr(setup.server, "_file_path", None)
    if impl == "tsm-local":
        target = setup.server._mp_queue
    stop = CTX.Event()
    flood = CTX.Process(target=abuser, args=(impl, target, stop), daemon=True)
    flood.start()
    time.sleep(0.3)  # the flood is under way
    t0, before = time.time(), logged.bytes
    poller = select.poll()
    pending: dict[int, tuple[Any, float]] = {}
    rng = random.Random(99)
    for _ in range(n):
        deadline = time.time() + 0.5 + rng.random() * 0.3
        p = CTX.Process(target=latency_worker, args=(setup.client, deadline), daemon=True)
        p.start()
        fd = os.pidfd_open(p.pid)
        poller.register(fd, select.POLLIN)
        pending[fd] = (p, deadline)
    latencies: list[float] = []
    end = time.time() + 10
    while pending and time.time() < end:
        for fd, _ev in poller.poll(500):
            latencies.append(time.time() - pending.pop(fd)[1])
            poller.unregister(fd)
            os.close(fd)
    elapsed = time.time() - t0
    for fd, (p, _) in pending.items():
        p.kill()
        os.close(fd)
    stop.set()
    flood.join(5)
    if flood.is_alive():
        flood.kill()
    refused = setup.server.stats["refused"]
    with contextlib.suppress(Exception):
        setup.server.stop()
    out.send((latencies, len(pending), refused, round((logged.bytes - before) / elapsed)))


def bench_abuse(n: int, tmpdir: str) -> None:
    for impl in OURS:
        here, there = CTX.Pipe()
        host = CTX.Process(target=abuse_host, args=(impl, n, tmpdir, there))
        host.start()
        row: dict[str, Any] = {"bench": "abuse", "impl": impl, "workers": n}
        if here.poll(60):
            lat, missed, refused, log_rate = here.recv()
            if lat:
                row.update(median_ms=round(statistics.median(lat) * 1e3, 2), max_ms=round(max(lat) * 1e3, 2))
            row.update(not_reaped=missed, requests_refused=refused, log_bytes_per_s=log_rate)
        else:
            row["error"] = "no result"
        host.join(10)
        if host.is_alive():
            host.kill()
        emit(**row)


# -- throughput ---------------------------------------------------------------------------------------------
def tput_worker(make_client: Callable[[], Any], ready: Any, go: Any, t_end: Any, out: Any) -> None:
    client = make_client()
    if hasattr(client, "sync"):
        client.sync()  # connect before the clock starts
    ready.wait()
    go.wait()
    end = t_end.value
    exp = time.time() + 3600
    acquire, release = client.acquire, client.release
    pairs = ok = failed = 0
    error = ""
    while True:
        for _ in range(64):
            pairs += 1
            try:
                acquire("bench", exp)
                ok += 1
            except Exception as e:
                failed += 1
                error = error or f"{type(e).__name__}: {e}"[:120]
            try:
                release("bench")
                ok += 1
            except Exception as e:
                failed += 1
                error = error or f"{type(e).__name__}: {e}"[:120]
        if time.time() >= end:
            break
    out.put((pairs, ok, failed, error))


def tput_host(impl: str, clients: int, duration: float, tmpdir: str, res: Connection) -> None:
    setup = Setup(impl, 0.1, tmpdir)
    setup.server.start()
    ready = CTX.Barrier(clients + 1)
    go = CTX.Event()
    t_end = CTX.Value("d", 0.0)
    out = CTX.Queue()
    procs = [
        CTX.Process(target=tput_worker, args=(setup.client, ready, go, t_end, out), daemon=True)
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    ready.wait()
    time.sleep(0.1)
    base = setup.processed()
    cpu0 = os.times()
    t0 = time.time()
    t_end.value = t0 + duration
    go.set()
    pairs = ok = failed = 0
    errors: list[str] = []
    for _ in procs:
        a, b, c, err = out.get()
        pairs, ok, failed = pairs + a, ok + b, failed + c
        if err:
            errors.append(err)
    t_clients = time.time() - t0
    # drain: wait until the server has processed everything that was sent (or stops making progress)
    last, last_change, t_done = -1, time.time(), time.time()
    while True:
        done = setup.processed() - base
        now = time.time()
        if done != last:
            last, last_change, t_done = done, now, now
        if done >= ok or now - last_change > 3 or now - t0 > duration + 25:
            break
        time.sleep(0.005)
    for p in procs:
        p.join(5)
    cpu1 = os.times()
    with contextlib.suppress(Exception):
        setup.server.stop()
    # CPU per processed pair, which load changes far less than pairs/s: this process (the server's thread,
    # the main thread mostly waits) and the client processes (their whole short lives, counted once joined).
    done_pairs = max(last / 2, 1)
    server_cpu = cpu1.user + cpu1.system - cpu0.user - cpu0.system
    client_cpu = cpu1.children_user + cpu1.children_system - cpu0.children_user - cpu0.children_system
    res.send(
        {
            "server_cpu_us_per_pair": round(server_cpu / done_pairs * 1e6, 2),
            "client_cpu_us_per_pair": round(client_cpu / done_pairs * 1e6, 2),
            "calls_pairs_per_s": round(pairs / t_clients),
            "processed_pairs_per_s": round(last / 2 / max(t_done - t0, 1e-9)),
            "requests_sent": ok + failed,
            "requests_failed_in_client": failed,
            "requests_processed": last,
            "requests_lost": ok + failed - last,
            **({"client_error_sample": errors[0]} if errors else {}),
        }
    )


def bench_throughput(impls: list[str], client_counts: list[int], duration: float, tmpdir: str) -> None:
    for impl in impls:
        for n in client_counts:
            here, there = CTX.Pipe()
            host = CTX.Process(target=tput_host, args=(impl, n, duration, tmpdir, there))
            host.start()
            row: dict[str, Any] = {"bench": "throughput", "impl": impl, "clients": n, "seconds": duration}
            if here.poll(duration + 60):
                row.update(here.recv())
            else:
                row["error"] = "no result"
            host.join(10)
            if host.is_alive():
                host.kill()
            emit(**row)


# -- expires() cost ------------------------------------------------------------------------------------------
def _time_blocks(make_cm: Callable[[], Any], n: int) -> float:
    for _ in range(min(n, 1000)):
        with make_cm():
            pass
    t = time.perf_counter()
    for _ in range(n):
        with make_cm():
            pass
    return (time.perf_counter() - t) / n * 1e6


def bench_expires(n: int, tmpdir: str) -> None:
    class Null(tt.TimerClient):
        def acquire(self, scope_id: str, expiration_time: float) -> None:
            pass

        def release(self, scope_id: str) -> None:
            pass

    null = Null()
    for label, scope in (("no scope", None), ("scope", "step")):
        us = _time_blocks(lambda s=scope: tt.expires(after=60, scope=s, client=null), n)
        emit(bench="expires", impl="tsm", client="no-op", variant=label, us_per_block=round(us, 2))

    # a real socket client (the server must live in another process: it refuses its own process)
    path = os.path.join(tmpdir, "expires.sock")
    server = tt.SocketTimerServer(path)
    server.start()
    here, there = CTX.Pipe()

    def measure(conn: Connection) -> None:
        client = tt.SocketTimerClient(path)
        res = {}
        for label, scope in (("no scope", None), ("scope", "step")):
            res[label] = _time_blocks(lambda s=scope: tt.expires(after=60, scope=s, client=client), n)
        client.sync()
        conn.send(res)

    p = CTX.Process(target=measure, args=(there,))
    p.start()
    res = here.recv()
    p.join()
    server.stop()
    for label, us in res.items():
        emit(bench="expires", impl="tsm", client="socket", variant=label, us_per_block=round(us, 2))

    if torch_timer is None:
        emit(bench="expires", impl="torch", skipped=TORCH)
        return

    class TorchNull(torch_timer.TimerClient):  # type: ignore[misc, name-defined]
        def acquire(self, scope_id: str, expiration_time: float) -> None:
            pass

        def release(self, scope_id: str) -> None:
            pass

    tnull = TorchNull()
    for label, scope in (("no scope", None), ("scope", "step")):
        us = _time_blocks(
            lambda s=scope: torch_timer.expires(after=60, scope=s, client=tnull), max(n // 10, 500)
        )
        emit(bench="expires", impl="torch", client="no-op", variant=label, us_per_block=round(us, 2))


# -- import time ---------------------------------------------------------------------------------------------
def _import_ms(module: str, env: dict[str, str], runs: int) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print((time.perf_counter() - t) * 1e3)"
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        out.append(float(r.stdout.strip()))
    return statistics.median(out)


def bench_import(tmpdir: str, runs: int) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    warm = dict(env, PYTHONPYCACHEPREFIX=os.path.join(tmpdir, "pyc"))
    warm.pop("PYTHONDONTWRITEBYTECODE", None)
    _import_ms("tsm.timer", warm, 1)  # fill the bytecode cache
    cold = dict(env, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=os.path.join(tmpdir, "none"))
    emit(
        bench="import",
        impl="tsm",
        module="tsm.timer",
        ms_median=round(_import_ms("tsm.timer", warm, runs), 2),
        cold_compile_ms=round(_import_ms("tsm.timer", cold, 3), 2),
    )
    if torch_timer is None:
        emit(bench="import", impl="torch", skipped=TORCH)
    else:
        emit(
            bench="import",
            impl="torch",
            module="torch.distributed.elastic.timer",
            ms_median=round(_import_ms("torch.distributed.elastic.timer", env, 3), 2),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer workers and shorter runs")
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes: checks that the benchmark still runs")
    ap.add_argument("--no-torch", action="store_true", help="skip torch rows even if torch is importable")
    sections = ["import", "expires", "latency", "throughput", "abuse"]
    ap.add_argument("--only", action="append", choices=sections, help="run only this section (repeatable)")
    args = ap.parse_args()
    run = set(args.only or sections)
    global torch_timer, TORCH
    if args.no_torch:
        torch_timer, TORCH = None, "--no-torch given"
    impls = OURS + (THEIRS if torch_timer is not None else [])
    emit(
        bench="info",
        python=sys.version.split()[0],
        cpus=os.cpu_count(),
        torch=None if torch_timer is None else __import__("torch").__version__,
        note=TORCH,
    )
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="tsm-timer-bench-") as tmpdir:
        if "import" in run:
            bench_import(tmpdir, 1 if args.tiny else 3 if args.quick else 7)
        if "expires" in run:
            bench_expires(200 if args.tiny else 5_000 if args.quick else 20_000, tmpdir)
        if "latency" in run:
            bench_latency(impls, [0.1] if args.tiny else [0.01, 0.1, 1.0], 2 if args.tiny else 6 if args.quick else 10,
                          tmpdir)
            if torch_timer is None:
                emit(bench="reap_latency", impl="torch", skipped=TORCH)
        if "throughput" in run:
            bench_throughput(impls, [1, 2] if args.tiny else [1, 16], 0.1 if args.tiny else 0.5 if args.quick else 1.0,
                             tmpdir)
            if torch_timer is None:
                emit(bench="throughput", impl="torch", skipped=TORCH)
        if "abuse" in run:
            bench_abuse(2 if args.tiny else 6 if args.quick else 10, tmpdir)
    emit(bench="done", seconds=round(time.time() - t_start, 1))


if __name__ == "__main__":
    main()
