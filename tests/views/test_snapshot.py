"""The Snapshot model against real local apps, and its refresh cost counted in store queries."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tsm.runner.api import Runner, get_runner
from tsm.schedulers.api import BatchedViews, DetailedViews
from tsm.specs.api import AppDef, AppState, Resource, Role
from tsm.store import Store
from tsm.views import snapshot as snapshot_module
from tsm.views.snapshot import AppView, BatchSnapshot, SnapshotCollector


def py(code: str, name: str = "r", replicas: int = 1, cpu: int = 1, mem: int = 256) -> Role:
    return Role(name, image=".", entrypoint=sys.executable, args=["-u", "-c", code], num_replicas=replicas,
                resource=Resource(cpu=cpu, gpu=0, memMB=mem))


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def wait_for(fn: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_running_and_failed_apps_with_usage_and_last_line(runner: Runner) -> None:
    busy = "import time\nprint('warming up', flush=True)\nt=time.time()\nwhile time.time()-t<60: pass"
    ok = runner.run(AppDef("busy", [py(busy, "spin", replicas=2, cpu=2, mem=512)]), "local")
    bad = runner.run(AppDef("bad", [py("import sys; print('about to fail'); sys.exit(3)", "w")]), "local")
    col = SnapshotCollector(runner=runner)
    try:
        runner.wait(bad, timeout=60)

        def running() -> Any:
            snap = col.refresh()
            app = snap.app(ok)
            if app and app.state == "RUNNING" and all(r.cpu_used for r in app.replicas) and \
                    all(r.last_line == "warming up" for r in app.replicas):
                return snap
            return None

        col.refresh()
        snap = wait_for(running)
        app = snap.app(ok)
        assert [(r.role, r.idx) for r in app.replicas] == [("spin", 0), ("spin", 1)]
        for r in app.replicas:
            assert r.cpu_req == 2 and r.mem_req_mb == 512 and r.gpu_req == 0
            assert 0 < r.cpu_used <= 2.5  # a busy loop on a shared 2-core machine: some of a core
            assert 1 < r.mem_used_mb < 512
            assert r.pid and r.host
        failed = snap.app(bad)
        assert failed.state == "FAILED" and failed.replicas[0].exit_code == 3
        assert failed.last_error and failed.replicas[0].last_line == "about to fail"
        assert failed.replicas[0].cpu_used is None  # ended: nothing to measure
        data = json.loads(json.dumps(snap.to_dict()))
        assert {a["handle"] for a in data["apps"]} == {ok, bad}
        assert all(a["age"] >= 0 and a["duration"] is not None for a in data["apps"])
        assert snap.calls["proc"] == 1
    finally:
        runner.cancel(ok)
    after = col.refresh().app(ok)
    assert after.state == "CANCELLED" and all(r.cpu_used is None for r in after.replicas)


def _fake_history(store: Store, apps: int, replicas: int) -> None:
    """Rows exactly as the runner and the local scheduler write them, for apps that ended long ago."""
    spec = AppDef("many", [py("pass", "w", replicas=replicas)]).to_dict()
    stmts: list[tuple[str, Sequence[Any]]] = []
    for a in range(apps):
        app_id = f"many-{a}"
        stmts.append(("INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated, spec) "
                      "VALUES (?,?,?,?,?,?,?,?,?)",
                      (f"local://default/{app_id}", "local", "default", app_id, "many", int(AppState.SUCCEEDED),
                       1000.0 + a, 1000.0 + a, json.dumps(spec))))
        stmts.append(("INSERT INTO local_apps(app_id, session, name, state, created, app_dir, log_dir, spec) "
                      "VALUES (?,?,?,?,?,?,?,?)",
                      (app_id, "default", "many", int(AppState.SUCCEEDED), 1000.0 + a, "/nonexistent",
                       "/nonexistent", json.dumps(spec))))
        for k in range(replicas):
            stmts.append(("INSERT INTO local_replicas(app_id, role, idx, state, exit_code) VALUES (?,?,?,?,?)",
                          (app_id, "w", k, int(AppState.SUCCEEDED), 0)))
    store.write(stmts)


def _refresh_counting(home: Any, monkeypatch: pytest.MonkeyPatch, apps: int, replicas: int) -> tuple[Any, int]:
    """A refresh of a fresh ``$TSM_HOME`` holding ``apps`` ended local apps, and the store queries it made in all
    (the collector's and the local scheduler's own, through its batched-views capability)."""
    monkeypatch.setenv("TSM_HOME", str(home))
    with Store() as s:
        _fake_history(s, apps, replicas)
    made: list[str] = []
    real = Store.query

    def counting(self: Store, sql: str, params: Sequence[Any] = ()) -> Any:
        made.append(sql)
        return real(self, sql, params)

    monkeypatch.setattr(Store, "query", counting)
    try:
        with get_runner() as runner:
            snap = SnapshotCollector(runner=runner, limit=None).refresh()
    finally:
        monkeypatch.setattr(Store, "query", real)
    return snap, len(made)


@pytest.mark.parametrize("apps,replicas", [(10, 100), (1000, 1)])
def test_refresh_costs_the_same_store_queries_for_1000_replicas_as_for_10(
    apps: int, replicas: int, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_snap, small = _refresh_counting(tmp_path / "small", monkeypatch, 1, 10)
    big_snap, big = _refresh_counting(tmp_path / "big", monkeypatch, apps, replicas)
    assert sum(len(a.replicas) for a in small_snap.apps) == 10
    assert sum(len(a.replicas) for a in big_snap.apps) == 1000
    assert big == small == 3  # history + local_apps + local_replicas
    # the collector made one history query and asked the local scheduler once, through its capability
    assert big_snap.calls == small_snap.calls == {"store": 1, "local.view_snapshot": 1}


def test_local_scheduler_declares_detailed_views_and_the_views_import_no_backend() -> None:
    from tsm.schedulers.local.scheduler import LocalScheduler

    sched = LocalScheduler("t")
    try:
        assert isinstance(sched, DetailedViews) and isinstance(sched, BatchedViews)
    finally:
        sched.close()
    source = (Path(snapshot_module.__file__)).read_text()
    for needle in ('"local"', "local_apps", "_os", "._scheduler("):
        assert needle not in source, needle


class HookedScheduler(BatchedViews):
    """A scheduler declaring the batched-views capability: the collector must call it once and nothing else."""

    def __init__(self) -> None:
        self.calls: list[Sequence[str]] = []

    def view_snapshot(self, app_ids: Sequence[str]) -> list[AppView]:
        self.calls.append(list(app_ids))
        return [AppView("", "hooked", i, "", "RUNNING") for i in app_ids]

    def list(self) -> list[Any]:
        raise AssertionError("list() must not be called when the hook exists")

    def close(self) -> None:
        pass


def test_batch_hook_is_one_call_per_scheduler_per_tick(runner: Runner) -> None:
    hooked = HookedScheduler()
    assert isinstance(hooked, BatchSnapshot)
    runner._schedulers["hooked"] = hooked  # type: ignore[attr-defined]
    with Store() as s:
        s.write([(
            "INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated) VALUES (?,?,?,?,?,?,?,?)",
            (f"hooked://default/a{i}", "hooked", "default", f"a{i}", f"n{i}", int(AppState.PENDING), i, i),
        ) for i in range(50)])
    snap = SnapshotCollector(runner=runner).refresh()
    assert len(hooked.calls) == 1 and len(hooked.calls[0]) == 50
    assert snap.calls["hooked.view_snapshot"] == 1
    assert {a.state for a in snap.apps} == {"RUNNING"} and snap.apps[0].handle == "hooked://default/a49"


class Plain:
    """The local scheduler seen through the base interface only: it declares no capability."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def list(self) -> Any:
        return self.inner.list()

    def describe(self, app_id: str) -> Any:
        return self.inner.describe(app_id)

    def close(self) -> None:
        pass


