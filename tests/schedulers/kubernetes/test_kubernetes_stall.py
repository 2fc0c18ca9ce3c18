"""Stall detection on Kubernetes (issue 25, :mod:`tsm.schedulers.kubernetes.stall`), on the fake cluster:
a replica that stops writing is warned (the ``preStop`` hook's signal), then retried as its own failure
(``TSM_LAST_EXIT=stalled``, ``max_retries`` spent) or the app fails "stalled for X, last line: ..."; the
metrics API, where it answers, keeps a computing replica from counting as stalled; two schedulers looking at
one app at once act once.

Each case asserts from the recorded states and the replica's own output; the check's clock is passed in
(``now``) where a case is about time, never read from a timer.
"""

from __future__ import annotations

import sys
import threading
import time

from schedulers.kubernetes.fake_kube import FakeCluster
from tsm.schedulers.common.appdir import AppDir
from tsm.schedulers.common.container_lock import locked
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler, store_root
from tsm.schedulers.kubernetes.stall import StallState, check
from tsm.schedulers.kubernetes.status import from_json
from tsm.specs.api import AppDef, AppState, RetryPolicy, Role

PY = sys.executable

#: attempt 0 says which it is, writes "working" and then goes silent (a hang) until stopped; a later
#: attempt says which it is and why the last ended, and succeeds. USR1 prints "warned"; SIGTERM exits 0
#: (a replica stopped for a stall is FAILED whatever its exit code).
HANGS_ONCE = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print('warned', flush=True))\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "print('attempt', os.environ['TSM_ATTEMPT'], os.environ['TSM_RESTART_COUNT'],"
    " repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "if os.environ['TSM_ATTEMPT'] != '0': raise SystemExit(0)\n"
    "print('working', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)
CFG = {"dns": "yes", "stall_timeout": "1s", "warn_signal": "USR1", "warn_before": "1s", "grace_period": 1}


def role(code: str, **kw: object) -> Role:
    return Role("w", image="fake/python", entrypoint=PY, args=["-c", code], **kw)  # type: ignore[arg-type]


def looks(s: KubernetesScheduler, app_id: str, timeout: float = 60.0) -> list[tuple[str, str]]:
    """Look at the app until it ends (each look is a controller step); the distinct (state, msg) seen."""
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    while True:
        desc = s.describe(app_id)
        assert desc is not None
        if not seen or seen[-1] != (desc.state.name, desc.msg):
            seen.append((desc.state.name, desc.msg))
        if desc.state.is_terminal:
            return seen
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)


def warned(cluster: FakeCluster) -> list[str]:
    return [c[1]["signal"] for c in cluster.calls if c[0] == "preStop"]


def test_a_stalled_replica_is_warned_then_retried_as_a_failure(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role(HANGS_ONCE, max_retries=1, retry_policy=RetryPolicy.ROLE)]), CFG)
    seen = looks(s, app_id)
    assert seen[-1] == ("SUCCEEDED", ""), seen
    assert any(m == "retrying after role 'w' replica 0 stalled for 1s, last line: 'working'" for _, m in seen), seen
    log = "".join(s.log_iter(app_id, "w", 0))
    assert "attempt 0 0 ''\nworking\nwarned\n" in log, log  # warned (preStop's USR1) before it was stopped
    assert "attempt 1 1 'stalled'" in log, log
    assert warned(cluster) == ["USR1"]
    final = s.describe(app_id)
    assert final is not None and final.num_restarts == 1 and "preemptions" not in final.metadata


def test_a_stall_with_no_retries_left_fails_the_replica_whatever_its_exit(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role(HANGS_ONCE)]), CFG)  # max_retries=0
    seen = looks(s, app_id)
    assert seen[-1] == ("FAILED", "role 'w' replica 0 stalled for 1s, last line: 'working'"), seen
    final = s.describe(app_id)
    assert final is not None
    r = final.roles_statuses[0].replicas[0]
    assert r.state == AppState.FAILED and r.error_msg == "stalled for 1s, last line: 'working'", r
    assert "warned" in "".join(s.log_iter(app_id, "w", 0))


