"""What a new user meets on the ``tsm`` command line: one exit-code table for every subcommand, errors that
say what to fix ("did you mean", where a flag goes), a wait that says why it gave up, a status that says why
an app failed, a list that says when it is cut short. Real ``tsm`` processes against real local apps.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testutil import assert_all_end, sleep_marker
from tsm.cli import _exits
from tsm.cli.cmd_dryrun import ID_NOTE
from tsm.cli.main import SUBCOMMANDS
from tsm.runner.api import get_runner

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 120  # seconds: a guard against a hung command, never a performance claim
README = Path(__file__).resolve().parents[2] / "README.md"


def tsm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``tsm ARGS`` to completion."""
    return subprocess.run([*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL,
                          env=env, errors="backslashreplace")  # fmt: skip


def one_error_line(r: subprocess.CompletedProcess[str], code: int = _exits.USAGE) -> str:
    """Check a failed command: its exit code, exactly one line on stderr, no traceback; return the line."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private directory with no config files around; whatever a failed test left running is stopped."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TSM_DEBUG", raising=False)
    yield tmp_path
    with get_runner() as runner:
        for app in runner.list("local"):
            if not app.state.is_terminal:
                runner.cancel(app.app_handle)


def launch(*component: str) -> str:
    """``tsm run --detach COMPONENT...``; returns the handle."""
    r = tsm("run", "--detach", "-c", "grace_period=5", *component)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def ended(*component: str) -> str:
    """Launch a component and wait for it to end; returns the handle."""
    handle = launch(*component)
    assert tsm("wait", handle).returncode in (0, 1)
    return handle


# -- the exit-code table -------------------------------------------------------------------------------------
def test_exit_code_table_is_in_help_and_readme() -> None:
    r = tsm("--help")
    assert r.returncode == 0
    help_text = " ".join(r.stdout.split())
    readme = README.read_text()
    for code, meaning in _exits.TABLE:
        assert re.search(rf"^\s+{code}\s", r.stdout, re.MULTILINE), (code, r.stdout)
        assert " ".join(meaning.split()) in help_text
        assert re.search(rf"^\| {code} +\|", readme, re.MULTILINE), f"README has no row for exit code {code}"


def test_every_subcommand_exits_by_the_table(workdir: Path) -> None:
    """Each subcommand: its success, its usage error and (where it takes one) an unknown handle."""
    ok = ended("utils.echo", "--msg", "hi")
    failed = ended("utils.sh", "--", "exit 3")
    marker = sleep_marker()
    running = launch("utils.sh", "--", f"sleep 600 {marker}")
    unknown = "local://default/echo-00000000"
    good = workdir / "comp.py"
    good.write_text(
        "from tsm.specs.api import AppDef, Role\n\n\n"
        "def hello(msg: str = 'hi') -> AppDef:\n"
        '    """Say hello.\n\n    Args:\n        msg: what to say\n    """\n'
        "    return AppDef(name='hello', roles=[Role(name='hello', entrypoint='echo', args=[msg])])\n"
    )
    bad = workdir / "bad.py"
    bad.write_text("def broken(:\n")
    ok_, failed_, usage, timeout = _exits.OK, _exits.FAILED, _exits.USAGE, _exits.TIMEOUT
    table: list[tuple[list[str], int]] = [
        ([], usage),
        (["nosuchcommand"], usage),
        (["run", "utils.echo"], ok_),
        (["run", "utils.sh", "--", "exit 3"], failed_),
        (["run", "nosuch.component"], usage),
        (["run", "--bogus", "utils.echo"], usage),
        (["dryrun", "utils.echo"], ok_),
        (["dryrun", "utils.ech"], usage),
        (["status", ok], ok_),
        (["status", failed], ok_),  # status reports; it does not fail because the app did
        (["status", unknown], usage),
        (["status", "not-a-handle"], usage),
        (["describe", ok], ok_),
        (["describe", unknown], usage),
        (["log", ok], ok_),
        (["log", unknown], usage),
        (["log", f"{ok}/nosuchrole"], usage),
        (["list"], ok_),
        (["list", "--limit", "x"], usage),
        (["wait", ok], ok_),
        (["wait", failed], failed_),
        (["wait", "--timeout", "0.1", running], timeout),
        (["wait", unknown], usage),
        (["wait", "--timeout", "nan", ok], usage),
        (["rm", running], failed_),  # it could not do what was asked: the app is still running
        (["rm", unknown], usage),
        (["rm"], usage),
        (["builtins"], ok_),
        (["builtins", "extra"], usage),
        (["runopts", "local"], ok_),
        (["runopts", "lcal"], usage),
        (["lint", str(good)], ok_),
        (["lint", str(bad)], failed_),
        (["lint", str(workdir / "missing.py")], usage),
        (["tracker", "list"], ok_),
        (["tracker", "show", unknown], usage),
        (["exec", running, "--", "true"], ok_), (["exec", running, "--", "sh", "-c", "exit 5"], 5),  # its own code
        (["exec", ok, "--", "true"], _exits.NOT_RUNNING), (["exec", f"{running}/nosuch/0", "--", "true"], usage),
        (["exec", unknown, "--", "true"], usage), (["stack", ok], _exits.NOT_RUNNING), (["stack", unknown], usage),
        (["stack", running], failed_),  # sh and sleep: no Python process to dump
        (["port-forward", running, "x"], usage), (["port-forward", ok, "80"], _exits.NOT_RUNNING),
        (["cancel", unknown], usage),
        (["cancel", running], ok_),
        (["top", "--once"], ok_),
        (["top", "--interval", "0"], usage),
        (["serve", "--port", "70000"], usage),
        (["sweep", "list"], ok_),
        (["sweep", "status", "sweep://default/nosuch-00000000"], usage),
        (["sweep", "--parallel", "0", "utils.echo", "--msg", "a,b"], usage),
        (["env", "list"], ok_),
        (["env", "show", "0000"], usage),
        (["env", "gc", "--older-than", "never"], usage),
        (["env"], usage),
        (["dryrun", "--environment", str(workdir / "missing" / "uv.lock"), "utils.echo"], failed_),
        (["rm", ok], ok_),
    ]
    wrong = []
    for argv, code in table:
        r = tsm(*argv)
        if r.returncode != code or "Traceback" in r.stderr or "internal error" in r.stderr:
            wrong.append(f"tsm {' '.join(argv)}: exit {r.returncode}, expected {code}: {r.stderr[-300:]!r}")
    assert not wrong, "\n".join(wrong)
    assert_all_end(marker)
    assert {argv[0] for argv, _ in table if argv} >= set(SUBCOMMANDS)  # every subcommand is in the table


@pytest.mark.parametrize("cmd", ["status", "describe", "wait", "cancel", "log", "rm"])
def test_an_unknown_handle_is_the_same_error_in_every_command(cmd: str) -> None:
    line = one_error_line(tsm(cmd, "local://default/echo-00000000"))
    assert line == (
        "error: unknown app local://default/echo-00000000: its scheduler does not know it (never launched, or "
        "removed); `tsm list` shows known apps"
    )


def test_cancel_goes_on_past_an_unknown_handle_and_still_exits_2() -> None:
    marker = sleep_marker()
    running = launch("utils.sh", "--", f"sleep 600 {marker}")
    r = tsm("cancel", "local://default/echo-00000000", running)
    assert r.returncode == _exits.USAGE, r.stderr
    assert r.stdout == f"{running}: CANCELLED\n"
    assert "unknown app local://default/echo-00000000" in r.stderr
    assert_all_end(marker)


def test_ctrl_c_in_wait_exits_130() -> None:
    marker = sleep_marker()
    handle = launch("utils.sh", "--", f"sleep 600 {marker}")
    proc = subprocess.Popen([*TSM, "wait", handle], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        # wait until the command is really waiting (it has opened the store) before Ctrl-C
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline and proc.poll() is None:
            if any("tsm.db" in target for target in _open_files(proc.pid)):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == _exits.INTERRUPTED, err
    assert "Traceback" not in err
    with get_runner() as runner:
        status = runner.status(handle)
        assert status is not None and not status.state.is_terminal  # wait only watches: the app goes on
        runner.cancel(handle)
    assert_all_end(marker)


def _open_files(pid: int) -> list[str]:
    """What ``pid``'s descriptors point to now; one closed between the listing and the read is left out (the
    command opens and closes files all through its start: its imports)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    out = []
    for fd in fds:
        with contextlib.suppress(OSError):
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


