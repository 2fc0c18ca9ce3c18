"""Hostile input on the ``tsm`` command line: broken config files, broken component files, wrong run options.

Every case runs a real ``tsm`` process and must end with exactly one line on stderr that starts with ``tsm``
or ``error``, a non-zero exit code and no traceback; the line names what to fix (the file, the option).
Cases run a few at a time, each in its own directory. Cases already covered in ``test_cli.py`` are not
repeated here: an unknown option in ``tsm.toml`` (``test_bad_config_file_is_one_line``), ``-c foo=1``,
``-c grace_period=abc``, ``-c novalue`` and ``-c =1`` (``test_usage_errors_exit_2_with_one_line``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 120  # seconds: a guard against a hung command, never a performance claim


@dataclass
class Case:
    """One hostile command: files to write in a fresh directory, the argv, and what the error line must say."""

    name: str
    argv: list[str]
    expect: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    code: int | None = None  # the exit code, when it matters (else any non-zero)


def run_cases(cases: list[Case], root: Path) -> list[str]:
    """Run every case (four at a time); return what went wrong, one entry per failed case."""

    def one(case: Case) -> str | None:
        cwd = root / case.name.replace(" ", "_").replace("/", "_")
        cwd.mkdir()
        for rel, data in case.files.items():
            path = cwd / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg"), "PYTHONIOENCODING": "utf-8"}
        env.pop("TSM_DEBUG", None)
        r = subprocess.run([*TSM, *case.argv], capture_output=True, text=True, errors="replace", cwd=cwd,
                           env=env, timeout=HANG, stdin=subprocess.DEVNULL)  # fmt: skip
        lines = r.stderr.splitlines()
        problems = []
        if r.returncode == 0 or (case.code is not None and r.returncode != case.code):
            problems.append(f"exit code {r.returncode}")
        if "Traceback" in r.stderr or len(lines) != 1 or not lines[0].startswith(("tsm", "error")):
            problems.append(f"stderr is not one error line: {r.stderr[-1500:]!r}")
        elif missing := [x for x in case.expect if x not in lines[0]]:
            problems.append(f"{missing} not in {lines[0]!r}")
        return f"{case.name}: {'; '.join(problems)}" if problems else None

    with ThreadPoolExecutor(4) as pool:
        return [p for p in pool.map(one, cases) if p]


# -- config files ------------------------------------------------------------------------------------------
def _toml(text: str) -> dict[str, bytes]:
    return {"tsm.toml": text.encode()}


def _pyproject(text: str) -> dict[str, bytes]:
    return {"pyproject.toml": b'[project]\nname = "x"\n\n' + text.encode()}


CONFIG_CASES = [
    Case("bad toml", ["dryrun", "utils.echo"], ["tsm.toml", "not valid TOML"], _toml("default_scheduler = \n")),
    Case("not utf-8", ["dryrun", "utils.echo"], ["tsm.toml", "not UTF-8"], {"tsm.toml": b"x = '\xff\xfe'\n"}),
    Case("nul byte", ["dryrun", "utils.echo"], ["tsm.toml", "not valid TOML"], {"tsm.toml": b"x = 1\x00\n"}),
    Case("scheduler not a string", ["dryrun", "utils.echo"], ["tsm.toml", "default_scheduler"],
         _toml("default_scheduler = 1\n")),
    Case("unknown default scheduler", ["dryrun", "utils.echo"], ["unknown scheduler 'lcoal'", "did you mean 'local'"],
         _toml('default_scheduler = "lcoal"\n')),
    Case("unknown key", ["dryrun", "utils.echo"], ["tsm.toml", "unknown key 'schedulers'", "did you mean 'scheduler'"],
         _toml("[schedulers.local]\ngrace_period = 1\n")),
    Case("scheduler not a table", ["dryrun", "utils.echo"], ["tsm.toml", "[scheduler.<name>]"], _toml("scheduler = 1\n")),
    Case("options not a table", ["dryrun", "utils.echo"], ["tsm.toml", "[scheduler.<name>]"],
         _toml("[scheduler]\nlocal = 1\n")),
    Case("option wrong type", ["run", "utils.echo"], ["tsm.toml", "[scheduler.local]", "grace_period", "float"],
         _toml('[scheduler.local]\ngrace_period = "abc"\n')),
    Case("option a list", ["dryrun", "utils.echo"], ["tsm.toml", "grace_period", "float"],
         _toml("[scheduler.local]\ngrace_period = [1, 2]\n")),
    Case("option nan", ["dryrun", "utils.echo"], ["tsm.toml", "grace_period", "finite"],
         _toml("[scheduler.local]\ngrace_period = nan\n")),
    Case("option inf", ["dryrun", "utils.echo"], ["tsm.toml", "grace_period", "finite"],
         _toml("[scheduler.local]\ngrace_period = inf\n")),
    Case("option a table", ["dryrun", "utils.echo"], ["tsm.toml", "log_dir", "str"],
         _toml("[scheduler.local]\nlog_dir = { a = 1 }\n")),
    Case("component default wrong type", ["dryrun", "utils.echo"], ["num_replicas", "invalid int value 'x'", "config"],
         _toml('[component."utils.echo"]\nnum_replicas = "x"\n'), code=2),
    Case("component default unknown", ["dryrun", "utils.echo"], ["'mesg'", "did you mean 'msg'", "config"],
         _toml('[component."utils.echo"]\nmesg = "hi"\n'), code=2),
    Case("component not a table", ["dryrun", "utils.echo"], ["tsm.toml", "[component."], _toml("component = [1]\n")),
    Case("pyproject wrong type", ["dryrun", "utils.echo"], ["pyproject.toml [tool.tsm]", "default_scheduler"],
         _pyproject("[tool.tsm]\ndefault_scheduler = 3\n")),
    Case("pyproject tool.tsm not a table", ["dryrun", "utils.echo"], ["pyproject.toml", "[tool.tsm] must be a table"],
         _pyproject("[tool]\ntsm = 3\n")),
    Case("pyproject bad toml", ["dryrun", "utils.echo"], ["pyproject.toml", "not valid TOML"],
         {"pyproject.toml": b"[tool.tsm\n"}),
    Case("pyproject unknown option", ["dryrun", "utils.echo"], ["pyproject.toml", "grace_perod", "did you mean"],
         _pyproject("[tool.tsm.scheduler.local]\ngrace_perod = 1\n")),
    Case("user config bad toml", ["dryrun", "utils.echo"], ["xdg/tsm/config.toml", "not valid TOML"],
         {"xdg/tsm/config.toml": b"= 1\n"}),
]


@pytest.mark.reliability(
    "malformed config files (tsm.toml, [tool.tsm], user file)",
    expect="one error line naming the file and the key, non-zero exit, no traceback",
    group="Hostile input",
)
def test_malformed_config_files_give_one_error_line(tmp_path: Path, figure: Any) -> None:
    problems = run_cases(CONFIG_CASES, tmp_path)
    assert not problems, "\n".join(problems)
    figure("cases", len(CONFIG_CASES), "")


# -- component files ---------------------------------------------------------------------------------------
_HEAD = "from tsm.specs.api import AppDef, Role\n\n\n"


def _comp(body: str) -> dict[str, bytes]:
    return {"comp.py": (_HEAD + body).encode()}


COMPONENT_CASES = [
    Case("syntax error", ["run", "comp.py:f"], ["cannot import component file 'comp.py'", "SyntaxError"],
         _comp("def f(:\n")),
    Case("import error", ["run", "comp.py:f"], ["cannot import component file", "No module named 'no_such_mod_x'"],
         _comp("import no_such_mod_x\n")),
    Case("raises at top level", ["dryrun", "comp.py:f"], ["cannot import", "RuntimeError: boom second line"],
         _comp("raise RuntimeError('boom\\nsecond line')\n")),
    Case("sys.exit() at top level", ["run", "comp.py:f"], ["cannot import", "SystemExit"],
         _comp("import sys\nsys.exit()\n")),
    Case("sys.exit(msg) at top level", ["run", "comp.py:f"], ["cannot import", "SystemExit: bye"],
         _comp("import sys\nsys.exit('bye')\n")),
    Case("unprintable exception at top level", ["run", "comp.py:f"], ["cannot import", "E"],
         _comp("class E(Exception):\n    def __str__(self):\n        raise ValueError('no')\n\n\nraise E()\n")),
    Case("not utf-8 with NUL", ["run", "comp.py:f"], ["cannot import component file"],
         {"comp.py": b"\xff\xfe\x00x = 1\n"}),
    Case("function raises", ["run", "comp.py:f"],
         ["tsm run comp.py:f: the component function raised ValueError: bad value"],
         _comp("def f() -> AppDef:\n    raise ValueError('bad value')\n")),
    Case("function calls sys.exit()", ["run", "comp.py:f"], ["component f called sys.exit(None)"],
         _comp("def f() -> AppDef:\n    import sys\n    sys.exit()\n")),
    Case("function calls sys.exit(0)", ["dryrun", "comp.py:f"], ["component f called sys.exit(0)"],
         _comp("def f() -> AppDef:\n    raise SystemExit(0)\n")),
    Case("function recurses forever", ["run", "comp.py:f"], ["the component function raised RecursionError"],
         _comp("def f() -> AppDef:\n    return f()\n")),
    Case("unprintable exception from the function", ["run", "comp.py:f"], ["the component function raised E"],
         _comp("class E(Exception):\n    def __str__(self):\n        raise ValueError('no')\n\n\n"
               "def f() -> AppDef:\n    raise E()\n")),
    Case("control characters in the message", ["run", "comp.py:f"], ["ValueError: a b \\x1b[2J c\\u202ed"],
         _comp("def f() -> AppDef:\n    raise ValueError('a\\rb\\n\\x1b[2J c\\u202ed')\n")),
    Case("returns no AppDef", ["run", "comp.py:f"], ["component f returned int, not a tsm.AppDef"],
         _comp("def f() -> AppDef:\n    return 3  # type: ignore\n")),
    Case("returns an invalid AppDef", ["run", "comp.py:f"], ["app name '../x' is not allowed"],
         _comp("def f() -> AppDef:\n    return AppDef('../x', [Role('r', entrypoint='true')])\n"), code=1),
    Case("unsupported parameter", ["run", "comp.py:f"], ["parameter 'x' has unsupported type"],
         _comp("def f(x: set[int]) -> AppDef:\n    raise AssertionError\n")),
    Case("no such function", ["run", "comp.py:g"], ["no function 'g'", "functions there: f"],
         _comp("def f() -> AppDef:\n    raise AssertionError\n")),
]


@pytest.mark.reliability(
    "component files that break: SyntaxError, ImportError, raise or sys.exit at import or call",
    expect="one error line naming the file or component, non-zero exit, no traceback",
    group="Hostile input",
)
def test_broken_component_files_give_one_error_line(tmp_path: Path, tsm_home: Path, figure: Any) -> None:
    problems = run_cases(COMPONENT_CASES, tmp_path)
    assert not problems, "\n".join(problems)
    assert not (tsm_home / "local").exists()  # nothing was launched
    figure("cases", len(COMPONENT_CASES), "")


# -- run options -------------------------------------------------------------------------------------------
def _dry(cfg: str, *scheduler: str) -> list[str]:
    return ["dryrun", *scheduler, "-c", cfg, "utils.echo"]


RUNOPT_CASES = [
    Case("typo with did-you-mean", _dry("grace_perod=1"), ["unknown run option 'grace_perod'",
                                                          "did you mean 'grace_period'"], code=2),
    Case("float given a list", _dry("grace_period=1,2"), ["grace_period", "expects float", "'1,2'"], code=2),
    Case("float nan", _dry("grace_period=nan"), ["grace_period", "expects float"], code=2),
    Case("float inf", _dry("grace_period=inf"), ["grace_period", "expects float"], code=2),
    Case("float overflow", _dry("grace_period=1e999"), ["grace_period", "expects float"], code=2),
    Case("negative grace", ["run", "-c", "grace_period=-1", "utils.echo"], ["grace_period must be >= 0"], code=2),
    Case("bool given junk", _dry("prepend_cwd=maybe"), ["prepend_cwd", "expects bool"], code=2),
    Case("bool given a list", _dry("timers=1,2"), ["timers", "expects bool"], code=2),
    Case("slurm int given text", _dry("kill_grace=abc", "-s", "slurm"), ["kill_grace", "expects int"], code=2),
    Case("slurm typo", _dry("partiton=gpu", "-s", "slurm"), ["did you mean 'partition'"], code=2),
    Case("slurm % in job_dir", _dry("job_dir=/tmp/a%jb", "-s", "slurm"), ["job_dir", "'%'"], code=2),
    Case("slurm line break in a directive", _dry("comment=a\nb", "-s", "slurm"), ["line break"], code=2),
    Case("slurm sbatch_args not an option", _dry("sbatch_args=rm -rf /", "-s", "slurm"), ["must be an option"],
         code=2),
]


@pytest.mark.reliability(
    "wrong run options on the command line (-c): types, typos, NaN, forbidden characters",
    expect="one error line naming the option (with did-you-mean), exit 2 (a usage error, bad values too), no traceback",
    group="Hostile input",
)
def test_wrong_run_options_give_one_error_line(tmp_path: Path, tsm_home: Path, figure: Any) -> None:
    problems = run_cases(RUNOPT_CASES, tmp_path)
    assert not problems, "\n".join(problems)
    assert not (tsm_home / "local").exists()  # nothing was launched
    # a str option takes commas as they are: -c log_dir=1,2 is the directory "1,2" (not a list, not an error)
    r = subprocess.run([*TSM, "dryrun", "-c", "log_dir=1,2", "utils.echo"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=HANG, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert r.returncode == 0, r.stderr
    assert f"logs in {tmp_path}/1,2/echo-" in r.stdout
    figure("cases", len(RUNOPT_CASES) + 1, "")
