"""The request: an AppDef and its run options as the batch script ``sbatch`` receives, unchanged.

Pure: :func:`build_script` runs nothing and reads no file, so a dry run prints exactly what is submitted
(the package docstring, :mod:`tsm.schedulers.slurm`, describes the script's shape). The run options are
declared once, typed, in :class:`SlurmOptions`.

Long runs (issue 25, the shared options of :mod:`tsm.schedulers.common.lifecycle_opts`): ``time_limit`` is
``--time`` (whole minutes, Slurm's unit); a warning is ``--signal=B:<SIG>@<warn_before>`` to the batch shell,
which forwards it to every task of every step (``scancel --signal``) and, with ``requeue_on_time_limit``,
requeues the job before the limit; ``exclude_nodes`` joins ``--exclude``. The script counts its own failure
requeues in ``job_dir/failures``: every other restart is the cluster's (a preemption, a lost node), spends
``max_preemptions`` and never ``max_retries``; each attempt gets ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT`` and
``TSM_LAST_EXIT`` (also written to ``job_dir/last_exit`` for ``describe``).
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field

from tsm.errors import InvalidRunOptionError
from tsm.schedulers.common.interpreter import replica_python
from tsm.schedulers.common.lifecycle_opts import LifecycleOptions
from tsm.schedulers.common.options import option
from tsm.schedulers.common.quoting import shell_quote
from tsm.schedulers.slurm.cli import parse_version
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
class SlurmOptions(LifecycleOptions):
    """The sbatch options tsm exposes, each applied to every role unless said otherwise.

    The long-run options (``time_limit``, ``warn_signal``, ...) come from :class:`LifecycleOptions`.
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
        if self.stall_timeout is not None:
            raise InvalidRunOptionError(
                "run option stall_timeout is not supported on slurm yet (tsm has no process watching the job's "
                "logs and CPU there); use the local scheduler, or tsm.timer.expires in the program"
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
    ``job_dir/app.json``; ``roles`` are the role names in het-group order.
    """

    script: str
    job_dir: str
    app_name: str
    roles: list[str]
    app_json: str
    sbatch_args: list[str] = field(default_factory=lambda: ["--parsable"])

    def __str__(self) -> str:
        return self.script


def format_request(request: object) -> str:
    """How a dry run prints a Slurm request: the script itself."""
    return request.script if isinstance(request, SlurmBatchRequest) else repr(request)


def _directive(option: str, value: str | int | None = None) -> str:
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

#: The fixed program every task runs (bash -c "$_tsm_replica" tsm-replica ROLE N NENV K=V... CMD...).
#: It never contains a value of the app: those arrive as positional parameters.
REPLICA_WRAPPER = r"""role=$1 n=$2 nenv=$3
shift 3
export TSM_REPLICA_ID="${SLURM_PROCID:-0}" TSM_ROLE_NAME="$role" TSM_NUM_REPLICAS="$n"
status="$TSM_JOB_DIR/$role/$TSM_REPLICA_ID.status"
attempt="${SLURM_RESTART_COUNT:-0}"
host="${SLURMD_NODENAME:-$(hostname)}"
printf 'running %s %s %s\n' "$host" "$(date +%s)" "$attempt" >"$status"
tsm_sub() {
  REPLY=$1
  case $REPLY in *'${'*)
    REPLY=${REPLY//'${app_id}'/"$TSM_APP_ID"}
    REPLY=${REPLY//'${replica_id}'/"$TSM_REPLICA_ID"} ;;
  esac
}
odd=()
while [ "$nenv" -gt 0 ]; do
  kv=$1
  shift
  nenv=$((nenv - 1))
  tsm_sub "${kv#*=}"
  if [[ ${kv%%=*} =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
    export "${kv%%=*}=$REPLY"
  else
    odd+=("${kv%%=*}=$REPLY")
  fi
done
case ${TSM_PYTHON_BIN:-} in ?*) export PATH="$TSM_PYTHON_BIN:$PATH" ;; esac
cmd=()
for a in "$@"; do
  tsm_sub "$a"
  cmd+=("$REPLY")
done
sig=-
case ${TSM_WARN_SIGNAL:-} in ?*) trap : "$TSM_WARN_SIGNAL" ;; esac
trap 'sig=TERM' TERM
trap 'sig=INT' INT
if [ "${#odd[@]}" -gt 0 ]; then
  env -- "${odd[@]}" "${cmd[@]}"
else
  "${cmd[@]}"
fi
rc=$?
printf 'exited %s %s %s %s %s\n' "$rc" "$(date +%s)" "$attempt" "$sig" "$host" >"$status"
exit "$rc"
"""

#: The batch script's body after the per-role sruns: wait for all, stop the rest when one fails,
#: requeue while the failed role has retries left, record the exit code.
_WAIT_LOOP = r"""_tsm_failed=
_tsm_grace=
while :; do
  _tsm_alive=0
  for i in "${!_tsm_pid[@]}"; do
    [ -n "${_tsm_rc[$i]:-}" ] && continue
    if kill -0 "${_tsm_pid[$i]}" 2>/dev/null; then
      _tsm_alive=1
      continue
    fi
    wait "${_tsm_pid[$i]}"
    _tsm_rc[$i]=$?
    if [ "${_tsm_rc[$i]}" -ne 0 ] && [ -z "$_tsm_failed" ]; then
      _tsm_failed=$i
      echo "tsm: role ${_tsm_role[$i]} failed (srun exit code ${_tsm_rc[$i]}); stopping the other roles" >&2
      # SIGTERM to every step of every role (not to this script); after the grace period a SIGTERM to
      # each srun still running makes it kill its step outright.
      scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null
      (sleep "$TSM_KILL_GRACE"; for p in "${_tsm_pid[@]}"; do kill -TERM "$p" 2>/dev/null; done) &
      _tsm_grace=$!
    fi
  done
  [ "$_tsm_alive" = 0 ] && break
  wait -n 2>/dev/null
  _tsm_on_wake
done
[ -n "$_tsm_grace" ] && kill "$_tsm_grace" 2>/dev/null
[ -n "$_tsm_timer" ] && kill "$_tsm_timer" 2>/dev/null
if [ -z "$_tsm_failed" ]; then
  echo 0 >"$TSM_JOB_DIR/exit"
  exit 0
fi
_tsm_code=${_tsm_rc[$_tsm_failed]}
if [ "$_tsm_failures" -lt "${_tsm_retries[$_tsm_failed]}" ]; then
  echo "tsm: requeueing (restart $((_tsm_failures + 1)) of ${_tsm_retries[$_tsm_failed]})" >&2
  echo $((_tsm_failures + 1)) >"$TSM_JOB_DIR/failures"
  echo "failed:$_tsm_code" >"$TSM_JOB_DIR/requeue_cause"
  echo requeued >"$TSM_JOB_DIR/exit"
  if scontrol requeue "$SLURM_JOB_ID"; then
    sleep 600 # Slurm ends this run of the job now
  fi
fi
echo "$_tsm_code" >"$TSM_JOB_DIR/exit"
exit "$_tsm_code"
"""


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
    """The complete sbatch script for ``app`` (the package docstring, :mod:`tsm.schedulers.slurm`, draws its shape).

    ``version`` is the Slurm version that decides the GPU option; it may be None when no role wants GPUs.
    """
    pack = opts.pack_replicas
    lines = ["#!/bin/bash"]
    job_wide: list[str] = [
        _directive("--job-name", f"{app.name}.{app.roles[0].name}"),
        _directive("--chdir", job_dir),
        _directive("--output", f"{job_dir}/batch.out"),
        _directive("--open-mode", "append"),
        _directive("--export", "ALL"),
    ]
    retries = any(r.max_retries > 0 for r in app.roles)
    if opts.requeue is True or retries or (opts.requeue is None and opts.max_preemptions > 0):
        job_wide.append(_directive("--requeue"))
    elif opts.requeue is False:
        job_wide.append(_directive("--no-requeue"))
    for opt, text in (
        ("--comment", opts.comment),
        ("--mail-user", opts.mail_user),
        ("--mail-type", opts.mail_type),
    ):
        if text:
            job_wide.append(_directive(opt, text))
    limit = opts.time_limit_s
    warn = _warn_name(opts)
    if limit is not None and warn is not None:
        job_wide.append(_directive("--signal", f"B:{warn}@{round(opts.warn_before_s)}"))
    for extra in opts.sbatch_args or []:
        job_wide.append(_raw_directive(extra))
    exclude = ",".join([*([opts.exclude] if opts.exclude else []), *(opts.exclude_nodes or [])])

    for i, role in enumerate(app.roles):
        if i > 0:
            lines.append("#SBATCH hetjob")
            lines.append(_directive("--job-name", f"{app.name}.{role.name}"))
        else:
            lines.extend(job_wide)
        res = role.resource
        n = role.num_replicas
        if pack:
            lines.append(_directive("--ntasks", n))
        else:
            lines.append(_directive("--nodes", n))
            lines.append(_directive("--ntasks-per-node", 1))
        sized = not is_null_resource(res)  # no resource given: no size directives, the partition's defaults
        cpus = _whole(res.cpu)
        if sized:
            lines.append(_directive("--cpus-per-task", cpus))
        if sized and res.memMB and res.memMB > 0:  # rounded up: "--mem=0" would mean all of a node's memory
            if pack:
                lines.append(_directive("--mem-per-cpu", f"{-(-math.ceil(res.memMB) // cpus)}M"))
            else:
                lines.append(_directive("--mem", f"{math.ceil(res.memMB)}M"))
        if sized and res.gpu and res.gpu > 0:
            per_task = pack or version is None or version >= GPUS_PER_TASK_SINCE
            lines.append(_directive("--gpus-per-task" if per_task else "--gpus-per-node", int(res.gpu)))
        caps = res.capabilities or {}
        partition = caps.get("partition") or opts.partition
        constraint = caps.get("constraint") or opts.constraint
        for opt, value in (
            ("--partition", partition),
            ("--time", opts.time or (slurm_time(limit) if limit is not None else None)),
            ("--account", opts.account),
            ("--qos", opts.qos),
            ("--constraint", constraint),
            ("--reservation", opts.reservation),
            ("--nodelist", opts.nodelist),
            ("--exclude", exclude),
        ):
            if value:
                lines.append(_directive(opt, str(value)))
        if opts.exclusive:
            lines.append(_directive("--exclusive"))

    q = shlex.quote
    roles_desc = ", ".join(f"{r.name} x{r.num_replicas}" for r in app.roles)
    lines += [
        "",
        f"# tsm app {app.name}: {roles_desc}. The job directory holds app.json, logs and replica status.",
        "umask 077",
        f"export TSM_JOB_DIR={q(job_dir)}",
        'export TSM_APP_ID="$SLURM_JOB_ID"',
        f"export TSM_KILL_GRACE={opts.kill_grace}",
        'echo "${SLURM_RESTART_COUNT:-0}" >"$TSM_JOB_DIR/restarts"',
        'rm -f -- "$TSM_JOB_DIR/exit"',
        *_lifecycle_lines(opts, warn),
        "# The first node of the first role, by a name that resolves (else by its address).",
        '_tsm_nodes="${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"',
        'TSM_RANK0_HOST=$(scontrol show hostnames "$_tsm_nodes" | head -n 1)',
        'if ! getent hosts "$TSM_RANK0_HOST" >/dev/null 2>&1; then',
        '  _tsm_addr=$(scontrol show node "$TSM_RANK0_HOST" 2>/dev/null | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p" | head -n 1)',
        '  [ -n "$_tsm_addr" ] && TSM_RANK0_HOST=$_tsm_addr',
        "fi",
        "export TSM_RANK0_HOST",
        *(['export TORCHX_RANK0_HOST="$TSM_RANK0_HOST"'] if any("TORCHX_JOB_ID" in r.env for r in app.roles) else []),
        f"_tsm_replica={q(REPLICA_WRAPPER)}",
        "declare -a _tsm_pid _tsm_rc _tsm_role _tsm_retries",
    ]
    het = len(app.roles) > 1
    extra_srun = list(opts.srun_args or [])
    for i, role in enumerate(app.roles):
        values = macros.Values(
            img_root=_role_cwd(role, submit_dir),
            app_id=macros.app_id,  # run time: the wrapper substitutes $SLURM_JOB_ID
            replica_id=macros.replica_id,  # run time: the wrapper substitutes the task's rank
        )
        r = values.apply(role)
        n = r.num_replicas
        sized = not is_null_resource(r.resource)
        srun = ["srun"]
        if het:
            srun.append(f"--het-group={i}")
        srun += [f"--ntasks={n}"]
        if not pack:
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
            *extra_srun,
        ]
        python = replica_python(r.env, opts.python)
        env = dict(r.env)
        if "PATH" not in env:
            # the wrapper puts the chosen interpreter's directory first on the PATH the job kept
            # (--export=ALL); a role that sets PATH gets exactly its own
            env[PYTHON_BIN_ENV] = python.bin_dir
        env_pairs = [f"{k}={v}" for k, v in env.items()]
        argv = [*srun, "bash", "-c", "$_tsm_replica", "tsm-replica", r.name, str(n), str(len(env_pairs))]
        argv += [*env_pairs, r.entrypoint, *r.args]
        quoted = " ".join('"$_tsm_replica"' if a == "$_tsm_replica" else shell_quote(a) for a in argv)
        lines += [
            f"# role {i}: {r.name}, {n} replica(s)"
            + ("" if sized else "; no resource given: the partition's default CPUs and memory per task apply"),
            f"# python: {python.describe()}" + ("" if "PATH" not in r.env else "; the role sets PATH itself"),
            f'mkdir -p -- "$TSM_JOB_DIR"/{q(r.name)}',
            f"_tsm_role[{i}]={q(r.name)}",
            f"_tsm_retries[{i}]={int(r.max_retries)}",
            f"{quoted} &",
            f"_tsm_pid[{i}]=$!",
        ]
    lines.append(_WAIT_LOOP.rstrip("\n"))
    return "\n".join(lines) + "\n"


def _warn_name(opts: SlurmOptions) -> str | None:
    """The signal the batch shell gets before the time limit (``USR1`` when only a requeue needs it), or None."""
    if opts.time_limit_s is None:
        return None
    sig = opts.warn_signum
    if sig is not None:
        return sig.name.removeprefix("SIG")
    return "USR1" if opts.requeue_on_time_limit else None


def _lifecycle_lines(opts: SlurmOptions, warn: str | None) -> list[str]:
    """The script's long-run part: the attempt's variables, the preemption budget, the time-limit warning.

    Restarts the script did not ask for (no ``requeue_cause`` file) are the cluster's: ``preempted``. Past
    ``max_preemptions`` of them the job fails at once. ``warn`` is the ``--signal`` the batch shell gets:
    it is forwarded to every task with ``scancel --signal`` (which signals the steps, not this shell) when a
    warning was asked for, and with ``requeue_on_time_limit`` the job requeues itself ``warn_before`` later
    (less a margin), as a preemption.
    """
    budget = int(opts.max_preemptions)
    lines = [
        "# Long runs: the attempt's variables; the script's own requeues are counted, any other is the cluster's.",
        'export TSM_ATTEMPT="${SLURM_RESTART_COUNT:-0}" TSM_RESTART_COUNT="${SLURM_RESTART_COUNT:-0}"',
        '_tsm_failures=$(cat "$TSM_JOB_DIR/failures" 2>/dev/null)',
        "case $_tsm_failures in '' | *[!0-9]*) _tsm_failures=0 ;; esac",
        "TSM_LAST_EXIT=",
        'if [ "$TSM_RESTART_COUNT" -gt 0 ]; then',
        "  TSM_LAST_EXIT=preempted",
        '  if [ -f "$TSM_JOB_DIR/requeue_cause" ]; then',
        '    TSM_LAST_EXIT=$(cat "$TSM_JOB_DIR/requeue_cause")',
        '    rm -f -- "$TSM_JOB_DIR/requeue_cause"',
        "  fi",
        "fi",
        "export TSM_LAST_EXIT",
        'echo "$TSM_LAST_EXIT" >"$TSM_JOB_DIR/last_exit"',
        "_tsm_preemptions=$((TSM_RESTART_COUNT - _tsm_failures))",
        f'if [ "$_tsm_preemptions" -gt {budget} ]; then',
        f'  echo "tsm: the cluster restarted the job $_tsm_preemptions time(s), more than max_preemptions={budget}; '
        'the app fails" >&2',
        '  echo 1 >"$TSM_JOB_DIR/exit"',
        "  exit 1",
        "fi",
        "_tsm_timer=",
    ]
    if not opts.requeue_on_time_limit:
        lines.append("_tsm_on_wake() { :; }")
    else:
        # the requeue timer is a child the wait loop's `wait -n` wakes for; it requeues when the timer is done
        lines += [
            "_tsm_on_wake() {",
            '  if [ -n "$_tsm_timer" ] && ! kill -0 "$_tsm_timer" 2>/dev/null; then',
            "    _tsm_timer=",
            '    echo requeued >"$TSM_JOB_DIR/exit"',
            '    scontrol requeue "$SLURM_JOB_ID" && sleep 600 # Slurm ends this run of the job now',
            "  fi",
            "}",
        ]
    if warn is None:
        return lines
    body = []
    if opts.warn_signum is not None:
        lines.append(f"export TSM_WARN_SIGNAL={warn}")
        body += [
            f'  echo "tsm: the time limit is near: SIG{warn} to every task" >&2',
            f'  scancel --signal={warn} "$SLURM_JOB_ID" 2>/dev/null',
        ]
    if opts.requeue_on_time_limit:
        wait = max(0, round(opts.warn_before_s) - 5)
        body += [
            f'  if [ "$_tsm_preemptions" -lt {budget} ]; then',
            f'    echo "tsm: requeueing at the time limit (preemption $((_tsm_preemptions + 1)) of {budget})" >&2',
            '    echo time_limit >"$TSM_JOB_DIR/requeue_cause"',
            f"    sleep {wait} &",
            "    _tsm_timer=$!",
            "  fi",
        ]
    return [
        *lines,
        "_tsm_warned=",
        "_tsm_warning() {",
        '  [ -n "$_tsm_warned" ] && return 0',
        "  _tsm_warned=1",
        *body,
        "}",
        f"trap _tsm_warning {warn}",
    ]


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


# -- job arrays: a sweep of single-role trials as one job (issue 24) ------------------------------------------

#: The line of :func:`build_script` that names the app; an array task's app id is ``<array job id>_<task id>``.
_APP_ID_LINE = 'export TSM_APP_ID="$SLURM_JOB_ID"'
_ARRAY_APP_ID_LINE = 'export TSM_APP_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
#: Directives each trial has its own of: the array script sets them once (the task's own run in its job dir).
_PER_TRIAL = frozenset({"--job-name", "--chdir", "--output"})


def array_task_script(script: str) -> str:
    """A trial's batch script (:func:`build_script`) as run by one task of a job array.

    Only the app id changes: ``<array job id>_<task id>``, which is the trial's app id, so the replicas'
    ``${app_id}``, ``TSM_APP_ID`` and the tracker's ``TSM_JOB_ID`` name the trial, not the array.
    (``$SLURM_JOB_ID`` is the task's own job id, which is what ``scancel``/``scontrol requeue`` in the script
    want.) The ``#SBATCH`` lines stay: run by ``bash`` they are comments.
    """
    if script.count(_APP_ID_LINE) != 1:
        raise ValueError("not a tsm Slurm batch script: its app id line is missing")
    return script.replace(_APP_ID_LINE, _ARRAY_APP_ID_LINE)


def _option_of(directive: str) -> str:
    """``--chdir`` of ``#SBATCH --chdir=/x`` (or of a quoted raw ``#SBATCH '--signal=USR1@60'``)."""
    return directive.removeprefix("#SBATCH ").lstrip("'\"").partition("=")[0]


def job_directives(script: str) -> list[str]:
    """The ``#SBATCH`` lines of a single-role :func:`build_script` script, in order."""
    out = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#SBATCH "):
            break
        out.append(line)
    return out


def build_array_script(task_scripts: list[str], task_links: str, name: str, parallel: int) -> str:
    """The batch script of a job array running ``task_scripts`` (one trial each), at most ``parallel`` at once.

    ``--array=0-(N-1)%P``: Slurm starts task *i* when fewer than ``P`` run, so the cap holds without anything
    of tsm's alive. Every trial's sbatch directives but its name, directory and output must be the same (an
    array is one request); they are the array's. ``task_links`` is a directory holding ``0``, ``1``, ... each
    a link to that trial's job directory, which holds its script (:func:`array_task_script`); task *i* runs
    ``task_links/i/job.sbatch`` there, and Slurm writes its batch output to ``task_links/i/batch.out``, i.e.
    the trial's own ``batch.out``. Every path is quoted as in :func:`build_script`.
    """
    if not task_scripts:
        raise ValueError("a job array needs at least one task")
    shared = [d for d in job_directives(task_scripts[0]) if _option_of(d) not in _PER_TRIAL]
    for i, script in enumerate(task_scripts[1:], 1):
        if [d for d in job_directives(script) if _option_of(d) not in _PER_TRIAL] != shared:
            raise InvalidRunOptionError(
                f"trial {i} asks Slurm for other resources or options than trial 0: a job array is one request"
            )
    n = len(task_scripts)
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        _directive("--job-name", name),
        _directive("--array", f"0-{n - 1}%{parallel}"),
        _directive("--chdir", task_links),
        _directive("--output", f"{task_links}/%a/batch.out"),
        *shared,
        "",
        f"# tsm sweep {name}: {n} trial(s), at most {parallel} at once; task i is the trial in {task_links}/i.",
        f"_tsm_tasks={q(task_links)}",
        'cd -- "$_tsm_tasks/$SLURM_ARRAY_TASK_ID" || exit 1',
        'exec bash ./job.sbatch',
    ]
    return "\n".join(lines) + "\n"
