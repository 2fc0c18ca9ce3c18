"""The local scheduler: apps run as processes on this machine, owned by a detached supervisor.

Each app gets ``$TSM_HOME/local/<app_id>/`` holding its request (``request.json``), the supervisor's
socket and, unless ``log_dir`` says otherwise, its logs. Its state lives in the store, so any process
can describe, wait on, tail or cancel an app through its handle. See ``supervisor.py`` for the process
that owns a running app and ``logs.py`` for the log layout.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tsm.errors import InvalidAppError, InvalidRunOptionError, StoreError, SubmissionError, UnknownAppError
from tsm.lifecycle import PREEMPTED_PREFIX
from tsm.schedulers.api import (
    DescribeAppResponse,
    DirectoryWorkspaces,
    EventWait,
    ListAppResponse,
    LockfileEnvironments,
    MultiReplicaLogs,
    PresetAppIds,
    Scheduler,
    Secrets,
    StoreRecords,
    Stream,
)
from tsm.schedulers.common.failure import structured_error
from tsm.schedulers.common.logs import check_replica
from tsm.schedulers.local import (
    _os,
    control,
    logs as _logs,
)
from tsm.schedulers.local.control import (  # re-exported: part of this module's face
    CONNECT_TIMEOUT,
)
from tsm.schedulers.local.debug import LocalDebug
from tsm.schedulers.local.logs import STDERR, STDOUT, replica_dir
from tsm.schedulers.local.view import LocalViews
from tsm.specs.api import (
    AppDef,
    AppDryRunInfo,
    AppState,
    ReplicaStatus,
    RoleStatus,
    json_default,
)
from tsm.specs.runopts import CfgVal, runopts
from tsm.store import Store

if TYPE_CHECKING:
    # imported where used: ``tsm status``/``tsm list`` read the store and never open a socket or a process
    import socket
    import subprocess

    from tsm.schedulers.local.request import LocalRequest

#: The request types and builders of :mod:`tsm.schedulers.local.request`, still importable from here. They
#: are imported on first use: ``tsm status``/``tsm list`` never build a request (and the module, with the
#: lifecycle options' dataclasses, was 3-5 ms of their start-up).
_REQUEST_NAMES = frozenset((
    "LocalOptions", "LocalReplicaRequest", "LocalRequest", "LocalRoleRequest", "assign_gpus", "detect_gpus",
    "format_request", "lifecycle_request", "python_entrypoint", "replica_path",
))


def __getattr__(name: str) -> Any:
    if name in _REQUEST_NAMES:
        from tsm.schedulers.local import request

        return getattr(request, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The local run options, built on the first ``run_opts()`` (see there).
_RUNOPTS: runopts | None = None

#: terminal AppState values as stored, and as an SQL list
_TERMINAL = tuple(int(s) for s in AppState if s.is_terminal)
_TERMINAL_SQL = "(" + ", ".join(map(str, _TERMINAL)) + ")"


class LocalScheduler(Scheduler["LocalRequest"], LocalViews, MultiReplicaLogs, DirectoryWorkspaces, EventWait,
                     StoreRecords, LockfileEnvironments, Secrets, LocalDebug, PresetAppIds):
    """Runs apps as local processes under a detached supervisor; the default scheduler.

    Capabilities: :class:`~tsm.schedulers.local.view.LocalViews` (``DetailedViews``: two store queries per
    view refresh), ``MultiReplicaLogs`` (``log_iter_many``), ``DirectoryWorkspaces`` (roles run in a
    directory), ``EventWait`` (the supervisor tells ``wait``), ``StoreRecords`` (its records are in tsm's store:
    the runner's history row is written with them), ``LockfileEnvironments`` (built under ``$TSM_HOME/envs`` at
    submit: :mod:`tsm.schedulers.local.envs`), :class:`~tsm.schedulers.local.debug.LocalDebug` (exec, stack,
    port-forward), ``PresetAppIds`` (the dry run names the app). Not ``SizedPlacement``: replicas run on this
    machine whatever their size, so a role without a resource is fine here.
    """

    def __init__(self, session_name: str, backend: str = "local") -> None:
        super().__init__(backend, session_name)
        self._store: Store | None = None
        self._launchers: list[subprocess.Popen[bytes]] = []

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store()
        return self._store

    def run_opts(self) -> runopts:
        """The local run options (declared once, typed, in :class:`LocalOptions`).

        Built once per process (``LocalOptions.runopts()`` evaluates the dataclass's annotations: 1-2 ms,
        and every ``run()`` asks twice); each call returns a new container of those (frozen) options, so a
        caller that adds to it changes nothing here.
        """
        global _RUNOPTS
        if _RUNOPTS is None:
            from tsm.schedulers.local.request import LocalOptions

            _RUNOPTS = LocalOptions.runopts()
        out = runopts()
        out.update(_RUNOPTS)
        return out

    # -- dry run -----------------------------------------------------------------------------------
    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        from tsm.schedulers.local.request import LocalOptions

        LocalOptions.from_cfg(cfg)  # refuses bad values before the roles are looked at
        for role in app.roles:
            if role.image and not os.path.isdir(role.image):
                raise InvalidAppError(
                    f"role '{role.name}': image {role.image!r} is not a directory; the local scheduler runs "
                    "replicas in a directory (leave image empty for the current one)"
                )

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[LocalRequest]:
        from tsm.schedulers.local.build import build_request
        from tsm.schedulers.local.request import LocalOptions, format_request

        return AppDryRunInfo(request=build_request(app, LocalOptions.from_cfg(cfg), self.session_name), fmt=format_request)

    # -- schedule ----------------------------------------------------------------------------------
    def schedule(self, dryrun_info: AppDryRunInfo[LocalRequest]) -> str:
        """Write the app's request and record, then start its supervisor.

        Files come first and the record second, so a failure (a full or read-only disk, a store error)
        leaves neither half behind: what was created is removed and the error says what to fix.
        """
        return self.schedule_recording(dryrun_info)

    def schedule_recording(self, dryrun_info: AppDryRunInfo[LocalRequest],
                           also: Callable[[str], tuple[str, tuple[Any, ...]]] | None = None) -> str:
        """:meth:`schedule`, with ``also(app_id)``'s statement written in the transaction of the app's record.

        The runner passes its history's row (:meth:`tsm.history.History.add_statement`), so a launch costs
        one store write, not two; the row is there whether or not the supervisor then starts (an app that
        could not start is recorded FAILED with the reason, and the history lists it).
        """
        req = dryrun_info.request
        values: dict[str, str] = {}
        if req.secrets:  # read now; kept out of the request (the caller's environment included)
            from tsm.specs.secrets import parse_secret, resolve, source_variables

            refs = [parse_secret(s) for s in req.secrets]
            values, hidden = resolve(refs), source_variables(refs)
            req.base_env = {k: v for k, v in os.environ.items() if k not in hidden}
        else:
            req.base_env = dict(os.environ)
        if os.path.lexists(req.app_dir):
            raise SubmissionError(f"{req.app_dir} already exists: app ids are unique, so something else wrote it")
        if req.environments:  # built (once per key) before any file or record of the app exists
            from tsm.schedulers.local import envs

            envs.ensure(req.environments)
        created = [d for d in (req.app_dir, req.log_dir) if not os.path.lexists(d)]
        from tsm.schedulers.local import spawn

        # A launcher's standby checks this caller while the files and the record are written (spawn.py).
        conn = spawn.connect()
        try:
            self._write(req, created, also, values)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        spawn.start_supervisor(self.store, self._launchers, req, conn)
        return req.app_id

    def _write(self, req: LocalRequest, created: list[str],
               also: Callable[[str], tuple[str, tuple[Any, ...]]] | None = None,
               secrets: Mapping[str, str] | None = None) -> None:
        """Write the app's request file, its secrets' file (:mod:`~tsm.schedulers.common.secretfile`: the
        supervisor takes it) and its store record (the files first; nothing is left on failure)."""
        try:
            _os.makedirs_private(req.app_dir)
            _os.makedirs_private(req.log_dir)
            data = json.dumps(req, default=json_default).encode()
            fd = os.open(os.path.join(req.app_dir, "request.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if secrets:
                from tsm.schedulers.common import secretfile

                secretfile.write(os.path.join(req.app_dir, secretfile.NAME), secrets)
        except OSError as e:
            self._undo(created)
            where = e.filename or req.app_dir
            raise SubmissionError(
                f"cannot write the files of app {req.app_id} at {where}: {e.strerror or e}; "
                "free space or permissions there, or set TSM_HOME (or -c log_dir=) to another folder"
            ) from e
        now = time.time()
        stmts: list[tuple[str, tuple[Any, ...]]] = [(
            "INSERT INTO local_apps (app_id, session, name, state, created, app_dir, log_dir, spec) VALUES (?,?,?,?,?,?,?,?)",
            (req.app_id, req.session, req.app_name, int(AppState.SUBMITTED), now, req.app_dir, req.log_dir,
             json.dumps(req.spec)),
        )]
        for role in req.roles:
            for rep in role.replicas:
                stmts.append((
                    "INSERT INTO local_replicas (app_id, role, idx, state) VALUES (?,?,?,?)",
                    (req.app_id, role.name, rep.idx, int(AppState.SUBMITTED)),
                ))
        if also is not None:
            stmts.append(also(req.app_id))
        try:
            self.store.write(stmts)
        except BaseException:
            self._undo(created)
            raise

    @staticmethod
    def _undo(created: list[str]) -> None:
        """Remove the folders a failed submission created (never one that was there before)."""
        import shutil  # not at module level: `tsm status`/`list` never need it

        for d in created:
            shutil.rmtree(d, ignore_errors=True)

    # -- queries -----------------------------------------------------------------------------------
    def app_row(self, app_id: str) -> Any:
        """The store's row of ``app_id`` (``local_apps``), None for an app this home does not hold."""
        rows = self.store.query("SELECT * FROM local_apps WHERE app_id=?", (app_id,))
        return rows[0] if rows else None

    def _reconcile(self, row: Any) -> Any:
        """Mark an app FAILED when its supervisor and watchdog are both gone without a terminal state.

        While the watchdog lives it records the reason itself (it saw how the supervisor died), so
        readers leave the row alone. Returns the current row.
        """
        if row["state"] in _TERMINAL:
            return row
        if row["sup_pid"] is None:
            if time.time() - row["created"] < 60:
                return row  # still starting
            msg = "supervisor never started; see supervisor.log in " + row["app_dir"]
        elif self._maybe_alive(row["sup_pid"], row["sup_start"]) or self._maybe_alive(
            row["watchdog_pid"], row["watchdog_start"]
        ):
            return row
        else:
            msg = "supervisor died; its replicas were stopped"
            self._kill_orphaned_replicas(row["app_id"])
        now = time.time()
        try:
            self.store.write([
                (
                    "UPDATE local_replicas SET state=5, ended=COALESCE(ended, ?), "
                    "error=CASE WHEN error='' THEN 'supervisor died' ELSE error END "
                    f"WHERE app_id=? AND state NOT IN {_TERMINAL_SQL}",
                    (now, row["app_id"]),
                ),
                (
                    f"UPDATE local_apps SET state=5, ended=?, msg=? WHERE app_id=? AND state NOT IN {_TERMINAL_SQL}",
                    (now, msg, row["app_id"]),
                ),
            ])
        except StoreError:  # a full or read-only store: this read says what it found, a later one records it
            return {**dict(row), "state": int(AppState.FAILED), "ended": now, "msg": msg}
        return self.app_row(row["app_id"])

    @staticmethod
    def _maybe_alive(pid: int | None, started: int | None) -> bool:
        """False only when ``pid`` is known to be gone: a check this process could not make (its own fd
        table is full, ...) counts as alive, so a reader never changes an app on evidence it could not read."""
        try:
            return _os.is_alive(pid, started)
        except OSError:
            return True

    def _kill_orphaned_replicas(self, app_id: str) -> None:
        """SIGKILL the process groups of replicas still running with nobody watching them."""
        rows = self.store.query(
            f"SELECT pid, pid_start FROM local_replicas WHERE app_id=? AND state NOT IN {_TERMINAL_SQL}", (app_id,)
        )
        for r in rows:
            if r["pid"] and r["pid_start"] is not None and _os.alive_for_sure(r["pid"], r["pid_start"]):
                with contextlib.suppress(OSError):
                    os.killpg(r["pid"], signal.SIGKILL)

    def _wait_for_watchdog(self, row: Any, timeout: float | None) -> None:
        """The supervisor is gone: block until its watchdog has recorded the outcome and exited."""
        if row["watchdog_pid"]:
            _os.wait_exit(row["watchdog_pid"], row["watchdog_start"], timeout)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        row = self.app_row(app_id)
        if row is None:
            return None
        row = self._reconcile(row)
        spec = json.loads(row["spec"])
        reps = self.store.query("SELECT * FROM local_replicas WHERE app_id=? ORDER BY rowid", (app_id,))
        roles: dict[str, RoleStatus] = {r["name"]: RoleStatus(r["name"]) for r in spec["roles"]}
        host = os.uname().nodename  # what socket.gethostname() returns on Linux, without importing socket
        for rep in reps:
            roles.setdefault(rep["role"], RoleStatus(rep["role"])).replicas.append(
                ReplicaStatus(
                    id=rep["idx"], role=rep["role"], state=AppState(rep["state"]), hostname=host,
                    exit_code=rep["exit_code"], error_msg=rep["error"], restarts=rep["restarts"], pid=rep["pid"],
                    preempted=rep["error"].startswith(PREEMPTED_PREFIX),
                )
            )
        return DescribeAppResponse(
            app_id=app_id, state=AppState(row["state"]), num_restarts=row["num_restarts"], msg=row["msg"],
            roles_statuses=list(roles.values()), app=AppDef.from_dict(spec), created=row["created"],
            ui_url=f"file://{row['log_dir']}", structured_error_msg=self._failure(row, reps),
        )

    @staticmethod
    def _failure(row: Any, reps: list[Any]) -> str:
        """Why a FAILED app failed, as a JSON object (empty for any other state).

        Keys: ``replica`` (``role/idx`` named by the app's message, else the first replica that failed),
        ``exit_code``, ``signal`` (its name when a signal ended it), ``message`` (the replica's error) and
        ``stderr_tail`` (the last :data:`TAIL_LINES` lines it wrote to stderr, read from its log file).
        """
        if row["state"] != int(AppState.FAILED):
            return ""
        failed = [r for r in reps if r["state"] == int(AppState.FAILED)]
        named = [r for r in failed if str(row["msg"]).startswith(f"{r['role']}/{r['idx']} ")]
        out: dict[str, Any] = {"replica": None, "exit_code": None, "signal": None, "message": row["msg"],
                               "stderr_tail": []}
        culprit = (named or sorted(failed, key=lambda r: r["ended"] or 0.0) or [None])[0]
        if culprit is not None:
            error = str(culprit["error"])
            sig = error.split()[-1] if error.startswith("killed by ") else None
            out.update(
                replica=f"{culprit['role']}/{culprit['idx']}", exit_code=culprit["exit_code"], signal=sig,
                message=error or row["msg"],
                stderr_tail=stderr_tail(replica_dir(row["log_dir"], culprit["role"], culprit["idx"])),
            )
        return structured_error(**out)

    def list(self) -> list[ListAppResponse]:
        rows = self.store.query(
            "SELECT app_id, session, name, state, created, sup_pid, sup_start FROM local_apps ORDER BY created DESC"
        )
        out = []
        for row in rows:
            state = AppState(row["state"])
            if not state.is_terminal and row["sup_pid"] and not self._maybe_alive(row["sup_pid"], row["sup_start"]):
                full = self._reconcile(self.app_row(row["app_id"]))
                state = AppState(full["state"])
            out.append(ListAppResponse(
                app_id=row["app_id"], state=state, name=row["name"], created=row["created"],
                app_handle=f"{self.backend}://{row['session']}/{row['app_id']}",
            ))
        return out

    # -- events ------------------------------------------------------------------------------------
    def _connect(self, app_id: str, app_dir: str, timeout: float | None = CONNECT_TIMEOUT) -> socket.socket | None:
        """A blocking connection to the app's supervisor, or None; see :func:`.control.connect`."""
        return control.connect(app_dir, timeout)

    def wait(
        self, app_id: str, timeout: float | None = None, poll_interval: float | None = None
    ) -> DescribeAppResponse | None:
        """Block until the app ends (told by its supervisor, not by polling: ``poll_interval`` is unused)."""
        row = self.app_row(app_id)
        if row is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        sock: socket.socket | None = None
        try:
            while True:
                row = self._reconcile(self.app_row(app_id))
                left = None if deadline is None else deadline - time.monotonic()
                if row["state"] in _TERMINAL or (left is not None and left <= 0):
                    break
                if sock is None:
                    limit = CONNECT_TIMEOUT if left is None else max(0.001, min(left, CONNECT_TIMEOUT))
                    sock = self._connect(app_id, row["app_dir"], timeout=limit)
                if sock is None:
                    if row["sup_pid"] is not None and not self._maybe_alive(row["sup_pid"], row["sup_start"]):
                        self._wait_for_watchdog(row, left)
                    else:  # starting up, or closing its socket on the way out: moments either way
                        time.sleep(0.005 if left is None else min(0.005, left))
                    continue
                poller = select.poll()
                poller.register(sock, select.POLLIN)
                if not poller.poll(None if left is None else control.ms(left)):
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:  # the supervisor exited: its last state is in the store, or the watchdog's
                    sock.close()
                    sock = None
                    row = self.app_row(app_id)
                    if row["state"] not in _TERMINAL:
                        self._wait_for_watchdog(row, left)
        finally:
            if sock is not None:
                sock.close()
        return self.describe(app_id)

    def cancel(self, app_id: str) -> None:
        """Ask the supervisor to stop the app and return once it has ended; see :func:`.control.cancel`."""
        control.cancel(self, app_id)

    def _force_cancel(self, app_id: str) -> None:
        control.force_cancel(self, app_id)

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
        attempt: int | None = None,
    ) -> Iterator[str]:
        """Lines of replica ``k`` of ``role_name``: every attempt in order, or only ``attempt`` (0: the first run).

        What a line is (long lines in pieces, ``\\r`` while following) is said in :mod:`.logs`. Following
        goes on across restarts of the replica and stops once it has ended for good and its log is read.
        """
        lines: Iterator[str] = self.log_iter_many(
            app_id, [(role_name, k)], regex, since, until, should_tail, streams, attempt, text_only=True
        )
        return lines

    def log_iter_many(
        self,
        app_id: str,
        targets: Sequence[tuple[str, int]] | None = None,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
        attempt: int | None = None,
        idle: Any = None,
        text_only: bool = False,
    ) -> Iterator[Any]:
        """The lines of many replicas ``(role, k)`` of the app (None: all), in one thread, as :class:`.LogEvent`.

        Events of one replica come in order, with an event (``marker``) where each of its restarted
        attempts begins. However many replicas, following costs one connection to the supervisor, one
        store query per state change and no open file per replica: what ``tsm log -f`` and an attached
        ``tsm run`` use. ``idle()``, if given, is called whenever the follower is about to wait;
        ``text_only`` yields just the lines (no events, no markers). Unknown roles, replicas or attempts
        raise before anything is read.
        """
        row = self.app_row(app_id)
        if row is None:
            raise UnknownAppError(f"unknown local app '{app_id}'")
        spec = json.loads(row["spec"])
        roles = {r["name"]: r["num_replicas"] for r in spec["roles"]}
        if targets is None:
            targets = [(name, i) for name, n in roles.items() for i in range(n)]
        for role_name, k in targets:
            check_replica(app_id, roles, role_name, k)
        if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0):
            raise InvalidRunOptionError(f"attempt must be a whole number >= 0 (0: the first run), not {attempt!r}")
        stream = Stream(streams) if streams is not None else Stream.COMBINED
        codes = {Stream.STDOUT: frozenset({STDOUT}), Stream.STDERR: frozenset({STDERR})}.get(
            stream, frozenset({STDOUT, STDERR})
        )
        waiter = control.SupervisorEvents(self, app_id, row["app_dir"]) if should_tail else None
        events = _logs.follow(
            [(r, i, replica_dir(row["log_dir"], r, i)) for r, i in targets], codes, self._log_states(app_id, spec),
            waiter, regex, since.timestamp() if since else None, until.timestamp() if until else None, attempt,
            idle, text_only,
        )
        return events if waiter is None else control.closing(events, waiter)

    def _log_states(self, app_id: str, spec: dict[str, Any]) -> Any:
        """The ``states`` callable of :func:`.logs.follow`: one store query for every replica of the app.

        A replica that succeeded may still be restarted when a retry restarts its role (ROLE policy) or
        the whole app (APPLICATION policy of any role) while retries are left: it is followed until the
        app ends. Any other ended replica is done unless its index records a pending restart.
        """
        with_retries = [r for r in spec["roles"] if r.get("max_retries", 0) > 0]
        whole_app = any(r.get("retry_policy") == "APPLICATION" for r in with_retries)
        by_role = {r["name"] for r in with_retries if r.get("retry_policy") == "ROLE"}

        def states() -> tuple[bool, dict[tuple[str, int], int]]:
            row = self.app_row(app_id)
            if row is None:  # removed while followed
                return True, {}
            if self._reconcile(row)["state"] in _TERMINAL:
                return True, {}
            out = {}
            for r in self.store.query("SELECT role, idx, state FROM local_replicas WHERE app_id=?", (app_id,)):
                if r["state"] not in _TERMINAL:
                    out[(r["role"], r["idx"])] = _logs.RUNNING
                elif r["state"] == int(AppState.SUCCEEDED) and (whole_app or r["role"] in by_role):
                    out[(r["role"], r["idx"])] = _logs.ENDED_MAY_RESTART
                else:
                    out[(r["role"], r["idx"])] = _logs.ENDED
            return False, out

        return states

    def remove(self, app_id: str) -> bool:
        """Delete an ended app's directory, logs and records; a running app is refused."""
        row = self.app_row(app_id)
        if row is None:
            return False
        row = self._reconcile(row)
        if row["state"] not in _TERMINAL:
            raise SubmissionError(f"local app '{app_id}' is still {AppState(row['state']).name}; cancel it first")
        import shutil  # not at module level: `tsm status`/`list` never need it

        for path in (row["log_dir"], row["app_dir"]):
            shutil.rmtree(path, ignore_errors=True)
        self.store.write([
            ("DELETE FROM local_replicas WHERE app_id=?", (app_id,)),
            ("DELETE FROM local_apps WHERE app_id=?", (app_id,)),
        ])
        return True

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


#: How many trailing stderr lines a failure report quotes, and at most how many bytes of them.
TAIL_LINES, TAIL_BYTES = 5, 4000


def stderr_tail(rdir: str, lines: int = TAIL_LINES, limit: int = TAIL_BYTES) -> list[str]:
    """The last ``lines`` lines of a replica's stderr file (read from its last ``limit`` bytes), as text."""
    try:
        with open(os.path.join(rdir, "stderr"), "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return []
    text = data.decode("utf-8", "replace").rstrip("\n")
    if not text:
        return []
    out = text.split("\n")
    if size > limit and len(out) > 1:
        out = out[1:]  # the first one is cut
    return [line.rstrip("\r") for line in out[-lines:]]


def create_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """Factory registered as ``local`` (and its alias ``local_cwd``)."""
    return LocalScheduler(session_name, **kwargs)
