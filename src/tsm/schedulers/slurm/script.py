"""The request: an AppDef and its run options as the batch script ``sbatch`` receives, unchanged.

Pure: :func:`build_script` runs nothing and reads no file but the package's programs, so a dry run prints
exactly what is submitted. The run options are declared once, typed, in :class:`SlurmOptions` (the long-run
ones come from :mod:`tsm.schedulers.common.lifecycle_opts`). The script is its ``#SBATCH`` lines, a few
generated lines of parameters and per-role ``srun`` lines, and the texts of ``programs/longrun.sh`` (the
attempt's bookkeeping, the preemption budget, keeping the job off failed nodes, the warning) and
``programs/wait.sh`` (the wait loop); each task runs ``programs/replica.sh``. Every value of the app is
quoted once, as a single shell word; docs/schedulers/slurm.md describes the result.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from tsm.env.options import EnvOptions
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.common.durations import format_duration
from tsm.schedulers.common.interpreter import replica_python
from tsm.schedulers.common.lifecycle_opts import LifecycleOptions
from tsm.schedulers.common.options import option
from tsm.schedulers.common.quoting import shell_quote
from tsm.schedulers.common.stall import QUOTE_MAX, stall_message, tick
from tsm.schedulers.slurm import programs, secrets as slurm_secrets
from tsm.schedulers.slurm.cli import parse_version
from tsm.schedulers.slurm.jobdir import CANCEL_MARK
from tsm.specs.api import AppDef, Role, is_null_resource, macros

#: First Slurm version whose GPU request is ``--gpus-per-task`` (before it: ``--gpus-per-node``).
GPUS_PER_TASK_SINCE = (23, 2)

_FORBIDDEN_IN_DIRECTIVE = re.compile(r"[\\\n\r\x00]")

#: The most seconds ahead of the time limit ``sbatch --signal=...@N`` accepts.
MAX_SIGNAL_LEAD = 65535


def slurm_time(seconds: float) -> str:
    """``seconds`` as ``sbatch --time`` takes it: whole minutes, rounded up (Slurm keeps limits in minutes)."""
    return str(max(1, math.ceil(seconds / 60)))


def directive_safe(text: str) -> bool:
    """True when ``text`` can be an ``#SBATCH`` value: no backslash, line break or NUL."""
    return not _FORBIDDEN_IN_DIRECTIVE.search(text)


