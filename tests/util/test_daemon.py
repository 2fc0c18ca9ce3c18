"""tsm's detached helpers (``tsm.util.daemon``): what each one imports, how one of a kind starts, idle limits, the key.

What must hold: a helper process imports only tsm (the one the caller runs, an editable install too) and the
libraries installed for the interpreter, never a module lying in the folder it was started from, whoever
started it; of many processes that find no helper at once exactly one starts it; a helper that dies before
it took its lock leaves nothing in the way of the next start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from testutil import HANG, procs_with, sleep_marker, wait_all_gone, wait_until
from tsm.schedulers.common import keeper
from tsm.schedulers.local import launcher
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState, Role
from tsm.store import tsm_home
from tsm.util import daemon

#: Standard-library names a helper imports after its start (and ``tsm`` itself): planted in the working
#: directory, each leaves a mark when it is imported.
PLANTED = ("argparse", "contextlib", "dataclasses", "enum", "fcntl", "functools", "hashlib", "json", "logging",
           "pathlib", "random", "re", "resource", "secrets", "select", "selectors", "shlex", "signal", "socket",
           "sqlite3", "string", "struct", "subprocess", "tempfile", "threading", "traceback", "typing", "weakref")


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project folder holding modules named like the standard library's and a ``tsm`` package, each of which
    appends its name to ``marks`` when imported; the test runs from it (``TSM_HOME`` elsewhere)."""
    folder = tmp_path / "project"
    (folder / "tsm").mkdir(parents=True)
    marks = tmp_path / "marks"
    code = f"import os\nopen({str(marks)!r}, 'a').write(__name__ + ' ' + str(os.getpid()) + '\\n')\n"
    for name in PLANTED:
        (folder / f"{name}.py").write_text(code)
    (folder / "tsm" / "__init__.py").write_text(code)
    monkeypatch.chdir(folder)
    yield marks


def marks_of(marks: Path) -> list[str]:
    return marks.read_text().splitlines() if marks.exists() else []


@pytest.mark.reliability(
    "code in the working directory is never imported by tsm's helper processes",
    expect="with json.py, threading.py, ... and a tsm/ package in the caller's folder: the spawned supervisor, "
    "the launcher and the supervisors it forks, the keeper, the sweep controller and Docker's stop helper "
    "import none of them, and work",
    group="Security",
)
def test_no_helper_imports_code_from_the_working_directory(planted: Path, monkeypatch: pytest.MonkeyPatch,
                                                           figure) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TSM_LAUNCHER", "1")
    monkeypatch.delenv("TSM_APP_ID", raising=False)
    monkeypatch.setenv("TSM_KEEPER_IDLE", "0")
    monkeypatch.setenv("TSM_KEEPER_GIVE_UP", "0")
    home = tsm_home()
    sched = LocalScheduler("planted")
    try:
        # the first app's supervisor is spawned and starts the launcher; the second is forked by it
        first = sched.submit(AppDef("first", [Role("r", entrypoint="true")]), {})
        wait_until(lambda: marks_of(planted) or sched.describe(first).state.is_terminal,  # type: ignore[union-attr]
                   "the spawned supervisor", timeout=HANG)
        ldir = Path(launcher.launcher_dir(str(home)))
        wait_until(lambda: marks_of(planted) or any(ldir.glob("*.sock")), "the launcher", timeout=HANG)
        second = sched.submit(AppDef("second", [Role("r", entrypoint="true")]), {})
        wait_until(lambda: marks_of(planted) or sched.describe(second).state.is_terminal,  # type: ignore[union-attr]
                   "the forked supervisor", timeout=HANG)
        assert marks_of(planted) == []
        assert [sched.describe(a).state for a in (first, second)] == [AppState.SUCCEEDED] * 2  # type: ignore[union-attr]
    finally:
        sched.close()

    root = home / "docker"  # the keeper: it takes its lock, imports its backend, finds nothing to do, leaves
    keeper.ensure("docker", root)
    daemon.wait_released(daemon.start_lock(root / keeper.LOCK), HANG)
    daemon.wait_released(root / keeper.LOCK, HANG)
    assert marks_of(planted) == []

    from tsm.runner.api import get_runner
    from tsm.sweep import api

    with get_runner("planted") as runner:  # the sweep controller, started in the sweep's folder
        handle = api.run_sweep(runner, "utils.echo", {"msg": "a,b"}, scheduler="local")
    wait_until(lambda: marks_of(planted) or api.sweep_status(handle, restart=False).is_terminal,
               "the sweep controller", timeout=HANG)
    assert marks_of(planted) == []
    assert api.sweep_status(handle).state == "SUCCEEDED"

    from tsm.schedulers.docker.scheduler import DockerScheduler

    docker = DockerScheduler("planted")  # Docker's stop helper, for a container that is not there
    nobody = sleep_marker().replace(".", "0").ljust(64, "0")
    docker._stop_later(SimpleNamespace(app_id="stop-helper", containers=[]), [nobody], 0.0)  # type: ignore[arg-type]
    wait_all_gone(procs_with(nobody))
    assert marks_of(planted) == []
    figure("helpers that imported a planted module", 0, "", limit=0)


