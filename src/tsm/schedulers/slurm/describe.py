"""``describe``'s answer from what Slurm says of a job and what its job directory holds; no command is run.

Slurm gives each role's state (one record per het-job component); the job directory (a :class:`~.jobdir.JobDir`,
here or mirrored from a login node) refines it per replica: the wrapper's status files give each replica's
host and exit code, and the batch script's records say why an attempt ended (a stall, a preemption, the
nodes it keeps the app off).
"""

from __future__ import annotations

from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common.failure import failure_of, signal_name
from tsm.schedulers.common.record import AppRecord
from tsm.schedulers.common.status import attribute_failure
from tsm.schedulers.slurm.jobdir import JobDir
from tsm.schedulers.slurm.parse import WAITING_REASONS, SlurmJob, expand_hostlist, job_state, preemption_of
from tsm.specs.api import AppDef, AppState, ReplicaStatus, Role, RoleStatus


def load_app(job_dir: JobDir | None) -> AppDef | None:
    """The app as submitted, from the job directory's record (None when it is gone or unreadable)."""
    record = AppRecord.load(job_dir.path / "app.json") if job_dir is not None else None
    return record.app if record is not None else None


def rebuild_app(recs: list[SlurmJob]) -> AppDef:
    """An app shaped like the job when its app.json is gone: roles named after the components."""
    app_name = recs[0].name.rsplit(".", 1)[0] if recs else "unknown"
    roles = []
    for r in recs:
        role_name = r.name.rsplit(".", 1)[-1] if "." in r.name else f"role{r.offset}"
        roles.append(Role(name=role_name, entrypoint="?", num_replicas=max(1, r.num_tasks or 1)))
    return AppDef(name=app_name or "unknown", roles=roles)


def describe_records(
    app_id: str, recs: list[SlurmJob] | None, job_dir: JobDir | None, app: AppDef | None = None
) -> DescribeAppResponse | None:
    """The description of app ``app_id`` from its records (``recs``, one per role, from ``squeue``/``sacct``),
    its job directory and, when the caller keeps it, its ``app``."""
    if not recs:
        return from_files(app_id, job_dir)
    if app is None:
        app = load_app(job_dir)
    if app is None or len(app.roles) != len(recs):
        app = rebuild_app(recs)
    leader = recs[0]
    state = job_state(recs)
    restarts = leader.restarts
    if job_dir is not None and leader.source == "sacct" and not restarts:
        restarts = job_dir.restarts()
    roles_statuses = [
        RoleStatus(role=role.name, replicas=[
            replica_status(role, k, rec, expand_hostlist(rec.nodes) if rec.nodes else [], job_dir, restarts)
            for k in range(role.num_replicas)])
        for role, rec in zip(app.roles, recs, strict=False)
    ]  # fmt: skip
    # the batch script's records of its attempts (none before the job first ran: no listing of the directory)
    records = job_dir if job_dir is not None and (restarts or leader.state != AppState.PENDING) else None
    preempted = preemption_of(leader, records.last_exit() if records is not None else "")
    stalled = records.stalled() if records is not None else None
    failure = _attribute(leader, state, roles_statuses, preempted, stalled)
    msg = _message(leader, state, failure)
    if stalled is not None:
        msg += f"; replica {stalled[0]}/{stalled[1]} {stalled[2]}"
    excluded = records.excluded() if records is not None else []
    if excluded:  # nodes that failed under an earlier attempt: the batch script keeps the app off them
        msg += "; excluded nodes: " + ", ".join(excluded)
    node_error = records.node_error() if records is not None else ""
    if node_error:  # ... and when it could not, why the app failed
        msg += "; " + node_error
    return DescribeAppResponse(
        app_id=app_id, state=state, num_restarts=restarts, msg=msg,
        structured_error_msg=failure_of(state, msg, roles_statuses), roles_statuses=roles_statuses,
        app=app, created=leader.submit_time,
    )  # fmt: skip


def _attribute(leader: SlurmJob, state: AppState, roles_statuses: list[RoleStatus], preempted: str,
               stalled: tuple[str, int, str] | None) -> str:
    """Say, per replica, which decision ended it, and return the failure of the replica that failed first."""
    replicas = [r for rs in roles_statuses for r in rs.replicas]
    if preempted:  # the cluster's decision (PREEMPTED, NODE_FAIL, BOOT_FAIL, a requeue the script did not ask for)
        for r in replicas:  # not one that succeeded or failed on its own in this attempt (a task the preemption's
            # SIGTERM ended before its wrapper got its own exited 143: not its own)
            if r.state != AppState.SUCCEEDED and (not r.error_msg.startswith("exited with code")
                                                  or r.error_msg == "exited with code 143"):
                r.preempted, r.error_msg = True, preempted
    if stalled is not None:  # the stall watcher stopped the app: the stalled replica failed, and says how,
        # whatever its task did on the warning (one that checkpointed and exited 0 still stalled)
        for r in replicas:
            if (r.role, r.id) == stalled[:2]:
                r.state, r.error_msg = AppState.FAILED, stalled[2]
    # the others were stopped because of the first failure: they did not fail themselves
    failure = attribute_failure(roles_statuses)
    if not failure and not preempted and state == AppState.FAILED and leader.state_name != "FAILED":
        # Slurm ended the job (TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED...): every replica it stopped
        # failed with it
        for r in replicas:
            if r.state in (AppState.CANCELLED, AppState.RUNNING, AppState.FAILED):
                r.state = AppState.FAILED
                r.error_msg = f"job ended by Slurm: {leader.state_name}" + (f" ({r.error_msg})" if r.error_msg else "")
    return failure


