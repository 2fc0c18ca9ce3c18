# shellcheck shell=bash
# The program every task of a tsm app runs (srun ... bash -c "$_tsm_replica" tsm-replica ROLE N NENV K=V... CMD...):
# exports the replica's TSM_* names, sets the role's NENV env pairs, substitutes ${app_id} and ${replica_id},
# records the replica's host and exit code in $TSM_JOB_DIR/ROLE/<k>.status and runs CMD. Its text never holds
# a value of the app: every value comes as a positional parameter, but the secrets' (the names in
# $TSM_SECRET_NAMES), which it reads from their files in $TSM_JOB_DIR/secrets into the replica's environment.
role=$1 n=$2 nenv=$3
shift 3
export TSM_REPLICA_ID="${SLURM_PROCID:-0}" TSM_ROLE_NAME="$role" TSM_NUM_REPLICAS="$n"
status="$TSM_JOB_DIR/$role/$TSM_REPLICA_ID.status"
attempt="${SLURM_RESTART_COUNT:-0}"
host="${SLURMD_NODENAME:-$(hostname)}"
printf 'running %s %s %s\n' "$host" "$(date +%s)" "$attempt" >"$status"
declare -A _tsm_secret=()
for _tsm_n in ${TSM_SECRET_NAMES:-}; do  # the role's secrets: each the whole of its file (written at submit)
  _tsm_f="$TSM_JOB_DIR/secrets/$_tsm_n"
  if ! _tsm_v=$(cat -- "$_tsm_f" && printf x); then
    echo "tsm: secret $_tsm_n: cannot read $_tsm_f (its file goes when the app ends, is cancelled or removed)" >&2
    printf 'exited 1 %s %s - %s\n' "$(date +%s)" "$attempt" "$host" >"$status"
    exit 1
  fi
  _tsm_secret[$_tsm_n]=${_tsm_v%x}
done
unset TSM_SECRET_NAMES _tsm_n _tsm_f _tsm_v
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
  local k v u ctl path p n=0 own=0 slurm="" seen=""
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
if [ "${#_tsm_secret[@]}" -gt 0 ]; then
  # the secrets go into the command's environment only, never into this wrapper's variables (whatever their
  # names): a subshell takes the command as its arguments, exports them and becomes the command
  (
    if [ "${#odd[@]}" -gt 0 ]; then set -- env -- "${odd[@]}" "${cmd[@]}"; else set -- "${cmd[@]}"; fi
    unset odd cmd  # arrays: a secret of either name is a plain variable
    for _tsm_n in "${!_tsm_secret[@]}"; do
      export "$_tsm_n=${_tsm_secret[$_tsm_n]}" 2>/dev/null || {
        echo "tsm: secret $_tsm_n: bash cannot set a variable of that name (it is one of its own)" >&2
        exit 1
      }
    done
    unset _tsm_secret _tsm_n
    exec "$@"
  )
elif [ "${#odd[@]}" -gt 0 ]; then
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
