"""``tsm exec``, ``tsm stack`` and ``tsm port-forward`` end to end: real ``tsm`` processes, real local apps.

Every replica here waits on an event the test controls (a file it creates, a cancel), never on a clock; the
time limits are hang guards only.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.cli import _exits
from tsm.runner.api import get_runner
from tsm.specs.api import AppDef, AppState, Role

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 120  # seconds: a guard against a hung command, never a performance claim

#: A replica program: rank 1 blocks in a function named for the test, every other rank in another one.
BLOCKED = """
import os, sys, time
def rank_one_is_stuck_here():
    while True:
        time.sleep(3600)
def everyone_else_waits_here():
    while True:
        time.sleep(3600)
open(sys.argv[1] + "." + os.environ["TSM_REPLICA_ID"], "w").close()
if os.environ["TSM_REPLICA_ID"] == "1":
    rank_one_is_stuck_here()
everyone_else_waits_here()
"""


def tsm(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = subprocess.run(
        [*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    return proc


def wait_for(paths: list[Path]) -> None:
    """Block until every path exists (the replicas create them once they run); the deadline is a hang guard."""
    deadline = time.monotonic() + HANG
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"replicas never started: {[p for p in paths if not p.exists()]}"
        time.sleep(0.02)


@pytest.fixture
def blocked_app(tmp_path: Path) -> Iterator[str]:
    """Three replicas of BLOCKED, running in ``tmp_path/work``; cancelled afterwards."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "prog.py").write_text(BLOCKED)
    started = tmp_path / "started"
    app = AppDef("blocked", [Role("trainer", image=str(work), entrypoint=sys.executable,
                                  args=["prog.py", str(started)], num_replicas=3)])
    with get_runner() as runner:
        handle = runner.run(app, "local")
        try:
            wait_for([Path(f"{started}.{k}") for k in range(3)])
            yield handle
        finally:
            runner.cancel(handle)


def test_exec_runs_in_the_replicas_place_and_passes_its_exit_code(blocked_app: str, tmp_path: Path) -> None:
    code = "import os, sys; print(os.environ['TSM_REPLICA_ID']); print(os.getcwd()); print(sys.argv[1:]); sys.exit(7)"
    odd = ["a b", "$HOME", "*", "", "-x", "--", "'\"", "\u00e9"]
    r = tsm("exec", f"{blocked_app}/trainer/2", "--", sys.executable, "-c", code, *odd)
    assert r.returncode == 7, r.stderr
    replica_id, cwd, argv = r.stdout.splitlines()
    assert replica_id == "2"
    assert cwd == str(tmp_path / "work")
    assert argv == repr(odd)  # verbatim: no shell expanded, split or dropped anything
    assert r.stderr == ""


def test_exec_gives_the_environment_the_replica_was_started_with(blocked_app: str) -> None:
    r = tsm("exec", f"{blocked_app}/trainer/1", "--", "env")
    assert r.returncode == 0, r.stderr
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert env["TSM_APP_HANDLE"] == blocked_app
    assert env["TSM_ROLE_NAME"] == "trainer" and env["TSM_REPLICA_ID"] == "1"
    assert env["TSM_APP_ID"] == blocked_app.rsplit("/", 1)[1]


def test_exec_of_a_missing_command_exits_127_with_one_line(blocked_app: str) -> None:
    r = tsm("exec", f"{blocked_app}/trainer/0", "--", "no-such-command-anywhere")
    assert r.returncode == 127
    assert r.stderr.count("\n") == 1 and "no-such-command-anywhere" in r.stderr


def test_exec_it_gives_the_command_a_terminal(blocked_app: str) -> None:
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [*TSM, "exec", "-it", f"{blocked_app}/trainer/1"])
    out = b""

    def read_until(text: bytes) -> None:
        nonlocal out
        deadline = time.monotonic() + HANG
        while text not in out:
            assert time.monotonic() < deadline, out
            if select.select([fd], [], [], 1)[0]:
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    return
                if not data:
                    return
                out += data

    read_until(b"# " if os.getuid() == 0 else b"$ ")  # the shell's prompt: it runs, interactive
    os.write(fd, b"echo id=$TSM_REPLICA_ID; tty; exit 3\n")
    read_until(b"\0")  # everything, until the command ended and its terminal closed
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 3, out
    assert b"id=1" in out and b"/dev/pts/" in out


def test_stack_shows_the_blocked_function_for_rank_1_only(blocked_app: str) -> None:
    r = tsm("stack", blocked_app)
    assert r.returncode == 0, r.stderr
    groups = r.stdout.split("== ")[1:]
    assert len(groups) == 2, r.stdout
    common, odd = groups
    assert common.startswith("trainer/0, trainer/2 (2 replicas")  # the two alike, folded, first
    assert "everyone_else_waits_here" in common and "rank_one_is_stuck_here" not in common
    assert odd.startswith("trainer/1 (1 replica)  <-- differs")
    assert "rank_one_is_stuck_here (prog.py:" in odd and "everyone_else_waits_here" not in odd


