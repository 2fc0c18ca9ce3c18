"""Fuzz the ``tsm`` command line: hostile values in every subcommand's every flag and argument.

Each case runs the real CLI entry point (``tsm.cli.main.main``, in this process, so thousands of cases stay
quick) against a real app on the local scheduler. Whatever the value, the command must end with an exit
code from the table (``tsm.cli._exits``) and at most one error line: never the catch-all "internal error"
(which means an unchecked value reached code that could not take it) and never a traceback. A value is
either accepted or refused where it is parsed.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tsm.cli import _exits
from tsm.cli.main import main
from tsm.runner.api import get_runner

#: Values a hostile or careless user might type, for any slot: numbers out of range, not-a-numbers, times
#: out of range, odd Unicode and bytes that are not UTF-8 (as Python sees them: surrogate escapes).
HOSTILE = [
    "", " ", "-", "--", "-1", "0", "1", "0.0", "-0", "1e308", "-1e308", "1e-400", "inf", "-inf", "+inf", "nan",
    "NaN", "Infinity", "1_000", "0x10", "１２", "٣", "9" * 400, "1" * 5000 + "d", "99999999d", "-5m", "1.5.5s", "5 m",
    "0001-01-01", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59", "9999-12-31T23:59:59-14:00", "2026-13-45",
    "2026-11-21T10:00+02:00", "10:00", "local://", "local://default/..", "local://default/x/../../etc",
    "local://default/echo-1/sh/99999999999", "lcal://default/x", "://", ":", "a:b", "file.py:", ":fn", "/", ".",
    "../..", "/etc/passwd", "%s%n", "{0}", "\n", "a\nb", "\r", "\t", "\x1b[31m", "\u202e", "é", "\udcff",
    "a\udc80b", "x" * 10000, "'", '"', "\\", "(", "[", "*", "(a+)+$", "=", "a=", "=b", ",", "a=1,,b",
    "grace_period=inf", "grace_period=nan", "grace_period=1e308", "max_retries=-1", "--help", "-h", "--version",
]

#: Every subcommand and flag, with ``{}`` where the hostile value goes and the exit codes it may end with.
#: ``{handle}`` is a real app that has SUCCEEDED.
USAGE_OR_OK = {_exits.OK, _exits.USAGE}
#: A component's arguments may also build an invalid app (``--num_replicas 0``): exit 1, as in the table.
BUILDS_APP = {_exits.OK, _exits.USAGE, _exits.FAILED}
TEMPLATES: list[tuple[list[str], set[int]]] = [
    (["{}"], USAGE_OR_OK),
    (["--session", "{}", "list"], USAGE_OR_OK),
    (["list", "--limit", "{}"], USAGE_OR_OK),
    (["list", "-s", "{}"], USAGE_OR_OK),
    (["list", "{}"], USAGE_OR_OK),
    (["status", "{}"], USAGE_OR_OK),
    (["status", "--json", "{}"], USAGE_OR_OK),
    (["status", "{handle}", "{}"], USAGE_OR_OK),
    (["describe", "{}"], USAGE_OR_OK),
    (["wait", "{}"], {_exits.OK, _exits.USAGE, _exits.FAILED}),
    (["wait", "--timeout", "{}", "{handle}"], USAGE_OR_OK),
    (["wait", "{handle}", "--timeout={}"], USAGE_OR_OK),
    (["log", "{}"], USAGE_OR_OK),
    (["log", "{handle}/{}"], USAGE_OR_OK),
    (["log", "{handle}/echo/{}"], USAGE_OR_OK),
    (["log", "--since", "{}", "{handle}"], USAGE_OR_OK),
    (["log", "--until", "{}", "{handle}"], USAGE_OR_OK),
    (["log", "--regex", "{}", "{handle}"], USAGE_OR_OK),
    (["log", "--streams", "{}", "{handle}"], USAGE_OR_OK),
    (["log", "--attempt", "{}", "{handle}"], USAGE_OR_OK),
    (["log", "-f", "--since", "{}", "{handle}"], USAGE_OR_OK),
    (["cancel", "{}"], USAGE_OR_OK),
    (["rm", "{}"], USAGE_OR_OK),
    (["runopts", "{}"], USAGE_OR_OK),
    (["builtins", "{}"], USAGE_OR_OK),
    (["lint", "{}"], {_exits.OK, _exits.FAILED, _exits.USAGE}),
    (["tracker", "{}"], USAGE_OR_OK),
    (["tracker", "show", "{}"], USAGE_OR_OK),
    (["tracker", "lineage", "--json", "{}"], USAGE_OR_OK),
    (["env", "show", "{}"], USAGE_OR_OK),
    (["env", "rm", "{}"], USAGE_OR_OK),
    (["env", "gc", "--older-than", "{}", "--dry-run"], USAGE_OR_OK),
    (["top", "--once", "--filter", "{}"], USAGE_OR_OK),
    (["top", "--once", "--interval", "{}"], USAGE_OR_OK),
    (["top", "--once", "--limit", "{}"], USAGE_OR_OK),
    (["dryrun", "{}"], BUILDS_APP),
    (["dryrun", "-s", "{}", "utils.echo"], BUILDS_APP),
    (["dryrun", "-c", "{}", "utils.echo"], BUILDS_APP),
    (["dryrun", "utils.echo", "--msg", "{}"], BUILDS_APP),
    (["dryrun", "utils.echo", "{}"], BUILDS_APP),
    (["dryrun", "--environment", "{}", "utils.echo"], BUILDS_APP),
    (["dryrun", "utils.echo", "--num_replicas", "{}"], BUILDS_APP),
    (["dryrun", "utils.sh", "-h", "{}", "--", "true"], BUILDS_APP),
    (["run", "--dryrun", "{}"], BUILDS_APP),
    (["run", "--dryrun", "-c", "{}", "utils.echo"], BUILDS_APP),
    (["run", "--dryrun", "-s", "{}", "utils.echo"], BUILDS_APP),
    (["run", "--dryrun", "utils.python", "-c", "{}"], BUILDS_APP),
    (["run", "--dryrun", "dist.ddp", "-j", "{}", "--script", "train.py"], BUILDS_APP),
]


@pytest.fixture
def handle(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local app that has SUCCEEDED (run in a directory of its own, with no config files around)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TSM_DEBUG", raising=False)
    with get_runner() as runner:
        h = runner.run_component("utils.echo", ["--msg", "fuzz"], "local", {})
        status = runner.wait(h, timeout=120)
        assert status is not None and status.state.name == "SUCCEEDED", status
    yield h


def call(argv: list[str]) -> tuple[int, str]:
    """Run ``tsm ARGV`` in this process; return its exit code and what it wrote to stderr."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: --help, --version and usage errors
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        sys.stdout, sys.stderr = old
    return code, err.getvalue()


