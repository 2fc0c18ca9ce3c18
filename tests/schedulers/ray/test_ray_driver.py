"""The Ray driver's bookkeeping of stalls and retries (issue 25), without a Ray cluster: a fake of Ray's
``get``/``kill`` and of the replicas' actor handles answers at once, so what the driver records and which
attempts it starts (with which ``TSM_LAST_EXIT``) is asserted directly. Placement, lost nodes and the
replicas' processes run on the real head in ``tests/integration/test_ray_long_runs.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tsm.schedulers.common.stall import stall_message, tick
from tsm.schedulers.ray import driver as drv
from tsm.schedulers.ray.request import RayOptions, build_request
from tsm.specs.api import AppDef, RetryPolicy, Role

K0, K1 = ("w", 0), ("w", 1)


class FakeRef:
    def __init__(self, value: Any) -> None:
        self.value = value


class FakeActor:
    """A fake of a :class:`~tsm.schedulers.ray.driver.Replica` handle: records each call, answers at once."""

    ANSWERS: dict[str, Any] = {"start": 4242, "signal": True, "running": True, "stop": None, "wait": None,
                               "progress": (10, 5, "step 7")}

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        calls = self.calls

        class Method:
            @staticmethod
            def remote(*args: Any) -> FakeRef:
                calls.append((name, args))
                return FakeRef(FakeActor.ANSWERS[name])

        return Method

    def starts(self) -> list[dict[str, str]]:
        """The env of each attempt started on this actor."""
        return [args[1] for name, args in self.calls if name == "start"]


class FakeRay:
    def __init__(self) -> None:
        #: what each ``get`` was given (a ref, or a list of refs)
        self.gets: list[Any] = []

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        self.gets.append(ref)
        return [r.value for r in ref] if isinstance(ref, list) else ref.value

    def kill(self, actor: Any) -> None:
        pass


def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, policy: RetryPolicy, max_retries: int,
            **cfg: Any) -> tuple[drv.Driver, dict[Any, tuple[str, int]]]:
    """A driver whose two replicas' first attempts run (on fake actors); its waits."""
    monkeypatch.setattr(drv, "ray", FakeRay())
    monkeypatch.setattr(drv, "logs_dir", lambda: str(tmp_path))
    role = Role("w", image="", entrypoint=sys.executable, args=["-c", "pass"], num_replicas=2,
                max_retries=max_retries, retry_policy=policy)
    payload = build_request(AppDef("a", [role]), RayOptions.from_cfg({"stall_timeout": "3s", **cfg}), "s",
                            "http://h:8265", 0.0).payload
    d = drv.Driver(payload)
    d.specs = {(r.role, r.replica_id): r for r in payload.replicas}
    d.actors = {k: FakeActor() for k in d.specs}
    waits = d._start_all(list(d.specs))  # as the driver's run starts them
    return d, waits


def end(d: drv.Driver, waits: dict[Any, tuple[str, int]], key: tuple[str, int], code: int) -> bool:
    """``key``'s attempt ends with ``code``, as the driver's loop hands it over."""
    waits.pop(next(ref for ref, k in waits.items() if k == key))
    return d._ended(key, code, waits)


def test_a_stalled_replica_that_exits_0_is_retried_as_stalled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # its handler checkpointed on the warning and exited 0: it did not finish, it stalled
    d, waits = started(monkeypatch, tmp_path, RetryPolicy.REPLICA, 1, on_stall="restart")
    d._stalled(K0, "step 7", 3.0)
    assert end(d, waits, K0, 0)
    rep = d.reps[K0]
    assert (rep["state"], rep["attempt"], rep["failures"], rep["restarts"]) == ("RUNNING", 1, 1, 1)
    assert d.actors[K0].starts()[-1]["TSM_LAST_EXIT"] == "stalled"  # type: ignore[attr-defined]
    assert d.reps[K1]["attempt"] == 0 and d.num_restarts == 1
    # a second stall spends the last retry: the app fails saying it stalled, whatever the code
    d._stalled(K0, "step 8", 3.0)
    assert not end(d, waits, K0, 0)
    assert (d.state, d.msg) == ("FAILED", "role 'w' replica 0 stalled for 3s, last line: 'step 8'")
    assert d.reps[K0]["state"] == "FAILED" and d.reps[K1]["state"] == "CANCELLED"


