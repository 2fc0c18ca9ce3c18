"""A function job as a :class:`concurrent.futures.Future`: ``result``, ``exception``, ``done``, ``cancel``,
``add_done_callback``, and ``concurrent.futures.wait`` / ``as_completed`` over many; plus the app's
``handle``, ``status()`` and ``logs()``.

Each job is watched by a daemon thread of its own that waits for its app through its own
:class:`~tsm.runner.Runner` (:func:`sibling`): on schedulers with an event to wait on (local) it wakes when the
app ends; on the others the backends' waits poll, and their status watchers batch every job of the process
into one query per tick (one ``squeue`` a second for a hundred Slurm jobs). When the app has ended the thread
reads every rank's outcome (:func:`outcomes`) and settles the future, so callbacks and waiters run then.

``result()`` is the function's return value; with ``replicas=N`` (N > 1) the list of every rank's, unless
the job was submitted with ``results="rank0"``. An exception a rank raised is raised as itself (the first
rank's that raised, in rank order), its ``__cause__`` the replica's traceback; a rank that ended without
returning is a :class:`~tsm.functions.errors.ReplicaLostError` saying how it ended.
"""

from __future__ import annotations

import concurrent.futures
import copy
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tsm.functions import files, payload
from tsm.functions.app import META_RESULTS
from tsm.functions.errors import (
    FunctionError,
    FunctionLoadError,
    RemoteError,
    RemoteTraceback,
    ReplicaLostError,
)
from tsm.functions.spec import WorkerArgs, is_worker, parse
from tsm.schedulers.api import Stream
from tsm.specs.api import AppDef, AppState, AppStatus

#: how long outcomes are looked for in the output of a replica that succeeded and shows none yet (a log
#: channel that lags its app's end), in pauses that double from 0.2 s
LOG_LAG = 6.0


@dataclass(frozen=True)
class JobSpec:
    """What a reader of a function job needs, as its app definition records it."""

    role: str
    replicas: int
    worker: WorkerArgs
    results: str = "all"

    @classmethod
    def of(cls, app: AppDef) -> JobSpec:
        roles = [r for r in app.roles if is_worker(r.args)]
        if len(roles) != 1:
            raise FunctionError(f"app {app.name!r} is not a tsm function job (no role runs tsm.functions.worker)")
        role = roles[0]
        return cls(role.name, role.num_replicas, parse(role.args), str(app.metadata.get(META_RESULTS, "all")))


def sibling(runner: Any) -> Any:
    """A runner like ``runner`` (its schedulers' factories and parameters, its config) for another thread:
    a Runner and its schedulers are used by one thread at a time."""
    twin = copy.copy(runner)
    twin._scheduler_instances = {}
    twin._apps = {}
    twin._hist = None
    return twin


def _decode(data: bytes, rank: int, handle: str) -> tuple[bool, Any]:
    """(True, value) or (False, the exception to raise) from one rank's outcome bytes."""
    try:
        outcome = payload.loads(data)
    except FunctionError:
        raise
    except Exception as e:  # noqa: BLE001 - a value whose class this process lacks
        raise FunctionLoadError(f"the result of rank {rank} cannot be loaded here: {type(e).__name__}: {e}",
                                handle=handle) from e
    if outcome[0] == payload.OK:
        return True, outcome[1]
    _, blob, type_name, message, tb_text = outcome
    exc: BaseException | None = None
    if blob is not None:
        try:
            exc = payload.cloudpickle().loads(blob)
        except Exception:  # noqa: BLE001 - its class is not importable here: the text stands in for it
            exc = None
    if not isinstance(exc, BaseException):
        return False, RemoteError(type_name, message, tb_text, handle=handle)
    exc.__cause__ = RemoteTraceback(tb_text)
    return False, exc