@dataclass(frozen=True)
class SlurmOptions(LifecycleOptions, EnvOptions):
    """The sbatch options tsm exposes, each applied to every role unless said otherwise.

    The long-run options (``time_limit``, ``warn_signal``, ...) come from :class:`LifecycleOptions`, the
    environment options (``environment``, ``find_links``, ...) from :class:`~tsm.env.options.EnvOptions`.
    """

    partition: str | None = option("partition (queue) to submit to; default: the cluster's default partition")
    time: str | None = option("time limit per job, as sbatch --time takes it: minutes, HH:MM:SS or D-HH:MM")
    account: str | None = option("account to charge (sbatch --account)")
    qos: str | None = option("quality of service (sbatch --qos)")
    constraint: str | None = option("node features required (sbatch --constraint), e.g. 'a100&ib'")
    reservation: str | None = option("reservation to run in (sbatch --reservation)")
    nodelist: str | None = option("nodes each role's allocation must include (sbatch --nodelist)")
    exclude: str | None = option("nodes never to use (sbatch --exclude), e.g. node[3-4]")
    exclusive: bool = option("take whole nodes, sharing them with no other job (sbatch --exclusive)", False)
    comment: str | None = option("free-text comment stored with the job (sbatch --comment)")
    mail_user: str | None = option("where Slurm mails job events (sbatch --mail-user)")
    mail_type: str | None = option("which events to mail: BEGIN, END, FAIL, ALL, ... (sbatch --mail-type)")
    requeue: bool | None = option(
        "let Slurm requeue the job after a node failure or preemption (--requeue/--no-requeue); "
        "default: on when a role has max_retries or max_preemptions > 0, else the cluster's setting"
    )
    pack_replicas: bool = option(
        "run a role's replicas as tasks Slurm may pack onto shared nodes (--ntasks=N) instead of one "
        "node per replica (--nodes=N --ntasks-per-node=1)",
        False,
    )
    job_dir: str | None = option(
        "directory for the job's script, logs and status (made 0700; must be shared with the compute "
        "nodes); default $TSM_HOME/slurm/jobs/<app>-<time>-<random>"
    )
    kill_grace: int = option("seconds the other roles get between SIGTERM and SIGKILL after a role fails", 30)
    sbatch_args: list[str] | None = option(
        "extra sbatch options for the whole job, e.g. --signal=USR1@60,--nice=10"
    )
    srun_args: list[str] | None = option("extra srun options for every role, e.g. --cpu-bind=cores")
    slurm_version: str | None = option(
        "assume this Slurm version (e.g. 23.02) instead of asking sbatch --version; decides the GPU option"
    )
    python: str | None = option(
        "the python replicas run (an interpreter, its bin directory or an environment's root); default: the "
        "activated environment's, else the one running tsm (a role's env TSM_PYTHON wins)"
    )

    def check(self) -> None:
        """Refuse values sbatch cannot read (backslashes, line breaks, '%' in job_dir) before anything is built."""
        if self.job_dir is not None and (
            not self.job_dir or "%" in self.job_dir or not directive_safe(self.job_dir)
        ):
            raise InvalidRunOptionError(
                f"job_dir {self.job_dir!r} must be a non-empty path without '%', backslashes or line breaks"
            )
        if self.slurm_version is not None and not re.search(r"\d+\.\d+", self.slurm_version):
            raise InvalidRunOptionError(
                f"slurm_version {self.slurm_version!r} is not a Slurm version such as 22.05 or 23.11"
            )
        if self.kill_grace < 0:
            raise InvalidRunOptionError(f"kill_grace must be >= 0, got {self.kill_grace}")
        super().check()
        if self.time and self.time_limit:
            raise InvalidRunOptionError(
                f"give one of time={self.time!r} and time_limit={self.time_limit!r} (both are sbatch --time)"
            )
        if self.warn_before_s > MAX_SIGNAL_LEAD:
            raise InvalidRunOptionError(
                f"run option warn_before={self.warn_before!r} is longer than Slurm's --signal takes "
                f"({MAX_SIGNAL_LEAD} seconds)"
            )
        for extra in self.sbatch_args or []:
            _raw_directive(extra)

    @property
    def version(self) -> tuple[int, int] | None:
        """``slurm_version`` as ``(major, minor)``, when given."""
        return parse_version(self.slurm_version) if self.slurm_version else None


@dataclass
class SlurmBatchRequest:
    """What :meth:`SlurmScheduler.schedule` submits: the batch script and where the job's files go.

    ``script`` is passed to ``sbatch`` unchanged (saved as ``job_dir/job.sbatch``); ``app_json`` is saved as
    ``job_dir/app.json``; ``roles`` are the role names in het-group order. ``ssh`` names the host it goes to
    (:mod:`.host`).
    """

    script: str
    job_dir: str
    app_name: str
    roles: list[str]
    app_json: str
    sbatch_args: list[str] = field(default_factory=lambda: ["--parsable"])
    #: the login node it is submitted on (``-c ssh=[user@]host[:port]``, with ``ssh_options``); None: here
    ssh: str | None = None
    ssh_options: list[str] | None = None
    #: over SSH: tsm's directory on the cluster and the local workspace snapshots to ship there first
    remote_home: str = ""
    workspaces: list[str] | None = None
    #: each role's lockfile environment (:meth:`tsm.env.spec.EnvPlan.to_dict`), built at submit into
    #: ``env_home``/envs (:mod:`tsm.schedulers.slurm.envs`); None when no role has one
    environments: dict[str, dict[str, object]] | None = None
    env_home: str = ""
    #: every secret the roles declare (``str`` of each :class:`~tsm.specs.secrets.SecretRef`: a name and where
    #: its value is read, never the value), read at submit (:mod:`.secrets`); None when there is none
    secrets: list[str] | None = None

    def __str__(self) -> str:
        return self.script


