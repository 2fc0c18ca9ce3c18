"""Issue 30 item 2: what ``python`` means in a replica -- one rule (:mod:`tsm.schedulers.common.interpreter`),
the same on local and Slurm, right in the issue's three cases; its overrides; and the local scheduler
following it in a real run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tsm.runner.api import get_runner
from tsm.schedulers.common.interpreter import replica_python
from tsm.specs.api import AppDef, AppState, Role


def _venv(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.symlink_to(sys.executable)
    return py


def test_rule_the_three_cases_of_the_issue(tmp_path: Path) -> None:
    venv, tool = _venv(tmp_path / "venv"), _venv(tmp_path / "pipx-tsm")
    # (a) the Python API run by a virtualenv's interpreter that is not activated
    got = replica_python(environ={"PATH": "/usr/bin"}, executable=str(venv))
    assert got.path == str(venv) and "running tsm" in got.why
    # (b) tsm in its own environment (pipx) while the user's environment is activated: the user's wins
    got = replica_python(environ={"PATH": f"{venv.parent}:/usr/bin", "VIRTUAL_ENV": str(venv.parent.parent)},
                         executable=str(tool))
    assert got.path == str(venv) and "$VIRTUAL_ENV" in got.why
    # (c) venv/bin/tsm, not activated: its own interpreter (symlink kept: the venv stays itself)
    got = replica_python(environ={"PATH": "/usr/bin"}, executable=str(venv))
    assert got.bin_dir == str(venv.parent)
    # conda's base, always activated on many clusters, does not count as a choice
    got = replica_python(environ={"CONDA_PREFIX": str(tool.parent.parent), "CONDA_DEFAULT_ENV": "base"},
                         executable=str(venv))
    assert got.path == str(venv)


def test_rule_overrides_role_env_then_run_option(tmp_path: Path) -> None:
    a, b = _venv(tmp_path / "a"), _venv(tmp_path / "b")
    env = {"VIRTUAL_ENV": str(tmp_path / "b")}
    assert replica_python({"TSM_PYTHON": str(a)}, str(b), environ=env).path == str(a)
    assert replica_python({}, str(tmp_path / "a"), environ=env).path == str(a)  # an environment's root
    assert replica_python({}, str(a.parent), environ=env).path == str(a)  # its bin directory
    assert replica_python({}, None, environ=env).path == str(b)



def test_local_case_b_the_activated_environment_wins_over_tsms_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tsm installed in its own environment (here: this venv), the user's environment activated: a replica's
    ``python`` is the user's, as the shell's would be."""
    user = _venv(tmp_path / "user-env")
    monkeypatch.setenv("VIRTUAL_ENV", str(user.parent.parent))
    monkeypatch.setenv("PATH", f"{user.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    app = AppDef("py", [Role("py", entrypoint="python", args=["-c", "import sys; print(sys.executable)"])])
    with get_runner("t") as runner:
        info = runner.dryrun(app, "local")
        assert f"PATH={user.parent}" in str(info)  # the dry run shows the interpreter's directory first
        handle = runner.schedule(info)
        status = runner.wait(handle, timeout=60)
        assert status is not None and status.state == AppState.SUCCEEDED
        lines = list(runner.log_lines(handle, "py", 0))
    assert "".join(lines).strip() == str(user)


@pytest.mark.parametrize("where", ["role env", "run option", "VIRTUAL_ENV"])
def test_a_python_path_with_a_newline_is_refused_before_it_reaches_a_batch_script(tmp_path: Path,
                                                                                  where: str) -> None:
    """A newline in the chosen path would start a command of its own in Slurm's script (its ``# python:`` line)."""
    from tsm.errors import InvalidRunOptionError
    from tsm.schedulers.slurm import create_scheduler

    hostile = "/opt/py\ntouch /tmp/tsm-pwned #"
    env = {"TSM_PYTHON": hostile} if where == "role env" else {}
    cfg = {"python": hostile} if where == "run option" else {}
    cfg["job_dir"] = str(tmp_path / "job")
    venv = tmp_path / "venv\nid"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    app = AppDef("a", [Role("r", entrypoint="python", args=["x.py"], env=env)])
    sched = create_scheduler("s")
    old = os.environ.get("VIRTUAL_ENV")
    if where == "VIRTUAL_ENV":
        os.environ["VIRTUAL_ENV"] = str(venv)
    try:
        with pytest.raises(InvalidRunOptionError, match="control characters"):
            sched.submit_dryrun(app, cfg)
    finally:
        if old is None:
            os.environ.pop("VIRTUAL_ENV", None)
        else:
            os.environ["VIRTUAL_ENV"] = old
