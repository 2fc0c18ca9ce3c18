"""The request: an AppDef and its run options as the batch script ``sbatch`` receives, unchanged.

Pure: :func:`build_script` runs nothing and reads no file, so a dry run prints exactly what is submitted
(the package docstring, :mod:`tsm.schedulers.slurm`, describes the script's shape). The run options are
declared once, typed, in :class:`SlurmOptions`.

Long runs (issue 25, the shared options of :mod:`tsm.schedulers.common.lifecycle_opts`): ``time_limit`` is
``--time`` (whole minutes, Slurm's unit); a warning is ``--signal=B:<SIG>@<warn_before>`` to the batch shell
(set with or without a time limit: a preemption and ``tsm cancel`` send it too), which forwards it to every
task of every step (``scancel --signal`` of :func:`relay_signal`, which each task's wrapper passes on as the
warning to its processes that handle it) and, with ``requeue_on_time_limit``, requeues the job before the
limit; ``exclude_nodes`` joins ``--exclude``. The script counts its own failure requeues in
``job_dir/failures`` and its moves off failed nodes in ``job_dir/moves``: every other restart is the
cluster's (a preemption, a lost node), spends ``max_preemptions`` and never ``max_retries``; each attempt gets
``TSM_ATTEMPT``, ``TSM_RESTART_COUNT`` and ``TSM_LAST_EXIT`` (also written to ``job_dir/last_exit`` for
``describe``). A restart after ``NODE_FAIL``/``BOOT_FAIL``, or after the node's OOM killer ended a replica
(:data:`REPLICA_WRAPPER` records it in ``oom_nodes``), keeps the app off that node
(:func:`_avoid_failed_nodes`); ``stall_timeout`` starts a watcher beside the sruns (:data:`STALL_WATCHER`).
A role that ends while Slurm preempts the job (``PreemptTime`` set: after the job's ``--signal`` was sent,
Slurm's preemption sends the tasks SIGTERM at once) is not the app's failure: the script waits for Slurm to
end the attempt at the ``GraceTime``'s end and requeue the job.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field

from tsm.errors import InvalidRunOptionError
from tsm.schedulers.common.durations import format_duration
from tsm.schedulers.common.interpreter import replica_python
from tsm.schedulers.common.lifecycle_opts import LifecycleOptions
from tsm.schedulers.common.options import option
from tsm.schedulers.common.quoting import shell_quote
from tsm.schedulers.common.stall import QUOTE_MAX, stall_message, tick
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
relay=${TSM_WARN_RELAY:-}
unset TSM_WARN_RELAY
tsm_relay() {  # the warning itself, to the processes under this wrapper that handle it (not to this helper)
  local want p k v hex tree=" $$ " more=1 all=() par=()
  want=$(kill -l "$TSM_WARN_SIGNAL" 2>/dev/null) || return 0
  for p in /proc/[0-9]*; do
    read -r v 2>/dev/null <"$p/stat" || continue
    set -f -- ${v##*) }  # state ppid ...: the fields after the command's name
    set +f
    all+=("${p#/proc/}") par+=("$2")
  done
  while [ -n "$more" ]; do  # the descendants of this wrapper, one generation per pass
    more=
    for k in "${!all[@]}"; do
      p=${all[$k]}
      case $tree in *" $p "*) continue ;; esac
      [ "$p" = "$BASHPID" ] && continue
      case $tree in *" ${par[$k]} "*) tree+="$p " more=1 ;; esac
    done
  done
  for p in $tree; do
    [ "$p" = "$$" ] && continue
    hex=
    while read -r k v; do [ "$k" = SigCgt: ] && hex=$v && break; done 2>/dev/null <"/proc/$p/status"
    [ -n "$hex" ] && (((0x$hex >> (want - 1)) & 1)) && kill -s "$TSM_WARN_SIGNAL" "$p" 2>/dev/null
  done
  return 0
}
helper=
if [ -n "${TSM_WARN_SIGNAL:-}" ] && [ -n "$relay" ]; then
  # Slurm delivers the warning to every process of every task as $relay, which programs ignore by default;
  # this helper passes it on as the warning itself to those that handle it, so a launcher without a handler
  # (torchrun, sh -c) is spared. A background shell, as this one runs the command in the foreground (bash
  # runs a trap only once its foreground command has ended).
  (
    nap=
    trap tsm_relay "$relay"
    trap 'kill "$nap" 2>/dev/null; wait "$nap"; exit 0' TERM
    while :; do
      # one sleep at a time: a relay's trap interrupts the wait, not the sleep
      if [ -z "$nap" ] || ! kill -0 "$nap" 2>/dev/null; then
        command -p sleep 3600 &  # the system's sleep, whatever PATH the app set
        nap=$!
      fi
      wait "$nap"
    done
  ) </dev/null >/dev/null 2>&1 &
  helper=$!
fi
tsm_oom() {  # REPLY: the node's OOM kills so far (/proc/vmstat), then how many of Slurm's memory cgroups of
  # this task, from its own up to the job's (a limit may sit on any of them), reached their limit (v2: their
  # "oom" events); "-" when it is in one that cannot be read (then no OOM is blamed on the node), 0 when
  # Slurm put it in none (no limit of its own)
  local k v u ctl path p n=0 own=0 slurm= seen=
  { while read -r k v; do [ "$k" = oom_kill ] && n=$v; done </proc/vmstat; } 2>/dev/null
  { while IFS=: read -r _ ctl path; do
      case $path in */job_*) ;; *) continue ;; esac
      case ",$ctl," in *,memory,* | ,,) ;; *) continue ;; esac  # v1's memory (alone or co-mounted), or v2
      slurm=1
      p=$path
      while [ -n "$p" ]; do
        case $ctl in
          '') while read -r k v; do [ "$k" = oom ] && own=$((own + v)) seen=1; done <"/sys/fs/cgroup$p/memory.events" ;;
          *) # v1: its usage's peak reached its limit (failcnt is not counted when swap is limited too)
             read -r v <"/sys/fs/cgroup/memory$p/memory.limit_in_bytes" && seen=1 \
               && read -r u <"/sys/fs/cgroup/memory$p/memory.max_usage_in_bytes" \
               && [ "$v" -lt 4611686018427387904 ] && [ "$u" -ge "$v" ] && own=$((own + 1)) ;;
        esac
        case ${p##*/} in job_*) break ;; esac
        p=${p%/*}
      done
    done </proc/self/cgroup; } 2>/dev/null
  [ -n "$slurm" ] && [ -z "$seen" ] && own=-
  REPLY="$n $own"
}
tsm_gpu() {  # REPLY: "" (no verdict: the task has no GPU of Slurm's, or the node no nvidia-smi), "lost <what
  # nvidia-smi said>" (a GPU fallen off the bus, or one it cannot reach), else the node's GPUs' uncorrectable
  # ECC errors since the driver loaded
  REPLY=
  [ -n "${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}" ] && command -v nvidia-smi >/dev/null 2>&1 || return 0
  local out line n=0 v
  out=$(timeout 60 nvidia-smi --query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total \
    --format=csv,noheader,nounits 2>&1)
  while IFS= read -r line; do
    case $line in
      *'GPU is lost'* | *'Unable to determine the device handle'* | *'fallen off the bus'*)
        REPLY="lost ${line:0:200}"
        return 0 ;;
      *,*) v=${line##*,} v=${v// /}
        case $v in '' | *[!0-9]*) ;; *) n=$((n + v)) ;; esac ;;  # "[N/A]": no ECC on this GPU
    esac
  done <<<"$out"
  REPLY=$n
}
tsm_oom
oom0=$REPLY
tsm_gpu
gpu0=$REPLY
if [ "${#odd[@]}" -gt 0 ]; then
  env -- "${odd[@]}" "${cmd[@]}"
else
  "${cmd[@]}"
fi
rc=$?
if [ -n "$helper" ]; then  # the helper and its sleep end with the task, before it says it ended
  kill "$helper" 2>/dev/null
  wait "$helper" 2>/dev/null
fi
if [ "$rc" -gt 128 ] && [ "$sig" = - ] && [ "$(cat "$TSM_JOB_DIR/stopping" 2>/dev/null)" = "$attempt" ]; then
  # the batch shell was stopping every task when the command died of a signal: that stop's, not its own
  sig=$(kill -l "$((rc - 128))" 2>/dev/null) || sig=TERM
fi
if [ "$rc" = 137 ] && [ "$sig" = - ]; then
  tsm_oom
  if [ "${REPLY% *}" -gt "${oom0% *}" ] 2>/dev/null && [ "${REPLY#* }" = "${oom0#* }" ] && [ "${oom0#* }" != - ]; then
    # SIGKILL while the node's OOM killer killed, not for a memory limit of the job's own: the node's doing
    printf "%s OOM (the kernel's OOM killer ended %s/%s)\n" "$host" "$role" "$TSM_REPLICA_ID" >>"$TSM_JOB_DIR/oom_nodes"
    echo "tsm: $role/$TSM_REPLICA_ID was killed by the kernel's OOM killer on $host; later attempts avoid it" >&2
  fi
fi
if [ "$rc" != 0 ] && [ "$sig" = - ] && [ -n "$gpu0" ]; then
  tsm_gpu
  why=
  case $REPLY in
    lost*) why="nvidia-smi: ${REPLY#lost }" ;;
    *) [ "${REPLY:-0}" -gt "${gpu0#lost*}" ] 2>/dev/null && why="uncorrectable ECC errors rose from $gpu0 to $REPLY" ;;
  esac
  if [ -n "$why" ]; then  # a failure with a GPU fault on the node: the node's doing
    printf "%s GPU (%s/%s: %s)\n" "$host" "$role" "$TSM_REPLICA_ID" "$why" >>"$TSM_JOB_DIR/oom_nodes"
    echo "tsm: $role/$TSM_REPLICA_ID failed with a GPU fault on $host ($why); later attempts avoid it" >&2
  fi
fi
printf 'exited %s %s %s %s %s\n' "$rc" "$(date +%s)" "$attempt" "$sig" "$host" >"$status"
exit "$rc"
"""

