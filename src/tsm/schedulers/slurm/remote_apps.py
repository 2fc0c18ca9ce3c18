"""The Slurm scheduler's operations on apps of a login node reached over SSH (``-c ssh=...``).

:class:`~tsm.schedulers.slurm.scheduler.SlurmScheduler` hands every remote app (an id ``<host slug>-<job id>``,
see :mod:`.remote`) to the functions here; each reads the same records as the local path does, from the
host's shared :class:`~tsm.schedulers.slurm.queries.SlurmQueries` and a local mirror of the job directory's
small files, so the description, state mapping and failure attribution are the local code's.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from datetime import datetime

from tsm.errors import InvalidRunOptionError, UnknownAppError
from tsm.schedulers.api import DescribeAppResponse, ListAppResponse, Stream
from tsm.schedulers.common.logs import check_replica, decode, filter_regex, follow, split_lines, stream_names
from tsm.schedulers.common.polling import poll_until_terminal
from tsm.schedulers.common.record import AppRecord, role_replicas
from tsm.schedulers.common.ssh import SshError, SshTarget, parse_ssh_options
from tsm.schedulers.slurm.parse import read_status
from tsm.schedulers.slurm.remote import (
    Remote,
    RemoteBatchRequest,
    RemoteRecord,
    SshOptions,
    remote,
    remote_of,
)
from tsm.schedulers.slurm.script import (
    CANCEL_MARK,
    SlurmBatchRequest,
    SlurmOptions,
    build_script,
    directive_safe,
    format_request,
    warning_of,
)
from tsm.schedulers.slurm.workspace_ssh import remote_workspace_roles, ship
from tsm.specs.api import AppDef, AppDryRunInfo, AppState
from tsm.specs.runopts import CfgVal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.slurm.scheduler import SlurmScheduler


def dryrun(
    sched: SlurmScheduler, app: AppDef, cfg: Mapping[str, CfgVal], opts: SlurmOptions, ssh: SshOptions
) -> AppDryRunInfo[SlurmBatchRequest]:
    """The request for a login node: the job directory is a remote path (under ``remote_home``), replicas run
    there (or in their workspace's remote snapshot), with the login node's ``python3`` by default."""
    assert ssh.ssh is not None
    rem = remote(ssh.ssh, ssh.ssh_options or ())
    home = rem.resolve(ssh.remote_home or "~/.tsm")
    if opts.python is None and (python := rem.python()) is not None:
        # this machine's interpreter means nothing on the cluster: the login node's python3 instead
        opts = dataclasses.replace(opts, python=python)
    workspaces = remote_workspace_roles(app, home)  # roles in a local snapshot run in its remote twin
    if opts.job_dir:
        job_dir = rem.resolve(opts.job_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        job_dir = f"{home}/slurm/jobs/{app.name}-{stamp}-{os.urandom(4).hex()}"
    if "%" in job_dir or not directive_safe(job_dir):
        raise InvalidRunOptionError(f"job_dir {job_dir!r} must not hold '%', backslashes or line breaks")
    version = opts.version
    if version is None and any(r.resource.gpu and r.resource.gpu > 0 for r in app.roles):
        from tsm.schedulers.slurm.cli import check, parse_version

        version = parse_version(check(rem.run(["sbatch", "--version"], timeout=20), "sbatch --version"))
    record = AppRecord(
        scheduler="slurm", session=sched.session_name, app=app, submit_dir=job_dir,
        details={"job_dir": job_dir, "ssh": ssh.ssh},
    )  # fmt: skip
    request = RemoteBatchRequest(
        script=build_script(app, opts, job_dir, job_dir, version),
        job_dir=job_dir,
        app_name=app.name,
        roles=[r.name for r in app.roles],
        app_json=record.to_json(),
        ssh=ssh.ssh,
        ssh_options=parse_ssh_options(ssh.ssh_options),
        remote_home=home,
        workspaces=workspaces,
    )
    return AppDryRunInfo(request=request, fmt=format_request)


def schedule(req: RemoteBatchRequest) -> str:
    """Ship the request's workspaces, submit it idempotently, keep its record here; the app id."""
    rem = remote(req.ssh, req.ssh_options or ())
    rem.last_ship = [ship(rem, req.remote_home, d) for d in req.workspaces or []]
    job_id = rem.submit(req)
    app_id = f"{SshTarget.parse(req.ssh).slug()}-{job_id}"
    RemoteRecord(app_id, job_id, req.ssh, tuple(req.ssh_options or ()), req.job_dir).save()
    rem.queries.submitted(job_id)
    return app_id


def describe(sched: SlurmScheduler, app_id: str, max_age: float) -> DescribeAppResponse | None:
    """A remote app: its host's shared squeue, and its job directory's small files mirrored here."""
    rec = RemoteRecord.load(app_id)
    if rec is None:
        return None
    rem = remote_of(rec)
    recs = rem.queries.job(rec.job_id, max_age=max_age)
    sched.requeue_stranded(app_id, recs, rem.run)
    mirror = rec.mirror
    if not (mirror / "exit").exists():  # once the job wrote its exit code, the mirror is complete
        rem.mirror([rec])
    desc = sched.describe_records(rec.job_id, recs, mirror if (mirror / "app.json").is_file() else None)
    if desc is not None:
        desc.app_id = app_id
    return desc


def list_apps(sched: SlurmScheduler) -> builtins.list[ListAppResponse]:
    """The apps this machine submitted over SSH (their local records), with one ``squeue`` (and at most one
    ``sacct``) per host; a host that does not answer lists its apps as UNKNOWN."""
    by_host: dict[tuple[str, tuple[str, ...]], list[RemoteRecord]] = {}
    for rec in RemoteRecord.all():
        by_host.setdefault((rec.target, rec.options), []).append(rec)
    out = []
    for recs in by_host.values():
        try:
            jobs = remote_of(recs[0]).queries.jobs([r.job_id for r in recs])
        except SshError:
            jobs = {}
        for rec in recs:
            found = jobs.get(rec.job_id)
            leader = found[0] if found else None
            name = "" if leader is None else leader.name.rsplit(".", 1)[0] if "." in leader.name else leader.name
            out.append(
                ListAppResponse(
                    app_id=rec.app_id,
                    state=leader.state if leader else AppState.UNKNOWN,
                    app_handle=f"{sched.backend}://{sched.session_name}/{rec.app_id}",
                    name=name,
                    created=leader.submit_time if leader else None,
                )
            )
    return out


def cancel(sched: SlurmScheduler, app_id: str) -> None:
    """``scancel`` on the login node, then wait (as locally) until Slurm reports the job ended.

    An app that asked for a warning (``warn_signal``) and runs is warned first, as a local one is
    (:meth:`~tsm.schedulers.slurm.scheduler.SlurmScheduler.cancel`): the cancel mark and the warning in one
    remote call, then up to ``warn_before`` for the job to end by itself.
    """
    rec = RemoteRecord.load(app_id)
    if rec is None:
        return
    rem = remote_of(rec)
    marked = _warn_before_cancel(sched, rem, rec)
    try:
        rem.cancel(rec.job_id)
    except BaseException:
        if marked:  # the job runs on: its next warning is not this cancel's
            _unmark(rem, rec)
        raise
    poll_until_terminal(lambda pause: sched.describe(app_id, max_age=0.0), sched.cancel_timeout,
                        initial=0.2, cap=2.0)  # fmt: skip


#: On the login node: write the cancel mark, then warn the batch shell; the mark is taken back when the warning
#: could not be sent (the job ended meanwhile). $1 job dir, $2 mark's name, $3 signal, $4 job id.
_WARN = (
    'umask 077; printf "cancel\\n" > "$1/$2" || exit 1; '
    'scancel --batch --signal="$3" "$4" || { rm -f -- "$1/$2"; exit 1; }'
)


def _warn_before_cancel(sched: SlurmScheduler, rem: Remote, rec: RemoteRecord) -> bool:
    """Warn every task of a running app that asked for a warning, then wait up to ``warn_before`` (less once the
    job has ended). True when the warning was sent (the cancel mark is on the login node)."""
    script = rem.read(f"{rec.job_dir}/job.sbatch").decode("utf-8", "replace")
    warning = warning_of(script) if script else None
    if warning is None:
        return False
    desc = sched.describe(rec.app_id, max_age=0.0)
    if desc is None or desc.state != AppState.RUNNING:
        return False  # pending or ended: there is no task to warn
    sig, lead = warning
    try:
        proc = rem.conn.run(["sh", "-c", _WARN, "tsm-warn", rec.job_dir, CANCEL_MARK, sig, rec.job_id], timeout=60)
        if proc.returncode != 0:
            return False  # ended meanwhile (or no mark could be written): the scancel that follows says the rest
        rem.queries.invalidate()
        poll_until_terminal(lambda pause: sched.describe(rec.app_id, max_age=0.0), float(lead), initial=0.2,
                            cap=1.0)  # fmt: skip
    except BaseException:  # the connection lost after the mark was written, or Ctrl-C: no cancel follows
        _unmark(rem, rec)
        raise
    return True


def _unmark(rem: Remote, rec: RemoteRecord) -> None:
    """Remove the cancel mark on the login node (best effort): the job runs on, its next warning is not a cancel's."""
    with contextlib.suppress(SshError, OSError):
        rem.conn.run(["sh", "-c", 'rm -f -- "$1/$2"', "tsm-unmark", rec.job_dir, CANCEL_MARK], timeout=30)


def remove(sched: SlurmScheduler, app_id: str) -> bool:
    """Delete the remote job directory's tsm files, the local mirror and the record."""
    from tsm.schedulers.slurm.scheduler import _remove_job_files

    rec = RemoteRecord.load(app_id)
    if rec is None:
        return False
    app = sched._load_app(rec.mirror) if (rec.mirror / "app.json").is_file() else None
    roles = [r.name for r in app.roles] if app else []
    remote_of(rec).remove(rec, roles)
    _remove_job_files(rec.mirror, roles)
    rec.forget()
    return True


def log_iter(
    sched: SlurmScheduler,
    app_id: str,
    role_name: str,
    k: int,
    regex: str | None,
    since: datetime | None,
    until: datetime | None,
    should_tail: bool,
    streams: Stream | None,
) -> Iterator[str]:
    """``log_iter`` of an app on a login node: the files are read over the connection, a follow resumes from
    its byte offset after a dropped connection (:meth:`.remote.Remote.reader`). ``since`` selects whole
    files by their remote mtime and ``until`` by the replica's start, as locally."""
    rec = RemoteRecord.load(app_id)
    if rec is None:
        raise UnknownAppError(f"no record of slurm app '{app_id}' on this machine")
    rem = remote_of(rec)
    rem.mirror([rec])
    app = sched._load_app(rec.mirror) if (rec.mirror / "app.json").is_file() else None
    check_replica(app_id, role_replicas(app), role_name, k)
    assert app is not None  # check_replica refused an app without roles
    role = next(r for r in app.roles if r.name == role_name)
    paths = [f"{rec.job_dir}/{role_name}/{k}.{name}" for name in stream_names(streams)]
    status_path = rec.mirror / role_name / f"{k}.status"
    if since is not None and paths:
        mtimes = rem.mtimes(paths)
        paths = [p for p in paths if mtimes.get(p) is None or mtimes[p] >= since.timestamp()]
    if until is not None:
        f = read_status(status_path)
        if f is not None and f.started is not None and f.started > until.timestamp():
            paths = []
    if not should_tail:
        return filter_regex(regex, (line for p in paths for line in split_lines(decode(rem.read(p)))))
    last_sync = [0.0]
    job_ended = sched._tail_end_check(rec.job_id, role, status_path, queries_=rem.queries)

    def ended() -> bool:
        now = time.monotonic()
        if now - last_sync[0] >= 2.0:
            last_sync[0] = now
            with contextlib.suppress(Exception):  # a dropped connection: the readers retry on their own
                rem.mirror([rec])
        return job_ended()

    return filter_regex(regex, follow([rem.reader(p) for p in paths], ended))
