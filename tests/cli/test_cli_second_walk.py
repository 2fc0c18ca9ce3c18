"""What a second newcomer tripped over on the command line (issue 45): options that were lost, lists that hid
apps, errors that named no fix. Each test failed on the tree before its fix; real ``tsm`` commands (in this
process where nothing but the output is looked at, a ``tsm`` process where the environment matters) and the
real local scheduler throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.cli import _exits
from tsm.cli.main import main
from tsm.runner.api import get_runner
from tsm.specs.api import AppDef, AppState, Role
from tsm.sweep.state import SweepHandle, SweepState, sweep_dir

ROOT = Path(__file__).resolve().parents[2]
HANG = 300  # seconds: a guard against a hung command, never a performance claim


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (project / "train.py").write_text("import sys\nprint('train', *sys.argv[1:])\n")
    yield project


def tsm(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``tsm ARGV`` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tsm_process(*argv: str, env: dict[str, str] | None = None, block: str | None = None) -> subprocess.CompletedProcess[str]:
    """``tsm ARGV`` as its own process; ``block`` names a module that process cannot import (an extra not
    installed)."""
    code = "import sys\n"
    if block:
        code += f"sys.modules[{block!r}] = None\n"
    code += "from tsm.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=HANG,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


# -- 1. a repeated -c merges; a key given twice is an error naming it ---------------------------------------
LONG_RUNS = ["-c", "time_limit=2h", "-c", "warn_signal=USR1", "-c", "warn_before=5m", "-c", "requeue_on_time_limit=true"]


@pytest.mark.parametrize("command", [["dryrun"], ["run", "--dryrun"]])
def test_repeated_c_options_all_reach_the_request(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """docs/long-runs.md's own line: the time limit given in the first -c is there with the requeue of the last."""
    code, out, err = tsm(capsys, *command, *LONG_RUNS, "-c", "grace_period=3", "utils.python", "--script", "train.py")
    assert code == _exits.OK, err
    assert "# lifecycle: time limit 2h (requeued up to 3 time(s)), warning USR1 5m before" in out
    assert "grace period 3s" in out