#: The batch script's body after the per-role sruns: wait for all, stop the rest when one fails,
#: requeue while the failed role has retries left, record the exit code.
_WAIT_LOOP = r"""_tsm_failed=
_tsm_grace=
_tsm_preempting=
_tsm_stop_all() {
  # the mark first: a task that dies of the SIGTERM before its wrapper gets its own (Slurm signals a step's
  # processes one at a time) is told apart from one that failed by itself; then SIGTERM to every step of
  # every role (not to this script); after the grace period a SIGTERM to each srun still running makes it
  # kill its step outright
  echo "$TSM_ATTEMPT" >"$TSM_JOB_DIR/stopping"
  scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null
  (sleep "$TSM_KILL_GRACE"; for p in "${_tsm_pid[@]}"; do kill -TERM "$p" 2>/dev/null; done) &
  _tsm_grace=$!
}
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
    [ "${_tsm_rc[$i]}" -ne 0 ] && [ -z "$_tsm_failed" ] && [ -z "$_tsm_preempting" ] || continue
    if _tsm_preempted; then
      # Slurm is preempting the job: once its own --signal was sent (a time limit's warning, which Slurm may
      # send up to 30 s early), a preemption sends SIGTERM to the tasks at once and requeues the job at the
      # end of the partition's GraceTime. Ending this script now would end the job as failed, never requeued
      _tsm_preempting=1
      echo "tsm: role ${_tsm_role[$i]} ended (srun exit code ${_tsm_rc[$i]}) as Slurm preempts the job; waiting for Slurm to requeue it" >&2
      [ -n "$_tsm_timer" ] && kill "$_tsm_timer" 2>/dev/null  # the requeue is Slurm's now
      _tsm_timer=
    else
      _tsm_failed=$i
      echo "tsm: role ${_tsm_role[$i]} failed (srun exit code ${_tsm_rc[$i]}); stopping the other roles" >&2
      _tsm_stop_all
    fi
  done
  [ "$_tsm_alive" = 0 ] && break
  wait -n 2>/dev/null
  _tsm_on_wake
done
[ -n "$_tsm_grace" ] && kill "$_tsm_grace" 2>/dev/null
[ -n "$_tsm_timer" ] && kill "$_tsm_timer" 2>/dev/null
[ -n "$_tsm_watch" ] && kill "$_tsm_watch" 2>/dev/null
if [ -n "$_tsm_preempting" ]; then
  # Slurm ends this run at the end of the grace time (SIGTERM to this script) and requeues the job
  while :; do sleep 600; done
fi
[ -n "$_tsm_stalled" ] && [ -z "$_tsm_failed" ] && _tsm_failed=0
if [ -z "$_tsm_failed" ]; then
  echo 0 >"$TSM_JOB_DIR/exit"
  exit 0
fi
_tsm_code=${_tsm_rc[$_tsm_failed]}
if [ -n "$_tsm_stalled" ] && [ "$_tsm_code" -eq 0 ]; then
  # a stall is the app's failure even when its tasks exited 0 on the warning (checkpoint, then exit)
  echo "tsm: the stalled role's tasks exited 0 after the warning; the attempt fails as stalled (exit 1)" >&2
  _tsm_code=1
fi
if [ -z "$_tsm_no_requeue" ] && [ "$_tsm_failures" -lt "${_tsm_retries[$_tsm_failed]}" ]; then
  echo "tsm: requeueing (restart $((_tsm_failures + 1)) of ${_tsm_retries[$_tsm_failed]})" >&2
  echo $((_tsm_failures + 1)) >"$TSM_JOB_DIR/failures"
  echo "${_tsm_cause:-failed:$_tsm_code}" >"$TSM_JOB_DIR/requeue_cause"
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
    if warn is not None:
        # also without a time limit: a cluster with SlurmctldParameters=preempt_send_user_signal sends it at
        # preemption (then GraceTime before SIGTERM), and tsm cancel sends it to the batch shell too
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
        *_early_lines(job_dir, warn),
        f"export TSM_JOB_DIR={q(job_dir)}",
        'export TSM_APP_ID="$SLURM_JOB_ID"',
        f"export TSM_KILL_GRACE={opts.kill_grace}",
        'echo "${SLURM_RESTART_COUNT:-0}" >"$TSM_JOB_DIR/restarts"',
        'rm -f -- "$TSM_JOB_DIR/exit"',
        *_lifecycle_lines(opts, warn, len(app.roles), sum(int(r.max_retries) for r in app.roles)),
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
    stall = opts.stall_timeout_s
    if stall is not None:
        watcher = replica_python(app.roles[0].env, opts.python).path
        every = tick(stall)
        watched = [f"{r.name}:{r.num_replicas}" for r in app.roles]
        with_line, silent = _stall_texts(stall)
        lines += [
            f"# stall_timeout={format_duration(stall)}: one look per {every:g}s at every replica's log sizes and, on "
            "this node, CPU time",
            f"_tsm_watcher={q(STALL_WATCHER)}",
            " ".join([shell_quote(watcher), "-c", '"$_tsm_watcher"', '"$TSM_JOB_DIR"', '"$TSM_ATTEMPT"',
                      f"{stall:g}", f"{every:g}", str(QUOTE_MAX), q(with_line), q(silent),
                      *map(q, watched)]) + " &",
            "_tsm_watch=$!",
        ]
    lines.append(_WAIT_LOOP.rstrip("\n"))
    return "\n".join(lines) + "\n"


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


#: The file ``tsm cancel`` writes in the job directory before it sends the warning to the batch shell: the
#: warning is then a cancel's (never a reason to requeue at the time limit).
CANCEL_MARK = "cancel"


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
    :func:`_lifecycle_lines` is set would kill the batch shell. It is only noted; the full handler, set
    before the tasks start, acts on it then (telling its cause apart and, for a time limit, starting the
    requeue timer); the tasks, started after it, are not sent it.
    """
    lines = [f"rm -f -- {shlex.quote(job_dir)}/{CANCEL_MARK}  # a mark of an earlier attempt's cancel is stale"]
    if warn is not None:
        lines.insert(0, f"_tsm_early= ; trap _tsm_early=1 {warn}  # first: an untrapped {warn} ends this shell")
    return lines


