"""The per-user command server (``tsm.cli._server``, its caller ``tsm.cli._client``): a read it serves prints the
same bytes, to the same streams, with the same exit code as the read run in the ``tsm`` process; it starts only
when reads come again, never runs old code, and ends with its home, when idle, and with its standby.

Real ``tsm`` processes (``python -m tsm.cli.main``, the console script's ``entry``) against a real home with real
local apps; the server's figures are in ``benchmarks/cli_reads.py``, never here.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.cli import _client, _server
from tsm.runner.api import get_runner
from tsm.specs.api import AppDef, AppState, Role

HANG = 120  # seconds: a guard against a hang, never a performance claim
BIN = str(Path(sys.executable).parent)


def tsm(*argv: str, env: dict[str, str] | None = None, cwd: str | None = None,
        stdout: int | None = None) -> subprocess.CompletedProcess[bytes]:
    """``tsm ARGV`` as the console script runs it (``entry``: served when a server runs); its output captured,
    or stdout to the descriptor ``stdout``."""
    code = f"import sys; sys.path[0] = {BIN!r}; from tsm.cli.main import entry; entry()"
    return subprocess.run([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE if stdout is None else stdout,
                          stderr=subprocess.PIPE, timeout=HANG, stdin=subprocess.DEVNULL, cwd=cwd,
                          env={**os.environ, **(env or {})})


def key() -> str:
    """The server key of the processes :func:`tsm` starts (their import path is the console script's)."""
    r = subprocess.run([sys.executable, "-c", f"import sys; sys.path[0] = {BIN!r}; from tsm.cli import _client; "
                        "print(_client.code_id())"], capture_output=True, text=True, timeout=HANG, check=True)
    return r.stdout.strip()


def server_pid(home: Path) -> int | None:
    """The pid of the home's command server, once its socket is bound (waiting for the process it started)."""
    sock = Path(_client.socket_path(str(home), key()))
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        if sock.exists():
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    try:
                        cmd = (proc / "cmdline").read_bytes().split(b"\0")
                    except OSError:
                        continue
                    if b"from tsm.cli._server import serve" in b" ".join(cmd) and os.fsencode(str(home)) in cmd:
                        return int(proc.name)
        time.sleep(0.05)  # only while it starts: the test waits for the process it caused
    return None


def gone(pid: int) -> bool:
    """Wait until ``pid`` has ended (it is not our child: poll /proc); True once it has."""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def apps(tsm_home: Path) -> Iterator[list[str]]:
    """Two ended local apps: one SUCCEEDED, one FAILED (its status shows the failure and stderr)."""
    with get_runner() as runner:
        ok = runner.run(AppDef("ok", [Role("w", entrypoint="true")]), "local")
        bad = runner.run(AppDef("bad", [Role("w", entrypoint="sh", args=["-c", "echo oops >&2; exit 3"])]), "local")
        for h in (ok, bad):
            assert runner.wait(h) is not None
        assert runner.status(bad).state == AppState.FAILED  # type: ignore[union-attr]
    yield [ok, bad]


@pytest.fixture
def server(tsm_home: Path, apps: list[str]) -> Iterator[int]:
    """A running server for the home: two reads within a minute start it (idle for as long as a test takes)."""
    for _ in range(2):
        assert tsm("list", env={"TSM_CLI_SERVER_IDLE": str(HANG * 3)}).returncode == 0
    pid = server_pid(tsm_home)
    assert pid is not None, "no command server started after two reads"
    yield pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 15)
    assert gone(pid)


READS = [["status", "{ok}"], ["status", "{bad}"], ["status", "{bad}", "--json"], ["list"], ["list", "--all"],
         ["--help"], ["list", "--help"], ["status", "local://default/none-00000000"], ["status", "not a handle"],
         ["describe", "{ok}"], ["runopts", "local"], ["builtins"], ["list", "--limit", "0"]]


@pytest.mark.parametrize("argv", READS, ids=lambda a: " ".join(a))
def test_a_served_read_is_byte_for_byte_the_read_run_in_the_process(argv: list[str], apps: list[str], server: int) -> None:
    words = [w.format(ok=apps[0], bad=apps[1]) for w in argv]
    here = tsm(*words, env={"TSM_CLI_SERVER": "0"})
    marker = Path(os.environ["TSM_HOME"], "cli", f"{key()}.read")
    before = marker.stat().st_mtime_ns
    served = tsm(*words)
    assert (served.returncode, served.stdout, served.stderr) == (here.returncode, here.stdout, here.stderr)
    assert marker.stat().st_mtime_ns == before  # served: a read run in its own process would have marked it


