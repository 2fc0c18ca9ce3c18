"""KubernetesScheduler: the interface, gluing the pure request/status modules to the API client.

Local store ``$TSM_HOME/kubernetes/<app_id>/`` (:class:`~tsm.schedulers.common.appdir.AppDir`: private files,
written whole): ``request.json`` (the manifests, to recreate Jobs for ROLE/APPLICATION retries),
``attempts.json`` (the try each role is on; the new Jobs carry it too, label ``tsm/attempt``), ``app.json``
(the :class:`AppRecord`), ``logs/<host>/<attempt>-<created>-<pod>.log`` (each pod's log, snapshotted before
tsm deletes the pod: :mod:`.logs`) and ``final.json`` (the last status and the app's start and end, written
when the app's objects are deleted: by ``cancel``, a final failure, the gang timeout, or cleanup). For long
runs (issue 25): ``preemptions.json`` (the restarts made as preemptions, each ``[attempt, [roles]]``: spent
from ``max_preemptions``, and not from the restarted roles' ``max_retries``; an older bare ``preemptions``
count is still read), ``clock`` (when the time
limit counts from: the last requeue), ``excluded.json`` (nodes the next tries avoid, and why),
``retry.json`` (a preemption's new Jobs, made once the old pods have ended), ``tried-at`` (when the current
try was made: its gang timeout counts from there), ``pods-seen.json`` (the pods of the current tries a look
saw: one gone since was taken by the cluster), ``finishing`` (tsm is deleting the app's objects: a pod
being deleted is then not an eviction), ``stall.json`` (the stall check's marks and the stalls found:
:mod:`.stall`) and ``lock`` (the ``flock`` every look of the app holds, :func:`~.stall.locked`).

**Stalls** (``stall_timeout``): a look checks, a tick apart, whether each running pod's log grew (and its CPU,
where ``metrics.k8s.io`` answers); a stalled pod is FAILED "stalled for X, last line: ..." whatever its exit
code. ``on_stall=restart``: it is retried as its own failure (its role's retry policy and ``max_retries``; a
REPLICA role's stall restarts its role's Jobs, as ROLE does, since a try is per role here;
``TSM_LAST_EXIT=stalled``), the old pods deleted with the grace period, so the ``preStop`` hook warns them
(``warn_signal``) ``warn_before`` ahead of SIGTERM, and the new Jobs made once they have ended.
``on_stall=fail``: the app fails with the stall's message and is stopped the same way.

**One look at a time.** Two processes may look at one app at once (a sweep's controller and ``tsm wait``, a
``tsm status`` beside an attached ``tsm run``): each look of an app this home submitted holds the app
directory's ``lock`` (an exclusive ``flock``) from its observation to what it does, and a look that got the
lock after another finished the app answers from the final status that one kept, so an app is finished,
retried or found stalled once. A look whose pod list is older than the last look's (``listed-at``) lists
again under the lock (a pod made in between is not one that vanished). A look that finds the lock held
while the app is being stopped (``finishing``, written first by a stop, or a cancel's marker: the holder
follows the pods through their grace period) does not wait, nor goes on waiting once that begins: it
reports RUNNING "being stopped". ``cancel`` and ``remove`` hold the lock too (a look never makes Jobs after
them), and a look under the lock acts on nothing while a cancel or a stop is under way.

**Preemptions.** A pod the cluster ended (evicted, lost with its node, or deleted by anyone but tsm: the
eviction API, a drain) makes its replica ``preempted`` (:mod:`.status`); the controller restarts it on the
``max_preemptions`` budget, never ``max_retries``, and the new try sees ``TSM_LAST_EXIT=preempted``. Its
new Jobs are made only once the old pods have ended (they get the warning and the grace period), so two
tries of a replica never run at once; a node a replica was lost with is excluded from the new Jobs.

**Status looks act.** Each look at an app (``describe``, ``wait``, ``status``, a view's refresh) is the kit's
controller step (:mod:`tsm.schedulers.common.controller`): observe (one owner-scoped pod list), decide (pure),
act (:meth:`KubernetesScheduler.act`): a ROLE/APPLICATION retry replaces the failed scope's Jobs; an app
that ended (success, a final failure, the gang timeout) has its logs and final status kept and every object
deleted. Only an app whose request this ``$TSM_HOME`` holds is acted on; any other is only reported.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tsm.errors import InvalidRunOptionError, SchedulerError, SubmissionError
from tsm.schedulers.api import BatchedViews, DescribeAppResponse, ListAppResponse, Scheduler
from tsm.schedulers.common.appdir import (
    REQUEST as REQUEST_FILE,
    AppDir,
    kept_status,
    list_rows,
    preemption_events,
    record_preemption,
)
from tsm.schedulers.common.controller import (
    Decision,
    Finish,
    Limits,
    Retry,
    count_preemptions,
    decide,
    shapes,
)
from tsm.schedulers.common.errors import is_status
from tsm.schedulers.common.failure import failure_of
from tsm.schedulers.common.owner import owner
from tsm.schedulers.common.polling import poll_until
from tsm.schedulers.common.record import AppRecord, ended_status, with_record
from tsm.schedulers.common.status import AppStatusView
from tsm.schedulers.common.watcher import StatusWatcher
from tsm.schedulers.kubernetes.client import KubeClient
from tsm.schedulers.kubernetes.logs import KubernetesLogs
from tsm.schedulers.kubernetes.request import (
    ANN_CREATED,
    ANN_ROLE,
    LABEL_REPLICA,
    LABEL_ROLE,
    RANK0_VAR,
    KubernetesOptions,
    KubernetesRequest,
    attempt_env,
    build_request,
    format_request,
    retried,
    validate,
    with_own_ip_as_rank0,
    with_owner,
    with_rank0,
)
from tsm.schedulers.kubernetes.stall import StallState, check, locked
from tsm.schedulers.kubernetes.status import (
    AppView,
    Pod,
    app_status,
    from_json,
    group,
    latest_pod,
    node_oom,
    parse_time,
)
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Role
from tsm.specs.runopts import CfgVal, runopts
from tsm.store import tsm_home
from tsm.workspace.api import WorkspaceBuilder
from tsm.workspace.image import ImageEngine, ImagePlan, build_image, plan_image

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.common.viewmodel import AppSummary as ViewApp


#: the app directory's files of long runs (see the module doc)
PREEMPTIONS, CLOCK, EXCLUDED, RETRY, TRIED_AT, FINISHING, SEEN = (
    "preemptions.json", "clock", "excluded.json", "retry.json", "tried-at", "finishing", "pods-seen.json")
#: the preemption counter of earlier versions (a bare number, roles unknown): still counted when present
OLD_PREEMPTIONS = "preemptions"
#: when the pod list of the last look that held the app's lock was taken (a look whose own list is older
#: lists again under the lock: a pod made in between is not taken for one that vanished)
LISTED_AT = "listed-at"
#: why a pod deleted by someone other than tsm ended (on 1.20 the eviction API only deletes the pod)
DELETED_BY_CLUSTER = "evicted: its pod was deleted by the cluster (the eviction API, a preemption or a drain)"
#: seconds past the grace period a preemption's new Jobs wait at most for the old pods to end
RETRY_WAIT_MARGIN = 30.0
#: seconds past the grace period a stop follows a pod's log for its last lines
FOLLOW_MARGIN = 10.0

#: seconds a Service without any pod is left alone by :meth:`KubernetesScheduler.cleanup` (its Jobs' pods
#: may still be on their way)
ORPHAN_AGE = 300.0


def limits_end(req: KubernetesRequest) -> float:
    """Seconds from a pod's start by which the kubelet has ended it at its time limit: the deadline
    (``time_limit``, less the warning's lead) and the whole termination grace period (which holds the lead),
    and a margin for the kubelet's own pace."""
    return math.ceil(req.time_limit or 0) + req.grace_period + 2.0


def store_root() -> Path:
    return tsm_home() / "kubernetes"


class KubernetesScheduler(KubernetesLogs, Scheduler[KubernetesRequest], WorkspaceBuilder[None], BatchedViews):
    """Runs each replica as a ``batch/v1`` Job behind one headless Service (see :mod:`tsm.schedulers.kubernetes`).

    Capabilities: ``WorkspaceBuilder`` (below) and ``BatchedViews`` (one pod list per view refresh). Not
    ``SizedPlacement``: a role without a resource gets no requests or limits.

    ``--workspace``: the first role's image becomes an image of the workspace built on it by the local Docker
    engine (:mod:`tsm.workspace.image`: content-hash tag, reused when unchanged), which the kubelet runs
    without a registry when its runtime is that engine (dockershim on this machine, as ``scripts/k8s-up``).

    ``client`` is the seam to the cluster (tests pass a client of ``tests/schedulers/kubernetes/fake_kube.py``).
    """

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
        self._docker: ImageEngine | None = None
        self._keeper = client is None  # a fake cluster given by the caller cannot be reached by another process
        #: app id -> the follows of the old pods a waiting retry stopped (joined before its new Jobs are made)
        self._retry_follows: dict[str, builtins.list[threading.Thread]] = {}

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
        req = build_request(app, opts, self.session_name, str(store_root()), time.time(), owner())
        plans = [p for p in (ImagePlan.from_metadata(r) for r in app.roles) if p is not None]
        if plans and opts.image_pull_policy == "Always":
            raise InvalidRunOptionError(
                f"image_pull_policy=Always cannot run the workspace image {plans[0].tag}: it is built on the local "
                "Docker engine, not in a registry; use IfNotPresent (the default) or Never"
            )
        req.builds = [p.to_dict() for p in plans]
        return AppDryRunInfo(request=req, fmt=format_request)

    # -- workspaces --------------------------------------------------------------------------------------
    def _docker_client(self) -> ImageEngine:
        if self._docker is None:
            self._docker = ImageEngine()
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
        d = self._dir(req.app_id)
        app = dryrun_info.app or AppDef.from_dict(req.spec)
        d.save_submission(req.to_json(), AppRecord("kubernetes", req.session, app, os.getcwd(), {}))
        try:
            svc = client.create_service(req.service)
            uid = svc["metadata"]["uid"]
            d.write("service-uid", uid)
            if req.secret:  # the env values, owned by the Service: deleted with it
                client.create_secret(with_owner(req.secret, uid, req.app_id))
            self._watcher.submitted(req.app_id)
            self._create_jobs(req, client, req.jobs)
        except SchedulerError as e:
            with contextlib.suppress(SchedulerError):
                client.delete_app(req.app_id, 0)
            self._write_final(req, AppState.FAILED, f"could not be created: {e}")
            raise SubmissionError(f"app {req.app_id} could not be created: {e}") from e
        self._ensure_keeper()
        return req.app_id

    def _ensure_keeper(self, by_a_look: bool = False) -> None:
        """Have this home's Kubernetes keeper (:func:`tsm.schedulers.common.keeper.ensure`) look at its running
        apps: at each submission, and at most every :data:`~tsm.schedulers.common.keeper.CHECK_EVERY` seconds
        ``by_a_look`` that saw a running app of the home. Not for a client given by the caller (the fake
        cluster: another process cannot reach it)."""
        if self._keeper:
            from tsm.schedulers.common import keeper

            keeper.ensure("kubernetes", store_root(), keeper.CHECK_EVERY if by_a_look else 0.0)

    def _dns(self, req: KubernetesRequest, client: KubeClient) -> bool:
        if req.dns != "auto":
            return req.dns == "yes"
        d = self._dir(req.app_id)
        if d.read("dns") is None:
            d.write("dns", "yes" if client.has_dns() else "no")
        return d.read("dns") == "yes"

    def _create_jobs(self, req: KubernetesRequest, client: KubeClient, jobs: builtins.list[dict[str, Any]]) -> None:
        """Create ``jobs`` owned by the Service; without DNS, rank 0 first, then its pod IP to the others.

        Without DNS rank 0 reads its own pod IP (downward API) as ``TSM_RANK0_HOST`` and the others get that
        IP plus ``hostAliases`` for rank 0's host names, since a rendezvous (torch's c10d) advertises the
        host's FQDN, which only the cluster DNS would otherwise resolve.
        """
        uid = self._dir(req.app_id).read("service-uid") or ""
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
                    if not is_status(e, 409):  # 409: another process watching the app created it first
                        raise
            ip = self._rank0_ip(req, client)
        for j in rest:
            try:
                client.create_job(with_owner(with_rank0(j, ip) if ip else j, uid, req.app_id))
            except SchedulerError as e:
                if not is_status(e, 409):  # 409: another process watching the app created it first
                    raise

    def _rank0_ip(self, req: KubernetesRequest, client: KubeClient) -> str:
        """Rank 0's pod IP once it has one (the sandbox exists), within the gang timeout."""
        role0 = req.roles[0][0]

        def ip() -> str | None:
            pods = [from_json(p) for p in client.list_pods(req.app_id)]
            floor = self._dir(req.app_id).attempts().get(role0, 0)
            mine = [p for p in pods if p.role == role0 and p.replica_id == 0 and not p.deleting and p.attempt >= floor]
            latest = max(mine, key=lambda p: (p.attempt, p.created), default=None)
            return latest.ip if latest is not None and latest.ip else None

        return poll_until(ip, req.gang_timeout, initial=0.1, cap=1.0) or ""  # "": the gang timeout fails the app

    # -- status: observe -> decide -> act -------------------------------------------------------------
    def _dir(self, app_id: str) -> AppDir:
        return AppDir(store_root(), app_id)

    def _request(self, app_id: str) -> KubernetesRequest | None:
        """The request this home submitted for ``app_id``; None for an app it did not submit."""
        text = self._dir(app_id).request_json()
        try:
            return KubernetesRequest.from_json(text) if text else None
        except (ValueError, TypeError, KeyError):
            return None

    def _snapshot(self) -> dict[str, DescribeAppResponse]:
        out: dict[str, DescribeAppResponse] = {}
        listed = time.time()
        pods = [from_json(p) for p in self.client.list_pods()]
        for app_id, view in group(pods).items():
            d = self._dir(app_id)
            if d.cancelling or d.exists("final.json"):
                continue  # final.json answers (through lookup)
            out[app_id] = self._look(view, listed)
            if not out[app_id].state.is_terminal and d.exists("request.json"):
                self._ensure_keeper(by_a_look=True)  # a keeper gone with a reboot or a kill starts again
        return out

    def _lookup(self, ids: builtins.list[str]) -> dict[str, DescribeAppResponse]:
        out = {}
        for app_id in ids:
            kept = kept_status(self._dir(app_id))
            if kept is not None:
                out[app_id] = kept
                continue
            req = self._request(app_id)
            if req is None:
                continue
            client = self._client_of(req)
            listed = time.time()
            pods = [from_json(p) for p in client.list_pods(app_id)]
            view = AppView(app_id, req.roles, float(req.service["metadata"]["annotations"][ANN_CREATED]), pods)
            out[app_id] = self._look(view, listed)
        return out

    def _final(self, app_id: str) -> DescribeAppResponse | None:
        return self._dir(app_id).final()

    def _describe_view(self, view: AppView, st: AppStatusView | None = None) -> DescribeAppResponse:
        st = st or app_status(view)
        return DescribeAppResponse(app_id=view.app_id, state=st.state, msg=st.msg, num_restarts=st.num_restarts,
                                   created=view.created, roles_statuses=st.roles,
                                   structured_error_msg=failure_of(st.state, st.msg, st.roles))

    def _look(self, view: AppView, listed: float | None = None) -> DescribeAppResponse:
        """One controller step: observe (``view``, less the pods of tries already replaced), decide, act;
        under the app directory's lock (:func:`~.stall.locked`) for an app this home submitted, so two
        processes looking at it act in turn. ``view`` was listed (at ``listed``; None: unknown) before the
        lock was held: when the app was finished meanwhile (by the look that held it), its kept final status
        answers; when a cancel, a finish or a remove is under way, it is reported, nothing is done; when
        another look listed the pods later than this one (``listed-at``), they are listed again, so a pod
        made in between (and recorded in ``pods-seen.json``) is not taken for one the cluster took away."""
        req = self._request(view.app_id)
        if req is None:  # not submitted from this home: report only
            return self._describe_view(view)
        d = self._dir(view.app_id)
        # a look that is stopping the app holds the lock through the pods' grace period (it follows their
        # last lines): another look does not wait that long, it reports the stop under way
        with locked(d, give_up=lambda: d.exists(FINISHING) or d.cancelling) as held:
            if not held:
                desc = self._describe_view(view)
                if d.exists():
                    desc.state, desc.msg = AppState.RUNNING, "being stopped (by another look at it)"
                return desc
            final = d.final()
            if final is not None:
                return final
            if not d.exists(REQUEST_FILE):  # removed meanwhile (tsm remove): report only
                return self._describe_view(view)
            if d.cancelling or d.exists(FINISHING):  # a cancel or a finish is under way: it acts, not this look
                desc = self._describe_view(view)
                desc.state, desc.msg = AppState.RUNNING, "being stopped (by another look at it)"
                return desc
            last = _number(d.read(LISTED_AT))
            if listed is None or last >= listed:  # another look's list is newer than this one's: list again
                listed = time.time()
                pods = [from_json(p) for p in self._client_of(req).list_pods(view.app_id)]
                view = AppView(view.app_id, view.roles, view.created, pods)
            d.write(LISTED_AT, f"{listed:.6f}")
            return self._step(req, view)

    def _step(self, req: KubernetesRequest, view: AppView) -> DescribeAppResponse:
        """The body of :meth:`_look` (the caller holds the app's lock)."""
        d = self._dir(view.app_id)
        if d.exists(RETRY):  # a preemption's new try waits for the old pods to end
            waiting = self._resume_retry(req, view)
            if waiting is not None:
                return waiting
        attempts = d.attempts()
        view = AppView(view.app_id, view.roles, view.created,
                       [p for p in view.pods if p.attempt >= attempts.get(p.role, 0)])
        stall = self._stalls(req, view)
        self._mark_lost(req, view, attempts, set(stall.stalled) if stall is not None else set())
        st = app_status(view)
        latest = [p.created for p in view.pods if p.attempt == view.attempt]
        since = max(view.created or 0.0, _number(d.read(TRIED_AT)), min(latest, default=0.0))
        clock = _number(d.read(CLOCK)) or view.created
        limits = None if req.time_limit is None else Limits(
            # the kubelet ends each pod at its deadline; a look ends the app only well past it (a backstop
            # for an app whose retries together outlast the limit), so the pods' own ends are seen first;
            # with requeue_on_time_limit the look requeues at the limit (the deadline is the backstop)
            req.time_limit, started=clock, slack=0.0 if req.requeue_on_time_limit else req.grace_period + 30.0,
            # the kubelet ended a pod at its activeDeadlineSeconds (the same limit, less the warning's lead)
            reached=any(p.reason == "DeadlineExceeded" for p in view.pods),
            requeue=req.requeue_on_time_limit,
        )
        now = time.time()
        if limits is not None and any(
            p.reason == "DeadlineExceeded" and p.exit_code is None and (p.started or now) + limits_end(req) > now
            for p in view.pods
        ):
            # the kubelet marks the pod Failed as it starts ending it (warning hook, SIGTERM, grace) and, on
            # some versions (1.20), never updates the container's state after: its last lines are still to
            # come, so the app is reported stopping until the container has ended or must have (its start,
            # the deadline and the whole grace period)
            desc = self._describe_view(view, st)
            desc.state, desc.msg = AppState.RUNNING, f"{limits.message}: stopping"
            return desc
        decision: Decision
        if stall is not None and stall.failed:  # on_stall=fail
            decision = Finish(AppState.FAILED, stall.failed, stop=True)
        else:
            shape = shapes(view.roles)
            stalled_roles = {p.role for p in view.pods if p.stalled}
            # a stall is retried by tsm: a REPLICA role's (whose Job retries only its own exits) as ROLE
            shape = [dataclasses.replace(r, policy="ROLE") if r.name in stalled_roles and r.policy == "REPLICA"
                     else r for r in shape]
            preemptions, role_preemptions = self._preemption_counts(d)
            decision = decide(st, shape, attempts, owned=True, gang_timeout=req.gang_timeout,
                              waiting_since=since, now=now, limits=limits,
                              preemptions=preemptions, role_preemptions=role_preemptions,
                              max_preemptions=req.max_preemptions)
        return self.act(req, view, st, decision)

    def _preemptions(self, d: AppDir) -> builtins.list[tuple[int, tuple[str, ...]]]:
        """The restarts of the app made as preemptions, each ``(attempt, roles)`` (``preemptions.json``)."""
        return preemption_events(d)

    def _record_preemption(self, d: AppDir, attempt: int, roles: Sequence[str]) -> None:
        """Add the preemption restart of ``roles`` into try ``attempt`` (idempotent; the caller holds the
        app's lock, so no other process's record is lost)."""
        record_preemption(d, attempt, roles)

    def _preemption_counts(self, d: AppDir) -> tuple[int, dict[str, int] | None]:
        """``(preemptions, role_preemptions)`` for :func:`decide` (:func:`count_preemptions`). An app
        directory of an earlier version keeps a bare count (``preemptions``, roles unknown): it adds to the
        total, and ``role_preemptions`` is then None (decide counts it for every role, as it did)."""
        total, by_role = count_preemptions(roles for _, roles in self._preemptions(d))
        old = int(_number(d.read(OLD_PREEMPTIONS)))
        return (total + old, None) if old else (total, by_role)

    def _stalls(self, req: KubernetesRequest, view: AppView) -> StallState | None:
        """The stall check of an app with ``stall_timeout`` (:mod:`.stall`; at most one per tick): each stall
        found is recorded in ``stall.json`` (with ``on_stall=fail``, the app's failure too) before anything is
        done about it, and every pod of ``view`` found stalled, now or by an earlier look, is marked so
        (:attr:`~.status.Pod.stalled`). None without ``stall_timeout``. The caller holds the app's lock."""
        if req.stall_timeout is None:
            return None
        d = self._dir(req.app_id)
        stall = StallState.load(d)
        if not (stall.failed or d.cancelling or d.exists(FINISHING)):
            found = check(self._client_of(req), req.app_id, stall, view.pods, req.stall_timeout, time.time())
            for p, why in found:
                stall.stalled[p.name] = why
                if req.on_stall == "fail" and not stall.failed:
                    stall.failed = f"role '{p.role}' replica {p.replica_id} {why}"
            stall.save(d)
        for p in view.pods:
            p.stalled = stall.stalled.get(p.name, "")
        return stall

    def _mark_lost(self, req: KubernetesRequest, view: AppView, attempts: dict[str, int],
                   stalled: builtins.set[str] | None = None) -> None:
        """Mark each pod of ``view`` the cluster took away though tsm is not deleting it (no cancel, no finish
        under way; replaced tries are out of ``view``) as lost: one being deleted (the eviction API, the
        scheduler's preemption and a drain only delete the pod on 1.20), and one a look saw before that is no
        longer listed (deleted and gone between two looks; on 1.20 its Job has made another pod meanwhile),
        which is added to ``view`` as a Failed pod. The pods seen are kept in ``pods-seen.json``. One node
        list, only when a pod was lost: a pod whose node is gone, or not Ready, was lost with it."""
        d = self._dir(req.app_id)
        if d.cancelling or d.exists(FINISHING) or d.final() is not None:
            return
        try:
            seen: dict[str, builtins.list[Any]] = json.loads(d.read(SEEN) or "{}")
        except ValueError:
            seen = {}
        listed = {p.name for p in view.pods}
        now_seen = {p.name: [p.role, p.replica_id, p.attempt, p.node, p.created, p.phase, p.exit_code, p.deleting]
                    for p in view.pods}
        kept = {n: v for n, v in seen.items() if int(v[2]) >= attempts.get(str(v[0]), 0)}
        stalled = stalled or set()  # pods tsm stopped for a stall: tsm deleted them, the cluster did not
        vanished = [n for n, v in kept.items() if n not in listed and v[5] != "Succeeded" and n not in stalled]
        for n in vanished:
            role, k, attempt, node, created, phase = kept[n][:6]
            code, deleting = (kept[n][6:8] + [None, True])[:2]  # a record of an earlier version has neither
            # one last seen Failed by its own exit (not being deleted then) was deleted after (pod GC, a
            # cleanup): its failure is the program's, not a loss
            own_exit = phase == "Failed" and code is not None and not deleting
            view.pods.append(Pod(name=n, app_id=req.app_id, role=str(role), replica_id=int(k), attempt=int(attempt),
                                 phase="Failed", created=float(created), node=str(node), deleting=not own_exit,
                                 exit_code=int(code) if own_exit else None))
        merged = {**kept, **now_seen}
        if merged != seen:
            d.write(SEEN, json.dumps(merged))
        # a pod tsm stopped for a stall is being deleted by tsm: not lost
        gone = [p for p in view.pods if p.deleting and not p.lost and p.name not in stalled and p.phase != "Succeeded"]
        if not gone:
            return
        ready = self._client_of(req).node_ready()
        for p in gone:
            if p.node and p.node not in ready:
                p.lost, p.node_lost = f"node lost: {p.node} is gone", True
            elif p.node and not ready[p.node]:  # the taint manager deletes the pods of an unreachable node
                p.lost, p.node_lost = f"node lost: {p.node} is not Ready", True
            else:
                p.lost = DELETED_BY_CLUSTER + (f" on node {p.node}" if p.node else "")

    def _excluded(self, req: KubernetesRequest) -> dict[str, str]:
        """``{node: why}``: the nodes the app's pods must not run on (``exclude_nodes``, and the nodes its
        replicas were lost with)."""
        out = dict.fromkeys(req.exclude_nodes, "exclude_nodes")
        try:
            kept = json.loads(self._dir(req.app_id).read(EXCLUDED) or "{}")
            out.update({str(k): str(v) for k, v in kept.items()})
        except (ValueError, AttributeError):
            pass
        return out

    def _resume_retry(self, req: KubernetesRequest, view: AppView) -> DescribeAppResponse | None:
        """Make a preemption's new Jobs (``retry.json``) once no pod of the replaced tries still runs (or
        the grace period and :data:`RETRY_WAIT_MARGIN` have passed); until then the app is RUNNING,
        "restarting". None once made (or when there is nothing to make)."""
        d = self._dir(req.app_id)
        try:
            data = json.loads(d.read(RETRY) or "")
            roles, attempt, jobs = set(data["roles"]), int(data["attempt"]), list(data["jobs"])
        except (ValueError, KeyError, TypeError):
            (d.path / RETRY).unlink(missing_ok=True)
            return None
        old = [p for p in view.pods if p.role in roles and p.attempt < attempt]
        running = [p for p in old if p.exit_code is None and p.phase in ("Pending", "Running") and p.started]
        if running and time.time() - float(data.get("at", 0)) < req.grace_period + RETRY_WAIT_MARGIN:
            return DescribeAppResponse(
                app_id=view.app_id, state=AppState.RUNNING, created=view.created,
                num_restarts=int(data.get("restarts", 0)),
                msg=f"restarting after {data.get('why', 'a preemption')}: waiting for {len(running)} pod(s) of the "
                    "last try to end")
        client = self._client_of(req)
        for t in self._retry_follows.pop(req.app_id, []):  # this process followed them: their logs kept whole
            t.join(req.grace_period + FOLLOW_MARGIN)
        for p in old:  # their last lines (the warning's, the grace period's) since the retry's snapshot
            self._snapshot_log(req.app_id, client, p, again=True)
        d.write(TRIED_AT, f"{time.time():.3f}")
        self._create_jobs(req, client, jobs)
        (d.path / RETRY).unlink(missing_ok=True)
        return None

    def act(self, req: KubernetesRequest, view: AppView, st: AppStatusView, decision: Decision) -> DescribeAppResponse:
        """Do what :func:`~tsm.schedulers.common.controller.decide` said (this home's apps only): a
        :class:`Retry` deletes the scope's Jobs and makes them anew; a :class:`Finish` keeps the logs and the
        final status (replicas still running: CANCELLED after a failure, FAILED by a gang timeout) and
        deletes every object of the app. Returns the status to report."""
        if isinstance(decision, Retry):
            d = self._dir(req.app_id)
            failed = next((p for p in view.pods if st.first_failure is not None and p.attempt == view.attempt
                           and (p.role, p.replica_id) == st.first_failure), None)
            code = failed.exit_code if failed is not None else None
            stalled = failed is not None and bool(failed.stalled)
            last = decision.last_exit or ("stalled" if stalled else
                                          "failed:" + (str(code) if code is not None else "unknown"))
            msg = f"retrying after {decision.why}"
            if decision.preemption:  # counted before anything is made: a crash after it never retries for free
                self._record_preemption(d, decision.attempt, decision.roles)
            if decision.time_limit:  # a requeue: the limit counts again from now
                d.write(CLOCK, f"{time.time():.3f}")
            lost_nodes = {p.node: f"role '{p.role}' replica {p.replica_id} was lost with it ({p.lost})"
                          for p in view.pods if p.node_lost and p.node}
            # failures the node caused (its OOM killer, its GPUs): its failure for max_retries, but off that node
            faulty_nodes = {p.node: f"the kernel's OOM killer ended role '{p.role}' replica {p.replica_id} (attempt "
                                    f"{p.attempt}; no memory limit of its own: the node ran out)"
                            for p in view.pods if node_oom(p) and p.attempt == view.attempt and p.node not in lost_nodes}
            if (failed is not None and failed.gpu_req and failed.node and not decision.preemption and not stalled
                    and failed.node not in lost_nodes and failed.node not in faulty_nodes):
                # a GPU pod's failure on a node whose device plugin has since withdrawn GPUs as unhealthy
                gone = self._client_of(req).gpus_withdrawn().get(failed.node)
                if gone is not None:
                    faulty_nodes[failed.node] = (
                        f"a GPU fault under role '{failed.role}' replica {failed.replica_id} (attempt {failed.attempt}): "
                        f"the device plugin withdrew {gone[0]} of the node's {gone[1]} GPUs as unhealthy")
            before = self._excluded(req) if lost_nodes or faulty_nodes else {}
            if faulty_nodes:  # never the last Ready node: the retry would wait for a node that does not exist
                ready = {n for n, ok in self._client_of(req).node_ready().items() if ok}
                if not ready - set(before) - set(lost_nodes) - set(faulty_nodes):
                    msg += f"; node(s) {', '.join(sorted(faulty_nodes))} not excluded: no other Ready node"
                    faulty_nodes = {}
            if lost_nodes or faulty_nodes:
                excluded = {**before, **faulty_nodes, **lost_nodes}
                d.write(EXCLUDED, json.dumps({k: v for k, v in excluded.items() if v != "exclude_nodes"}))
                msg += f"; excluding node(s) {', '.join(sorted({*lost_nodes, *faulty_nodes}))}"
            self._retry(req, view, decision.roles, decision.attempt,
                        attempt_env(decision.attempt, st.num_restarts + 1, last), why=decision.why,
                        # the old pods end first (warned, their grace period), unless their node is lost;
                        # a stalled pod is warned and stopped the same way
                        wait=(decision.preemption or stalled) and not lost_nodes, restarts=st.num_restarts + 1)
            return DescribeAppResponse(app_id=view.app_id, state=AppState.RUNNING, created=view.created,
                                       num_restarts=st.num_restarts + 1, msg=msg)
        desc = self._describe_view(view, st)
        if isinstance(decision, Finish):
            desc.state, desc.msg = decision.state, decision.msg
            for rs in desc.roles_statuses:
                for r in rs.replicas:
                    if decision.gang and not r.state.is_terminal:
                        r.state, r.error_msg = AppState.FAILED, r.error_msg or decision.msg
                    elif decision.time_limit and r.state != AppState.SUCCEEDED:
                        r.state, r.error_msg = AppState.FAILED, decision.msg
                    elif decision.stop and not r.state.is_terminal:
                        r.state, r.error_msg = AppState.CANCELLED, f"stopped: {decision.msg}"
            desc.structured_error_msg = failure_of(desc.state, desc.msg, desc.roles_statuses)
            # survivors of a failed app are stopped as a cancel stops them: SIGTERM, the grace period, SIGKILL
            self._finish(req, desc, view.pods, grace=req.grace_period if decision.stop else 0)
        return desc

    def _retry(self, req: KubernetesRequest, view: AppView, roles: Sequence[str], attempt: int,
               env: dict[str, str] | None = None, why: str = "", wait: bool = False, restarts: int = 0) -> None:
        """Delete the Jobs of ``roles``, logs snapshotted, and create them anew as try ``attempt`` (with
        ``env``: the attempt's ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT``, ``TSM_LAST_EXIT``; and the excluded
        nodes' anti-affinity term).

        The new try is recorded first (``attempts.json``), so a refresh that still sees the old pods while
        they are being deleted does not retry again; the new Jobs carry ``tsm/attempt`` too. With ``wait``
        (a preemption) the old pods are deleted with the grace period (the warning hook runs) and the new
        Jobs are kept in ``retry.json``, made by a later look once the old pods have ended
        (:meth:`_resume_retry`); ``retry.json`` is written before ``attempts.json``, so no look in between
        decides again.
        """
        client = self._client_of(req)
        d = self._dir(req.app_id)
        exclude = sorted(self._excluded(req))
        jobs = [j for j in req.jobs if j["metadata"]["annotations"][ANN_ROLE] in roles]
        new = [retried(j, req.app_id, attempt, env, exclude) for j in jobs]
        if wait:
            d.write(RETRY, json.dumps({"roles": list(roles), "attempt": attempt, "jobs": new, "why": why,
                                       "restarts": restarts, "at": time.time()}))
        attempts = d.attempts()
        attempts.update(dict.fromkeys(roles, attempt))
        d.set_attempts(attempts)
        for p in view.pods:
            if p.role in roles:
                self._snapshot_log(req.app_id, client, p)
        if wait:  # the old pods are warned and stopped with the grace period: what they write meanwhile is kept
            running = [p for p in view.pods if p.role in roles and p.phase == "Running" and p.exit_code is None
                       and not p.deleting]
            self._retry_follows[req.app_id] = self._follow_to_end(req.app_id, client, running,
                                                                  req.grace_period + FOLLOW_MARGIN)
        for j in jobs:
            client.delete_job_of(req.app_id, j["metadata"]["labels"][LABEL_ROLE], j["metadata"]["labels"][LABEL_REPLICA],
                                 grace=req.grace_period if wait else 0)
        if not wait:
            d.write(TRIED_AT, f"{time.time():.3f}")
            self._create_jobs(req, client, new)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's status from one pod list shared by every app of the process.

        A look is a controller step (:meth:`act`, see the module doc): for an app this home submitted it
        may retry Jobs, or delete every object of an app that has ended (its logs and status kept here).
        """
        desc = with_record(self._watcher.get(app_id), self._dir(app_id).path / "app.json")
        req = self._request(app_id) if desc is not None else None
        if desc is not None and req is not None:
            excluded = self._excluded(req)
            if excluded:  # which nodes the app's pods avoid, and why (issue 25)
                desc.metadata["excluded_nodes"] = "; ".join(f"{n}: {why}" for n, why in sorted(excluded.items()))
            preemptions, _ = self._preemption_counts(self._dir(app_id))
            if preemptions:
                desc.metadata["preemptions"] = f"{preemptions} of max_preemptions={req.max_preemptions}"
        return desc

    def list(self) -> builtins.list[ListAppResponse]:
        # an app just submitted whose pods are not made yet is asked of the watcher (its lookup reads the request)
        return list_rows(store_root(), self._watcher.all(), self._watcher.get)

    # -- views (tsm top / tsm serve) ----------------------------------------------------------------------
    def view_snapshot(self, app_ids: Sequence[str]) -> builtins.list[ViewApp]:
        """The views' batched refresh (:class:`tsm.schedulers.api.BatchedViews`): every app of ``app_ids``
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
            listed = time.time()
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
                if self._dir(app_id).cancelling:
                    desc = DescribeAppResponse(app_id=app_id, state=AppState.RUNNING, msg="being cancelled",
                                               created=view.created, roles_statuses=app_status(view).roles)
                else:
                    desc = self._look(view, listed)
                out.append(self._view_of(desc, _pods_by_replica(view), usage, req.app_name if req else None))
        return out

    def _view_of(self, desc: DescribeAppResponse, pods: dict[tuple[str, int], Pod],
                 usage: dict[str, tuple[float, float]] | None, name: str | None) -> ViewApp:
        """One app as the views show it: ``desc`` (:func:`~tsm.schedulers.common.viewmodel.view_of_describe`, requests
        from the submitted app) plus, per replica, its pod's IP, requests, start and end, and usage."""
        from tsm.schedulers.common.viewmodel import requests_of, view_of_describe

        record = self._dir(desc.app_id).record()
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
        if not pods and desc.state.is_terminal:  # its pods are gone: the final status kept when it started and ended
            view.started, view.ended = self._dir(desc.app_id).final_times()
        return view

    # -- cancel / finish -----------------------------------------------------------------------------------
    def cancel(self, app_id: str) -> None:
        """Delete every object of the app (pods get ``grace_period`` after SIGTERM), its logs and final
        status kept. Only this owner's objects are seen: another user's app is unknown here.

        The app's status is asked first (a look, which takes the app's lock); the marker, the pod list and
        the deletion are then done under the lock, so no look makes Jobs after them (it waits, then finds
        the final status)."""
        current = self.describe(app_id)
        if current is None or current.state.is_terminal:
            return
        req = self._request(app_id)
        client = self._client_of(req)
        d = self._dir(app_id)
        with contextlib.ExitStack() as stack:
            if req is not None and stack.enter_context(locked(d)) and d.final() is not None:
                return  # finished by the look that held the lock
            stack.enter_context(d.cancel_marker())
            pods = [from_json(p) for p in client.list_pods(app_id)]
            desc = DescribeAppResponse(app_id=app_id, state=AppState.CANCELLED, msg="cancelled", created=current.created,
                                       num_restarts=current.num_restarts, roles_statuses=current.roles_statuses)
            for rs in desc.roles_statuses:
                for r in rs.replicas:
                    if r.state != AppState.SUCCEEDED:
                        r.state, r.error_msg = AppState.CANCELLED, "cancelled"
            if req is not None:
                self._finish(req, desc, pods, grace=req.grace_period)
            else:
                client.delete_app(app_id, 10)
        self._watcher.invalidate()

    def _finish(self, req: KubernetesRequest, desc: DescribeAppResponse, pods: builtins.list[Pod],
                grace: int = 0) -> None:
        """Snapshot every pod's log, delete the app's objects (all of them), then write the final status (with
        the app's start and end). In that order: a delete that fails (an API timeout) leaves no final status,
        so the next describe sees the objects again and finishes the app then, rather than reporting it ended
        while its pods run on."""
        client = self._client_of(req)
        d = self._dir(req.app_id)
        # first: its pods now being deleted are not evictions, and a look does not wait on this one's lock
        d.write(FINISHING, "")
        try:
            for p in pods:
                self._snapshot_log(req.app_id, client, p)
            starts = [p.started for p in pods if p.started]
            ends = [p.finished for p in pods if p.finished]
            # a pod stopped with a grace period (warned first) writes on after the snapshot: follow it to its end
            running = [p for p in pods if grace and p.phase == "Running" and p.exit_code is None and not p.deleting]
            follows = self._follow_to_end(req.app_id, client, running, grace + FOLLOW_MARGIN)
            client.delete_app(req.app_id, grace)
        except BaseException:  # nothing was stopped: the next look sees the app as it is, and finishes it then
            (d.path / FINISHING).unlink(missing_ok=True)
            raise
        for t in follows:
            t.join(grace + FOLLOW_MARGIN)
        self._dir(req.app_id).save_final(desc, min(starts) if starts else None, max(ends) if ends else None)

    def _follow_to_end(self, app_id: str, client: KubeClient, pods: builtins.list[Pod],
                       timeout: float) -> builtins.list[threading.Thread]:
        """For each of ``pods``, two follows opened now (plain, and stamped for ``--since/--until``) and read
        to the container's end in a thread each, which then keeps that copy of the log
        (:meth:`~.logs.KubernetesLogs._keep_followed`): the lines a pod writes while it is stopped (after the
        warning, within the grace period) are kept, though its container goes with it."""
        threads = []
        for p in pods:
            for stamped in (False, True):  # the plain log, and the stamped copy that --since/--until read
                try:
                    chunks = client.follow_open(p.name, timeout, timestamps=stamped)
                except SchedulerError:
                    break  # gone already: its snapshot is what there is
                t = threading.Thread(target=self._keep_followed, args=(app_id, p, chunks, stamped), daemon=True)
                t.start()
                threads.append(t)
        return threads

    def _write_final(self, req: KubernetesRequest, state: AppState, msg: str) -> None:
        now = time.time()
        self._dir(req.app_id).save_final(ended_status(req.app_id, req.roles, state, msg), now, now)

    def remove(self, app_id: str) -> bool:
        """Delete the app's objects and everything kept of it in ``$TSM_HOME``."""
        req = self._request(app_id)
        d = self._dir(app_id)
        found = False
        with contextlib.ExitStack() as stack:
            if req is not None:
                stack.enter_context(locked(d))  # no look acts meanwhile; one waiting finds the app gone
                d.write(FINISHING, "")
                try:
                    self._client_of(req).delete_app(app_id, 0)
                except BaseException:
                    (d.path / FINISHING).unlink(missing_ok=True)
                    raise
                found = True
            found = d.remove() or found  # never made again: a lock does not make the directory
        self._watcher = self._new_watcher()
        return found

    def cleanup(self, include_running: bool = False, older_than: float = 0.0,
                dry_run: bool = False) -> builtins.list[str]:
        """Delete what is left on the cluster of this owner's ended tsm apps of the namespace; returns their ids.

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
                        # under the app's lock, as a look finishes it: never two finishes of one app (a
                        # second would save the logs again over the first's copy and rewrite its status)
                        d = self._dir(app_id)
                        with locked(d) as held:
                            if not held or d.final() is not None:
                                # finished meanwhile (or removed: its folder is gone): only what is left of it
                                self.client.delete_app(app_id, 0)
                            else:
                                again = group([from_json(p) for p in self.client.list_pods(app_id)]).get(app_id)
                                if again is None:
                                    continue  # its objects are gone already
                                now_desc = self._describe_view(again)
                                if not now_desc.state.is_terminal:
                                    continue  # a look retried it meanwhile: it runs again
                                self._finish(req, now_desc, again.pods)
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

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()


def _number(text: str | None) -> float:
    """A number kept in a file of the app directory; 0 when absent or unreadable."""
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


def _pods_by_replica(view: AppView) -> dict[tuple[str, int], Pod]:
    """The pod that is each replica now (see :func:`~tsm.schedulers.kubernetes.status.latest_pod`)."""
    by: dict[tuple[str, int], builtins.list[Pod]] = {}
    for p in view.pods:
        by.setdefault((p.role, p.replica_id), []).append(p)
    return {k: pod for k, pods in by.items() if (pod := latest_pod(pods)) is not None}



__all__ = ["RANK0_VAR", "KubernetesScheduler"]
