"""The Slurm scheduler: submit, describe, list, cancel, remove and read logs of apps run as sbatch jobs.

The package docstring (:mod:`tsm.schedulers.slurm`) is the manual; this module ties the pieces together:
:mod:`.script` builds the request, :mod:`.cli` runs Slurm's commands, :mod:`.queries` shares their answers
and :mod:`.parse` reads them; the job directory fills in what Slurm does not keep.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from tsm.errors import (
    InvalidAppError,
    InvalidRunOptionError,
    SchedulerUnavailableError,
    SubmissionError,
    UnknownAppError,
)
from tsm.schedulers.api import (
    BatchedViews,
    DescribeAppResponse,
    DirectoryWorkspaces,
    ListAppResponse,
    Scheduler,
    Stream,
    SweepNative,
    TrialState,
)
from tsm.schedulers.common.errors import cli_message
from tsm.schedulers.common.failure import failure_of, signal_name
from tsm.schedulers.common.files import make_private_dirs, read_text, rmdir, unlink, write_private
from tsm.schedulers.common.logs import (
    check_replica,
    file_reader,
    filter_regex,
    follow,
    read_files,
    stream_names,
)
from tsm.schedulers.common.polling import poll_until_terminal
from tsm.schedulers.common.quoting import is_shell_name
from tsm.schedulers.common.record import AppRecord, role_replicas
from tsm.schedulers.common.status import attribute_failure
from tsm.schedulers.slurm import cli
from tsm.schedulers.slurm.parse import (
    APP_ID,
    WAITING_REASONS,
    SlurmJob,
    expand_hostlist,
    id_key,
    preemption_of,
    read_excluded,
    read_last_exit,
    read_node_error,
    read_stalled,
    read_status,
    stranded,
)
from tsm.schedulers.slurm.queries import SlurmQueries, queries
from tsm.schedulers.slurm.script import (
    CANCEL_MARK,
    JOB_FILES,
    REPLICA_WRAPPER,
    SlurmBatchRequest,
    SlurmOptions,
    build_script,
    directive_safe,
    format_request,
    warning_of,
)
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, ReplicaStatus, Role, RoleStatus
from tsm.specs.runopts import CfgVal, runopts
from tsm.specs.validate import check_exec_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.common.viewmodel import AppSummary as AppView
    from tsm.schedulers.slurm.view import SlurmView


def _default_job_dir(app_name: str) -> str:
    from tsm.store import tsm_home

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return str(tsm_home() / "slurm" / "jobs" / f"{app_name}-{stamp}-{os.urandom(3).hex()}")


def _index_dir() -> Path:
    from tsm.store import tsm_home

    return tsm_home() / "slurm" / "index"


class SlurmScheduler(Scheduler[SlurmBatchRequest], BatchedViews, DirectoryWorkspaces, SweepNative):
    """Runs apps as Slurm heterogeneous batch jobs; see the package docstring (:mod:`tsm.schedulers.slurm`) for the whole picture.

    Capabilities: ``BatchedViews`` (one ``squeue`` plus one ``sstat`` per view refresh),
    ``DirectoryWorkspaces`` (roles run in a directory on the shared filesystem) and ``SweepNative`` (a sweep
    of single-role trials is one job array, ``--array=0-(N-1)%P``: Slurm holds the cap, and each task is an
    app of its own, ``<job id>_<task>``; see :meth:`schedule_sweep`). Not ``SizedPlacement``:
    a role without a resource is accepted: its component gets no size
    directives, so the partition's defaults apply, as TorchX's Slurm scheduler does.
    """

    #: Seconds :meth:`cancel` waits for Slurm to report the job ended (COMPLETING can take KillWait + more).
    cancel_timeout = 120.0

    def __init__(
        self, session_name: str, backend: str = "slurm", queries_: SlurmQueries | None = None
    ) -> None:
        super().__init__(backend, session_name)
        self._queries = queries_
        self._view: SlurmView | None = None

    @property
    def queries(self) -> SlurmQueries:
        """The status batcher this scheduler reads through (the process-wide one by default)."""
        return self._queries or queries()

    # -- run options --------------------------------------------------------------------------------------
    def run_opts(self) -> runopts:
        """The sbatch options tsm exposes (declared once, typed, in :class:`SlurmOptions`), and the SSH ones
        (:class:`~tsm.schedulers.slurm.remote.SshOptions`: ``ssh``, ``ssh_options``, ``remote_home``)."""
        from tsm.schedulers.slurm.remote import SshOptions

        opts = SlurmOptions.runopts()
        opts.update(SshOptions.runopts())
        return opts

    # -- requests -----------------------------------------------------------------------------------------
    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Reject what Slurm cannot carry: mounts, odd env names with an '=' in the entrypoint, bad paths."""
        for role in app.roles:
            if role.mounts:
                raise InvalidAppError(
                    f"role '{role.name}': the slurm scheduler has no mounts; replicas see the nodes' own filesystems"
                )
            odd = [k for k in role.env if not is_shell_name(k)]
            if odd and "=" in role.entrypoint:
                raise InvalidAppError(
                    f"role '{role.name}': env names {odd} are not shell names, so they are set with env(1), "
                    "which would read the entrypoint (it holds '=') as another variable"
                )
            for key in ("partition", "constraint"):
                value = (role.resource.capabilities or {}).get(key)
                if value is not None and not isinstance(value, str):
                    raise InvalidAppError(f"role '{role.name}': resource capability '{key}' must be a string")
            # Both programs the job starts per replica must fit ARG_MAX with the submitter's environment
            # (the job keeps it): bash, given the wrapper, the env pairs and the command as arguments, then
            # the command itself, given the env.
            env_pairs = [f"{k}={v}" for k, v in role.env.items()]
            wrapper = ["bash", "-c", REPLICA_WRAPPER, "tsm-replica", role.name, str(role.num_replicas), "0"]
            check_exec_size(f"role '{role.name}'", [*wrapper, *env_pairs, role.entrypoint, *role.args], {}, inherit=True)
            check_exec_size(f"role '{role.name}'", [role.entrypoint, *role.args], role.env, inherit=True)
        SlurmOptions.from_cfg(cfg)  # refuses bad values before the app's own checks are paid for

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[SlurmBatchRequest]:
        """Build the batch script; asks ``sbatch --version`` only when a role wants GPUs."""
        opts = SlurmOptions.from_cfg(cfg)
        from tsm.schedulers.slurm.remote import SshOptions

        ssh = SshOptions.from_cfg(cfg)
        if ssh.ssh:
            from tsm.schedulers.slurm import remote_apps

            return remote_apps.dryrun(self, app, cfg, opts, ssh)
        job_dir = os.path.abspath(os.path.expanduser(opts.job_dir or _default_job_dir(app.name)))
        if "%" in job_dir or not directive_safe(job_dir):
            raise InvalidRunOptionError(f"job_dir {job_dir!r} must not hold '%', backslashes or line breaks")
        version = opts.version
        if version is None and any(r.resource.gpu and r.resource.gpu > 0 for r in app.roles):
            version = cli.slurm_version()
        submit_dir = os.getcwd()
        record = AppRecord(
            scheduler="slurm",
            session=self.session_name,
            app=app,
            submit_dir=submit_dir,
            details={"job_dir": job_dir},
        )
        request = SlurmBatchRequest(
            script=build_script(app, opts, job_dir, submit_dir, version),
            job_dir=job_dir,
            app_name=app.name,
            roles=[r.name for r in app.roles],
            app_json=record.to_json(),
        )
        return AppDryRunInfo(request=request, fmt=format_request)

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> str:
        """Make the job directory, save the script and app, ``sbatch`` the script unchanged; returns the job id.

        A request for a login node (``-c ssh=...``) is submitted there, idempotently
        (:meth:`tsm.schedulers.slurm.remote.Remote.submit`); its app id is ``<host slug>-<job id>``.
        """
        req = dryrun_info.request
        if not isinstance(req, SlurmBatchRequest):
            raise SubmissionError(f"the slurm scheduler cannot submit a {type(req).__name__} request")
        from tsm.schedulers.slurm.remote import RemoteBatchRequest

        if isinstance(req, RemoteBatchRequest):
            from tsm.schedulers.slurm import remote_apps

            return remote_apps.schedule(req)
        job_dir = Path(req.job_dir)
        _prepare_job_dir(job_dir, req, req.script)
        try:
            job_id = self._sbatch(req.sbatch_args, job_dir / "job.sbatch", job_dir)
        except BaseException:
            _remove_job_files(job_dir, req.roles)  # nothing was submitted: leave no half-made job behind
            raise
        _record_job(job_id, job_dir)
        self.queries.submitted(job_id)
        return job_id

    @staticmethod
    def _sbatch(sbatch_args: Sequence[str], script: Path, cwd: Path) -> str:
        """``sbatch`` the saved ``script`` from ``cwd``; the job id (typed errors when Slurm refuses)."""
        # umask 077: files Slurm creates for the job before its script runs (batch.out) are private too
        proc = cli.run(["sbatch", *sbatch_args, str(script)], cwd=str(cwd), umask=0o077)
        if proc.returncode != 0:
            err = cli_message(proc)
            if cli.unreachable(proc):
                raise SchedulerUnavailableError(f"sbatch: the Slurm controller cannot be reached ({err})")
            raise SubmissionError(f"sbatch refused the job: {err}")
        job_id = proc.stdout.strip().splitlines()[-1].split(";")[0].strip() if proc.stdout.strip() else ""
        if not job_id.isdigit():
            raise SubmissionError(f"sbatch gave no job id: {proc.stdout.strip()!r} {proc.stderr.strip()!r}")
        return job_id

    # -- sweeps: one job array (SweepNative) ----------------------------------------------------------------
    def accepts_sweep(self, trials: Sequence[AppDryRunInfo[SlurmBatchRequest]]) -> bool:
        """A sweep is one job array when every trial is a single-role job submitted from here (heterogeneous
        jobs cannot be arrays; a login node's ``-c ssh=...`` submissions go through the controller)."""
        from tsm.schedulers.slurm.remote import RemoteBatchRequest

        return bool(trials) and all(
            isinstance(t.request, SlurmBatchRequest) and not isinstance(t.request, RemoteBatchRequest)
            and len(t.request.roles) == 1 for t in trials
        )

    def schedule_sweep(
        self, trials: Sequence[AppDryRunInfo[SlurmBatchRequest]], parallel: int, name: str
    ) -> builtins.list[str]:
        """Submit the trials as one job array ``--array=0-(N-1)%parallel``; their app ids ``<job id>_<i>``.

        Each trial gets its own job directory as :meth:`schedule` makes it (app.json, role folders, and its
        own script, :func:`~tsm.schedulers.slurm.script.array_task_script`, with its own command line and
        env); the array's script (:func:`~tsm.schedulers.slurm.script.build_array_script`) sits in a folder
        beside them whose entries ``0``, ``1``, ... link to those directories, and task ``i`` runs trial
        ``i``'s script. So each trial is an ordinary app: ``describe``, logs, ``cancel`` (``scancel
        <job>_<i>``) and ``remove`` work on it as on any job.
        """
        if not self.accepts_sweep(trials):
            raise SubmissionError("a Slurm job array takes single-role trials submitted from this machine only")
        reqs = [t.request for t in trials]
        first = Path(reqs[0].job_dir)
        links = first.parent / f"{first.name}-array"
        if "%" in str(links) or not directive_safe(str(links)):
            raise InvalidRunOptionError(f"job_dir {first} must not hold '%', backslashes or line breaks")
        from tsm.schedulers.slurm.script import array_task_script, build_array_script

        made: builtins.list[SlurmBatchRequest] = []
        try:
            script = build_array_script([array_task_script(r.script) for r in reqs], str(links),
                                        f"{name}.{reqs[0].roles[0]}", parallel)
            make_private_dirs(links)
            for i, req in enumerate(reqs):
                _prepare_job_dir(Path(req.job_dir), req, array_task_script(req.script))
                made.append(req)
                os.symlink(req.job_dir, links / str(i))
            write_private(links / "job.sbatch", script)
            array_id = self._sbatch(reqs[0].sbatch_args, links / "job.sbatch", links)
        except BaseException as e:
            for req in made:  # nothing was submitted: leave no half-made job behind
                _remove_job_files(Path(req.job_dir), req.roles)
            for i in range(len(made)):
                unlink(links / str(i))
            unlink(links / "job.sbatch")
            rmdir(links)
            if isinstance(e, OSError):
                raise SubmissionError(f"cannot prepare the job array in {links}: {e.strerror or e}") from e
            raise
        ids = [f"{array_id}_{i}" for i in range(len(reqs))]
        with contextlib.suppress(OSError):
            write_private(links / "job_id", array_id + "\n")
        for app_id, req in zip(ids, reqs, strict=True):
            _record_job(app_id, Path(req.job_dir))
            self.queries.submitted(app_id)
        return ids

    def trial_states(self, app_ids: Sequence[str]) -> dict[str, TrialState]:
        """The trials' states from one ``squeue`` (one ``sacct`` for those it no longer shows), each as
        :meth:`describe` says it, with the start and end times Slurm recorded."""
        records = self.queries.jobs(app_ids)
        arrays = sorted({i.partition("_")[0] for i in app_ids if "_" in i and not records.get(i)})
        if arrays:  # tasks Slurm shows no record of: the array's own record may say they ended with it
            records.update(self.queries.jobs(arrays))
        out: dict[str, TrialState] = {}
        for app_id in app_ids:
            recs = records.get(app_id)
            array = records.get(app_id.partition("_")[0]) if "_" in app_id else None
            if not recs and array and array[0].state.is_terminal:
                # a task that never started, of an array that ended (cancelled): Slurm keeps only the array's
                # record for it
                out[app_id] = TrialState(array[0].state, f"never started: the job array ended {array[0].state_name}")
                continue
            self.requeue_stranded(app_id, recs)
            desc = self.describe_records(app_id, recs, *self._dir_and_app(app_id, recs))
            if desc is None:
                continue
            leader = recs[0] if recs else None
            out[app_id] = TrialState(desc.state, desc.msg, leader.start_time if leader else None,
                                     leader.end_time if leader else None)
        return out

    def cancel_trials(self, app_ids: Sequence[str]) -> None:
        """``scancel`` every trial in one call (tasks not started never start), then wait as :meth:`cancel`."""
        ids = [i for i in app_ids if APP_ID.fullmatch(i)]
        for other in app_ids:
            if other not in ids:
                self.cancel(other)
        if not ids:
            return
        proc = cli.run(["scancel", *ids])
        if proc.returncode != 0:
            err = proc.stderr.lower()
            if "already completing or completed" not in err and "invalid job id" not in err:
                cli.check(proc, "scancel")
        self.queries.invalidate()

        def describe_all(pause: float) -> DescribeAppResponse | None:
            # "terminal" once every trial is: the poller waits on one response, so give it the first live one
            records = self.queries.jobs(ids, max_age=min(pause, 1.0))
            live = [i for i in ids if records.get(i) and not records[i][0].state.is_terminal]
            return self.describe(live[0], max_age=min(pause, 1.0)) if live else None

        poll_until_terminal(describe_all, self.cancel_timeout, initial=0.2, cap=2.0)

    # -- queries ------------------------------------------------------------------------------------------
    @staticmethod
    def _indexed_job_dir(app_id: str) -> Path | None:
        """The job directory this ``$TSM_HOME`` recorded for ``app_id`` at submission, if any."""
        try:
            text = read_text(_index_dir() / app_id) if APP_ID.fullmatch(app_id) else None
        except Exception:  # noqa: BLE001 - an unusable TSM_HOME only loses the index
            return None
        path = Path(text.strip()) if text and text.strip() else None
        return path if path is not None and (path / "app.json").is_file() else None

    def _job_dir(self, app_id: str, recs: list[SlurmJob] | None) -> Path | None:
        """The app's job directory: from this TSM_HOME's index, else from the job's WorkDir."""
        indexed = self._indexed_job_dir(app_id)
        if indexed is not None:
            return indexed
        task = app_id.partition("_")[2]  # an array task's WorkDir is the array's folder of links, one per task
        for r in recs or []:
            where = Path(r.work_dir) / task if r.work_dir else None
            if where is not None and (where / "app.json").is_file():
                return where
        return None

    @staticmethod
    def _load_app(job_dir: Path | None) -> AppDef | None:
        """The app as submitted, from the job directory's record (None when it is gone or unreadable)."""
        record = AppRecord.load(job_dir / "app.json") if job_dir is not None else None
        return record.app if record is not None else None

    @staticmethod
    def _rebuild_app(recs: list[SlurmJob]) -> AppDef:
        """An app shaped like the job when its app.json is gone: roles named after the components."""
        app_name = recs[0].name.rsplit(".", 1)[0] if recs else "unknown"
        roles = []
        for r in recs:
            role_name = r.name.rsplit(".", 1)[-1] if "." in r.name else f"role{r.offset}"
            roles.append(Role(name=role_name, entrypoint="?", num_replicas=max(1, r.num_tasks or 1)))
        return AppDef(name=app_name or "unknown", roles=roles)

    def describe(self, app_id: str, max_age: float = 1.0) -> DescribeAppResponse | None:
        """The app's state, per role and replica, from squeue/sacct refined by the job directory.

        ``max_age`` is how old (seconds) a shared squeue answer may be; see :class:`SlurmQueries`.
        """
        if not APP_ID.fullmatch(app_id):
            from tsm.schedulers.slurm import remote_apps

            return remote_apps.describe(self, app_id, max_age)
        recs = self.queries.job(app_id, max_age=max_age)
        self.requeue_stranded(app_id, recs)
        return self.describe_records(app_id, recs, *self._dir_and_app(app_id, recs))

    def requeue_stranded(self, app_id: str, recs: list[SlurmJob] | None,
                         run: Callable[[list[str]], object] | None = None) -> None:
        """Requeue the components of a heterogeneous app Slurm left behind when it requeued the rest (see
        :func:`~tsm.schedulers.slurm.parse.stranded`); once per app and restart in this process.

        Done by whichever look sees it (``tsm status``, ``wait``, the views, a sweep's controller): the job's
        own batch shell died with the failed node. ``scontrol requeue`` of the pending leader answers "Job is
        pending execution", and requeues the components that ended. ``run`` runs it (default: here; an app
        submitted over SSH passes its login node's).
        """
        if not recs or not stranded(recs) or (app_id, recs[0].restarts) in _REQUEUED_WHOLE:
            return
        _REQUEUED_WHOLE.add((app_id, recs[0].restarts))
        (run or cli.run)(["scontrol", "requeue", recs[0].app_id])

    def _dir_and_app(self, app_id: str, recs: list[SlurmJob] | None) -> tuple[Path | None, AppDef | None]:
        """The app's job directory and app as submitted (kept for the process once read)."""
        known = _RECORDS.get(app_id)
        if known is not None and known[0].is_dir():
            return known
        job_dir = self._job_dir(app_id, recs)
        app = self._load_app(job_dir)
        if job_dir is not None and app is not None:
            _RECORDS.put(app_id, job_dir, app)
        return job_dir, app

    def describe_records(
        self, app_id: str, recs: list[SlurmJob] | None, job_dir: Path | None, app: AppDef | None = None
    ) -> DescribeAppResponse | None:
        """:meth:`describe` from records already fetched (``recs``, see :class:`SlurmQueries`), the app's job
        directory and, when the caller keeps it, its ``app``: no Slurm command is run here (the views'
        batch hook, :mod:`tsm.schedulers.slurm.view`, describes every app of a tick from one ``squeue``)."""
        if not recs:
            return self._describe_from_files(app_id, job_dir)
        if app is None:
            app = self._load_app(job_dir)
        if app is None or len(app.roles) != len(recs):
            app = self._rebuild_app(recs)
        leader = recs[0]
        state = leader.state
        restarts = leader.restarts
        if job_dir is not None and leader.source == "sacct" and not restarts:
            text = read_text(job_dir / "restarts")
            restarts = int(text.strip()) if text and text.strip().isdigit() else 0
        roles_statuses: list[RoleStatus] = []
        for role, rec in zip(app.roles, recs, strict=False):
            hosts = expand_hostlist(rec.nodes) if rec.nodes else []
            replicas = [
                self._replica_status(role, k, rec, hosts, job_dir, restarts) for k in range(role.num_replicas)
            ]
            roles_statuses.append(RoleStatus(role=role.name, replicas=replicas))
        # the cluster's decision (PREEMPTED, NODE_FAIL, BOOT_FAIL, a requeue the script did not ask for)
        preempted = preemption_of(leader, read_last_exit(job_dir) if job_dir is not None else "")
        if preempted:
            for rs_role in roles_statuses:
                for r in rs_role.replicas:  # not one that succeeded or failed on its own in this attempt (a task
                    # the preemption's SIGTERM ended before its wrapper got its own exited 143: not its own)
                    if r.state != AppState.SUCCEEDED and (not r.error_msg.startswith("exited with code")
                                                          or r.error_msg == "exited with code 143"):
                        r.preempted, r.error_msg = True, preempted
        # the batch script's stall watcher stopped the app: the stalled replica failed, and says how, whatever
        # its task did on the warning (one that checkpointed and exited 0 still stalled)
        stalled = read_stalled(job_dir) if job_dir is not None else None
        if stalled is not None:
            for rs_role in roles_statuses:
                for r in rs_role.replicas:
                    if (rs_role.role, r.id) == stalled[:2]:
                        r.state, r.error_msg = AppState.FAILED, stalled[2]
        # the others were stopped because of the first failure: they did not fail themselves
        failure = attribute_failure(roles_statuses)
        if not failure and not preempted and state == AppState.FAILED and leader.state_name != "FAILED":
            # Slurm ended the job (TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED...): every replica it
            # stopped failed with it.
            for rs_role in roles_statuses:
                for r in rs_role.replicas:
                    if r.state in (AppState.CANCELLED, AppState.RUNNING, AppState.FAILED):
                        r.state = AppState.FAILED
                        r.error_msg = f"job ended by Slurm: {leader.state_name}" + (
                            f" ({r.error_msg})" if r.error_msg else ""
                        )
        msg = self._message(leader, state, failure)
        if stalled is not None:
            msg += f"; replica {stalled[0]}/{stalled[1]} {stalled[2]}"
        excluded = read_excluded(job_dir) if job_dir is not None else []
        if excluded:  # nodes that failed under an earlier attempt: the batch script keeps the app off them
            msg += "; excluded nodes: " + ", ".join(excluded)
        node_error = read_node_error(job_dir) if job_dir is not None else ""
        if node_error:  # ... and when it could not, why the app failed
            msg += "; " + node_error
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=restarts,
            msg=msg,
            structured_error_msg=failure_of(state, msg, roles_statuses),
            roles_statuses=roles_statuses,
            app=app,
            created=leader.submit_time,
        )

    @staticmethod
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

    @staticmethod
    def _replica_status(
        role: Role,
        k: int,
        rec: SlurmJob,
        hosts: list[str],
        job_dir: Path | None,
        restarts: int,
    ) -> ReplicaStatus:
        comp_state = rec.state
        host = hosts[k] if k < len(hosts) and rec.num_tasks in (None, len(hosts)) else ""
        rs = ReplicaStatus(id=k, role=role.name, state=comp_state, hostname=host, restarts=restarts)
        if comp_state == AppState.PENDING or job_dir is None:
            return rs
        f = read_status(job_dir / role.name / f"{k}.status")
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
            rs.error_msg = f"exited with code {f.exit_code}"
            faults = read_excluded(job_dir, "oom_nodes")
            gpu = f"{f.host} GPU ({role.name}/{k}: "
            if f.exit_code == 137 and f"{f.host} OOM (the kernel's OOM killer ended {role.name}/{k})" in faults:
                rs.error_msg += f": killed by the kernel's OOM killer on {f.host} (later attempts avoid it)"
            elif found := [ln for ln in faults if ln.startswith(gpu)]:
                why = found[-1][len(gpu) : -1]
                rs.error_msg += f": a GPU fault on {f.host}: {why} (later attempts avoid it)"
        return rs

    def _describe_from_files(self, app_id: str, job_dir: Path | None) -> DescribeAppResponse | None:
        """Slurm forgot the job (no accounting): its job directory's ``exit`` file still tells how it ended."""
        if job_dir is None:
            return None
        app = self._load_app(job_dir)
        code = (read_text(job_dir / "exit") or "").strip()
        if code.isdigit():
            state = AppState.SUCCEEDED if code == "0" else AppState.FAILED
            msg = "ended (Slurm no longer lists the job)" + (f"; exit code {code}" if code != "0" else "")
        else:
            state, msg = AppState.UNKNOWN, "Slurm no longer lists the job and it left no exit code"
        roles_statuses = []
        for role in app.roles if app else []:
            reps = []
            for k in range(role.num_replicas):
                f = read_status(job_dir / role.name / f"{k}.status")
                st = state
                if f is not None and not f.running:
                    st = AppState.SUCCEEDED if f.exit_code == 0 else AppState.FAILED
                reps.append(
                    ReplicaStatus(
                        id=k,
                        role=role.name,
                        state=st,
                        hostname=f.host if f else "",
                        exit_code=f.exit_code if f else None,
                    )
                )
            roles_statuses.append(RoleStatus(role=role.name, replicas=reps))
        return DescribeAppResponse(
            app_id=app_id, state=state, msg=msg, roles_statuses=roles_statuses, app=app
        )

    def view_snapshot(self, app_ids: Sequence[str]) -> builtins.list[AppView]:
        """The views' batch hook (:class:`tsm.schedulers.api.BatchedViews`): every app of ``app_ids`` from one
        ``squeue``, one ``sacct`` only for jobs the controller forgot, and one ``sstat`` for the usage of the
        running ones; see :mod:`tsm.schedulers.slurm.view`."""
        if self._view is None:
            from tsm.schedulers.slurm.view import SlurmView

            self._view = SlurmView(self)
        return self._view.snapshot(app_ids)

    def wait(
        self, app_id: str, timeout: float | None = None, poll_interval: float | None = None
    ) -> DescribeAppResponse | None:
        """Block until the app is terminal or ``timeout`` passes; return its last description.

        Polls :meth:`describe` starting every 0.5 s and backing off by 1.5x to every 5 s; the polls go
        through the shared :class:`SlurmQueries`, so many apps waited on in threads share their squeue
        calls (about one a second in all) instead of each asking the controller.
        """
        return poll_until_terminal(
            lambda pause: self.describe(app_id, max_age=min(pause, 1.0)), timeout, initial=0.5,
            cap=min(5.0, poll_interval or 5.0),
        )

    def list(self) -> list[ListAppResponse]:
        """This user's jobs: those ``squeue`` shows and those ``sacct`` recorded in the last 7 days."""
        found: dict[str, list[SlurmJob]] = {}
        found.update(self.queries.recent())
        found.update(self.queries.queue())
        me = _user_name()
        out = []
        for app_id, recs in found.items():
            leader = recs[0]
            if me and leader.user and leader.user != me:
                continue  # 22.05's squeue --json ignores --me, and root's sacct shows everyone
            out.append(
                ListAppResponse(
                    app_id=app_id,
                    state=leader.state,
                    app_handle=f"{self.backend}://{self.session_name}/{app_id}",
                    name=leader.name.rsplit(".", 1)[0] if "." in leader.name else leader.name,
                    created=leader.submit_time,
                )
            )
        from tsm.schedulers.slurm import remote_apps

        out += remote_apps.list_apps(self)
        out.sort(key=lambda r: (r.created or 0, id_key(r.app_id)), reverse=True)
        return out

    def cancel(self, app_id: str) -> None:
        """``scancel`` the job (every role) and return once Slurm reports it ended (or
        :attr:`cancel_timeout` seconds passed); cancelling an ended or unknown job is not an error.

        Waiting matters: right after ``scancel`` the job is still RUNNING/COMPLETING while its steps are
        killed, and ``tsm cancel`` (or Ctrl-C of an attached run) prints the state that follows the cancel.
        """
        if not APP_ID.fullmatch(app_id):
            from tsm.schedulers.slurm import remote_apps

            remote_apps.cancel(self, app_id)
            return
        mark = self._warn_before_cancel(app_id)
        try:
            proc = cli.run(["scancel", app_id])
            if proc.returncode != 0:
                err = proc.stderr.lower()
                if "already completing or completed" not in err and "invalid job id" not in err:
                    cli.check(proc, f"scancel {app_id}")
        except BaseException:
            if mark is not None:  # the job runs on: its next warning is not this cancel's
                unlink(mark)
            raise
        self.queries.invalidate()
        poll_until_terminal(lambda pause: self.describe(app_id, max_age=0.0), self.cancel_timeout,
                            initial=0.2, cap=2.0)

    def _warn_before_cancel(self, app_id: str) -> Path | None:
        """When the app asked for a warning (``warn_signal``) and runs: warn every task, then wait up to
        ``warn_before`` (less once the job has ended) before the ``scancel``. Returns the cancel mark it wrote,
        or None.

        The warning goes to the batch shell (``scancel --batch --signal``), which forwards it once to every
        task as it does before a time limit; :data:`~tsm.schedulers.slurm.script.CANCEL_MARK` in the job
        directory tells it this is a cancel, so it never requeues the job for ``requeue_on_time_limit``. The
        mark is removed again when no cancel follows it (the warning could not be sent, or this is
        interrupted), and by the batch script as each attempt starts: a stale one would make a later time
        limit's warning a cancel's.
        """
        job_dir, _ = self._dir_and_app(app_id, None)
        script = read_text(job_dir / "job.sbatch") if job_dir is not None else None
        warning = warning_of(script) if script else None
        if job_dir is None or warning is None:
            return None
        desc = self.describe(app_id, max_age=0.0)
        if desc is None or desc.state != AppState.RUNNING:
            return None  # pending or ended: there is no task to warn
        sig, lead = warning
        mark = job_dir / CANCEL_MARK
        write_private(mark, "cancel\n")
        try:
            proc = cli.run(["scancel", "--batch", f"--signal={sig}", app_id])
            if proc.returncode != 0:
                unlink(mark)
                return None  # ended meanwhile: the scancel that follows says the rest
            self.queries.invalidate()
            poll_until_terminal(lambda pause: self.describe(app_id, max_age=0.0), float(lead), initial=0.2,
                                cap=1.0)
        except BaseException:
            unlink(mark)
            raise
        return mark

    def remove(self, app_id: str) -> bool:
        """Delete the files tsm wrote for an ended app (its job directory and index entry).

        Only the files tsm and Slurm write there are deleted, and then the directories if that leaves
        them empty, so a ``job_dir`` that held other files keeps them. Slurm's own records stay.
        """
        if not APP_ID.fullmatch(app_id):
            from tsm.schedulers.slurm import remote_apps

            return remote_apps.remove(self, app_id)
        job_dir = self._indexed_job_dir(app_id)
        if job_dir is None:
            job_dir = self._job_dir(app_id, self.queries.job(app_id))
        removed = False
        _RECORDS.forget(app_id)
        if job_dir is not None:
            app = self._load_app(job_dir)
            removed = _remove_job_files(job_dir, [r.name for r in app.roles] if app else [])
        with contextlib.suppress(Exception):  # an unusable TSM_HOME has no index to clean
            removed |= unlink(_index_dir() / app_id)
        return removed

    # -- logs ---------------------------------------------------------------------------------------------
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
        """Lines of replica ``k`` of ``role_name`` from its files in the job directory.

        See the package docstring for what COMBINED, ``since``/``until`` and ``should_tail`` mean here.
        """
        if not APP_ID.fullmatch(app_id):
            from tsm.schedulers.slurm import remote_apps

            return remote_apps.log_iter(self, app_id, role_name, k, regex, since, until, should_tail, streams)
        job_dir = None
        if APP_ID.fullmatch(app_id):
            job_dir = self._indexed_job_dir(app_id) or self._job_dir(app_id, self.queries.job(app_id))
        if job_dir is None:
            raise UnknownAppError(
                f"no job directory found for slurm app '{app_id}' (not submitted by tsm, or its files are gone)"
            )
        app = self._load_app(job_dir)
        check_replica(app_id, role_replicas(app), role_name, k)
        assert app is not None  # check_replica refused an app without roles
        role = next(r for r in app.roles if r.name == role_name)
        paths = [job_dir / role_name / f"{k}.{name}" for name in stream_names(streams)]
        status_path = job_dir / role_name / f"{k}.status"
        if since is not None or until is not None:
            paths = [p for p in paths if _file_in_window(p, status_path, since, until)]
        if not should_tail:
            return filter_regex(regex, read_files(paths))
        ended = self._tail_end_check(app_id, role, status_path)
        return filter_regex(regex, follow([file_reader(p) for p in paths], ended))

    def _tail_end_check(
        self, app_id: str, role: Role, status_path: Path, queries_: SlurmQueries | None = None
    ) -> Callable[[], bool]:
        """A callable that is True once the replica is done for good (no retry left) or the job has ended."""
        last_check = [0.0]

        def ended() -> bool:
            f = read_status(status_path)
            if f is not None and not f.running and (f.exit_code == 0 or f.attempt >= role.max_retries):
                return True
            now = time.monotonic()
            if now - last_check[0] < 2.0:
                return False
            last_check[0] = now
            recs = (queries_ or self.queries).job(app_id, max_age=2.0)
            return recs is None or bool(recs) and recs[0].state.is_terminal

        return ended


