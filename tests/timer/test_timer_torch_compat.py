"""Code and tests written for ``torch.distributed.elastic.timer`` keep working after changing the import.

Each test here is written the way a torch user writes it (subclasses of ``TimerServer``/``RequestQueue``,
``start``/``stop`` twice, a client with no server, ``mock.patch`` on the module's functions), against
``tsm.timer``.  The tests marked ``torch`` run the same user program against torch and tsm and compare what
can be observed, and compare the modules' public names and signatures.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import tsm.timer as timer
from testutil import spawn, wait_until
from tsm.timer import api, file_based_local_timer, local_timer

CTX = mp.get_context("fork")
WAIT = 30.0
HERE = Path(__file__).resolve().parent
SRC = Path(timer.__file__).resolve().parents[2]
PKG = Path(timer.__file__).resolve().parent


def hang(q: Any, after: float) -> None:
    timer.configure(timer.LocalTimerClient(q))
    with timer.expires(after=after):
        time.sleep(60)


def put_requests(q: Any, requests: list[timer.TimerRequest]) -> None:
    """Put requests from a child process (as workers do); once it exited, they are all readable."""
    for r in requests:
        q.put(r)


# -- module names ----------------------------------------------------------------------------------------
def test_torchs_module_and_public_names_exist() -> None:
    from tsm.timer.api import RequestQueue, TimerClient, TimerRequest, TimerServer, configure, expires
    from tsm.timer.debug_info_logging import log_debug_info_for_expired_timers as logged
    from tsm.timer.file_based_local_timer import (
        FileTimerClient,
        FileTimerRequest,
        FileTimerServer,
        log_debug_info_for_expired_timers,
    )
    from tsm.timer.local_timer import LocalTimerClient, LocalTimerServer, MultiprocessingRequestQueue

    assert configure is timer.configure and expires is timer.expires
    assert log_debug_info_for_expired_timers is logged
    assert issubclass(LocalTimerServer, TimerServer) and issubclass(MultiprocessingRequestQueue, RequestQueue)
    assert issubclass(FileTimerRequest, TimerRequest)
    assert all(issubclass(c, TimerClient) for c in (FileTimerClient, LocalTimerClient))
    assert FileTimerServer.is_process_running(os.getpid())


def _imports(path: Path) -> set[str]:
    """Modules of the package that ``path`` imports anywhere (functions included), except for type checking."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip.update(id(n) for sub in node.body for n in ast.walk(sub))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module)
            else:
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tsm.timer."):
            out.add(node.module.removeprefix("tsm.timer."))  # type: ignore[union-attr]
    return out


def test_no_import_cycle_in_the_package() -> None:
    """Issue 14: api.py is only the contract; configure/expires have their own module; no cycle, even lazy."""
    graph = {p.stem: _imports(p) for p in PKG.glob("*.py") if p.stem != "__init__"}
    assert graph["api"] <= {"_expires", "_log"}
    assert "socket_timer" not in graph["_expires"]
    seen: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if seen.get(node) == 1:
            raise AssertionError(f"import cycle: {' -> '.join([*path, node])}")
        if seen.get(node) == 2:
            return
        seen[node] = 1
        for nxt in graph.get(node, ()):
            visit(nxt, [*path, node])
        seen[node] = 2

    for mod in graph:
        visit(mod, [])


def test_importing_the_api_alone_loads_no_server() -> None:
    code = "import sys, tsm.timer.api\nprint(sorted(m for m in sys.modules if m.startswith('tsm.timer')))"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    # the package's __init__ runs first (as for any submodule); the API itself pulls in nothing else
    assert "tsm.timer.api" in out.stdout and "tsm.timer._expires" in out.stdout


# -- start/stop twice -------------------------------------------------------------------------------------
def test_local_server_start_twice_stop_twice_and_restart() -> None:
    q = CTX.Queue()
    server = timer.LocalTimerServer(q, max_interval=0.05)
    server.stop()  # never started: nothing to do
    server.start()
    thread = server._watchdog_thread
    server.start()  # torch tolerates it
    assert server._watchdog_thread is thread
    server.stop()
    server.stop()
    assert thread is not None and not thread.is_alive()
    server.start()  # and runs again after a stop, as torch's does
    try:
        p = spawn(hang, q, 0.1)
        p.join(WAIT)
        assert p.exitcode == -signal.SIGKILL
    finally:
        server.stop()