def test_on_stall_fail_fails_the_app_and_stops_every_replica(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    quiet_one = HANGS_ONCE.replace("os.environ['TSM_ATTEMPT'] != '0'", "os.environ['TSM_REPLICA_ID'] == '7'")
    talker = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
              "while True: print('tick', flush=True); time.sleep(0.05)\n")
    app = AppDef("st", [role(quiet_one, max_retries=3, retry_policy=RetryPolicy.ROLE),
                        Role("talk", image="fake/python", entrypoint=PY, args=["-c", talker])])
    app_id = s.submit(app, {**CFG, "on_stall": "fail"})
    seen = looks(s, app_id)
    assert seen[-1] == ("FAILED", "role 'w' replica 0 stalled for 1s, last line: 'working'"), seen
    assert not any(m.startswith("retrying") for _, m in seen), seen  # on_stall=fail spends no max_retries
    final = s.describe(app_id)
    assert final is not None
    by_role = {rs.role: rs.replicas[0] for rs in final.roles_statuses}
    assert by_role["w"].state == AppState.FAILED and by_role["w"].error_msg.startswith("stalled for 1s")
    assert by_role["talk"].state == AppState.CANCELLED  # the replica that wrote on was stopped, not stalled
    assert sorted(warned(cluster)) == ["USR1", "USR1"]  # both were warned by the hook before SIGTERM
    assert StallState.load(AppDir(store_root(), app_id)).failed == seen[-1][1]


def test_the_metrics_api_keeps_a_computing_replica_from_stalling(cluster: FakeCluster) -> None:
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role(HANGS_ONCE)]), {"dns": "yes"})
    client = cluster.client()

    def pods() -> list:  # type: ignore[type-arg]
        return [from_json(p) for p in client.list_pods(app_id)]

    deadline = time.monotonic() + 30
    while not (pods() and pods()[0].started and b"working" in client.log(pods()[0].name)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    name = pods()[0].name
    # with metrics served: busy at 0.5 cores, the silent log does not make it stalled
    cluster.metrics = {name: 0.5}
    busy = StallState()
    assert check(client, app_id, busy, pods(), 10.0, now=1000.0) == []
    assert check(client, app_id, busy, pods(), 10.0, now=1020.0) == []
    assert busy.marks[name]["since"] == 1020.0  # its quiet period starts again at each busy check
    # idle by the metrics: stalled once the timeout has passed since the first quiet check
    cluster.metrics = {name: 0.0}
    idle = StallState()
    assert check(client, app_id, idle, pods(), 10.0, now=1000.0) == []
    assert check(client, app_id, idle, pods(), 10.0, now=1005.0) == []
    found = check(client, app_id, idle, pods(), 10.0, now=1010.0)
    assert [(p.name, why) for p, why in found] == [(name, "stalled for 10s, last line: 'working'")]
    # no metrics API (the test cluster): the log alone decides, and the metrics list is asked once per check
    cluster.metrics = None
    alone = StallState()
    check(client, app_id, alone, pods(), 10.0, now=1000.0)
    assert [p.name for p, _ in check(client, app_id, alone, pods(), 10.0, now=1010.0)] == [name]
    # a check within a tick of the last reads nothing
    listed = pods()
    n = len(cluster.calls)
    assert check(client, app_id, alone, listed, 10.0, now=1010.5) == [] and len(cluster.calls) == n
    s.cancel(app_id)


def test_two_schedulers_looking_at_once_retry_a_stall_once(cluster: FakeCluster) -> None:
    a = KubernetesScheduler("t", client=cluster.client())
    b = KubernetesScheduler("t", client=cluster.client())
    app_id = a.submit(AppDef("st", [role(HANGS_ONCE, max_retries=3, retry_policy=RetryPolicy.ROLE)]), CFG)
    results: dict[str, list[tuple[str, str]]] = {}
    threads = [threading.Thread(target=lambda n=n, s=s: results.__setitem__(n, looks(s, app_id)))
               for n, s in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert results["a"][-1] == ("SUCCEEDED", "") and results["b"][-1] == ("SUCCEEDED", ""), results
    log = "".join(a.log_iter(app_id, "w", 0))
    assert log.count("attempt 1 1 'stalled'") == 1 and "attempt 2" not in log, log  # acted on once
    assert warned(cluster) == ["USR1"]



def test_a_look_does_not_wait_for_another_that_is_stopping_the_app(cluster: FakeCluster) -> None:
    """While one look holds the app's lock and stops it (``finishing``), another answers at once, RUNNING
    "being stopped", and acts on nothing; once the lock is free, looks go on as before."""
    s = KubernetesScheduler("t", client=cluster.client())
    app_id = s.submit(AppDef("st", [role(HANGS_ONCE)]), {"dns": "yes"})
    d = AppDir(store_root(), app_id)
    with locked(d) as held:
        assert held
        d.write("finishing", "")
        desc = s.describe(app_id)
        assert desc is not None and (desc.state, desc.msg) == (AppState.RUNNING, "being stopped (by another look at it)")
        with locked(d, wait=False) as again:
            assert not again
    (d.path / "finishing").unlink()
    s.cancel(app_id)
    final = s.describe(app_id)
    assert final is not None and final.state == AppState.CANCELLED
