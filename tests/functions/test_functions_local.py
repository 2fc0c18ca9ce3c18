"""Functions as jobs on the real local scheduler: futures, ranks, errors with their traceback, refusals at
submit, a killed replica, cancel, the map's cap, ``tsm rm``, a checkpoint resumed after a time limit."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from tsm import get_runner
from tsm.functions import (
    Call,
    Checkpointable,
    FunctionPickleError,
    FunctionVersionError,
    RemoteError,
    RemoteTraceback,
    ReplicaLostError,
    attach,
    environment,
    files as function_files,
)
from tsm.sweep.state import SweepState, max_concurrent, parse_sweep_handle

WAIT = 120.0


def square(x: int) -> int:
    return x * x


def rank_and_world(tag: str) -> tuple[str, int, int]:
    env = environment()
    return tag, env.rank, env.world_size


class Unreadable(Exception):
    """An exception the submitter cannot unpickle: its class lives only in the replica."""


def raise_value_error() -> None:
    def inner() -> None:
        raise ValueError("bad value on purpose")

    inner()


def raise_unloadable() -> None:
    import types

    mod = types.ModuleType("only_in_the_replica")
    exec("class Gone(Exception):\n    pass\n", mod.__dict__)  # noqa: S102 - a class no other process has
    sys.modules["only_in_the_replica"] = mod
    raise mod.Gone("a class the submitter does not have")


def wait_forever(fifo: str = "") -> None:
    """Say its pid through ``fifo`` (the test's read of it is the event that it runs), then wait to be stopped."""
    if fifo:
        with open(fifo, "w") as f:
            f.write(str(os.getpid()))
    while True:
        signal.pause()


@pytest.fixture
def runner():
    with get_runner() as r:
        yield r


def test_a_function_is_a_future(runner) -> None:
    job = runner.submit(square, 7)
    done = threading.Event()
    job.add_done_callback(lambda f: done.set())
    assert job.result(WAIT) == 49
    assert done.wait(WAIT) and job.done() and job.exception() is None
    finished, _ = concurrent.futures.wait([job, runner.submit(square, 3)], WAIT)
    assert len(finished) == 2
    assert job.handle.startswith("local://default/square-")
    assert job.status().state.name == "SUCCEEDED"
    assert attach(job.handle).result(WAIT) == 49  # found again from its handle alone


def test_every_rank_returns_and_rank0_when_asked(runner) -> None:
    assert runner.submit(rank_and_world, "r", replicas=2).result(WAIT) == [("r", 0, 2), ("r", 1, 2)]
    assert runner.submit(rank_and_world, "r", replicas=2, results="rank0").result(WAIT) == ("r", 0, 2)


def test_an_exception_comes_back_as_itself_with_the_remote_traceback(runner) -> None:
    job = runner.submit(raise_value_error)
    with pytest.raises(ValueError, match="bad value on purpose") as err:
        job.result(WAIT)
    cause = err.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in inner" in cause.text and "raise_value_error" in cause.text  # the replica's frames
    assert job.status().state.name == "FAILED"


def test_an_exception_that_cannot_be_unpickled_keeps_its_text(runner) -> None:
    with pytest.raises(RemoteError) as err:
        runner.submit(raise_unloadable).result(WAIT)
    assert err.value.type_name.endswith("Gone") and "the submitter does not have" in err.value.message
    assert "Traceback" in err.value.remote_traceback


def test_an_unpicklable_argument_is_refused_at_submit_naming_it(runner) -> None:
    with pytest.raises(FunctionPickleError, match=r"argument 1 \(_thread\.lock\)"):
        runner.submit(square, 1, threading.Lock())
    assert runner.list("local") == []  # nothing was submitted
    assert not function_files.root().exists() or not list(function_files.root().iterdir())


def test_a_replica_python_of_another_version_is_refused_at_submit(runner, tmp_path: Path) -> None:
    other = tmp_path / "python"
    other.write_text("#!/bin/sh\necho 3.8\n")
    other.chmod(0o755)
    with pytest.raises(FunctionVersionError, match=r"Python 3\.8 .* but this is Python 3\.\d+"):
        runner.submit(square, 2, python=str(other))
    assert runner.list("local") == []


def test_a_killed_replica_is_an_error_naming_how_it_ended(runner, tmp_path: Path) -> None:
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    job = runner.submit(wait_forever, str(fifo))
    with open(fifo) as f:  # blocks until the replica writes its pid
        pid = int(f.read())
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ReplicaLostError, match="rank 0 .* ended without returning a result: .*SIGKILL"):
        job.result(WAIT)


def test_cancel_ends_the_app_and_the_future(runner, tmp_path: Path) -> None:
    job = runner.submit(wait_forever)
    assert job.cancel()
    assert job.cancelled()
    finished, _ = concurrent.futures.wait([job], WAIT)
    assert job in finished
    assert runner.status(job.handle).state.name == "CANCELLED"
    assert not job.cancel()  # an ended job cannot be cancelled again


def test_a_map_of_20_items_holds_its_cap_and_gives_results_in_order(runner) -> None:
    jobs = runner.map(square, range(20), parallel=3)
    assert jobs.results(WAIT * 3) == [i * i for i in range(20)]
    state = SweepState.open(parse_sweep_handle(jobs.handle))
    try:
        assert max_concurrent(state.events()) == 3  # the cap held, and was used
    finally:
        state.close()
    assert [j.result() for j in concurrent.futures.as_completed(jobs.jobs)] != []


def test_tsm_rm_leaves_nothing_of_a_function_job(runner) -> None:
    job = runner.submit(square, 5, replicas=2)
    assert job.result(WAIT) == [25, 25]
    assert list(function_files.root().iterdir())  # the job's directory held the outcomes
    assert runner.remove([job.handle]) == [job.handle]
    assert list(function_files.root().iterdir()) == []


def test_rm_never_removes_a_folder_outside_the_functions_home(tmp_path: Path) -> None:
    from tsm.specs.api import AppDef, Role

    victim = tmp_path / "precious" / "3"
    victim.mkdir(parents=True)
    role = Role("r", entrypoint="python", args=["-m", "tsm.functions.worker", "--nonce", "x", "--dir", str(victim)])
    function_files.forget(AppDef("evil", [role]))
    assert victim.is_dir()


class Resume(Checkpointable):
    """Saves its state when warned, then waits to be stopped; resumed, returns what it saved."""

    def __init__(self) -> None:
        self.saved: str | None = None

    def __call__(self, tag: str) -> str:
        if self.saved is not None:
            return f"resumed {self.saved} attempt {environment().attempt}"
        while True:
            signal.pause()  # the warning's handler checkpoints; the time limit then stops this attempt

    def checkpoint(self, tag: str) -> Call:
        self.saved = tag
        return Call(self, tag)


def test_a_checkpointable_resumes_from_its_checkpoint_after_the_time_limit(runner) -> None:
    job = runner.submit(Resume(), "state-1", time_limit="6s", warn_signal="USR1", warn_before="3s",
                        requeue_on_time_limit=True, max_preemptions=1)
    assert job.result(WAIT) == "resumed state-1 attempt 1"