def test_file_server_start_twice_stop_twice(tmp_path: Path) -> None:
    events: list[str] = []
    path = str(tmp_path / "fifo")
    server = timer.FileTimerServer(path, "run", max_interval=0.05, log_event=lambda name, req: events.append(name))
    server.start()
    server.start()
    server.stop()
    server.stop()
    assert events == ["watchdog started", "watchdog stopped", "watchdog stopped"]  # each stop() reports, as in torch
    assert not os.path.exists(path)


def test_socket_server_start_twice_stop_twice(tmp_path: Path) -> None:
    server = timer.SocketTimerServer(str(tmp_path / "s"))
    server.start()
    server.start()
    server.stop()
    server.stop()


# -- a client without a server -----------------------------------------------------------------------------
def test_file_client_without_server_raises_broken_pipe(tmp_path: Path) -> None:
    client = timer.FileTimerClient(str(tmp_path / "nobody.fifo"))
    try:
        client.acquire("step", time.time() + 10)
    except BrokenPipeError as e:  # what torch's client raises; torch users catch this
        assert isinstance(e, timer.TimerServerUnavailableError)
    else:
        raise AssertionError("no error without a server")


def test_file_client_whose_server_stopped_raises_broken_pipe(tmp_path: Path) -> None:
    path = str(tmp_path / "fifo")
    server = timer.FileTimerServer(path, "run")
    server.start()
    client = timer.FileTimerClient(path)
    client.acquire("a", time.time() + 600)
    server.stop()
    with pytest.raises(BrokenPipeError):
        client.release("a")


def test_socket_client_without_server_raises_broken_pipe(tmp_path: Path) -> None:
    client = timer.SocketTimerClient(str(tmp_path / "nobody.sock"), connect_timeout=0.1)
    with pytest.raises(BrokenPipeError):
        client.acquire("a", time.time() + 1)


# -- a TimerServer subclass written for torch -------------------------------------------------------------------
class FixedQueue(timer.RequestQueue):
    """torch's api tests' kind of queue: always two requests."""

    def size(self) -> int:
        return 2

    def get(self, size: int, timeout: float) -> list[timer.TimerRequest]:
        return [timer.TimerRequest(1, "test_1", 0), timer.TimerRequest(2, "test_2", 0)]


class TableServer(timer.TimerServer):
    def __init__(self, request_queue: timer.RequestQueue, max_interval: float) -> None:
        super().__init__(request_queue, max_interval)

    def register_timers(self, timer_requests: list[timer.TimerRequest]) -> None:
        pass

    def clear_timers(self, worker_ids: set[Any]) -> None:
        pass

    def get_expired_timers(self, deadline: float) -> dict[Any, list[timer.TimerRequest]]:
        return {i: [timer.TimerRequest(i, f"test_{i}", 0)] for i in (1, 2)}

    def _reap_worker(self, worker_id: Any) -> bool:
        if worker_id == 1:
            raise RuntimeError("a reaper that raises: the worker counts as reaped")
        return True


def test_run_watchdog_calls_the_hooks_as_torch_does() -> None:
    max_interval = 1
    queue = mock.Mock(wraps=FixedQueue())
    server = TableServer(queue, max_interval)
    with (
        mock.patch.object(TableServer, "register_timers") as register,
        mock.patch.object(TableServer, "clear_timers") as clear,
    ):
        server._run_watchdog()
    queue.size.assert_called_once()
    queue.get.assert_called_with(2, max_interval)  # positional, max_interval as given
    register.assert_called_with(FixedQueue().get(2, 1))
    clear.assert_called_with({1, 2})


def test_watchdog_loop_calls_run_watchdog_until_stopped() -> None:
    server = TableServer(FixedQueue(), 0.01)
    with mock.patch.object(server, "_run_watchdog", wraps=server._run_watchdog) as rounds:
        server.start()
        wait_until(lambda: rounds.call_count >= 5, "rounds of the watchdog loop")
        server.stop()
    done = rounds.call_count
    time.sleep(0.05)
    assert rounds.call_count == done


