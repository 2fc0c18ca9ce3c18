"""RayScheduler: the interface, gluing the pure request/status modules to the Ray client.

Local store, per app: ``$TSM_HOME/ray/<app_id>/`` holds ``app.json`` (the :class:`AppRecord`, for
``describe``'s AppDef) and ``tsm_ray_payload_<id>/`` (the driver payload shipped in ``py_modules``). Ray
itself keeps the job (metadata, status) and the driver's status record and the replicas' logs on the
nodes' log directories, read with Ray's log API.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tsm.errors import InvalidAppError
from tsm.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, Stream
from tsm.schedulers.common.logs import check_log_target, decode, filter_regex, in_window, stream_names
from tsm.schedulers.common.record import AppRecord, with_record
from tsm.schedulers.common.watcher import StatusWatcher
from tsm.schedulers.ray import status as st
from tsm.schedulers.ray.client import RayClient, resolve_address
from tsm.schedulers.ray.request import (
    RayOptions,
    RayRequest,
    build_request,
    format_request,
    payload_module,
    validate,
)
from tsm.specs.api import AppDef, AppDryRunInfo, Role
from tsm.specs.runopts import CfgVal, runopts
from tsm.store import tsm_home
from tsm.workspace.api import METADATA_KEY, WorkspaceBuilder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.ray.view import RayView
    from tsm.views.snapshot import AppView

_TERMINAL_JOB = {"SUCCEEDED", "FAILED", "STOPPED"}


def store_root() -> Path:
    return tsm_home() / "ray"


def _job_status(job: Any) -> str:
    s = getattr(job, "status", "")
    return str(getattr(s, "value", s))


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


class RayScheduler(Scheduler[RayRequest], WorkspaceBuilder[None]):
    """Runs an app as a Ray job whose driver starts one actor per replica (see :mod:`tsm.schedulers.ray`)."""

    def __init__(self, session_name: str, address: str = "") -> None:
        super().__init__("ray", session_name)
        self._address = address
        self._clients: dict[str, RayClient] = {}
        self._final: dict[str, DescribeAppResponse] = {}
        self._lock = threading.Lock()
        self._watcher: StatusWatcher[DescribeAppResponse] = StatusWatcher(
            self._snapshot, self._lookup, is_terminal=lambda d: d.state.is_terminal
        )
        self._view: RayView | None = None

    def client(self, address: str = "") -> RayClient:
        addr = resolve_address(address or self._address)
        with self._lock:
            if addr not in self._clients:
                self._clients[addr] = RayClient(addr)
            return self._clients[addr]

    # -- requests -----------------------------------------------------------------------------------------
    def run_opts(self) -> runopts:
        return RayOptions.runopts()

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        validate(app)

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[RayRequest]:
        opts = RayOptions.from_cfg(cfg)
        req = build_request(app, opts, self.session_name, resolve_address(opts.address or self._address), time.time())
        return AppDryRunInfo(request=req, fmt=format_request)

    def check_feasible(self, req: RayRequest) -> None:
        """Refuse a replica no node of the cluster could ever hold (Ray would leave it pending forever)."""
        nodes = self.client(req.address).nodes()
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
        self.check_feasible(req)
        app_dir = store_root() / req.app_id
        pkg = app_dir / payload_module(req.app_id)
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "payload.json").write_text(req.payload.to_json())
        app = dryrun_info.app or AppDef.from_dict(req.spec)
        (app_dir / "app.json").write_text(AppRecord("ray", req.session, app, os.getcwd(), {"address": req.address}).to_json())
        import tsm

        runtime_env: dict[str, Any] = dict(req.runtime_env)
        runtime_env["py_modules"] = [os.path.dirname(tsm.__file__), str(pkg)]
        runtime_env["excludes"] = ["__pycache__", "*.pyc"]
        if req.working_dir:
            runtime_env["working_dir"] = req.working_dir
        self.client(req.address).submit(
            entrypoint=req.entrypoint, submission_id=req.app_id, metadata=dict(req.metadata), runtime_env=runtime_env,
            entrypoint_num_cpus=0,
        )
        self._watcher.submitted(req.app_id)
        return req.app_id

    # -- workspaces --------------------------------------------------------------------------------------
    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        """Snapshot ``workspace`` (the dir workspace) and make the snapshot the job's ``working_dir``.

        The snapshot is named by its content hash and Ray names the uploaded package by the hash of its
        content, so an unchanged workspace is neither copied nor uploaded again. Replicas start in it.
        """
        from tsm.workspace.dir import DirWorkspace

        report = DirWorkspace().build(workspace)
        role.metadata[METADATA_KEY] = {
            "workspace": os.path.abspath(workspace), "digest": report.digest, "snapshot": report.snapshot,
            "files": report.files, "bytes": report.bytes, "ray_working_dir": report.snapshot,
        }

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Nothing to push: the workspace travels as the job's ``working_dir``."""
        return None

    def push_images(self, images_to_push: None) -> None:
        """Nothing to push (see :meth:`dryrun_push_images`)."""

    # -- status -------------------------------------------------------------------------------------------
    def _record(self, job: Any) -> dict[str, Any] | None:
        return st.parse_record(self.client().read(getattr(job, "driver_node_id", "") or "",
                                                  f"tsm/{job.submission_id}/status.json"))

    def _describe_job(self, job: Any) -> DescribeAppResponse:
        app_id = str(job.submission_id)
        if app_id in self._final:
            return self._final[app_id]
        status = _job_status(job)
        d = st.describe(app_id, status, str(job.message or ""), dict(job.metadata or {}), self._record(job))
        if status in _TERMINAL_JOB:
            self._final[app_id] = d
        return d

    def _snapshot(self) -> dict[str, DescribeAppResponse]:
        return {str(j.submission_id): self._describe_job(j) for j in self.client().list_jobs()
                if st.is_tsm_job(j.metadata) and j.submission_id}

    def _lookup(self, ids: builtins.list[str]) -> dict[str, DescribeAppResponse]:
        return {}

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        return with_record(self._watcher.get(app_id), store_root() / app_id / "app.json")

    def view_snapshot(self, app_ids: Sequence[str]) -> builtins.list[AppView]:
        """The views' batch hook (:class:`tsm.views.snapshot.BatchSnapshot`): every app of ``app_ids`` from one
        ``list_jobs`` call (plus, per app, its driver's status record when it changed or got old); see
        :mod:`tsm.schedulers.ray.view`."""
        if self._view is None:
            from tsm.schedulers.ray.view import RayView

            self._view = RayView(self)
        return self._view.snapshot(app_ids)

    def list(self) -> builtins.list[ListAppResponse]:
        rows = [st.list_row(str(j.submission_id), _job_status(j), dict(j.metadata or {}))
                for j in self.client().list_jobs() if st.is_tsm_job(j.metadata) and j.submission_id]
        return sorted(rows, key=lambda r: -(r.created or 0))

    # -- cancel -------------------------------------------------------------------------------------------
    def cancel(self, app_id: str) -> None:
        """``ray job stop``: the driver stops every replica (SIGTERM, SIGKILL after the grace period) and kills
        the actors; returns once the job has ended and no actor of the app is left."""
        current = self.describe(app_id)
        if current is None or current.state.is_terminal:
            return
        c = self.client()
        c.stop(app_id)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            job = c.job(app_id)
            if job is None or _job_status(job) in _TERMINAL_JOB:
                break
            time.sleep(0.2)
        while time.monotonic() < deadline and c.actors(app_id):
            time.sleep(0.2)
        self._watcher.invalidate()

    # -- logs ---------------------------------------------------------------------------------------------
    def _roles(self, app_id: str) -> dict[str, int] | None:
        """``{role: replica count}`` from the job's metadata; None when Ray has no tsm job ``app_id``."""
        job = self.client().job(app_id)
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
        c = self.client()
        job = c.job(app_id)
        if job is None:
            return {}, True
        rec = self._record(job)
        ended = _job_status(job) in _TERMINAL_JOB
        rep = st.replica_of(rec, role, k)
        if rep.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED") and rec is not None:
            ended = ended or rec.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED") or rep.get("state") == "SUCCEEDED"
        return rep, ended

    def _lines(self, app_id: str, role: str, k: int, names: builtins.list[str], since: datetime | None,
               until: datetime | None, tail: bool) -> Iterator[str]:
        c = self.client()
        rep, ended = self._replica(app_id, role, k)
        emitted = 0
        attempt = 0
        while True:
            node = str(rep.get("node_id") or "")
            last = int(rep.get("attempt") or 0)
            while attempt <= last:
                raw = c.read(node, f"tsm/{app_id}/{role}.{k}.{attempt}.log") or b""
                if attempt == last and tail and not ended:
                    # follow: keep only whole records of the attempt still running
                    raw = raw[: raw.rfind(b"\n") + 1]
                lines = parse_log(raw, names, since, until)
                yield from lines[emitted:]
                if attempt < last:
                    attempt, emitted = attempt + 1, 0
                else:
                    emitted = len(lines)
                    break
            if not tail or ended:
                return
            time.sleep(0.3)
            rep, ended = self._replica(app_id, role, k)
            if int(rep.get("attempt") or 0) != last:
                # the attempt ended and another started: read what remains of this one first
                raw = c.read(node, f"tsm/{app_id}/{role}.{k}.{last}.log") or b""
                yield from parse_log(raw, names, since, until)[emitted:]
                attempt, emitted = last + 1, 0

    def close(self) -> None:
        self._clients.clear()