def _lifecycle_lines(opts: SlurmOptions, warn: str | None, roles: int = 1, retries: int = 0) -> list[str]:
    """The script's long-run part: the attempt's variables, the preemption budget, the warning.

    Restarts the script did not ask for (no ``requeue_cause`` file) are the cluster's: ``preempted``. Past
    ``max_preemptions`` of them the job fails at once. ``warn`` is the ``--signal`` the batch shell gets
    before the time limit, at a preemption (``SlurmctldParameters=preempt_send_user_signal``: then the
    partition's ``GraceTime`` passes before SIGTERM) and from ``tsm cancel``: it is forwarded once to every
    task with ``scancel --signal`` (which signals the steps, not this shell) when the app asked for a warning.
    With ``requeue_on_time_limit`` the job requeues itself 5 s before its ``EndTime`` (``warn_before`` less
    5 s after the warning when Slurm does not say it: Slurm checks limits periodically, so the warning may
    come late), as a preemption, only when the warning is the time limit's: not a preemption's (``scontrol
    show job`` has a ``PreemptTime``, which Slurm clears when it requeues the job, checked on 22.05 by
    ``tests/integration/test_slurm_lifecycle.py``; Slurm requeues the job itself) nor a cancel's
    (:data:`CANCEL_MARK`).
    """
    budget = int(opts.max_preemptions)
    lines = [
        "# Long runs: the attempt's variables; the script's own requeues are counted, any other is the cluster's.",
        'export TSM_ATTEMPT="${SLURM_RESTART_COUNT:-0}" TSM_RESTART_COUNT="${SLURM_RESTART_COUNT:-0}"',
        '_tsm_failures=$(cat "$TSM_JOB_DIR/failures" 2>/dev/null)',
        "case $_tsm_failures in '' | *[!0-9]*) _tsm_failures=0 ;; esac",
        '_tsm_moves=$(cat "$TSM_JOB_DIR/moves" 2>/dev/null)',
        "case $_tsm_moves in '' | *[!0-9]*) _tsm_moves=0 ;; esac",
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
        "_tsm_preemptions=$((TSM_RESTART_COUNT - _tsm_failures - _tsm_moves))",
        f'if [ "$_tsm_preemptions" -gt {budget} ]; then',
        f'  echo "tsm: the cluster restarted the job $_tsm_preemptions time(s), more than max_preemptions={budget}; '
        'the app fails" >&2',
        '  echo 1 >"$TSM_JOB_DIR/exit"',
        "  exit 1",
        "fi",
        *_avoid_failed_nodes(opts, roles, retries),
        "_tsm_timer= _tsm_job=",
        "_tsm_watch= _tsm_stalled= _tsm_cause= _tsm_no_requeue=",
        "_tsm_preempted() {  # whether Slurm is preempting the job (it clears PreemptTime when it requeues it)",
        '  _tsm_job=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null)',
        "  case $_tsm_job in *PreemptTime=None* | '') return 1 ;; *PreemptTime=*) return 0 ;; esac",
        "  return 1",
        "}",
        'rm -f -- "$TSM_JOB_DIR/stalled"',
        "_tsm_on_wake() {",
        "  _tsm_on_timer",
        "  _tsm_on_stall",
        "}",
        *_stall_handler(opts, warn),
    ]
    if not opts.requeue_on_time_limit:
        lines.append("_tsm_on_timer() { :; }")
    else:
        # the requeue timer is a child the wait loop's `wait -n` wakes for; it requeues when the timer is done
        lines += [
            "_tsm_on_timer() {",
            '  if [ -n "$_tsm_timer" ] && ! kill -0 "$_tsm_timer" 2>/dev/null; then',
            "    _tsm_timer=",
            f'    [ -f "$TSM_JOB_DIR/{CANCEL_MARK}" ] && return 0  # cancelled meanwhile: never requeue',
            "    # the cause is written now, not at the warning: a preemption meanwhile is Slurm's requeue",
            '    echo time_limit >"$TSM_JOB_DIR/requeue_cause"',
            '    echo requeued >"$TSM_JOB_DIR/exit"',
            '    scontrol requeue "$SLURM_JOB_ID" && sleep 600 # Slurm ends this run of the job now',
            "  fi",
            "}",
        ]
    if warn is None:
        return lines
    body = [
        "  _tsm_why=limit",
        f'  if [ -f "$TSM_JOB_DIR/{CANCEL_MARK}" ]; then',
        "    _tsm_why=cancel",
        "  else",
        "    _tsm_preempted && _tsm_why=preemption",
        "  fi",
    ]
    relay = relay_signal(warn)
    if opts.warn_signum is not None:
        lines += [f"export TSM_WARN_SIGNAL={warn}", f"export TSM_WARN_RELAY={relay}"]
        body += [
            "  case $_tsm_why in",
            f'    cancel) echo "tsm: cancelled: SIG{warn} to every task" >&2 ;;',
            f'    preemption) echo "tsm: the job is preempted: SIG{warn} to every task" >&2 ;;',
            f'    *) echo "tsm: the time limit is near: SIG{warn} to every task" >&2 ;;',
            "  esac",
            f'  scancel --signal={relay} "$SLURM_JOB_ID" 2>/dev/null  # each task\'s wrapper passes it on as SIG{warn}',
        ]
    if opts.requeue_on_time_limit:
        wait = max(0, round(opts.warn_before_s) - 5)
        body += [
            f'  if [ "$_tsm_why" = limit ] && [ "$_tsm_preemptions" -lt {budget} ]; then',
            f'    echo "tsm: requeueing at the time limit (preemption $((_tsm_preemptions + 1)) of {budget})" >&2',
            "    # Slurm may send the warning late (it checks limits periodically): requeue 5 s before the job's",
            "    # EndTime, else warn_before - 5 s after the warning",
            f"    _tsm_left={wait}",
            """    _tsm_end=$(sed -n 's/.* EndTime=\\([0-9][0-9T:-]*\\).*/\\1/p' <<<"$_tsm_job" | head -n 1)""",
            '    if [ -n "$_tsm_end" ] && _tsm_end=$(date -d "$_tsm_end" +%s 2>/dev/null); then',
            "      _tsm_left=$((_tsm_end - $(date +%s) - 5))",
            '      [ "$_tsm_left" -lt 0 ] && _tsm_left=0',
            "    fi",
            '    sleep "$_tsm_left" &',
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
        '[ -n "$_tsm_early" ] && _tsm_warning  # it came before this handler was set',
    ]


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


