"""Pure: the pods of one label-selected list -> replica and app statuses.

Input is the JSON of one ``GET /api/v1/namespaces/<ns>/pods?labelSelector=tsm/scheduler=kubernetes`` (every
tsm app of the namespace at once: one API call per refresh whatever the number of replicas). A replica is
the pods of its Job with the highest ``tsm/attempt`` label; under REPLICA retries the Job makes a new pod per
try (``restartPolicy: Never``), so the newest one is the replica and the failed ones before it are its
restarts. The pod-level reason Kubernetes gives (ErrImagePull, ImagePullBackOff, Unschedulable, OOMKilled,
Evicted) is carried into the replica's message.

**Preempted is not failed**. A pod the cluster ended is :attr:`Pod.lost` (:func:`lost_why`): the
kubelet's ``Evicted``, the ``DisruptionTarget`` condition (1.26+), a node shutdown, its node lost
(``NodeLost``, phase ``Unknown``); a pod deleted by someone else (the eviction API, the scheduler's
preemption, a drain: on 1.20 they only delete the pod) is marked by the scheduler, which alone knows what it
deletes itself. Its replica is FAILED with ``preempted=True`` and ``preempted: <why>`` as its error, whatever
the Job made after it (on 1.20 the Job replaces a deleted pod: that pod is not tsm's restart and is replaced).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tsm.schedulers.common.status import AppStatusView, Seen, StateTable, aggregate_roles
from tsm.schedulers.kubernetes.request import (
    ANN_CREATED,
    ANN_ROLE,
    ANN_ROLES,
    LABEL_APP,
    LABEL_ATTEMPT,
    LABEL_REPLICA,
)
from tsm.specs.api import AppState, ReplicaStatus

#: Kubernetes' pod phases.
STATES = StateTable({
    AppState.PENDING: {"Pending"},
    AppState.RUNNING: {"Running"},
    AppState.SUCCEEDED: {"Succeeded"},
    AppState.FAILED: {"Failed"},
})  # "Unknown" (node lost) and any other name -> UNKNOWN

#: waiting reasons that mean the pod cannot start until something changes (often only a new app will do)
FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "ErrImageNeverPull", "RunContainerError"}

#: what a pull error's message says when pulling again cannot help: the name does not parse, or the image,
#: its repository or its registry does not exist (a mistyped image); other pull errors (a registry that is
#: slow or briefly down) are left to the gang timeout
_HOPELESS_PULL = ("no such host", "not found", "manifest unknown", "name unknown", "repository does not exist",
                  "pull access denied", "invalid reference format")


def never_starts(pods: Iterable[Pod]) -> str:
    """Why one of ``pods`` (not yet started) can never start by itself, or "": an image that cannot be pulled
    (``InvalidImageName``, ``ErrImageNeverPull``, or ``ErrImagePull`` for a name no registry has), or a Secret
    or key its env names that does not exist (:func:`~.secrets.missing`: nothing tsm does will make it)."""
    from tsm.schedulers.kubernetes.secrets import missing  # imports the scheduler API: only when asked

    for p in pods:
        if p.started or p.exit_code is not None or p.deleting:
            continue
        hint = missing(p.reason, p.message)
        hopeless = bool(hint) or p.reason in ("InvalidImageName", "ErrImageNeverPull") or (
            p.reason == "ErrImagePull" and any(w in p.message.lower() for w in _HOPELESS_PULL))
        if hopeless:
            return f"role '{p.role}' replica {p.replica_id}: {p.reason}: {p.message}".rstrip(": ") + hint
    return ""


def quantity(text: str) -> float:
    """A Kubernetes quantity (``2``, ``1500m``, ``16Gi``, ``64M``, ``12345n``) as a number (cores, bytes, count)."""
    units = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text)


def latest_pod(pods: list[Pod]) -> Pod | None:
    """The pod that is the replica now: the newest of its latest try (the others are its restarts)."""
    if not pods:
        return None
    latest = max(p.attempt for p in pods)
    return max((p for p in pods if p.attempt == latest), key=_newest)


def _newest(p: Pod) -> tuple[float, bool, str]:
    """Order of a replica's pods, oldest first. Creation times have whole seconds: a Job makes the next pod
    only after the last one failed, so of two made in the same second the one not Failed is the newer."""
    return (p.created, p.phase != "Failed", p.name)


def parse_time(text: str | None) -> float:
    """RFC 3339 (``2026-11-23T14:20:01Z``) -> epoch seconds; 0 when absent."""
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Pod:
    """One pod as a refresh saw it."""

    name: str
    app_id: str
    role: str
    replica_id: int
    attempt: int
    phase: str
    created: float
    ip: str = ""
    node: str = ""
    exit_code: int | None = None
    #: Kubernetes' reason: a waiting/terminated reason, Unschedulable, Evicted
    reason: str = ""
    message: str = ""
    restarts: int = 0
    finished: float = 0.0
    deleting: bool = False
    roles: list[list[Any]] = field(default_factory=list)
    app_created: float | None = None
    #: when the container started (0: not yet)
    started: float = 0.0
    #: the container's requests: cores, MiB, GPUs (None: not requested)
    cpu_req: float | None = None
    mem_req_mb: float | None = None
    gpu_req: int | None = None
    #: why the cluster ended it (an eviction, a lost node: see :func:`lost_why`); "" when it did not
    lost: str = ""
    #: it was lost with its node (that node is excluded from the app's next attempts)
    node_lost: bool = False
    #: its container has a memory limit of its own (``resources.limits.memory``)
    mem_limited: bool = False
    #: tsm found it stalled (``stall_timeout``: "stalled for X, last line: ..."); "" when not. Set by the
    #: scheduler from the app's ``stall.json``: such a replica is FAILED whatever its exit code
    stalled: str = ""


def from_json(p: dict[str, Any]) -> Pod:
    """A :class:`Pod` from the API's JSON of one pod."""
    meta, status = p.get("metadata", {}), p.get("status", {}) or {}
    labels, ann = meta.get("labels", {}) or {}, meta.get("annotations", {}) or {}
    pod = Pod(
        name=meta.get("name", ""), app_id=labels.get(LABEL_APP, ""), role=ann.get(ANN_ROLE, ""),
        replica_id=int(labels.get(LABEL_REPLICA, "0")), attempt=int(labels.get(LABEL_ATTEMPT, "0")),
        phase=status.get("phase", "Pending"), created=parse_time(meta.get("creationTimestamp")),
        ip=status.get("podIP", "") or "", node=(p.get("spec", {}) or {}).get("nodeName", "") or "",
        deleting=bool(meta.get("deletionTimestamp")),
    )
    try:
        pod.roles = json.loads(ann.get(ANN_ROLES, "[]"))
    except ValueError:
        pod.roles = []
    created = ann.get(ANN_CREATED)
    pod.app_created = float(created) if created else None
    if status.get("reason"):
        pod.reason, pod.message = status["reason"], status.get("message", "")
    for c in (p.get("spec", {}) or {}).get("containers", [])[:1]:
        req = (c.get("resources") or {}).get("requests") or {}
        if "cpu" in req:
            pod.cpu_req = quantity(str(req["cpu"]))
        if "memory" in req:
            pod.mem_req_mb = quantity(str(req["memory"])) / 2**20
        if "nvidia.com/gpu" in req:
            pod.gpu_req = int(quantity(str(req["nvidia.com/gpu"])))
        pod.mem_limited = "memory" in ((c.get("resources") or {}).get("limits") or {})
    for c in status.get("containerStatuses", []) or []:
        pod.restarts = int(c.get("restartCount", 0))
        state = c.get("state", {}) or {}
        for s in state.values():
            if isinstance(s, dict) and s.get("startedAt"):
                pod.started = parse_time(s["startedAt"])
        if "terminated" in state:
            t = state["terminated"]
            pod.exit_code = int(t.get("exitCode", 0))
            pod.finished = parse_time(t.get("finishedAt"))
            if t.get("reason") not in (None, "Completed", "Error"):
                pod.reason, pod.message = t["reason"], t.get("message", "") or ""
        elif "waiting" in state and state["waiting"].get("reason") not in (None, "ContainerCreating"):
            pod.reason, pod.message = state["waiting"]["reason"], state["waiting"].get("message", "") or ""
    if not pod.reason:
        for cond in status.get("conditions", []) or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                pod.reason, pod.message = cond.get("reason", "Unschedulable"), cond.get("message", "") or ""
    pod.lost, pod.node_lost = lost_why(status, pod.node)
    return pod