# -- bad values: checked where they are parsed (issue 11, item 14) -------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["wait", "--timeout", "nan", "{h}"], "--timeout"),
        (["wait", "--timeout", "-1", "{h}"], "seconds >= 0"),
        (["wait", "--timeout", "soon", "{h}"], "inf for no timeout"),
        (["log", "--since", "0001-01-01", "{h}"], "--since '0001-01-01' is out of range"),
        (["log", "--until", "0001-01-01T00:00:00+00:00", "{h}"], "--until"),
        (["log", "--since", "99999999d", "{h}"], "out of range"),
        (["rm", "--older-than", "nan"], "--older-than"),
        (["rm", "--older-than", "-1"], "number of days"),
        (["list", "--limit", "0"], "--limit"),
    ],
)
def test_bad_values_are_usage_errors_not_internal_errors(argv: list[str], expect: str) -> None:
    handle = ended("utils.echo")
    line = one_error_line(tsm(*[a.replace("{h}", handle) for a in argv]))
    assert expect in line, line


def test_wait_timeout_inf_means_no_timeout() -> None:
    handle = launch("utils.sh", "--", "sleep 1")
    for value in ("inf", "1e308"):  # 1e308 once overflowed the scheduler's select()
        r = tsm("wait", "--timeout", value, handle)
        assert r.returncode == _exits.OK, r.stderr
        assert "State: SUCCEEDED" in r.stdout