def format_request(request: object) -> str:
    """How a dry run prints a Slurm request: the script itself (after each role's environment and the secrets'
    sources, if any; never a value)."""
    if not isinstance(request, SlurmBatchRequest):
        return repr(request)
    lines = []
    if request.environments:
        from tsm.schedulers.slurm import envs

        lines += envs.lines(request.env_home, request.environments)
    if request.secrets:
        lines.append(f"# secrets (read at submit, each an owner-only file of the job directory): "
                     f"{', '.join(request.secrets)}")
    extra = [a for a in request.sbatch_args if a != "--parsable"]
    if extra:
        lines.append(f"# sbatch {' '.join(extra)}")
    return "\n".join([*lines, request.script])


#: ``--after``'s conditions in Slurm's words.
DEPENDENCY_TYPES = {"ok": "afterok", "any": "afterany", "fail": "afternotok"}


def dependency_args(after: Sequence[tuple[str, str]]) -> list[str]:
    """``sbatch`` arguments holding a job until each ``(job id, condition)``: all of them must be met, and one
    that never can be ends the job (CANCELLED, with Slurm's reason) instead of leaving it pending for good."""
    by_type: dict[str, list[str]] = {}
    for job_id, condition in after:
        by_type.setdefault(DEPENDENCY_TYPES[condition], []).append(job_id)
    spec = ",".join(f"{kind}:{':'.join(ids)}" for kind, ids in by_type.items())
    return [f"--dependency={spec}", "--kill-on-invalid-dep=yes"]


def directive(option: str, value: str | int | None = None) -> str:
    """One ``#SBATCH`` line, its value shell-quoted (sbatch reads the same quotes; no backslash or newline)."""
    if value is None:
        return f"#SBATCH {option}"
    text = str(value)
    if _FORBIDDEN_IN_DIRECTIVE.search(text):
        raise InvalidRunOptionError(
            f"{option} value {text!r} holds a backslash or a line break, which sbatch cannot read in a script"
        )
    return f"#SBATCH {option}={shlex.quote(text)}"


#: The env variable naming the directory of the python a role's replicas run (put first on their PATH by
#: the wrapper; see :mod:`tsm.schedulers.common.interpreter`).
PYTHON_BIN_ENV = "TSM_PYTHON_BIN"

#: The fixed program every task runs (``programs/replica.sh``: bash -c "$_tsm_replica" tsm-replica ROLE N NENV
#: K=V... CMD...). It never contains a value of the app: those arrive as positional parameters.
REPLICA_WRAPPER = programs.text("replica.sh")



def _role_cwd(role: Role, submit_dir: str) -> str:
    """Where a role's replicas run: its image when that is a directory path, else the submit directory."""
    image = role.image
    if image and (image.startswith(("/", "./", "../", "~")) or image in (".", "..")):
        return os.path.abspath(os.path.expanduser(image))
    return submit_dir


def build_script(
    app: AppDef,
    opts: SlurmOptions,
    job_dir: str,
    submit_dir: str,
    version: tuple[int, int] | None,
) -> str:
    """The complete sbatch script for ``app``: its ``#SBATCH`` lines (one het-job component per role), then
    the body: the job's variables, the long-run part, one background ``srun`` per role running the replicas'
    wrapper, the stall watcher when asked for, and the wait loop (docs/schedulers/slurm.md draws the shape).

    ``version`` is the Slurm version that decides the GPU option; it may be None when no role wants GPUs.
    """
    warn = _warn_name(opts)
    lines = ["#!/bin/bash", *_job_directives(app, opts, job_dir, warn)]
    for i, role in enumerate(app.roles):
        if i > 0:
            lines += ["#SBATCH hetjob", directive("--job-name", f"{app.name}.{role.name}")]
        lines += _role_directives(role, opts, version)
    lines += _preamble(app, opts, job_dir, warn)
    for i, role in enumerate(app.roles):
        lines += _role_launch(app, i, role, opts, job_dir, submit_dir)
    lines += _stall_lines(app, opts)
    lines.append(programs.text("wait.sh").rstrip("\n"))
    return "\n".join(lines) + "\n"