class _RecordCache:
    """The job directory and app of each app id ``describe`` has read, kept for the process.

    They never change after submission (``app.json`` is written once, before ``sbatch``), and reading them is
    most of what ``describe`` costs beyond the shared ``squeue``: two file opens and a JSON parse per app
    (docs/perf.md, "Slurm: status of 1,000 jobs"). An entry is dropped by ``remove`` and ignored once its
    directory is gone; at most :attr:`LIMIT` apps are kept (the oldest go first). The cached ``AppDef`` is
    shared by the descriptions of one app: treat ``DescribeAppResponse.app`` as read-only.
    """

    LIMIT = 20000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[Path, AppDef]] = {}

    def get(self, app_id: str) -> tuple[Path, AppDef] | None:
        return self._items.get(app_id)

    def put(self, app_id: str, job_dir: Path, app: AppDef) -> None:
        with self._lock:
            self._items[app_id] = (job_dir, app)
            while len(self._items) > self.LIMIT:
                del self._items[next(iter(self._items))]

    def forget(self, app_id: str) -> None:
        with self._lock:
            self._items.pop(app_id, None)


_RECORDS = _RecordCache()

#: (app id, the leader's restarts) of heterogeneous apps this process asked Slurm to requeue whole.
_REQUEUED_WHOLE: set[tuple[str, int]] = set()


