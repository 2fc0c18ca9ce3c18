"""The keeper's loop (:mod:`tsm.schedulers.common.keeper`) on app folders of a temporary home, and its
process started by :func:`ensure`. What its looks decide on a real engine is tested in
``tests/integration/test_docker_long_runs.py`` and ``test_kubernetes_long_runs.py``."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from testutil import wait_until
from tsm.schedulers.common import keeper
from tsm.schedulers.common.keeper import Keeper, held, running_apps


def app(root: Path, app_id: str, final: bool = False) -> None:
    d = root / app_id
    d.mkdir(parents=True)
    (d / "request.json").write_text("{}")
    if final:
        (d / "final.json").write_text("{}")


def test_running_apps_are_those_with_a_request_and_no_final_status(tmp_path: Path) -> None:
    app(tmp_path, "a")
    app(tmp_path, "b", final=True)
    (tmp_path / "c").mkdir()  # not submitted by this home
    (tmp_path / ".keeper.lock").write_text("")
    app(tmp_path, ".hidden")
    assert running_apps(tmp_path) == ["a"]
    assert running_apps(tmp_path / "missing") == []


def test_it_looks_until_every_app_ended_then_leaves_when_idle(tmp_path: Path) -> None:
    app(tmp_path, "a")
    app(tmp_path, "b")
    looks: list[str] = []

    def look(app_id: str) -> bool:
        looks.append(app_id)
        return app_id == "a" or looks.count("b") >= 3  # a has ended; b ends at its third look

    assert Keeper(tmp_path, look, tick=0.01, idle=0.05).run() == "idle"
    assert looks.count("a") == 1 and looks.count("b") == 3  # an ended app is not looked at again
    assert not held(tmp_path)  # the lock goes with it


def test_a_second_keeper_leaves_at_once(tmp_path: Path) -> None:
    first = Keeper(tmp_path, lambda a: False)
    assert first.lock() and held(tmp_path)
    try:
        assert Keeper(tmp_path, lambda a: True).run() == "taken"
    finally:
        first.unlock()
    assert not held(tmp_path)


def test_an_app_submitted_as_it_leaves_is_still_looked_at(tmp_path: Path) -> None:
    # the submission saw the lock held, so started no keeper; the keeper finds the app after releasing it
    looks: list[str] = []
    k = Keeper(tmp_path, lambda a: looks.append(a) or True, tick=0.01, idle=0.0)
    unlock = k.unlock

    def unlock_then_submit() -> None:
        unlock()
        if not looks:
            app(tmp_path, "late")

    k.unlock = unlock_then_submit  # type: ignore[method-assign]
    assert k.run() == "idle"
    assert looks == ["late"]


def test_a_failed_look_is_logged_and_the_others_go_on(tmp_path: Path) -> None:
    app(tmp_path, "a")
    app(tmp_path, "b")
    said: list[str] = []

    def look(app_id: str) -> bool:
        if app_id == "a":
            raise ConnectionError("engine away")
        return True

    k = Keeper(tmp_path, look, tick=0.01, idle=0.05, log=said.append)
    stop = threading.Timer(0.3, lambda: (tmp_path / "a" / "final.json").write_text("{}"))
    stop.start()
    assert k.run() == "idle"
    assert "b" in k.ended
    assert said == ["look at a failed: ConnectionError: engine away"]  # said once, not at every tick


def test_new_code_on_disk_ends_the_loop(tmp_path: Path) -> None:
    app(tmp_path, "a")
    assert Keeper(tmp_path, lambda a: False, tick=0.01).run(changed=lambda: True) == "changed"
    assert not held(tmp_path)


def test_ensure_starts_one_keeper_process_that_leaves_when_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_KEEPER_IDLE", "1")
    root = tmp_path / "docker"
    keeper.ensure("docker", root)
    wait_until(lambda: held(root), "the keeper took its lock", timeout=60)
    keeper.ensure("docker", root)  # held: nothing more is started
    assert oct((root / ".keeper.lock").stat().st_mode & 0o777) == "0o600"
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    wait_until(lambda: not held(root), "the idle keeper left", timeout=60)
    assert (root / ".keeper.log").read_text() == ""  # nothing went wrong


def test_no_keeper_when_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_KEEPER", "0")
    keeper.ensure("docker", tmp_path)  # ensure opens the keeper's log before it starts one: none was
    assert not held(tmp_path) and not (tmp_path / ".keeper.log").exists()


def test_the_keeper_refuses_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert keeper.main(["slurm", "/tmp"]) == 2
    assert capsys.readouterr().err == "usage: keeper {docker,kubernetes} ROOT\n"


def test_its_command_runs_the_tsm_of_this_process_isolated() -> None:
    cmd = keeper._command("docker", Path("/x"))
    assert cmd[:3] == [sys.executable, "-I", "-c"]  # no working directory on its sys.path
    assert cmd[5] == str(Path(keeper.__file__).resolve().parents[3])  # the first path: this tsm
    assert os.path.isdir(os.path.join(cmd[5], "tsm")) and cmd[-2:] == ["docker", "/x"]


def test_an_app_whose_looks_keep_failing_is_given_up(tmp_path: Path) -> None:
    # its engine is gone for good (a removed DOCKER_HOST): the keeper stops looking and leaves when idle
    app(tmp_path, "a")
    said: list[str] = []

    def look(app_id: str) -> bool:
        raise ConnectionError("engine gone")

    k = Keeper(tmp_path, look, tick=0.01, idle=0.05, log=said.append, give_up=0.2)
    assert k.run() == "idle"
    assert said[0] == "look at a failed: ConnectionError: engine gone" and len(said) == 2, said
    assert said[1].startswith("gave up on a: its looks failed for ")


@pytest.mark.reliability(
    "10 submissions at once start one keeper",
    expect="ten threads (a sweep's workers) submitting to one home at the same moment start one keeper "
    "interpreter, which holds the lock; none is started while it runs",
    group="Load",
)
def test_ten_submissions_at_once_start_one_keeper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 figure) -> None:  # type: ignore[no-untyped-def]
    """Counted by the interpreter itself: ``sys.executable`` is a shell that notes its pid, then execs python."""
    started = tmp_path / "started"
    counting = tmp_path / "python"
    counting.write_text(f"#!/bin/sh\necho $$ >> {started}\nexec {sys.executable} \"$@\"\n")
    counting.chmod(0o700)
    monkeypatch.setattr(sys, "executable", str(counting))
    monkeypatch.setenv("TSM_KEEPER_IDLE", "600")  # it stays until killed below
    root = tmp_path / "docker"
    go = threading.Barrier(10)

    def submission() -> None:
        go.wait()
        keeper.ensure("docker", root)

    threads = [threading.Thread(target=submission) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pids: list[int] = []
    try:
        wait_until(lambda: held(root), "the keeper's lock", timeout=60)  # each interpreter noted itself by then
        keeper.ensure("docker", root)
        pids = [int(p) for p in started.read_text().split()]
        figure("keepers started by 10 submissions", len(pids), "", limit=1)
        assert len(pids) == 1, pids
    finally:
        for pid in pids or ([int(p) for p in started.read_text().split()] if started.exists() else []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
