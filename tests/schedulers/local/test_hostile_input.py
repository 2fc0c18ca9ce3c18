"""Hostile input against real local replicas, the Runner and the ``tsm`` command line (the shared corpus: ``tests/hostile.py``).

What must hold: every value of the corpus reaches a replica byte for byte, as an argument and as an env
value, whether given through the Runner or the command line, and no shell ever runs one (the payloads
would create a marker file). Values no process can receive, bad names and path-climbing handles are
refused with a one-line error before anything is written: ``$TSM_HOME`` stays empty, and (watched with a
Python audit hook) no path outside it is ever opened, listed, made or removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hostile
import tsm.cli.main
import tsm.runner.api
import tsm.schedulers.local.scheduler
import tsm.schedulers.slurm
import tsm.store
from hostile import DUMP, mismatches, read_dump
from tsm.errors import InvalidAppError, MalformedAppHandleError, TsmError
from tsm.runner.api import get_runner
from tsm.schedulers import get_scheduler, scheduler_names
from tsm.schedulers.api import Stream
from tsm.specs import AppDef, AppState, Role

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 120.0  # seconds: a guard against a hang, never a performance claim
SCHEDULERS = ["local", "local_cwd", "slurm"]
CLI_MODULES = ("status", "describe", "wait", "cancel", "log", "rm", "run", "dryrun", "list")
#: imported before any file access is watched, so the watch sees what commands do, not imports
_PRELOADED = (tsm.runner.api, tsm.schedulers.local.scheduler, tsm.schedulers.slurm, tsm.store)


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private working directory without config files (the user's config too is out of reach)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return work


def tsm_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run a real ``tsm`` process; output as bytes (replicas may print any byte)."""
    return subprocess.run(
        [*TSM, *args], capture_output=True, timeout=HANG, stdin=subprocess.DEVNULL, cwd=cwd,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},  # a strict UTF-8 stdout, as in a UTF-8 terminal
    )


def one_error_line(stderr: str, returncode: int) -> str:
    """The single ``tsm``/``error`` line a refused command prints (no traceback, non-zero exit)."""
    assert returncode != 0, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr[:2000]
    assert lines[0].startswith(("tsm", "error")), lines[0]
    return lines[0]


# -- watching file access --------------------------------------------------------------------------------
_FILE_EVENTS = {
    "open", "os.listdir", "os.scandir", "os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.chmod",
    "os.chown", "os.truncate", "os.link", "os.symlink", "os.utime", "shutil.rmtree", "shutil.copyfile",
    "sqlite3.connect", "subprocess.Popen", "os.posix_spawn", "os.exec", "os.system",
}
_seen: list[tuple[str, Any]] | None = None
_watched_thread: int | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _seen is not None and event in _FILE_EVENTS and threading.get_ident() == _watched_thread:
        _seen.append((event, args))


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _read_only(event: str, args: tuple[Any, ...]) -> bool:
    if event in ("os.listdir", "os.scandir"):
        return True
    if event != "open":
        return False
    mode, flags = (args[1:3] + (None, None))[:2]
    if isinstance(mode, str):
        return not any(c in mode for c in "wax+")
    return isinstance(flags, int) and not flags & _WRITE_FLAGS


def _code_roots() -> list[Path]:
    """Where the interpreter reads code and package metadata from (imports are not file access by tsm)."""
    roots = {Path(sys.prefix), Path(sys.base_prefix)}
    roots.update(Path(p) for p in sys.path if p not in ("", "."))
    return [r.resolve() for r in roots]


sys.addaudithook(_audit)


class FileAccess:
    """Paths the test's thread opens, lists, makes, removes or executes while :meth:`watch` is active."""

    def __init__(self, home: Path) -> None:
        self.home = home.resolve()
        self.events: list[tuple[str, Any]] = []

    def watch(self) -> Any:
        import contextlib

        @contextlib.contextmanager
        def cm() -> Iterator[None]:
            global _seen, _watched_thread
            _seen, _watched_thread = self.events, threading.get_ident()
            try:
                yield
            finally:
                _seen, _watched_thread = None, None

        return cm()

    def outside_home(self) -> list[tuple[str, Any]]:
        """Every event on a path outside ``$TSM_HOME`` (executing anything counts; the interpreter reading
        code or package metadata does not)."""
        out = []
        code = _code_roots()
        for event, args in self.events:
            target = args[0] if args else None
            if isinstance(target, int):  # an already open file descriptor
                continue
            if event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.system"):
                out.append((event, target))
                continue
            try:
                path = Path(os.fsdecode(target)).resolve()
            except (TypeError, ValueError):
                out.append((event, target))
                continue
            if path == self.home or self.home in path.parents:
                continue
            if _read_only(event, args) and any(path == r or r in path.parents for r in code):
                continue
            out.append((event, str(path)))
        return out

    def any_but_code(self) -> list[tuple[str, Any]]:
        """Every event except the interpreter reading code or package metadata."""
        code = _code_roots()
        out = []
        for event, args in self.events:
            target = args[0] if args else None
            if _read_only(event, args) and isinstance(target, (str, bytes, os.PathLike)):
                path = Path(os.fsdecode(target)).resolve()
                if any(path == r or r in path.parents for r in code):
                    continue
            out.append((event, target))
        return out