def _message(leader: SlurmJob, state: AppState, failure: str) -> str:
    reason = leader.reason if leader.reason and leader.reason != "None" else ""
    if state != AppState.PENDING and reason in WAITING_REASONS:
        reason = ""  # a stale pending reason (sacct keeps the last one) says nothing about the end
    parts = [leader.state_name]
    if reason:
        parts.append(f"reason: {reason}")
    if leader.description:
        parts.append(leader.description)
    if state == AppState.FAILED:
        if failure:
            parts.append(failure)
        elif leader.exit_code:
            parts.append(f"exit code {leader.exit_code}")
        elif leader.signal:
            parts.append(f"signal {leader.signal}")
    return "; ".join(parts)


def replica_status(
    role: Role, k: int, rec: SlurmJob, hosts: list[str], job_dir: JobDir | None, restarts: int
) -> ReplicaStatus:
    """Replica ``k`` of ``role``: its component's state, refined by the status file of this attempt."""
    comp_state = rec.state
    host = hosts[k] if k < len(hosts) and rec.num_tasks in (None, len(hosts)) else ""
    rs = ReplicaStatus(id=k, role=role.name, state=comp_state, hostname=host, restarts=restarts)
    if comp_state == AppState.PENDING or job_dir is None:
        return rs
    f = job_dir.status(role.name, k)
    if f is None or f.attempt != restarts:
        return rs  # not started in this attempt (or files not shared): the role's state stands
    rs.hostname = f.host or rs.hostname
    if f.running:
        rs.state = AppState.RUNNING if not comp_state.is_terminal else comp_state
        return rs
    rs.exit_code = f.exit_code
    if f.exit_code == 0:
        rs.state = AppState.SUCCEEDED
    elif f.signal or (comp_state == AppState.CANCELLED and (f.exit_code or 0) > 128):
        # stopped by tsm (another role failed) or by Slurm (scancel, time limit): not its own failure. Slurm
        # signals a cancelled step's processes one at a time, so a task may die of the SIGTERM before its
        # wrapper gets its own: the wrapper then saw no signal, but the job was cancelled
        rs.state = AppState.CANCELLED
        number = (f.exit_code or 0) - 128
        name = f"SIG{f.signal}" if f.signal else signal_name(number) or f"SIG{number}"
        rs.error_msg = f"stopped by {name} (exit code {f.exit_code})"
    else:
        rs.state = AppState.FAILED
        rs.error_msg = f"exited with code {f.exit_code}" + _node_fault(role.name, k, f.exit_code, f.host, job_dir)
    return rs


def _node_fault(role: str, k: int, code: int | None, host: str, job_dir: JobDir) -> str:
    """What the replicas' wrapper blamed on the node for this replica's failure (``oom_nodes``), or ""."""
    faults = job_dir.excluded("oom_nodes")
    gpu = f"{host} GPU ({role}/{k}: "
    if code == 137 and f"{host} OOM (the kernel's OOM killer ended {role}/{k})" in faults:
        return f": killed by the kernel's OOM killer on {host} (later attempts avoid it)"
    if found := [ln for ln in faults if ln.startswith(gpu)]:
        return f": a GPU fault on {host}: {found[-1][len(gpu) : -1]} (later attempts avoid it)"
    return ""


def from_files(app_id: str, job_dir: JobDir | None) -> DescribeAppResponse | None:
    """Slurm forgot the job (no accounting): its job directory's ``exit`` file still tells how it ended."""
    if job_dir is None:
        return None
    app = load_app(job_dir)
    code = job_dir.exit_code()
    if code.isdigit():
        state = AppState.SUCCEEDED if code == "0" else AppState.FAILED
        msg = "ended (Slurm no longer lists the job)" + (f"; exit code {code}" if code != "0" else "")
    else:
        state, msg = AppState.UNKNOWN, "Slurm no longer lists the job and it left no exit code"
    roles_statuses = []
    for role in app.roles if app else []:
        reps = []
        for k in range(role.num_replicas):
            f = job_dir.status(role.name, k)
            st = state
            if f is not None and not f.running:
                st = AppState.SUCCEEDED if f.exit_code == 0 else AppState.FAILED
            reps.append(ReplicaStatus(id=k, role=role.name, state=st, hostname=f.host if f else "",
                                      exit_code=f.exit_code if f else None))  # fmt: skip
        roles_statuses.append(RoleStatus(role=role.name, replicas=reps))
    return DescribeAppResponse(app_id=app_id, state=state, msg=msg, roles_statuses=roles_statuses, app=app)
