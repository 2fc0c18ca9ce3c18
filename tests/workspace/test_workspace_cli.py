"""``tsm run --workspace DIR`` through the real command line and the real local scheduler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsm.workspace.dir import workspaces_home

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 120  # seconds: a guard against a hung command, never a performance claim

SCRIPT = "import os; print('cwd', os.getcwd()); print('data', open('data.txt').read())\n"


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "main.py").write_text(SCRIPT)
    (root / "data.txt").write_text("v1")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TSM_WORKSPACE", raising=False)
    return root


def tsm(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL, cwd=cwd,
        env={**os.environ, **env},
    )


def snapshots() -> list[str]:
    return sorted(p.name for p in (workspaces_home() / "snapshots").iterdir())


def test_run_with_a_workspace_runs_in_the_snapshot_and_reuses_it(ws: Path) -> None:
    first = tsm("run", "--workspace", ".", "utils.python", "--script", "main.py", cwd=ws)
    assert first.returncode == 0, first.stderr
    (snap,) = snapshots()
    assert f"cwd {workspaces_home() / 'snapshots' / snap}" in first.stdout and "data v1" in first.stdout
    assert "new snapshot: copied 2 files" in first.stderr
    second = tsm("run", "--workspace", ".", "utils.python", "--script", "main.py", cwd=ws)
    assert second.returncode == 0, second.stderr
    assert "reused the existing snapshot, copying nothing" in second.stderr
    assert snapshots() == [snap]


def test_dryrun_says_what_is_snapshotted_and_the_request_runs_there(ws: Path) -> None:
    r = tsm("run", "--dryrun", "--workspace", str(ws), "utils.python", "--script", "main.py", cwd=ws)
    assert r.returncode == 0, r.stderr
    (snap,) = snapshots()
    assert "=== workspace ===" in r.stdout and "2 files" in r.stdout and snap[:12] in r.stdout
    assert str(workspaces_home() / "snapshots" / snap) in r.stdout.split("=== scheduler request")[1]


def test_default_comes_from_tsm_workspace_and_empty_turns_it_off(ws: Path) -> None:
    on = tsm("run", "utils.python", "--script", "main.py", cwd=ws, TSM_WORKSPACE=str(ws))
    assert on.returncode == 0, on.stderr
    assert "cwd " + str(workspaces_home() / "snapshots") in on.stdout
    off = tsm("run", "--workspace", "", "utils.python", "--script", "main.py", cwd=ws, TSM_WORKSPACE=str(ws))
    assert off.returncode == 0, off.stderr
    assert f"cwd {ws}" in off.stdout and "workspace" not in off.stderr
    plain = tsm("run", "utils.python", "--script", "main.py", cwd=ws)
    assert f"cwd {ws}" in plain.stdout


@pytest.mark.parametrize("kind", ["missing", "escaping-link"])
def test_a_bad_workspace_is_a_one_line_usage_error(ws: Path, kind: str) -> None:
    target = str(ws / "nope")
    if kind == "escaping-link":
        (ws / "etc").symlink_to("/etc")
        target = str(ws)
    r = tsm("run", "--workspace", target, "utils.python", "--script", "main.py", cwd=ws)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: workspace")
    assert not snapshots()
