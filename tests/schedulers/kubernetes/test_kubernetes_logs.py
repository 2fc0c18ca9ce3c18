"""Kubernetes' kept logs on the fake cluster (``fake_kube.py``): no window in which a finished pod's log is
neither readable from the API nor kept (issue 24: a short sweep trial once read back an empty log).

Two processes finish one app at once in a sweep (its controller and the launcher's ``wait``); each is played
here by its own :class:`KubernetesScheduler` on one ``$TSM_HOME``. The interleaving that lost the log is made
exact, not timed: the second one's log read first lets the other finish the app (keep the log, delete the
pod), then goes on against a pod that is gone. Two looks no longer interleave (each holds the app's lock,
:func:`tsm.schedulers.common.container_lock.locked`), so the other finishes it as a reader does not lock: a
``cleanup`` (a cron's), or a log read while the look finishes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from schedulers.kubernetes.fake_kube import FakeCluster
from tsm.schedulers.common.container_lock import locked
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.schedulers.kubernetes.status import from_json, group
from tsm.specs.api import AppDef, AppState, Role

HANG = 30.0
CFG = {"dns": "yes"}


def until(pred: Callable[[], bool]) -> None:
    end = time.monotonic() + HANG
    while not pred():
        assert time.monotonic() < end, "the fake cluster did not get there"
        time.sleep(0.02)


class FirstLogReadRuns:
    """The fake's API, except that the first log read runs ``before`` first (the other process's turn)."""

    def __init__(self, api: Any, before: Callable[[], None]) -> None:
        self._api, self._before = api, before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def read_namespaced_pod_log(self, *a: Any, **kw: Any) -> Any:
        before, self._before = self._before, lambda: None
        before()
        return self._api.read_namespaced_pod_log(*a, **kw)


def ended_app(cluster: FakeCluster) -> tuple[KubernetesScheduler, str]:
    """An app whose one pod printed a line and ended, not yet looked at (so nothing is kept or deleted)."""
    a = KubernetesScheduler("t", client=cluster.client())
    app_id = a.submit(AppDef("t", [Role("r", image="fake/python", entrypoint=sys.executable,
                                        args=["-c", "print('hello from the trial')"])]), CFG)
    until(lambda: bool(cluster.pods) and all(p.phase == "Succeeded" for p in cluster.pods.values()))
    return a, app_id


def other_process(cluster: FakeCluster, a: KubernetesScheduler, app_id: str,
                  look: bool = True) -> KubernetesScheduler:
    """A second scheduler whose first log read lets ``a`` finish the app and its pod be gone: by a look
    (``look``), else by a finish that takes no lock (the second one's look holds it): what an older tsm's
    ``cleanup`` did, and what any process finishing the app without the lock would do."""

    def a_finishes() -> None:
        if look:
            assert a.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]
        else:
            view = group([from_json(p) for p in a.client.list_pods()])[app_id]
            req = a.request(app_id)
            assert req is not None
            a._finish(req, a._describe_view(view), view.pods)
        until(lambda: not cluster.pods)

    client = cluster.client()
    client.core = FirstLogReadRuns(cluster.core, a_finishes)
    return KubernetesScheduler("t", client=client)


def test_a_log_kept_before_the_delete_is_not_replaced_by_a_late_empty_read(cluster: FakeCluster) -> None:
    a, app_id = ended_app(cluster)
    b = other_process(cluster, a, app_id, look=False)
    assert b.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert "".join(a.log_iter(app_id, "r", 0)) == "hello from the trial\n"


def test_a_reader_whose_pod_is_deleted_under_it_reads_the_kept_log(cluster: FakeCluster) -> None:
    a, app_id = ended_app(cluster)
    b = other_process(cluster, a, app_id)
    assert "".join(b.log_iter(app_id, "r", 0)) == "hello from the trial\n"


def test_a_log_that_reads_back_empty_just_after_the_exit_is_read_again(cluster: FakeCluster) -> None:
    cluster.log_lag = 2  # the stamped and the plain read
    a, app_id = ended_app(cluster)
    assert a.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert not cluster.pods or all(p.deleted for p in cluster.pods.values())
    assert "".join(a.log_iter(app_id, "r", 0)) == "hello from the trial\n"


def test_cleanup_finishes_an_app_under_its_lock_and_never_twice(cluster: FakeCluster) -> None:
    # a look holds the app's lock while it finishes the app; a cleanup beside it waits for the lock, then finds
    # the app finished and only deletes what is left: the kept log and the final status are the look's
    a, app_id = ended_app(cluster)
    d = a.app_dir(app_id)
    done: list[list[str]] = []
    with locked(d) as held:
        assert held
        cleaner = threading.Thread(target=lambda: done.append(KubernetesScheduler("t", client=cluster.client())
                                                              .cleanup()))
        cleaner.start()
        time.sleep(0.3)
        assert cleaner.is_alive() and not done  # waiting for the lock, nothing finished beside the look
        view = group([from_json(p) for p in a.client.list_pods()])[app_id]
        req = a.request(app_id)
        assert req is not None
        a._finish(req, a._describe_view(view), view.pods)  # what the look does under the lock
        final = (d.path / "final.json").read_bytes()
    cleaner.join(timeout=30)
    assert done == [[app_id]]
    assert (d.path / "final.json").read_bytes() == final
    assert "".join(a.log_iter(app_id, "r", 0)) == "hello from the trial\n"


#: what the kubelet answered (status 200) on the real cluster for a pod whose log file was already gone
GONE_FILE = (b'failed to try resolving symlinks in path "/var/log/pods/default_st-9ed3a64e-w-0-glm7w_debd607c/main/0.log": '
             b"lstat /var/log/pods/default_st-9ed3a64e-w-0-glm7w_debd607c/main/0.log: no such file or directory")


def test_the_kubelets_text_for_a_gone_log_file_is_no_log(tmp_path: Any) -> None:
    from tsm.schedulers.kubernetes.logs import _kubelet_error_only, _without_runtime_error

    for text in (GONE_FILE, b'failed to open log file "/var/log/pods/x/main/0.log": open /var/log/pods/x/main/0.log: '
                            b"no such file or directory"):
        f = tmp_path / "part"
        f.write_bytes(text + b"\n")
        assert _kubelet_error_only(f), text
        assert b"".join(_without_runtime_error(iter([b"working\n", text + b"\n"]), lambda: True)) == b"working\n"
    f.write_bytes(b"failed to try resolving my own symlinks\n")  # a replica's own line stays a line
    assert not _kubelet_error_only(f)
