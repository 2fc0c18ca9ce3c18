"""The live status line of an attached ``tsm run`` and the spinner of long steps (issue 18), on a real terminal.

``tsm run`` runs as a real process with its stderr on a pseudo-terminal and its stdout on a pipe: the
status line (replicas running / done / failed per role) shows on the terminal, while stdout carries every
log line whole, in order and byte for byte as without a terminal. Piped, nothing changes at all: no escape
code anywhere. Time limits are hang guards only.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.cli import _live
from tsm.runner.api import get_runner

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 300  # seconds: a guard against a hung command, never a performance claim

#: Two roles: two workers print five lines and succeed once the file go_workers exists; "bad" prints a line,
#: waits for go_bad and for both workers to be done (its failure would stop them), then fails. The test opens the gates when the terminal showed the state it checks, so
#: no assertion depends on a poll landing inside a time window (a loaded CI machine cannot miss one).
COMPONENT = '''
from tsm.specs.api import AppDef, Role

def two() -> AppDef:
    work = ("for i in 1 2 3 4 5; do echo line $i of $TSM_REPLICA_ID; sleep 0.1; done; "
            "while [ ! -e go_workers ]; do sleep 0.05; done; touch done_$TSM_REPLICA_ID")
    bad = ("echo bad start; while [ ! -e go_bad ] || [ ! -e done_0 ] || [ ! -e done_1 ]; do sleep 0.05; done; "
           "sleep 0.5; echo bad end; exit 3")
    return AppDef(name="two", roles=[
        Role(name="worker", entrypoint="sh", args=["-c", work], num_replicas=2),
        Role(name="bad", entrypoint="sh", args=["-c", bad]),
    ])
'''

#: (text the terminal must show, gate file to create then): the workers run until the status line showed them
#: running; "bad" runs until the line showed the workers done and itself running.
GATES = [
    ("worker: 2 running, 0 done, 0 failed", "go_workers"),
    ("worker: 0 running, 2 done, 0 failed | bad: 1 running", "go_bad"),
]

EXPECTED = {
    "worker/0": [f"line {i} of 0" for i in range(1, 6)],
    "worker/1": [f"line {i} of 1" for i in range(1, 6)],
    "bad/0": ["bad start", "bad end"],
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    env["TERM"] = "xterm"
    return env


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private directory holding the component; whatever a failed test left running is stopped."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "comp.py").write_text(COMPONENT)
    yield tmp_path
    with get_runner() as runner:
        for app in runner.list("local"):
            if not app.state.is_terminal:
                runner.cancel(app.app_handle)


def _read_all(fd: int, into: bytearray) -> None:
    """Read a pty master until the other side is closed (EIO on Linux)."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.extend(chunk)


def _open_gates(seen: bytearray) -> None:
    """Create each gate file once the terminal showed its text (after HANG anyway, so a miss fails, not hangs)."""
    for text, gate in GATES:
        deadline = time.monotonic() + HANG
        while text.encode() not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        Path(gate).touch()


def run_on_tty(*args: str, stdout_too: bool = False) -> tuple[int, bytes, bytes]:
    """``tsm ARGS`` with stderr (and stdout if ``stdout_too``, else a pipe) on a 200-column pseudo-terminal.

    Returns (rc, what came through the stdout pipe, what the terminal received).
    """
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    seen = bytearray()
    reader = threading.Thread(target=_read_all, args=(master, seen), daemon=True)
    reader.start()
    threading.Thread(target=_open_gates, args=(seen,), daemon=True).start()
    try:
        proc = subprocess.Popen(
            [*TSM, *args], stdin=subprocess.DEVNULL, stdout=slave if stdout_too else subprocess.PIPE,
            stderr=slave, env=_env(),
        )
        os.close(slave)
        out, _ = proc.communicate(timeout=HANG)
        reader.join(HANG)
    finally:
        os.close(master)
    return proc.returncode, out, bytes(seen)


def by_replica(stdout: bytes) -> dict[str, list[str]]:
    """Each replica's lines in the order they came; every line must be whole (``role/k text``)."""
    text = stdout.decode()
    assert text.endswith("\n")
    out: dict[str, list[str]] = {}
    for ln in text.splitlines():
        m = re.fullmatch(r"((?:worker|bad)/\d) (line \d of \d|bad start|bad end)", ln)
        assert m, f"torn or foreign line {ln!r} in {text!r}"
        out.setdefault(m.group(1), []).append(m.group(2))
    return out


def test_attached_run_on_a_tty_shows_live_role_counts_and_keeps_stdout_exact() -> None:
    rc, out, tty = run_on_tty("run", "comp.py:two")
    assert rc == 1, tty
    assert by_replica(out) == EXPECTED  # every line, whole, each replica's in order
    assert b"\x1b" not in out  # stdout is never touched by the status line
    screen = tty.decode(errors="replace")
    assert "\r\x1b[K" in screen
    draws = [d for d in re.split(r"\r\x1b\[K", screen) if d.startswith("tsm: ") and " | " in d]
    assert any("worker: 2 running, 0 done, 0 failed" in d for d in draws), draws
    assert any("worker: 0 running, 2 done, 0 failed | bad: 1 running" in d for d in draws), draws
    assert any("bad: 0 running, 0 done, 1 failed" in d for d in draws), draws
    # the line is erased before the final status, which reads as without a terminal
    tail = screen.replace("\r\n", "\n")
    assert re.search(r"\r\x1b\[Ktsm: local://default/two-\w+\nState: FAILED\n", tail), tail[-600:]
    assert "bad/0: FAILED" in tail and "Msg: bad/0 exited with code 3" in tail