def test_a_large_environment_is_sent_whole_and_served(apps: list[str], server: int) -> None:
    """300 KB of environment, more than a Unix socket takes in one send: it still arrives whole (the standby
    would refuse a cut request, and the caller run the read itself, which marks the home)."""
    big = {f"BIG{i}": chr(ord("a") + i) * 100_000 for i in range(3)}
    marker = Path(os.environ["TSM_HOME"], "cli", f"{key()}.read")
    before = marker.stat().st_mtime_ns
    served = tsm("status", apps[0], env=big)
    assert served.returncode == 0 and apps[0].encode() in served.stdout
    assert marker.stat().st_mtime_ns == before


def test_a_served_read_takes_the_callers_environment_directory_and_terminal(
    apps: list[str], server: int, tmp_path: Path
) -> None:
    """The time zone (``tsm list`` prints local times), the working directory (a relative ``TSM_HOME``) and a
    terminal for stdout (line buffering, ``isatty``) are the caller's, never the server's."""
    for tz in ("UTC", "Asia/Kolkata"):
        here = tsm("list", env={"TZ": tz, "TSM_CLI_SERVER": "0"})
        assert tsm("list", env={"TZ": tz}).stdout == here.stdout
    home = Path(os.environ["TSM_HOME"])
    rel = tsm("status", apps[0], env={"TSM_HOME": home.name}, cwd=str(home.parent))
    assert rel.returncode == 0 and apps[0].encode() in rel.stdout
    primary, secondary = pty.openpty()
    try:
        r = tsm("status", apps[0], stdout=secondary)
        os.close(secondary)
        out = b""
        while b"Roles:" not in out:
            out += os.read(primary, 4096)
    finally:
        os.close(primary)
    assert r.returncode == 0 and apps[0].encode() in out


def test_status_json_is_the_same_document_served(apps: list[str], server: int) -> None:
    assert json.loads(tsm("status", apps[1], "--json").stdout)["failure"]["stderr_tail"] == ["oops"]


def test_one_read_starts_no_server_and_a_replica_or_tsm_cli_server_0_never_does(tsm_home: Path, apps: list[str]) -> None:
    assert tsm("list", env={"TSM_CLI_SERVER": "0"}).returncode == 0
    assert tsm("list", env={"TSM_CLI_SERVER": "0"}).returncode == 0
    assert tsm("list", env={"TSM_APP_ID": "x"}).returncode == 0
    assert tsm("list", env={"TSM_APP_ID": "x"}).returncode == 0
    assert not (tsm_home / "cli").exists() or not list((tsm_home / "cli").glob("*.sock"))
    assert tsm("list").returncode == 0  # the first read done here with a server allowed: a marker, no server
    assert not list((tsm_home / "cli").glob("*.sock"))
    assert tsm("--help", env={"TSM_HOME": str(tsm_home / "none")}).returncode == 0
    assert not (tsm_home / "none").exists()  # help creates no home


def test_a_source_file_that_changed_is_never_served_the_server_ends(tsm_home: Path, apps: list[str], server: int) -> None:
    """An edit or an upgrade of a file the server imported: the next read runs in its own process, the server exits."""
    source = Path(_client.__file__)
    st = source.stat()
    try:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # the content is the same; the file "changed"
        assert tsm("status", apps[0]).returncode == 0
        assert gone(server)
    finally:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_server_ends_when_its_socket_is_gone(tsm_home: Path, apps: list[str], server: int) -> None:
    sock = Path(_client.socket_path(str(tsm_home), key()))
    sock.unlink()  # what removing the home does to its socket
    assert gone(server)


def test_an_idle_server_ends_and_takes_its_standby_with_it(tsm_home: Path, apps: list[str]) -> None:
    for _ in range(2):
        assert tsm("list", env={"TSM_CLI_SERVER_IDLE": "1"}).returncode == 0
    pid = server_pid(tsm_home)
    assert pid is not None
    standbys = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(int(p.name)) == pid]
    assert gone(pid)
    assert all(gone(s) for s in standbys)


def test_a_killed_server_leaves_no_standby_and_reads_run_on(tsm_home: Path, apps: list[str], server: int) -> None:
    standbys = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(int(p.name)) == server]
    assert standbys
    os.kill(server, 9)
    assert gone(server) and all(gone(s) for s in standbys)
    r = tsm("status", apps[0])
    assert r.returncode == 0 and b"SUCCEEDED" in r.stdout