#: The stall watcher the batch shell starts beside the sruns (``python -c WATCHER JOB_DIR ATTEMPT TIMEOUT TICK
#: QUOTE_MAX PREFIX SILENT ROLE:N...``, TICK from :func:`~tsm.schedulers.common.stall.tick`, the texts from
#: :func:`_stall_texts`). Once per tick it reads every replica's log sizes (the job directory is shared) and, in
#: one pass over ``/proc``, the CPU time of this node's processes of each replica (found by the
#: ``TSM_JOB_DIR``, ``TSM_ROLE_NAME`` and ``TSM_REPLICA_ID`` in their environment; replicas on other nodes are
#: judged by their logs alone). A replica running in this attempt whose fingerprint did not change for
#: TIMEOUT seconds is stalled: the watcher writes ``<role>/<k> stalled for 15m, last line: '...'`` (the
#: shared :func:`~tsm.schedulers.common.stall.stall_message`) to ``job_dir/stalled``, says it on stderr and
#: exits, which wakes the batch shell.
STALL_WATCHER = r"""import os, sys, time
job_dir, attempt, timeout, tick = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
quote_max, prefix, silent = int(sys.argv[5]), sys.argv[6], sys.argv[7]
roles = [(spec.rsplit(":", 1)[0], int(spec.rsplit(":", 1)[1])) for spec in sys.argv[8:]]
mine = ("TSM_JOB_DIR=" + job_dir).encode()


def cpu():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            if mine not in env:
                continue
            role = rid = None
            for kv in env:
                if kv.startswith(b"TSM_ROLE_NAME="):
                    role = kv[14:].decode(errors="replace")
                elif kv.startswith(b"TSM_REPLICA_ID="):
                    rid = kv[15:].decode(errors="replace")
            if role is None or rid is None:
                continue
            with open("/proc/%s/stat" % pid, "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            out[(role, rid)] = out.get((role, rid), 0) + int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return out


def size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def last_line(base):
    best = (-1.0, "")
    for path in (base + ".stdout", base + ".stderr"):
        try:
            with open(path, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                f.seek(max(0, end - 8192))
                tail = f.read()
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        lines = [ln for ln in tail.decode(errors="replace").splitlines() if ln.strip()]
        if lines and mtime > best[0]:
            best = (mtime, lines[-1].strip())
    return best[1]


seen, since = {}, {}
while True:
    now, used = time.monotonic(), cpu()
    for role, n in roles:
        for k in range(n):
            base = os.path.join(job_dir, role, str(k))
            try:
                with open(base + ".status") as f:
                    words = f.read().split()
            except OSError:
                words = []
            if words[:1] != ["running"] or words[3:4] != [attempt]:
                since.pop((role, k), None)
                continue
            mark = (size(base + ".stdout"), size(base + ".stderr"), used.get((role, str(k))))
            if seen.get((role, k)) != mark or (role, k) not in since:
                seen[(role, k)], since[(role, k)] = mark, now
                continue
            if now - since[(role, k)] >= timeout:
                line = last_line(base)
                why = (prefix + repr(line[:quote_max])) if line else silent
                with open(os.path.join(job_dir, "stalled"), "w") as f:
                    f.write("%s/%d %s\n" % (role, k, why))
                print("tsm: replica %s/%d %s" % (role, k, why), file=sys.stderr, flush=True)
                sys.exit(0)
    time.sleep(tick)
"""