class LoggingLocalServer(timer.LocalTimerServer):
    """A torch user's LocalTimerServer subclass that notes whom it reaps, then reaps as the base does."""

    def __init__(self, mp_queue: Any, max_interval: float, noted: list[Any]) -> None:
        super().__init__(mp_queue, max_interval)
        self.noted = noted

    def _reap_worker(self, worker_id: Any) -> bool:
        self.noted.append(worker_id)
        return super()._reap_worker(worker_id)


def test_local_server_subclass_hooks_are_called() -> None:
    q = CTX.Queue()
    noted: list[Any] = []
    server = LoggingLocalServer(q, 0.05, noted)
    server.start()
    try:
        p = spawn(hang, q, 0.1)
        p.join(WAIT)
        assert p.exitcode == -signal.SIGKILL
        assert noted == [p.pid]
    finally:
        server.stop()


def test_patching_a_hook_on_a_running_local_server() -> None:
    q = CTX.Queue()
    server = timer.LocalTimerServer(q, max_interval=0.05)
    server.start()
    try:
        with mock.patch.object(server, "register_timers", wraps=server.register_timers) as register:
            # the round in progress was the fast one; every round after it calls the hook (torch's loop)
            wait_until(lambda: register.called, "a round of torch's loop")
            p = spawn(hang, q, 0.1)
            p.join(WAIT)
            assert p.exitcode == -signal.SIGKILL
        seen = [r for call in register.call_args_list for r in call.args[0]]
        assert any(r.worker_id == p.pid and r.expiration_time > 0 for r in seen)
    finally:
        server.stop()


def test_local_server_round_driven_directly_with_fake_pids() -> None:
    """torch's own tests drive ``_run_watchdog()`` with made-up (negative) pids and read ``_timers``."""
    q = CTX.Queue()
    server = timer.LocalTimerServer(q, max_interval=0.01)
    server._run_watchdog()  # an empty queue is fine
    now = time.time()
    requests = [
        timer.TimerRequest(-3, "test1", now + 600),
        timer.TimerRequest(-3, "test2", now - 1),  # expired: all timers of -3 go
        timer.TimerRequest(-2, "test1", now + 600),
        timer.TimerRequest(-1, "test1", now + 600),
        timer.TimerRequest(-1, "test1", -1),  # released
        timer.TimerRequest(-1, "never-armed", -1),  # a vacuous release
    ]
    p = spawn(put_requests, q, requests)
    p.join(WAIT)
    wait_until(lambda: (server._run_watchdog(), server.stats["requests"] == len(requests))[1], "the requests")
    assert set(server._timers) == {(-2, "test1")}
    assert server.stats["refused"] == 1 and server.stats["reaped"] == 0  # -3 is never signalled


# -- FileTimerServer ------------------------------------------------------------------------------------------
def file_hang(path: str, after: float) -> None:
    with timer.expires(after=after, client=timer.FileTimerClient(path)):
        time.sleep(60)


def test_log_debug_info_for_expired_timers_is_called(tmp_path: Path) -> None:
    path = str(tmp_path / "fifo")
    server = timer.FileTimerServer(path, "run-42")
    with mock.patch.object(file_based_local_timer, "log_debug_info_for_expired_timers") as debug_info:
        server.start()
        try:
            p = spawn(file_hang, path, 0.1)
            p.join(WAIT)
            assert p.exitcode == -signal.SIGKILL
            wait_until(lambda: debug_info.called, "the debug info")
        finally:
            server.stop()
    run_id, expired = debug_info.call_args.args
    assert run_id == "run-42" and list(expired) == [p.pid]
    (line,) = expired[p.pid]
    assert json.loads(line)["pid"] == p.pid and json.loads(line)["signal"] == signal.SIGKILL


def test_log_debug_info_for_expired_timers_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tsm.timer"):
        file_based_local_timer.log_debug_info_for_expired_timers("r", {})
        assert caplog.records == []
        file_based_local_timer.log_debug_info_for_expired_timers("r", {12: ["{}"]})
    assert "r" in caplog.records[0].getMessage() and "12" in caplog.records[0].getMessage()


