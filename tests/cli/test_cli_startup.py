"""The start-up path of ``tsm status``/``tsm list`` (issue 26): the few command lines taken without argparse
parse exactly as argparse parses them, everything else still goes through argparse, and those commands do
not build an argparse parser at all."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tsm.cli._parser import build_parser
from tsm.cli.main import _simple_args, main
from tsm.runner.api import get_runner

HANG = 120

TAKEN = [
    ["status", "local://default/echo-1a2b3c4d"],
    ["status", "local://default/echo-1a2b3c4d", "--json"],
    ["status", "not a handle at all"],
    ["status", ""],
    ["list"],
    ["list", "--all"],
    ["list", "-s", "local"],
    ["list", "--scheduler", "slurm"],
]

LEFT_TO_ARGPARSE = [
    [],
    ["status"],
    ["status", "-x"],
    ["status", "--json", "h"],
    ["status", "h", "--js"],
    ["status", "h", "--json", "x"],
    ["status", "h", "--", "x"],
    ["status", "--", "h"],
    ["list", "--limit", "5"],
    ["list", "--al"],
    ["list", "-s"],
    ["list", "-s", "-1"],
    ["list", "-slocal"],
    ["list", "--scheduler=local"],
    ["list", "--all", "--limit", "3"],
    ["--debug", "list"],
    ["--session", "x", "status", "h"],
    ["statu", "h"],
    ["log", "h"],
]


@pytest.mark.parametrize("argv", TAKEN)
def test_simple_forms_parse_as_argparse_does(argv: list[str]) -> None:
    simple = _simple_args(argv)
    assert simple is not None
    parsed, extra = build_parser(argv).parse_known_args(argv)
    assert extra == []
    assert vars(simple) == vars(parsed)


@pytest.mark.parametrize("argv", LEFT_TO_ARGPARSE)
def test_other_command_lines_go_through_argparse(argv: list[str]) -> None:
    assert _simple_args(argv) is None


def test_usage_errors_are_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["status"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "tsm status: error: the following arguments are required: handle (see tsm status --help)\n"
    )
    with pytest.raises(SystemExit) as e:
        main(["list", "--limit", "0"])
    assert e.value.code == 2
    assert "give a number from 1 to 1000000000, or --all" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["status", "HANDLE"], ["status", "HANDLE", "--json"], ["list"], ["list", "--all"]])
def test_queries_build_no_parser(argv: list[str]) -> None:
    runner = get_runner("startup")
    handle = runner.run_component("utils.echo", ["--msg", "hi"], scheduler="local")
    runner.wait(handle)
    runner.close()
    argv = [handle if a == "HANDLE" else a for a in argv]
    code = (
        "import sys, io, contextlib\n"
        "from tsm.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    assert main({argv!r}) == 0\n"
        f"assert {handle!r} in out.getvalue(), out.getvalue()\n"
        # argparse itself still comes in through tsm.specs.builders (its annotations) until that module
        # imports it for type checkers only (/tmp/tsm-helpers/perf-specs-builders.diff); then add it here
        "heavy = [m for m in ('shutil', 'locale', 'tsm.cli._parser',\n"
        "                     'tsm.schedulers.local.request', 'tsm.schedulers.common.viewmodel')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0, r.stderr
