"""The :class:`Snapshot` model behind ``tsm top`` and ``tsm serve``, and the one batched refresh that fills it.

A snapshot lists the newest apps launched through tsm (the store's ``apps`` table) with their roles and
replicas: state, host, attempt, exit code, last log line, requested and used CPU / memory / GPU.

**Cost of a refresh** (:meth:`SnapshotCollector.refresh`), whatever the number of apps and replicas:

* the history: one store query;
* the local scheduler: two store queries (``local_apps``, ``local_replicas``) plus one walk of the
  process table (:class:`~tsm.views.usage.UsageProbe`) and the tail of each replica's log files,
  re-read only when a file grew;
* any other scheduler that offers the batch hook :class:`BatchSnapshot` (a ``view_snapshot`` method):
  one call to it, which makes one batched query of its backend (Slurm: one ``squeue`` plus one ``sstat``,
  :mod:`tsm.schedulers.slurm.view`; Docker: one container list, :mod:`tsm.schedulers.docker.view`; Ray:
  one job list, :mod:`tsm.schedulers.ray.view`). A scheduler without the hook is asked with one
  ``list()`` plus one ``describe()`` per *app* still running (never per replica); an ended app is
  described once and remembered, since terminal states are sticky.

Usage and last log lines of local replicas can be limited to the apps a view shows them for
(``refresh(detail=...)``): ``tsm top`` shows them for the selected app only.

:attr:`Snapshot.calls` counts these calls per source, so the cost is a figure a test can check.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from tsm.specs.api import AppState
from tsm.views.usage import Usage, UsageProbe

#: How many of the newest apps a snapshot shows by default.
DEFAULT_LIMIT = 200
#: AppState by its stored value (a dict lookup: 1,000 replicas a tick make ``AppState(v)`` show in profiles).
_STATE = {s.value: s for s in AppState}
#: Bytes read from the end of a log file to find its last line.
_TAIL_BYTES = 4096


@dataclass
class ReplicaView:
    """One replica as the views show it; usage fields are None where they cannot be measured (``n/a``)."""

    role: str
    idx: int
    state: str
    host: str = ""
    attempt: int = 0  #: restarts so far (0: first attempt)
    exit_code: int | None = None
    error: str = ""
    last_line: str = ""
    pid: int | None = None
    cpu_req: float | None = None  #: cores requested
    mem_req_mb: float | None = None
    gpu_req: int | None = None
    cpu_used: float | None = None  #: cores in use
    mem_used_mb: float | None = None
    gpu_mem_mb: float | None = None


@dataclass
class AppView:
    """One app: identity, state, timing, restarts, why it failed, and its replicas."""

    handle: str
    scheduler: str
    app_id: str
    name: str
    state: str
    created: float | None = None
    started: float | None = None
    ended: float | None = None
    restarts: int = 0
    last_error: str = ""
    replicas: list[ReplicaView] = field(default_factory=list)

    def age(self, now: float) -> float | None:
        """Seconds since the app was submitted."""
        return None if self.created is None else max(0.0, now - self.created)

    def duration(self, now: float) -> float | None:
        """Seconds it has run (or ran): from start (else submission) to its end (else now)."""
        begin = self.started if self.started is not None else self.created
        if begin is None:
            return None
        return max(0.0, (self.ended if self.ended is not None else now) - begin)

    @property
    def terminal(self) -> bool:
        """True once the app has ended (its state will not change)."""
        return AppState[self.state].is_terminal if self.state in AppState.__members__ else False

    def to_dict(self, now: float) -> dict[str, Any]:
        """JSON-ready form, with ``age`` and ``duration`` computed at ``now``."""
        d = asdict(self)
        d["age"], d["duration"] = self.age(now), self.duration(now)
        return d


@dataclass
class Snapshot:
    """Every app a view shows at one instant, and what the refresh cost."""

    taken: float
    apps: list[AppView]
    calls: dict[str, int] = field(default_factory=dict)  #: source -> calls made for this refresh
    errors: dict[str, str] = field(default_factory=dict)  #: scheduler -> why it could not be read

    def app(self, key: str) -> AppView | None:
        """The app whose handle or app id is ``key``."""
        return next((a for a in self.apps if key in (a.handle, a.app_id)), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``/api/apps`` returns)."""
        return {
            "taken": self.taken, "calls": dict(self.calls), "errors": dict(self.errors),
            "apps": [a.to_dict(self.taken) for a in self.apps],
        }


@runtime_checkable
class BatchSnapshot(Protocol):
    """The optional hook a scheduler adds to be shown in one call per tick.

    ``view_snapshot(app_ids)`` returns an :class:`AppView` for each of ``app_ids`` it knows (ids it does
    not know are left out), built from one batched query of its backend (a label-selected list, one
    ``squeue``, one State API call). ``handle`` may be left empty; the collector fills it in.
    """

    def view_snapshot(self, app_ids: Sequence[str]) -> list[AppView]: ...


