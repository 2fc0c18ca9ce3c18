"""Hooks on state changes (:mod:`tsm.runner.hooks`) on the real local scheduler, through ``get_runner()``.

A loopback HTTP server started by the test receives the events; it refuses each event's first delivery, so
every event is proven retried, and a receiver that drops repeats by id sees exactly one per transition. The
apps are held by fifo gates (events, not sleeps); the launcher is killed with SIGKILL before its app ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from testutil import everything_under, store_text, wait_until
from tsm.components.utils import sh
from tsm.errors import ConfigError, InvalidRunOptionError
from tsm.runner import hooks
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppState
from tsm.util import daemon

HANG = 120.0  # seconds: a guard against a hang, never a performance claim


class Receiver:
    """A loopback webhook that answers 500 to the first delivery of each event id, then 200."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.keys: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    first = all(p["id"] != body["id"] for p in outer.posts)
                    outer.posts.append(body)
                    outer.keys.append(self.headers["Idempotency-Key"])
                self.send_response(500 if first else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def events(self) -> list[dict[str, Any]]:
        """Each event once (by id), in the order first seen."""
        with self.lock:
            return list({p["id"]: p for p in self.posts}.values())

    def ends(self, state: str) -> bool:
        return any(e["new"] == state for e in self.events())


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner("hooks") as r:
        yield r


def _gate(folder: Path) -> Path:
    fifo = folder / f"gate-{os.urandom(3).hex()}"
    os.mkfifo(fifo)
    return fifo


def _open(fifo: Path) -> None:
    with open(fifo, "w") as f:  # blocks until the replica reads it
        f.write("go\n")


def _helper_ends(handle: str) -> None:
    lock = hooks.hook_dir(handle) / hooks.LOCK
    assert daemon.wait_released(daemon.start_lock(lock), HANG), "the hook's helper did not start"
    assert daemon.wait_released(lock, HANG), "the hook's helper did not end"


def _chain(events: list[dict[str, Any]], handle: str, last: str) -> list[str]:
    """The states the events walk through, checked to be one transition each, numbered, from UNSUBMITTED."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), events
    assert [e["id"] for e in events] == [f"{handle}#{e['seq']}" for e in events]
    assert all(e["handle"] == handle for e in events)
    walk = ["UNSUBMITTED"]
    for e in events:
        assert e["old"] == walk[-1] and e["new"] != e["old"], events
        walk.append(e["new"])
    assert walk[-1] == last, events
    return walk


def test_a_target_is_checked_and_shown_without_its_path() -> None:
    assert hooks.check("https://hooks.example.org/T0K3N?x=1") == "https://hooks.example.org/T0K3N?x=1"
    assert hooks.describe("https://hooks.example.org/T0K3N?x=1") == "https://hooks.example.org/..."
    assert hooks.describe("notify-send --urgency=low") == "notify-send ..."
    assert hooks.check("curl -d x=1 https://h/p") and hooks.describe("curl -d x=1 https://h/p") == "curl ..."
    for bad, why in (("ftp://host/x", "not an http"), ("http:///path", "not an http"), ("  ", "expected a command"),
                     ("say 'unbalanced", "cannot be split")):
        with pytest.raises(InvalidRunOptionError, match=why):
            hooks.check(bad)


LAUNCH = """
import os, signal, sys
from tsm.components.utils import sh
from tsm.runner.api import get_runner
r = get_runner("hooks")
h = r.run(sh(f"read x < {sys.argv[1]}; echo done"), "local", cfg={"on_state": sys.argv[2]})
print(h, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_webhook_gets_one_event_per_transition_by_id_after_the_launcher_is_killed(
    runner: Runner, receiver: Receiver, tmp_path: Path
) -> None:
    token = "hook-token-" + os.urandom(6).hex()
    gate = _gate(tmp_path)
    proc = subprocess.run([sys.executable, "-c", LAUNCH, str(gate), receiver.url(f"/in/{token}")],
                          capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    handle = proc.stdout.strip()
    wait_until(lambda: receiver.ends("RUNNING"), "the RUNNING event", HANG)
    _open(gate)
    final = runner.wait(handle, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED
    _helper_ends(handle)
    events = receiver.events()
    walk = _chain(events, handle, "SUCCEEDED")
    assert "RUNNING" in walk
    with receiver.lock:
        assert len(receiver.posts) == 2 * len(events), "each event is sent again after a refusal, then no more"
        assert receiver.keys == [p["id"] for p in receiver.posts]
    home = Path(os.environ["TSM_HOME"])
    assert token not in everything_under(home), "the URL is kept only while the helper runs"
    assert not hooks.hook_dir(handle).exists(), "a hook that told everything leaves nothing behind"


RECORD = """
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"argv": sys.argv[2:], "id": os.environ["TSM_EVENT_ID"]}) + "\\n")
"""


def test_a_command_is_called_with_the_handle_and_both_states_and_the_event_id(
    runner: Runner, tmp_path: Path
) -> None:
    script, out = tmp_path / "record.py", tmp_path / "events.jsonl"
    script.write_text(RECORD)
    target = f"{sys.executable} {script} {out}"
    handle = runner.run(sh("echo bye; exit 3"), "local", cfg={"on_state": target})
    assert runner.wait(handle, timeout=HANG).state == AppState.FAILED  # type: ignore[union-attr]
    _helper_ends(handle)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == [f"{handle}#{i}" for i in range(1, len(lines) + 1)]
    assert all(x["argv"][0] == handle and len(x["argv"]) == 4 for x in lines)
    assert lines[0]["argv"][1] == "UNSUBMITTED" and lines[-1]["argv"][2] == "FAILED"
    assert str(script) not in store_text(Path(os.environ["TSM_HOME"])), "the target is not kept in the store"


def test_a_held_app_tells_its_wait_and_its_cancellation_with_the_reason(
    runner: Runner, receiver: Receiver, tmp_path: Path
) -> None:
    gate = _gate(tmp_path)
    a = runner.run(sh(f"read x < {gate}; exit 1"), "local")
    b = runner.run(sh("echo never"), "local", cfg={"on_state": receiver.url("/b")}, after=[a])
    wait_until(lambda: receiver.ends("PENDING"), "the PENDING event", HANG)
    _open(gate)
    _helper_ends(b)
    events = receiver.events()
    assert _chain(events, b, "CANCELLED") == ["UNSUBMITTED", "PENDING", "CANCELLED"]
    assert f"dependency {a} ended FAILED" in events[-1]["msg"]


def test_the_dry_run_shows_the_hook_by_host_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "TSM_CLI_SERVER": "0"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tsm.cli.main", *args], capture_output=True, text=True,
                              timeout=HANG, env=env)

    dry = cli("dryrun", "-c", "on_state=https://hooks.example.org/s3cr3t", "utils.echo")
    assert dry.returncode == 0, dry.stderr
    assert "# each state change is told to https://hooks.example.org/... by tsm's helper" in dry.stdout
    assert "s3cr3t" not in dry.stdout + dry.stderr
    bad = cli("run", "-c", "on_state=ftp://host/x", "utils.echo")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not an http" in bad.stderr, bad.stderr


def test_a_project_file_cannot_set_a_hook_but_the_users_own_may(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    (Path.cwd() / "tsm.toml").write_text("[scheduler.local]\non_state = 'curl evil'\n")
    with get_runner() as r, pytest.raises(ConfigError, match="'on_state' runs a command"):
        r.dryrun(sh("true"), "local")
    (Path.cwd() / "tsm.toml").unlink()
    home = Path.home()
    home.mkdir(parents=True, exist_ok=True)
    (home / ".torchxconfig").write_text("[local]\non_state = notify-send\n")
    with get_runner() as r:
        info = r.dryrun(sh("true"), "local")
        assert info.on_state == "notify-send" and "on_state" not in info.cfg


class FlakyStatuses:
    """A fake runner (fast feedback for :func:`hooks.watch`): the statuses given, a read that raises among them."""

    def __init__(self, *items: Any) -> None:
        self.items = list(items)

    def status(self, handle: str) -> Any:
        return self.wait(handle, 0)

    def wait(self, handle: str, timeout: float) -> Any:
        item = self.items.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def test_a_status_that_cannot_be_read_for_a_while_loses_no_transition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tsm.specs.api import AppStatus

    monkeypatch.setattr(hooks, "LAST_LOOK_S", 0.01)
    script, out = tmp_path / "record.py", tmp_path / "events.jsonl"
    script.write_text(RECORD)
    fake = FlakyStatuses(AppStatus(AppState.RUNNING), OSError("squeue: timed out"), AppStatus(AppState.RUNNING),
                         AppStatus(AppState.SUCCEEDED))
    (tmp_path / "hook").mkdir()
    hooks.watch(fake, "slurm://s/1", f"{sys.executable} {script} {out}", hooks.Journal(tmp_path / "hook"))
    got = [json.loads(line)["argv"][1:3] for line in out.read_text().splitlines()]
    assert got == [["UNSUBMITTED", "RUNNING"], ["RUNNING", "SUCCEEDED"]]


def test_a_helper_whose_home_is_removed_stops_retrying(runner: Runner, tmp_path: Path) -> None:
    import shutil
    import socket

    from testutil import procs_with, wait_all_gone

    with socket.socket() as s:  # a port nothing listens on: every delivery is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handle = runner.run(sh("true"), "local", cfg={"on_state": f"http://127.0.0.1:{port}/x"})
    assert runner.wait(handle, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    folder = hooks.hook_dir(handle)
    assert daemon.wait_released(daemon.start_lock(folder / hooks.LOCK), HANG)
    helpers = procs_with(str(folder))
    assert helpers, "the helper retries an event nobody takes"
    shutil.rmtree(folder)
    wait_all_gone(helpers, HANG)
    assert procs_with(str(folder)) == []