def _stall_handler(opts: SlurmOptions, warn: str | None) -> list[str]:
    """``_tsm_on_stall``: when the stall watcher (:data:`STALL_WATCHER`) has ended, act on the stall.

    Every task gets the warning (the app's ``warn_signal``, once, as before a time limit) and up to
    ``warn_before`` to end (less once every srun has ended), then SIGTERM as when a role fails. With
    ``on_stall=restart`` the stall is the replica's own failure: its role's ``max_retries`` decide a requeue,
    whose next attempt sees ``TSM_LAST_EXIT=stalled``; with ``on_stall=fail`` the app fails.
    """
    if opts.stall_timeout_s is None:
        return ["_tsm_on_stall() { :; }"]
    lead = round(opts.warn_before_s)
    warning = []
    if opts.warn_signum is not None and warn is not None:
        warning = [
            '    if [ -z "$_tsm_warned" ]; then',
            "      _tsm_warned=1",
            f'      echo "tsm: stalled: SIG{warn} to every task" >&2',
            f'      scancel --signal={relay_signal(warn)} "$SLURM_JOB_ID" 2>/dev/null',
            f"      for ((_tsm_i = 0; _tsm_i < {lead * 10}; _tsm_i++)); do",
            "        _tsm_any=",
            '        for _tsm_p in "${_tsm_pid[@]}"; do kill -0 "$_tsm_p" 2>/dev/null && _tsm_any=1; done',
            '        [ -z "$_tsm_any" ] && break',
            "        sleep 0.1",
            "      done",
            "    fi",
        ]
    return [
        "_tsm_on_stall() {",
        '  if [ -n "$_tsm_watch" ] && ! kill -0 "$_tsm_watch" 2>/dev/null; then',
        '    wait "$_tsm_watch" 2>/dev/null',
        "    _tsm_watch=",
        '    [ -s "$TSM_JOB_DIR/stalled" ] || return 0',
        "    _tsm_stalled=1 _tsm_cause=stalled",
        "    # the stalled replica's role is the one that failed (its max_retries decide a restart)",
        '    _tsm_what=$(head -n 1 "$TSM_JOB_DIR/stalled")',
        '    for _tsm_i in "${!_tsm_role[@]}"; do',
        '      [ "${_tsm_role[$_tsm_i]}" = "${_tsm_what%%/*}" ] && [ -z "$_tsm_failed" ] && _tsm_failed=$_tsm_i',
        "    done",
        *(["    _tsm_no_requeue=1"] if opts.on_stall == "fail" else []),
        *warning,
        '    echo "tsm: stalled: stopping every task" >&2',
        "    _tsm_stop_all",
        "  fi",
        "}",
    ]


