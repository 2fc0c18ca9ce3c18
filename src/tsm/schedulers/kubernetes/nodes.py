"""The cluster's nodes as an app sees them: whether it can fit at all, which of its pods the cluster took
away (and whether their node went with them), and the nodes its next tries avoid.

The app directory keeps ``pods-seen.json`` (the pods of the current tries a look saw: one gone since was
taken by the cluster) and ``excluded.json`` (the nodes the next tries avoid, and why: beside the
``exclude_nodes`` run option, a node a replica was lost with, one whose OOM killer or GPUs failed it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tsm.errors import SubmissionError
from tsm.schedulers.common.appdir import AppDir
from tsm.schedulers.kubernetes.request import KubernetesRequest, Need
from tsm.schedulers.kubernetes.status import AppView, Pod, node_oom

if TYPE_CHECKING:
    from tsm.schedulers.kubernetes.client import KubeClient

#: the app directory's files (see the module doc)
EXCLUDED, SEEN = "excluded.json", "pods-seen.json"
#: why a pod deleted by someone other than tsm ended (on 1.20 the eviction API only deletes the pod)
DELETED_BY_CLUSTER = "evicted: its pod was deleted by the cluster (the eviction API, a preemption or a drain)"


def check_fits(app_name: str, needs: Sequence[Need], nodes: Sequence[dict[str, float]]) -> None:
    """Refuse an app that can never run on ``nodes`` (their allocatable): a replica bigger than every node,
    or more than the cluster has (a gang waits for all its replicas)."""
    if not nodes:
        raise SubmissionError("the cluster has no schedulable node: nothing can run; add a node (or uncordon one)")
    keys = (("cpu", "cpu_milli", 1e-3, "CPU"), ("memory", "mem_bytes", 1.0, "bytes of memory"),
            ("nvidia.com/gpu", "gpus", 1.0, "GPU(s)"))
    for res, attr, scale, what in keys:
        total_need = sum(getattr(n, attr) * scale for n in needs)
        biggest = max(node.get(res, 0.0) for node in nodes)
        for n in needs:
            need = getattr(n, attr) * scale
            if need > biggest:
                raise SubmissionError(
                    f"app {app_name!r} cannot fit: a replica of role '{n.role}' requests {need:g} {what} "
                    f"but the largest node has {biggest:g} allocatable; ask for less (or lower request_fraction)"
                )
        capacity = sum(node.get(res, 0.0) for node in nodes)
        if total_need > capacity:
            raise SubmissionError(
                f"app {app_name!r} cannot fit: its {len(needs)} replicas request {total_need:g} {what} "
                f"together but the cluster has {capacity:g} allocatable; it would wait forever (gang start)"
            )


def mark_lost(d: AppDir, view: AppView, attempts: dict[str, int], stalled: set[str],
              node_ready: Callable[[], dict[str, bool]]) -> None:
    """Mark each pod of ``view`` the cluster took away as lost (the caller knows tsm is not deleting the app;
    replaced tries are out of ``view``): one being deleted (the eviction API, the scheduler's preemption and a
    drain only delete the pod on 1.20), and one a look saw before that is no longer listed (deleted and gone
    between two looks; on 1.20 its Job has made another pod meanwhile), which is added to ``view`` as a
    Failed pod. ``stalled``: pods tsm stopped for a stall (tsm deleted them, not the cluster). The pods seen
    are kept in ``pods-seen.json``. ``node_ready`` (one node list) is asked only when a pod was lost: a pod
    whose node is gone, or not Ready, was lost with it."""
    try:
        seen: dict[str, list[Any]] = json.loads(d.read(SEEN) or "{}")
    except ValueError:
        seen = {}
    listed = {p.name for p in view.pods}
    now_seen = {p.name: [p.role, p.replica_id, p.attempt, p.node, p.created, p.phase, p.exit_code, p.deleting]
                for p in view.pods}
    kept = {n: v for n, v in seen.items() if int(v[2]) >= attempts.get(str(v[0]), 0)}
    vanished = [n for n, v in kept.items() if n not in listed and v[5] != "Succeeded" and n not in stalled]
    for n in vanished:
        role, k, attempt, node, created, phase = kept[n][:6]
        code, deleting = (kept[n][6:8] + [None, True])[:2]  # a record of an earlier version has neither
        # one last seen Failed by its own exit (not being deleted then) was deleted after (pod GC, a
        # cleanup): its failure is the program's, not a loss
        own_exit = phase == "Failed" and code is not None and not deleting
        view.pods.append(Pod(name=n, app_id=view.app_id, role=str(role), replica_id=int(k), attempt=int(attempt),
                             phase="Failed", created=float(created), node=str(node), deleting=not own_exit,
                             exit_code=int(code) if own_exit else None))
    merged = {**kept, **now_seen}
    if merged != seen:
        d.write(SEEN, json.dumps(merged))
    gone = [p for p in view.pods if p.deleting and not p.lost and p.name not in stalled and p.phase != "Succeeded"]
    if not gone:
        return
    ready = node_ready()
    for p in gone:
        if p.node and p.node not in ready:
            p.lost, p.node_lost = f"node lost: {p.node} is gone", True
        elif p.node and not ready[p.node]:  # the taint manager deletes the pods of an unreachable node
            p.lost, p.node_lost = f"node lost: {p.node} is not Ready", True
        else:
            p.lost = DELETED_BY_CLUSTER + (f" on node {p.node}" if p.node else "")


def excluded(d: AppDir, req: KubernetesRequest) -> dict[str, str]:
    """``{node: why}``: the nodes the app's pods must not run on (``exclude_nodes``, and those recorded in
    ``excluded.json``)."""
    out = dict.fromkeys(req.exclude_nodes, "exclude_nodes")
    try:
        kept = json.loads(d.read(EXCLUDED) or "{}")
        out.update({str(k): str(v) for k, v in kept.items()})
    except (ValueError, AttributeError):
        pass
    return out


def avoid_for_retry(d: AppDir, req: KubernetesRequest, view: AppView, failed: Pod | None, own_failure: bool,
                    client: KubeClient) -> tuple[str, bool]:
    """Record the nodes a retry's new try avoids: those replicas were lost with, and those that caused the
    failure (the kernel's OOM killer; for ``own_failure`` of a GPU pod, GPUs the device plugin withdrew as
    unhealthy since), never the last Ready node. Returns what the retry's message adds, and whether a node
    was lost (the old pods are then not waited for)."""
    lost = {p.node: f"role '{p.role}' replica {p.replica_id} was lost with it ({p.lost})"
            for p in view.pods if p.node_lost and p.node}
    # failures the node caused (its OOM killer, its GPUs): its failure for max_retries, but off that node
    faulty = {p.node: f"the kernel's OOM killer ended role '{p.role}' replica {p.replica_id} (attempt "
                      f"{p.attempt}; no memory limit of its own: the node ran out)"
              for p in view.pods if node_oom(p) and p.attempt == view.attempt and p.node not in lost}
    if (failed is not None and failed.gpu_req and failed.node and own_failure
            and failed.node not in lost and failed.node not in faulty):
        # a GPU pod's failure on a node whose device plugin has since withdrawn GPUs as unhealthy
        gone = client.gpus_withdrawn().get(failed.node)
        if gone is not None:
            faulty[failed.node] = (
                f"a GPU fault under role '{failed.role}' replica {failed.replica_id} (attempt {failed.attempt}): "
                f"the device plugin withdrew {gone[0]} of the node's {gone[1]} GPUs as unhealthy")
    msg = ""
    before = excluded(d, req) if lost or faulty else {}
    if faulty:  # never the last Ready node: the retry would wait for a node that does not exist
        ready = {n for n, ok in client.node_ready().items() if ok}
        if not ready - set(before) - set(lost) - set(faulty):
            msg += f"; node(s) {', '.join(sorted(faulty))} not excluded: no other Ready node"
            faulty = {}
    if lost or faulty:
        now = {**before, **faulty, **lost}
        d.write(EXCLUDED, json.dumps({k: v for k, v in now.items() if v != "exclude_nodes"}))
        msg += f"; excluding node(s) {', '.join(sorted({*lost, *faulty}))}"
    return msg, bool(lost)