def test_repeated_c_options_all_reach_every_sweep_trial(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = tsm(capsys, "sweep", "--dryrun", "-c", "grace_period=3", "-c", "time_limit=1h", "utils.echo",
                         "--msg", "a,b")
    assert code == _exits.OK, err
    assert "grace period 3s" in out and "time limit 1h" in out


@pytest.mark.parametrize("command", [["dryrun"], ["run", "--detach"], ["sweep", "--dryrun"]])
@pytest.mark.parametrize("cfg", [["-c", "grace_period=3", "-c", "grace_period=4"], ["-c", "grace_period=3,grace_period=4"]])
def test_an_option_given_twice_is_a_usage_error_naming_it(command: list[str], cfg: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--msg", "a,b"] if command[0] == "sweep" else []
    code, out, err = tsm(capsys, *command, *cfg, "utils.echo", *args)
    assert code == _exits.USAGE
    assert err == "error: -c: run option 'grace_period' is given twice ('3' and '4'); give each option once\n"
    assert out == ""
    with get_runner() as runner:
        assert runner.list(None) == []  # nothing submitted


def test_runner_cfg_from_str_refuses_an_option_two_strings_give() -> None:
    from tsm.errors import InvalidRunOptionError

    with get_runner() as runner:
        assert runner.cfg_from_str("local", "grace_period=3", "queue=true") == {"grace_period": 3.0, "queue": True}
        with pytest.raises(InvalidRunOptionError, match="'grace_period' is given twice"):
            runner.cfg_from_str("local", "grace_period=3", "grace_period=4")


# -- 3. tsm list --limit N: the newest N, whatever they are ---------------------------------------------------
def _run_ended(runner: object, name: str) -> str:
    app = AppDef(name, [Role("w", entrypoint="true")])
    handle: str = runner.run(app, "local")  # type: ignore[attr-defined]
    status = runner.wait(handle)  # type: ignore[attr-defined]
    assert status is not None and status.state == AppState.SUCCEEDED
    return handle


def _sweep(sweep_id: str, created: float, trials: list[str]) -> str:
    handle = SweepHandle("default", sweep_id)
    state = SweepState(sweep_dir(handle), create=True)
    try:
        state.init({"handle": str(handle), "session": "default", "component": "utils.echo", "created": created,
                    "state": "SUCCEEDED", "total": len(trials) or 1, "name": sweep_id},
                   [{"msg": str(i)} for i in range(len(trials) or 1)], [f"{sweep_id}-{i}" for i in range(len(trials) or 1)])
        for i, h in enumerate(trials):
            state.set_trial(i, "SUCCEEDED", handle=h)
    finally:
        state.close()
    return str(handle)


def test_list_limit_shows_the_newest_entries_and_no_old_sweep_before_newer_apps(capsys: pytest.CaptureFixture[str]) -> None:
    old_sweep = _sweep("old", time.time() - 86400, [])
    with get_runner() as runner:
        apps = [_run_ended(runner, f"app{i}") for i in range(5)]
        new_created = time.time()
        trials = [_run_ended(runner, f"new-{i}") for i in range(4)]  # the newest rows are a sweep's trials
    new_sweep = _sweep("new", new_created, trials)
    code, out, err = tsm(capsys, "list", "--limit", "3")
    assert code == _exits.OK, err
    shown = [line.split()[0] for line in out.splitlines()[1:]]
    assert shown == [new_sweep, apps[4], apps[3]]
    assert old_sweep not in out and "showing the newest 3 apps only" in err
    code, out, _ = tsm(capsys, "list", "--all")
    assert [line.split()[0] for line in out.splitlines()[1:]] == [new_sweep, *reversed(apps), old_sweep]


# -- 4. a backend without its extra names the pip install line -------------------------------------------------
def _without_extra(module: str, argv: list[str]) -> None:
    r = tsm_process(*argv, block=module)
    assert r.returncode == _exits.FAILED, r.stderr
    assert r.stderr == (f"error: the {module} scheduler needs the Python package '{module}': "
                        f"pip install 'tsm[{module}]'\n")


@pytest.mark.parametrize(("module", "argv"), [
    ("kubernetes", ["list", "-s", "kubernetes"]),
    ("docker", ["run", "-s", "docker", "--workspace", ".", "utils.echo", "--image", "python:3"]),
])
def test_a_backend_without_its_extra_says_which_pip_install_to_run(module: str, argv: list[str]) -> None:
    _without_extra(module, argv)


def test_ray_without_its_extra_says_which_pip_install_to_run() -> None:
    """A Ray run packs the job's code with Ray's own packaging, here; the head is the fake dashboard of the Ray
    client's tests (the same against the real head: ``tests/integration``)."""
    from schedulers.ray.test_ray_client import FakeDashboard

    head = FakeDashboard()
    try:
        _without_extra("ray", ["run", "-s", "ray", "-c", f"address={head.address}", "utils.echo"])
        assert not [r for r in head.requests if r[0] == "POST"]  # nothing submitted
    finally:
        head.close()


# -- 5. tsm rm --older-than does what it can, and says what it could not ----------------------------------------
def test_rm_older_than_removes_every_app_it_can_reach_and_names_the_others(tsm_home: Path) -> None:
    """A Ray app whose head does not answer (``RAY_ADDRESS`` on a port nothing listens on) is older than the local
    apps, so it is the first one tried; before, nothing was removed."""
    with get_runner() as runner:
        runner.history.add("ray://default/gone-1", "ray", "default", "gone-1", None, {})
        local = [_run_ended(runner, f"a{i}") for i in range(2)]
    r = tsm_process("rm", "--older-than", "0", env={"RAY_ADDRESS": "http://127.0.0.1:9"})
    assert r.returncode == _exits.FAILED
    assert r.stdout.splitlines() == [f"removed {h}" for h in local]
    lines = r.stderr.splitlines()
    assert lines[0].startswith("tsm: could not remove ray://default/gone-1: no Ray cluster answers at http://127.0.0.1:9")
    assert lines[1:] == ["error: 1 app(s) not removed (above); the others were"]
    with get_runner() as runner:
        assert [a.app_handle for a in runner.list(None)] == ["ray://default/gone-1"]  # kept, to try again


# -- 6. after make demo, where tsm is --------------------------------------------------------------------------
def test_make_demo_ends_by_saying_where_tsm_is_and_how_to_activate_it(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    plan = subprocess.run(["make", "-s", "-n", "--no-print-directory", "-C", str(ROOT), "demo", f"VENV={venv}"],
                          capture_output=True, text=True, timeout=HANG, check=True).stdout.splitlines()
    said = subprocess.run(["bash", "-c", plan[-1]], capture_output=True, text=True, timeout=HANG, check=True).stdout
    assert f"{venv}/bin/tsm" in said and f"source {venv}/bin/activate" in said


# -- 7. dist.ddp without torch where its replicas run: refused at dry run, with the install line ---------------
def test_dist_ddp_on_local_without_torch_is_refused_at_dry_run_with_the_install_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "bare"  # an environment without torch, activated as a user would
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(bare)],
                   check=True, timeout=HANG)
    monkeypatch.setenv("VIRTUAL_ENV", str(bare))
    code, out, err = tsm(capsys, "dryrun", "dist.ddp", "-j", "1x2", "--script", "train.py")
    assert code == _exits.FAILED and out == ""
    python = f"{bare}/bin/python"
    assert err == (f"error: role 'train' needs the Python package 'torch' in the python its replicas run, {python} "
                   f"(the activated environment $VIRTUAL_ENV), which does not have it: {python} -m pip install torch, "
                   "or run them with a python that has it (activate its environment, or -c python=PATH)\n")
    monkeypatch.delenv("VIRTUAL_ENV")  # the interpreter running tsm has torch (make test installs it)
    pytest.importorskip("torch")
    code, out, err = tsm(capsys, "dryrun", "dist.ddp", "-j", "1x2", "--script", "train.py")
    assert code == _exits.OK, err


# -- 10. tsm dryrun --workspace, as tsm run --dryrun --workspace -----------------------------------------------
def test_dryrun_takes_workspace_and_prints_what_run_dryrun_prints(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workspace", ".", "utils.python", "--script", "train.py"]
    code, dry, err = tsm(capsys, "dryrun", *argv)
    assert code == _exits.OK, err
    code, run_dry, err = tsm(capsys, "run", "--dryrun", *argv)
    assert code == _exits.OK, err
    assert dry.startswith("=== workspace ===\nworkspace ") and "=== scheduler request (local) ===" in dry
    strip = [line for line in dry.splitlines() if "python-" not in line and "snapshot" not in line]
    assert strip == [line for line in run_dry.splitlines() if "python-" not in line and "snapshot" not in line]


# -- 13. sweep show --json: parameters of their types ---------------------------------------------------------
TYPED = '''
from tsm import AppDef, Role


def fit(lr: float = 0.1, batch: int = 32, opt: str = "sgd", tag: str = "", warm: bool = False) -> AppDef:
    return AppDef("fit", [Role("fit", entrypoint="true")])
'''


def test_sweep_show_json_gives_each_parameter_the_type_of_its_component_parameter(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / "fit.py").write_text(TYPED)
    handle = SweepHandle("default", "typed")
    state = SweepState(sweep_dir(handle), create=True)
    try:
        params = {"lr": "0.01", "batch": "64", "opt": "adam", "tag": "1e3", "warm": "true"}
        state.init({"handle": str(handle), "session": "default", "component": f"{workdir / 'fit.py'}:fit",
                    "created": time.time(), "state": "SUCCEEDED", "total": 1, "name": "fit"}, [params], ["typed-0"])
    finally:
        state.close()
    code, out, err = tsm(capsys, "sweep", "show", str(handle), "--json")
    assert code == _exits.OK, err
    [row] = json.loads(out)
    assert row["params"] == {"lr": 0.01, "batch": 64, "opt": "adam", "tag": "1e3", "warm": True}
    code, text, err = tsm(capsys, "sweep", "show", str(handle))
    assert code == _exits.OK and "0.01" in text and "64" in text  # the table shows them as given
