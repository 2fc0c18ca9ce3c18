"""The checks of ``tsm exec``, ``tsm stack`` and ``tsm port-forward`` every engine's test runs on its own app.

:func:`debug_app` is the app: two replicas of one role, each serving HTTP on :data:`PORT` + its rank (a page
naming its replica) and then blocking, rank 1 in :func:`rank_one_is_stuck_here`, rank 0 elsewhere. :func:`wait_ready`
waits for each replica's "ready" log line (an event, not a sleep); the ``check_*`` functions drive the real
``tsm`` command line against it.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import urllib.request

from tsm.runner.api import Runner
from tsm.specs.api import AppDef, Resource, Role

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 240  # seconds: a guard against a hung command, never a performance claim
PORT = 8471

PROGRAM = f"""
import http.server, os, threading, time
rid = os.environ["TSM_REPLICA_ID"]
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from replica " + rid + "\\n").encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
srv = http.server.ThreadingHTTPServer(("0.0.0.0", {PORT} + int(rid)), Page)  # a port per rank: one host may run both
threading.Thread(target=srv.serve_forever, daemon=True).start()
def rank_one_is_stuck_here():
    while True:
        time.sleep(3600)
def everyone_else_waits_here():
    while True:
        time.sleep(3600)
print("ready", flush=True)
if rid == "1":
    rank_one_is_stuck_here()
everyone_else_waits_here()
"""


def debug_app(image: str, python: str = "python3", **role: object) -> AppDef:
    """Two replicas of PROGRAM in ``image``."""
    return AppDef("dbg", [Role("trainer", image=image, entrypoint=python, args=["-c", PROGRAM], num_replicas=2,
                               resource=Resource(cpu=1, memMB=256), **role)])  # type: ignore[arg-type]


def wait_ready(runner: Runner, handle: str) -> None:
    """Block until both replicas printed "ready" (each follows its log until that line)."""
    for k in range(2):
        for line in runner.log_lines(handle, "trainer", k, should_tail=True):
            if line.strip() == "ready":
                break
        else:
            raise AssertionError(f"replica trainer/{k} of {handle} ended before it was ready")


def tsm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL)


def check_exec(handle: str, cwd: str | None = None) -> None:
    """exec prints the replica's TSM_REPLICA_ID and working directory, and passes its exit code back."""
    code = "import os, sys; print(os.environ['TSM_REPLICA_ID']); print(os.getcwd()); print(sys.argv[1:]); sys.exit(7)"
    odd = ["a b", "$HOME", "*", "-x"]
    r = tsm("exec", f"{handle}/trainer/1", "--", "python3", "-c", code, *odd)
    assert r.returncode == 7, r.stderr
    replica_id, where, argv = r.stdout.splitlines()[-3:]
    assert replica_id == "1"
    if cwd is not None:
        assert where == cwd
    assert argv == repr(odd)
    r = tsm("exec", f"{handle}/trainer/0", "--", "sh", "-c", "exit 3")
    assert r.returncode == 3, r.stderr


def check_stdin_and_tty(handle: str, stdin_eof: bool = True) -> None:
    """``-i`` relays stdin (to its end, when the engine can say so); ``-t`` gives the command a terminal, whose
    output and exit code come back."""
    if stdin_eof:
        r = subprocess.run([*TSM, "exec", "-i", f"{handle}/trainer/0", "--", "cat"], input="one\ntwo\n",
                           capture_output=True, text=True, timeout=HANG)
        assert (r.returncode, r.stdout) == (0, "one\ntwo\n"), r.stderr
    pid, fd = pty.fork()
    if pid == 0:  # under a terminal, as a user at one
        os.execv(sys.executable, [*TSM, "exec", "-t", f"{handle}/trainer/1", "--", "sh", "-c",
                                  "tty; echo id=$TSM_REPLICA_ID; exit 3"])
    out = b""
    while select.select([fd], [], [], HANG)[0]:
        try:
            data = os.read(fd, 4096)
        except OSError:  # the terminal closed: the command and tsm ended
            break
        if not data:
            break
        out += data
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 3, out
    assert b"/dev/" in out and b"id=1" in out and b"not a tty" not in out, out


def check_stack(handle: str) -> None:
    """stack shows rank 1's blocking function for rank 1 and not for rank 0."""
    r = tsm("stack", handle, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    names = {(x["role"], x["k"]): {f["name"] for p in x["processes"] for t in p["threads"] for f in t["frames"]}
             for x in report["replicas"]}
    assert "rank_one_is_stuck_here" in names[("trainer", 1)], names
    assert "rank_one_is_stuck_here" not in names[("trainer", 0)] and "everyone_else_waits_here" in names[("trainer", 0)]
    text = tsm("stack", handle).stdout
    assert "rank_one_is_stuck_here" in text.split("== trainer/1")[1]


def check_port_forward(handle: str) -> None:
    """port-forward reaches the HTTP server inside replica 1 from loopback, until Ctrl-C (exit 0)."""
    proc = subprocess.Popen([*TSM, "port-forward", f"{handle}/trainer/1", str(PORT + 1)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("Forwarding 127.0.0.1:"), (line, proc.stderr.read() if proc.stderr else "")
        local = int(line.split("127.0.0.1:")[1].split()[0])
        for _ in range(2):
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=HANG) as resp:
                assert resp.read() == b"hello from replica 1\n"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, err


def check_all(runner: Runner, handle: str, cwd: str | None = None, stdin_eof: bool = True) -> None:
    wait_ready(runner, handle)
    check_exec(handle, cwd)
    check_stdin_and_tty(handle, stdin_eof)
    check_stack(handle)
    check_port_forward(handle)
