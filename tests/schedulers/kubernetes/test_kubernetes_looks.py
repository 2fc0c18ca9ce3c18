"""Looks that race on the fake cluster (issue 25 review): a pod list older than another look's, a cancel or a
remove under way while a look acts, a failed pod deleted after its failure, preemptions counted per role, and
the ``finishing`` marker of a stop whose delete failed.

Each case sets the race up deterministically (a view listed before another look, the cancel marker held)
and asserts recorded states and the replica's own output, never timing.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from schedulers.kubernetes.fake_kube import FakeCluster
from tsm.errors import SchedulerError
from tsm.schedulers.common.appdir import AppDir
from tsm.schedulers.common.container_lock import locked
from tsm.schedulers.kubernetes.client import KubeClient
from tsm.schedulers.kubernetes.nodes import DELETED_BY_CLUSTER
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler, store_root
from tsm.schedulers.kubernetes.status import AppView, from_json
from tsm.specs.api import AppDef, AppState, RetryPolicy, Role

PY = sys.executable
CFG = {"dns": "yes"}
RUNS = "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.05)\n"


def role(code: str, name: str = "w", **kw: object) -> Role:
    return Role(name, image="fake/python", entrypoint=PY, args=["-c", code], **kw)  # type: ignore[arg-type]


def wait_for(pred: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


def phases(cluster: FakeCluster) -> list[str]:
    with cluster.lock:
        return [p.phase for p in cluster.pods.values()]


def listed(s: KubernetesScheduler, app_id: str) -> AppView:
    req = s.request(app_id)
    assert req is not None
    return AppView(app_id, req.roles, time.time(), [from_json(p) for p in s.client.list_pods(app_id)])


def test_a_list_older_than_another_looks_is_listed_again_not_taken_for_a_lost_pod(cluster: FakeCluster) -> None:
    """Look A lists (no pod yet), look B lists later, sees the pod and records it; A, taking the lock after
    B, must not find that pod "vanished" (a false eviction that spends max_preemptions)."""
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role(RUNS)]), CFG)
    req = s.request(app_id)
    assert req is not None
    stale_at = time.time()
    stale = AppView(app_id, req.roles, stale_at, [])  # A's list: the Job controller had not made the pod yet
    wait_for(lambda: phases(cluster) == ["Running"])
    b = s.look(listed(s, app_id), time.time())  # B: sees the pod, records it in pods-seen.json
    assert b.state == AppState.RUNNING, b
    a = s.look(stale, stale_at)
    assert a.state == AppState.RUNNING and not a.msg.startswith("retrying"), a
    d = AppDir(store_root(), app_id)
    assert not d.exists("preemptions.json") and d.attempts().get("w", 0) == 0
    # a look whose list is the newest acts on it as it is: no second list
    n = sum(1 for c, _ in cluster.calls if c == "list_namespaced_pod")
    s.look(listed(s, app_id), time.time())
    assert sum(1 for c, _ in cluster.calls if c == "list_namespaced_pod") == n + 1  # listed() only
    s.cancel(app_id)


def test_a_look_during_a_cancel_makes_no_jobs(cluster: FakeCluster) -> None:
    """A look that gets the app's lock while a cancel is under way (its marker) acts on nothing: a failed
    replica with retries left is not retried (its new Jobs would outlive the cancel)."""
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role("raise SystemExit(1)", max_retries=3, retry_policy=RetryPolicy.ROLE)]), CFG)
    wait_for(lambda: phases(cluster) == ["Failed"])
    d = AppDir(store_root(), app_id)
    view = listed(s, app_id)
    with d.cancel_marker():
        desc = s.look(view, time.time())
        assert desc.state == AppState.RUNNING and desc.msg == "being stopped (by another look at it)", desc
    assert phases(cluster) == ["Failed"] and d.attempts().get("w", 0) == 0
    s.cancel(app_id)
    final = s.describe(app_id)
    assert final is not None and final.state.is_terminal


def test_a_lock_never_makes_a_removed_app_directory_again(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role(RUNS)]), CFG)
    d = AppDir(store_root(), app_id)
    assert d.exists()
    assert s.remove(app_id)
    with locked(d) as held:
        assert not held
    assert not d.exists()


def test_a_failed_pod_deleted_after_its_failure_is_a_failure_not_a_preemption(cluster: FakeCluster) -> None:
    """A pod seen Failed by its own exit, then deleted by someone else (pod GC, a cleanup), is its failure."""
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role("raise SystemExit(3)")]), CFG)
    wait_for(lambda: phases(cluster) == ["Failed"])
    req = s.request(app_id)
    assert req is not None
    seen = listed(s, app_id)
    s._mark_lost(req, seen, {})
    assert [p.lost for p in seen.pods] == [""]
    gone = AppView(app_id, req.roles, seen.created, [])  # the pod GC deleted it
    s._mark_lost(req, gone, {})
    assert [(p.phase, p.exit_code, p.lost, p.deleting) for p in gone.pods] == [("Failed", 3, "", False)], gone.pods
    # one seen running, then gone, is still lost to the cluster
    running = KubernetesScheduler("t", client=cluster.client())
    other = running.submit(AppDef("st", [role(RUNS)]), CFG)
    wait_for(lambda: "Running" in phases(cluster))
    oreq = running.request(other)
    assert oreq is not None
    running._mark_lost(oreq, listed(running, other), {})
    vanished = AppView(other, oreq.roles, time.time(), [])
    running._mark_lost(oreq, vanished, {})
    assert [p.lost.startswith(DELETED_BY_CLUSTER) for p in vanished.pods] == [True]
    s.cancel(app_id)
    running.cancel(other)


#: role "a": runs (until evicted); role "b": says its attempt, then fails once the flag file exists
B_FAILS = ("import os, sys, time\nprint('attempt', os.environ['TSM_ATTEMPT'], flush=True)\n"
           "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\nraise SystemExit(1)\n")


def test_a_preemption_of_one_role_gives_another_role_no_extra_failure_retry(cluster: FakeCluster,
                                                                            tmp_path: Path) -> None:
    """ROLE policy: role a preempted once, role b (max_retries=1) fails twice: b is retried once, then the
    app fails (a's preemption is a's, not b's)."""
    flag = tmp_path / "fail-now"
    s = KubernetesScheduler("t", client=cluster.client())
    b = Role("b", image="fake/python", entrypoint=PY, args=["-c", B_FAILS, str(flag)], max_retries=1,
             retry_policy=RetryPolicy.ROLE)
    app_id = s.submit(AppDef("pr", [role(RUNS, name="a", retry_policy=RetryPolicy.ROLE), b]), CFG)
    seen: list[str] = []
    deadline = time.monotonic() + 60
    evicted = False
    while True:
        desc = s.describe(app_id)
        assert desc is not None
        if not seen or seen[-1] != desc.msg:
            seen.append(desc.msg)
        if desc.state.is_terminal:
            break
        with cluster.lock:
            a0 = next((n for n, p in cluster.pods.items() if p.phase == "Running" and not p.deleted
                       and p.obj["metadata"]["labels"]["tsm/role"] == "a"), None)
        if not evicted and a0 is not None:
            cluster.evict(a0)
            evicted = True
        if any(m.startswith("retrying after role 'a'") for m in seen):
            flag.write_text("")
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)
    assert desc.state == AppState.FAILED, seen
    log = "".join(s.log_iter(app_id, "b", 0))
    assert "attempt 1" in log and "attempt 2" not in log, (log, seen)
    events = json.loads(AppDir(store_root(), app_id).read("preemptions.json") or "[]")
    assert events == [[1, ["a"]]], events


