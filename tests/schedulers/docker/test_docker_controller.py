"""The Docker scheduler on the fake engine (``fake_docker.py``): controller, security and cleanup cases in seconds.

The same cases run on the real engine in ``tests/integration/test_docker.py`` (the final proof); here they run
in the fast suite through the real scheduler and client over an in-memory engine.
"""

from __future__ import annotations

import os
import stat
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schedulers.docker.fake_docker import FakeDockerEngine, FakeImages, fake_client
from tsm.schedulers.docker.request import HOST_MAX, dns_name
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, AppState, RetryPolicy, Role

SECURITY, HOSTILE = "Security", "Hostile input"
PY = sys.executable
HANG = 60.0


def role(name: str, code: str, **kw: object) -> Role:
    return Role(name, image="fake/python", entrypoint=PY, args=["-c", code], **kw)  # type: ignore[arg-type]


@pytest.fixture
def engine() -> Iterator[FakeDockerEngine]:
    e = FakeDockerEngine()
    yield e
    for c in list(e.by_id.values()):
        if c.current is not None:
            c.current.signal(9)


def sched_on(engine: FakeDockerEngine, as_owner: str | None = None) -> DockerScheduler:
    return DockerScheduler("t", client=fake_client(engine, as_owner), images=FakeImages())


def loose_modes(root: Path) -> list[str]:
    """Paths under ``root`` that another user could read or enter (files not 0600, dirs not 0700)."""
    out = []
    for p in root.rglob("*"):
        mode = stat.S_IMODE(p.lstat().st_mode)
        want = 0o700 if p.is_dir() else 0o600
        if mode != want:
            out.append(f"{p.relative_to(root)} {oct(mode)}")
    return out


@pytest.mark.reliability(
    "Docker keeps an app's files private even in a world-readable $TSM_HOME",
    expect="with $TSM_HOME 0755 and umask 022: request, record, final status and log snapshots 0600, folders 0700",
    group=SECURITY,
)
def test_every_file_is_private_whatever_tsm_homes_mode(engine: FakeDockerEngine, tsm_home: Path, figure) -> None:  # type: ignore[no-untyped-def]
    tsm_home.chmod(0o755)
    old = os.umask(0o022)
    try:
        s = sched_on(engine)
        app_id = s.submit(AppDef("secret", [role("r", "print('out')", env={"TOKEN": "hunter2"})]))
        assert s.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
        s._finish(app_id, s.describe(app_id))  # type: ignore[arg-type]  # final status and log snapshots
    finally:
        os.umask(old)
    root = tsm_home / "docker"
    files = [p for p in root.rglob("*") if p.is_file()]
    assert {"request.json", "app.json", "final.json", "stdout"} <= {p.name for p in files}
    assert loose_modes(root) == [] and stat.S_IMODE(root.stat().st_mode) == 0o700
    figure("paths checked", len(list(root.rglob("*"))), "")


@pytest.mark.reliability(
    "Docker's status never stops containers of an app this $TSM_HOME did not submit",
    expect="another home of the same user sees the failed app on the same engine and stops nothing of it",
    group=SECURITY,
)
def test_status_of_an_app_without_its_request_stops_nothing(engine: FakeDockerEngine, tsm_home: Path,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figure) -> None:  # type: ignore[no-untyped-def]
    mine = sched_on(engine)
    code = "import os, sys, time\nif os.environ['TSM_REPLICA_ID'] == '1': sys.exit(3)\ntime.sleep(60)"
    app_id = mine.submit(AppDef("shared", [role("w", code, num_replicas=2)]))
    deadline = time.monotonic() + HANG
    while not any(c.state == "exited" for c in engine.by_id.values()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "other-home"))
    other = sched_on(engine)
    seen = other.describe(app_id)
    rows = other.list()
    assert seen is not None and seen.state == AppState.FAILED and app_id in [r.app_id for r in rows]
    time.sleep(0.3)
    stops = [a for name, a in engine.calls if name in ("stop", "remove_container")]
    assert stops == [], stops
    assert any(c.state == "running" for c in engine.by_id.values())  # replica 0 runs on, untouched
    figure("stop calls by the other home", len(stops), "", limit=0)
    monkeypatch.setenv("TSM_HOME", str(tsm_home))
    assert mine.wait(app_id, timeout=HANG).state == AppState.FAILED  # type: ignore[union-attr]


