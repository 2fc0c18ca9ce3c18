"""Following logs from the command line (issue 11): attached ``tsm run`` and ``tsm log -f`` with real processes.

Across retried attempts (a marker on stderr, never in the output or the log files), with 1,500 replicas under
``ulimit -n 1024``, with ``\\r`` progress bars, and a second Ctrl-C that must not lose the final status.
Time limits are hang guards only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.runner.api import get_runner

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 300  # seconds: a guard against a hung command, never a performance claim


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)  # as a user has it: output through a pipe is what tsm flushes
    return env


def tsm(*args: str, timeout: float = HANG) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TSM, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=_env()
    )


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private directory with no config files around; whatever a failed test left running is stopped."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    yield tmp_path
    with get_runner() as runner:
        for app in runner.list("local"):
            if not app.state.is_terminal:
                runner.cancel(app.app_handle)


def launched(stderr: str) -> str:
    return next(ln.split()[-1] for ln in stderr.splitlines() if ln.startswith("tsm: launched "))


# -- retried attempts: followed to the end, with a marker on stderr ------------------------------------------
def test_attached_run_follows_every_attempt_with_a_marker_on_stderr(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    script = f"if [ -e {seen} ]; then echo second; else touch {seen}; echo first; printf partial; sleep 0.5; exit 1; fi"
    r = tsm("run", "-c", "grace_period=5", "utils.sh", "--max_retries", "1", "--", script)
    assert r.returncode == 0, r.stderr
    # The second attempt's output reaches the attached run; the first attempt's unfinished line stays its own.
    assert r.stdout == "sh/0 first\nsh/0 partial\nsh/0 second\n"
    assert "sh/0 --- attempt 1 ---\n" in r.stderr
    handle = launched(r.stderr)
    # `tsm log` shows the same, marker on stderr; the log file holds only what the replica wrote.
    log = tsm("log", handle)
    assert log.returncode == 0, log.stderr
    assert log.stdout == r.stdout
    assert log.stderr == "sh/0 --- attempt 1 ---\n"
    with get_runner() as runner:
        log_dir = runner.status(handle).ui_url.removeprefix("file://")  # type: ignore[union-attr]
    assert Path(log_dir, "sh", "0", "stdout").read_text() == "first\npartialsecond\n"
    # One attempt alone.
    assert tsm("log", "--attempt", "0", handle).stdout == "sh/0 first\nsh/0 partial\n"
    one = tsm("log", "--attempt", "1", handle)
    assert (one.returncode, one.stdout) == (0, "sh/0 second\n")
    bad = tsm("log", "--attempt", "-1", handle)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.splitlines()) == 1, bad
    assert "--attempt" in bad.stderr and "Traceback" not in bad.stderr


def test_log_follow_started_during_the_first_attempt_sees_the_second(tmp_path: Path) -> None:
    seen, go = tmp_path / "seen", tmp_path / "go"
    script = (
        f"if [ -e {seen} ]; then echo second; exit 0; fi; touch {seen}; echo first; "
        f"while [ ! -e {go} ]; do sleep 0.02; done; exit 1"
    )
    r = tsm("run", "--detach", "-c", "grace_period=5", "utils.sh", "--max_retries", "1", "--", script)
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    follower = subprocess.Popen([*TSM, "log", "-f", f"{handle}/sh/0"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "first\n"  # following attempt 0 now
        go.touch()  # attempt 0 fails; attempt 1 prints "second"
        out, err = follower.communicate(timeout=HANG)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert out == "second\n"
    assert err == "--- attempt 1 ---\n"


# -- `\r` progress bars ----------------------------------------------------------------------------------------
def test_log_follow_passes_carriage_returns_through() -> None:
    r = tsm("run", "utils.sh", "--", r"printf '10%%\r20%%\r100%%\n'")
    assert r.returncode == 0, r.stderr
    handle = launched(r.stderr)

    def raw(*args: str) -> bytes:  # bytes: text mode would turn every \r into a newline
        p = subprocess.run([*TSM, *args], capture_output=True, timeout=HANG, stdin=subprocess.DEVNULL, env=_env())
        assert p.returncode == 0, p.stderr
        return p.stdout

    # A follower ends a line at \r too and prints it with its \r (no newline added): a terminal redraws it.
    assert raw("log", "-f", handle) == b"sh/0 10%\rsh/0 20%\rsh/0 100%\n"
    # Without -f lines end at newlines only: the same bytes, as the replica wrote them.
    assert raw("log", f"{handle}/sh/0") == b"10%\r20%\r100%\n"


# -- many replicas: one follower, every line, within 1,024 descriptors -------------------------------------------
def test_attached_run_of_1500_replicas_under_ulimit_1024_delivers_every_line() -> None:
    n = 1500
    launcher = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))\n"
        "from tsm.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", launcher, "run", "-c", "grace_period=5", "utils.sh", "--num_replicas", str(n), "--",
         "echo first $TSM_REPLICA_ID; sleep 1; echo last $TSM_REPLICA_ID"],
        capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL, env=_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    want = {f"sh/{k} first {k}" for k in range(n)} | {f"sh/{k} last {k}" for k in range(n)}
    missing = want - set(lines)
    assert not missing, f"{len(missing)} lines lost, e.g. {sorted(missing)[:5]}"
    assert len(lines) == 2 * n, "a line was printed twice or torn"
    assert "Too many open files" not in r.stderr


# -- Ctrl-C twice ----------------------------------------------------------------------------------------------
def _interactive() -> None:
    """In the child: SIGINT as in a terminal (a background job, like this test run may be, ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _read_until(stream: object, text: str, got: list[str], timeout: float) -> bool:
    """Read lines from ``stream`` into ``got`` (in a thread) until one contains ``text``; False on timeout."""
    found = threading.Event()

    def run() -> None:
        for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
            got.append(line)
            if text in line:
                found.set()
                return

    threading.Thread(target=run, daemon=True).start()
    return found.wait(timeout)


def test_second_ctrl_c_still_prints_the_final_status() -> None:
    # The replica takes 2 s to stop on SIGTERM, so the second Ctrl-C lands while tsm is cancelling.
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(0))); "
            "print('started', flush=True); time.sleep(1000)")
    proc = subprocess.Popen(
        [*TSM, "run", "-c", "grace_period=30", "utils.python", "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), preexec_fn=_interactive,
    )
    out: list[str] = []
    err: list[str] = []
    try:
        assert _read_until(proc.stdout, "started", out, HANG), out
        proc.send_signal(signal.SIGINT)
        assert _read_until(proc.stderr, "interrupted; cancelling", err, HANG), err
        proc.send_signal(signal.SIGINT)
        rest_out, rest_err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(err) + rest_err
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "still cancelling" in stderr  # the second Ctrl-C was heard
    assert "CANCELLED" in stderr.split("interrupted; cancelling", 1)[1], stderr  # and the final status printed
