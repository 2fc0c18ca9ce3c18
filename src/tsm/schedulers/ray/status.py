"""Pure: a Ray job's status and the driver's status record -> tsm's app, role and replica statuses."""

from __future__ import annotations

import json
from typing import Any

from tsm.schedulers.api import DescribeAppResponse, ListAppResponse
from tsm.schedulers.common.failure import failure_of
from tsm.schedulers.common.status import StateTable
from tsm.schedulers.ray.request import (
    META_APP,
    META_CREATED,
    META_ROLES,
    META_SCHEDULER,
    META_SESSION,
    SHORT_ID,
)
from tsm.specs.api import AppState, ReplicaStatus, RoleStatus

#: Ray's job states (``JobStatus``); STOPPED is ``ray job stop``, i.e. tsm's cancel.
JOB_STATES = StateTable({
    AppState.PENDING: {"PENDING"},
    AppState.RUNNING: {"RUNNING"},
    AppState.SUCCEEDED: {"SUCCEEDED"},
    AppState.FAILED: {"FAILED"},
    AppState.CANCELLED: {"STOPPED"},
})


def job_status(job: Any) -> str:
    """A job's status as a string (``JobStatus`` is an enum in some Ray versions, a string in others)."""
    s = getattr(job, "status", "")
    return str(getattr(s, "value", s))


def is_tsm_job(metadata: dict[str, str] | None) -> bool:
    """True for a job tsm submitted (its metadata names the scheduler)."""
    return bool(metadata) and (metadata or {}).get(META_SCHEDULER) == "ray"


def shape(metadata: dict[str, str]) -> list[tuple[str, int]]:
    """The app's roles and replica counts, from the job's metadata."""
    try:
        return [(str(n), int(k)) for n, k in json.loads(metadata.get(META_ROLES, "[]"))]
    except (ValueError, TypeError):
        return []


def created(metadata: dict[str, str]) -> float | None:
    try:
        return float(metadata[META_CREATED])
    except (KeyError, ValueError):
        return None


def parse_record(text: str | bytes | None) -> dict[str, Any] | None:
    """The driver's status record, or None when there is none (yet) or it is unreadable."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "roles" in data else None


def describe(app_id: str, job_status: str, job_message: str, metadata: dict[str, str],
             record: dict[str, Any] | None) -> DescribeAppResponse:
    """The app's status: the job's state, refined by the driver's record (per role and replica).

    A replica whose last attempt was ended by the cluster (its node lost, a requeued time limit) is
    ``preempted``, the reason in its error; the nodes the driver excludes, and why, end the app's message
    (``excluded nodes: <node id> (<ip>): lost under role 'w' replica 1 (attempt 0)``)."""
    job_state = JOB_STATES.state(job_status)
    rec_state = AppState[record["state"]] if record and record.get("state") in AppState.__members__ else None
    if job_state == AppState.CANCELLED:
        state, msg = AppState.CANCELLED, "cancelled"
    elif job_state == AppState.FAILED:
        state = AppState.FAILED
        msg = (record or {}).get("msg") or f"the Ray job failed: {job_message}".strip()
    elif job_state == AppState.SUCCEEDED:
        state, msg = AppState.SUCCEEDED, ""
    elif job_state == AppState.RUNNING and rec_state is not None and not rec_state.is_terminal:
        state, msg = rec_state, (record or {}).get("msg", "")
    else:
        state, msg = job_state, ""
    roles: list[RoleStatus] = []
    by_role = {name: reps for name, reps in (record or {}).get("roles", [])}
    for name, n in shape(metadata):
        rs = RoleStatus(name)
        reps = by_role.get(name) or []
        for k in range(n):
            r = reps[k] if k < len(reps) else {}
            rstate = AppState[r["state"]] if r.get("state") in AppState.__members__ else AppState.PENDING
            if state.is_terminal and not rstate.is_terminal:
                rstate = AppState.CANCELLED if state == AppState.CANCELLED else state
            rs.replicas.append(ReplicaStatus(
                id=k, state=rstate, role=name, hostname=str(r.get("node_ip") or ""), exit_code=r.get("exit_code"),
                error_msg=str(r.get("msg") or ""), restarts=int(r.get("restarts") or 0), pid=r.get("pid"),
                preempted=bool(r.get("preempted")),
            ))
        roles.append(rs)
    excluded = excluded_nodes(record)
    if excluded:
        msg = "; ".join(m for m in (msg, "excluded nodes: " + excluded) if m)
    return DescribeAppResponse(app_id=app_id, state=state, msg=msg,
                               num_restarts=int((record or {}).get("num_restarts") or 0),
                               created=created(metadata), roles_statuses=roles,
                               structured_error_msg=failure_of(state, msg, roles))


def excluded_nodes(record: dict[str, Any] | None) -> str:
    """The nodes the driver keeps the app off and why (``<id> (<ip>): <why>, ...``); "" for none."""
    out = []
    for e in (record or {}).get("excluded") or []:
        if isinstance(e, dict) and e.get("node_id"):
            ip = f" ({e['node_ip']})" if e.get("node_ip") else ""
            out.append(f"{str(e['node_id'])[:SHORT_ID]}{ip}: {e.get('why') or 'excluded'}")
    return ", ".join(out)


def list_row(app_id: str, job_status: str, metadata: dict[str, str]) -> ListAppResponse:
    """One ``list`` row from a job's metadata; the handle names the session that submitted it."""
    session = metadata.get(META_SESSION) or "default"
    return ListAppResponse(app_id, JOB_STATES.state(job_status), app_handle=f"ray://{session}/{app_id}",
                           name=metadata.get(META_APP, ""), created=created(metadata))


def replica_of(record: dict[str, Any] | None, role: str, k: int) -> dict[str, Any]:
    """The record's entry for a replica ({} when not known yet)."""
    for name, reps in (record or {}).get("roles", []):
        if name == role and k < len(reps):
            return dict(reps[k])
    return {}