#: ``DisruptionTarget`` reasons that mean the pod's node is gone or unreachable
NODE_GONE_REASONS = {"DeletionByTaintManager", "DeletionByPodGC"}


def lost_why(status: dict[str, Any], node: str) -> tuple[str, bool]:
    """Why the cluster ended a pod, from its status alone (``""``: it did not), and whether its node went
    with it. A pod merely deleted by someone else is told apart by the scheduler (see the module doc)."""
    on = f" on node {node}" if node else ""
    reason, message = status.get("reason") or "", status.get("message") or ""
    for cond in status.get("conditions", []) or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            why = cond.get("reason") or "DisruptionTarget"
            gone = why in NODE_GONE_REASONS
            text = f"{'node lost' if gone else 'evicted'} ({why}{': ' + cond['message'] if cond.get('message') else ''})"
            return text + on, gone
    if reason == "Evicted":
        return f"evicted{on}{': ' + message if message else ''}", False
    if reason == "NodeLost" or status.get("phase") == "Unknown":
        return f"node lost: {node or 'its node'} stopped answering{' (' + message + ')' if message else ''}", True
    if reason in ("Shutdown", "Terminated", "NodeShutdown"):
        return f"node shutdown{on}{': ' + message if message else ''}", False
    return "", False


@dataclass
class AppView:
    """Everything a refresh saw of one app: its shape (from annotations) and its pods."""

    app_id: str
    roles: list[list[Any]]
    created: float | None
    pods: list[Pod] = field(default_factory=list)

    @property
    def attempt(self) -> int:
        return max((p.attempt for p in self.pods), default=0)


