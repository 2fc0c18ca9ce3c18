# shellcheck shell=bash disable=SC2154
# The batch script's last part (after one background srun per role): wait for every role, stop the others
# when one fails, requeue while the failed role has retries left, record the exit code in $TSM_JOB_DIR/exit
# (removing the secrets' folder first when no attempt follows).
# Set before it (the script's own, generated part and longrun.sh): the arrays _tsm_pid, _tsm_role and
# _tsm_retries (one entry per role), _tsm_failures, _tsm_timer, _tsm_watch, _tsm_stalled, _tsm_cause,
# _tsm_no_requeue, and the functions _tsm_preempted, _tsm_signal_run and _tsm_on_wake.
_tsm_failed=
_tsm_grace=
_tsm_preempting=
_tsm_stop_all() {
  # the mark first: a task that dies of the SIGTERM before its wrapper gets its own (Slurm signals a step's
  # processes one at a time) is told apart from one that failed by itself; then SIGTERM to every step of
  # every role (not to this script); after the grace period a SIGTERM to each srun still running makes it
  # kill its step outright
  echo "$TSM_ATTEMPT" >"$TSM_JOB_DIR/stopping"
  _tsm_signal_run TERM
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
  rm -rf -- "$TSM_JOB_DIR/secrets"  # the app is over: its secrets' files go (only a requeue keeps them)
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
rm -rf -- "$TSM_JOB_DIR/secrets"
echo "$_tsm_code" >"$TSM_JOB_DIR/exit"
exit "$_tsm_code"