@pytest.fixture
def access(tsm_home: Path) -> FileAccess:
    return FileAccess(tsm_home)


def home_files(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def _cli_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``tsm ARGV`` run in this process (the same parser and handlers as the console script)."""
    try:
        code = tsm.cli.main.main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- 1. byte-exact delivery ------------------------------------------------------------------------------
@pytest.mark.reliability(
    "hostile arguments and env values reach local replicas (Runner API)",
    expect="byte-exact for every replica and in describe(); no shell runs them (no marker file)",
    group="Hostile input",
)
def test_hostile_arguments_and_env_reach_local_replicas_byte_exact(tmp_path: Path, figure: Any) -> None:
    marker = tmp_path / "pwned"
    args, env = hostile.args(str(marker)), hostile.env(str(marker))
    role = Role("h", entrypoint=sys.executable, args=["-c", DUMP, *args], env=env, num_replicas=2)
    with get_runner() as runner:
        handle = runner.run(AppDef("hostile", [role]), "local")
        status = runner.wait(handle, timeout=HANG)
        assert status.state == AppState.SUCCEEDED, status
        for k in range(2):
            out = "".join(runner.log_lines(handle, "h", k, streams=Stream.STDOUT))
            got_args, got_env = read_dump(out)
            assert not mismatches(got_args, got_env, args, env)
        described = runner.describe(handle).roles[0]  # the app as the store kept it
        assert described.args[2:] == args
        assert {k: v for k, v in described.env.items() if k in env} == env
    assert not marker.exists()
    assert os.listdir(tmp_path) == ["work"]  # and no payload made any file next to the marker
    figure("values delivered byte-exact", len(args) + len(env), "")
    figure("bytes per replica", sum(len(os.fsencode(v)) for v in [*args, *env.keys(), *env.values()]), "B")


def _component_file(path: Path, args: list[str], env: dict[str, str]) -> None:
    """A component file that launches a DUMP replica with ``args`` and ``env`` (as Python literals)."""
    path.write_text(
        "import sys\n"
        "from tsm.specs.api import AppDef, Resource, Role\n\n"
        f"DUMP = {DUMP!r}\nARGS = {args!r}\nENV = {env!r}\n\n\n"
        "def hostile() -> AppDef:\n"
        '    """Dump what the replica receives."""\n'
        '    return AppDef("hostile", [Role("h", entrypoint=sys.executable, args=["-c", DUMP, *ARGS], env=ENV,\n'
        '                                   resource=Resource(cpu=1, gpu=0, memMB=256))])\n',
        encoding="utf-8",
    )


@pytest.mark.reliability(
    "hostile arguments and env values through the tsm command line",
    expect="byte-exact after `tsm run utils.python -c ... -- ARGS` and `tsm run file.py:fn`; dry run prints "
    "them under a strict UTF-8 stdout; no shell runs them",
    group="Hostile input",
)
def test_hostile_values_through_the_command_line(tmp_path: Path, workdir: Path, figure: Any) -> None:
    marker = tmp_path / "pwned"
    args, env = hostile.args(str(marker)), hostile.env(str(marker))

    # arguments on tsm's own command line (non-UTF-8 ones arrive as bytes, and must leave as the same bytes)
    r = tsm_cli("run", "utils.python", "-c", DUMP, "--", *args)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    out = r.stdout.decode("utf-8", "surrogateescape")
    assert out.startswith("python/0 {"), out[:200]
    got_args, _ = read_dump(out.removeprefix("python/0 "))
    assert not mismatches(got_args, {}, args, {})

    # arguments and env values from a component file
    _component_file(workdir / "comp.py", args, env)
    r = tsm_cli("run", "comp.py:hostile")
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    got_args, got_env = read_dump(r.stdout.decode("utf-8", "surrogateescape").removeprefix("h/0 "))
    assert not mismatches(got_args, got_env, args, env)

    # the dry run prints every value (bytes that are not UTF-8 as themselves), for both schedulers
    for sched in ("local", "slurm"):
        r = tsm_cli("dryrun", "-s", sched, "-c", "slurm_version=22.05" if sched == "slurm" else "", "comp.py:hostile")
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
        assert b"\xff\xfe" in r.stdout and b"Traceback" not in r.stderr
    assert not marker.exists()
    figure("values delivered byte-exact", 2 * len(args) + len(env), "")


# -- 2. refused values -----------------------------------------------------------------------------------
@pytest.mark.reliability(
    "values no process can receive: NUL, lone surrogates, > 128 KiB, > ARG_MAX",
    expect="InvalidAppError naming the role and field at dry run, on every scheduler and the CLI; "
    "TSM_HOME stays empty",
    group="Hostile input",
)
def test_values_no_process_can_receive_are_refused(
    tsm_home: Path, workdir: Path, access: FileAccess, capsys: pytest.CaptureFixture[str], figure: Any
) -> None:
    cases = hostile.refused()
    problems: list[str] = []
    refused = 0
    with get_runner() as runner, access.watch():
        for case, field, kwargs in cases:
            app = AppDef("bad", [Role("r", **{"entrypoint": "true", **kwargs})])
            calls: list[tuple[str, Any]] = [(f"dryrun {s}", lambda s=s, a=app: runner.dryrun(a, s)) for s in SCHEDULERS]
            calls += [(f"{s} scheduler", lambda s=s, a=app: get_scheduler(s, "t").submit_dryrun(a)) for s in SCHEDULERS]
            calls.append(("run local", lambda a=app: runner.run(a, "local")))
            for what, call in calls:
                try:
                    call()
                    problems.append(f"{case} / {what}: accepted")
                except InvalidAppError as e:
                    msg = str(e)
                    if "role 'r'" not in msg or field not in msg or "\n" in msg or len(msg) > 400:
                        problems.append(f"{case} / {what}: unclear message {msg[:300]!r}")
                    refused += 1
    assert not problems, "\n".join(problems)
    assert access.any_but_code() == []  # refused before any file was opened or any process started
    assert home_files(tsm_home) == []

    # the command line says the same in one line; such values come from a component file (tsm's own argv could
    # not hold them: the OS would refuse to start tsm)
    (workdir / "comp.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(hostile.__file__).parent)!r})\n"
        "from hostile import refused\n"
        "from tsm.specs.api import AppDef, Role\n\n\n"
        "def bad(case: int) -> AppDef:\n"
        '    """An app with one value no process can receive."""\n'
        "    return AppDef('bad', [Role('r', **{'entrypoint': 'true', **refused()[case][2]})])\n"
    )
    for i, (case, field, _) in enumerate(cases):
        for sched in ("local", "slurm"):
            code, _, err = _cli_in_process(["run", "-s", sched, "comp.py:bad", "--case", str(i)], capsys)
            line = one_error_line(err, code)
            assert code == 1 and "role 'r'" in line and field in line and len(line) < 400, (case, line)
            refused += 1
    for i in (0, len(cases) - 1):  # and the same through real tsm processes
        r = tsm_cli("run", "comp.py:bad", "--case", str(i))
        assert r.returncode == 1 and "role 'r'" in one_error_line(r.stderr.decode(), r.returncode)
    assert home_files(tsm_home) == []
    figure("refusals checked", refused, "")


# -- 3. names and handles --------------------------------------------------------------------------------
@pytest.mark.reliability(
    "hostile names (app, role, session) and path-climbing handles",
    expect="names refused before anything is written; handles refused with MalformedAppHandleError by every "
    "Runner method and the CLI (one line); no path outside TSM_HOME touched",
    group="Hostile input",
)
def test_hostile_names_and_handles_are_refused(
    tsm_home: Path, access: FileAccess, capsys: pytest.CaptureFixture[str], figure: Any
) -> None:
    for module in CLI_MODULES:  # imported up front, so the watch below sees only what the commands do
        __import__(f"tsm.cli.cmd_{module}")
    scheduler_names()  # reads (and caches) the installed packages' entry points
    problems: list[str] = []
    good = Role("r", entrypoint="true")

    # names: refused by validation, before the store, config files or any scheduler are touched
    with access.watch():
        for name in hostile.BAD_NAMES:
            attempts: list[tuple[str, Any]] = [("session", lambda n=name: get_runner(n))]
            with get_runner() as runner:
                for s in SCHEDULERS:
                    attempts += [
                        (f"app name, dryrun {s}", lambda n=name, s=s: runner.dryrun(AppDef(n, [good]), s)),
                        (f"role name, dryrun {s}", lambda n=name, s=s: runner.dryrun(AppDef("a", [Role(n, entrypoint="true")]), s)),
                    ]
                attempts += [
                    ("app name, run", lambda n=name: runner.run(AppDef(n, [good]), "local")),
                    ("role name, run", lambda n=name: runner.run(AppDef("a", [Role(n, entrypoint="true")]), "local")),
                ]
                for what, attempt in attempts:
                    try:
                        attempt()
                        problems.append(f"name {name!r} / {what}: accepted")
                    except InvalidAppError as e:
                        if "\n" in str(e) or "name" not in str(e):
                            problems.append(f"name {name!r} / {what}: unclear message {str(e)!r}")
    assert access.any_but_code() == [], access.any_but_code()[:10]
    assert home_files(tsm_home) == []

    # handles: every Runner method refuses them, before looking anything up
    methods: dict[str, Any] = {
        "status": lambda r, h: r.status(h),
        "wait": lambda r, h: r.wait(h, timeout=0.1),
        "cancel": lambda r, h: r.cancel(h),
        "describe": lambda r, h: r.describe(h),
        "log_lines": lambda r, h: r.log_lines(h, "r", 0),
        "remove": lambda r, h: r.remove([h]),
    }
    with get_runner() as runner, access.watch():
        for handle in hostile.BAD_HANDLES:
            for name, method in methods.items():
                try:
                    method(runner, handle)
                    problems.append(f"{handle[:60]!r} / {name}: accepted")
                except MalformedAppHandleError as e:
                    if "\n" in str(e) or len(str(e)) > 400:
                        problems.append(f"{handle[:60]!r} / {name}: message not one short line")
                except TsmError as e:
                    problems.append(f"{handle[:60]!r} / {name}: {type(e).__name__}, not MalformedAppHandleError")
    assert access.any_but_code() == [], access.any_but_code()[:10]
    assert home_files(tsm_home) == []

    # the command line: one line on stderr, usage-error exit code, nothing touched outside TSM_HOME
    with access.watch():
        for handle in (h for h in hostile.BAD_HANDLES if "\x00" not in h):
            for cmd in ("status", "describe", "wait", "cancel", "log", "rm"):
                code, out, err = _cli_in_process([cmd, handle], capsys)
                try:
                    line = one_error_line(err, code)
                except AssertionError as e:
                    problems.append(f"tsm {cmd} {handle[:60]!r}: {e}")
                    continue
                # `tsm log` reads HANDLE/ROLE/K: "local:///etc/passwd" is role "passwd" of app "etc", unknown
                # here; "file:///etc/passwd" is of scheduler "file"
                expected = ("malformed app handle",)
                if cmd == "log":
                    expected += ("unknown app", "unknown scheduler 'file'")
                if not any(x in line for x in expected) or len(line) > 500:
                    problems.append(f"tsm {cmd} {handle[:60]!r}: {line[:200]}")
        for name in (n for n in hostile.BAD_NAMES if "\x00" not in n):
            code, out, err = _cli_in_process(["run", "utils.python", f"--name={name}", "-c", "pass"], capsys)
            code2, out2, err2 = _cli_in_process([f"--session={name}", "list"], capsys)
            for c, e in ((code, err), (code2, err2)):
                try:
                    one_error_line(e, c)
                except AssertionError as exc:
                    problems.append(f"name {name!r} on the CLI: {exc}")
    assert not problems, "\n".join(problems[:40])
    assert access.outside_home() == [], access.outside_home()[:10]
    assert set(home_files(tsm_home)) <= {"tsm.db", "tsm.db-wal", "tsm.db-shm"}  # `tsm log` looked an app up

    # and a few through real tsm processes
    for argv in (["status", "local://x/../../etc"], ["rm", "local://default/.."], ["log", "local://../x"],
                 ["cancel", "local://default/a%2fb"], ["run", "utils.python", "--name=../x", "-c", "pass"]):
        r = tsm_cli(*argv)
        one_error_line(r.stderr.decode(), r.returncode)
    # a real `tsm` read leaves the command server's marker (cli/), a cache of the user's own: nothing else
    assert {f for f in home_files(tsm_home) if f.split("/")[0] != "cli"} <= {"tsm.db", "tsm.db-wal", "tsm.db-shm"}
    figure("names refused", len(hostile.BAD_NAMES), "")
    figure("handles refused", len(hostile.BAD_HANDLES), "")