def test_sources_see_a_changed_size_or_time() -> None:
    src = _server.Sources()
    assert not src.changed()
    path = next(iter(src.seen))
    src.seen[path] = (0, 0)
    assert src.changed()


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def test_ctrl_c_reaches_the_served_command_as_it_would_reach_it_here(tsm_home: Path, apps: list[str], server: int) -> None:
    """A read waiting for the store (another process holds its write lock): Ctrl-C ends it with "interrupted"
    and exit code 130, served or not (SQLite's wait for the lock is not interrupted: the read ends when that
    wait does, after ``TSM_STORE_TIMEOUT``)."""
    import signal
    import sqlite3

    results = []
    for env in ({"TSM_CLI_SERVER": "0"}, {}):
        holder = sqlite3.connect(tsm_home / "tsm.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # `tsm status` records the state it read: it waits for this lock
        try:
            standby = _standby(server)
            code = f"import sys; sys.path[0] = {BIN!r}; from tsm.cli.main import entry; entry()"
            proc = subprocess.Popen([sys.executable, "-c", code, "status", apps[0]], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env={**os.environ, "TSM_STORE_TIMEOUT": "8", **env})
            _until_waiting(standby if not env else proc.pid)  # the command runs, waiting for the lock
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=HANG)
            results.append((proc.returncode, err.decode().splitlines()[-1:]))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    assert results[0] == results[1] == (130, ["interrupted"])


def _standby(server: int) -> int:
    """The server's standby, once it waits for a caller (its rehearsal done: it holds no store open then)."""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        for p in Path("/proc").iterdir():
            if p.name.isdigit() and _parent(int(p.name)) == server:
                with contextlib.suppress(OSError):
                    if "select" in (p / "wchan").read_text() or "poll" in (p / "wchan").read_text():
                        return int(p.name)
        time.sleep(0.05)  # the server forks its standby after the previous one ended: the test waits for it
    raise AssertionError("no standby waiting")


def _until_waiting(pid: int) -> None:
    """Until ``pid`` (a read run in its own process) has the store open: it then waits for the lock."""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        try:
            if any("tsm.db" in os.readlink(f) for f in (str(p) for p in Path(f"/proc/{pid}/fd").iterdir())):
                return
        except OSError:
            pass
        time.sleep(0.05)  # the process imports and opens the store: the test waits for that
    raise AssertionError("the read never opened the store")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_another_user_gets_nothing_even_with_the_folder_opened_to_all(tsm_home: Path, apps: list[str], server: int) -> None:
    """The attack: the socket's folder made world-reachable (a careless chmod); a process of another uid connects
    and sends a well-formed request. The server checks the caller's uid (``SO_PEERCRED``) and hangs up: no pid,
    no exit code, no command run as the home's owner."""
    folder = tsm_home / "cli"
    sock = Path(_client.socket_path(str(tsm_home), key()))
    modes = [(p, p.stat().st_mode & 0o777) for p in (folder, sock)]
    for path, mode in ((folder, 0o777), (sock, 0o777)):
        path.chmod(mode)
    code = (
        "import os, socket, sys\n"
        "from tsm.cli import _client\n"
        "folder = os.open(os.path.dirname(sys.argv[1]), os.O_RDONLY)  # reached through it: the test's parents are 0700\n"
        "os.setgid(65534)\n"
        "os.setuid(65534)  # nobody, from here on (the interpreter's files are root's own)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.settimeout(30)\n"
        "s.connect(f'/proc/self/fd/{folder}/{os.path.basename(sys.argv[1])}')\n"
        "fds = b''.join(i.to_bytes(4, sys.byteorder) for i in (0, 1, 2))\n"
        "try:\n"
        "    s.sendmsg([_client.request(['status', 'x'])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])\n"
        "    print(repr(s.recv(64)))\n"
        "except (BrokenPipeError, ConnectionResetError):  # hung up on, before or after the request\n"
        "    print(repr(b''))\n"
    )
    try:
        r = subprocess.run([sys.executable, "-c", code, str(sock)], capture_output=True, text=True, timeout=HANG,
                           cwd="/", env={**os.environ, "TSM_HOME": str(tsm_home)})
    finally:
        for path, mode in modes:
            path.chmod(mode)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "b''"
