"""StatusWatcher: single flight, snapshot reuse, lookups batched and rate-limited, terminal states cached."""

from __future__ import annotations

import threading
import time

from tsm.schedulers.common.watcher import StatusWatcher


class Backend:
    """A backend whose snapshot and lookup count their calls; statuses are plain strings."""

    def __init__(self, delay: float = 0.0) -> None:
        self.queue: dict[str, str] = {}
        self.history: dict[str, str] = {}
        self.snapshots = 0
        self.lookups: list[list[str]] = []
        self.delay = delay

    def snapshot(self) -> dict[str, str]:
        self.snapshots += 1
        time.sleep(self.delay)
        return dict(self.queue)

    def lookup(self, ids: list[str]) -> dict[str, str]:
        self.lookups.append(sorted(ids))
        return {i: self.history[i] for i in ids if i in self.history}


def watcher(b: Backend) -> StatusWatcher[str]:
    return StatusWatcher(b.snapshot, b.lookup, is_terminal=lambda s: s == "done")


def test_threads_share_one_snapshot() -> None:
    b = Backend(delay=0.05)
    b.queue = {"1": "running", "2": "pending"}
    w = watcher(b)
    got: list[str | None] = []
    threads = [
        threading.Thread(target=lambda i=i: got.append(w.get(str(1 + i % 2), max_age=30))) for i in range(50)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(set(map(str, got))) == ["pending", "running"]
    assert b.snapshots == 1 and b.lookups == []


def test_old_snapshot_is_refreshed_and_invalidate_forces_one() -> None:
    b = Backend()
    b.queue = {"1": "running"}
    w = watcher(b)
    assert w.get("1", max_age=30) == "running"
    b.queue = {"1": "stopping"}
    assert w.get("1", max_age=30) == "running"  # young enough
    w.invalidate()
    assert w.get("1", max_age=30) == "stopping"
    assert w.get("1", max_age=0) == "stopping" and b.snapshots == 3


def test_a_just_submitted_app_forces_a_new_snapshot() -> None:
    b = Backend()
    w = watcher(b)
    assert w.all(max_age=30) == {}
    b.queue = {"7": "pending"}
    w.submitted("7")
    assert w.get("7", max_age=30) == "pending"


def test_missing_apps_are_looked_up_together_and_terminal_ones_cached_for_good() -> None:
    b = Backend()
    b.history = {"1": "done", "2": "running"}
    w = watcher(b)
    assert w.get("2", max_age=30) == "running"
    assert w.get("1", max_age=30) == "done"
    assert b.lookups == [["2"], ["1"]]  # "2" was looked up less than max_age ago
    assert w.get("3", max_age=0) is None
    assert b.lookups[-1] == ["2", "3"]  # one call for every id still wanted ("1" ended: never again)
    b.history["1"] = "changed"
    w.invalidate()
    assert w.get("1", max_age=0) == "done"  # terminal: never asked again
    assert ["1"] not in b.lookups[2:]


def test_unknown_app_is_none_and_not_asked_again_within_the_interval() -> None:
    b = Backend()
    w = watcher(b)
    assert w.get("404", max_age=30) is None
    assert w.get("404", max_age=30) is None
    assert b.lookups == [["404"]]


def test_without_a_lookup_only_the_snapshot_answers() -> None:
    b = Backend()
    w: StatusWatcher[str] = StatusWatcher(b.snapshot, is_terminal=lambda s: False)
    assert w.get("x") is None
