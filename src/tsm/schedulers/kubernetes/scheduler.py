"""KubernetesScheduler: the interface, gluing the pure request/status modules to the API client.

Local store ``$TSM_HOME/kubernetes/<app_id>/`` (:class:`~tsm.schedulers.common.appdir.AppDir`: private files,
written whole): ``request.json`` (the manifests, to recreate Jobs for ROLE/APPLICATION retries),
``attempts.json`` (the try each role is on; the new Jobs carry it too, label ``tsm/attempt``), ``app.json``
(the :class:`AppRecord`), ``logs/<host>/<attempt>-<created>-<pod>.log`` (each pod's log, snapshotted before
tsm deletes the pod: :mod:`.logs`) and ``final.json`` (the last status and the app's start and end, written
when the app's objects are deleted: by ``cancel``, a final failure, the gang timeout, or cleanup). For long
runs: ``preemptions.json`` (the restarts made as preemptions, each ``[attempt, [roles]]``: spent
from ``max_preemptions``, and not from the restarted roles' ``max_retries``; an older bare ``preemptions``
count is still read), ``clock`` (when the time
limit counts from: the last requeue), ``excluded.json`` (nodes the next tries avoid, and why),
``retry.json`` (a preemption's new Jobs, made once the old pods have ended), ``tried-at`` (when the current
try was made: its gang timeout counts from there), ``pods-seen.json`` (the pods of the current tries a look
saw: one gone since was taken by the cluster), ``finishing`` (tsm is deleting the app's objects: a pod
being deleted is then not an eviction), ``stall.json`` (the stall check's marks and the stalls found:
:mod:`.stall`) and ``lock`` (the ``flock`` every look of the app holds, :func:`~tsm.schedulers.common.container_lock.locked`).

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
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tsm.env import image as env_image
from tsm.errors import InvalidRunOptionError, SchedulerError, SubmissionError
from tsm.schedulers.api import DescribeAppResponse, LockfileEnvironments
from tsm.schedulers.common.appdir import REQUEST as REQUEST_FILE, AppDir
from tsm.schedulers.common.container import mark_cancelled
from tsm.schedulers.common.container_lock import locked
from tsm.schedulers.common.controller import (
    Decision,
    Finish,
    Limits,
    Retry,
    count_preemptions,
    decide,
    shapes,
)
from tsm.schedulers.common.failure import failure_of
from tsm.schedulers.common.owner import owner
from tsm.schedulers.common.record import AppRecord
from tsm.schedulers.common.status import AppStatusView
from tsm.schedulers.kubernetes.client import KubeClient
from tsm.schedulers.kubernetes.debug import KubernetesDebug
from tsm.schedulers.kubernetes.dryrun import format_request
from tsm.schedulers.kubernetes.logs import FOLLOW_MARGIN
from tsm.schedulers.kubernetes.manifests import with_owner
from tsm.schedulers.kubernetes.nodes import avoid_for_retry, check_fits, excluded, mark_lost
from tsm.schedulers.kubernetes.request import (
    ANN_CREATED,
    RANK0_VAR,
    KubernetesOptions,
    KubernetesRequest,
    attempt_env,
    build_request,
    validate,
)
from tsm.schedulers.kubernetes.secrets import KubernetesSecrets, app_secret, with_secrets
from tsm.schedulers.kubernetes.stall import StallState, check
from tsm.schedulers.kubernetes.status import (
    AppView,
    Pod,
    app_status,
    from_json,
    group,
    never_starts,
    parse_time,
)
from tsm.schedulers.kubernetes.tries import RETRY, TRIED_AT, KubernetesTries
from tsm.specs.api import AppDef, AppDryRunInfo, AppState
from tsm.specs.runopts import CfgVal, runopts
from tsm.store import tsm_home
from tsm.workspace.image import ImagePlan, build_image

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.kubernetes.view import KubernetesView


#: the app directory's files of long runs (see the module doc)
PREEMPTIONS, CLOCK, FINISHING = "preemptions.json", "clock", "finishing"
#: the preemption counter of earlier versions (a bare number, roles unknown): still counted when present
OLD_PREEMPTIONS = "preemptions"
#: when the pod list of the last look that held the app's lock was taken (a look whose own list is older
#: lists again under the lock: a pod made in between is not taken for one that vanished)
LISTED_AT = "listed-at"

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


class KubernetesScheduler(KubernetesTries, LockfileEnvironments, KubernetesDebug, KubernetesSecrets):
    """Runs each replica as a ``batch/v1`` Job behind one headless Service (see :mod:`tsm.schedulers.kubernetes`),
    on the container kit (:class:`~tsm.schedulers.common.container.ContainerScheduler`).

    Capabilities: ``WorkspaceBuilder`` (below) and ``BatchedViews`` (one pod list per view refresh:
    :mod:`tsm.schedulers.kubernetes.view`). Not ``SizedPlacement``: a role without a resource gets no
    requests or limits. ``PresetAppIds``: the dry run names the app (``--after`` holds it).

    ``--workspace``: the first role's image becomes an image of the workspace built on it by the local Docker
    engine (:mod:`tsm.workspace.image`: content-hash tag, reused when unchanged), which the kubelet runs
    without a registry when its runtime is that engine (dockershim on this machine, as ``scripts/k8s-up``).

    ``client`` is the seam to the cluster (tests pass a client of ``tests/schedulers/kubernetes/fake_kube.py``).
    """

    def __init__(self, session_name: str, namespace: str = "default", kubeconfig: str | None = None,
                 context: str | None = None, client: KubeClient | None = None) -> None:
        # a fake cluster given by the caller cannot be reached by another process: no keeper
        super().__init__("kubernetes", session_name, in_process=client is not None)
        self._where = (namespace, kubeconfig, context)
        self._clients: dict[tuple[str, str | None, str | None], KubeClient] = {}
        if client is not None:
            self._clients[(client.namespace, kubeconfig, context)] = client
            self._where = (client.namespace, kubeconfig, context)
        #: app id -> the follows of the old pods a waiting retry stopped (joined before its new Jobs are made)
        self._retry_follows: dict[str, builtins.list[threading.Thread]] = {}

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

    def client_for(self, req: KubernetesRequest | None) -> KubeClient:
        """The client of the cluster and namespace ``req`` was submitted to (None: the scheduler's own)."""
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
        app, env_images = env_image.apply(app, opts, lambda: self.images, "missing")  # on the kubelet's engine
        req = with_secrets(build_request(app, opts, self.session_name, str(store_root()), time.time(), owner()),
                           app)  # each Job names its role's secrets (their values: read at schedule)
        plans = [p for p in (ImagePlan.from_metadata(r) for r in app.roles) if p is not None]
        if (plans or env_images) and opts.image_pull_policy == "Always":
            raise InvalidRunOptionError(
                f"image_pull_policy=Always cannot run the image {(plans or env_images)[0].tag}: it is built on the local "
                "Docker engine, not in a registry; use IfNotPresent (the default) or Never")
        req.builds = [p.to_dict() for p in plans]
        return AppDryRunInfo(request=req, fmt=env_image.fmt(format_request, env_images) if env_images else format_request)

    def schedule(self, dryrun_info: AppDryRunInfo[KubernetesRequest]) -> str:
        req = dryrun_info.request
        client = self.client_for(req)
        secret = app_secret(req)  # the env values and the secrets' (read now, before anything is made)
        check_fits(req.app_name, req.needs, client.allocatable())
        env_image.build_all(AppDef.from_dict(req.spec), self.images)  # environment images, first
        for b in req.builds:  # workspace images, before anything exists on the cluster
            try:
                build_image(ImagePlan(**b), self.images)
            except SchedulerError as e:
                raise SubmissionError(f"app {req.app_id}: workspace image of role '{b['role']}': {e}") from e
        d = self.app_dir(req.app_id)
        app = dryrun_info.app or AppDef.from_dict(req.spec)
        d.save_submission(req.to_json(), AppRecord("kubernetes", req.session, app, os.getcwd(), {}))
        try:
            svc = client.create_service(req.service)
            uid = svc["metadata"]["uid"]
            d.write("service-uid", uid)
            client.create_secret(with_owner(secret, uid, req.app_id))  # owned by the Service: deleted with it
            self._watcher.submitted(req.app_id)
            self._create_jobs(req, client, req.jobs)
        except SchedulerError as e:
            with contextlib.suppress(SchedulerError):
                client.delete_app(req.app_id, 0)
            self._write_final(req, AppState.FAILED, f"could not be created: {e}")
            raise SubmissionError(f"app {req.app_id} could not be created: {e}") from e
        self._ensure_keeper()
        return req.app_id

    # -- status: observe -> decide -> act -------------------------------------------------------------
    def _parse_request(self, text: str) -> KubernetesRequest:
        return KubernetesRequest.from_json(text)

    def _app_status(self, view: AppView) -> AppStatusView:
        return app_status(view)

    def _new_view(self) -> KubernetesView:
        from tsm.schedulers.kubernetes.view import KubernetesView

        return KubernetesView(self, self.client_for)

    def _observe(self, app_id: str | None = None) -> dict[str, tuple[AppView, Any]]:
        """One owner-scoped pod list (of ``app_id`` only: an app this home submitted, seen even before its
        pods are made), each app's view with the time the list was taken."""
        listed = time.time()
        if app_id is None:
            return {a: (view, listed) for a, view in group([from_json(p) for p in self.client.list_pods()]).items()}
        req = self.request(app_id)
        if req is None:
            return {}
        pods = [from_json(p) for p in self.client_for(req).list_pods(app_id)]
        return {app_id: (AppView(app_id, req.roles, float(req.service["metadata"]["annotations"][ANN_CREATED]), pods),
                         listed)}

    def look(self, view: AppView, mark: Any = None) -> DescribeAppResponse:
        """One controller step: observe (``view``, less the pods of tries already replaced), decide, act;
        under the app directory's lock (:func:`~tsm.schedulers.common.container_lock.locked`) for an app this home submitted, so two
        processes looking at it act in turn. ``view`` was listed (at ``listed``; None: unknown) before the
        lock was held: when the app was finished meanwhile (by the look that held it), its kept final status
        answers; when a cancel, a finish or a remove is under way, it is reported, nothing is done; when
        another look listed the pods later than this one (``listed-at``), they are listed again, so a pod
        made in between (and recorded in ``pods-seen.json``) is not taken for one the cluster took away."""
        listed: float | None = mark
        req = self.request(view.app_id)
        if req is None:  # not submitted from this home: report only
            return self._describe_view(view)
        d = self.app_dir(view.app_id)
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
                pods = [from_json(p) for p in self.client_for(req).list_pods(view.app_id)]
                view = AppView(view.app_id, view.roles, view.created, pods)
            d.write(LISTED_AT, f"{listed:.6f}")
            return self._step(req, view)

    def _step(self, req: KubernetesRequest, view: AppView) -> DescribeAppResponse:
        """The body of :meth:`look` (the caller holds the app's lock)."""
        d = self.app_dir(view.app_id)
        if d.exists(RETRY):  # a preemption's new try waits for the old pods to end
            waiting = self._resume_retry(req, view)
            if waiting is not None:
                return waiting
        attempts = d.attempts()
        view = AppView(view.app_id, view.roles, view.created,
                       [p for p in view.pods if p.attempt >= attempts.get(p.role, 0)])
        stall = self._stalls(req, view)
        self._mark_lost(req, view, attempts, set(stall.stalled) if stall is not None else set())
        st = app_status(view, max(attempts.values(), default=0))
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
                              max_preemptions=req.max_preemptions,
                              hopeless=never_starts(p for p in view.pods if p.attempt == view.attempt))
        return self.act(req, view, st, decision)

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
        d = self.app_dir(req.app_id)
        stall = StallState.load(d)
        if not (stall.failed or d.cancelling or d.exists(FINISHING)):
            found = check(self.client_for(req), req.app_id, stall, view.pods, req.stall_timeout, time.time())
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
        """Mark the pods of ``view`` the cluster took away (:func:`~.nodes.mark_lost`), unless tsm itself is
        deleting the app (a cancel, a finish under way, or its end kept)."""
        d = self.app_dir(req.app_id)
        if not (d.cancelling or d.exists(FINISHING) or d.final() is not None):
            mark_lost(d, view, attempts, stalled or set(), self.client_for(req).node_ready)

    def _excluded(self, req: KubernetesRequest) -> dict[str, str]:
        return excluded(self.app_dir(req.app_id), req)

    def act(self, req: KubernetesRequest, view: AppView, st: AppStatusView, decision: Decision) -> DescribeAppResponse:
        """Do what :func:`~tsm.schedulers.common.controller.decide` said (this home's apps only): a
        :class:`Retry` deletes the scope's Jobs and makes them anew; a :class:`Finish` keeps the logs and the
        final status (replicas still running: CANCELLED after a failure, FAILED by a gang timeout) and
        deletes every object of the app. Returns the status to report."""
        if isinstance(decision, Retry):
            d = self.app_dir(req.app_id)
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
            extra, node_lost = avoid_for_retry(d, req, view, failed, not decision.preemption and not stalled,
                                               self.client_for(req))
            msg += extra
            self._retry(req, view, decision.roles, decision.attempt,
                        attempt_env(decision.attempt, st.num_restarts + 1, last), why=decision.why,
                        # the old pods end first (warned, their grace period), unless their node is lost;
                        # a stalled pod is warned and stopped the same way
                        wait=(decision.preemption or stalled) and not node_lost, restarts=st.num_restarts + 1)
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

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's status from one pod list shared by every app of the process (see the module doc), with
        the nodes its pods avoid and the preemptions it spent."""
        desc = super().describe(app_id)
        req = self.request(app_id) if desc is not None else None
        if desc is not None and req is not None:
            excluded = self._excluded(req)
            if excluded:
                desc.metadata["excluded_nodes"] = "; ".join(f"{n}: {why}" for n, why in sorted(excluded.items()))
            preemptions, _ = self._preemption_counts(self.app_dir(app_id))
            if preemptions:
                desc.metadata["preemptions"] = f"{preemptions} of max_preemptions={req.max_preemptions}"
        return desc

    # -- cancel / finish -----------------------------------------------------------------------------------
    def _cancel(self, app_id: str, current: DescribeAppResponse) -> None:
        """Delete every object of the app (pods get ``grace_period`` after SIGTERM), its logs and final status
        kept. The marker, the pod list and the deletion are done under the app's lock, so no look makes Jobs
        after them (it waits, then finds the final status)."""
        req = self.request(app_id)
        client = self.client_for(req)
        d = self.app_dir(app_id)
        with contextlib.ExitStack() as stack:
            if req is not None and stack.enter_context(locked(d)) and d.final() is not None:
                return  # finished by the look that held the lock
            stack.enter_context(d.cancel_marker())
            pods = [from_json(p) for p in client.list_pods(app_id)]
            desc = mark_cancelled(DescribeAppResponse(app_id=app_id, created=current.created,
                                                      num_restarts=current.num_restarts,
                                                      roles_statuses=current.roles_statuses))
            if req is not None:
                self._finish(req, desc, pods, grace=req.grace_period)
            else:
                client.delete_app(app_id, 10)

    def _finish(self, req: KubernetesRequest, desc: DescribeAppResponse, pods: builtins.list[Pod],
                grace: int = 0) -> None:
        """Snapshot every pod's log, delete the app's objects (all of them), then write the final status (with
        the app's start and end). In that order: a delete that fails (an API timeout) leaves no final status,
        so the next describe sees the objects again and finishes the app then, rather than reporting it ended
        while its pods run on."""
        client = self.client_for(req)
        d = self.app_dir(req.app_id)
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
        self.app_dir(req.app_id).save_final(desc, min(starts) if starts else None, max(ends) if ends else None)

    @contextlib.contextmanager
    def _removing(self, app_id: str) -> Iterator[bool]:
        req = self.request(app_id)
        d = self.app_dir(app_id)
        with contextlib.ExitStack() as stack:
            if req is not None:
                stack.enter_context(locked(d))  # no look acts meanwhile; one waiting finds the app gone
                d.write(FINISHING, "")
                try:
                    self.client_for(req).delete_app(app_id, 0)
                except BaseException:
                    (d.path / FINISHING).unlink(missing_ok=True)
                    raise
            yield req is not None

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
            req = self.request(app_id)
            desc = self._describe_view(view)
            if desc.state.is_terminal:
                ended = max((p.finished or p.created for p in view.pods), default=0.0)
                if now - ended < older_than:
                    continue
                if not dry_run:
                    if req is not None:
                        # under the app's lock, as a look finishes it: never two finishes of one app (a
                        # second would save the logs again over the first's copy and rewrite its status)
                        d = self.app_dir(app_id)
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
                    req = self.request(app_id)
                    if req is not None and self.final_status(app_id) is None:
                        self._write_final(req, AppState.FAILED, "its objects were left incomplete; removed by cleanup")
                    self.client.delete_app(app_id, 0)
                done.append(app_id)
        self._watcher.invalidate()
        return done

    def close(self) -> None:
        super().close()
        for c in self._clients.values():
            c.close()
        self._clients.clear()


def _number(text: str | None) -> float:
    """A number kept in a file of the app directory; 0 when absent or unreadable."""
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


__all__ = ["RANK0_VAR", "KubernetesScheduler"]
