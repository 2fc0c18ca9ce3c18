"""``Runner.log_events``: many replicas' logs as one stream of events, whatever the scheduler can do.

The local scheduler follows every replica in one reader (``MultiReplicaLogs``); a scheduler without that gets
one reading thread per replica behind the runner. Both give the same events; the CLI (``tsm log``, an attached
``tsm run``) prints them and fans nothing out itself.
"""

from __future__ import annotations

import threading

import pytest

from schedulers.fake import FakeScheduler
from tsm.errors import NotSupportedError
from tsm.runner.api import Runner, get_runner
from tsm.schedulers.api import MultiReplicaLogs
from tsm.specs.api import AppDef, AppState, Role

LINES = 50


class KeptFake(FakeScheduler):
    """The in-memory fake cluster, kept when a runner closes its scheduler, as a real engine is: every runner
    (each reading thread has its own) then sees the same apps."""

    def close(self) -> None:
        pass


def _app() -> AppDef:
    code = f"import sys\nfor i in range({LINES}): print(sys.argv[1], i, flush=True)"
    return AppDef("many", [Role("a", entrypoint="python", args=["-c", code, "a"], num_replicas=3),
                           Role("b", entrypoint="python", args=["-c", code, "b"], num_replicas=2)])


def _by_replica(events: list[object]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ev in events:
        out.setdefault(f"{ev.role}/{ev.k}", []).append(ev.text)  # type: ignore[attr-defined]
    return out


def _expected() -> dict[str, list[str]]:
    return {f"{role}/{k}": [f"{role} {i}\n" for i in range(LINES)] for role, n in (("a", 3), ("b", 2)) for k in range(n)}


def test_a_scheduler_without_multi_replica_logs_is_read_by_one_thread_per_replica() -> None:
    cluster = KeptFake("t")
    assert not isinstance(cluster, MultiReplicaLogs)
    runner = Runner("t", scheduler_factories={"fake": lambda session, **kw: cluster})
    try:
        handle = runner.run(_app(), "fake")
        assert runner.wait(handle) is not None
        events = list(runner.log_events(handle, idle=lambda: None))
        assert _by_replica(events) == _expected()  # every line of every replica, each replica's in order
        followed = list(runner.log_events(handle, [("b", 1)], should_tail=True))
        assert _by_replica(followed) == {"b/1": _expected()["b/1"]}
        with pytest.raises(NotSupportedError, match="does not keep a replica's attempts apart"):
            list(runner.log_events(handle, attempt=0))
    finally:
        FakeScheduler.close(cluster)
        runner.close()


def test_the_local_scheduler_gives_the_same_events_from_one_reader() -> None:
    with get_runner() as runner:
        handle = runner.run(_app(), "local")
        status = runner.wait(handle)
        assert status is not None and status.state == AppState.SUCCEEDED
        events = [ev for ev in runner.log_events(handle) if not ev.marker]
        assert _by_replica(events) == _expected()


def test_events_are_read_on_another_thread_with_the_runner_busy_on_this_one() -> None:
    """The iterator reads through runners of its own: an attached ``tsm run`` follows the logs on one thread
    while it waits for the app on another."""
    with get_runner() as runner:
        handle = runner.run(_app(), "local")
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.extend(runner.log_events(handle, should_tail=True)))
        reader.start()
        assert runner.wait(handle) is not None
        reader.join(timeout=120)
        assert not reader.is_alive()
        assert _by_replica([ev for ev in got if not ev.marker]) == _expected()  # type: ignore[attr-defined]
