# shellcheck shell=bash disable=SC2154
# The batch script's long-run part, run once per attempt before the tasks start: the attempt's variables, the
# preemption budget, keeping the job off nodes that failed, the warning and the stall handler.
# Set before it by the script's generated part: TSM_JOB_DIR; _tsm_budget (max_preemptions), _tsm_moves_cap
# (the most moves off failed nodes), _tsm_exclude (the exclude options' nodes), _tsm_components (het-job
# components); _tsm_warn (the signal the batch shell gets before the end, or empty), _tsm_forward (1: it is
# the app's warn_signal, forwarded to every task as TSM_WARN_RELAY, which each task's wrapper passes on),
# _tsm_requeue_at_limit (1: requeue_on_time_limit) and _tsm_limit_lead (seconds from the warning to that
# requeue when Slurm does not say the job's EndTime), _tsm_stall_lead (warn_before: how long stalled tasks
# get to end after the warning), _tsm_stall_policy (on_stall: fail or restart); _tsm_early (the warning came before its
# handler was set). Used later by wait.sh: _tsm_on_wake, _tsm_preempted, _tsm_signal_run and the variables set
# here.
#
# Restarts the script did not ask for (no requeue_cause file) are the cluster's: preemptions. Past
# max_preemptions of them the job fails at once. The warning comes before the time limit, at a preemption
# (SlurmctldParameters=preempt_send_user_signal: then the partition's GraceTime passes before SIGTERM) and from
# tsm cancel (the cancel mark is in the job directory); it is forwarded once to every task with
# scancel --signal (which signals the steps, not this shell). With requeue_on_time_limit the job requeues
# itself 5 s before its EndTime (_tsm_limit_lead after the warning when Slurm does not say it: Slurm checks
# limits periodically, so the warning may come late), as a preemption, only when the warning is the time
# limit's: not a preemption's (scontrol show job has a PreemptTime, which Slurm clears when it requeues the
# job; Slurm requeues it itself) nor a cancel's.

# -- the attempt's variables; the script's own requeues are counted, any other is the cluster's
export TSM_ATTEMPT="${SLURM_RESTART_COUNT:-0}" TSM_RESTART_COUNT="${SLURM_RESTART_COUNT:-0}"
_tsm_failures=$(cat "$TSM_JOB_DIR/failures" 2>/dev/null)
case $_tsm_failures in '' | *[!0-9]*) _tsm_failures=0 ;; esac
_tsm_moves=$(cat "$TSM_JOB_DIR/moves" 2>/dev/null)
case $_tsm_moves in '' | *[!0-9]*) _tsm_moves=0 ;; esac
TSM_LAST_EXIT=
if [ "$TSM_RESTART_COUNT" -gt 0 ]; then
  TSM_LAST_EXIT=preempted
  if [ -f "$TSM_JOB_DIR/requeue_cause" ]; then
    TSM_LAST_EXIT=$(cat "$TSM_JOB_DIR/requeue_cause")
    rm -f -- "$TSM_JOB_DIR/requeue_cause"
  fi
fi
export TSM_LAST_EXIT
echo "$TSM_LAST_EXIT" >"$TSM_JOB_DIR/last_exit"
_tsm_preemptions=$((TSM_RESTART_COUNT - _tsm_failures - _tsm_moves))
if [ "$_tsm_preemptions" -gt "$_tsm_budget" ]; then
  echo "tsm: the cluster restarted the job $_tsm_preemptions time(s), more than max_preemptions=$_tsm_budget; the app fails" >&2
  rm -rf -- "$TSM_JOB_DIR/secrets"  # the app is over: its secrets' files go
  echo 1 >"$TSM_JOB_DIR/exit"
  exit 1
fi