@pytest.mark.reliability(
    "Docker list, cancel and cleanup touch only the caller's apps",
    expect="another user's list shows none of them; their cleanup(include_running) and cancel leave them running",
    group=SECURITY,
)
def test_another_owner_neither_sees_nor_removes_the_app(engine: FakeDockerEngine, tmp_path: Path, tsm_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch, figure) -> None:  # type: ignore[no-untyped-def]
    mine = sched_on(engine)
    app_id = mine.submit(AppDef("mine", [role("r", "import time; time.sleep(60)")]))
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "mallory"))  # another user: their own home
    mallory = sched_on(engine, as_owner="mallory")
    assert app_id not in [r.app_id for r in mallory.list()]
    assert mallory.describe(app_id) is None
    mallory.cancel(app_id)
    assert mallory.cleanup(include_running=True) == []
    monkeypatch.setenv("TSM_HOME", str(tsm_home))
    assert mine.describe(app_id).state == AppState.RUNNING  # type: ignore[union-attr]
    labels = [c.labels for c in engine.by_id.values()] + [n["Labels"] for n in engine.nets.values()]
    assert labels and all(lb.get("tsm.owner") == mine.client.owner for lb in labels)
    figure("objects of the app", len(labels), "")
    mine.cancel(app_id)


@pytest.mark.reliability(
    "Docker host names fit Linux's 63 characters",
    expect="a 63-character role name gives host names of at most 63 characters, distinct per role, and the app runs",
    group=HOSTILE,
)
def test_a_long_role_name_gives_a_host_name_linux_takes(engine: FakeDockerEngine, figure) -> None:  # type: ignore[no-untyped-def]
    long_a, long_b = "a" * 63, "a" * 62 + "b"
    assert len(dns_name(long_a, 12)) <= HOST_MAX and dns_name(long_a, 0) != dns_name(long_b, 0)
    assert dns_name("trainer", 3) == "trainer-3"  # short names unchanged
    s = sched_on(engine)
    app_id = s.submit(AppDef("long", [role(long_a, "print('ok')", num_replicas=2)]))
    assert s.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    hosts = [a["hostname"] for name, a in engine.calls if name == "create_container"]
    assert hosts and max(map(len, hosts)) <= HOST_MAX
    figure("longest host name", max(map(len, hosts)), "chars", limit=HOST_MAX)


@pytest.mark.reliability(
    "Docker cancel streams each container's log to disk",
    expect="cancelling an app whose replica wrote 24 MB keeps under 8 MB of Python memory at peak (was 5 full copies)",
    group=SECURITY,
)
def test_cancel_streams_logs_instead_of_reading_them_whole(engine: FakeDockerEngine, figure) -> None:  # type: ignore[no-untyped-def]
    s = sched_on(engine)
    code = "import sys, time\nfor _ in range(24 * 1024): sys.stdout.write('x' * 1023 + '\\n')\nsys.stdout.flush(); time.sleep(60)"
    app_id = s.submit(AppDef("chatty", [role("r", code)]))
    deadline = time.monotonic() + HANG
    while sum(len(p.data) for c in engine.by_id.values() for r in c.runs for p in r.pieces) < 24 * 2**20:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    tracemalloc.start()
    try:
        s.cancel(app_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]
    assert "".join(s.log_iter(app_id, "r", 0)).count("\n") == 24 * 1024  # the whole log was kept
    figure("peak Python memory of cancel", peak / 2**20, "MiB", limit=8.0)
    assert peak < 8 * 2**20


def test_an_application_retry_replaces_every_role_and_the_attempt_is_labelled(engine: FakeDockerEngine,
                                                                               tmp_path: Path) -> None:
    s = sched_on(engine)
    marker = tmp_path / "tries"
    code = f"import sys; p = {str(marker)!r}; open(p, 'a').write('x'); sys.exit(1 if len(open(p).read()) == 1 else 0)"
    app = AppDef("retry", [role("a", code, max_retries=1, retry_policy=RetryPolicy.APPLICATION),
                           role("b", "import time; time.sleep(1)")])
    app_id = s.submit(app)
    desc = s.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED and desc.num_restarts >= 1
    attempts = {c.labels["tsm.role"]: c.labels["tsm.attempt"] for c in engine.by_id.values()}
    assert attempts == {"a": "1", "b": "1"}