class KillingFileServer(timer.FileTimerServer):
    """A FileTimerServer subclass with its own ``_reap_worker(worker_pid, signal)``, torch's hook."""

    reaped: list[tuple[int, int]] = []

    def _reap_worker(self, worker_pid: int, signal: int) -> bool:
        self.reaped.append((worker_pid, signal))
        os.kill(worker_pid, signal)
        return True


def test_file_server_subclass_reap_worker_is_called(tmp_path: Path) -> None:
    path = str(tmp_path / "fifo")
    server = KillingFileServer(path, "run")
    server.start()
    try:
        p = spawn(file_hang, path, 0.1)
        p.join(WAIT)
        assert p.exitcode == -signal.SIGKILL
        assert KillingFileServer.reaped == [(p.pid, signal.SIGKILL)]
    finally:
        server.stop()


def test_multiprocessing_request_queue_never_returns_the_wake_marker() -> None:
    q = CTX.Queue()
    server = timer.LocalTimerServer(q)
    server._wake()
    rq = local_timer.MultiprocessingRequestQueue(q)
    assert rq.get(1, timeout=WAIT) == []  # the marker ends the wait and is not handed out


# -- side by side with torch --------------------------------------------------------------------------------
def _run_program(module: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TSM_TIMER_SOCKET"}
    env["PYTHONPATH"] = str(SRC)
    out = subprocess.run(
        [sys.executable, str(HERE / "torch_user_program.py"), module],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.torch
def test_same_program_same_behaviour_with_torch_and_tsm() -> None:
    results: dict[str, dict[str, Any]] = {}

    def run(module: str) -> None:
        results[module] = _run_program(module)

    threads = [threading.Thread(target=run, args=(m,)) for m in ("torch.distributed.elastic.timer", "tsm.timer")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ours, theirs = results["tsm.timer"], results["torch.distributed.elastic.timer"]
    assert ours == theirs
    # and what they agree on is what a user expects (so the comparison is not vacuous)
    assert ours["local"] == {"hung": -signal.SIGKILL, "in_time": 0, "nested": -signal.SIGKILL}
    assert ours["file"] == {"hung": -signal.SIGUSR1}
    assert ours["no_server"] == "BrokenPipeError" and ours["unconfigured"] == "RuntimeError"
    assert ours["custom_victim"] == -signal.SIGKILL


TORCH_MODULES = ["api", "local_timer", "file_based_local_timer"]
# Private methods that torch users override or call; they must exist with the same parameters.
TORCH_HOOKS = {
    "TimerServer": ["_reap_worker", "_reap_worker_no_throw", "_run_watchdog", "_watchdog_loop", "_get_scopes"],
    "LocalTimerServer": ["_reap_worker", "_run_watchdog", "_watchdog_loop"],
    "FileTimerServer": ["_reap_worker"],
    "FileTimerClient": ["_send_request"],
}


def _params(fn: Any) -> list[str]:
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


@pytest.mark.torch
@pytest.mark.parametrize("name", TORCH_MODULES)
def test_public_names_and_signatures_match_torch(name: str) -> None:
    theirs = importlib.import_module(f"torch.distributed.elastic.timer.{name}")
    ours = importlib.import_module(f"tsm.timer.{name}")
    for attr in theirs.__all__:
        assert hasattr(ours, attr), f"tsm.timer.{name} lacks {attr}"
        t, o = getattr(theirs, attr), getattr(ours, attr)
        if inspect.isclass(t):
            methods = [m for m in vars(t) if not m.startswith("_") and callable(getattr(t, m))]
            for m in [*methods, "__init__", *TORCH_HOOKS.get(attr, [])]:
                assert hasattr(o, m), f"{attr}.{m} is missing"
                assert _params(getattr(o, m)) == _params(getattr(t, m)), f"{attr}.{m}"
        elif callable(t):
            assert _params(o) == _params(t), attr
    for attr in dir(theirs):  # e.g. log_debug_info_for_expired_timers, imported into torch's module
        fn = getattr(theirs, attr)
        if not attr.startswith("_") and inspect.isfunction(fn) and fn.__module__.startswith(theirs.__package__):
            assert hasattr(ours, attr), f"tsm.timer.{name} lacks {attr}"
    assert set(theirs.__all__) <= set(getattr(ours, "__all__", ()))
    assert api.TimerServer is timer.TimerServer