# -- nodes that failed under an earlier attempt (NODE_FAIL, BOOT_FAIL, an OOM kill) are kept out of the later
# ones. A restart asks sacct for the job's earlier runs that ended NODE_FAIL or BOOT_FAIL: their node (every
# node of a one-node run; of a larger run, those not back in service) is excluded, and so is each node of
# oom_nodes (written by the replicas' wrapper); "excluded" says which and why. Slurm takes ExcNodeList only
# for a pending job, so an attempt given such a node requeues itself held, sets the exclusion, releases the
# job and ends: a move, counted in "moves", spending neither max_retries nor max_preemptions. When Slurm
# refuses the exclusion, or gives the job a failed node again after _tsm_moves_cap moves, node_error says why
# and the app fails.
if [ -s "$TSM_JOB_DIR/node_error" ]; then  # an earlier attempt could not keep the job off them
  echo "tsm: $(head -n 1 "$TSM_JOB_DIR/node_error")" >&2
  rm -rf -- "$TSM_JOB_DIR/secrets"  # the app is over: its secrets' files go
  echo 1 >"$TSM_JOB_DIR/exit"
  exit 1
fi
_tsm_failed_nodes() {
  local st nl n t reason hosts
  while IFS='|' read -r st nl; do
    case $st in NODE_FAIL | BOOT_FAIL) ;; *) continue ;; esac
    mapfile -t hosts < <(scontrol show hostnames "$nl" 2>/dev/null)
    for n in "${hosts[@]}"; do
      t=$(sinfo -h -N -n "$n" -o %t 2>/dev/null | head -n 1)
      if [ "${#hosts[@]}" -gt 1 ]; then
        case $t in *down* | *drain* | *drng* | *fail* | *'*'*) ;; *) continue ;; esac  # not back in service
      fi
      reason=$(sinfo -h -N -n "$n" -o %E 2>/dev/null | head -n 1)
      case $reason in '' | none) reason= ;; *) reason=" (reason: $reason)" ;; esac
      printf '%s %s%s\n' "$n" "$st" "$reason"
    done
  done < <(sacct -j "$SLURM_JOB_ID" -D -X -n -P -o State,NodeList 2>/dev/null)
  [ -s "$TSM_JOB_DIR/oom_nodes" ] && cat "$TSM_JOB_DIR/oom_nodes"  # written by the replicas' wrapper
}
_tsm_move_off() {  # requeue the job held, keep it off _tsm_exc, release it: the next attempt runs elsewhere
  local id ids=("$SLURM_JOB_ID") c
  if [ "$_tsm_components" -gt 1 ]; then
    ids=()
    for ((c = 0; c < _tsm_components; c++)); do ids+=("$SLURM_JOB_ID+$c"); done
  fi
  echo $((_tsm_moves + 1)) >"$TSM_JOB_DIR/moves"
  echo "$TSM_LAST_EXIT" >"$TSM_JOB_DIR/requeue_cause"
  echo requeued >"$TSM_JOB_DIR/exit"
  _tsm_refused=
  for id in "${ids[@]}"; do
    if ! _tsm_err=$(scontrol update JobId="$id" ExcNodeList="$_tsm_exc" 2>&1); then
      _tsm_refused="Slurm refused to keep the job off node(s)$_tsm_on_bad (scontrol update JobId=$id ExcNodeList=$_tsm_exc: $(printf %s "$_tsm_err" | tr -s "\n" " ")); the app fails"
    fi
  done
  if [ -n "$_tsm_refused" ]; then  # the next attempt fails at once, with this record
    echo "$_tsm_refused" >"$TSM_JOB_DIR/node_error"
    echo "tsm: $_tsm_refused" >&2
  fi
  scontrol release "$SLURM_JOB_ID" >&2 || scontrol release "$SLURM_JOB_ID" >&2
}
if [ "$TSM_RESTART_COUNT" -gt 0 ]; then
  _tsm_bad=$(_tsm_failed_nodes | sort -u -k1,1)
  if [ -n "$_tsm_bad" ]; then
    printf '%s\n' "$_tsm_bad" >"$TSM_JOB_DIR/excluded"
    _tsm_alloc="$SLURM_JOB_NODELIST"
    for _tsm_v in $(compgen -v SLURM_JOB_NODELIST_HET_GROUP_); do _tsm_alloc="$_tsm_alloc,${!_tsm_v}"; done
    _tsm_here=" $(scontrol show hostnames "$_tsm_alloc" 2>/dev/null | tr '\n' ' ')"
    _tsm_exc=$_tsm_exclude
    _tsm_on_bad=
    while read -r _tsm_n _; do
      _tsm_exc="${_tsm_exc:+$_tsm_exc,}$_tsm_n"
      case $_tsm_here in *" $_tsm_n "*) _tsm_on_bad="$_tsm_on_bad $_tsm_n" ;; esac
    done <<<"$_tsm_bad"
    if [ -n "$_tsm_on_bad" ] && [ "$_tsm_moves" -ge "$_tsm_moves_cap" ]; then
      echo "this attempt was given node(s)$_tsm_on_bad, which failed under an earlier one, after $_tsm_moves_cap move(s) off failed nodes (at most max_preemptions + max_retries): Slurm does not keep the job off them (ExcNodeList=$_tsm_exc); the app fails" >"$TSM_JOB_DIR/node_error"
      echo "tsm: $(head -n 1 "$TSM_JOB_DIR/node_error")" >&2
      rm -rf -- "$TSM_JOB_DIR/secrets"  # the app is over: its secrets' files go
      echo 1 >"$TSM_JOB_DIR/exit"
      exit 1
    fi
    if [ -n "$_tsm_on_bad" ]; then
      echo "tsm: this attempt was given node(s)$_tsm_on_bad, which failed under an earlier one: requeueing without them (ExcNodeList=$_tsm_exc)" >&2
      trap '' TERM  # the requeue's SIGTERM must not end this shell before the exclusion is set
      if scontrol requeuehold "$SLURM_JOB_ID" >&2; then
        _tsm_move_off
        exit 0
      fi
      trap - TERM
    fi
  fi
