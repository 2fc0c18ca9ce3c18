"""KubernetesScheduler: the interface, gluing the pure request/status modules to the API client.

Local store ``$TSM_HOME/kubernetes/<app_id>/``: ``request.json`` (the manifests, to recreate Jobs for
ROLE/APPLICATION retries: the retry count itself lives on the objects, label ``tsm/attempt``), ``app.json``
(the :class:`AppRecord`), ``logs/<host>/<attempt>-<created>-<pod>.log`` (each pod's log with Kubernetes'
timestamps, snapshotted before tsm deletes the pod) and ``final.json`` (the last status, written when the
app's objects are deleted: by ``cancel``, a final failure, the gang timeout, or cleanup).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tsm.errors import (
    InvalidRunOptionError,
    NotSupportedError,
    SchedulerError,
    SubmissionError,
)
from tsm.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, Stream
from tsm.schedulers.common.logs import (
    check_log_target,
    decode,
    filter_regex,
    in_window,
    replica_counts,
    split_lines,
    split_lines_iterator,
    utf8_chunks,
)
from tsm.schedulers.common.record import AppRecord, ended_status, load_final, save_final, with_record
from tsm.schedulers.common.watcher import StatusWatcher
from tsm.schedulers.kubernetes.client import KubeClient
from tsm.schedulers.kubernetes.request import (
    ANN_CREATED,
    ANN_ROLE,
    LABEL_REPLICA,
    LABEL_ROLE,
    RANK0_VAR,
    KubernetesOptions,
    KubernetesRequest,
    build_request,
    format_request,
    host_name,
    retried,
    validate,
    with_own_ip_as_rank0,
    with_owner,
    with_rank0,
)
from tsm.schedulers.kubernetes.status import (
    AppView,
    Pod,
    app_status,
    from_json,
    group,
    latest_pod,
    parse_time,
)
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Role
from tsm.specs.runopts import CfgVal, runopts
from tsm.store import tsm_home
from tsm.workspace.api import WorkspaceBuilder
from tsm.workspace.image import ImagePlan, build_image, docker_client, plan_image

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.docker.client import DockerClient
    from tsm.views.snapshot import AppView as ViewApp


#: seconds a Service without any pod is left alone by :meth:`KubernetesScheduler.cleanup` (its Jobs' pods
#: may still be on their way)
ORPHAN_AGE = 300.0


def store_root() -> Path:
    return tsm_home() / "kubernetes"


class KubernetesScheduler(Scheduler[KubernetesRequest], WorkspaceBuilder[None]):
    """Runs each replica as a ``batch/v1`` Job behind one headless Service (see :mod:`tsm.schedulers.kubernetes`).

    ``--workspace``: the first role's image becomes an image of the workspace built on it by the local Docker
    engine (:mod:`tsm.workspace.image`: content-hash tag, reused when unchanged), which the kubelet runs
    without a registry when its runtime is that engine (dockershim on this machine, as ``scripts/k8s-up``).
    """

    requires_resource = False

    def __init__(self, session_name: str, namespace: str = "default", kubeconfig: str | None = None,
                 context: str | None = None, client: KubeClient | None = None) -> None:
        super().__init__("kubernetes", session_name)
        self._where = (namespace, kubeconfig, context)
        self._clients: dict[tuple[str, str | None, str | None], KubeClient] = {}
        if client is not None:
            self._clients[(client.namespace, kubeconfig, context)] = client
            self._where = (client.namespace, kubeconfig, context)
        self._watcher = self._new_watcher()
        self._lock = threading.Lock()
        self._docker: DockerClient | None = None

    def _new_watcher(self) -> StatusWatcher[DescribeAppResponse]:
        return StatusWatcher(self._snapshot, self._lookup, is_terminal=lambda d: d.state.is_terminal)

    def _client(self, where: tuple[str, str | None, str | None] | None = None) -> KubeClient:
        key = where or self._where
        with self._lock:
            if key not in self._clients:
                self._clients[key] = KubeClient(*key)
            return self._clients[key]

    @property
    def client(self) -> KubeClient:
        """The client of the scheduler's own namespace and kubeconfig."""
        return self._client()

    def _client_of(self, req: KubernetesRequest | None) -> KubeClient:
        if req is None:
            return self.client
        return self._client((req.namespace, req.kubeconfig, req.context))

    # -- requests -----------------------------------------------------------------------------------------
    def run_opts(self) -> runopts:
        return KubernetesOptions.runopts()

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        validate(app)

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[KubernetesRequest]:
        opts = KubernetesOptions.from_cfg(cfg)
        req = build_request(app, opts, self.session_name, str(store_root()), time.time())
        plans = [p for p in (ImagePlan.from_metadata(r) for r in app.roles) if p is not None]
        if plans and opts.image_pull_policy == "Always":
            raise InvalidRunOptionError(
                f"image_pull_policy=Always cannot run the workspace image {plans[0].tag}: it is built on the local "
                "Docker engine, not in a registry; use IfNotPresent (the default) or Never"
            )
        req.builds = [p.to_dict() for p in plans]
        return AppDryRunInfo(request=req, fmt=format_request)

    # -- workspaces --------------------------------------------------------------------------------------
    def _docker_client(self) -> DockerClient:
        if self._docker is None:
            self._docker = docker_client()
        return self._docker

    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        """Snapshot ``workspace`` and point ``role`` at its image's tag; the build runs at ``schedule``
        (skipped when the tag is already on the engine: :func:`tsm.workspace.image.plan_image`)."""
        plan_image(role, workspace, self._docker_client())

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Nothing to push: the kubelet runs the image from the engine that built it."""
        return None

    def push_images(self, images_to_push: None) -> None:
        """Nothing to push (see :meth:`dryrun_push_images`)."""

    def check_fits(self, req: KubernetesRequest, client: KubeClient) -> None:
        """Refuse an app that can never run: a replica bigger than every node, or more than the cluster has."""
        nodes = client.allocatable()
        if not nodes:
            raise SubmissionError("the cluster has no schedulable node: nothing can run; add a node (or uncordon one)")
        keys = (("cpu", "cpu_milli", 1e-3, "CPU"), ("memory", "mem_bytes", 1.0, "bytes of memory"),
                ("nvidia.com/gpu", "gpus", 1.0, "GPU(s)"))
        for res, attr, scale, what in keys:
            total_need = sum(getattr(n, attr) * scale for n in req.needs)
            biggest = max(node.get(res, 0.0) for node in nodes)
            for n in req.needs:
                need = getattr(n, attr) * scale
                if need > biggest:
                    raise SubmissionError(
                        f"app {req.app_name!r} cannot fit: a replica of role '{n.role}' requests {need:g} {what} "
                        f"but the largest node has {biggest:g} allocatable; ask for less (or lower request_fraction)"
                    )
            capacity = sum(node.get(res, 0.0) for node in nodes)
            if total_need > capacity:
                raise SubmissionError(
                    f"app {req.app_name!r} cannot fit: its {len(req.needs)} replicas request {total_need:g} {what} "
                    f"together but the cluster has {capacity:g} allocatable; it would wait forever (gang start)"
                )

    def schedule(self, dryrun_info: AppDryRunInfo[KubernetesRequest]) -> str:
        req = dryrun_info.request
        client = self._client_of(req)
        self.check_fits(req, client)
        for b in req.builds:  # workspace images, before anything exists on the cluster
            try:
                build_image(ImagePlan(**b), self._docker_client())
            except SchedulerError as e:
                raise SubmissionError(f"app {req.app_id}: workspace image of role '{b['role']}': {e}") from e
        app_dir = Path(req.app_dir)
        app_dir.mkdir(parents=True, exist_ok=True)
        (app_dir / "request.json").write_text(req.to_json())
        app = dryrun_info.app or AppDef.from_dict(req.spec)
        (app_dir / "app.json").write_text(AppRecord("kubernetes", req.session, app, os.getcwd(), {}).to_json())
        try:
            svc = client.create_service(req.service)
            (app_dir / "service-uid").write_text(svc["metadata"]["uid"])
            self._watcher.submitted(req.app_id)
            self._create_jobs(req, client, req.jobs)
        except SchedulerError as e:
            with contextlib.suppress(SchedulerError):
                client.delete_app(req.app_id, 0)
            self._write_final(req, AppState.FAILED, f"could not be created: {e}")
            raise SubmissionError(f"app {req.app_id} could not be created: {e}") from e
        return req.app_id

    def _dns(self, req: KubernetesRequest, client: KubeClient) -> bool:
        if req.dns != "auto":
            return req.dns == "yes"
        flag = Path(req.app_dir) / "dns"
        if not flag.exists():
            flag.write_text("yes" if client.has_dns() else "no")
        return flag.read_text() == "yes"

    def _create_jobs(self, req: KubernetesRequest, client: KubeClient, jobs: builtins.list[dict[str, Any]]) -> None:
        """Create ``jobs`` owned by the Service; without DNS, rank 0 first, then its pod IP to the others.

        Without DNS rank 0 reads its own pod IP (downward API) as ``TSM_RANK0_HOST`` and the others get that
        IP plus ``hostAliases`` for rank 0's host names, since a rendezvous (torch's c10d) advertises the
        host's FQDN, which only the cluster DNS would otherwise resolve.
        """
        uid = (Path(req.app_dir) / "service-uid").read_text()
        rest = list(jobs)
        ip = ""
        if len(req.jobs) > 1 and not self._dns(req, client):
            first = next((j for j in rest if j["metadata"]["annotations"][ANN_ROLE] == req.roles[0][0]
                          and j["metadata"]["labels"][LABEL_REPLICA] == "0"), None)
            if first is not None:
                rest.remove(first)
                try:
                    client.create_job(with_owner(with_own_ip_as_rank0(first), uid, req.app_id))
                except SchedulerError as e:
                    if "(409)" not in str(e):
                        raise
            ip = self._rank0_ip(req, client)
        for j in rest:
            try:
                client.create_job(with_owner(with_rank0(j, ip) if ip else j, uid, req.app_id))
            except SchedulerError as e:
                if "(409)" not in str(e):  # 409: another process watching the app created it first
                    raise

    def _rank0_ip(self, req: KubernetesRequest, client: KubeClient) -> str:
        """Rank 0's pod IP once it has one (the sandbox exists), within the gang timeout."""
        deadline = time.monotonic() + req.gang_timeout
        pause = 0.1
        while time.monotonic() < deadline:
            pods = [from_json(p) for p in client.list_pods(req.app_id)]
            role0 = req.roles[0][0]
            floor = self._attempts(req.app_id).get(role0, 0)
            mine = [p for p in pods if p.role == role0 and p.replica_id == 0 and not p.deleting and p.attempt >= floor]
            latest = max(mine, key=lambda p: (p.attempt, p.created), default=None)
            if latest is not None and latest.ip:
                return latest.ip
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        return ""  # the gang timeout will fail the app with rank 0's reason

    # -- status -------------------------------------------------------------------------------------------
    def _app_dir(self, app_id: str) -> Path:
        return store_root() / app_id

    def _request(self, app_id: str) -> KubernetesRequest | None:
        try:
            return KubernetesRequest.from_json((self._app_dir(app_id) / "request.json").read_text())
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _snapshot(self) -> dict[str, DescribeAppResponse]:
        out: dict[str, DescribeAppResponse] = {}
        pods = [from_json(p) for p in self.client.list_pods()]
        for app_id, view in group(pods).items():
            if (self._app_dir(app_id) / "cancelling").exists() or (self._app_dir(app_id) / "final.json").exists():
                continue  # final.json answers (through lookup)
            out[app_id] = self._settle(view)
        return out

    def _lookup(self, ids: builtins.list[str]) -> dict[str, DescribeAppResponse]:
        out = {}
        for app_id in ids:
            d = self._final(app_id)
            if d is not None:
                out[app_id] = d
                continue
            if (self._app_dir(app_id) / "cancelling").exists():
                out[app_id] = DescribeAppResponse(app_id=app_id, state=AppState.RUNNING, msg="being cancelled")
                continue
            req = self._request(app_id)
            if req is None:
                continue
            client = self._client_of(req)
            pods = [from_json(p) for p in client.list_pods(app_id)]
            view = AppView(app_id, req.roles, float(req.service["metadata"]["annotations"][ANN_CREATED]), pods)
            out[app_id] = self._settle(view)
        return out

    def _final(self, app_id: str) -> DescribeAppResponse | None:
        return load_final(self._app_dir(app_id))

    def _describe_view(self, view: AppView) -> DescribeAppResponse:
        st = app_status(view)
        return DescribeAppResponse(app_id=view.app_id, state=st.state, msg=st.msg, num_restarts=st.num_restarts,
                                   created=view.created, roles_statuses=st.roles)

    def _settle(self, view: AppView) -> DescribeAppResponse:
        """The app's status; acts on it: ROLE/APPLICATION retries, gang timeout, final failure (delete)."""
        req = self._request(view.app_id)
        if req is None:  # not submitted from this machine: report only
            return self._describe_view(view)
        attempts = self._attempts(view.app_id)
        # pods of a try tsm has already replaced (being deleted) are not the replica any more
        view = AppView(view.app_id, view.roles, view.created,
                       [p for p in view.pods if p.attempt >= attempts.get(p.role, 0)])
        st = app_status(view)
        if st.state == AppState.FAILED and st.first_failure is not None:
            role_name = st.first_failure[0]
            shape = {r[0]: r for r in view.roles}
            _, _, max_retries, policy = shape.get(role_name, [role_name, 1, 0, "APPLICATION"])
            scope = [role_name] if policy == "ROLE" else [r[0] for r in view.roles]
            attempt = max(attempts.get(r, 0) for r in scope)
            if policy in ("APPLICATION", "ROLE") and attempt < int(max_retries):
                self._retry(req, view, role_name if policy == "ROLE" else None, attempt + 1)
                return DescribeAppResponse(app_id=view.app_id, state=AppState.RUNNING, created=view.created,
                                           num_restarts=st.num_restarts + 1, msg=f"retrying after {st.msg}")
            desc = self._describe_view(view)
            for rs in desc.roles_statuses:
                for r in rs.replicas:
                    if not r.state.is_terminal:
                        r.state, r.error_msg = AppState.CANCELLED, f"stopped: {desc.msg}"
            self._finish(req, desc, view.pods)
            return desc
        if st.state in (AppState.PENDING, AppState.RUNNING) and not st.all_started:
            latest = [p.created for p in view.pods if p.attempt == view.attempt]
            since = max(view.created or 0.0, min(latest, default=0.0))
            if since and time.time() - since > req.gang_timeout:
                why = st.pending_reason or "not scheduled"
                msg = f"not every replica was Running within gang_timeout={req.gang_timeout:g}s: {why}"
                desc = self._describe_view(view)
                desc.state, desc.msg = AppState.FAILED, msg
                for rs in desc.roles_statuses:
                    for r in rs.replicas:
                        if not r.state.is_terminal:
                            r.state, r.error_msg = AppState.FAILED, r.error_msg or msg
                self._finish(req, desc, view.pods)
                return desc
        desc = self._describe_view(view)
        if desc.state == AppState.SUCCEEDED:
            self._finish(req, desc, view.pods)
        return desc

    def _attempts(self, app_id: str) -> dict[str, int]:
        """``{role: n}``: the ROLE/APPLICATION try each role is on (0 when never retried)."""
        try:
            data = json.loads((self._app_dir(app_id) / "attempts.json").read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): int(v) for k, v in data.items()}

    def _retry(self, req: KubernetesRequest, view: AppView, role: str | None, attempt: int) -> None:
        """Delete the role's (``role``) or app's (None) Jobs, logs snapshotted, and create them anew.

        The new try is recorded first (``attempts.json``), so a refresh that still sees the old pods while
        they are being deleted does not retry again; the new Jobs carry ``tsm/attempt`` too.
        """
        client = self._client_of(req)
        roles = [role] if role is not None else [r[0] for r in req.roles]
        attempts = self._attempts(req.app_id)
        attempts.update(dict.fromkeys(roles, attempt))
        tmp = Path(req.app_dir) / "attempts.json.tmp"
        tmp.write_text(json.dumps(attempts))
        tmp.replace(Path(req.app_dir) / "attempts.json")
        for p in view.pods:
            if p.role in roles:
                self._snapshot_log(req.app_id, client, p)
        jobs = [j for j in req.jobs if j["metadata"]["annotations"][ANN_ROLE] in roles]
        for j in jobs:
            client.delete_job_of(req.app_id, j["metadata"]["labels"][LABEL_ROLE], j["metadata"]["labels"][LABEL_REPLICA])
        self._create_jobs(req, client, [retried(j, req.app_id, attempt) for j in jobs])

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        return with_record(self._watcher.get(app_id), self._app_dir(app_id) / "app.json")

    def list(self) -> builtins.list[ListAppResponse]:
        rows = {a: ListAppResponse(a, d.state, name=a.rsplit("-", 1)[0], created=d.created)
                for a, d in self._watcher.all().items()}
        root = store_root()
        if root.is_dir():
            for entry in os.scandir(root):
                if entry.name not in rows:
                    d = self._final(entry.name)
                    if d is None and (Path(entry.path) / "cancelling").exists():
                        d = DescribeAppResponse(app_id=entry.name, state=AppState.RUNNING)
                    elif d is None and (Path(entry.path) / "request.json").exists():
                        d = self._watcher.get(entry.name)  # just submitted: its pods are not made yet
                    if d is not None:
                        rows[entry.name] = ListAppResponse(entry.name, d.state, name=entry.name.rsplit("-", 1)[0],
                                                           created=d.created)
        return sorted(rows.values(), key=lambda r: -(r.created or 0))

    # -- views (tsm top / tsm serve) ----------------------------------------------------------------------
    def view_snapshot(self, app_ids: Sequence[str]) -> builtins.list[ViewApp]:
        """The views' batched refresh (:class:`tsm.views.snapshot.BatchSnapshot`): every app of ``app_ids``
        this scheduler knows, from ONE label-selected pod list per namespace (one in practice, whatever the
        number of apps and replicas) plus, when the cluster serves ``metrics.k8s.io``, one pod-metrics list.

        An ended app answers from its final status in the store (no API call). Per replica: state, pod IP,
        restarts (``attempt``), exit code, Kubernetes' reason, the container's requests; usage (cores and
        MiB in use) from metrics-server, None (shown as n/a) where the cluster has none. Like ``describe``,
        a refresh acts on what it sees (retries, gang timeout, deletion of an ended app).
        """

        out: builtins.list[ViewApp] = []
        live: dict[tuple[str, str | None, str | None], builtins.list[str]] = {}
        reqs: dict[str, KubernetesRequest | None] = {}
        for app_id in dict.fromkeys(app_ids):
            final = self._final(app_id)
            if final is not None:
                out.append(self._view_of(final, {}, None, None))
                continue
            req = reqs[app_id] = self._request(app_id)
            where = (req.namespace, req.kubeconfig, req.context) if req is not None else self._where
            live.setdefault(where, []).append(app_id)
        for where, ids in live.items():
            client = self._client(where)
            views = group([from_json(p) for p in client.list_pods_of(ids)])
            usage = client.pod_metrics(ids)
            for app_id in ids:
                req = reqs[app_id]
                view = views.get(app_id)
                if view is None:
                    if req is None:
                        continue  # not an app of this cluster (or its objects are gone and nothing is kept)
                    view = AppView(app_id, req.roles, float(req.service["metadata"]["annotations"][ANN_CREATED]), [])
                elif req is not None:
                    view.roles = req.roles
                if (self._app_dir(app_id) / "cancelling").exists():
                    desc = DescribeAppResponse(app_id=app_id, state=AppState.RUNNING, msg="being cancelled",
                                               created=view.created, roles_statuses=app_status(view).roles)
                else:
                    desc = self._settle(view)
                out.append(self._view_of(desc, _pods_by_replica(view), usage, req.app_name if req else None))
        return out

    def _view_of(self, desc: DescribeAppResponse, pods: dict[tuple[str, int], Pod],
                 usage: dict[str, tuple[float, float]] | None, name: str | None) -> ViewApp:
        """One app as the views show it: ``desc`` (:func:`~tsm.views.snapshot.view_of_describe`, requests
        from the submitted app) plus, per replica, its pod's IP, requests, start and end, and usage."""
        from tsm.views.snapshot import requests_of, view_of_describe

        record = AppRecord.load(self._app_dir(desc.app_id) / "app.json")
        reqs = requests_of(record.app.to_dict()) if record is not None else {}
        view = view_of_describe(desc, "kubernetes", name=name or desc.app_id.rsplit("-", 1)[0], reqs=reqs)
        started: builtins.list[float] = []
        ended: builtins.list[float] = []
        for rv in view.replicas:
            pod = pods.get((rv.role, rv.idx))
            if pod is None:
                continue
            rv.host = pod.ip or rv.host
            rv.cpu_req, rv.mem_req_mb, rv.gpu_req = pod.cpu_req, pod.mem_req_mb, pod.gpu_req
            if pod.started:
                started.append(pod.started)
            if pod.finished:
                ended.append(pod.finished)
            used = (usage or {}).get(pod.name)
            if used is not None and not AppState[rv.state].is_terminal:
                rv.cpu_used, rv.mem_used_mb = used[0], used[1] / 2**20
        # a live app shows why a replica is waiting (ErrImagePull, Unschedulable, ...) as its error
        view.last_error = desc.msg if desc.state == AppState.FAILED else next(
            (r.error for r in view.replicas if r.error), "")
        view.started = min(started) if started else None
        view.ended = (max(ended) if ended else None) if desc.state.is_terminal else None
        return view

    # -- cancel / finish -----------------------------------------------------------------------------------
    def cancel(self, app_id: str) -> None:
        current = self.describe(app_id)
        if current is None or current.state.is_terminal:
            return
        req = self._request(app_id)
        client = self._client_of(req)
        app_dir = self._app_dir(app_id)
        app_dir.mkdir(parents=True, exist_ok=True)
        (app_dir / "cancelling").touch()
        try:
            pods = [from_json(p) for p in client.list_pods(app_id)]
            desc = DescribeAppResponse(app_id=app_id, state=AppState.CANCELLED, msg="cancelled", created=current.created,
                                       num_restarts=current.num_restarts, roles_statuses=current.roles_statuses)
            for rs in desc.roles_statuses:
                for r in rs.replicas:
                    if r.state != AppState.SUCCEEDED:
                        r.state, r.error_msg = AppState.CANCELLED, "cancelled"
            grace = req.grace_period if req else 10
            if req is not None:
                self._finish(req, desc, pods, grace=grace)
            else:
                client.delete_app(app_id, grace)
        finally:
            with contextlib.suppress(OSError):
                (app_dir / "cancelling").unlink()
        self._watcher.invalidate()

    def _finish(self, req: KubernetesRequest, desc: DescribeAppResponse, pods: builtins.list[Pod],
                grace: int = 0) -> None:
        """Snapshot every pod's log, write the final status, then delete the app's objects (all of them)."""
        client = self._client_of(req)
        for p in pods:
            self._snapshot_log(req.app_id, client, p)
        save_final(Path(req.app_dir), desc)
        client.delete_app(req.app_id, grace)

    def _write_final(self, req: KubernetesRequest, state: AppState, msg: str) -> None:
        save_final(Path(req.app_dir), ended_status(req.app_id, req.roles, state, msg))

    def remove(self, app_id: str) -> bool:
        """Delete the app's objects and everything kept of it in ``$TSM_HOME``."""
        req = self._request(app_id)
        found = False
        if req is not None:
            self._client_of(req).delete_app(app_id, 0)
            found = True
        app_dir = self._app_dir(app_id)
        if app_dir.exists():
            shutil.rmtree(app_dir, ignore_errors=True)
            found = True
        self._watcher = self._new_watcher()
        return found

    def cleanup(self, include_running: bool = False, older_than: float = 0.0,
                dry_run: bool = False) -> builtins.list[str]:
        """Delete what is left on the cluster of ended tsm apps of the namespace; returns their app ids.

        Normally an app is deleted as soon as tsm sees it end; objects stay behind when nothing watched
        it to the end (the launcher was killed, ``tsm run --detach`` never looked again) or when it was
        launched from another machine. This finds them with one pod list and one Service list:

        * an ended app (every replica Succeeded, or one Failed for good) whose last pod ended more than
          ``older_than`` seconds ago: its logs are copied into the local store first when this machine
          launched it (``tsm logs`` keeps working), then every object is deleted;
        * a Service without pods (a launcher that died between creating the Service and its Jobs), once
          it is older than ``older_than`` and at least :data:`ORPHAN_AGE` seconds;
        * with ``include_running``, running apps too (cancelled).

        ``dry_run`` only lists what would be deleted. ``python -m tsm.schedulers.kubernetes cleanup`` runs
        this from a shell or a cron job (``--older-than`` keeps ended apps for a while).
        """
        now = time.time()
        done = []
        views = group([from_json(p) for p in self.client.list_pods()])
        for app_id, view in views.items():
            req = self._request(app_id)
            desc = self._describe_view(view)
            if desc.state.is_terminal:
                ended = max((p.finished or p.created for p in view.pods), default=0.0)
                if now - ended < older_than:
                    continue
                if not dry_run:
                    if req is not None:
                        self._finish(req, desc, view.pods)
                    else:
                        self.client.delete_app(app_id, 0)
                done.append(app_id)
            elif include_running:
                if not dry_run:
                    if req is not None:
                        self.cancel(app_id)
                    else:
                        self.client.delete_app(app_id, 0)
                done.append(app_id)
        for svc in self.client.list_services():
            app_id = svc["metadata"]["name"]
            if app_id in views:
                continue
            created = parse_time(svc["metadata"].get("creationTimestamp"))
            if now - created >= max(older_than, ORPHAN_AGE) or include_running:
                if not dry_run:
                    req = self._request(app_id)
                    if req is not None and self._final(app_id) is None:
                        self._write_final(req, AppState.FAILED, "its objects were left incomplete; removed by cleanup")
                    self.client.delete_app(app_id, 0)
                done.append(app_id)
        self._watcher.invalidate()
        return done

    # -- logs ---------------------------------------------------------------------------------------------
    def _log_file(self, app_id: str, p: Pod) -> Path:
        return self._app_dir(app_id) / "logs" / host_name(p.role, p.replica_id) / f"{p.attempt:03d}-{p.created:.3f}-{p.name}.log"

    def _snapshot_log(self, app_id: str, client: KubeClient, p: Pod) -> None:
        """Copy a pod's log into the store: as written (``.log``) and with Kubernetes' timestamps (``.ts``,
        for since/until: the runtime cuts lines over 16 KiB and stamps each part, so only the plain copy is exact)."""
        path = self._log_file(app_id, p)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        stamped = client.log(p.name, timestamps=True)
        plain = client.log(p.name)
        for target, data in ((path.with_suffix(".ts"), stamped), (path, plain)):
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(target)

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
        req = self._request(app_id)
        roles = replica_counts(req.roles if req else None, lambda: self.describe(app_id))
        check_log_target("kubernetes", app_id, roles, role_name, k)
        if streams is not None and Stream(streams) != Stream.COMBINED:
            raise NotSupportedError(
                "Kubernetes keeps a container's stdout and stderr in one log: only the combined stream can be "
                f"read (drop --streams {Stream(streams).value}, or write the streams to files in the job)"
            )
        return filter_regex(regex, self._lines(app_id, role_name, k, since, until, should_tail))

    def _lines(self, app_id: str, role: str, k: int, since: datetime | None, until: datetime | None,
               tail: bool) -> Iterator[str]:
        req = self._request(app_id)
        client = self._client_of(req)

        def live_pods() -> builtins.list[Pod]:
            if self._final(app_id) is not None:
                return []
            mine = [p for p in (from_json(x) for x in client.list_pods(app_id)) if p.role == role and p.replica_id == k]
            return sorted(mine, key=lambda p: (p.attempt, p.created, p.name))

        live = live_pods()
        if tail and not live:  # following a replica whose pod is not made yet: wait for it or the app's end
            deadline = time.monotonic() + 600
            while not live and time.monotonic() < deadline:
                now = self.describe(app_id)
                if now is None or now.state.is_terminal:
                    break
                time.sleep(0.5)
                live = live_pods()
        d = self._app_dir(app_id) / "logs" / host_name(role, k)
        saved = sorted(d.glob("*.log")) if d.is_dir() else []
        live_files = {self._log_file(app_id, p).name for p in live}
        window = since is not None or until is not None

        def saved_lines(f: Path) -> Iterator[str]:
            if window:
                return _stamped_lines(f.with_suffix(".ts").read_bytes(), since, until)
            return iter(split_lines(decode(f.read_bytes())))

        for f in saved:
            if f.name not in live_files:
                yield from saved_lines(f)
        for i, p in enumerate(live):
            f = self._log_file(app_id, p)
            if f.exists():
                yield from saved_lines(f)
                continue
            last = i == len(live) - 1
            if tail and last and until is None:
                s = int(time.time() - since.timestamp()) + 1 if since else None
                yield from _follow(self, client, app_id, p, s)
                return
            if window:
                yield from _stamped_lines(client.log(p.name, timestamps=True), since, until)
            else:
                yield from split_lines(decode(client.log(p.name)))

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()