def test_non_utf8_tsm_home_is_one_clear_error(tmp_path: Path) -> None:
    home = os.fsencode(tmp_path) + b"/home-\xff"
    env = {**os.environ}
    env_b = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    env_b[b"TSM_HOME"] = home
    for argv in (["list"], ["run", "utils.echo"], ["status", "local://default/echo-00000000"]):
        r = subprocess.run([*TSM, *argv], capture_output=True, env=env_b, timeout=HANG)  # type: ignore[arg-type]
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode == _exits.USAGE, err
        assert err.count("\n") == 1 and "TSM_HOME" in err and "not valid UTF-8" in err and "\\xff" in err, err
        assert "internal error" not in err and "Traceback" not in err


# -- wait says why it gave up --------------------------------------------------------------------------------
def test_wait_timeout_says_the_state_it_is_still_in() -> None:
    marker = sleep_marker()
    handle = launch("utils.sh", "--", f"sleep 600 {marker}")
    r = tsm("wait", "--timeout", "0.2", handle)
    assert r.returncode == _exits.TIMEOUT
    assert r.stderr.splitlines() == [f"tsm: timed out after 0.2s: {handle} is still RUNNING"], r.stderr
    tsm("cancel", handle)
    assert_all_end(marker)


# -- did you mean, and where a flag goes ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["rnu", "utils.echo"], "did you mean 'run'?"),
        (["stauts", "x"], "did you mean 'status'?"),
        (["run", "--detatch", "utils.echo"], "unrecognized option '--detatch' (did you mean '--detach'?)"),
        (["wait", "--timout", "5", "local://default/x-1"], "did you mean '--timeout'?"),
        (["status", "--jsno", "local://default/x-1"], "did you mean '--json'?"),
        (["log", "--folow", "local://default/x-1"], "did you mean '--follow'?"),
        (["log", "--streams", "stdrr", "local://default/x-1"], "did you mean 'stderr'?"),
        (["list", "--debug"], "--debug is an option of tsm itself: put it before the subcommand (tsm --debug list"),
        (["list", "--session", "s"], "tsm --session VALUE list"),
    ],
)
def test_misspelt_subcommands_and_flags_get_did_you_mean(argv: list[str], expect: str) -> None:
    line = one_error_line(tsm(*argv))
    assert expect in line, line


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["run", "utils.echo", "--detach"], "--detach is an option of tsm run, and options of tsm run go before "
                                            "COMPONENT"),
        (["run", "utils.echo", "--msg", "hi", "--dryrun"], "tsm run --dryrun utils.echo ..."),
        (["dryrun", "utils.echo", "-s", "local"], "tsm dryrun -s VALUE utils.echo ..."),
    ],
)
def test_flags_after_component_are_explained(argv: list[str], expect: str) -> None:
    r = tsm(*argv)
    assert r.returncode == _exits.USAGE and r.stdout == "", r.stderr
    assert "Traceback" not in r.stderr
    last = r.stderr.splitlines()[-1]
    assert last.startswith("error: ") and expect in last, last