fi

# -- what the wait loop (wait.sh) asks as it wakes
_tsm_timer='' _tsm_job=''
_tsm_watch='' _tsm_stalled='' _tsm_cause='' _tsm_no_requeue=''
_tsm_preempted() {  # whether Slurm is preempting the job, or has requeued this run of it already (then it
  # clears PreemptTime and counts one more restart than this run started with: the tasks it ended are not
  # this run's failure)
  _tsm_job=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null)
  _tsm_restarts=$(sed -n 's/.* Restarts=\([0-9][0-9]*\).*/\1/p' <<<"$_tsm_job" | head -n 1)
  [ -n "$_tsm_restarts" ] && [ "$_tsm_restarts" -gt "$TSM_RESTART_COUNT" ] && return 0
  case $_tsm_job in *PreemptTime=None* | '') return 1 ;; *PreemptTime=*) return 0 ;; esac
  return 1
}
_tsm_signal_run() {  # scancel --signal=$1 to every step of this run of the job. scancel retries for as long
  # as the job is in transition (being requeued): such a retry would signal the next run, so it is cut short
  timeout 5 scancel --signal="$1" "$SLURM_JOB_ID" 2>/dev/null
}
rm -f -- "$TSM_JOB_DIR/stalled"
_tsm_on_wake() {
  _tsm_on_timer
  _tsm_on_stall
}
_tsm_on_stall() {  # the stall watcher (stall_watch.py) has ended: act on the stall it found
  if [ -n "$_tsm_watch" ] && ! kill -0 "$_tsm_watch" 2>/dev/null; then
    wait "$_tsm_watch" 2>/dev/null
    _tsm_watch=
    [ -s "$TSM_JOB_DIR/stalled" ] || return 0
    _tsm_stalled=1 _tsm_cause=stalled
    # the stalled replica's role is the one that failed (its max_retries decide a restart)
    _tsm_what=$(head -n 1 "$TSM_JOB_DIR/stalled")
    for _tsm_i in "${!_tsm_role[@]}"; do
      [ "${_tsm_role[$_tsm_i]}" = "${_tsm_what%%/*}" ] && [ -z "$_tsm_failed" ] && _tsm_failed=$_tsm_i
    done
    [ "$_tsm_stall_policy" = fail ] && _tsm_no_requeue=1
    if [ -n "$_tsm_forward" ] && [ -z "$_tsm_warned" ]; then  # the warning, once, and warn_before to end
      _tsm_warned=1
      echo "tsm: stalled: SIG$_tsm_warn to every task" >&2
      _tsm_signal_run "$TSM_WARN_RELAY"
      for ((_tsm_i = 0; _tsm_i < _tsm_stall_lead * 10; _tsm_i++)); do
        _tsm_any=
        for _tsm_p in "${_tsm_pid[@]}"; do kill -0 "$_tsm_p" 2>/dev/null && _tsm_any=1; done
        [ -z "$_tsm_any" ] && break
        sleep 0.1
      done
    fi
    echo "tsm: stalled: stopping every task" >&2
    _tsm_stop_all
  fi
}
_tsm_on_timer() {  # the time limit's requeue timer is done: requeue
  if [ -n "$_tsm_timer" ] && ! kill -0 "$_tsm_timer" 2>/dev/null; then
    _tsm_timer=
    [ -f "$TSM_JOB_DIR/cancel" ] && return 0  # cancelled meanwhile: never requeue
    # the cause is written now, not at the warning: a preemption meanwhile is Slurm's requeue
    echo time_limit >"$TSM_JOB_DIR/requeue_cause"
    echo requeued >"$TSM_JOB_DIR/exit"
    scontrol requeue "$SLURM_JOB_ID" && sleep 600 # Slurm ends this run of the job now
  fi
}