def test_a_helper_sees_its_arguments_and_this_tsm_first_and_no_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(lib), "relative/dir", ""]))
    # found through PYTHONPATH's absolute entry, as a plugin on PYTHONPATH would be
    (lib / "probe.py").write_text("import json, os, sys\n"
                                  "def main():\n"
                                  "    print(json.dumps({'argv': sys.argv[1:], 'path': sys.path}))\n")
    monkeypatch.chdir(tmp_path)
    argv = daemon.command("probe:main", "a b", "--x", site=True)
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=HANG).stdout
    import json

    seen = json.loads(out)
    assert seen["argv"] == ["a b", "--x"]
    assert seen["path"][0] == daemon.package_parent() and str(lib) in seen["path"]
    assert all(p and os.path.isabs(p) and os.path.abspath(p) != str(tmp_path) for p in seen["path"]), seen["path"]
    bare = daemon.command("probe:main", site=False)
    assert bare[1:3] == ["-I", "-S"] and str(lib) not in bare  # only tsm and the standard library


def test_of_many_callers_at_once_exactly_one_starts_the_helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads race to start the helper of one lock; the helper takes its lock only after all of them looked."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # where the helper's module is
    lock = tmp_path / "helper.lock"
    started: list[subprocess.Popen[bytes]] = []
    go = threading.Barrier(10)
    release = tmp_path / "release"
    code = ("import os, sys, time\n"
            "from tsm.util import daemon\n"
            "def main():\n"
            f"    while not os.path.exists({str(release)!r}): time.sleep(0.01)\n"
            f"    fd = daemon.take({str(lock)!r}); daemon.started()\n"
            "    sys.stdin.read()\n")
    (tmp_path / "helper_probe.py").write_text(code)

    def start(fd: int) -> None:
        argv = daemon.command("helper_probe:main", handover_fd=fd)
        started.append(subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=(fd,)))

    def caller() -> None:
        go.wait()
        daemon.start_once(lock, start)

    threads = [threading.Thread(target=caller) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(started) == 1
        release.touch()
        wait_until(lambda: daemon.held(lock), "the helper's lock", timeout=HANG)
        assert daemon.wait_released(daemon.start_lock(lock), HANG)  # handed over, then released
        assert not daemon.start_once(lock, start) and len(started) == 1  # it runs: nothing more is started
    finally:
        for p in started:
            p.kill()
            p.wait()
    assert daemon.wait_released(lock, HANG)
    assert daemon.start_once(lock, lambda fd: None)  # it died: the next caller starts another


def test_a_helper_that_dies_before_its_lock_leaves_the_next_start_free(tmp_path: Path) -> None:
    lock = tmp_path / "h.lock"

    def start(fd: int) -> None:
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], pass_fds=(fd,), check=True)

    assert daemon.start_once(lock, start)
    assert not daemon.held(daemon.start_lock(lock))
    assert daemon.start_once(lock, start)


def test_idle_limits_come_from_their_variable_and_a_bad_one_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, want in (("", 30.0), ("2.5", 2.5), ("0", 0.0), ("-1", 30.0), ("soon", 30.0), ("nan", 30.0)):
        monkeypatch.setenv("TSM_X_IDLE", raw)
        assert daemon.idle_limit("TSM_X_IDLE", 30.0) == want, raw
    idle = daemon.Idle(0.0)
    assert idle.over() and idle.left() == 0.0
    idle = daemon.Idle(3600.0)
    assert not idle.over() and idle.left() > 3000


def test_the_code_key_follows_the_sources_the_helper_runs(tmp_path: Path) -> None:
    pkg = tmp_path / "tsm"
    (pkg / "schedulers" / "local").mkdir(parents=True)
    (pkg / "timer").mkdir()
    sup = pkg / "schedulers" / "local" / "supervisor.py"
    sup.write_text("x = 1\n")
    other = pkg / "timer" / "api.py"
    other.write_text("y = 1\n")
    local = daemon.code_key(["schedulers/local"], parent=str(tmp_path), executable="/usr/bin/python3")
    every = daemon.code_key(parent=str(tmp_path), executable="/usr/bin/python3")
    other.write_text("y = 22\n")
    assert daemon.code_key(["schedulers/local"], parent=str(tmp_path), executable="/usr/bin/python3") == local
    assert daemon.code_key(parent=str(tmp_path), executable="/usr/bin/python3") != every  # every folder counts
    assert daemon.code_key(parent=str(tmp_path), executable="/opt/python3") != every
