"""Issue 29's container-backend items (and issue 30's durations) on the real Docker engine of ``scripts/docker-up``.

The same cases run on the fake engine in the fast suite (``tests/schedulers/docker/test_docker_controller.py``);
these are the final proof, on dockerd and runc.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.docker_engine import PYTHON_IMAGE, DockerEngine
from tsm.schedulers.api import Stream
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, AppState, Resource, Role

pytestmark = [pytest.mark.integration, pytest.mark.docker]

SECURITY, HOSTILE = "Security", "Hostile input"
HANG = 240.0
SMALL = Resource(cpu=1, memMB=256)


@pytest.fixture
def sched(docker_engine: DockerEngine) -> Iterator[DockerScheduler]:
    s = DockerScheduler("isec")
    yield s
    s.cleanup(include_running=True, session="isec")
    s.close()


def py(name: str, code: str, **kw: object) -> Role:
    kw.setdefault("resource", SMALL)
    return Role(name, image=PYTHON_IMAGE, entrypoint="python3", args=["-c", code], **kw)  # type: ignore[arg-type]


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout


def running(app_id: str) -> list[str]:
    return docker("ps", "-q", "--filter", f"label=tsm.app-id={app_id}").split()


@pytest.mark.reliability(
    "Docker keeps an app's files private even in a world-readable $TSM_HOME (real engine)",
    expect="with $TSM_HOME 0755 and umask 022: request, record, final status and log snapshots 0600, folders 0700",
    group=SECURITY,
)
def test_every_file_is_private_whatever_tsm_homes_mode(sched: DockerScheduler, tsm_home: Path, figure) -> None:  # type: ignore[no-untyped-def]
    tsm_home.chmod(0o755)
    old = os.umask(0o022)
    try:
        app_id = sched.submit(AppDef("secret", [py("r", "print('out')", env={"TOKEN": "hunter2"})]),
                              {"remove_finished": True})
        assert sched.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    finally:
        os.umask(old)
    root = tsm_home / "docker"
    paths = list(root.rglob("*"))
    assert {"request.json", "app.json", "final.json", "stdout"} <= {p.name for p in paths}
    loose = [f"{p} {oct(stat.S_IMODE(p.stat().st_mode))}" for p in paths
             if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)]
    assert loose == [] and stat.S_IMODE(root.stat().st_mode) == 0o700
    figure("paths checked", len(paths), "")


@pytest.mark.reliability(
    "Docker's status never stops containers of an app this $TSM_HOME did not submit (real engine)",
    expect="another home of the same user looks at a failed app on the same engine: its running replica stays up",
    group=SECURITY,
)
def test_another_homes_status_stops_nothing(sched: DockerScheduler, tmp_path: Path, tsm_home: Path,
                                            monkeypatch: pytest.MonkeyPatch, figure) -> None:  # type: ignore[no-untyped-def]
    # the submitting home's keeper would stop replica 0 at once (the failure is its to act on): this test is
    # about what another home's look does, so the submitter has no keeper
    monkeypatch.setenv("TSM_KEEPER", "0")
    code = "import os, sys, time\nif os.environ['TSM_REPLICA_ID'] == '1': sys.exit(3)\ntime.sleep(600)"
    app_id = sched.submit(AppDef("shared", [py("w", code, num_replicas=2)]))
    deadline = time.monotonic() + HANG
    while len(running(app_id)) != 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "other-home"))
    other = DockerScheduler("other")
    seen = other.describe(app_id)
    assert seen is not None and seen.state == AppState.FAILED
    other.list()
    time.sleep(3)
    left = running(app_id)
    figure("replicas still running after the other home's look", len(left), "")
    assert len(left) == 1  # replica 0 is the submitter's to stop, not this home's
    monkeypatch.setenv("TSM_HOME", str(tsm_home))
    assert sched.wait(app_id, timeout=HANG).state == AppState.FAILED  # type: ignore[union-attr]


@pytest.mark.reliability(
    "Docker list, cancel and cleanup touch only the caller's apps (real engine)",
    expect="every container and network carries the owner label; another user's list, cancel and cleanup(include_running) leave the app running",
    group=SECURITY,
)
def test_another_owner_neither_sees_nor_removes_the_app(sched: DockerScheduler, tmp_path: Path, tsm_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch, figure) -> None:  # type: ignore[no-untyped-def]
    app_id = sched.submit(AppDef("mine", [py("r", "import time; time.sleep(600)")]))
    owners = docker("ps", "-a", "--filter", f"label=tsm.app-id={app_id}", "--format", '{{.Label "tsm.owner"}}').split()
    net = docker("network", "ls", "--filter", f"label=tsm.app-id={app_id}", "--format", '{{.Label "tsm.owner"}}').split()
    assert owners == [sched.client.owner] and net == [sched.client.owner]
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "mallory"))
    monkeypatch.setenv("TSM_OWNER", "mallory")
    mallory = DockerScheduler("isec")
    assert app_id not in [r.app_id for r in mallory.list()]
    mallory.cancel(app_id)
    assert app_id not in mallory.cleanup(include_running=True)
    assert len(running(app_id)) == 1
    figure("containers of the app still running", len(running(app_id)), "")
    monkeypatch.setenv("TSM_HOME", str(tsm_home))


@pytest.mark.reliability(
    "Docker host names fit Linux's 63 characters (real engine)",
    expect="an app whose role name has 63 characters runs: host names cut to 63 with a hash, distinct per replica",
    group=HOSTILE,
)
def test_a_63_character_role_name_runs(sched: DockerScheduler, figure) -> None:  # type: ignore[no-untyped-def]
    name = "r" * 63
    app_id = sched.submit(AppDef("long", [py(name, "import socket; print(socket.gethostname())", num_replicas=2)]))
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    hosts = ["".join(sched.log_iter(app_id, name, k)).strip() for k in range(2)]
    assert len(set(hosts)) == 2 and max(map(len, hosts)) <= 63, hosts
    figure("longest host name", max(map(len, hosts)), "chars", limit=63)


@pytest.mark.reliability(
    "Docker cancel streams each container's log to disk (real engine)",
    expect="cancelling an app whose replica wrote 32 MB keeps under 12 MB of Python memory at peak; the whole log is kept",
    group=SECURITY,
)
def test_cancel_streams_the_logs(sched: DockerScheduler, figure) -> None:  # type: ignore[no-untyped-def]
    code = ("import sys, time\nline = 'x' * 1023 + '\\n'\nfor _ in range(32 * 1024): sys.stdout.write(line)\n"
            "sys.stdout.flush(); print('done', flush=True); time.sleep(600)")
    app_id = sched.submit(AppDef("chatty", [py("r", code)]))
    deadline = time.monotonic() + HANG
    while "done" not in docker("logs", "--tail", "1", f"{app_id}-r-0"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    tracemalloc.start()
    try:
        sched.cancel(app_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    figure("peak Python memory of cancel", peak / 2**20, "MiB", limit=12.0)
    assert peak < 12 * 2**20
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]
    assert "".join(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)).count("\n") == 32 * 1024 + 1


def test_an_ended_app_reports_when_it_started_and_ended(sched: DockerScheduler) -> None:
    """Issue 30 item 4: ``tsm top``/``serve`` show a fixed DURATION (started/ended not null) for an ended app."""
    app_id = sched.submit(AppDef("timed", [py("r", "import time; time.sleep(2)")]))
    assert sched.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    (view,) = sched.view_snapshot([app_id])
    assert view.started is not None and view.ended is not None and 1.5 < view.ended - view.started < 60
    first = view.ended - view.started
    time.sleep(1.1)
    sched._view = None
    (again,) = sched.view_snapshot([app_id])
    assert again.ended is not None and again.started is not None and again.ended - again.started == first