def _job_directives(app: AppDef, opts: SlurmOptions, job_dir: str, warn: str | None) -> list[str]:
    """The ``#SBATCH`` lines of the whole job (they lead the first component)."""
    out = [
        directive("--job-name", f"{app.name}.{app.roles[0].name}"),
        directive("--chdir", job_dir),
        directive("--output", f"{job_dir}/batch.out"),
        directive("--open-mode", "append"),
        directive("--export", "ALL"),
    ]
    retries = any(r.max_retries > 0 for r in app.roles)
    if opts.requeue is True or retries or (opts.requeue is None and opts.max_preemptions > 0):
        out.append(directive("--requeue"))
    elif opts.requeue is False:
        out.append(directive("--no-requeue"))
    for opt, text in (("--comment", opts.comment), ("--mail-user", opts.mail_user), ("--mail-type", opts.mail_type)):
        if text:
            out.append(directive(opt, text))
    if warn is not None:
        # also without a time limit: a cluster with SlurmctldParameters=preempt_send_user_signal sends it at
        # preemption (then GraceTime before SIGTERM), and tsm cancel sends it to the batch shell too
        out.append(directive("--signal", f"B:{warn}@{round(opts.warn_before_s)}"))
    out += [_raw_directive(extra) for extra in opts.sbatch_args or []]
    return out


def _role_directives(role: Role, opts: SlurmOptions, version: tuple[int, int] | None) -> list[str]:
    """The ``#SBATCH`` lines of a role's component: its size, where it may run, its time limit."""
    res, n, pack = role.resource, role.num_replicas, opts.pack_replicas
    out = [directive("--ntasks", n)] if pack else [directive("--nodes", n), directive("--ntasks-per-node", 1)]
    sized = not is_null_resource(res)  # no resource given: no size directives, the partition's defaults
    cpus = _whole(res.cpu)
    if sized:
        out.append(directive("--cpus-per-task", cpus))
    if sized and res.memMB and res.memMB > 0:  # rounded up: "--mem=0" would mean all of a node's memory
        if pack:
            out.append(directive("--mem-per-cpu", f"{-(-math.ceil(res.memMB) // cpus)}M"))
        else:
            out.append(directive("--mem", f"{math.ceil(res.memMB)}M"))
    if sized and res.gpu and res.gpu > 0:
        per_task = pack or version is None or version >= GPUS_PER_TASK_SINCE
        out.append(directive("--gpus-per-task" if per_task else "--gpus-per-node", int(res.gpu)))
    caps = res.capabilities or {}
    limit = opts.time_limit_s
    exclude = ",".join([*([opts.exclude] if opts.exclude else []), *(opts.exclude_nodes or [])])
    for opt, value in (
        ("--partition", caps.get("partition") or opts.partition),
        ("--time", opts.time or (slurm_time(limit) if limit is not None else None)),
        ("--account", opts.account),
        ("--qos", opts.qos),
        ("--constraint", caps.get("constraint") or opts.constraint),
        ("--reservation", opts.reservation),
        ("--nodelist", opts.nodelist),
        ("--exclude", exclude),
    ):
        if value:
            out.append(directive(opt, str(value)))
    if opts.exclusive:
        out.append(directive("--exclusive"))
    return out


