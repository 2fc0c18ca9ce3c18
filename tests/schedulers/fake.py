"""FakeScheduler: a scheduler whose whole state lives in memory, for runner and CLI tests and as the
smallest backend that passes the conformance suite (tests/schedulers/conformance.py).

It is a fake of a cluster, not of processes: each replica is a real child process started with the exact
argv and env of its role (no shell), in a session of its own so cancel ends its whole tree; its stdout and
stderr are kept in memory, line by line with the time each arrived. Nothing outlives the process that
made the scheduler and nothing is written to disk, so a test gets a fresh cluster with every instance.

What it does not do, on purpose, so that the suite sees a backend refuse cleanly: retries
(``max_retries > 0`` is refused at dry run), mounts, and GPUs. Usage::

    runner = Runner("t", scheduler_factories={"fake": create_scheduler})
    sched = FakeScheduler("t"); app_id = sched.submit(app); sched.wait(app_id)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tsm.errors import InvalidAppError, SubmissionError, UnknownAppError
from tsm.schedulers.api import DescribeAppResponse, EventWait, ListAppResponse, Scheduler, Stream
from tsm.schedulers.common.logs import check_replica, decode, filter_regex, in_window, stream_names
from tsm.schedulers.common.options import RunOptions, option
from tsm.schedulers.common.status import attribute_failure
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, ReplicaStatus, RoleStatus, macros
from tsm.specs.runopts import CfgVal, runopts

#: Seconds a replica gets between SIGTERM and SIGKILL when its app is cancelled or another replica fails.
GRACE = 5.0


@dataclass(frozen=True)
class FakeOptions(RunOptions):
    """The fake's run options: where replicas run, and a label kept with the app."""

    cwd: str | None = option("working directory of every replica; default: the submitter's")
    label: str | None = option("free text kept with the app (shown in describe's message)")


@dataclass
class FakeReplicaRequest:
    """One process to start: its argv (verbatim) and the env added to the submitter's."""

    replica_id: int
    argv: list[str]
    env: dict[str, str]


@dataclass
class FakeRequest:
    """What :meth:`FakeScheduler.schedule` starts, unchanged: the app id is chosen at dry run."""

    app_id: str
    app: AppDef
    cwd: str
    label: str
    roles: dict[str, list[FakeReplicaRequest]] = field(default_factory=dict)


@dataclass
class _Replica:
    role: str
    replica_id: int
    proc: subprocess.Popen[bytes]
    lines: list[tuple[str, float, bytes]] = field(default_factory=list)  # (stream, time, line)
    readers_left: int = 2
    exit_code: int | None = None
    state: AppState = AppState.RUNNING
    error_msg: str = ""


@dataclass
class _App:
    request: FakeRequest
    created: float
    replicas: list[_Replica]
    state: AppState = AppState.RUNNING
    msg: str = ""
    cancelled: bool = False
    reaped: int = 0


