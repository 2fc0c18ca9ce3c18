"""The torch-compatible API surface: requests, abstract classes, configure/expires, import cost rules."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

import tsm.timer as timer
from tsm.errors import TimerError, TsmError
from tsm.timer import _expires as api

CTX = mp.get_context("fork")
WAIT = 30.0
SRC = str(Path(timer.__file__).resolve().parents[2])


@pytest.fixture(autouse=True)
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(api.TIMER_SOCKET_ENV, raising=False)
    monkeypatch.setattr(api, "_timer_client", None)
    monkeypatch.setattr(api, "_env_client", None)
    yield


def test_timer_request_value_semantics() -> None:
    r = timer.TimerRequest(10, "scope", 3.5)
    assert (r.worker_id, r.scope_id, r.expiration_time) == (10, "scope", 3.5)
    assert r == timer.TimerRequest(10, "scope", 3.5)
    assert r != timer.TimerRequest(10, "scope", -1)
    assert r != "not a request"
    assert not hasattr(r, "__dict__")
    assert "scope" in repr(r)


def test_abstract_classes() -> None:
    for cls in (timer.TimerClient, timer.TimerServer, timer.RequestQueue):
        with pytest.raises(TypeError):
            cls()  # type: ignore[abstract, call-arg]


def test_expires_without_client_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="configure") as info, timer.expires(after=1):
        pass
    assert isinstance(info.value, TimerError) and isinstance(info.value, TsmError)


def test_multiprocessing_request_queue_contract() -> None:
    q = CTX.Queue()
    rq = timer.MultiprocessingRequestQueue(q)
    for i in range(5):
        q.put(timer.TimerRequest(i, "s", i))
    assert rq.size() == 5
    assert [r.worker_id for r in rq.get(3, timeout=WAIT)] == [0, 1, 2]
    assert [r.worker_id for r in rq.get(2, timeout=WAIT)] == [3, 4]
    assert rq.get(1, timeout=0.01) == []


def test_expires_contract_through_a_real_server(tmp_path: Path) -> None:
    """Scope used verbatim, deadline = now + after, release on exit even when the block raises."""
    path = str(tmp_path / "t.sock")
    with timer.SocketTimerServer(path) as srv:
        here, there = CTX.Pipe()

        def worker(conn: Connection) -> None:
            client = timer.SocketTimerClient(path)
            timer.configure(client)
            before = time.time()
            with timer.expires(after=100, scope="my-scope"):
                client.sync()
                conn.send(before)
                conn.recv()
            try:
                with timer.expires(after=100, scope="raising"):
                    raise ValueError("boom")
            except ValueError:
                pass

            @timer.expires(after=100, scope="decorated")
            def decorated(x: int) -> int:
                client.sync()
                conn.send("in decorated")
                conn.recv()
                return x * 2

            assert decorated(21) == 42
            client.sync()
            conn.send("done")

        p = CTX.Process(target=worker, args=(there,), daemon=True)
        p.start()
        before = here.recv()
        (req,) = srv.get_expired_timers(float("inf"))[p.pid]
        assert req.scope_id == "my-scope"
        assert before + 100 <= req.expiration_time <= time.time() + 100
        here.send("go")
        assert here.recv() == "in decorated"
        assert [r.scope_id for r in srv.get_expired_timers(float("inf"))[p.pid]] == ["decorated"]
        here.send("go")
        assert here.recv() == "done"
        p.join(WAIT)
        assert p.exitcode == 0
        assert srv.get_expired_timers(float("inf")) == {}
        assert srv.stats["acquired"] == srv.stats["released"] == 3


def test_generated_scopes_are_unique_and_cheap_to_make(tmp_path: Path) -> None:
    path = str(tmp_path / "t.sock")
    with timer.SocketTimerServer(path) as srv:
        here, there = CTX.Pipe()

        def worker(conn: Connection) -> None:
            client = timer.SocketTimerClient(path)

            def recurse(n: int) -> None:
                with timer.expires(after=600, client=client):  # same line every time
                    if n:
                        recurse(n - 1)
                    else:
                        client.sync()
                        conn.send("deep")
                        conn.recv()

            recurse(4)
            conn.send("out")

        p = CTX.Process(target=worker, args=(there,), daemon=True)
        p.start()
        assert here.recv() == "deep"
        scopes = [r.scope_id for r in srv.get_expired_timers(float("inf"))[p.pid]]
        assert len(set(scopes)) == 5
        here.send("go")
        assert here.recv() == "out"
        p.join(WAIT)


def test_env_default_client_is_built_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "t.sock")
    with timer.SocketTimerServer(path) as srv:
        monkeypatch.setenv(api.TIMER_SOCKET_ENV, path)

        def worker() -> None:
            with timer.expires(after=0.1):
                time.sleep(60)

        p = CTX.Process(target=worker, daemon=True)
        p.start()
        p.join(WAIT)
        assert p.exitcode == -signal.SIGKILL
        assert srv.stats["reaped"] == 1
    assert api._env_client is None  # built lazily, in the child only


def test_configure_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(api.TIMER_SOCKET_ENV, str(tmp_path / "nobody-listens.sock"))
    q = CTX.Queue()
    with_server = timer.LocalTimerServer(q)
    with_server.start()
    try:

        def worker() -> None:
            timer.configure(timer.LocalTimerClient(q))
            with timer.expires(after=0.1):
                time.sleep(60)

        p = CTX.Process(target=worker, daemon=True)
        p.start()
        p.join(WAIT)
        assert p.exitcode == -signal.SIGKILL
    finally:
        with_server.stop()


def test_import_is_stdlib_only() -> None:
    code = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import tsm.timer\n"
        "new = sorted(set(sys.modules) - before)\n"
        "print(json.dumps(new))\n"
    )
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    new = json.loads(out.stdout)
    assert "tsm.timer" in new
    stdlib = sys.stdlib_module_names
    foreign = [m for m in new if m.split(".")[0] not in stdlib and m.split(".")[0] != "tsm"]
    assert foreign == []
    ours = [m for m in new if m.split(".")[0] == "tsm"]
    assert all(m in ("tsm", "tsm.errors") or m.startswith("tsm.timer") for m in ours), ours
    assert "torch" not in new