def _frames(runner: Any, handle: str, spec: JobSpec, rank: int, status: AppStatus) -> bytes | None:
    """Rank ``rank``'s outcome from its output, waiting out a log channel's lag when the app succeeded."""
    reader = payload.FrameReader(spec.worker.nonce)
    pattern = re.escape(f"{payload.FRAME} {spec.worker.nonce} {rank} ")
    pause, waited = 0.2, 0.0
    while True:
        try:
            for line in runner.log_lines(handle, spec.role, rank, regex=pattern):
                reader.feed(line)
        except (FunctionError, LookupError, ValueError):
            return None  # the scheduler forgot the app or has no such replica: nothing came back
        if reader.seen(rank):
            return reader.data(rank)
        if status.state != AppState.SUCCEEDED or waited >= LOG_LAG:
            return None
        time.sleep(pause)
        waited += pause
        pause *= 2


def _how_it_ended(status: AppStatus, spec: JobSpec, rank: int) -> str:
    rep = next((r for role in status.roles if role.role == spec.role for r in role.replicas if r.id == rank), None)
    if status.state == AppState.CANCELLED:
        return "the job was cancelled"
    if rep is not None:
        if rep.error_msg:
            return rep.error_msg
        if rep.exit_code is not None:
            return f"it exited with code {rep.exit_code}"
    return f"the app ended {status.state.name}" + (f": {status.msg}" if status.msg else "")


def outcomes(runner: Any, handle: str, spec: JobSpec, status: AppStatus) -> list[tuple[bool, Any]]:
    """Every rank's (ok, value or exception), in rank order, once the app has ended."""
    out: list[tuple[bool, Any]] = []
    for rank in range(spec.replicas):
        data = files.read(files.result_path(spec.worker.dir, rank)) if spec.worker.dir else None
        if data is None:
            data = _frames(runner, handle, spec, rank, status)
        if data is None:
            lost = ReplicaLostError(f"rank {rank} of {handle} ended without returning a result: "
                                    f"{_how_it_ended(status, spec, rank)}", rank, handle=handle)
            out.append((False, lost))
            continue
        try:
            out.append(_decode(data, rank, handle))
        except FunctionError as e:
            out.append((False, e))
    return out


def settle(ranks: list[tuple[bool, Any]], spec: JobSpec) -> tuple[bool, Any]:
    """The job's (ok, result or exception): every rank's values, or the first exception a rank raised (a
    lost rank only when none raised: a rank's error is what ends the others)."""
    raised = [v for ok, v in ranks if not ok and not isinstance(v, ReplicaLostError)]
    lost = [v for ok, v in ranks if not ok]
    if raised or lost:
        return False, (raised or lost)[0]
    values = [v for _, v in ranks]
    if spec.replicas == 1 or spec.results == "rank0":
        return True, values[0]
    return True, values