def test_a_stop_whose_delete_fails_leaves_no_finishing_marker(cluster: FakeCluster,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role(RUNS)]), CFG)
    wait_for(lambda: phases(cluster) == ["Running"])
    real = KubeClient.delete_app
    fails = [1]

    def delete_app(self: KubeClient, app_id: str, grace: int | None = None) -> None:
        if fails:
            fails.pop()
            raise SchedulerError("the API server timed out")
        real(self, app_id, grace)

    monkeypatch.setattr(KubeClient, "delete_app", delete_app)
    with pytest.raises(SchedulerError):
        s.cancel(app_id)
    d = AppDir(store_root(), app_id)
    assert not d.exists("finishing") and d.final() is None
    desc = s.look(listed(s, app_id), time.time())  # the app is looked at as it is, not "being stopped"
    assert desc.state == AppState.RUNNING and desc.msg != "being stopped (by another look at it)", desc
    s.cancel(app_id)
    final = d.final()
    assert final is not None and final.state == AppState.CANCELLED


def test_a_look_waiting_for_the_lock_answers_once_a_stop_begins(cluster: FakeCluster) -> None:
    """A look that began waiting for the app's lock before another look started stopping the app does not
    wait through that stop (grace period, follows): it answers "being stopped" once ``finishing`` exists,
    while the lock is still held."""
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role(RUNS)]), CFG)
    d = AppDir(store_root(), app_id)
    answers: list[str] = []
    with locked(d) as held:
        assert held
        t = threading.Thread(target=lambda: answers.append(s.look(listed(s, app_id), time.time()).msg), daemon=True)
        n = sum(1 for c, _ in cluster.calls if c == "list_namespaced_pod")
        t.start()
        wait_for(lambda: sum(1 for c, _ in cluster.calls if c == "list_namespaced_pod") > n)  # it is looking
        d.write("finishing", "")
        t.join(30)
        assert answers == ["being stopped (by another look at it)"]  # answered with the lock still held here
    (d.path / "finishing").unlink()
    s.cancel(app_id)


#: a replica that prints "warned" on USR1 (after the snapshot of a cancel) and runs on until stopped
WARNABLE = ("import signal, time\nsignal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
            "print('up', flush=True)\nwhile True: time.sleep(0.05)\n")


def test_the_lines_written_after_a_warning_are_in_a_windowed_read_too(cluster: FakeCluster) -> None:
    """A cancel warns the pod, which writes on within its grace period: that line is kept in the plain
    log and in the stamped copy that ``tsm log --since/--until`` reads."""
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("wa", [role(WARNABLE)]),
                      {**CFG, "warn_signal": "USR1", "warn_before": "1s", "grace_period": 1})
    wait_for(lambda: "up" in "".join(s.log_iter(app_id, "w", 0)))
    s.cancel(app_id)
    assert "".join(s.log_iter(app_id, "w", 0)) == "up\nwarned\n"
    since = datetime.fromtimestamp(0, tz=timezone.utc)
    assert "".join(s.log_iter(app_id, "w", 0, since=since)) == "up\nwarned\n"
