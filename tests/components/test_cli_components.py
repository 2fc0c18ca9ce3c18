"""What a user sees of components on the command line: their help, argument errors, and file hints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def tsm(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tsm.cli.main", *argv], capture_output=True, text=True, timeout=60, cwd=cwd
    )


@pytest.mark.parametrize("command", ["run", "dryrun"])
def test_component_help_after_the_component(command: str) -> None:
    r = tsm(command, "dist.ddp", "-j", "2x1", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: tsm {command} dist.ddp") or r.stdout.startswith(
        "usage: tsm run dist.ddp"
    )
    assert "--script SCRIPT" in r.stdout and "--tee TEE" in r.stdout
    assert "-h is this component's -h option (a named resource in the builtins, as in TorchX)" in r.stdout


def test_h_is_the_named_resource_not_help() -> None:
    r = tsm("dryrun", "dist.ddp", "-h", "gpu.small", "-m", "train")
    assert r.returncode == 0, r.stderr
    assert "usage:" not in r.stdout


def test_help_of_a_component_without_h_has_no_note() -> None:
    r = tsm("run", "utils.echo", "--help")
    assert r.returncode == 0 and "Note: -h" not in r.stdout


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["utils.echo", "--bogus", "1"], "error: tsm run utils.echo: unrecognized arguments: --bogus 1"),
        (["utils.touch"], "error: tsm run utils.touch: the following arguments are required: --file"),
        (["dist.ddp", "-j", "2y3", "-m", "t"], "error: tsm run dist.ddp: -j '2y3': expected [min:]NxM"),
    ],
)
def test_argument_errors_are_one_usage_line_and_one_error_line(argv: list[str], error: str) -> None:
    r = tsm("run", *argv)
    assert r.returncode == 2 and r.stdout == ""
    usage, line = r.stderr.splitlines()
    assert usage.startswith(f"usage: tsm run {argv[0]} ") and usage.endswith(
        f"('tsm run {argv[0]} --help' lists the options)"
    )
    assert line.startswith(error)


def test_a_missing_script_fails_the_dry_run(tmp_path: Path) -> None:
    for component in ("dist.ddp", "utils.python"):
        r = tsm("dryrun", component, "--script", "train.py", cwd=tmp_path)
        assert r.returncode == 2
        assert f"--script 'train.py': no such file ({tmp_path}/train.py)" in r.stderr.splitlines()[-1]


def test_a_file_without_function_lists_its_components(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(
        "import tsm\n\ndef train(lr: float = 0.1) -> tsm.AppDef:\n    '''Train.'''\n    raise SystemExit\n\n"
        "def evaluate() -> tsm.AppDef:\n    '''Eval.'''\n    raise SystemExit\n\ndef helper() -> int:\n    return 1\n"
    )
    r = tsm("run", "jobs.py", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (
        "error: component 'jobs.py' names a file but no function: use jobs.py:train "
        "(components there: train, evaluate)\n"
    )
    assert "does not exist" in tsm("run", "missing.py", cwd=tmp_path).stderr