class Job(concurrent.futures.Future):  # type: ignore[type-arg]
    """A submitted function (see the module doc); made by :func:`tsm.functions.submit` or :func:`attach`."""

    def __init__(self, runner: Any, handle: str | None, spec: JobSpec, *, watch: bool = True) -> None:
        super().__init__()
        self._runner = runner
        #: the app's handle; None for an item of a map that has not been launched yet
        self.handle = handle
        self.spec = spec
        self._ranks: list[tuple[bool, Any]] | None = None
        self._final: AppStatus | None = None
        self._cancelling = False  # cancel() is stopping the app: its end is the cancel's, not an outcome
        if watch:
            threading.Thread(target=self._watch, name=f"tsm-job:{handle}", daemon=True).start()

    # -- the watcher --------------------------------------------------------------------------------
    def _watch(self) -> None:
        twin = sibling(self._runner)
        try:
            self._settle(twin, self._wait(twin))
        except BaseException as e:  # noqa: BLE001 - whatever stops the wait is the job's exception
            self._set(False, e)
        finally:
            twin.close()

    def _wait(self, runner: Any) -> AppStatus | None:
        """The app's status once it ended; or, on a scheduler without an event to wait on whose replicas write
        their outcomes into the job's directory, as soon as every outcome is there (the app may still be
        finishing: Slurm reports a job's end seconds after its tasks returned). Its looks at the directory
        come between the backend's own polls, from 0.1 s doubling to 2 s."""
        from tsm.schedulers.api import EventWait
        from tsm.specs.handles import parse_app_handle

        assert self.handle is not None
        folder = self.spec.worker.dir
        if not folder or isinstance(runner.scheduler(parse_app_handle(self.handle).scheduler), EventWait):
            status: AppStatus | None = runner.wait(self.handle)
            return status
        pause = 0.1
        while True:
            status = runner.wait(self.handle, timeout=pause)
            if status is None or status.state.is_terminal:
                return status
            if all(files.result_path(folder, r).exists() for r in range(self.spec.replicas)):
                return status
            pause = min(pause * 2, 2.0)

    def _settle(self, runner: Any, status: AppStatus | None) -> None:
        assert self.handle is not None
        if status is None:
            self._set(False, FunctionError(f"{self.handle}: its scheduler no longer knows the job (removed?)",
                                           handle=self.handle))
            return
        self._final = status
        self._ranks = outcomes(runner, self.handle, self.spec, status)
        self._set(*settle(self._ranks, self.spec))

    def _set(self, ok: bool, value: Any) -> None:
        if self._cancelling:
            return
        try:
            if ok:
                self.set_result(value)
            else:
                self.set_exception(value)
        except concurrent.futures.InvalidStateError:
            pass  # cancelled meanwhile

    # -- the app ------------------------------------------------------------------------------------
    def _launched(self) -> str:
        if self.handle is None:
            raise FunctionError("this item of the map has not been launched yet")
        return self.handle

    def status(self) -> AppStatus | None:
        """The app's status now (None when its scheduler forgot it, or it has not been launched yet)."""
        if self.handle is None:
            return None
        result: AppStatus | None = self._runner.status(self.handle)
        return result

    def running(self) -> bool:
        """Whether the app is running now (asks its scheduler)."""
        if self.done():
            return False
        status = self.status()
        return status is not None and status.state == AppState.RUNNING

    def cancel(self) -> bool:
        """Cancel the app (running or not); False when the job had already ended."""
        if self.done() or self.handle is None:
            return False  # a map's item not launched yet: cancel the map (MapJob.cancel)
        self._cancelling = True
        try:
            self._runner.cancel(self.handle)
            self._final = self._runner.status(self.handle)
        except BaseException:
            self._cancelling = False
            raise
        if not super().cancel():
            return False
        self.set_running_or_notify_cancel()  # CANCELLED_AND_NOTIFIED: concurrent.futures.wait counts it done
        return True

    def results(self, timeout: float | None = None) -> list[Any]:
        """Every rank's value, in rank order (raises as :meth:`result` does)."""
        self.exception(timeout)  # waits: CancelledError or TimeoutError from here
        if self._ranks is None:
            return [self.result()]  # the job failed before any rank was read: raises why
        ok, value = settle(self._ranks, self.spec)
        if not ok:
            raise value
        return [v for _, v in self._ranks]

    def outcomes(self, timeout: float | None = None) -> list[tuple[bool, Any]] | None:
        """Once the job ended: every rank's ``(True, value)`` or ``(False, exception)``, in rank order (None when
        the job failed before any rank could be read, or was cancelled first)."""
        concurrent.futures.wait([self], timeout)
        return self._ranks

    def final_status(self) -> AppStatus | None:
        """The app's status as the job ended (None before)."""
        return self._final

    def logs(self, rank: int = 0, streams: Stream | None = None, should_tail: bool = False) -> Iterator[str]:
        """Rank ``rank``'s log lines (the outcome's own lines left out)."""
        marker = payload.FRAME
        for line in self._runner.log_lines(self._launched(), self.spec.role, rank, streams=streams,
                                           should_tail=should_tail):
            if marker not in line:
                yield line

    def __repr__(self) -> str:
        with self._condition:
            state = self._state
        return f"<tsm.functions.Job {self.handle} {state.lower()}>"

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(f"a job is a future of this process: pickle its handle ({self.handle}) and find it again "
                        "with tsm.functions.attach(handle)")


def attach_with(runner: Any, handle: str) -> Job:
    """The :class:`Job` of a function job launched earlier (by this process or another), from its handle."""
    app = runner.describe(handle)
    if app is None:
        from tsm.errors import UnknownAppError

        raise UnknownAppError(f"unknown app {handle}: its scheduler does not know it", handle=handle)
    return Job(runner, handle, JobSpec.of(app))
