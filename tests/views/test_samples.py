"""Usage samples in the store: at most one per replica per interval, only for running apps, gone with the app."""

from __future__ import annotations

from tsm.specs.api import AppState
from tsm.store import Store
from tsm.views.samples import SampleRecorder
from tsm.views.snapshot import AppView, ReplicaView, Snapshot


def snap(state: str, t: float) -> Snapshot:
    reps = [ReplicaView("w", k, state, cpu_used=0.5 + k, mem_used_mb=10.0 * (k + 1)) for k in range(2)]
    return Snapshot(t, [AppView("local://s/a1", "local", "a1", "a", state, replicas=reps)])


def test_interval_running_only_and_removed_apps_forgotten() -> None:
    with Store() as store:
        store.write([("INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated) "
                      "VALUES (?,?,?,?,?,?,?,?)", ("local://s/a1", "local", "s", "a1", "a", int(AppState.RUNNING), 1, 1))])
        rec = SampleRecorder(store, interval=3600)
        assert rec.record(snap("RUNNING", 100.0)) == 2
        assert rec.record(snap("RUNNING", 101.0)) == 0  # within the interval
        rec.interval = 0
        assert rec.record(snap("SUCCEEDED", 102.0)) == 0  # an ended app is not sampled
        assert rec.record(snap("RUNNING", 103.0)) == 2
        assert rec.samples("local://s/a1") == {
            "w/0": [[100.0, 0.5, 10.0, None], [103.0, 0.5, 10.0, None]],
            "w/1": [[100.0, 1.5, 20.0, None], [103.0, 1.5, 20.0, None]],
        }
        SampleRecorder(store)  # a new recorder with the app still known keeps its curves
        assert len(rec.samples("local://s/a1")["w/0"]) == 2
        store.write([("DELETE FROM apps WHERE handle=?", ("local://s/a1",))])  # what tsm rm does to the history
        SampleRecorder(store)
        assert rec.samples("local://s/a1") == {}
