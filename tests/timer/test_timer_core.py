"""The shared timer table (heap + lazy deletion + batching + compaction) against a plain-dict model."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings, strategies as st

from tsm.timer._core import Core
from tsm.timer._proc import Guard, Reaper, read_stat
from tsm.timer.api import TimerRequest

# Pids above the kernel's largest possible pid (2**22): never a real process, so reaping them is a no-op.
PIDS = [2**22 + 1 + i for i in range(3)]
SCOPES = ["a", "b", "c"]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("arm"), st.sampled_from(PIDS), st.sampled_from(SCOPES), st.integers(1, 50)),
        st.tuples(st.just("release"), st.sampled_from(PIDS), st.sampled_from(SCOPES), st.just(0)),
        st.tuples(st.just("flush"), st.just(0), st.just(""), st.just(0)),
        st.tuples(st.just("fire"), st.just(0), st.just(""), st.integers(0, 50)),
    ),
    max_size=80,
)


def test_fake_pids_do_not_exist() -> None:
    assert all(read_stat(p) is None for p in PIDS)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_table_matches_model(operations: list[tuple[str, int, str, int]]) -> None:
    core = Core(Reaper(), Guard())
    model: dict[tuple[int, str], float] = {}
    with core.lock:
        for op, pid, scope, t in operations:
            if op == "arm":
                core.arm_locked(pid, scope, float(t), 0)
                model[(pid, scope)] = float(t)
            elif op == "release":
                core.timers.pop((pid, scope), None)
                model.pop((pid, scope), None)
            elif op == "flush":
                core.flush_locked()
            else:
                core.flush_locked()
                core.fire_locked(float(t))
                doomed = {p for (p, _s), exp in model.items() if exp <= t}
                model = {k: v for k, v in model.items() if k[0] not in doomed}
            expired = core.expired_locked(float("inf"), lambda p, s, tm: TimerRequest(p, s, tm[0]))
            assert {(p, r.scope_id): r.expiration_time for p, rs in expired.items() for r in rs} == model
        core.flush_locked()
        assert core.next_deadline_locked() == (min(model.values()) if model else None)
    # gone pids were skipped, never signalled
    assert core.stats["reaped"] == 0


def test_heap_is_compacted_when_mostly_stale() -> None:
    core = Core(Reaper(), Guard())
    with core.lock:
        for i in range(5000):
            core.arm_locked(PIDS[0], "s", 1e12 + i, 0)
            core.flush_locked()  # one acquire per batch: each lands on the heap
            core.timers.pop((PIDS[0], "s"))
        assert len(core.heap) <= 1024 + 2
        assert core.next_deadline_locked() is None


def test_acquire_released_in_the_same_batch_never_touches_the_heap() -> None:
    core = Core(Reaper(), Guard())
    with core.lock:
        for _ in range(100):
            core.arm_locked(PIDS[0], "s", 1e12, 0)
            core.timers.pop((PIDS[0], "s"))
        core.flush_locked()
        assert core.heap == []


def test_guard_trusts_a_cached_start_time_only_briefly() -> None:
    """A pid reused by a new process must not keep its predecessor's start time (it would never be reaped)."""
    import os
    import time

    from tsm.timer._proc import CACHE_TTL, process_start_time

    guard = Guard()
    pid = os.getppid() if os.getppid() > 1 else os.getpid()
    real = process_start_time(pid)
    assert real is not None and guard.start_of(pid) == real
    guard._cache[pid] = (real - 1, time.monotonic())  # what a predecessor with the same pid left
    assert guard.start_of(pid) == real - 1  # within the lifetime: no /proc read
    guard._cache[pid] = (real - 1, time.monotonic() - CACHE_TTL - 0.1)
    assert guard.start_of(pid) == real  # read again: the new process's own start time
    assert guard.start_of("worker-a") is None and guard.start_of(-3) is None  # not pids: nothing to record
    assert guard.reapable(1) and guard.reapable(os.getpid()) and guard.reapable("worker-a")


OUT_OF_DESCRIPTORS = """
import os, subprocess, time
from tsm.timer._core import Core
from tsm.timer._proc import Guard, Reaper, process_start_time
child = subprocess.Popen(["sleep", "60"])
core = Core(Reaper(), Guard())
with core.lock:
    core.arm_locked(child.pid, "s", time.time() - 1, process_start_time(child.pid))
    core.flush_locked()
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
with core.lock:
    core.fire_locked(time.time())  # /proc cannot be read: the worker can be neither verified nor written off
alive = child.poll() is None
for fd in fds:
    os.close(fd)
time.sleep(0.2)
with core.lock:
    core.fire_locked(time.time())  # the retry
child.wait(10)
print(alive, child.returncode, core.stats["skipped"], core.stats["reaped"])
"""


def test_reaper_retries_when_proc_cannot_be_read() -> None:
    """Out of descriptors, the reaper cannot check the pid: it neither signals blindly nor writes the worker
    off as gone; it tries again and reaps once it can look."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import tsm.timer

    env = dict(os.environ, PYTHONPATH=str(Path(tsm.timer.__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", OUT_OF_DESCRIPTORS], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "-9", "0", "1"], out.stderr[-2000:]


def test_a_flush_returns_only_once_a_flush_under_way_delivered_what_it_took() -> None:
    """The server thread flushes the reap callbacks outside its lock; an owner that saw the worker die flushes
    too, to learn at once whether a timer killed it. When the server thread had taken the callback but not yet
    delivered it, the owner's flush found nothing and returned: the supervisor then called a replica its timer
    had reaped "killed by SIGKILL" instead of "expired timer later". Now the second flush waits for the first."""
    seen: list[tuple[int, str]] = []
    taken = threading.Event()

    def on_reap(pid: int, scope_id: str) -> None:
        taken.set()
        time.sleep(0.3)  # the server thread, preempted between taking the callback and delivering it
        seen.append((pid, scope_id))

    reaper = Reaper(on_reap=on_reap)
    reaper._done(4242, "later")  # what a reap queues
    server = threading.Thread(target=reaper.flush_callbacks)
    server.start()
    assert taken.wait(10)
    reaper.flush_callbacks()  # the owner's: the reap it asks about is delivered when it returns
    assert seen == [(4242, "later")]
    server.join()