def test_a_look_that_listed_during_anothers_retry_lists_again(engine: FakeDockerEngine, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes look at one app (the keeper beside ``tsm wait``): B lists the containers while A's retry
    is replacing them (the old one killed, not yet removed), then waits for A's lock. B must list again, not
    take the killed container for a new failure (it retried twice, or failed the app with the kill's
    ``exited with code 143``)."""
    a, b = sched_on(engine), sched_on(engine)
    app_id = a.submit(AppDef("race", [role("w", "import os, sys, time\n"
                                               "if os.environ['TSM_ATTEMPT'] == '0': sys.exit(3)\n"
                                               "time.sleep(60)", max_retries=1)]))
    deadline = time.monotonic() + HANG
    while not any(c.state == "exited" for c in engine.by_id.values()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    seen: dict[str, Any] = {}
    remove = engine.remove_container

    def remove_after_b_listed(ref: str, force: bool = False, v: bool = False) -> None:
        if not seen:
            seen.update(b._observe())  # B's list, taken mid-retry: the old container ended, still there
        remove(ref, force=force, v=v)

    monkeypatch.setattr(engine, "remove_container", remove_after_b_listed)
    first = a.describe(app_id)  # A's look: the retry
    assert first is not None and first.state == AppState.RUNNING and first.num_restarts == 1, first
    assert [c.attempt for c in seen[app_id][0].containers] == [0]
    desc = b.look(*seen[app_id])  # B's look, on its list of before the retry
    assert desc.state == AppState.RUNNING and desc.num_restarts == 1, desc
    assert sum(1 for name, _ in engine.calls if name == "create_container") == 2  # one retry, not two
    assert [c.labels["tsm.attempt"] for c in engine.by_id.values()] == ["1"]
    a.cancel(app_id)


def test_a_final_failure_stops_the_other_replicas(engine: FakeDockerEngine) -> None:
    s = sched_on(engine)
    code = "import os, sys, time\nif os.environ['TSM_REPLICA_ID'] == '1': sys.exit(4)\ntime.sleep(60)"
    app_id = s.submit(AppDef("fails", [role("w", code, num_replicas=2)]))
    desc = s.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.FAILED and "replica 1" in desc.msg
    deadline = time.monotonic() + HANG
    while any(c.state == "running" for c in engine.by_id.values()):
        assert time.monotonic() < deadline, "replica 0 was not stopped"
        time.sleep(0.05)


def test_a_finished_app_reports_when_it_started_and_ended(engine: FakeDockerEngine) -> None:
    """Issue 30 item 4: the views show a fixed DURATION for an ended app (started/ended not null)."""
    s = sched_on(engine)
    app_id = s.submit(AppDef("timed", [role("r", "import time; time.sleep(0.5)")]))
    assert s.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    (view,) = s.view_snapshot([app_id])
    assert view.started is not None and view.ended is not None and 0.3 < view.ended - view.started < 30
    s._finish(app_id, s.describe(app_id))  # type: ignore[arg-type]  # containers removed, final.json kept
    s._view = None
    (kept,) = s.view_snapshot([app_id])  # from final.json once the containers are gone
    assert (kept.started, kept.ended) == (view.started, view.ended)


def test_cleanup_dry_run_lists_and_removes_nothing(engine: FakeDockerEngine) -> None:
    s = sched_on(engine)
    app_id = s.submit(AppDef("done", [role("r", "pass")]))
    assert s.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert s.cleanup(dry_run=True) == [app_id] and len(engine.by_id) == 1
    assert s.cleanup() == [app_id] and len(engine.by_id) == 0 and engine.nets == {}
    assert s.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]


def test_cleanup_cli_has_help_and_a_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    from tsm.schedulers.docker.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["cleanup", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--dry-run" in out and "--include-running" in out
    with pytest.raises(SystemExit) as exit_:
        main(["cleanup", "--bogus"])
    assert exit_.value.code == 2


def test_a_roles_containers_are_created_concurrently_within_the_bound(engine: FakeDockerEngine) -> None:
    """Issue 26: submit creates a role's containers a few at a time (never more than CREATE_CONCURRENCY)."""
    import threading

    from tsm.schedulers.docker import scheduler as mod

    inflight, most, lock = [0], [0], threading.Lock()
    create = engine.create_container

    def slow_create(*a: object, **kw: object) -> dict[str, str]:
        with lock:
            inflight[0] += 1
            most[0] = max(most[0], inflight[0])
        time.sleep(0.05)  # a create that takes a round trip, so calls overlap when issued together
        try:
            return create(*a, **kw)  # type: ignore[arg-type]
        finally:
            with lock:
                inflight[0] -= 1

    engine.create_container = slow_create  # type: ignore[method-assign]
    s = sched_on(engine)
    app_id = s.submit(AppDef("many", [Role("r", image="fake/python", entrypoint="true", num_replicas=12)]))
    assert 2 <= most[0] <= mod.CREATE_CONCURRENCY
    final = s.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert sorted(r.id for r in final.roles_statuses[0].replicas) == list(range(12))