def _preamble(app: AppDef, opts: SlurmOptions, job_dir: str, warn: str | None) -> list[str]:
    """The body up to the sruns: the job's variables, the long-run part, the first node's address, the
    replicas' wrapper."""
    q = shlex.quote
    roles_desc = ", ".join(f"{r.name} x{r.num_replicas}" for r in app.roles)
    torchx = any("TORCHX_JOB_ID" in r.env for r in app.roles)
    return [
        "",
        f"# tsm app {app.name}: {roles_desc}. The job directory holds app.json, logs and replica status.",
        "umask 077",
        *_early_lines(job_dir, warn),
        f"export TSM_JOB_DIR={q(job_dir)}",
        'export TSM_APP_ID="$SLURM_JOB_ID"',
        f"export TSM_KILL_GRACE={opts.kill_grace}",
        'echo "${SLURM_RESTART_COUNT:-0}" >"$TSM_JOB_DIR/restarts"',
        'rm -f -- "$TSM_JOB_DIR/exit"',
        *_longrun_lines(opts, warn, len(app.roles), sum(int(r.max_retries) for r in app.roles)),
        "# The first node of the first role, by a name that resolves (else by its address).",
        '_tsm_nodes="${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"',
        'TSM_RANK0_HOST=$(scontrol show hostnames "$_tsm_nodes" | head -n 1)',
        'if ! getent hosts "$TSM_RANK0_HOST" >/dev/null 2>&1; then',
        '  _tsm_addr=$(scontrol show node "$TSM_RANK0_HOST" 2>/dev/null | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p" | head -n 1)',
        '  [ -n "$_tsm_addr" ] && TSM_RANK0_HOST=$_tsm_addr',
        "fi",
        "export TSM_RANK0_HOST",
        *(['export TORCHX_RANK0_HOST="$TSM_RANK0_HOST"'] if torchx else []),
        f"_tsm_replica={q(REPLICA_WRAPPER)}",
        "declare -a _tsm_pid _tsm_rc _tsm_role _tsm_retries",
    ]


def _role_launch(app: AppDef, i: int, role: Role, opts: SlurmOptions, job_dir: str, submit_dir: str) -> list[str]:
    """Role ``i``'s lines of the body: its ``srun`` of the replicas' wrapper, in the background."""
    q = shlex.quote
    values = macros.Values(
        img_root=_role_cwd(role, submit_dir),
        app_id=macros.app_id,  # run time: the wrapper substitutes $SLURM_JOB_ID
        replica_id=macros.replica_id,  # run time: the wrapper substitutes the task's rank
    )
    r = values.apply(role)
    n = r.num_replicas
    sized = not is_null_resource(r.resource)
    srun = ["srun", *([f"--het-group={i}"] if len(app.roles) > 1 else []), f"--ntasks={n}"]
    if not opts.pack_replicas:
        srun += [f"--nodes={n}", "--ntasks-per-node=1"]
    if sized:
        srun.append(f"--cpus-per-task={_whole(r.resource.cpu)}")
    srun += [
        f"--job-name={app.name}.{r.name}",
        f"--chdir={values.img_root}",
        f"--output={job_dir}/{r.name}/%t.stdout",
        f"--error={job_dir}/{r.name}/%t.stderr",
        "--open-mode=append",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        *(opts.srun_args or []),
    ]
    python = replica_python(r.env, opts.python)
    env = dict(r.env)
    if "PATH" not in env:
        # the wrapper puts the chosen interpreter's directory first on the PATH the job kept (--export=ALL);
        # a role that sets PATH gets exactly its own
        env[PYTHON_BIN_ENV] = python.bin_dir
    env_pairs = [f"{k}={v}" for k, v in env.items()]
    argv = [*srun, "bash", "-c", "$_tsm_replica", "tsm-replica", r.name, str(n), str(len(env_pairs))]
    argv += [*env_pairs, r.entrypoint, *r.args]
    quoted = " ".join('"$_tsm_replica"' if a == "$_tsm_replica" else shell_quote(a) for a in argv)
    secrets = slurm_secrets.role_names(role)
    quoted = slurm_secrets.launch_prefix(secrets) + quoted
    return [
        f"# role {i}: {r.name}, {n} replica(s)"
        + ("" if sized else "; no resource given: the partition's default CPUs and memory per task apply"),
        f"# python: {python.describe()}" + ("" if "PATH" not in r.env else "; the role sets PATH itself"),
        *([slurm_secrets.comment(secrets)] if secrets else []),
        f'mkdir -p -- "$TSM_JOB_DIR"/{q(r.name)}',
        f"_tsm_role[{i}]={_string(r.name)}",
        f"_tsm_retries[{i}]={int(r.max_retries)}",
        f"{quoted} &",
        f"_tsm_pid[{i}]=$!",
    ]