def _prepare_job_dir(job_dir: Path, req: SlurmBatchRequest, script: str) -> None:
    """Make the job directory of a request: role folders, ``app.json`` and the ``script`` it runs."""
    try:
        make_private_dirs(job_dir)
        if (job_dir / "app.json").exists():
            raise SubmissionError(f"job_dir {job_dir} already holds an app: choose another directory")
        for role in req.roles:
            (job_dir / role).mkdir(mode=0o700, exist_ok=True)
        write_private(job_dir / "app.json", req.app_json)
        write_private(job_dir / "job.sbatch", script)
    except OSError as e:
        raise SubmissionError(f"cannot prepare the job directory {job_dir}: {e.strerror or e}") from e


def _record_job(app_id: str, job_dir: Path) -> None:
    """Write the app id into its job directory and this ``$TSM_HOME``'s index (which leads back to it)."""
    try:
        write_private(job_dir / "job_id", app_id + "\n")
        index = _index_dir()
        make_private_dirs(index)
        write_private(index / app_id, str(job_dir) + "\n")
    except OSError:
        pass  # the job's WorkDir still leads to the job directory


def _remove_job_files(job_dir: Path, roles: list[str]) -> bool:
    """Delete the files tsm and Slurm write in a job directory, then the directories left empty."""
    removed = False
    for role in roles:
        for f in (job_dir / role).glob("*"):
            if re.fullmatch(r"\d+\.(stdout|stderr|status)", f.name):
                removed |= unlink(f)
        rmdir(job_dir / role)
    # with the long-run records of the batch script (see the package docstring)
    for name in JOB_FILES:
        removed |= unlink(job_dir / name)
    rmdir(job_dir)
    return removed


def _user_name() -> str:
    """This process's user name, as Slurm reports job owners ("" when it cannot be told)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "")


def _file_in_window(path: Path, status_path: Path, since: datetime | None, until: datetime | None) -> bool:
    """Whole-file time filter: Slurm's log lines carry no time of their own."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return True
    if since is not None and mtime < since.timestamp():
        return False
    if until is not None:
        f = read_status(status_path)
        if f is not None and f.started is not None and f.started > until.timestamp():
            return False
    return True