def _pods_by_replica(view: AppView) -> dict[tuple[str, int], Pod]:
    """The pod that is each replica now (see :func:`~tsm.schedulers.kubernetes.status.latest_pod`)."""
    by: dict[tuple[str, int], builtins.list[Pod]] = {}
    for p in view.pods:
        by.setdefault((p.role, p.replica_id), []).append(p)
    return {k: pod for k, pods in by.items() if (pod := latest_pod(pods)) is not None}


def _follow(sched: KubernetesScheduler, client: KubeClient, app_id: str, p: Pod, since: int | None) -> Iterator[str]:
    """Follow a live pod: wait until its container started, then stream until it ends."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        cur = next((from_json(x) for x in client.list_pods(app_id) if x["metadata"]["name"] == p.name), None)
        if cur is None or cur.phase != "Pending":
            break
        time.sleep(0.5)
    try:
        chunks = (decode(b) for b in utf8_chunks(client.follow(p.name, since=since)))
        yield from split_lines_iterator(chunks)
    except SchedulerError:  # the pod went away (the app ended and was deleted): its snapshot has the log
        f = sched._log_file(app_id, p)
        if not f.exists():
            raise
        yield from split_lines(decode(f.read_bytes()))


def _stamped_lines(raw: bytes, since: datetime | None, until: datetime | None) -> Iterator[str]:
    """Lines of a log read with ``timestamps=true`` (``<RFC3339Nano> <line>``), stamps removed, in the window."""
    if not raw:
        return
    out = bytearray()
    for line in raw.split(b"\n")[: -1 if raw.endswith(b"\n") else None]:
        head, _, body = line.partition(b" ")
        if since is not None or until is not None:
            try:
                text = head.decode().rstrip("Z")
                base, _, frac = text.partition(".")
                when: float | None = datetime.fromisoformat(base + "+00:00").timestamp() + float("0." + (frac[:6] or "0"))
            except ValueError:
                when = None
            if not in_window(when, since, until):
                continue
        out += body + b"\n"
    if raw and not raw.endswith(b"\n") and out:
        out = out[:-1]  # the last line had no newline
    yield from split_lines(decode(bytes(out)))


__all__ = ["RANK0_VAR", "KubernetesScheduler"]