class FakeScheduler(Scheduler[FakeRequest], EventWait):
    """An in-memory scheduler whose replicas are real child processes (see the module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, session_name: str, backend: str = "fake") -> None:
        super().__init__(backend, session_name)
        self._apps: dict[str, _App] = {}
        self._cond = threading.Condition()
        #: every request schedule() was given, by app id (tests compare it with the dry run's)
        self.submitted: dict[str, FakeRequest] = {}

    def run_opts(self) -> runopts:
        return FakeOptions.runopts()

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        for role in app.roles:
            if role.max_retries > 0:
                raise InvalidAppError(
                    f"role '{role.name}': the fake scheduler does not retry replicas; set max_retries=0 "
                    f"(got {role.max_retries}, retry_policy {role.retry_policy.value})"
                )
            if role.mounts:
                raise InvalidAppError(f"role '{role.name}': the fake scheduler has no mounts")

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[FakeRequest]:
        opts = FakeOptions.from_cfg(cfg)
        app_id = f"fake-{os.getpid()}-{next(self._ids)}"
        cwd = os.path.abspath(opts.cwd or os.getcwd())
        req = FakeRequest(app_id=app_id, app=app, cwd=cwd, label=opts.label or "")
        for role in app.roles:
            reps = []
            for k in range(role.num_replicas):
                r = macros.Values(img_root=cwd, app_id=app_id, replica_id=str(k)).apply(role)
                env = {**r.env, "TSM_APP_ID": app_id, "TSM_ROLE_NAME": role.name, "TSM_REPLICA_ID": str(k)}
                reps.append(FakeReplicaRequest(k, [r.entrypoint, *r.args], env))
            req.roles[role.name] = reps
        return AppDryRunInfo(request=req, fmt=lambda r: repr(r))

    def schedule(self, dryrun_info: AppDryRunInfo[FakeRequest]) -> str:
        req = dryrun_info.request
        if not isinstance(req, FakeRequest):
            raise SubmissionError(f"the fake scheduler cannot submit a {type(req).__name__} request")
        with self._cond:
            if req.app_id in self._apps:
                raise SubmissionError(f"app {req.app_id} was already submitted")
            app = _App(request=req, created=time.time(), replicas=[])
            self._apps[req.app_id] = app
            self.submitted[req.app_id] = req
        try:
            for role, reps in req.roles.items():
                for rep in reps:
                    proc = subprocess.Popen(
                        rep.argv, env={**os.environ, **rep.env}, cwd=req.cwd, stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                    )  # fmt: skip
                    replica = _Replica(role, rep.replica_id, proc)
                    app.replicas.append(replica)
                    for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                        threading.Thread(
                            target=self._read, args=(app, replica, stream, pipe), daemon=True
                        ).start()
        except OSError as e:
            self._stop(app, signal.SIGKILL)
            with self._cond:
                for started in app.replicas:
                    started.proc.wait()  # reaped here: no reaper thread was started for them
                    started.state, started.error_msg = (
                        AppState.CANCELLED,
                        "stopped: another replica could not start",
                    )
                app.state, app.msg = AppState.FAILED, f"could not start a replica: {e}"
                self._cond.notify_all()
            raise SubmissionError(f"the fake scheduler could not start {req.app_id}: {e}") from e
        for replica in app.replicas:  # only once all are started, so the last to end is known
            threading.Thread(target=self._reap, args=(app, replica), daemon=True).start()
        return req.app_id

    # -- the app's life ------------------------------------------------------------------------------
    def _read(self, app: _App, replica: _Replica, stream: str, pipe: Any) -> None:
        for line in iter(pipe.readline, b""):
            with self._cond:
                replica.lines.append((stream, time.time(), line))
                self._cond.notify_all()
        pipe.close()
        with self._cond:
            replica.readers_left -= 1
            self._cond.notify_all()

    def _reap(self, app: _App, replica: _Replica) -> None:
        """Wait for one replica to exit (an event, not a poll) and record it; the first failure stops the
        others; the last replica to end records the app's end, once its output has been read."""
        code = replica.proc.wait()
        with self._cond:
            replica.exit_code = code
            if code == 0:
                replica.state = AppState.SUCCEEDED
            elif app.cancelled or app.state == AppState.FAILED:
                replica.state, replica.exit_code = AppState.FAILED, None  # stopped, not failed
            else:
                replica.state, replica.error_msg = AppState.FAILED, f"exited with code {code}"
                app.state = AppState.FAILED
                threading.Thread(target=self._stop, args=(app, signal.SIGTERM), daemon=True).start()
            app.reaped += 1
            self._cond.notify_all()
            if app.reaped < len(app.replicas):
                return
            self._cond.wait_for(lambda: all(r.readers_left == 0 for r in app.replicas), timeout=GRACE)
            if app.cancelled and app.state != AppState.FAILED:
                app.state = AppState.CANCELLED
            elif app.state != AppState.FAILED:
                app.state = AppState.SUCCEEDED
            for r in app.replicas:
                if r.state == AppState.RUNNING or (app.cancelled and r.exit_code is None):
                    r.state = AppState.CANCELLED
            self._cond.notify_all()

    def _stop(self, app: _App, sig: int) -> None:
        """SIGTERM every replica's process group, SIGKILL after :data:`GRACE` seconds.

        The group is signalled even when its leader has exited: a child it left behind is still in it.
        """
        for r in app.replicas:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(r.proc.pid, sig)
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + GRACE
            for r in app.replicas:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            self._stop(app, signal.SIGKILL)

    # -- queries -------------------------------------------------------------------------------------
    def describe(self, app_id: str) -> DescribeAppResponse | None:
        with self._cond:
            app = self._apps.get(app_id)
            if app is None:
                return None
            roles = []
            for role in app.request.app.roles:
                reps = [
                    ReplicaStatus(id=r.replica_id, role=r.role, state=r.state, exit_code=r.exit_code,
                                  error_msg=r.error_msg, pid=r.proc.pid)
                    for r in app.replicas if r.role == role.name
                ]  # fmt: skip
                roles.append(RoleStatus(role=role.name, replicas=reps))
            failure = attribute_failure(roles)
            msg = "; ".join(filter(None, [app.msg, failure, app.request.label]))
            return DescribeAppResponse(
                app_id=app_id, state=app.state, msg=msg, structured_error_msg=failure,
                roles_statuses=roles, app=app.request.app, created=app.created,
            )  # fmt: skip

    def list(self) -> list[ListAppResponse]:
        with self._cond:
            rows = [
                ListAppResponse(app_id=i, state=a.state, app_handle=f"{self.backend}://{self.session_name}/{i}",
                                name=a.request.app.name, created=a.created)
                for i, a in self._apps.items()
            ]  # fmt: skip
        return sorted(rows, key=lambda r: r.created or 0, reverse=True)

    def wait(
        self, app_id: str, timeout: float | None = None, poll_interval: float | None = None
    ) -> DescribeAppResponse | None:
        """Block on the app's end (an event, not a poll: ``poll_interval`` is unused; it declares EventWait)."""
        with self._cond:
            app = self._apps.get(app_id)
            if app is not None:
                self._cond.wait_for(lambda: app.state.is_terminal, timeout=timeout)
        return self.describe(app_id)

    def cancel(self, app_id: str) -> None:
        """Stop the app's replicas (SIGTERM, then SIGKILL); an ended or unknown app is left as it is."""
        with self._cond:
            app = self._apps.get(app_id)
            if app is None or app.state.is_terminal:
                return
            app.cancelled = True
        self._stop(app, signal.SIGTERM)
        self.wait(app_id, timeout=GRACE * 2)

    def remove(self, app_id: str) -> bool:
        with self._cond:
            app = self._apps.get(app_id)
            if app is None or not app.state.is_terminal:
                return False
            del self._apps[app_id]
            return True

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterator[str]:
        with self._cond:
            app = self._apps.get(app_id)
            if app is None:
                raise UnknownAppError(f"unknown fake app '{app_id}'")
            check_replica(app_id, {r.name: r.num_replicas for r in app.request.app.roles}, role_name, k)
            replica = next(r for r in app.replicas if r.role == role_name and r.replica_id == k)
        wanted = set(stream_names(streams))
        return filter_regex(regex, self._lines(replica, wanted, since, until, should_tail))

    def _lines(
        self, replica: _Replica, wanted: set[str], since: datetime | None, until: datetime | None, tail: bool
    ) -> Iterator[str]:
        seen = 0

        def more() -> bool:
            return len(replica.lines) > seen or replica.readers_left == 0

        while True:
            with self._cond:
                if tail:
                    self._cond.wait_for(more)
                batch, done = replica.lines[seen:], replica.readers_left == 0 or not tail
            seen += len(batch)
            for stream, when, line in batch:
                if stream in wanted and in_window(when, since, until):
                    yield decode(line)
            if done and seen >= len(replica.lines):
                return

    def close(self) -> None:
        """End every replica still running (a fake cluster dies with its scheduler)."""
        for app_id in list(self._apps):
            self.cancel(app_id)


def create_scheduler(session_name: str, **kwargs: Any) -> FakeScheduler:
    """Factory for ``Runner(..., scheduler_factories={"fake": create_scheduler})``."""
    return FakeScheduler(session_name, **kwargs)