def test_a_component_flag_named_like_a_run_flag_still_works() -> None:
    """``utils.python -c CODE`` is the component's own -c, not tsm run's: no false hint, it runs."""
    r = tsm("run", "utils.python", "-c", "print('own -c')")
    assert r.returncode == 0, r.stderr
    assert "python/0 own -c" in r.stdout


# -- list says when it is capped -----------------------------------------------------------------------------
def test_list_says_when_capped_and_offers_limit_and_all() -> None:
    handles = [ended("utils.echo", "--msg", str(i)) for i in range(3)]
    r = tsm("list", "--limit", "2")
    assert r.returncode == 0
    rows = r.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == handles[::-1][:2]  # newest first
    assert r.stderr == "tsm: showing the newest 2 apps only; use --limit N or --all to see more\n"
    for argv in (["list", "--all"], ["list", "--limit", "3"], ["list"]):
        r = tsm(*argv)
        assert len(r.stdout.splitlines()) == 4 and r.stderr == "", (argv, r.stdout, r.stderr)
    assert "not allowed with" in one_error_line(tsm("list", "--all", "--limit", "2"))


# -- status says why an app failed ---------------------------------------------------------------------------
def test_status_of_a_failed_app_names_the_replica_its_exit_code_and_stderr() -> None:
    handle = ended(
        "utils.sh", "--num_replicas", "2", "--",
        'if [ "$TSM_REPLICA_ID" = 0 ]; then echo out-line; echo first-err >&2; echo "last-err" >&2; exit 4; fi; '
        "sleep 600",
    )
    r = tsm("status", handle)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "Failed: sh/0 (exit code 4): exited with code 4" in lines
    i = lines.index("Last stderr lines of sh/0:")
    assert lines[i + 1:] == ["  | first-err", "  | last-err"]

    import json

    r = tsm("wait", handle)  # wait, too, says why the app it waited for failed
    assert r.returncode == _exits.FAILED
    assert r.stdout.splitlines()[-3:] == ["Last stderr lines of sh/0:", "  | first-err", "  | last-err"]

    data = json.loads(tsm("status", "--json", handle).stdout)
    assert data["failure"] == {
        "replica": "sh/0", "exit_code": 4, "signal": None, "message": "exited with code 4",
        "stderr_tail": ["first-err", "last-err"],
    }


def test_status_of_a_killed_app_names_the_signal() -> None:
    handle = ended("utils.sh", "--", "echo dying >&2; kill -9 $$")
    r = tsm("status", handle)
    assert "Failed: sh/0 (killed by SIGKILL)" in r.stdout, r.stdout
    assert "  | dying" in r.stdout
    import json

    failure = json.loads(tsm("status", "--json", handle).stdout)["failure"]
    assert failure["signal"] == "SIGKILL" and failure["replica"] == "sh/0"


