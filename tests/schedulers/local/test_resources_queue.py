"""The local resource queue (``-c queue=true``) against real supervisors, with a fake inventory.

The machine's GPUs, CPUs and memory are replaced by ``TSM_FAKE_GPUS``/``TSM_FAKE_CPUS``/``TSM_FAKE_MEM_MB``
(the test names say "fake"); each replica prints the CUDA_VISIBLE_DEVICES it got and then sleeps, so which
GPU it holds is read from its own output and whether an app waits is read from its recorded state.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testutil import wait_until
from tsm.errors import InvalidAppError
from tsm.schedulers.api import Stream
from tsm.schedulers.local import resources
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState, Resource, Role
from tsm.sweep import run_sweep, sweep_wait

HANG_GUARD = 120.0


def holder(name: str, cpu: int = 0, gpu: int = 0, mem: int = 0, replicas: int = 1) -> AppDef:
    """An app whose replicas print their GPUs, then hold their resources until cancelled."""
    role = Role("r", entrypoint="sh", args=["-c", 'echo "gpu=${CUDA_VISIBLE_DEVICES:-none}"; exec sleep 600'],
                num_replicas=replicas, resource=Resource(cpu=cpu, gpu=gpu, memMB=mem))
    return AppDef(name, [role])


def state(sched: LocalScheduler, app_id: str) -> AppState:
    desc = sched.describe(app_id)
    assert desc is not None
    return desc.state


def printed(sched: LocalScheduler, app_id: str, k: int = 0) -> str | None:
    """The GPU line replica ``k`` printed, None before it printed."""
    for line in sched.log_iter(app_id, "r", k, streams=Stream.STDOUT):
        if line.startswith("gpu="):
            return line.strip().removeprefix("gpu=")
    return None


@pytest.fixture
def fake_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_FAKE_GPUS", "8")
    monkeypatch.setenv("TSM_FAKE_CPUS", "64")
    monkeypatch.setenv("TSM_FAKE_MEM_MB", "65536")


def test_fake_gpus_eight_apps_get_disjoint_devices_and_the_ninth_is_pending(
        sched: LocalScheduler, fake_machine: None) -> None:
    ids = [sched.submit(holder(f"g{i}", gpu=1), {"queue": True}) for i in range(9)]
    try:
        def eight_printed() -> bool:
            return sum(printed(sched, a) is not None for a in ids) == 8
        wait_until(eight_printed, "eight apps to print their GPU", HANG_GUARD)
        states = {a: state(sched, a) for a in ids}
        running = [a for a in ids if states[a] == AppState.RUNNING]
        pending = [a for a in ids if states[a] == AppState.PENDING]
        assert len(running) == 8 and len(pending) == 1, states
        gpus = {a: printed(sched, a) for a in running}
        assert sorted(gpus.values()) == [str(i) for i in range(8)]  # one each, all distinct
        waiting = pending[0]
        assert printed(sched, waiting) is None  # it started nothing
        held = resources.holders(os.path.join(os.environ["TSM_HOME"], "local"))
        assert sorted(held) == sorted(running)

        freed = running[0]
        sched.cancel(freed)
        wait_until(lambda: printed(sched, waiting) is not None, "the ninth app to start", HANG_GUARD)
        assert state(sched, waiting) == AppState.RUNNING
        assert printed(sched, waiting) == gpus[freed]  # the GPU that was given back
        assert state(sched, freed) == AppState.CANCELLED
    finally:
        for a in ids:
            sched.cancel(a)
    held = resources.holders(os.path.join(os.environ["TSM_HOME"], "local"))
    assert held == {}  # every app gave its GPUs back


def test_fake_cpus_and_memory_admit_what_fits(sched: LocalScheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_FAKE_GPUS", "0")
    monkeypatch.setenv("TSM_FAKE_CPUS", "4")
    monkeypatch.setenv("TSM_FAKE_MEM_MB", "1000")
    big = sched.submit(holder("cpu3", cpu=3, mem=100), {"queue": True})  # 3 of 4 CPUs
    wait_until(lambda: printed(sched, big) is not None, "the first app to start", HANG_GUARD)
    cpu_wait = sched.submit(holder("cpu2", cpu=2, mem=100), {"queue": True})  # 2 more CPUs: waits
    mem_wait = sched.submit(holder("mem", cpu=1, mem=901), {"queue": True})  # 1 CPU fits, 901 MB does not
    fits = sched.submit(holder("fits", cpu=1, mem=100, replicas=1), {"queue": True})  # the last CPU
    try:
        wait_until(lambda: printed(sched, fits) is not None, "the app that fits to start", HANG_GUARD)
        wait_until(lambda: state(sched, cpu_wait) == AppState.PENDING and state(sched, mem_wait) == AppState.PENDING,
                   "the two that do not fit to be PENDING", HANG_GUARD)
        assert printed(sched, cpu_wait) is None and printed(sched, mem_wait) is None
        assert printed(sched, fits) == "none"  # no GPU role: no CUDA_VISIBLE_DEVICES from the queue

        sched.cancel(big)  # 3 CPUs back: cpu2 (2 CPUs) fits; mem (1 CPU, 901 MB) fits by CPU but not memory
        wait_until(lambda: printed(sched, cpu_wait) is not None, "the CPU-bound app to start", HANG_GUARD)
        assert state(sched, mem_wait) == AppState.PENDING
        sched.cancel(fits)
        sched.cancel(cpu_wait)  # memory back (and CPUs): mem starts
        wait_until(lambda: printed(sched, mem_wait) is not None, "the memory-bound app to start", HANG_GUARD)
    finally:
        for a in (big, cpu_wait, mem_wait, fits):
            sched.cancel(a)


def test_cancel_while_pending_ends_the_app_and_starts_nothing(sched: LocalScheduler, fake_machine: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_FAKE_GPUS", "1")
    first = sched.submit(holder("first", gpu=1), {"queue": True})
    wait_until(lambda: printed(sched, first) is not None, "the first app to start", HANG_GUARD)
    second = sched.submit(holder("second", gpu=1), {"queue": True})
    try:
        wait_until(lambda: state(sched, second) == AppState.PENDING, "the second app to be PENDING", HANG_GUARD)
        sched.cancel(second)
        desc = sched.wait(second, timeout=HANG_GUARD)
        assert desc is not None and desc.state == AppState.CANCELLED
        assert all(r.state == AppState.CANCELLED and r.pid is None for rs in desc.roles_statuses for r in rs.replicas)
        wait_dir = Path(os.environ["TSM_HOME"]) / "local" / resources.WAIT_DIR
        assert not (wait_dir / second).exists()  # its FIFO is gone
    finally:
        sched.cancel(first)
        sched.cancel(second)


def test_queue_refuses_an_app_bigger_than_the_fake_machine(sched: LocalScheduler, fake_machine: None) -> None:
    with pytest.raises(InvalidAppError, match="gpus 9 > 8"):
        sched.submit_dryrun(holder("huge", gpu=1, replicas=9), {"queue": True})  # type: ignore[arg-type]
    info = sched.submit_dryrun(holder("ok", gpu=2, replicas=2), {"queue": True})  # type: ignore[arg-type]
    assert "# queue: PENDING until 0 CPU(s), 0 MB and 4 GPU(s) are free" in str(info)
    assert all("CUDA_VISIBLE_DEVICES" not in rep.env for role in info.request.roles for rep in role.replicas)


def test_a_dead_holder_is_reclaimed(tmp_path: Path) -> None:
    home = str(tmp_path)
    inv = {"cpu": 2, "memMB": 100, "gpus": ["0"]}
    need = {"cpu": 1, "memMB": 10, "gpus": [["r", 0, 1]]}
    # a holder pid that is not alive (above the largest pid Linux gives): its GPU is free for the next app
    assert resources.reserve(home, "dead", need, inv, 2**22 + 1, 1) == {"r/0": ["0"]}
    me = os.getpid()
    from tsm.schedulers.local import _os

    assert resources.reserve(home, "live", need, inv, me, _os.start_time(me)) == {"r/0": ["0"]}
    assert resources.reserve(home, "other", need, inv, me, _os.start_time(me)) is None  # GPU 0 is held
    assert (os.stat(os.path.join(home, resources.TABLE)).st_mode & 0o777) == 0o600
    waiter = resources.Waiter(home, "other")
    try:
        resources.release(home, "live")
        assert os.read(waiter.fd, 16) == b"x"  # released: the waiter was woken
    finally:
        waiter.close()


GPU_COMPONENT = '''
import sys
from tsm import AppDef, Resource, Role


def probe(n: int = 0, out: str = "") -> AppDef:
    code = f"import os; open({out!r} + '/' + str({n}), 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', 'none'))"
    return AppDef(name="probe", roles=[Role(name="r", entrypoint=sys.executable, args=["-c", code],
                                            resource=Resource(cpu=0, gpu=1, memMB=0))])
'''


def test_sweep_trials_queue_by_default_on_fake_gpus(tmp_path: Path, fake_machine: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from tsm.runner import get_runner

    monkeypatch.setenv("TSM_FAKE_GPUS", "2")
    (tmp_path / "probe.py").write_text(GPU_COMPONENT)
    out = tmp_path / "out"
    out.mkdir()
    with get_runner() as runner:
        handle = run_sweep(runner, f"{tmp_path / 'probe.py'}:probe", {"n": "0,1,2,3"}, scheduler="local", parallel=3,
                                  args=["--out", str(out)])
        status = sweep_wait(handle, timeout=HANG_GUARD)
        assert status.state == "SUCCEEDED", status.summary()
    seen = {p.name: p.read_text() for p in out.iterdir()}
    assert sorted(seen) == ["0", "1", "2", "3"]
    assert set(seen.values()) <= {"0", "1"}  # each trial got one of the two fake GPUs from the queue


def test_a_killed_supervisor_gives_its_fake_gpu_to_the_waiting_app(sched: LocalScheduler, fake_machine: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    monkeypatch.setenv("TSM_FAKE_GPUS", "1")
    first = sched.submit(holder("first", gpu=1), {"queue": True})
    wait_until(lambda: printed(sched, first) is not None, "the first app to start", HANG_GUARD)
    second = sched.submit(holder("second", gpu=1), {"queue": True})
    try:
        wait_until(lambda: state(sched, second) == AppState.PENDING, "the second app to be PENDING", HANG_GUARD)
        os.kill(sched.app_row(first)["sup_pid"], signal.SIGKILL)  # its watchdog releases the GPU
        wait_until(lambda: printed(sched, second) is not None, "the second app to start", HANG_GUARD)
        assert printed(sched, second) == "0"
        assert state(sched, first) == AppState.FAILED
    finally:
        sched.cancel(first)
        sched.cancel(second)


def test_odd_requests_are_counted_safely() -> None:
    roles = [{"name": "a", "num_replicas": 2, "resource": {"cpu": 0.5, "gpu": 1.5, "memMB": -1}},
             {"name": "b", "num_replicas": 1, "resource": {"cpu": float("nan"), "gpu": 0, "memMB": 10}}]
    need = resources.demand(roles)
    assert need["gpus"] == [["a", 0, 2], ["a", 1, 2]]  # a fractional GPU takes whole ones
    assert need["memMB"] == 10
    why = resources.too_big(need, {"cpu": 64, "memMB": 100, "gpus": [str(i) for i in range(8)]})
    assert why is not None and "cpu inf > 64" in why  # NaN never fits: refused, not admitted everywhere
