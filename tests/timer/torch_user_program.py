"""A small program written against torch's timer API; the module it uses is the first argument.

``python torch_user_program.py torch.distributed.elastic.timer`` and ``... tsm.timer`` must print the same
JSON: that is what "change the import and it works" means.  It exercises what a torch user's code does:
``LocalTimerServer`` with ``expires`` in child processes (a hung worker, one that finishes in time, nested
scopes), ``start()``/``stop()`` twice, ``FileTimerServer`` with ``FileTimerClient`` (a custom signal), a
``FileTimerClient`` with no server, ``expires`` with no client configured, ``worker_id`` values that are not
pids, and a ``TimerServer`` subclass over a ``RequestQueue`` of its own, whose hook calls are recorded.
Only observable outcomes are printed (exit codes, exception classes, hook calls), never timings.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Any

IMPL = sys.argv[1]
timer: Any = importlib.import_module(IMPL)
api: Any = importlib.import_module(f"{IMPL}.api")
local_timer: Any = importlib.import_module(f"{IMPL}.local_timer")
file_based: Any = importlib.import_module(f"{IMPL}.file_based_local_timer")
CTX = mp.get_context("fork")
WAIT = 30.0


def hung(q: Any) -> None:
    timer.configure(local_timer.LocalTimerClient(q))
    with timer.expires(after=0.3):
        time.sleep(WAIT)


def in_time(q: Any) -> None:
    timer.configure(local_timer.LocalTimerClient(q))
    with timer.expires(after=WAIT):
        time.sleep(0.05)


def nested(q: Any) -> None:
    timer.configure(local_timer.LocalTimerClient(q))
    with timer.expires(after=WAIT, scope="outer"), timer.expires(after=0.3, scope="inner"):
        time.sleep(WAIT)


def file_hung(path: str) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # the parent ignores it (see main)
    with timer.expires(after=0.3, client=file_based.FileTimerClient(path, signal=signal.SIGUSR1)):
        time.sleep(WAIT)


def run(target: Any, *args: Any) -> Any:
    p = CTX.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def exit_codes(procs: dict[str, Any]) -> dict[str, Any]:
    for p in procs.values():
        p.join(WAIT)
    return {name: p.exitcode for name, p in procs.items()}


class ListQueue(api.RequestQueue):  # type: ignore[misc]
    """A RequestQueue of the user's own (not a multiprocessing queue), recording how it is called."""

    def __init__(self, calls: list[Any]) -> None:
        self.items: list[Any] = []
        self.calls = calls
        self.lock = threading.Lock()

    def size(self) -> int:
        self.calls.append(["size"])
        return len(self.items)

    def get(self, size: int, timeout: float) -> list[Any]:
        self.calls.append(["get", size, timeout])
        with self.lock:
            out, self.items = self.items[:size], self.items[size:]
        return out


class RecordingServer(api.TimerServer):  # type: ignore[misc]
    """A TimerServer subclass as torch users write one: its own table, reaping with os.kill."""

    def __init__(self, queue: ListQueue, calls: list[Any]) -> None:
        super().__init__(queue, max_interval=0.05)
        self.calls = calls
        self.table: dict[Any, Any] = {}

    def register_timers(self, timer_requests: list[Any]) -> None:
        self.calls.append(["register_timers", sorted(str(r.scope_id) for r in timer_requests)])
        for r in timer_requests:
            if r.expiration_time < 0:
                self.table.pop((r.worker_id, r.scope_id), None)
            else:
                self.table[(r.worker_id, r.scope_id)] = r

    def clear_timers(self, worker_ids: set[Any]) -> None:
        self.calls.append(["clear_timers", sorted("victim" if isinstance(w, int) else w for w in worker_ids)])
        self.table = {k: v for k, v in self.table.items() if k[0] not in worker_ids}

    def get_expired_timers(self, deadline: float) -> dict[Any, list[Any]]:
        self.calls.append(["get_expired_timers"])
        out: dict[Any, list[Any]] = {}
        for r in self.table.values():
            if r.expiration_time <= deadline:
                out.setdefault(r.worker_id, []).append(r)
        return out

    def _reap_worker(self, worker_id: Any) -> bool:
        self.calls.append(["_reap_worker", "victim" if isinstance(worker_id, int) else worker_id])
        if worker_id == "broken":
            raise RuntimeError("a reaper that raises counts as reaped")
        os.kill(worker_id, signal.SIGKILL)
        return True


def main() -> None:
    signal.signal(signal.SIGUSR1, lambda *_: None)  # torch's FileTimerServer signals its own process too
    os.environ.pop("TSM_TIMER_SOCKET", None)
    out: dict[str, Any] = {}

    # expires() with nothing configured
    try:
        with timer.expires(after=1):
            pass
        out["unconfigured"] = "no error"
    except RuntimeError:
        out["unconfigured"] = "RuntimeError"

    # LocalTimerServer: started twice, stopped twice
    q = CTX.Queue()
    server = timer.LocalTimerServer(q, max_interval=0.05)
    server.start()
    server.start()
    out["local"] = exit_codes({"hung": run(hung, q), "in_time": run(in_time, q), "nested": run(nested, q)})
    server.register_timers([api.TimerRequest("worker-a", "s", time.time() + 3600)])  # any worker id
    out["non_pid_ids"] = sorted(server.get_expired_timers(float("inf")))
    server.clear_timers({"worker-a"})
    out["after_clear"] = server.get_expired_timers(float("inf"))
    server.stop()
    server.stop()

    # FileTimerServer / FileTimerClient
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "timers.fifo")
    fserver = timer.FileTimerServer(path, "run-1", max_interval=0.05)
    fserver.start()
    out["file"] = exit_codes({"hung": run(file_hung, path)})
    fserver.stop()
    fserver.stop()
    try:
        file_based.FileTimerClient(os.path.join(tmp, "nobody.fifo")).acquire("x", time.time() + 1)
        out["no_server"] = "no error"
    except BrokenPipeError:
        out["no_server"] = "BrokenPipeError"

    # A user's TimerServer subclass over a RequestQueue of its own: one round, driven directly
    calls: list[Any] = []
    queue = ListQueue(calls)
    custom = RecordingServer(queue, calls)
    victim = run(time.sleep, WAIT)
    queue.items = [
        api.TimerRequest(victim.pid, "late", time.time() - 1),
        api.TimerRequest("broken", "late", time.time() - 1),
        api.TimerRequest(victim.pid, "fine", time.time() + 3600),
    ]
    custom._run_watchdog()
    victim.join(WAIT)
    out["custom_calls"] = calls
    out["custom_victim"] = victim.exitcode
    out["custom_table"] = sorted(str(k[1]) for k in custom.table)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