def requests_of(spec: dict[str, Any]) -> dict[str, tuple[float | None, float | None, int | None]]:
    """role name -> (cpu, memMB, gpu) requested, None where the role asked for nothing (-1)."""
    out: dict[str, tuple[float | None, float | None, int | None]] = {}
    for r in spec.get("roles", []):
        res = r.get("resource") or {}

        def pos(v: Any) -> Any:
            return v if isinstance(v, (int, float)) and v >= 0 else None

        out[r.get("name", "")] = (pos(res.get("cpu")), pos(res.get("memMB")), pos(res.get("gpu")))
    return out


class LastLines:
    """The last line of each log file, re-read only when the file's size or mtime changed.

    Used by the local refresh and by the batch hooks of backends whose replica logs are files this host
    can read (Slurm's job directory). A file whose replica has ended is not even looked at again once read
    (``final``). :meth:`prune` after each tick forgets the files that tick did not ask about.
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, int, str]] = {}  # path -> (size, mtime_ns, line)
        self._sealed: set[str] = set()  # files read once their replica had ended: not looked at again
        self._asked: set[str] = set()

    def _line(self, path: str, final: bool = False) -> tuple[str, int]:
        self._asked.add(path)
        hit = self._cache.get(path)
        if final and hit is not None and path in self._sealed:
            return hit[2], hit[1]
        if final:
            self._sealed.add(path)  # this look, after the end, is the last one
        try:
            st = os.stat(path)
        except OSError:
            return "", 0
        if hit is not None and hit[:2] == (st.st_size, st.st_mtime_ns):
            return hit[2], hit[1]
        line = ""
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                data = os.pread(fd, _TAIL_BYTES, max(0, st.st_size - _TAIL_BYTES))
            finally:
                os.close(fd)
            for raw in reversed(data.replace(b"\r", b"\n").split(b"\n")):
                if raw.strip():
                    line = raw.decode("utf-8", "replace")
                    break
        except OSError:
            pass
        self._cache[path] = (st.st_size, st.st_mtime_ns, line)
        return line, st.st_mtime_ns

    def prune(self) -> None:
        """Forget the files not asked about since the last prune (replicas of apps that left the view)."""
        if len(self._cache) > len(self._asked):
            self._cache = {k: v for k, v in self._cache.items() if k in self._asked}
        self._sealed &= self._asked
        self._asked = set()

    def last(self, rdir: str, final: bool = False) -> str:
        """The last non-empty line the replica wrote to stdout or stderr, whichever was written last."""
        return self.last_of(f"{rdir}{os.sep}stdout", f"{rdir}{os.sep}stderr", final)

    def last_of(self, stdout: str, stderr: str, final: bool = False) -> str:
        """The last non-empty line of the two files ``stdout`` and ``stderr``, whichever was written last.

        ``final``: the replica has ended, so files already read are not looked at again.
        """
        out, t_out = self._line(stdout, final)
        err, t_err = self._line(stderr, final)
        if out and err:
            return err if t_err > t_out else out
        return out or err


class SnapshotCollector:
    """Builds snapshots; keep one across ticks (it remembers CPU times, log tails and ended apps).

    ``store`` is the :class:`tsm.store.Store` to read (default: the one under ``$TSM_HOME``);
    ``runner`` gives the other schedulers (default: :func:`tsm.runner.api.get_runner` on first use).
    """

    def __init__(
        self, store: Any = None, runner: Any = None, limit: int | None = DEFAULT_LIMIT, probe: UsageProbe | None = None
    ) -> None:
        if store is None:
            from tsm.store import Store

            store = Store()
        self.store = store
        self._runner = runner
        self.limit = limit
        self.probe = probe if probe is not None else UsageProbe()
        self._tails = LastLines()
        self._ended: dict[str, AppView] = {}  # handle -> view of an ended app on a non-local scheduler
        self._reqs: dict[str, dict[str, tuple[float | None, float | None, int | None]]] = {}  # app id -> requests
        self._host = socket.gethostname()

    @property
    def runner(self) -> Any:
        """The runner used for schedulers other than local (created on first use)."""
        if self._runner is None:
            from tsm.runner.api import get_runner

            self._runner = get_runner()
        return self._runner

    def refresh(self, detail: Collection[str] | None = None) -> Snapshot:
        """One snapshot of the ``limit`` newest apps: one batched call per scheduler (see the module doc).

        ``detail``: handles of the apps whose local replicas need usage and last log lines (None: all). A
        view that shows them for one app at a time (``tsm top``) passes that app, so a tick with 1,000
        running local replicas reads the process table and log files of that app's replicas only; the
        others keep their usage ``None`` and an empty last line.
        """
        from tsm.history import History

        calls: dict[str, int] = {"store": 0}
        errors: dict[str, str] = {}
        rows = History(self.store).recent(self.limit)
        calls["store"] += 1
        by_sched: dict[str, list[Any]] = {}
        for r in rows:
            by_sched.setdefault(r.scheduler, []).append(r)
        views: dict[str, AppView] = {}
        wanted = None if detail is None else {r.app_id for r in rows if r.handle in detail}
        for name, recs in by_sched.items():
            try:
                if name in ("local", "local_cwd"):
                    got = self._local([r.app_id for r in recs], calls, wanted)
                else:
                    got = self._other(name, recs, calls)
            except Exception as e:  # noqa: BLE001 - one unreachable backend must not hide the others
                errors[name] = f"{type(e).__name__}: {e}"
                got = {}
            for r in recs:
                v = got.get(r.app_id)
                if v is None:
                    v = AppView(r.handle, r.scheduler, r.app_id, r.name, r.state.name, created=r.created)
                v.handle, v.scheduler, v.name = r.handle, r.scheduler, v.name or r.name
                views[r.handle] = v
        self._usage([a for a in views.values() if a.scheduler in ("local", "local_cwd")
                     and (detail is None or a.handle in detail)], calls)
        shown = {r.app_id for r in rows}  # forget what belongs to apps no longer shown (a long-lived view)
        self._reqs = {k: v for k, v in self._reqs.items() if k in shown}
        self._ended = {k: v for k, v in self._ended.items() if k in views}
        self._tails.prune()
        return Snapshot(time.time(), [views[r.handle] for r in rows], calls, errors)

    # -- local -------------------------------------------------------------------------------------
    def _local(self, app_ids: Sequence[str], calls: dict[str, int],
               detail: Collection[str] | None = None) -> dict[str, AppView]:
        """Views of local apps from two store queries, whatever their number of replicas; the last log lines
        of the replicas of ``detail`` (app ids; None: all)."""
        from tsm.schedulers.local.logs import replica_dir

        if not app_ids:
            return {}
        marks = ",".join("?" * len(app_ids))
        apps = self.store.query(f"SELECT * FROM local_apps WHERE app_id IN ({marks})", tuple(app_ids))
        reps = self.store.query(
            f"SELECT * FROM local_replicas WHERE app_id IN ({marks}) ORDER BY app_id, rowid", tuple(app_ids)
        )
        calls["store"] += 2
        stale = [a["app_id"] for a in apps if self._supervisor_gone(a)]
        if stale:  # rare: let the scheduler record why (one describe per such app, once)
            sched = self.runner._scheduler("local")
            for app_id in stale:
                calls["local.describe"] = calls.get("local.describe", 0) + 1
                sched.describe(app_id)
            return self._local(app_ids, calls, detail)
        by_app: dict[str, list[Any]] = {}
        for rep in reps:
            by_app.setdefault(rep["app_id"], []).append(rep)
        out: dict[str, AppView] = {}
        for a in apps:
            req = self._reqs.get(a["app_id"])
            if req is None:  # an app's spec never changes: parsed once
                req = self._reqs[a["app_id"]] = requests_of(json.loads(a["spec"]))
            view = AppView(
                handle="", scheduler="local", app_id=a["app_id"], name=a["name"], state=_STATE[a["state"]].name,
                created=a["created"], started=a["started"], ended=a["ended"], restarts=a["num_restarts"],
                last_error=a["msg"] if _STATE[a["state"]] == AppState.FAILED else "",
            )
            tails = detail is None or a["app_id"] in detail
            for rep in by_app.get(a["app_id"], []):
                cpu, mem, gpu = req.get(rep["role"], (None, None, None))
                state = _STATE[rep["state"]]
                view.replicas.append(ReplicaView(
                    role=rep["role"], idx=rep["idx"], state=state.name, host=self._host, attempt=rep["restarts"],
                    exit_code=rep["exit_code"], error=rep["error"], pid=rep["pid"] if not state.is_terminal else None,
                    cpu_req=cpu, mem_req_mb=mem, gpu_req=gpu,
                    last_line=self._tails.last(replica_dir(a["log_dir"], rep["role"], rep["idx"]), state.is_terminal)
                    if tails else "",
                ))
            if view.state == "FAILED" and not view.last_error:
                view.last_error = next((r.error for r in view.replicas if r.error), "")
            out[a["app_id"]] = view
        return out

    @staticmethod
    def _supervisor_gone(row: Any) -> bool:
        """True when a running app's supervisor and watchdog are both known to be gone (state is stale)."""
        from tsm.schedulers.local import _os

        if _STATE[row["state"]].is_terminal or not row["sup_pid"]:
            return False
        try:
            return not (_os.is_alive(row["sup_pid"], row["sup_start"])
                        or _os.is_alive(row["watchdog_pid"], row["watchdog_start"]))
        except OSError:
            return False

    def _usage(self, apps: list[AppView], calls: dict[str, int]) -> None:
        """Fill in CPU / memory / GPU used by running local replicas: one process-table walk."""
        running = [r for a in apps for r in a.replicas if r.pid]
        if not running:
            return
        before = self.probe.scans
        usage = self.probe.sample(r.pid for r in running if r.pid)
        calls["proc"] = calls.get("proc", 0) + self.probe.scans - before
        for r in running:
            u = usage.get(r.pid or 0, Usage())
            r.cpu_used, r.mem_used_mb, r.gpu_mem_mb = u.cpu, u.mem_mb, u.gpu_mem_mb

    # -- any other scheduler -----------------------------------------------------------------------
    def _other(self, name: str, recs: list[Any], calls: dict[str, int]) -> dict[str, AppView]:
        """Views from the scheduler's batch hook, else one list() plus one describe() per running app."""
        sched = self.runner._scheduler(name)
        if isinstance(sched, BatchSnapshot):
            calls[f"{name}.view_snapshot"] = calls.get(f"{name}.view_snapshot", 0) + 1
            return {v.app_id: v for v in sched.view_snapshot([r.app_id for r in recs])}
        out: dict[str, AppView] = {}
        pending = [r for r in recs if r.handle not in self._ended]
        for r in recs:
            if r.handle in self._ended:
                out[r.app_id] = self._ended[r.handle]
        if not pending:
            return out
        calls[f"{name}.list"] = calls.get(f"{name}.list", 0) + 1
        listed = {a.app_id: a for a in sched.list()}
        for r in pending:
            if r.app_id not in listed and r.state.is_terminal:
                continue  # gone from the backend: the history's last state stands
            calls[f"{name}.describe"] = calls.get(f"{name}.describe", 0) + 1
            desc = sched.describe(r.app_id)
            if desc is None:
                continue
            view = _from_describe(r, desc)
            if desc.state.is_terminal:
                self._ended[r.handle] = view
            out[r.app_id] = view
        return out


