"""End-to-end tests of the ``tsm`` command line: real ``tsm`` processes driving real apps on the local scheduler.

Every test has its own ``$TSM_HOME`` (root conftest) and works in its own directory. Nothing is mocked; time
limits are only hang guards, never assertions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from testutil import assert_all_end, sleep_marker
from tsm.runner.api import get_runner
from tsm.specs.api import AppState

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 120  # seconds: a guard against a hung command, never a performance claim


def _env() -> dict[str, str]:
    # As a user has it: without PYTHONUNBUFFERED, so output through a pipe shows what tsm itself flushes.
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    return env


def tsm(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``tsm ARGS`` to completion."""
    return subprocess.run(
        [*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL, env=_env(), cwd=cwd
    )


def first_line(handle: str, role: str, k: int = 0) -> str:
    """Block until replica ``role/k`` wrote its first line (or ended); return that line."""
    with get_runner() as runner:
        for line in runner.log_lines(handle, role, k, should_tail=True):
            return line
    return ""


def one_error_line(r: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """Check a failed command: its exit code, exactly one line on stderr, no traceback, no stdout; return the line."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "error:" in lines[0]
    assert r.stdout == ""
    return lines[0]


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in a private directory with no config files around, and stop whatever a failed test left running."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    yield tmp_path
    with get_runner() as runner:
        for app in runner.list("local"):
            if not app.state.is_terminal:
                runner.cancel(app.app_handle)


def launch(*component: str) -> str:
    """``tsm run --detach COMPONENT...``; returns the handle."""
    r = tsm("run", "--detach", "-c", "grace_period=5", *component)
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    assert handle.startswith("local://default/"), r.stdout
    return handle


# -- basics ------------------------------------------------------------------------------------------------
def test_version() -> None:
    r = tsm("--version")
    assert r.returncode == 0
    from tsm import __version__

    assert r.stdout.strip() == f"tsm {__version__}"


def test_console_script_version() -> None:
    script = Path(sys.executable).with_name("tsm")
    if not script.exists():
        pytest.skip("the tsm console script is not installed next to this interpreter")
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0 and r.stdout.startswith("tsm ")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["log", "--help"], ["status", "--help"]])
def test_help_imports_no_backend(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from tsm.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = [m for m in ('tsm.schedulers.local.scheduler', 'tsm.schedulers.local', 'tsm.store', 'sqlite3',\n"
        "                     'tsm.runner.api', 'tsm.components.finder', 'socket', 'subprocess')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout


@pytest.mark.parametrize("argv", [["status", "HANDLE"], ["list"], ["list", "-s", "local"]])
def test_queries_import_only_what_they_use(argv: list[str]) -> None:
    """``tsm status``/``tsm list`` of local apps read the store: no config files, plugin metadata, logging,
    sockets, processes or other backends are imported for that (issue 19's start-up rows)."""
    runner = get_runner("imports")
    handle = runner.run_component("utils.echo", ["--msg", "hi"], scheduler="local")
    runner.wait(handle)
    runner.close()
    argv = [handle if a == "HANDLE" else a for a in argv]
    code = (
        "import sys, io, contextlib\n"
        "from tsm.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    assert main({argv!r}) == 0\n"
        "assert out.getvalue().strip()\n"
        "heavy = [m for m in ('importlib.metadata', 'logging', 'tomllib', 'configparser', 'socket', 'subprocess',\n"
        "                     'secrets', 'ctypes', 'tsm.runner.config', 'tsm.schedulers.docker',\n"
        "                     'tsm.schedulers.kubernetes', 'tsm.schedulers.slurm', 'tsm.schedulers.ray',\n"
        "                     'tsm.views', 'tsm.components.finder')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0, r.stderr


def test_run_knows_the_workspace_metadata_key() -> None:
    from tsm.cli._launch import WORKSPACE_METADATA_KEY
    from tsm.workspace.api import METADATA_KEY

    assert WORKSPACE_METADATA_KEY == METADATA_KEY


def test_help_importtime_has_no_backend() -> None:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tsm.cli.main", "--help"],
        capture_output=True, text=True, timeout=HANG,
    )
    assert r.returncode == 0
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert "tsm.cli.main" in imported or "tsm.cli" in imported
    assert not {"sqlite3", "tsm.store", "tsm.schedulers.local.scheduler", "tsm.runner.api"} & imported


def test_no_command_prints_help_and_exits_2() -> None:
    r = tsm()
    assert r.returncode == 2
    assert "usage: tsm" in r.stdout


# -- run ---------------------------------------------------------------------------------------------------
def test_run_echo_output_is_never_lost() -> None:
    for i in range(20):
        r = tsm("run", "utils.echo", "--msg", "hi")
        assert r.returncode == 0, (i, r.stdout, r.stderr)
        assert r.stdout == "echo/0 hi\n", (i, r.stdout, r.stderr)
        assert "State: SUCCEEDED" in r.stderr


def test_run_streams_every_replica_with_prefix() -> None:
    r = tsm("run", "utils.sh", "--num_replicas", "3", "--", 'echo "one $TSM_REPLICA_ID"; echo "two $TSM_REPLICA_ID"')
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted(f"sh/{k} {w} {k}" for k in range(3) for w in ("one", "two"))
    for k in range(3):  # each replica's lines in the order it wrote them
        mine = [ln for ln in r.stdout.splitlines() if ln.startswith(f"sh/{k} ")]
        assert mine == [f"sh/{k} one {k}", f"sh/{k} two {k}"]
    assert "State: SUCCEEDED" in r.stderr


def test_run_failure_exits_1_with_final_status() -> None:
    r = tsm("run", "utils.sh", "--", "echo before; exit 3")
    assert r.returncode == 1
    assert r.stdout == "sh/0 before\n"
    assert "State: FAILED" in r.stderr
    assert "exit=3" in r.stderr


def test_run_stdout_is_streamed_through_a_pipe() -> None:
    """A line reaches a pipe while the app still runs (not only once tsm exits)."""
    marker = sleep_marker()
    proc = subprocess.Popen(
        [*TSM, "run", "-c", "grace_period=5", "utils.sh", "--", f"echo first; sleep {marker}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), preexec_fn=_interactive,
    )
    try:
        line = _readline(proc, HANG)
        assert line == "sh/0 first\n"
        assert proc.poll() is None  # still attached to the running app
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=HANG)
    assert_all_end(marker)


def test_run_dryrun_submits_nothing() -> None:
    r = tsm("run", "--dryrun", "-c", "grace_period=2.5", "utils.echo", "--msg", "dry")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("=== scheduler request (local) ===\n")
    assert "grace period 2.5s" in r.stdout
    assert "echo/0:" in r.stdout and "dry" in r.stdout
    assert "TSM_APP_HANDLE=local://default/echo-" in r.stdout
    assert tsm("list").stdout == "no apps\n"


def test_dryrun_subcommand() -> None:
    r = tsm("dryrun", "-s", "local", "utils.sh", "--num_replicas", "2", "--", "echo x")
    assert r.returncode == 0, r.stderr
    assert "sh/0:" in r.stdout and "sh/1:" in r.stdout
    assert tsm("list").stdout == "no apps\n"


@pytest.mark.parametrize("command", ["run", "dryrun"])
def test_component_help(command: str) -> None:
    r = tsm(command, "utils.echo", "--help")
    assert r.returncode == 0
    assert r.stdout.startswith(f"usage: tsm {command} utils.echo")  # the command the user typed
    assert "--msg" in r.stdout


def test_config_file_in_cwd_gives_run_options(workdir: Path) -> None:
    (workdir / "tsm.toml").write_text('[scheduler.local]\ngrace_period = 3.5\n\n[component."utils.echo"]\nmsg = "from toml"\n')
    r = tsm("dryrun", "utils.echo")
    assert r.returncode == 0, r.stderr
    assert "grace period 3.5s" in r.stdout and "'from toml'" in r.stdout
    r = tsm("dryrun", "-c", "grace_period=1", "utils.echo", "--msg", "cli")
    assert "grace period 1s" in r.stdout and " cli" in r.stdout  # the command line wins


@pytest.mark.reliability(
    "unknown run option in tsm.toml",
    expect="one error line naming the file and the option; reading existing apps still works",
    group="Hostile input",
)
def test_bad_config_file_is_one_line(workdir: Path) -> None:
    handle = launch("utils.echo", "--msg", "before")
    (workdir / "tsm.toml").write_text("[scheduler.local]\ngrace_perod = 3\n")
    line = one_error_line(tsm("run", "utils.echo"))
    assert "tsm.toml" in line and "grace_perod" in line
    assert tsm("wait", handle).returncode == 0  # reading apps needs no config
    assert tsm("log", "-f", handle).stdout == "echo/0 before\n"


# -- the life of a detached app -------------------------------------------------------------------------
def test_detached_app_status_log_list_wait_cancel_rm() -> None:
    marker = sleep_marker()
    handle = launch("utils.sh", "--", f"echo started; sleep {marker}")
    assert first_line(handle, "sh") == "started\n"

    r = tsm("status", handle)
    assert r.returncode == 0
    assert r.stdout.splitlines()[:2] == [handle, "State: RUNNING"]
    assert "sh/0: RUNNING" in r.stdout

    r = tsm("status", "--json", handle)
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert data["handle"] == handle
    assert data["roles"][0]["role"] == "sh"

    r = tsm("describe", handle)
    assert r.returncode == 0
    app = json.loads(r.stdout)
    assert app["name"] == "sh" and app["roles"][0]["entrypoint"] == "sh"

    r = tsm("list")
    assert r.returncode == 0
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith(handle))
    assert row.split()[1] == "RUNNING"
    r = tsm("list", "-s", "local")
    assert any(ln.startswith(handle) and ln.split()[1] == "RUNNING" for ln in r.stdout.splitlines())

    assert tsm("log", handle).stdout == "sh/0 started\n"
    assert tsm("log", f"{handle}/sh/0").stdout == "started\n"

    line = one_error_line(tsm("rm", handle), code=1)
    assert "RUNNING" in line and "cancel" in line

    r = tsm("wait", "--timeout", "0.2", handle)
    assert r.returncode == 3  # not ended yet
    assert "State: RUNNING" in r.stdout

    r = tsm("cancel", handle)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{handle}: CANCELLED\n"
    assert_all_end(marker)  # the whole replica tree ends with the app
    assert tsm("cancel", handle).returncode == 0  # idempotent

    r = tsm("wait", handle)
    assert r.returncode == 1 and "State: CANCELLED" in r.stdout
    assert "State: CANCELLED" in tsm("status", handle).stdout

    r = tsm("rm", handle)
    assert r.returncode == 0 and r.stdout == f"removed {handle}\n"
    assert "unknown app" in one_error_line(tsm("status", handle), code=2)
    assert tsm("list").stdout == "no apps\n"


def test_status_json_states_are_names() -> None:
    handle = launch("utils.echo")
    assert tsm("wait", handle).returncode == 0
    data = json.loads(tsm("status", "--json", handle).stdout)
    assert data["state"] == "SUCCEEDED"
    assert data["roles"][0]["replicas"][0]["state"] == "SUCCEEDED"


def test_rm_older_than_removes_only_ended_apps() -> None:
    marker = sleep_marker()
    ended = [launch("utils.echo"), launch("utils.sh", "--", "exit 1")]
    running = launch("utils.sh", "--", f"echo started; sleep {marker}")
    for h in ended:
        tsm("wait", h)
    assert first_line(running, "sh") == "started\n"
    r = tsm("rm", "--older-than", "0")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted(f"removed {h}" for h in ended)
    listed = tsm("list").stdout
    assert running in listed and not any(h in listed for h in ended)
    r = tsm("cancel", running, running)  # several handles at once (here twice the same: idempotent)
    assert r.returncode == 0 and r.stdout == f"{running}: CANCELLED\n" * 2
    assert_all_end(marker)
    assert tsm("rm", "--older-than", "0").stdout == f"removed {running}\n"
    assert tsm("rm", "--older-than", "0").stdout == "nothing to remove\n"


def test_wait_exit_codes() -> None:
    ok = launch("utils.echo")
    bad = launch("utils.sh", "--", "exit 4")
    r = tsm("wait", ok)
    assert r.returncode == 0 and "State: SUCCEEDED" in r.stdout
    r = tsm("wait", bad)
    assert r.returncode == 1 and "State: FAILED" in r.stdout


def test_log_filters() -> None:
    handle = launch(
        "utils.sh", "--num_replicas", "2", "--",
        'echo "out1 $TSM_REPLICA_ID"; echo "err1 $TSM_REPLICA_ID" >&2; echo "out2 $TSM_REPLICA_ID"',
    )
    assert tsm("wait", handle).returncode == 0
    r = tsm("log", handle)
    assert r.returncode == 0
    assert sorted(r.stdout.splitlines()) == sorted(
        f"sh/{k} {w} {k}" for k in range(2) for w in ("out1", "err1", "out2")
    )
    assert tsm("log", f"{handle}/sh/1", "--streams", "stdout").stdout == "out1 1\nout2 1\n"
    assert tsm("log", f"{handle}/sh/1", "--streams", "stderr").stdout == "err1 1\n"
    assert tsm("log", f"{handle}/sh/0", "--regex", r"^out\d").stdout == "out1 0\nout2 0\n"
    r = tsm("log", f"{handle}/sh", "--regex", "err")
    assert sorted(r.stdout.splitlines()) == ["sh/0 err1 0", "sh/1 err1 1"]
    assert len(tsm("log", f"{handle}/sh/0", "--since", "1h").stdout.splitlines()) == 3
    assert len(tsm("log", f"{handle}/sh/0", "--since", "2000-01-01T00:00:00").stdout.splitlines()) == 3
    assert tsm("log", f"{handle}/sh/0", "--until", "1h").stdout == ""  # all written less than an hour ago
    assert tsm("log", f"{handle}/sh/0", "--since", "1d", "--until", "2000-01-01").stdout == ""
    r = tsm("log", "-f", f"{handle}/sh/0", "--streams", "stdout")  # -f on an ended app returns
    assert r.returncode == 0 and r.stdout == "out1 0\nout2 0\n"


def test_log_follow_sees_lines_until_the_app_ends() -> None:
    handle = launch("utils.sh", "--", "echo a; sleep 0.5; echo b; sleep 0.5; echo c")
    r = tsm("log", "-f", handle)
    assert r.returncode == 0
    assert r.stdout == "sh/0 a\nsh/0 b\nsh/0 c\n"


def test_list_empty_and_builtins_runopts_lint(workdir: Path) -> None:
    assert tsm("list").stdout == "no apps\n"

    r = tsm("builtins")
    assert r.returncode == 0
    names = [ln.split()[0] for ln in r.stdout.splitlines()]
    assert {"utils.echo", "utils.sh", "dist.ddp"} <= set(names)

    r = tsm("runopts", "local")
    assert r.returncode == 0
    assert r.stdout.startswith("local:\n") and "grace_period" in r.stdout
    r = tsm("runopts")
    assert r.returncode == 0 and "local:" in r.stdout and "Traceback" not in r.stderr

    good = workdir / "comp.py"
    good.write_text(
        "from tsm.specs.api import AppDef, Role\n\n\n"
        "def hello(msg: str = 'hi') -> AppDef:\n"
        '    """Say hello.\n\n    Args:\n        msg: what to say\n    """\n'
        "    return AppDef(name='hello', roles=[Role(name='hello', entrypoint='echo', args=[msg])])\n"
    )
    r = tsm("lint", str(good))
    assert r.returncode == 0 and r.stdout.endswith(": ok\n")
    r = tsm("run", f"{good}:hello", "--msg", "from a file")
    assert r.returncode == 0 and r.stdout == "hello/0 from a file\n"


# -- Ctrl-C --------------------------------------------------------------------------------------------------
def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """One line of the process's stdout; "" if none comes before the hang guard ``timeout``."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else ""


def _interactive() -> None:
    """In the child: SIGINT as in a terminal (a background job, like this test run may be, ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cancels_the_app_and_exits_130() -> None:
    marker = sleep_marker()
    proc = subprocess.Popen(
        [*TSM, "run", "-c", "grace_period=5", "utils.sh", "--num_replicas", "2", "--",
         f"echo started; sleep {marker}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), preexec_fn=_interactive,
    )
    try:
        # Both replicas have started and written all they will before Ctrl-C.
        assert sorted([_readline(proc, HANG), _readline(proc, HANG)]) == ["sh/0 started\n", "sh/1 started\n"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    handle = next(ln.split()[-1] for ln in err.splitlines() if ln.startswith("tsm: launched "))
    assert "State: CANCELLED" in err
    assert_all_end(marker)  # no replica left running
    with get_runner() as runner:
        status = runner.status(handle)
    assert status.state == AppState.CANCELLED
    assert all(rep.state == AppState.CANCELLED for rs in status.roles for rep in rs.replicas)


# -- every error path: one line, the right exit code, never a traceback -------------------------------------
@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["run", "utils.ech"], "did you mean 'utils.echo'"),
        (["dryrun", "nosuch.component"], "no component named"),
        (["run", "-c", "foo=1", "utils.echo"], "unknown run option 'foo'"),
        (["run", "-c", "grace_period=abc", "utils.echo"], "grace_period"),
        (["run", "-c", "novalue", "utils.echo"], "name=value"),
        (["dryrun", "-c", "=1", "utils.echo"], "empty option name"),
        (["run", "-s", "lcal", "utils.echo"], "did you mean 'local'"),
        (["runopts", "lcal"], "did you mean 'local'"),
        (["status", "lcal://default/echo-1"], "did you mean 'local'"),
        (["status", "not-a-handle"], "malformed app handle"),
        (["describe", "local://default/"], "malformed app handle"),
        (["wait", "local://default/a/b"], "malformed app handle"),
        (["cancel", "local://default/.."], "malformed app handle"),
        (["log", "local:/default/x"], "malformed app handle"),
        (["log", "local://default/x/sh/one"], "must be a number"),
        (["log", "--regex", "(", "local://default/echo-1"], "not a valid regular expression"),
        (["log", "--since", "yesterday", "local://default/echo-1"], "--since"),
        (["log", "--until", "5 minutes", "local://default/echo-1"], "--until"),
        (["rm"], "HANDLE"),
        (["--session", "bad name", "list"], "session name"),
        (["nosuchcommand"], "invalid choice"),
        (["lint", "/no/such/file.py"], "does not exist"),
        (["run"], "required"),
        (["log", "--streams", "both", "local://default/x"], "invalid choice"),
        (["run", "utils.sh", "-h", "gpu.hug", "--", "true"], "did you mean 'gpu.large'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv: list[str], expect: str) -> None:
    line = one_error_line(tsm(*argv), code=2)
    assert expect in line


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "utils.echo", "--bogus", "1"],
        ["run", "utils.echo", "--num_replicas", "two"],
        ["dryrun", "utils.python"],  # needs exactly one of -m, -c, --script
        ["run", "dist.ddp", "-j", "2y3", "--script", "train.py"],
    ],
)
def test_component_argument_errors_show_usage_then_one_error(argv: list[str]) -> None:
    r = tsm(*argv)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"usage: tsm run {argv[1]}")
    assert lines[-1].startswith("error: ")
    assert sum(ln.startswith("error") for ln in lines) == 1


@pytest.mark.parametrize("cmd", ["status", "describe", "wait", "cancel", "log", "rm"])
def test_unknown_app_exits_2_with_one_line(cmd: str) -> None:
    line = one_error_line(tsm(cmd, "local://default/echo-00000000"), code=2)
    assert "unknown app local://default/echo-00000000" in line


def test_unknown_role_or_replica_in_log_path() -> None:
    handle = launch("utils.sh", "--num_replicas", "2", "--", "echo x")
    assert "no replica trainer/*" in one_error_line(tsm("log", f"{handle}/trainer"))
    assert "no replica sh/7" in one_error_line(tsm("log", f"{handle}/sh/7"))
    assert tsm("wait", handle).returncode == 0


def test_invalid_app_is_a_failure_not_a_traceback() -> None:
    line = one_error_line(tsm("run", "utils.echo", "--num_replicas", "0"), code=1)
    assert "num_replicas" in line
    line = one_error_line(tsm("run", "utils.binary", "--entrypoint", "/no/such/program"), code=1)
    assert "/no/such/program" in line


def test_debug_shows_the_traceback() -> None:
    r = tsm("--debug", "status", "not-a-handle")
    assert r.returncode != 0
    assert "Traceback" in r.stderr and "MalformedAppHandleError" in r.stderr


def test_ctrl_c_during_submission_is_held_until_attached() -> None:
    """A Ctrl-C while the app is being submitted is raised only once tsm can cancel what it launched."""
    from tsm.cli.cmd_run import _HeldInterrupt

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        held = _HeldInterrupt()
        os.kill(os.getpid(), signal.SIGINT)  # a real signal, "during submission"
        assert held.hit
        with pytest.raises(KeyboardInterrupt):
            held.release()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        quiet = _HeldInterrupt()
        quiet.release()  # no Ctrl-C: nothing raised
    finally:
        signal.signal(signal.SIGINT, old)