def group(pods: list[Pod]) -> dict[str, AppView]:
    """Pods by app id."""
    apps: dict[str, AppView] = {}
    for p in pods:
        if not p.app_id:
            continue
        view = apps.get(p.app_id)
        if view is None:
            view = apps[p.app_id] = AppView(p.app_id, p.roles, p.app_created)
        view.pods.append(p)
    return apps


def node_oom(p: Pod) -> bool:
    """Whether the kernel's OOM killer ended the pod for its node's memory, not its own: ``OOMKilled`` with no
    memory limit of its own (the node, or the memory all pods share on it, ran out). Its node is excluded
    from the app's next attempts. With a limit, ``OOMKilled`` is the program outgrowing it: its own failure."""
    return p.reason == "OOMKilled" and not p.mem_limited and bool(p.node)


def why(p: Pod) -> str:
    """Kubernetes' reason for a pod, as a short phrase (``ErrImagePull: <message>``)."""
    if not p.reason:
        return ""
    if node_oom(p):
        return f"OOMKilled: the kernel's OOM killer on node {p.node}, the pod having no memory limit of its own"
    return f"{p.reason}: {p.message}" if p.message else p.reason


def replica(pods: list[Pod], role: str, k: int, max_retries: int, policy: str) -> tuple[ReplicaStatus, Pod | None]:
    """The status of replica ``k`` from its pods (those of its latest attempt), and the pod that ended it."""
    if not pods:
        return ReplicaStatus(id=k, state=AppState.PENDING, role=role), None
    latest = max(p.attempt for p in pods)
    mine = sorted((p for p in pods if p.attempt == latest), key=_newest)
    p = mine[-1]
    failed = sum(1 for q in mine if q.phase == "Failed")
    restarts = failed - (1 if p.phase == "Failed" else 0) + p.restarts
    stalled = next((q for q in mine if q.stalled), None)
    if stalled is not None:  # tsm stopped it for a stall: FAILED, whatever its exit code
        r = ReplicaStatus(id=k, state=AppState.FAILED, role=role, hostname=stalled.ip or stalled.name,
                          exit_code=stalled.exit_code, error_msg=stalled.stalled, restarts=restarts)
        return r, stalled
    lost = next((q for q in mine if q.lost), None)
    if lost is not None:  # the cluster ended it: a preemption, whatever the Job made after it
        r = ReplicaStatus(id=k, state=AppState.FAILED, role=role, hostname=lost.ip or lost.name,
                          exit_code=lost.exit_code, error_msg=f"preempted: {lost.lost}", restarts=restarts,
                          preempted=True)
        return r, lost
    state = STATES.state(p.phase)
    msg = ""
    if state == AppState.FAILED:
        if policy == "REPLICA" and failed <= max_retries:
            state = AppState.RUNNING  # the Job makes the next try
        else:
            msg = f"exited with code {p.exit_code}" if p.exit_code is not None else "failed"
            if p.reason:
                msg = f"{msg} ({why(p)})"
    elif state in (AppState.PENDING, AppState.UNKNOWN) and p.reason:
        msg = why(p)
    out = ReplicaStatus(id=k, state=state, role=role, hostname=p.ip or p.name,
                        exit_code=p.exit_code if state.is_terminal else None, error_msg=msg, restarts=restarts)
    return out, p


def app_status(view: AppView, attempt: int = 0) -> AppStatusView:
    """Roles and replicas in the app's order, its state, which replica failed first, and the first reason a
    replica gives for not running yet (:func:`~tsm.schedulers.common.status.aggregate_roles` over its pods).
    ``attempt``: the app's latest try as recorded (a try whose pods are not made yet counts as a restart too)."""
    by_key: dict[tuple[str, int], list[Pod]] = {}
    for p in view.pods:
        by_key.setdefault((p.role, p.replica_id), []).append(p)

    def seen(row: Sequence[Any], k: int) -> Seen | None:
        role_name, _, max_retries, policy = row
        pods = by_key.get((role_name, k))
        if not pods:
            return None
        r, pod = replica(pods, role_name, k, int(max_retries), str(policy))
        return r, pod.finished if pod else 0.0, r.error_msg

    return aggregate_roles(view.roles, seen, max(view.attempt, attempt))
