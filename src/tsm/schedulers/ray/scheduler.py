"""RayScheduler: the interface, gluing the pure request/status modules to the Ray client.

Local store, per app: ``$TSM_HOME/ray/<app_id>/`` (0700, whatever the mode of ``$TSM_HOME``) holds
``app.json`` (the :class:`AppRecord`, for ``describe``'s AppDef and the cluster's address) and
``tsm_ray_payload_<id>/`` (the driver payload shipped in ``py_modules``), every file 0600. Ray itself keeps
the job (metadata, status) and the driver's status record and the replicas' logs on the nodes' log
directories, read with Ray's log API.

Every call about an app goes to the cluster it was submitted to (the address kept in its ``app.json``), so
``-c address=`` at submission wins over ``$RAY_ADDRESS`` for its whole life.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tsm.errors import InvalidAppError, InvalidRunOptionError, SchedulerError
from tsm.schedulers.api import (
    BatchedViews,
    DescribeAppResponse,
    ListAppResponse,
    LockfileEnvironments,
    PresetAppIds,
    Scheduler,
    Secrets,
    Stream,
)
from tsm.schedulers.common.files import make_private_dirs, write_private
from tsm.schedulers.common.logs import check_log_target, decode, filter_regex, in_window, stream_names
from tsm.schedulers.common.record import AppRecord, with_record
from tsm.schedulers.common.watcher import StatusWatcher
from tsm.schedulers.ray import secrets as ray_secrets, status as st
from tsm.schedulers.ray.client import RayClient, resolve_address
from tsm.schedulers.ray.debug import RayDebug
from tsm.schedulers.ray.request import (
    IMPLICIT_EXCLUDES,
    MAX_WORKING_DIR_BYTES,
    META_STOP_WAIT,
    RayOptions,
    RayRequest,
    build_request,
    format_request,
    node_matches,
    payload_module,
    validate,
)
from tsm.specs.api import AppDef, AppDryRunInfo, Role
from tsm.specs.runopts import CfgVal, runopts
from tsm.store import tsm_home
from tsm.workspace.api import METADATA_KEY, WorkspaceBuilder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.common.viewmodel import AppSummary as AppView
    from tsm.schedulers.ray.view import RayView

_TERMINAL_JOB = {"SUCCEEDED", "FAILED", "STOPPED"}
#: Seconds between two checks of a followed replica's state (one job call and one status-record read).
FOLLOW_CHECK = 1.0


def store_root() -> Path:
    return tsm_home() / "ray"


def parse_log(raw: bytes, names: builtins.list[str], since: datetime | None, until: datetime | None) -> builtins.list[str]:
    """The lines of a replica's log file (records ``<time> <o|e|O|E> <line>``) of the streams ``names``."""
    want = {b"o" if n == "stdout" else b"e" for n in names}
    out: builtins.list[str] = []
    for rec in raw.split(b"\n"):
        if not rec:
            continue
        ts, _, rest = rec.partition(b" ")
        tag, _, body = rest.partition(b" ")
        if tag.lower() not in want:
            continue
        try:
            when: float | None = float(ts)
        except ValueError:
            when = None
        if in_window(when, since, until):
            out.append(decode(body) + ("\n" if tag.islower() else ""))
    return out