# -- the warning
_tsm_warned=
_tsm_warning() {
  [ -n "$_tsm_warned" ] && return 0
  _tsm_warned=1
  _tsm_why=limit
  if [ -f "$TSM_JOB_DIR/cancel" ]; then
    _tsm_why=cancel
  else
    _tsm_preempted && _tsm_why=preemption
  fi
  if [ -n "$_tsm_forward" ]; then
    case $_tsm_why in
      cancel) echo "tsm: cancelled: SIG$_tsm_warn to every task" >&2 ;;
      preemption) echo "tsm: the job is preempted: SIG$_tsm_warn to every task" >&2 ;;
      *) echo "tsm: the time limit is near: SIG$_tsm_warn to every task" >&2 ;;
    esac
    _tsm_signal_run "$TSM_WARN_RELAY"  # each task's wrapper passes it on
  fi
  if [ -n "$_tsm_requeue_at_limit" ] && [ "$_tsm_why" = limit ] && [ "$_tsm_preemptions" -lt "$_tsm_budget" ]; then
    echo "tsm: requeueing at the time limit (preemption $((_tsm_preemptions + 1)) of $_tsm_budget)" >&2
    # Slurm may send the warning late (it checks limits periodically): requeue 5 s before the job's
    # EndTime, else _tsm_limit_lead after the warning
    _tsm_left=$_tsm_limit_lead
    _tsm_end=$(sed -n 's/.* EndTime=\([0-9][0-9T:-]*\).*/\1/p' <<<"$_tsm_job" | head -n 1)
    if [ -n "$_tsm_end" ] && _tsm_end=$(date -d "$_tsm_end" +%s 2>/dev/null); then
      _tsm_left=$((_tsm_end - $(date +%s) - 5))
      [ "$_tsm_left" -lt 0 ] && _tsm_left=0
    fi
    sleep "$_tsm_left" &
    _tsm_timer=$!
  fi
}
if [ -n "$_tsm_warn" ]; then
  trap _tsm_warning "$_tsm_warn"
  [ -n "$_tsm_early" ] && _tsm_warning  # it came before this handler was set
fi
