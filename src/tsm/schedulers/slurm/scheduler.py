"""The Slurm scheduler: submit, describe, list, cancel, remove and read logs of apps run as sbatch jobs.

Every operation first finds where the app lives (:meth:`SlurmScheduler.where`: a :class:`~.host.Where`, whose
host is this machine or a login node over SSH) and then asks that host; nothing here tells local from remote
apps. :mod:`.script` builds the request, :mod:`.describe` reads Slurm's records and the job directory,
:mod:`.array` runs sweeps as job arrays.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from tsm.errors import InvalidAppError, InvalidRunOptionError, SubmissionError, UnknownAppError
from tsm.schedulers.api import (
    BatchedViews,
    DescribeAppResponse,
    DirectoryWorkspaces,
    ListAppResponse,
    LockfileEnvironments,
    NativeDependencies,
    Scheduler,
    Secrets,
    Stream,
    SweepNative,
    TrialState,
)
from tsm.schedulers.common.logs import check_replica, decode, filter_regex, follow, split_lines, stream_names
from tsm.schedulers.common.polling import poll_until_terminal
from tsm.schedulers.common.quoting import is_shell_name
from tsm.schedulers.common.record import AppRecord, role_replicas
from tsm.schedulers.common.ssh import SshError, parse_ssh_options
from tsm.schedulers.slurm import envs as slurm_envs, secrets as slurm_secrets, ssh_host
from tsm.schedulers.slurm.debug import SlurmDebug
from tsm.schedulers.slurm.describe import describe_records
from tsm.schedulers.slurm.host import Host, LocalHost, Where, default_job_dir
from tsm.schedulers.slurm.jobdir import JobDir
from tsm.schedulers.slurm.parse import APP_ID, SlurmJob, id_key, job_state
from tsm.schedulers.slurm.queries import SlurmQueries, queries
from tsm.schedulers.slurm.script import (
    REPLICA_WRAPPER,
    SlurmBatchRequest,
    SlurmOptions,
    build_script,
    dependency_args,
    directive_safe,
    format_request,
    warning_of,
)
from tsm.schedulers.slurm.ssh_host import SshOptions
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Role
from tsm.specs.runopts import CfgVal, runopts
from tsm.specs.validate import check_exec_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.common.viewmodel import AppSummary as AppView
    from tsm.schedulers.slurm.view import SlurmView


class SlurmScheduler(Scheduler[SlurmBatchRequest], BatchedViews, DirectoryWorkspaces, SweepNative,
                     LockfileEnvironments, Secrets, SlurmDebug, NativeDependencies):
    """Runs apps as Slurm heterogeneous batch jobs (docs/schedulers/slurm.md is the manual).

    Capabilities: ``BatchedViews`` (one ``squeue`` plus one ``sstat`` per view refresh),
    ``DirectoryWorkspaces`` (roles run in a directory on the shared filesystem) and ``SweepNative`` (a sweep
    of single-role trials is one job array, ``--array=0-(N-1)%P``: Slurm holds the cap, and each task is an
    app of its own, ``<job id>_<task>``; see :meth:`schedule_sweep`), and exec, stack and port-forward
    (:class:`~tsm.schedulers.slurm.debug.SlurmDebug`). Not ``SizedPlacement``: a role without
    a resource is accepted: its component gets no size directives, so the partition's defaults apply, as
    TorchX's Slurm scheduler does. ``LockfileEnvironments``: built at submit on the shared file system
    (:mod:`tsm.schedulers.slurm.envs`; not yet over ``-c ssh=``). ``Secrets``: each one an owner-only file
    in the job directory that the replicas' wrapper reads into their environment (:mod:`.secrets`).
    ``NativeDependencies``: ``--after`` apps of the same cluster become ``sbatch --dependency``.
    """

    #: Seconds :meth:`cancel` waits for Slurm to report the job ended (COMPLETING can take KillWait + more).
    cancel_timeout = 120.0

    def __init__(
        self, session_name: str, backend: str = "slurm", queries_: SlurmQueries | None = None
    ) -> None:
        super().__init__(backend, session_name)
        self._queries = queries_
        self._local: LocalHost | None = None
        self._view: SlurmView | None = None

    @property
    def queries(self) -> SlurmQueries:
        """The status batcher of this machine's Slurm (the process-wide one by default)."""
        return self._queries or queries()

    @property
    def local(self) -> LocalHost:
        """This machine as a :class:`~.host.Host`."""
        if self._local is None:
            self._local = LocalHost(self.queries)
        return self._local

    def _host(self, ssh: str | None, options: Sequence[str] | None) -> Host:
        """The host a request or the run options name: a login node (``ssh``), else this machine."""
        return ssh_host.ssh_host(ssh, options or ()) if ssh else self.local

    def where(self, app_id: str) -> Where | None:
        """Where ``app_id`` lives: a job id is this machine's, ``<host slug>-<job id>`` a login node's (from
        this machine's record of it); None for an id of neither kind."""
        if APP_ID.fullmatch(app_id):
            return self.local.where(app_id)
        return ssh_host.where(app_id)

    # -- run options --------------------------------------------------------------------------------------
    def run_opts(self) -> runopts:
        """The sbatch options tsm exposes (declared once, typed, in :class:`SlurmOptions`), and the SSH ones
        (:class:`~tsm.schedulers.slurm.ssh_host.SshOptions`: ``ssh``, ``ssh_options``, ``remote_home``)."""
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
        """Build the batch script for the host the run options name; asks ``sbatch --version`` only when a role
        wants GPUs. Over SSH the job directory is a remote path and the replicas run there (or in their
        workspace's copy on the cluster), with the login node's ``python3`` by default."""
        opts = SlurmOptions.from_cfg(cfg)
        ssh = SshOptions.from_cfg(cfg)
        host = self._host(ssh.ssh, ssh.ssh_options)
        home = host.home(ssh.remote_home)
        if opts.python is None and (python := host.python()) is not None:
            opts = dataclasses.replace(opts, python=python)  # this machine's interpreter means nothing there
        app, env_plans = slurm_envs.apply(app, opts, home, ssh.ssh)  # roles' lockfile environments, built at submit
        workspaces = host.place(app, home)
        job_dir = host.resolve(opts.job_dir) if opts.job_dir else default_job_dir(home, app.name)
        if "%" in job_dir or not directive_safe(job_dir):
            raise InvalidRunOptionError(f"job_dir {job_dir!r} must not hold '%', backslashes or line breaks")
        version = opts.version
        if version is None and any(r.resource.gpu and r.resource.gpu > 0 for r in app.roles):
            version = host.slurm_version()
        submit_dir = host.submit_dir(job_dir)
        record = AppRecord(scheduler="slurm", session=self.session_name, app=app, submit_dir=submit_dir,
                           details={"job_dir": job_dir, **({"ssh": ssh.ssh} if ssh.ssh else {})})  # fmt: skip
        request = SlurmBatchRequest(
            script=build_script(app, opts, job_dir, submit_dir, version),
            job_dir=job_dir,
            app_name=app.name,
            roles=[r.name for r in app.roles],
            app_json=record.to_json(),
            ssh=ssh.ssh,
            ssh_options=parse_ssh_options(ssh.ssh_options) if ssh.ssh else None,
            remote_home=home if ssh.ssh else "",
            workspaces=workspaces or None,
            environments=env_plans or None,
            env_home=home if env_plans else "",
            secrets=slurm_secrets.entries(app),
        )
        return AppDryRunInfo(request=request, fmt=format_request)

    def with_dependencies(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest],
                          after: Sequence[tuple[str, str]]) -> AppDryRunInfo[SlurmBatchRequest] | None:
        """The request held by Slurm until each ``(app id, condition)`` (:func:`.script.dependency_args`); None
        when one is not a job of the request's own host (tsm's helper cannot hold a Slurm job: its id is the
        engine's)."""
        req = dryrun_info.request
        host = self._host(req.ssh, req.ssh_options)
        jobs = []
        for app_id, condition in after:
            where = self.where(app_id)
            if where is None or host.app_id(where.job_id) != app_id:
                return None
            jobs.append((where.job_id, condition))
        held = dataclasses.replace(req, sbatch_args=[*req.sbatch_args, *dependency_args(jobs)])
        return dataclasses.replace(dryrun_info, request=held)

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> str:
        """Submit the request on its host (the job directory made, its script ``sbatch``-ed unchanged); returns
        the app id: the job id, or ``<host slug>-<job id>`` for a login node's (submitted idempotently)."""
        req = dryrun_info.request
        if not isinstance(req, SlurmBatchRequest):
            raise SubmissionError(f"the slurm scheduler cannot submit a {type(req).__name__} request")
        host = self._host(req.ssh, req.ssh_options)
        delivery = slurm_secrets.Delivery.read(req.secrets)  # read now, by this process; never in the request
        slurm_envs.ensure(req.env_home, req.environments)  # once per key, before any job exists
        job_id = host.submit(req, delivery)
        app_id = host.app_id(job_id)
        host.remember(app_id, job_id, req.job_dir)
        host.queries.submitted(job_id)
        return app_id

    # -- sweeps: one job array (SweepNative) ----------------------------------------------------------------
    def accepts_sweep(self, trials: Sequence[AppDryRunInfo[SlurmBatchRequest]]) -> bool:
        """A sweep is one job array when every trial is a single-role job submitted from here (heterogeneous
        jobs cannot be arrays; a login node's trials go through the sweep controller)."""
        return bool(trials) and all(
            isinstance(t.request, SlurmBatchRequest) and t.request.ssh is None and len(t.request.roles) == 1
            for t in trials
        )

    def schedule_sweep(
        self, trials: Sequence[AppDryRunInfo[SlurmBatchRequest]], parallel: int, name: str
    ) -> builtins.list[str]:
        """Submit the trials as one job array ``--array=0-(N-1)%parallel``; their app ids ``<job id>_<i>``
        (:func:`.array.submit_array`: each trial is an ordinary app with a job directory of its own)."""
        if not self.accepts_sweep(trials):
            raise SubmissionError("a Slurm job array takes single-role trials submitted from this machine only")
        from tsm.schedulers.slurm.array import submit_array

        deliveries = [slurm_secrets.Delivery.read(t.request.secrets) for t in trials]
        for t in trials:
            slurm_envs.ensure(t.request.env_home, t.request.environments)
        return submit_array(self.local, [t.request for t in trials], name, parallel, deliveries)

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
            where = self.where(app_id)
            desc = self._describe(where, recs) if where is not None else None
            if desc is None:
                continue
            leader = recs[0] if recs else None
            out[app_id] = TrialState(desc.state, desc.msg, leader.start_time if leader else None,
                                     leader.end_time if leader else None)
        return out

    def cancel_trials(self, app_ids: Sequence[str]) -> None:
        """``scancel`` every trial in one call per host (tasks not started never start), then wait as
        :meth:`cancel` does, for all of them together."""
        by_host: dict[int, tuple[Host, builtins.list[Where]]] = {}
        for app_id in app_ids:
            where = self.where(app_id)
            if where is not None:
                by_host.setdefault(id(where.host), (where.host, []))[1].append(where)
        for host, wheres in by_host.values():
            host.scancel([w.job_id for w in wheres])

        def first_live(pause: float) -> DescribeAppResponse | None:
            # "terminal" once every trial is: the poller waits on one response, so give it the first live one
            for host, wheres in by_host.values():
                records = host.queries.jobs([w.job_id for w in wheres], max_age=min(pause, 1.0))
                for w in wheres:
                    recs = records.get(w.job_id)
                    if recs and not job_state(recs).is_terminal:
                        return self._describe(w, recs)
            return None

        if poll_until_terminal(first_live, self.cancel_timeout, initial=0.2, cap=2.0) is None:
            for _, wheres in by_host.values():
                for w in wheres:
                    if w.job_dir:
                        self._forget_secrets(w, w.job_dir)

    # -- describe -----------------------------------------------------------------------------------------
    def describe(self, app_id: str, max_age: float = 1.0) -> DescribeAppResponse | None:
        """The app's state, per role and replica, from its host's squeue/sacct refined by the job directory.

        ``max_age`` is how old (seconds) a shared squeue answer may be; see :class:`SlurmQueries`.
        """
        where = self.where(app_id)
        if where is None:
            return None
        return self._describe(where, where.host.queries.job(where.job_id, max_age=max_age))

    def _describe(self, where: Where, recs: list[SlurmJob] | None) -> DescribeAppResponse | None:
        where.host.requeue_stranded(where, recs)
        where.host.sync([where])
        desc = describe_records(where.job_id, recs, *where.host.job_files(where, recs))
        if desc is not None:
            desc.app_id = where.app_id
        return desc

    def view_snapshot(self, app_ids: Sequence[str]) -> builtins.list[AppView]:
        """The views' batch hook (:class:`tsm.schedulers.api.BatchedViews`): every app of ``app_ids`` from one
        ``squeue`` per host, one ``sacct`` only for jobs the controller forgot, and one ``sstat`` for the usage
        of the running ones; see :mod:`tsm.schedulers.slurm.view`."""
        if self._view is None:
            from tsm.schedulers.slurm.view import SlurmView

            self._view = SlurmView(self.where, self.backend)
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

    def list(self) -> builtins.list[ListAppResponse]:
        """This user's jobs here (those ``squeue`` shows and those ``sacct`` recorded in the last 7 days, asked at
        once), and the apps this machine submitted to login nodes (one ``squeue``, at most one ``sacct``, per
        host; a host that does not answer lists its apps as UNKNOWN)."""
        me = _user_name()
        found: dict[str, list[SlurmJob] | None] = {
            app_id: recs for app_id, recs in self.queries.listing().items()  # root's sacct shows every user's
            if not (me and recs and recs[0].user and recs[0].user != me)
        }
        for host, wheres in ssh_host.recorded():
            try:
                jobs = host.queries.jobs([w.job_id for w in wheres])
            except SshError:
                jobs = {}
            found.update((w.app_id, jobs.get(w.job_id)) for w in wheres)
        out = []
        for app_id, recs in found.items():
            leader = recs[0] if recs else None
            name = leader.name if leader else ""
            out.append(ListAppResponse(
                app_id=app_id, state=job_state(recs) if recs else AppState.UNKNOWN,
                app_handle=f"{self.backend}://{self.session_name}/{app_id}",
                name=name.rsplit(".", 1)[0] if "." in name else name,
                created=leader.submit_time if leader else None,
            ))  # fmt: skip
        out.sort(key=lambda r: (r.created or 0, id_key(r.app_id)), reverse=True)
        return out

    # -- cancel and remove ----------------------------------------------------------------------------------
    def cancel(self, app_id: str) -> None:
        """``scancel`` the job (every role) on its host and return once Slurm reports it ended (or
        :attr:`cancel_timeout` seconds passed); cancelling an ended or unknown job is not an error.

        Waiting matters: right after ``scancel`` the job is still RUNNING/COMPLETING while its steps are
        killed, and ``tsm cancel`` (or Ctrl-C of an attached run) prints the state that follows the cancel.
        """
        where = self.where(app_id)
        if where is None:
            return
        job_dir = where.job_dir or self._job_dir_there(where)
        marked = self._warn_before_cancel(where, job_dir)
        try:
            where.host.scancel([where.job_id])
        except BaseException:
            if marked and job_dir:  # the job runs on: its next warning is not this cancel's
                where.host.unmark(job_dir)
            raise
        last = poll_until_terminal(lambda pause: self.describe(app_id, max_age=0.0), self.cancel_timeout,
                                   initial=0.2, cap=2.0)  # fmt: skip
        if job_dir and (last is None or last.state.is_terminal):
            self._forget_secrets(where, job_dir)

    def _forget_secrets(self, where: Where, job_dir: str) -> None:
        """Remove the secrets' files of an app that has ended for good (a cancelled job's batch script is killed
        before it can), when it declares any."""
        app = self._files(where)[1]
        if app is not None and any(role.secrets for role in app.roles):
            where.host.forget_secrets(job_dir)

    def job_dir(self, app_id: str) -> Path | None:
        """Where this machine reads the app's job directory: the directory, or the copy of a login node's."""
        where = self.where(app_id)
        found = self._files(where)[0] if where is not None else None
        return found.path if found is not None else None

    def _files(self, where: Where) -> tuple[JobDir | None, AppDef | None]:
        """:meth:`job_files` of an app, asking Slurm for its records only when nothing here leads to them."""
        found = where.host.job_files(where, None)
        return found if found[0] is not None else where.host.job_files(where, where.host.queries.job(where.job_id))

    def _job_dir_there(self, where: Where) -> str | None:
        """The job directory's path on the app's host, found through this machine's copy of it."""
        job_dir, _ = self._files(where)
        return str(job_dir.path) if job_dir is not None else None

    def _warn_before_cancel(self, where: Where, job_dir: str | None) -> bool:
        """When the app asked for a warning (``warn_signal``) and runs: warn every task, then wait up to
        ``warn_before`` (less once the job has ended) before the ``scancel``. True when the warning was sent.

        The warning goes to the batch shell (``scancel --batch --signal``), which forwards it once to every
        task as it does before a time limit; the cancel mark (:data:`~.jobdir.CANCEL_MARK`) in the job
        directory tells it this is a cancel, so it never requeues the job for ``requeue_on_time_limit``. The
        mark is removed again when no cancel follows it (the warning could not be sent, or this is
        interrupted), and by the batch script as each attempt starts: a stale one would make a later time
        limit's warning a cancel's.
        """
        script = decode(where.host.read(f"{job_dir}/job.sbatch")) if job_dir else ""
        warning = warning_of(script) if script else None
        if job_dir is None or warning is None:
            return False
        desc = self.describe(where.app_id, max_age=0.0)
        if desc is None or desc.state != AppState.RUNNING:
            return False  # pending or ended: there is no task to warn
        sig, lead = warning
        try:
            if not where.host.warn(job_dir, where.job_id, sig):
                return False  # ended meanwhile (or no mark could be written): the scancel that follows says the rest
            poll_until_terminal(lambda pause: self.describe(where.app_id, max_age=0.0), float(lead), initial=0.2,
                                cap=1.0)  # fmt: skip
        except BaseException:  # the connection lost after the mark was written, or Ctrl-C: no cancel follows
            where.host.unmark(job_dir)
            raise
        return True

    def remove(self, app_id: str) -> bool:
        """Delete the files tsm wrote for an ended app (its job directory, and this machine's record of it).

        Only the files tsm and Slurm write there are deleted, and then the directories if that leaves
        them empty, so a ``job_dir`` that held other files keeps them. Slurm's own records stay.
        """
        where = self.where(app_id)
        if where is None:
            return False
        local, app = self._files(where)
        job_dir = where.job_dir or (str(local.path) if local is not None else None)
        where.host.records.forget(app_id)
        removed = where.host.remove(job_dir, [r.name for r in app.roles] if app else []) if job_dir else False
        had_record = where.job_dir is not None
        where.host.forget(where)
        return removed or had_record

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
        """Lines of replica ``k`` of ``role_name`` from its files in the job directory, read on its host.

        Slurm keeps stdout and stderr in separate files without timestamps: ``Stream.COMBINED`` (the default)
        is stdout's lines, then stderr's (while following, lines come as they appear in either), and
        ``since``/``until`` select whole files (a file last written before ``since``, or a replica started
        after ``until``, gives no lines). ``should_tail`` follows the files until the replica has exited for
        good (no retry left) or the job has ended; over SSH a follow resumes from its byte offset after a
        dropped connection.
        """
        where = self.where(app_id)
        if where is not None:
            where.host.sync([where])
        local, app = self._files(where) if where is not None else (None, None)
        if where is None or local is None:
            raise UnknownAppError(
                f"no job directory found for slurm app '{app_id}' (not submitted by tsm, or its files are gone)"
            )
        check_replica(app_id, role_replicas(app), role_name, k)
        assert app is not None  # check_replica refused an app without roles
        role = next(r for r in app.roles if r.name == role_name)
        there = where.job_dir or str(local.path)
        paths = [f"{there}/{role_name}/{k}.{name}" for name in stream_names(streams)]
        if since is not None or until is not None:
            paths = _in_window(paths, where.host.mtimes(paths), local, role_name, k, since, until)
        if not should_tail:
            return filter_regex(regex, (line for p in paths for line in split_lines(decode(where.host.read(p)))))
        return filter_regex(regex, follow([where.host.reader(p) for p in paths], self._ended(where, role, local, k)))

    @staticmethod
    def _ended(where: Where, role: Role, local: JobDir, k: int) -> Callable[[], bool]:
        """A callable that is True once the replica is done for good (no retry left) or the job has ended."""
        last_check = [0.0]

        def ended() -> bool:
            f = local.status(role.name, k)
            if f is not None and not f.running and (f.exit_code == 0 or f.attempt >= role.max_retries):
                return True
            now = time.monotonic()
            if now - last_check[0] < 2.0:
                return False
            last_check[0] = now
            with contextlib.suppress(Exception):  # a dropped connection: the readers retry on their own
                where.host.sync([where])
            recs = where.host.queries.job(where.job_id, max_age=2.0)
            return recs is None or bool(recs) and job_state(recs).is_terminal

        return ended



def _user_name() -> str:
    """This process's user name, as Slurm reports job owners ("" when it cannot be told)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "")


def _in_window(paths: builtins.list[str], mtimes: dict[str, float], local: JobDir, role: str, k: int,
               since: datetime | None, until: datetime | None) -> builtins.list[str]:
    """Whole-file time filter (Slurm's log lines carry no time of their own): files written since ``since``,
    of a replica that started before ``until``."""
    if since is not None:
        paths = [p for p in paths if mtimes.get(p) is None or mtimes[p] >= since.timestamp()]
    f = local.status(role, k) if until is not None else None
    if until is not None and f is not None and f.started is not None and f.started > until.timestamp():
        return []
    return paths