def _stall_lines(app: AppDef, opts: SlurmOptions) -> list[str]:
    """With ``stall_timeout``: start the stall watcher (``programs/stall_watch.py``) beside the sruns."""
    stall = opts.stall_timeout_s
    if stall is None:
        return []
    q = shlex.quote
    watcher = replica_python(app.roles[0].env, opts.python).path
    every = tick(stall)
    watched = [f"{r.name}:{r.num_replicas}" for r in app.roles]
    with_line, silent = _stall_texts(stall)
    return [
        f"# stall_timeout={format_duration(stall)}: one look per {every:g}s at every replica's log sizes and, on "
        "this node, CPU time",
        f"_tsm_watcher={q(programs.bundle('stall_watch.py'))}",
        " ".join([shell_quote(watcher), "-I", "-c", '"$_tsm_watcher"', '"$TSM_JOB_DIR"', '"$TSM_ATTEMPT"',
                  f"{stall:g}", f"{every:g}", str(QUOTE_MAX), q(with_line), q(silent),
                  *map(q, watched)]) + " &",
        "_tsm_watch=$!",
    ]


def relay_signal(warn: str) -> str:
    """The signal the batch shell sends every task's processes for a warning ``warn``: one they ignore by default.

    ``scancel --signal`` reaches every process of every step, a launcher over the program (``torchrun``,
    ``sh -c``) included, and USR1's default action ends a process. URG's (WINCH's when the warning is URG
    itself) is to ignore it; each task's wrapper (:data:`REPLICA_WRAPPER`) passes it on as ``warn`` to its
    processes that handle ``warn``, the rule of :mod:`tsm.schedulers.common.warn` on every backend.
    """
    return "WINCH" if warn == "URG" else "URG"


def _warn_name(opts: SlurmOptions) -> str | None:
    """The signal the batch shell gets before the end (``--signal=B:<SIG>``), or None.

    The app's ``warn_signal`` whenever it asked for one (before a time limit, a preemption or a cancel);
    else ``USR1`` when only ``requeue_on_time_limit`` needs to hear of the time limit.
    """
    sig = opts.warn_signum
    if sig is not None:
        return sig.name.removeprefix("SIG")
    return "USR1" if opts.requeue_on_time_limit and opts.time_limit_s is not None else None




def warning_of(script: str) -> tuple[str, int] | None:
    """The warning an app's batch script asked for (the app's ``warn_signal``) and ``warn_before`` in seconds.

    Read from the saved ``job.sbatch`` (:func:`build_script` writes both lines), so ``cancel`` needs no other
    record of the run options. None when the app asked for no warning (a bare requeue signal is not one).
    """
    sig = re.search(r"^export TSM_WARN_SIGNAL=([A-Z0-9]+)$", script, re.M)
    lead = re.search(r"^#SBATCH --signal=B:([A-Z0-9]+)@(\d+)$", script, re.M)
    if sig is None or lead is None or lead.group(1) != sig.group(1):
        return None
    return sig.group(1), int(lead.group(2))


def _early_lines(job_dir: str, warn: str | None) -> list[str]:
    """The batch script's first commands (after ``umask``), before anything that may take time (``sacct``,
    ``scontrol``).

    Each attempt starts without a :data:`CANCEL_MARK`: one left by a ``tsm cancel`` whose ``scancel`` never
    came (it failed, or tsm was stopped) must not make a later warning a cancel's. Then the warning signal
    is trapped at once: a signal bash does not trap ends it, so a cancel, a preemption or a time limit
    (``warn_before`` longer than ``time_limit`` warns at the start) arriving before the full handler of
    ``programs/longrun.sh`` is set would kill the batch shell. It is only noted; the full handler, set
    before the tasks start, acts on it then (telling its cause apart and, for a time limit, starting the
    requeue timer); the tasks, started after it, are not sent it.
    """
    lines = [f"rm -f -- {shlex.quote(job_dir)}/{CANCEL_MARK}  # a mark of an earlier attempt's cancel is stale"]
    if warn is not None:
        lines.insert(0, f"_tsm_early= ; trap _tsm_early=1 {warn}  # first: an untrapped {warn} ends this shell")
    return lines