def test_scheduler_without_hook_costs_one_list_and_one_describe_per_running_app(runner: Runner) -> None:
    """The fallback path, on the real local scheduler registered under a second name with no hook."""
    runner._schedulers["plain"] = Plain(runner.scheduler("local"))  # type: ignore[assignment]
    long = runner.run(AppDef("long", [py("import time; time.sleep(60)", "w", replicas=3)]), "local")
    short = runner.run(AppDef("short", [py("pass", "w", replicas=3)]), "local")
    runner.wait(short, timeout=60)
    with Store() as s:
        s.write([("UPDATE apps SET scheduler='plain', handle=replace(handle, 'local://', 'plain://')", ())])
    col = SnapshotCollector(runner=runner)
    try:
        first = col.refresh()
        assert first.calls == {"store": 1, "plain.list": 1, "plain.describe": 2}
        assert {a.name: len(a.replicas) for a in first.apps} == {"long": 3, "short": 3}
        assert first.app(short.replace("local://", "plain://")).state == "SUCCEEDED"
        second = col.refresh()  # the ended app is remembered: only the running one is described
        assert second.calls == {"store": 1, "plain.list": 1, "plain.describe": 1}
        assert second.app(short.replace("local://", "plain://")).replicas[0].exit_code == 0
    finally:
        runner.cancel(long)