#: Node states (``sinfo -o %t``) of a node not back in service.
_NOT_IN_SERVICE = "*down* | *drain* | *drng* | *fail* | *'*'*"


#: The file the batch script writes when it cannot keep the app off a failed node (``describe`` shows it);
#: the attempt that finds it fails at once.
NODE_ERROR = "node_error"

#: Every file tsm, the batch script and its replicas' wrapper write at the top of a job directory (what
#: ``remove`` deletes there, locally and on a login node; the replicas' files are in the role directories).
JOB_FILES = ("job.sbatch", "batch.out", "exit", "restarts", "job_id", "app.json", "submit_token", "failures",
             "moves", "requeue_cause", "last_exit", "excluded", "oom_nodes", "stalled", "stopping", CANCEL_MARK,
             NODE_ERROR)


def max_moves(opts: SlurmOptions, retries: int = 0) -> int:
    """How many times the script may move the job off failed nodes (see :func:`_avoid_failed_nodes`).

    A move follows a node failure, which spends a preemption, or an OOM kill on a shared node, which is a
    failure and spends a retry (``retries``: the roles' ``max_retries`` together); once its exclusion holds
    the job is never given that node again, so one move per restart those budgets allow (at least one) is
    all a run can need. More means Slurm does not keep the exclusion, and another requeue would only repeat
    the last one.
    """
    return max(1, int(opts.max_preemptions) + retries)