def test_log_lines_stay_whole_when_stdout_shares_the_terminal() -> None:
    """Both streams on one terminal (the usual case): no log line is cut by a status line drawn into it."""
    rc, _, tty = run_on_tty("run", "comp.py:two", stdout_too=True)
    assert rc == 1
    screen = tty.decode(errors="replace").replace("\r\n", "\n")
    assert re.search(r"\r\x1b\[Ktsm: [^\n]*worker: 2 running", screen), screen
    # drop every drawn status line (erase, text up to the next erase) and the erases themselves
    plain = re.sub(r"\r\x1b\[Ktsm: \d[^\r\n]*|\r\x1b\[Ktsm: waiting[^\r\n]*|\r\x1b\[K", "", screen)
    logs = "".join(ln + "\n" for ln in plain.splitlines() if re.match(r"(worker|bad)/\d ", ln))
    assert by_replica(logs.encode()) == EXPECTED


def test_piped_run_has_no_escape_codes_and_the_plain_format() -> None:
    for _, gate in GATES:  # no terminal to watch: the replicas run straight through
        Path(gate).touch()
    r = subprocess.run(
        [*TSM, "run", "comp.py:two"], capture_output=True, timeout=HANG, stdin=subprocess.DEVNULL, env=_env()
    )
    assert r.returncode == 1
    assert by_replica(r.stdout) == EXPECTED
    assert b"\x1b" not in r.stdout + r.stderr and b"\r" not in r.stdout + r.stderr
    err = r.stderr.decode().splitlines()
    assert err[0].startswith("tsm: launched local://default/two-")
    assert err[1] == "tsm: " + err[0].split()[-1] and err[2] == "State: FAILED"
    assert not any(" running, " in ln for ln in err)


def test_status_line_steps_out_of_the_way_of_every_log_line() -> None:
    """Driven directly: stdout gets the log text byte for byte; the line is erased before each one."""
    tty, out = io.StringIO(), io.StringIO()
    line = _live.StatusLine(tty, out)
    line.set("tsm: 1.0s | w: 1 running, 0 done, 0 failed", force=True)
    assert tty.getvalue() == "\r\x1b[Ktsm: 1.0s | w: 1 running, 0 done, 0 failed"
    texts = ["w/0 one\n", "w/0 50%\r", "w/0 two\n"]
    for t in texts:
        line.write_out(t)
    assert out.getvalue() == "".join(texts)
    assert tty.getvalue().count("\r\x1b[K") == 2  # erased once before the first line; not yet redrawn
    line.write_err("w/0 --- attempt 1 ---\n")
    assert tty.getvalue().endswith("w/0 --- attempt 1 ---\n")
    line.close()
    line.set("never shown", force=True)
    line.write_out("w/0 three\n")
    assert "never shown" not in tty.getvalue() and out.getvalue().endswith("w/0 three\n")


def test_step_spins_with_elapsed_time_on_a_tty_and_is_silent_otherwise() -> None:
    master, slave = os.openpty()
    seen = bytearray()
    reader = threading.Thread(target=_read_all, args=(master, seen), daemon=True)
    reader.start()
    with os.fdopen(slave, "w") as stream, _live.step("snapshotting workspace", stream):
        time.sleep(1.0)
    reader.join(HANG)
    os.close(master)
    screen = seen.decode()
    assert re.search(r"\r\x1b\[K[|/\\-] snapshotting workspace \d+\.\ds", screen), screen
    assert screen.endswith("\r\x1b[K")  # erased when the step ends

    piped = io.StringIO()
    with _live.step("snapshotting workspace", piped):
        time.sleep(0.6)
    assert piped.getvalue() == ""


def test_status_text_counts_replicas_per_role() -> None:
    from tsm.specs.api import AppState, AppStatus, ReplicaStatus, RoleStatus

    reps = [ReplicaStatus(i, s, "w") for i, s in enumerate([AppState.RUNNING, AppState.RUNNING, AppState.FAILED])]
    st = AppStatus(AppState.RUNNING, roles=[RoleStatus("w", reps),
                                            RoleStatus("p", [ReplicaStatus(0, AppState.PENDING, "p")])])
    text = _live.status_text(st, time.monotonic())
    assert text.endswith(" | w: 2 running, 0 done, 1 failed | p: 0 running, 0 done, 0 failed, 1 pending")
    waiting = AppStatus(AppState.PENDING, roles=[RoleStatus("p", [ReplicaStatus(0, AppState.PENDING, "p")])])
    assert _live.status_text(waiting, time.monotonic()).startswith("tsm: waiting for the app to start ")