class RayScheduler(Scheduler[RayRequest], WorkspaceBuilder[None], BatchedViews, Secrets, RayDebug, PresetAppIds,
                   LockfileEnvironments):
    """Runs an app as a Ray job whose driver starts one actor per replica (see :mod:`tsm.schedulers.ray`).

    Capabilities: ``WorkspaceBuilder`` (the workspace ships as the job's working_dir; without one, the
    launching directory does), ``BatchedViews`` (one job list per view refresh) and exec, stack and
    port-forward (:class:`~tsm.schedulers.ray.debug.RayDebug`), ``PresetAppIds`` (the submission id is
    fixed at dry run), ``Secrets`` (from env or a file, through
    the cluster's store to the driver's memory, never in the job: :mod:`~tsm.schedulers.ray.secrets`),
    ``LockfileEnvironments`` (built on each node before the replicas start: :mod:`~tsm.schedulers.ray.envs`). Not
    ``SizedPlacement``:
    a role without a resource gets :data:`~tsm.schedulers.ray.request.DEFAULT_BUNDLE` per replica (1 CPU, no
    GPU, no memory reservation), as TorchX's Ray scheduler gave such a role.
    """

    def __init__(self, session_name: str, address: str = "") -> None:
        super().__init__("ray", session_name)
        self._address = address
        self._clients: dict[str, RayClient] = {}
        self._final: dict[str, DescribeAppResponse] = {}
        self._lock = threading.Lock()
        self._watchers: dict[str, StatusWatcher[DescribeAppResponse]] = {}
        self._app_addresses: dict[str, str] = {}
        self._view: RayView | None = None

    def client(self, address: str = "") -> RayClient:
        addr = resolve_address(address or self._address)
        with self._lock:
            if addr not in self._clients:
                self._clients[addr] = RayClient(addr)
            return self._clients[addr]

    def app_record(self, app_id: str) -> AppRecord | None:
        """The record tsm wrote of an app at submit (``app.json``: its definition, its cluster), if any."""
        return AppRecord.load(store_root() / app_id / "app.json") if app_id and "/" not in app_id else None

    def address_of(self, app_id: str) -> str:
        """The cluster an app was submitted to (kept in its ``app.json``), else this scheduler's default."""
        with self._lock:
            known = self._app_addresses.get(app_id)
        if known is not None:
            return known
        rec = self.app_record(app_id)
        addr = resolve_address(str((rec.details if rec is not None else {}).get("address") or self._address))
        if rec is not None:
            with self._lock:
                self._app_addresses[app_id] = addr
        return addr

    def _watcher(self, address: str) -> StatusWatcher[DescribeAppResponse]:
        """The status batcher of one cluster: one ``list_jobs`` per refresh for every app on it."""
        with self._lock:
            w = self._watchers.get(address)
            if w is None:
                w = self._watchers[address] = StatusWatcher(
                    lambda: self._snapshot(address), self._lookup, is_terminal=lambda d: d.state.is_terminal)
            return w

    # -- requests -----------------------------------------------------------------------------------------
    def run_opts(self) -> runopts:
        return RayOptions.runopts()

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        validate(app)

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[RayRequest]:
        opts = RayOptions.from_cfg(cfg)
        req = build_request(app, opts, self.session_name, resolve_address(opts.address or self._address), time.time())
        if not req.working_dir and self._ships_cwd(app, opts):
            req.working_dir = req.working_dir_source = os.getcwd()
            req.implicit_working_dir = True
        return AppDryRunInfo(request=req, fmt=format_request)

    @staticmethod
    def _ships_cwd(app: AppDef, opts: RayOptions) -> bool:
        """Without ``--workspace``, the launching directory is the job's ``working_dir`` (as TorchX's Ray
        scheduler shipped it), so ``--script train.py`` -- checked to exist here at dry run -- runs from it.

        Only when some role has no image (runs "from here"). Ray zips it at submission, leaving out what
        ``.gitignore`` lists and :data:`~tsm.schedulers.ray.request.IMPLICIT_EXCLUDES`; with the run option
        ``ship_cwd=False`` nothing is shipped and replicas start in the Ray worker's directory (give absolute
        paths every node has).
        """
        if not opts.ship_cwd or all(r.image for r in app.roles):
            return False
        cwd = os.getcwd()
        home = os.path.realpath(tsm_home())
        if home == os.path.realpath(cwd) or home.startswith(os.path.realpath(cwd) + os.sep):
            raise InvalidRunOptionError(
                f"the launching directory {cwd} holds tsm's home ({home}), so it is not shipped as the Ray job's "
                "working directory: launch from your project directory, give --workspace DIR, or "
                "-c ship_cwd=False with absolute paths")
        return True

    def check_feasible(self, req: RayRequest) -> None:
        """Refuse a replica no node of the cluster could ever hold (Ray would leave it pending forever), an
        ``exclude_nodes`` entry that names no node the cluster knows (a typo would exclude nothing), and an
        exclusion that leaves no alive node."""
        excl = req.payload.exclude_nodes
        if not excl:
            nodes = self.client(req.address).nodes()
        else:
            known = self.client(req.address).node_details()

            def named(n: dict[str, Any], entry: str) -> bool:
                return node_matches(entry, str(n.get("node_id") or ""), str(n.get("node_ip") or ""),
                                    str(n.get("node_name") or ""))

            for entry in excl:
                if not any(named(n, entry) for n in known):
                    raise InvalidRunOptionError(
                        f"run option exclude_nodes: {entry!r} names no node of the Ray cluster at {req.address} "
                        "(give node ids, IP addresses or hostnames, as `ray list nodes` shows them)")
            alive = [n for n in known if n.get("state") == "ALIVE"]
            nodes = [dict(n.get("resources_total") or {}) for n in alive
                     if not any(named(n, e) for e in excl)]
            if not nodes:
                raise InvalidRunOptionError(
                    f"run option exclude_nodes={','.join(excl)} excludes every alive node of the Ray cluster at "
                    f"{req.address} ({len(alive)} node(s)): nothing could run the app")
        for r in req.payload.replicas:
            if not any(all(n.get(k, 0.0) >= v for k, v in r.bundle.items()) for n in nodes):
                have = "; ".join(
                    ", ".join(f"{k}={n.get(k, 0.0):g}" for k in r.bundle) for n in nodes) or "no alive node"
                raise InvalidAppError(
                    f"role '{r.role}' asks for {', '.join(f'{k}={v:g}' for k, v in r.bundle.items())} per replica, "
                    f"more than any node of the Ray cluster has ({have}): lower the role's resource"
                )

    def schedule(self, dryrun_info: AppDryRunInfo[RayRequest]) -> str:
        req = dryrun_info.request
        values: dict[str, str] = {}
        if req.secrets:  # read now, before anything is written: they go to the cluster apart from the job
            from tsm.specs.secrets import parse_secret, resolve

            values = resolve([parse_secret(s) for s in req.secrets])
        self.check_feasible(req)
        app_dir = store_root() / req.app_id
        pkg = app_dir / payload_module(req.app_id)
        make_private_dirs(pkg)  # 0700 whatever $TSM_HOME's mode: the payload holds the roles' env values
        write_private(pkg / "__init__.py", "")
        write_private(pkg / "payload.json", req.payload.to_json())
        # the request's spec when a role has an environment: it names each one's key (``tsm describe``)
        envs = any(r.environment for r in req.payload.roles)
        app = AppDef.from_dict(req.spec) if envs or dryrun_info.app is None else dryrun_info.app
        write_private(app_dir / "app.json",
                      AppRecord("ray", req.session, app, os.getcwd(), {"address": req.address}).to_json())
        with self._lock:
            self._app_addresses[req.app_id] = req.address
        import tsm

        runtime_env: dict[str, Any] = dict(req.runtime_env)
        runtime_env["py_modules"] = [os.path.dirname(tsm.__file__), str(pkg)]
        runtime_env["excludes"] = ["__pycache__", "*.pyc"]
        if req.working_dir:
            runtime_env["working_dir"] = req.working_dir
        if req.implicit_working_dir:
            runtime_env["excludes"] += IMPLICIT_EXCLUDES
        if req.secrets and req.working_dir:  # a token file kept in the shipped directory stays here
            runtime_env["excludes"] += ray_secrets.excludes(req.secrets, req.working_dir_source or req.working_dir)
        uri = req.payload.secrets_uri
        c = self.client(req.address)
        try:
            c.submit(entrypoint=req.entrypoint, submission_id=req.app_id, metadata=dict(req.metadata),
                     runtime_env=runtime_env, entrypoint_num_cpus=0,
                     packages={uri: ray_secrets.encode(values)} if values else None)
        except BaseException:
            if values:  # put but never submitted: withdrawn at once rather than when Ray's pin ends
                with contextlib.suppress(Exception):
                    ray_secrets.scrub(c, uri)
            raise
        self._watcher(req.address).submitted(req.app_id)
        return req.app_id

    # -- workspaces --------------------------------------------------------------------------------------
    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        """Snapshot ``workspace`` (the dir workspace) and make the snapshot the job's ``working_dir``.

        The snapshot is named by its content hash and Ray names the uploaded package by the hash of its
        content, so an unchanged workspace is neither copied nor uploaded again. Replicas start in it.
        """
        self._ship(role, workspace, implicit=False)

    @staticmethod
    def _ship(role: Role, workspace: str, implicit: bool) -> None:
        """Snapshot ``workspace`` and record it in the role's metadata as the job's ``working_dir``."""
        from tsm.workspace.dir import DirWorkspace

        report = DirWorkspace().build(workspace)
        if report.bytes > MAX_WORKING_DIR_BYTES:
            raise InvalidRunOptionError(
                f"{'the launching directory' if implicit else 'workspace'} {os.path.abspath(workspace)} holds "
                f"{report.bytes} bytes, more than Ray takes as a working directory ({MAX_WORKING_DIR_BYTES} bytes): "
                "list what to leave out in .tsmignore, give --workspace DIR with only what the job needs, or "
                "-c ship_cwd=False with absolute paths")
        role.metadata[METADATA_KEY] = {
            "workspace": os.path.abspath(workspace), "digest": report.digest, "snapshot": report.snapshot,
            "files": report.files, "bytes": report.bytes, "ray_working_dir": report.snapshot,
            "reused": report.reused, "files_copied": report.files_copied, "bytes_copied": report.bytes_copied,
            "implicit": implicit,
        }

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Nothing to push: the workspace travels as the job's ``working_dir``."""
        return None

    def push_images(self, images_to_push: None) -> None:
        """Nothing to push (see :meth:`dryrun_push_images`)."""

    # -- status -------------------------------------------------------------------------------------------
    def record_of(self, job: Any, address: str = "") -> dict[str, Any] | None:
        """The driver's status record of ``job`` (its replicas' states, nodes, exits), None before the first."""
        return st.parse_record(self.client(address).read(getattr(job, "driver_node_id", "") or "",
                                                         f"tsm/{job.submission_id}/status.json"))

    def _describe_job(self, job: Any, address: str = "") -> DescribeAppResponse:
        app_id = str(job.submission_id)
        if app_id in self._final:
            return self._final[app_id]
        status = st.job_status(job)
        d = st.describe(app_id, status, str(job.message or ""), dict(job.metadata or {}), self.record_of(job, address))
        if status in _TERMINAL_JOB:
            self._final[app_id] = d
        return d

    def _snapshot(self, address: str) -> dict[str, DescribeAppResponse]:
        return {str(j.submission_id): self._describe_job(j, address) for j in self.client(address).list_jobs()
                if st.is_tsm_job(j.metadata) and j.submission_id}

    def _lookup(self, ids: builtins.list[str]) -> dict[str, DescribeAppResponse]:
        return {}

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        return with_record(self._watcher(self.address_of(app_id)).get(app_id), store_root() / app_id / "app.json")

    def view_snapshot(self, app_ids: Sequence[str]) -> builtins.list[AppView]:
        """The views' batch hook (:class:`tsm.schedulers.api.BatchedViews`): every app of ``app_ids`` from one
        ``list_jobs`` call (plus, per app, its driver's status record when it changed or got old); see
        :mod:`tsm.schedulers.ray.view`."""
        if self._view is None:
            from tsm.schedulers.ray.view import RayView

            self._view = RayView(self)
        return self._view.snapshot(app_ids)

    def list(self) -> builtins.list[ListAppResponse]:
        rows = [st.list_row(str(j.submission_id), st.job_status(j), dict(j.metadata or {}))
                for j in self.client().list_jobs() if st.is_tsm_job(j.metadata) and j.submission_id]
        return sorted(rows, key=lambda r: -(r.created or 0))

    # -- cancel -------------------------------------------------------------------------------------------
    def cancel(self, app_id: str) -> None:
        """``ray job stop``: the driver stops every replica (SIGTERM, SIGKILL after the grace period) and kills
        the actors; returns once the job has ended and no actor of the app is left."""
        current = self.describe(app_id)
        if current is None or current.state.is_terminal:
            return
        c = self.client(self.address_of(app_id))
        c.stop(app_id)
        self._scrub(app_id)
        warn = self._warn_wait(app_id)
        deadline = time.monotonic() + 120 + warn
        while time.monotonic() < deadline:
            job = c.job(app_id)
            if job is None or st.job_status(job) in _TERMINAL_JOB:
                break
            time.sleep(0.2)
        while time.monotonic() < deadline and c.actors(app_id):
            time.sleep(0.2)
        self._watcher(c.address).invalidate()

    def remove(self, app_id: str) -> bool:
        """Ray keeps the ended app (its job, its logs on the nodes) and tsm its record; only secrets a driver
        never took (a job stopped or failed before its driver ran) are withdrawn. False: nothing removed."""
        self._scrub(app_id)
        return False

    def _scrub(self, app_id: str) -> None:
        """Overwrite the app's secrets in the cluster's store if its driver has not taken them (:mod:`.secrets`);
        a head that does not answer leaves them to Ray's pin, which ends within minutes."""
        uri = ray_secrets.recorded_uri(store_root() / app_id, payload_module(app_id)) if "/" not in app_id else ""
        if uri:
            with contextlib.suppress(SchedulerError):
                ray_secrets.scrub(self.client(self.address_of(app_id)), uri)

    def _warn_wait(self, app_id: str) -> float:
        """Seconds a cancel of ``app_id`` may spend warning its replicas (the job's stop wait beyond Ray's
        default, set at submission with a ``warn_signal``); 0 when unknown."""
        job = self.client(self.address_of(app_id)).job(app_id)
        try:
            return float(job.metadata.get(META_STOP_WAIT, 0)) if job is not None else 0.0
        except (TypeError, ValueError):
            return 0.0

    # -- logs ---------------------------------------------------------------------------------------------
    def _roles(self, app_id: str) -> dict[str, int] | None:
        """``{role: replica count}`` from the job's metadata; None when Ray has no tsm job ``app_id``."""
        job = self.client(self.address_of(app_id)).job(app_id)
        if job is None or not st.is_tsm_job(job.metadata):
            return None
        return dict(st.shape(dict(job.metadata)))

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
        check_log_target("ray", app_id, self._roles(app_id), role_name, k)
        names = stream_names(streams)
        return filter_regex(regex, self._lines(app_id, role_name, k, names, since, until, should_tail))

    def _replica(self, app_id: str, role: str, k: int) -> tuple[dict[str, Any], bool]:
        """The replica's record entry and whether it (and so its log) has ended for good."""
        c = self.client(self.address_of(app_id))
        job = c.job(app_id)
        if job is None:
            return {}, True
        rec = self.record_of(job, c.address)
        ended = st.job_status(job) in _TERMINAL_JOB
        rep = st.replica_of(rec, role, k)
        if rep.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED") and rec is not None:
            ended = ended or rec.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED") or rep.get("state") == "SUCCEEDED"
        return rep, ended

    def _lines(self, app_id: str, role: str, k: int, names: builtins.list[str], since: datetime | None,
               until: datetime | None, tail: bool) -> Iterator[str]:
        """The replica's lines, attempt after attempt; following, the running attempt's file is *streamed*
        (Ray's log stream sends each addition once) and the replica's state is checked every
        :data:`FOLLOW_CHECK` seconds, instead of downloading the whole file on every poll."""
        c = self.client(self.address_of(app_id))
        rep, ended = self._replica(app_id, role, k)
        attempt = 0
        while True:
            node = str(rep.get("node_id") or "")
            last = int(rep.get("attempt") or 0)
            for a in range(attempt, last):  # attempts that ended: read each once, from the node it ran on
                yield from parse_log(self._read_attempt(c, rep, a, f"tsm/{app_id}/{role}.{k}.{a}.log"), names,
                                     since, until)
            attempt = last
            name = f"tsm/{app_id}/{role}.{k}.{last}.log"
            if not tail or ended:
                yield from parse_log(c.read(node, name) or b"", names, since, until)
                return
            seen = 0  # whole records of this attempt already handled
            where = {"node": node}  # filled in by the follower once the replica is placed
            for chunk_records in self._follow(c, where, name, app_id, role, k, last):
                yield from parse_log(b"".join(chunk_records), names, since, until)
                seen += len(chunk_records)
            # the attempt ended, or another began: what the stream had not sent yet, from one last read
            rep, ended = self._replica(app_id, role, k)
            node = str(rep.get("node_id") or where["node"])
            rest = (c.read(node, name) or b"").split(b"\n")[seen:]
            yield from parse_log(b"\n".join(rest), names, since, until)
            if int(rep.get("attempt") or 0) == last:
                return  # ended for good
            attempt = last + 1

    @staticmethod
    def _read_attempt(c: RayClient, rep: dict[str, Any], attempt: int, name: str) -> bytes:
        """An ended attempt's log file, from the node it ran on (``nodes`` of the replica's record), else from
        the replica's current node; b"" when neither has it (its node was lost, with the file)."""
        nodes = rep.get("nodes") or []
        first = str(nodes[attempt]) if attempt < len(nodes) and nodes[attempt] else ""
        current = str(rep.get("node_id") or "")
        for node in dict.fromkeys(n for n in (first, current) if n):
            try:
                data = c.read(node, name)
            except SchedulerError:  # the node is gone: its agent does not answer
                data = None
            if data is not None:
                return data
        return b""

    def _follow(self, c: RayClient, where: dict[str, str], name: str, app_id: str, role: str, k: int,
                attempt: int) -> Iterator[builtins.list[bytes]]:
        """Whole records (each with its newline) of a running attempt's file as they are written, until the
        replica ends or starts another attempt. A reader thread holds the stream (reopened, skipping what was
        seen, when the head closes it); this generator checks the replica's state between chunks."""
        import queue

        chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=64)  # bounded: a slow reader slows the stream
        stop = threading.Event()

        def reader() -> None:
            try:
                while not stop.is_set():
                    stream = c.stream(where["node"], name)
                    if stream is None:
                        if stop.wait(FOLLOW_CHECK):
                            return
                        continue
                    try:
                        for data in stream:
                            while not stop.is_set():
                                try:
                                    chunks.put(data, timeout=FOLLOW_CHECK)
                                    break
                                except queue.Full:
                                    continue
                            if stop.is_set():
                                return
                    finally:
                        stream.close()  # type: ignore[attr-defined]
                    chunks.put(None)  # the head closed the stream: start over (the file again, from its start)
            except Exception:  # noqa: BLE001 - the follower falls back to its last read
                stop.set()
                chunks.put(None)

        threading.Thread(target=reader, name=f"tsm-ray-follow-{app_id}", daemon=True).start()
        buf, seen, passed = b"", 0, 0  # partial record; records of this stream pass; records handed out
        last_check = time.monotonic()
        try:
            while True:
                try:
                    data = chunks.get(timeout=FOLLOW_CHECK)
                except queue.Empty:
                    data = b""
                if data is None:  # a new stream resends the file from its start
                    if stop.is_set():
                        return
                    buf, seen = b"", 0
                    continue
                if data:
                    buf += data
                    recs = buf.split(b"\n")
                    buf = recs.pop()
                    new = [r + b"\n" for r in recs]
                    fresh = new[max(0, passed - seen):]
                    seen += len(new)
                    if fresh:
                        passed += len(fresh)
                        yield fresh
                if time.monotonic() - last_check >= FOLLOW_CHECK:
                    last_check = time.monotonic()
                    rep, ended = self._replica(app_id, role, k)
                    where["node"] = str(rep.get("node_id") or where["node"])
                    if ended or int(rep.get("attempt") or 0) != attempt:
                        return
        finally:
            stop.set()

    def close(self) -> None:
        self._clients.clear()