def test_detail_limits_usage_and_last_lines_to_the_apps_shown(runner: Runner) -> None:
    code = "import time\nprint('up', flush=True)\ntime.sleep(60)"
    shown = runner.run(AppDef("shown", [py(code, "w", replicas=2)]), "local")
    other = runner.run(AppDef("other", [py(code, "w", replicas=2)]), "local")
    col = SnapshotCollector(runner=runner)
    try:
        def lines_up() -> Any:
            snap = col.refresh()
            apps = [snap.app(h) for h in (shown, other)]
            return all(a and len(a.replicas) == 2 and all(r.last_line == "up" for r in a.replicas) for a in apps)

        wait_for(lines_up)
        full = col.refresh().calls
        snap = col.refresh(detail={shown})
        assert snap.calls == full  # the same store queries and one process-table walk
        a, b = snap.app(shown), snap.app(other)
        assert a is not None and b is not None
        assert all(r.last_line == "up" and r.mem_used_mb is not None for r in a.replicas), a.replicas
        assert all(r.last_line == "" and r.mem_used_mb is None for r in b.replicas), b.replicas
        assert a.state == b.state == "RUNNING"  # states of every app all the same
    finally:
        runner.cancel(shown)
        runner.cancel(other)


def test_last_lines_are_read_once_after_the_end_and_forgotten_when_not_asked(tmp_path: Any) -> None:
    from tsm.views.snapshot import LastLines

    (tmp_path / "stdout").write_text("one\ntwo\n")
    (tmp_path / "stderr").write_text("")
    tails = LastLines()
    assert tails.last(str(tmp_path)) == "two"
    (tmp_path / "stdout").write_text("one\ntwo\nthree\n")
    assert tails.last(str(tmp_path), final=True) == "three"  # the first look after the end reads the file
    (tmp_path / "stdout").write_text("rewritten\n")
    assert tails.last(str(tmp_path), final=True) == "three"  # ended and read: not looked at again
    tails.prune()
    tails.prune()  # a tick that did not ask about it: forgotten
    assert tails.last(str(tmp_path)) == "rewritten"


def test_an_ended_app_known_only_to_the_history_ran_until_its_end_was_recorded(runner: Runner) -> None:
    """An app its scheduler no longer reports (gone, removed) shows the history's times: it does not keep running."""
    now = time.time()
    with Store() as s:
        s.write([(
            "INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated) VALUES (?,?,?,?,?,?,?,?)",
            (f"local://default/{name}", "local", "default", name, name, int(state), now - 600, now - 480),
        ) for name, state in (("ended", AppState.FAILED), ("pending", AppState.PENDING))])
    snap = SnapshotCollector(runner=runner).refresh()
    ended, pending = (snap.app(f"local://default/{n}") for n in ("ended", "pending"))
    assert ended is not None and pending is not None
    assert ended.ended == pytest.approx(now - 480) and ended.duration(snap.taken) == pytest.approx(120)
    assert pending.ended is None  # not ended: its duration runs on
