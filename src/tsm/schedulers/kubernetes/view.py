"""The views' batch hook for Kubernetes: every app of a ``tsm top`` / ``tsm serve`` tick from one pod list.

:meth:`KubernetesScheduler.view_snapshot <tsm.schedulers.common.container.ContainerScheduler.view_snapshot>`
hands the app ids of a tick to :class:`KubernetesView`, which makes, whatever the number of apps and replicas,
ONE label-selected pod list per cluster the apps run on (one in practice) plus, when the cluster serves
``metrics.k8s.io``, one pod-metrics list. An ended app answers from its final status in the store (no API
call).

Per replica: state, pod IP, restarts (``attempt``), exit code, Kubernetes' reason, the container's requests;
usage (cores and MiB in use) from metrics-server, None (shown as n/a) where the cluster has none. Like
``describe``, a refresh is a controller step of each live app (:meth:`~.scheduler.KubernetesScheduler.look`:
retries, the gang timeout, the deletion of an ended app). It asks the scheduler's public methods only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common.viewmodel import AppSummary, requests_of, view_of_describe
from tsm.schedulers.kubernetes.request import ANN_CREATED, KubernetesRequest
from tsm.schedulers.kubernetes.status import AppView, Pod, app_status, from_json, group, latest_pod
from tsm.specs.api import AppState

if TYPE_CHECKING:
    from tsm.schedulers.common.container import ContainerScheduler
    from tsm.schedulers.kubernetes.client import KubeClient


def pods_by_replica(view: AppView) -> dict[tuple[str, int], Pod]:
    """The pod that is each replica now (see :func:`~tsm.schedulers.kubernetes.status.latest_pod`)."""
    by: dict[tuple[str, int], list[Pod]] = {}
    for p in view.pods:
        by.setdefault((p.role, p.replica_id), []).append(p)
    return {k: pod for k, pods in by.items() if (pod := latest_pod(pods)) is not None}


class KubernetesView:
    """Builds the views of Kubernetes apps for a tick; one per scheduler (see the module doc).

    ``sched`` answers the statuses and looks; ``client_for`` gives the client of the cluster a request went to."""

    def __init__(self, sched: ContainerScheduler[KubernetesRequest, AppView],
                 client_for: Callable[[KubernetesRequest | None], KubeClient]) -> None:
        self.sched = sched
        self.client_for = client_for

    def snapshot(self, app_ids: Sequence[str]) -> list[AppSummary]:
        """Views of the apps of ``app_ids`` the cluster (or the store) knows; see the module doc."""
        out: list[AppSummary] = []
        live: dict[int, tuple[KubeClient, list[str]]] = {}
        reqs: dict[str, KubernetesRequest | None] = {}
        for app_id in dict.fromkeys(app_ids):
            final = self.sched.final_status(app_id)
            if final is not None:
                out.append(self.view_of(final, {}, None, None))
                continue
            req = reqs[app_id] = self.sched.request(app_id)
            client = self.client_for(req)
            live.setdefault(id(client), (client, []))[1].append(app_id)
        for client, ids in live.values():
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
                if self.sched.app_dir(app_id).cancelling:
                    desc = DescribeAppResponse(app_id=app_id, state=AppState.RUNNING, msg="being cancelled",
                                               created=view.created, roles_statuses=app_status(view).roles)
                else:
                    desc = self.sched.look(view, listed)
                out.append(self.view_of(desc, pods_by_replica(view), usage, req.app_name if req else None))
        return out

    def view_of(self, desc: DescribeAppResponse, pods: dict[tuple[str, int], Pod],
                usage: dict[str, tuple[float, float]] | None, name: str | None) -> AppSummary:
        """One app as the views show it: ``desc`` (:func:`~tsm.schedulers.common.viewmodel.view_of_describe`,
        requests from the submitted app) plus, per replica, its pod's IP, requests, start and end, and usage."""
        record = self.sched.app_record(desc.app_id)
        reqs = requests_of(record.app.to_dict()) if record is not None else {}
        view = view_of_describe(desc, "kubernetes", name=name or desc.app_id.rsplit("-", 1)[0], reqs=reqs)
        started: list[float] = []
        ended: list[float] = []
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
            view.started, view.ended = self.sched.app_dir(desc.app_id).final_times()
        return view

    def close(self) -> None:
        """Nothing to stop: the view holds no thread or connection of its own."""