def test_stack_json_of_one_replica(blocked_app: str) -> None:
    r = tsm("stack", f"{blocked_app}/trainer/0", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert [(x["role"], x["k"], x["error"]) for x in report["replicas"]] == [("trainer", 0, "")]
    [proc] = report["replicas"][0]["processes"]
    names = [f["name"] for t in proc["threads"] for f in t["frames"]]
    assert "everyone_else_waits_here" in names and "rank_one_is_stuck_here" not in names
    assert report["groups"][0]["replicas"] == ["trainer/0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_app(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """One replica serving HTTP on a port of its own, with a page naming its replica id."""
    port = free_port()
    (tmp_path / "index.html").write_text("hello from inside the replica\n")
    code = (f"import http.server, functools, sys; h = functools.partial(http.server.SimpleHTTPRequestHandler, "
            f"directory={str(tmp_path)!r}); s = http.server.HTTPServer(('127.0.0.1', {port}), h); "
            f"open({str(tmp_path / 'up')!r}, 'w').close(); s.serve_forever()")
    app = AppDef("web", [Role("web", entrypoint=sys.executable, args=["-c", code])])
    with get_runner() as runner:
        handle = runner.run(app, "local")
        try:
            wait_for([tmp_path / "up"])
            yield handle, port
        finally:
            runner.cancel(handle)


def test_port_forward_reaches_a_server_inside_the_replica_until_ctrl_c(http_app: tuple[str, int]) -> None:
    handle, port = http_app
    proc = subprocess.Popen([*TSM, "port-forward", f"{handle}/web/0", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("Forwarding 127.0.0.1:"), (line, proc.stderr.read() if proc.stderr else "")
        local = int(line.split("127.0.0.1:")[1].split()[0])
        assert local != port  # a port of its own, chosen free
        for _ in range(2):  # every connection gets its own stream
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.html", timeout=HANG) as resp:
                assert resp.read() == b"hello from inside the replica\n"
        with socket.socket() as s:  # loopback only: no other address of this host takes it
            s.settimeout(5)
            other = socket.gethostbyname(socket.gethostname())
            if not other.startswith("127."):
                assert s.connect_ex((other, local)) != 0
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_port_forward_refuses_another_local_user(http_app: tuple[str, int]) -> None:
    """Attack: another user of this machine connects to the loopback port; it gets nothing and is cut off."""
    handle, port = http_app
    proc = subprocess.Popen([*TSM, "port-forward", f"{handle}/web/0", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        local = int(line.split("127.0.0.1:")[1].split()[0])
        intruder = ("import socket, sys\ngot = b''\ntry:\n"
                    f"    s = socket.create_connection(('127.0.0.1', {local}), timeout=30)\n"
                    "    s.sendall(b'GET /index.html HTTP/1.0\\r\\n\\r\\n')\n"
                    "    while chunk := s.recv(4096):\n        got += chunk\n"
                    "except OSError:\n    pass\nsys.stdout.write((got or b'<nothing>').hex())\n")
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # one every user may run
        printed = subprocess.run([python, "-I", "-c", intruder], user=65534, group=65534, extra_groups=[], cwd="/",
                                 capture_output=True, timeout=HANG, text=True)
        seen = bytes.fromhex(printed.stdout) if printed.stdout else printed.stderr.encode()
        assert seen == b"<nothing>", seen
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.html", timeout=HANG) as resp:
            assert resp.read() == b"hello from inside the replica\n"  # its owner still gets through
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=HANG)


def test_an_ended_app_is_one_line_and_exit_code_4(tmp_path: Path) -> None:
    with get_runner() as runner:
        handle = runner.run(AppDef("done", [Role("r", entrypoint="true")]), "local")
        assert runner.wait(handle) is not None and runner.status(handle).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    for argv in (["exec", handle, "--", "true"], ["stack", handle], ["port-forward", f"{handle}/r/0", "8000"]):
        r = tsm(*argv)
        assert r.returncode == _exits.NOT_RUNNING, (argv, r.stderr)
        assert r.stderr == f"error: {handle} has ended (SUCCEEDED): there is no replica to " + {
            "exec": "exec into", "stack": "dump", "port-forward": "forward a port of"}[argv[0]] + "\n"
        assert r.stdout == ""


def test_unknown_role_and_replica_are_usage_errors(blocked_app: str) -> None:
    for target, says in ((f"{blocked_app}/nosuch/0", "has no role 'nosuch' (roles: trainer)"),
                         (f"{blocked_app}/trainer/3", "has replicas 0..2, not 3"),
                         (blocked_app, "name one replica")):
        r = tsm("exec", target, "--", "true")
        assert r.returncode == _exits.USAGE, r.stderr
        assert r.stderr.count("\n") == 1 and says in r.stderr and "Traceback" not in r.stderr
