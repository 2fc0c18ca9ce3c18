"""Kubernetes' tries of an app: making its Jobs, and replacing a scope's Jobs by a new try.

A try of a role is its Jobs with one ``tsm/attempt`` label; ``attempts.json`` in the app directory says
which try each role is on (a pod of an older try is out of every look). Without cluster DNS, rank 0's Job is
made first and its pod IP handed to the others. A retry records the new try first, snapshots the old pods'
logs and deletes their Jobs; a preemption's (or a stall's) new Jobs wait in ``retry.json`` until the old
pods have ended (warned, with their grace period), so two tries of a replica never run at once, and
``tried-at`` says when the current try was made (its gang timeout counts from there).
"""

from __future__ import annotations

import builtins
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from tsm.errors import SchedulerError
from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common.errors import is_status
from tsm.schedulers.common.polling import poll_until
from tsm.schedulers.kubernetes.client import KubeClient
from tsm.schedulers.kubernetes.logs import FOLLOW_MARGIN, KubernetesLogs
from tsm.schedulers.kubernetes.manifests import (
    retried,
    with_own_ip_as_rank0,
    with_owner,
    with_rank0,
)
from tsm.schedulers.kubernetes.nodes import excluded
from tsm.schedulers.kubernetes.request import (
    ANN_ROLE,
    LABEL_REPLICA,
    LABEL_ROLE,
    KubernetesRequest,
)
from tsm.schedulers.kubernetes.status import AppView, from_json
from tsm.specs.api import AppState

#: the app directory's files of tries (see the module doc)
RETRY, TRIED_AT = "retry.json", "tried-at"
#: seconds past the grace period a preemption's new Jobs wait at most for the old pods to end
RETRY_WAIT_MARGIN = 30.0


class KubernetesTries(KubernetesLogs):
    """The tries half of :class:`~tsm.schedulers.kubernetes.scheduler.KubernetesScheduler` (see the module doc)."""

    #: app id -> the follows of the old pods a waiting retry stopped (joined before its new Jobs are made)
    _retry_follows: dict[str, builtins.list[threading.Thread]]

    def _dns(self, req: KubernetesRequest, client: KubeClient) -> bool:
        if req.dns != "auto":
            return req.dns == "yes"
        d = self.app_dir(req.app_id)
        if d.read("dns") is None:
            d.write("dns", "yes" if client.has_dns() else "no")
        return d.read("dns") == "yes"

    def _create_jobs(self, req: KubernetesRequest, client: KubeClient, jobs: builtins.list[dict[str, Any]]) -> None:
        """Create ``jobs`` owned by the Service; without DNS, rank 0 first, then its pod IP to the others.

        Without DNS rank 0 reads its own pod IP (downward API) as ``TSM_RANK0_HOST`` and the others get that
        IP plus ``hostAliases`` for rank 0's host names, since a rendezvous (torch's c10d) advertises the
        host's FQDN, which only the cluster DNS would otherwise resolve.
        """
        uid = self.app_dir(req.app_id).read("service-uid") or ""
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
            floor = self.app_dir(req.app_id).attempts().get(role0, 0)
            mine = [p for p in pods if p.role == role0 and p.replica_id == 0 and not p.deleting and p.attempt >= floor]
            latest = max(mine, key=lambda p: (p.attempt, p.created), default=None)
            return latest.ip if latest is not None and latest.ip else None

        return poll_until(ip, req.gang_timeout, initial=0.1, cap=1.0) or ""  # "": the gang timeout fails the app

    def _resume_retry(self, req: KubernetesRequest, view: AppView) -> DescribeAppResponse | None:
        """Make a preemption's new Jobs (``retry.json``) once no pod of the replaced tries still runs (or
        the grace period and :data:`RETRY_WAIT_MARGIN` have passed); until then the app is RUNNING,
        "restarting". None once made (or when there is nothing to make)."""
        d = self.app_dir(req.app_id)
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
        client = self.client_for(req)
        for t in self._retry_follows.pop(req.app_id, []):  # this process followed them: their logs kept whole
            t.join(req.grace_period + FOLLOW_MARGIN)
        for p in old:  # their last lines (the warning's, the grace period's) since the retry's snapshot
            self._snapshot_log(req.app_id, client, p, again=True)
        d.write(TRIED_AT, f"{time.time():.3f}")
        self._create_jobs(req, client, jobs)
        (d.path / RETRY).unlink(missing_ok=True)
        return None

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
        client = self.client_for(req)
        d = self.app_dir(req.app_id)
        exclude = sorted(excluded(self.app_dir(req.app_id), req))
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