def test_a_stalled_replica_that_exits_0_fails_the_app_with_on_stall_fail(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    d, waits = started(monkeypatch, tmp_path, RetryPolicy.REPLICA, 3, on_stall="fail")
    d._stalled(K0, "", 3.0)
    assert not end(d, waits, K0, 0)
    assert (d.state, d.msg) == ("FAILED", "role 'w' replica 0 stalled for 3s, no output at all")
    assert (d.reps[K0]["state"], d.reps[K0]["msg"]) == ("FAILED", "stalled for 3s, no output at all")
    assert d.reps[K0]["attempt"] == 0 and not waits


def test_an_unstalled_exit_0_still_succeeds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    d, waits = started(monkeypatch, tmp_path, RetryPolicy.REPLICA, 1, on_stall="restart")
    assert end(d, waits, K0, 0)
    assert d.reps[K0]["state"] == "SUCCEEDED" and d.num_restarts == 0


def test_a_restart_by_a_peer_clears_the_stall_records(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # replica 1 is stalled and warned (to be stopped in 60 s) when replica 0 fails: the ROLE retry restarts
    # both; replica 1's new attempt must be stall-checked again, and not be stopped as stalled
    d, waits = started(monkeypatch, tmp_path, RetryPolicy.ROLE, 1, on_stall="restart", warn_signal="USR1",
                       warn_before="60s")
    d.progress[K1] = (3, 4)
    d._stalled(K1, "step 3", 3.0)
    assert K1 in d.stalled and K1 in d.stall_stop_at
    assert end(d, waits, K0, 1)
    assert d.reps[K1]["attempt"] == 1 and d.actors[K1].starts()[-1]["TSM_LAST_EXIT"] == "failed:1"  # type: ignore[attr-defined]
    assert K1 not in d.stalled and K1 not in d.stall_stop_at and K1 not in d.progress
    d.next_stall_check = 0.0
    d._check_stalls()  # both new attempts are looked at
    assert d.progress == {K0: (10, 5), K1: (10, 5)}
    assert [c for c in d.actors[K1].calls if c[0] == "stop"] == [("stop", (d.p.grace_period,))]  # only the retry's


def test_start_clears_the_stall_records(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # what a lost node's or a requeued time limit's restart does: _start, without the replica's own end
    d, _ = started(monkeypatch, tmp_path, RetryPolicy.REPLICA, 0, on_stall="restart", warn_signal="USR1",
                   warn_before="60s")
    d.progress[K0] = (1, 1)
    d._stalled(K0, "x", 3.0)
    d._start(K0)
    assert (d.stalled, d.stall_stop_at, d.progress) == ({}, {}, {})


def test_the_stall_uses_the_shared_tick_and_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    d, _ = started(monkeypatch, tmp_path, RetryPolicy.REPLICA, 0, on_stall="restart")
    long_line = "y" * 500
    d._stalled(K0, long_line, 900.0)
    assert d.reps[K0]["msg"] == d.stalled[K0] == stall_message(900.0, long_line)
    assert d._tick() == min(1.0, tick(3.0))


def test_the_app_is_recorded_running_with_every_replica_started(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """What ``describe`` reads once the gang is placed: the app RUNNING, each replica RUNNING with its pid
    (the app stays PENDING while it is being placed)."""
    fake = FakeRay()
    monkeypatch.setattr(drv, "ray", fake)
    monkeypatch.setattr(drv, "logs_dir", lambda: str(tmp_path))
    role = Role("w", image="", entrypoint=sys.executable, args=["-c", "pass"], num_replicas=3)
    payload = build_request(AppDef("a", [role]), RayOptions.from_cfg({}), "s", "http://h:8265", 0.0).payload
    d = drv.Driver(payload)
    records: list[dict[str, Any]] = []

    def place(keys: list[tuple[str, int]]) -> bool:
        records.append(json.loads(d.status_path.read_text()))
        d.actors = {k: FakeActor() for k in keys}
        return True

    def wait(refs: list[Any], num_returns: int, timeout: float) -> tuple[list[Any], list[Any]]:
        records.append(json.loads(d.status_path.read_text()))
        d.stopping = True  # end the loop here: the record the scheduler reads while the replicas run is taken
        return [], refs

    monkeypatch.setattr(d, "_place", place)
    fake.wait = wait  # type: ignore[attr-defined]
    assert d.run() == 0
    placing, running = records
    assert placing["state"] == "PENDING" and {r["state"] for r in placing["roles"][0][1]} == {"PENDING"}
    assert running["state"] == "RUNNING"
    assert [(r["state"], r["pid"], r["attempt"]) for r in running["roles"][0][1]] == [("RUNNING", 4242, 0)] * 3


def test_the_replicas_start_together(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every replica's start call goes out before the driver waits, and it waits once for all of them (one
    round trip for the app, not one per replica); a retried scope starts the same way."""
    d, waits = started(monkeypatch, tmp_path, RetryPolicy.ROLE, 1)
    gets = drv.ray.gets
    assert len(gets) == 1 and isinstance(gets[0], list) and len(gets[0]) == 2
    assert sorted(waits.values()) == [K0, K1]
    assert end(d, waits, K0, 1)  # the ROLE retry: replica 1 stopped (one get), then both started (one get)
    starts = [g for g in gets[1:] if isinstance(g, list)]
    assert len(starts) == 1 and len(starts[0]) == 2
    assert [d.reps[k]["attempt"] for k in (K0, K1)] == [1, 1] and sorted(waits.values()) == [K0, K1]


def test_session_cpu_is_the_local_supervisors_measure() -> None:
    """Same ticks as the local backend's ``cpu_by_session`` for a replica that did its work in a child it
    reaped (the child's time counted, through its parent's ``cutime``) and then in itself."""
    from tsm.schedulers.local._os import cpu_by_session

    code = ("import subprocess, sys, time\n"
            "burn = 'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass'\n"
            "subprocess.run([sys.executable, '-c', burn], check=True)\n"
            "print('done', flush=True)\n"
            "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"done\n"
        ray_ticks = drv.session_cpu(proc.pid)
        assert ray_ticks == cpu_by_session()[proc.pid]
        assert ray_ticks >= 0.3 * os.sysconf("SC_CLK_TCK") - 1  # the reaped child's CPU is in it
    finally:
        proc.kill()
        proc.wait()


def test_a_replica_not_handling_the_warning_yet_is_warned_again_until_it_does(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    # K0 is a launcher (bash) whose program has not set its handler when the warning comes: none of its
    # processes handles it, so it is tried again, and once it is handled never again; K1 is warned once
    d, _ = started(monkeypatch, tmp_path, RetryPolicy.APPLICATION, 0, warn_signal="USR1")
    answers, sent = iter([False, True]), []

    class Late:
        class signal:  # noqa: N801 (an actor method's name)
            @staticmethod
            def remote(sig: str) -> FakeRef:
                sent.append(sig)
                return FakeRef(next(answers))

    d.actors[K0] = Late()
    assert d.warn() == 1  # K1 only
    assert d.warn() == 1  # K0, now handled
    assert d.warn() == 0
    assert sent == [d.p.warn_signal] * 2
    assert [c for c in d.actors[K1].calls if c[0] == "signal"] == [("signal", (d.p.warn_signal,))]  # type: ignore[attr-defined]