def check(template: list[str], allowed: set[int], value: str, handle: str) -> str | None:
    """Run one case; return what is wrong with its outcome, or None."""
    argv = [w.replace("{handle}", handle).replace("{}", value) for w in template]
    code, err = call(argv)
    problems = []
    if code not in allowed:
        problems.append(f"exit code {code} (allowed {sorted(allowed)})")
    if "internal error" in err or "Traceback" in err:
        problems.append("internal error")
    if sum(line.startswith(("error", "tsm")) for line in err.splitlines()) > 1:
        problems.append("more than one error line")
    return f"{argv!r}: {', '.join(problems)}: {err[-600:]!r}" if problems else None


def test_every_flag_takes_every_hostile_value(handle: str) -> None:
    """The table: every template with every value of :data:`HOSTILE`."""
    failures = [
        problem
        for template, allowed in TEMPLATES
        for value in HOSTILE
        if (problem := check(template, allowed, value, handle)) is not None
    ]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:40])


_argv_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30
)  # what a real argv can hold: no NUL; non-UTF-8 bytes come as surrogate escapes, added below
_values = st.one_of(
    _argv_text,
    st.sampled_from(HOSTILE),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers().map(str),
    st.builds(lambda t, b: t + chr(0xDC00 + b), _argv_text, st.integers(0x80, 0xFF)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(TEMPLATES), value=_values)
def test_fuzzed_values_never_reach_the_catch_all(handle: str, case: tuple[list[str], set[int]], value: str) -> None:
    template, allowed = case
    problem = check(template, allowed, value, handle)
    assert problem is None, problem


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e308", "x", "", "1" * 400])
def test_rm_older_than_never_reaches_the_catch_all(handle: str, value: str) -> None:
    """``rm --older-than`` apart: a valid value removes the app the other cases share."""
    code, err = call(["rm", "--older-than", value])
    assert "internal error" not in err and "Traceback" not in err, err
    assert code in USAGE_OR_OK, (code, err)
    if value in ("-1", "nan", "inf", "1e308", "x", ""):
        assert code == _exits.USAGE and "--older-than" in err, err


@pytest.mark.parametrize("encoding", ["utf-8", "ascii", "latin-1"])
def test_any_argument_prints_under_any_stdout_encoding(tmp_path: Path, encoding: str) -> None:
    """In a real process: bytes that are not UTF-8 come back as given; what the stdout encoding cannot hold
    is escaped, never the catch-all (``PYTHONIOENCODING=ascii`` once made a dry run an internal error)."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONIOENCODING": encoding, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("TSM_DEBUG", None)
    for value in (b"plain", "é€".encode(), b"\xff\xfe", "é".encode() + b"\xff", b"\x1b[31m"):
        argv: list[str | bytes] = [sys.executable, "-m", "tsm.cli.main", "dryrun", "utils.echo", "--msg", value]
        r = subprocess.run(argv, capture_output=True, env=env, cwd=tmp_path, timeout=120)
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode == 0, (value, err)
        assert "internal error" not in err and "Traceback" not in err, err
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(b"echo/0"))
        if b"\xff" in value:
            assert b"\xff" in line, line  # the user's own byte, back as given
        if encoding == "ascii" and "é".encode() in value:
            assert b"\\xe9" in line, line
        argv = [sys.executable, "-m", "tsm.cli.main", "status", b"local://default/" + value]
        r = subprocess.run(argv, capture_output=True, env=env, cwd=tmp_path, timeout=120)
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode == _exits.USAGE and err.count("\n") == 1 and "internal error" not in err, err