def test_status_of_a_successful_app_has_no_failure() -> None:
    handle = ended("utils.echo")
    r = tsm("status", handle)
    assert "Failed:" not in r.stdout and "stderr" not in r.stdout
    import json

    assert json.loads(tsm("status", "--json", handle).stdout)["failure"] is None


# -- dry run and app ids -------------------------------------------------------------------------------------
def test_dry_run_says_the_app_id_is_assigned_at_submit() -> None:
    for argv in (["dryrun", "utils.echo"], ["run", "--dryrun", "utils.echo"]):
        r = tsm(*argv)
        assert r.returncode == 0, r.stderr
        assert r.stdout.rstrip("\n").splitlines()[-1] == ID_NOTE
    ids = {re.search(r"echo-[0-9a-f]{8}", tsm("dryrun", "utils.echo").stdout).group(0) for _ in range(2)}  # type: ignore[union-attr]
    assert len(ids) == 2  # what the note warns about: each dry run (and each run) gets its own id


# -- the README matches what tsm does ------------------------------------------------------------------------
def test_readme_log_example_names_a_role_dist_ddp_has(workdir: Path) -> None:
    """The tour launches ``dist.ddp ... --script train.py`` and then follows ``HANDLE/ROLE/0``: that role exists."""
    text = README.read_text()
    run = re.search(r"^\$ tsm run --detach (dist\.ddp .*?)\s+#", text, re.MULTILINE)
    log = re.search(r"^\$ tsm log -f local://default/[\w-]+/(\w+)/0 ", text, re.MULTILINE)
    assert run and log, "the README tour no longer has the dist.ddp run and log example"
    (workdir / "train.py").write_text("print('hi')\n")
    r = tsm("dryrun", *run.group(1).split())
    assert r.returncode == 0, r.stderr
    roles = set(re.findall(r"^# role (\S+):", r.stdout, re.MULTILINE))
    assert log.group(1) in roles, (log.group(1), roles)


def test_readme_links_stay_inside_the_repository() -> None:
    text = README.read_text()
    assert "../shared" not in text and "DESIGN.md" not in text
    root = README.parent
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" in target:
            continue
        assert (root / target).resolve().is_relative_to(root), target
        assert (root / target).exists(), f"README links to {target}, which is not in the repository"
    assert "timers" in text  # the run option that gives each app its expiration-timer server


@pytest.mark.torch
def test_torch_imports_without_the_numpy_warning() -> None:
    """``make test`` installs numpy with torch, so torchrun workers and the demo print no NumPy warning."""
    r = subprocess.run([sys.executable, "-W", "default", "-c", "import torch"], capture_output=True, text=True,
                       timeout=HANG)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "NumPy" not in r.stderr, r.stderr


def test_status_reads_the_stderr_tail_itself_when_the_scheduler_gives_no_report() -> None:
    """A backend with no ``structured_error_msg``: the failing replica is worked out from the replica states
    (a sibling stopped with SIGTERM is not blamed) and its last stderr lines are read from its log."""
    from dataclasses import replace

    from tsm.cli.cmd_status import failure_of, format_failure

    handle = ended(
        "utils.sh", "--num_replicas", "2", "--",
        'if [ "$TSM_REPLICA_ID" = 1 ]; then for i in $(seq 1 30); do echo "err $i" >&2; done; exit 7; fi; sleep 600',
    )
    with get_runner() as runner:
        status = runner.status(handle)
        assert status is not None
        failure = failure_of(runner, handle, replace(status, structured_error_msg=""))
    assert failure is not None
    assert failure["replica"] == "sh/1" and failure["exit_code"] == 7 and failure["signal"] is None
    assert failure["stderr_tail"] == [f"err {i}" for i in range(21, 31)]  # the last 10 lines
    text = format_failure(failure)
    assert text.startswith("Failed: sh/1 (exit code 7)") and text.endswith("  | err 30\n")