def _avoid_failed_nodes(opts: SlurmOptions, roles: int, retries: int = 0) -> list[str]:
    """The script's part that keeps a restarted job off the nodes that failed under its earlier attempts.

    A restart asks ``sacct`` (one call) for the job's earlier runs that ended ``NODE_FAIL`` or ``BOOT_FAIL``;
    their node (every node of a one-node run; of a larger run, those not back in service) is excluded, and so
    is each node of ``job_dir/oom_nodes`` (the kernel's OOM killer ended a replica there), and
    ``job_dir/excluded`` says which and why (``node3 NODE_FAIL (reason)``, shown by ``describe``). Slurm takes
    ``ExcNodeList`` only for a pending job, so when this attempt was given such a node it requeues itself held
    (``scontrol requeuehold``), sets the exclusion (the ``exclude`` options' nodes too), releases the job and
    ends: a move the script asked for, counted in ``job_dir/moves``, spending neither ``max_retries`` nor
    ``max_preemptions``; the next attempt sees the same ``TSM_LAST_EXIT``. Without accounting nothing is done.

    A move never repeats for ever: when Slurm refuses the exclusion (``scontrol update`` fails), or when the
    job is given a failed node again after :func:`max_moves` moves, the script writes why to
    ``job_dir/node_error`` (:data:`NODE_ERROR`, shown by ``describe``) and the app fails (the attempt that
    finds the record ends at once with exit code 1, before starting anything).
    """
    static = ",".join([*([opts.exclude] if opts.exclude else []), *(opts.exclude_nodes or [])])
    ids = ['"$SLURM_JOB_ID"'] if roles == 1 else [f'"$SLURM_JOB_ID+{c}"' for c in range(roles)]
    cap = max_moves(opts, retries)
    update = []
    for i in ids:
        update += [
            f'        if ! _tsm_err=$(scontrol update JobId={i} ExcNodeList="$_tsm_exc" 2>&1); then',
            '          _tsm_refused="Slurm refused to keep the job off node(s)$_tsm_on_bad (scontrol update '
            f'JobId={i.strip(chr(34))} ExcNodeList=$_tsm_exc: '
            '$(printf %s "$_tsm_err" | tr -s "\\n" " ")); the app fails"',
            "        fi",
        ]
    node_error = f'"$TSM_JOB_DIR/{NODE_ERROR}"'
    return [
        "# Nodes that failed under an earlier attempt (NODE_FAIL, BOOT_FAIL, an OOM kill) are kept out of the later ones.",
        f"if [ -s {node_error} ]; then  # an earlier attempt could not keep the job off them",
        f'  echo "tsm: $(head -n 1 {node_error})" >&2',
        '  echo 1 >"$TSM_JOB_DIR/exit"',
        "  exit 1",
        "fi",
        "_tsm_failed_nodes() {",
        "  local st nl n t reason hosts",
        "  while IFS='|' read -r st nl; do",
        "    case $st in NODE_FAIL | BOOT_FAIL) ;; *) continue ;; esac",
        '    mapfile -t hosts < <(scontrol show hostnames "$nl" 2>/dev/null)',
        '    for n in "${hosts[@]}"; do',
        '      t=$(sinfo -h -N -n "$n" -o %t 2>/dev/null | head -n 1)',
        '      if [ "${#hosts[@]}" -gt 1 ]; then',
        f"        case $t in {_NOT_IN_SERVICE}) ;; *) continue ;; esac",
        "      fi",
        '      reason=$(sinfo -h -N -n "$n" -o %E 2>/dev/null | head -n 1)',
        "      case $reason in '' | none) reason= ;; *) reason=\" (reason: $reason)\" ;; esac",
        "      printf '%s %s%s\\n' \"$n\" \"$st\" \"$reason\"",
        "    done",
        '  done < <(sacct -j "$SLURM_JOB_ID" -D -X -n -P -o State,NodeList 2>/dev/null)',
        '  [ -s "$TSM_JOB_DIR/oom_nodes" ] && cat "$TSM_JOB_DIR/oom_nodes"  # written by the replicas\' wrapper',
        "}",
        'if [ "$TSM_RESTART_COUNT" -gt 0 ]; then',
        "  _tsm_bad=$(_tsm_failed_nodes | sort -u -k1,1)",
        '  if [ -n "$_tsm_bad" ]; then',
        "    printf '%s\\n' \"$_tsm_bad\" >\"$TSM_JOB_DIR/excluded\"",
        '    _tsm_alloc="$SLURM_JOB_NODELIST"',
        "    for _tsm_v in $(compgen -v SLURM_JOB_NODELIST_HET_GROUP_); do _tsm_alloc=\"$_tsm_alloc,${!_tsm_v}\"; done",
        "    _tsm_here=\" $(scontrol show hostnames \"$_tsm_alloc\" 2>/dev/null | tr '\\n' ' ')\"",
        f"    _tsm_exc={shlex.quote(static)}",
        "    _tsm_on_bad=",
        "    while read -r _tsm_n _; do",
        '      _tsm_exc="${_tsm_exc:+$_tsm_exc,}$_tsm_n"',
        '      case $_tsm_here in *" $_tsm_n "*) _tsm_on_bad="$_tsm_on_bad $_tsm_n" ;; esac',
        '    done <<<"$_tsm_bad"',
        f'    if [ -n "$_tsm_on_bad" ] && [ "$_tsm_moves" -ge {cap} ]; then',
        f'      echo "this attempt was given node(s)$_tsm_on_bad, which failed under an earlier one, after {cap} '
        'move(s) off failed nodes (at most max_preemptions + max_retries): Slurm does not keep the job off them '
        f'(ExcNodeList=$_tsm_exc); the app fails" >{node_error}',
        f'      echo "tsm: $(head -n 1 {node_error})" >&2',
        '      echo 1 >"$TSM_JOB_DIR/exit"',
        "      exit 1",
        "    fi",
        '    if [ -n "$_tsm_on_bad" ]; then',
        '      echo "tsm: this attempt was given node(s)$_tsm_on_bad, which failed under an earlier one: requeueing '
        'without them (ExcNodeList=$_tsm_exc)" >&2',
        "      trap '' TERM  # the requeue's SIGTERM must not end this shell before the exclusion is set",
        '      if scontrol requeuehold "$SLURM_JOB_ID" >&2; then',
        '        echo $((_tsm_moves + 1)) >"$TSM_JOB_DIR/moves"',
        '        echo "$TSM_LAST_EXIT" >"$TSM_JOB_DIR/requeue_cause"',
        '        echo requeued >"$TSM_JOB_DIR/exit"',
        "        _tsm_refused=",
        *update,
        '        if [ -n "$_tsm_refused" ]; then  # the next attempt fails at once, with this record',
        f'          echo "$_tsm_refused" >{node_error}',
        '          echo "tsm: $_tsm_refused" >&2',
        "        fi",
        '        scontrol release "$SLURM_JOB_ID" >&2 || scontrol release "$SLURM_JOB_ID" >&2',
        "        exit 0",
        "      fi",
        "      trap - TERM",
        "    fi",
        "  fi",
        "fi",
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