def _longrun_lines(opts: SlurmOptions, warn: str | None, roles: int = 1, retries: int = 0) -> list[str]:
    """The script's long-run part: its parameters, then ``programs/longrun.sh`` (the attempt's variables, the
    preemption budget, keeping the job off failed nodes, the warning's handler, the stall handler).

    ``warn`` is the ``--signal`` the batch shell gets (:func:`_warn_name`); it is forwarded to every task
    only when it is the app's ``warn_signal``.
    """
    q = shlex.quote
    forward = opts.warn_signum is not None and warn is not None
    params = {
        "_tsm_budget": int(opts.max_preemptions),
        "_tsm_moves_cap": max_moves(opts, retries),
        "_tsm_exclude": ",".join([*([opts.exclude] if opts.exclude else []), *(opts.exclude_nodes or [])]),
        "_tsm_components": roles,
        "_tsm_warn": warn or "",
        "_tsm_forward": "1" if forward else "",
        "_tsm_requeue_at_limit": "1" if opts.requeue_on_time_limit else "",
        "_tsm_limit_lead": max(0, round(opts.warn_before_s) - 5),
        "_tsm_stall_lead": round(opts.warn_before_s),
        "_tsm_stall_policy": opts.on_stall,
    }
    lines = ["# Long runs: the parameters of programs/longrun.sh, then its text."]
    words = [f"{k}={q(str(v))}" for k, v in params.items()]
    lines += [" ".join(words[:4]), " ".join(words[4:])]
    if forward and warn is not None:
        lines += [f"export TSM_WARN_SIGNAL={warn}", f"export TSM_WARN_RELAY={relay_signal(warn)}"]
    return [*lines, programs.text("longrun.sh").rstrip("\n")]


def _stall_texts(timeout: float) -> tuple[str, str]:
    """What the stall watcher writes, from the shared :func:`~tsm.schedulers.common.stall.stall_message`: the
    prefix its quoted last line follows (``stalled for 15m, last line: ``) and the whole message of a replica
    that wrote nothing. The watcher runs in the replica's python, which need not import tsm, so it gets
    them as arguments and adds ``repr(line[:QUOTE_MAX])``: the message is the shared one, character for
    character."""
    sample = "-"
    with_line = stall_message(timeout, sample)
    quoted = repr(sample[:QUOTE_MAX])
    if not with_line.endswith(quoted):  # the shared message no longer ends with the quoted line
        raise AssertionError(f"stall_message() changed shape: {with_line!r}")
    return with_line[: -len(quoted)], stall_message(timeout, "")




def max_moves(opts: SlurmOptions, retries: int = 0) -> int:
    """How many times the script may move the job off failed nodes (see ``programs/longrun.sh``).

    A move follows a node failure, which spends a preemption, or an OOM kill on a shared node, which is a
    failure and spends a retry (``retries``: the roles' ``max_retries`` together); once its exclusion holds
    the job is never given that node again, so one move per restart those budgets allow (at least one) is
    all a run can need. More means Slurm does not keep the exclusion, and another requeue would only repeat
    the last one.
    """
    return max(1, int(opts.max_preemptions) + retries)


def _string(text: str) -> str:
    """``text`` as one single-quoted shell word, even when it needs no quotes (a role named ``ps`` is a name)."""
    quoted = shlex.quote(text)
    return quoted if quoted.startswith("'") else f"'{text}'"


def _whole(cpu: float) -> int:
    """CPUs per task: at least one, and never fewer than asked for (2.5 is 3)."""
    return max(1, math.ceil(cpu))


def _raw_directive(option: str) -> str:
    """An extra ``#SBATCH`` option given verbatim (``--signal=USR1@60``), quoted as one word."""
    if not option.startswith("-"):
        raise InvalidRunOptionError(f"sbatch_args entry {option!r} must be an option starting with '-'")
    if _FORBIDDEN_IN_DIRECTIVE.search(option):
        raise InvalidRunOptionError(f"sbatch_args entry {option!r} holds a backslash or a line break")
    return f"#SBATCH {shlex.quote(option)}"
