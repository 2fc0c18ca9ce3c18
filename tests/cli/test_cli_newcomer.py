"""What a newcomer tripped over on the command line (issue 30, items 6 and 10): hints that were wrong or
missing, handles spelt two ways, a status line that lagged behind the log. Real ``tsm`` processes where a
process is what the user runs; the status line is driven directly.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.cli import _exits, _live

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 120  # seconds: a guard against a hung command, never a performance claim


def tsm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL)


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "train.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    yield tmp_path


def test_script_args_after_double_dash_reach_the_script_and_bare_options_are_refused_as_in_torchx() -> None:
    """TorchX's ``utils.python`` takes ``*args`` as an argparse remainder: ``--lr 0.1`` right after the
    component's options is an unknown option there too, so the README writes ``-- --lr 0.1``."""
    ok = tsm("run", "utils.python", "--script", "train.py", "--", "--lr", "0.1")
    assert ok.returncode == 0, ok.stderr
    assert "python/0 args ['--lr', '0.1']" in ok.stdout
    bad = tsm("run", "utils.python", "--script", "train.py", "--lr", "0.1")
    assert bad.returncode == _exits.USAGE
    assert "--lr" in bad.stderr and "Traceback" not in bad.stderr


def test_component_own_c_option_gets_no_tsm_run_hint() -> None:
    r = tsm("run", "utils.python", "-c", "print(1)", "--script", "train.py")
    assert r.returncode == _exits.USAGE
    assert "exactly one of -m, -c or --script" in r.stderr
    assert "is an option of tsm run" not in r.stderr
    # a component without a -c of its own still gets it
    r = tsm("run", "utils.echo", "-c", "grace_period=1")
    assert r.returncode == _exits.USAGE and "-c is an option of tsm run" in r.stderr


@pytest.mark.parametrize("argv", [["--debgu", "list"], ["list", "--debgu"]])
def test_misspelt_global_flag_gets_did_you_mean(argv: list[str]) -> None:
    r = tsm(*argv)
    assert r.returncode == _exits.USAGE
    assert "did you mean '--debug'?" in r.stderr and len(r.stderr.splitlines()) == 1


def test_top_filter_with_a_misspelt_state_is_a_usage_error_with_a_hint() -> None:
    r = tsm("top", "--once", "--filter", "state:FAILD")
    assert r.returncode == _exits.USAGE
    assert "did you mean 'FAILED'?" in r.stderr and "no apps match" not in r.stdout
    ok = tsm("top", "--once", "--filter", "state:failed,SUCCEEDED name")
    assert ok.returncode == 0, ok.stderr


def test_list_with_an_alias_shows_the_handle_each_app_was_launched_with() -> None:
    handles = []
    for sched in ("local_cwd", "local"):
        r = tsm("run", "--detach", "-s", sched, "utils.echo", "--msg", "hi")
        assert r.returncode == 0, r.stderr
        handles.append(r.stdout.strip())
    assert handles[0].startswith("local_cwd://") and handles[1].startswith("local://")
    listed = {name: set(tsm("list", *extra).stdout.split()) for name, extra in
              (("all", []), ("local", ["-s", "local"]), ("local_cwd", ["-s", "local_cwd"]))}
    for name, words in listed.items():
        assert set(handles) <= words, (name, words)


def test_status_line_counts_a_replica_running_once_its_first_line_is_out() -> None:
    from tsm.specs.api import AppState, AppStatus, ReplicaStatus, RoleStatus

    tty, out = io.StringIO(), io.StringIO()
    line = _live.StatusLine(tty, out)
    pending = AppStatus(AppState.PENDING, roles=[RoleStatus("w", [ReplicaStatus(0, AppState.PENDING, "w")])])
    line.show_status(pending, time.monotonic(), force=True)
    assert tty.getvalue().endswith("1 pending")
    line.write_out("w/0 first line\n")  # the status query has not caught up: the line has
    last = tty.getvalue().rsplit("\r\x1b[K", 1)[-1]
    assert last.endswith("w: 1 running, 0 done, 0 failed"), last
    assert "waiting for the app to start" not in last
    assert out.getvalue() == "w/0 first line\n"


def test_every_workspace_kind_gets_the_launch_line() -> None:
    """Docker/Kubernetes (image) and Ray (working_dir) workspaces print the line local and Slurm print."""
    from tsm.cli._launch import WORKSPACE_METADATA_KEY, workspace_line
    from tsm.specs.api import AppDef, Role

    base = {"workspace": "/p", "snapshot": "/h/ws/abc", "files": 3, "bytes": 120, "digest": "ab" * 32}
    image = AppDef("a", [Role("t", image="tsm-workspace:1", metadata={WORKSPACE_METADATA_KEY: {
        **base, "docker_tag": "tsm-workspace:1", "build": False}})])
    assert workspace_line(image) == ("workspace /p -> /h/ws/abc (3 files, 120 bytes, sha256 abababababab): "
                                     "image tsm-workspace:1 reused, nothing to build (roles: t)")
    ray = AppDef("a", [Role("t", metadata={WORKSPACE_METADATA_KEY: {**base, "ray_working_dir": "/h/ws/abc"}})])
    assert "the Ray job's working_dir" in (workspace_line(ray) or "")
    assert workspace_line(AppDef("a", [Role("t")])) is None


def test_cli_reference_is_made_from_every_parser() -> None:
    from tsm.cli.main import SUBCOMMANDS
    from tsm.cli.reference import markdown

    text = markdown()
    for name in SUBCOMMANDS:
        assert f"## tsm {name}\n" in text
    assert "usage: tsm run" in text and "--detach" in text