def _from_describe(rec: Any, desc: Any) -> AppView:
    """An :class:`AppView` from a scheduler's ``DescribeAppResponse`` and the history's row ``rec``."""
    view = view_of_describe(desc, rec.scheduler, handle=rec.handle, name=rec.name)
    view.created = view.created or rec.created
    return view


def settled(view: AppView) -> bool:
    """True once the app and every replica of it have ended: its view will not change (a hook may keep it).

    An app is terminal as soon as one replica fails, while the others are still being stopped.
    """
    return view.terminal and all(
        r.state in AppState.__members__ and AppState[r.state].is_terminal for r in view.replicas
    )


def view_of_describe(
    desc: Any, scheduler: str, handle: str = "", name: str = "",
    reqs: dict[str, tuple[float | None, float | None, int | None]] | None = None,
) -> AppView:
    """An :class:`AppView` from a scheduler's ``DescribeAppResponse`` (usage left n/a).

    What the batch hooks of the backends build their views from; ``reqs`` (role -> requests, see
    :func:`requests_of`) saves parsing the app again when the caller keeps it.
    """
    req = reqs if reqs is not None else (requests_of(desc.app.to_dict()) if desc.app is not None else {})
    error = desc.msg if desc.state == AppState.FAILED else ""
    if desc.structured_error_msg:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            error = json.loads(desc.structured_error_msg).get("message") or error
    if not name and desc.app is not None:
        name = desc.app.name
    view = AppView(handle, scheduler, desc.app_id, name, desc.state.name,
                   created=desc.created, restarts=desc.num_restarts, last_error=error)
    for role in desc.roles_statuses:
        cpu, mem, gpu = req.get(role.role, (None, None, None))
        for rep in role.replicas:
            view.replicas.append(ReplicaView(
                role=role.role, idx=rep.id, state=rep.state.name, host=rep.hostname or "",
                attempt=getattr(rep, "restarts", 0) or 0, exit_code=getattr(rep, "exit_code", None),
                error=getattr(rep, "error_msg", "") or "", cpu_req=cpu, mem_req_mb=mem, gpu_req=gpu,
            ))
    if view.state == "FAILED" and not view.last_error:
        view.last_error = next((r.error for r in view.replicas if r.state == "FAILED" and r.error), "")
    return view
