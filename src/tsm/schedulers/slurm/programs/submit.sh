# shellcheck shell=sh
# Submit a job on a login node, idempotently: sh -c "$(cat submit.sh)" tsm-submit JOB_DIR TOKEN SBATCH_ARG...
# with a gzipped tar of the job directory's first files (app.json, job.sbatch, the role folders, the secrets'
# folder) on stdin.
# JOB_DIR's random name is TOKEN: a directory that holds an app under another token is refused.
# Exit codes: 127 no sbatch, 3 another app's directory, 4 unpacking failed, 5 sbatch refused the job.
umask 077
d=$1; tok=$2; shift 2
command -v sbatch >/dev/null 2>&1 || { echo "tsm: sbatch not found on the remote PATH" >&2; exit 127; }
if [ -f "$d/app.json" ] && [ "$(cat "$d/submit_token" 2>/dev/null)" != "$tok" ]; then
  echo "tsm: job_dir $d already holds an app: choose another directory" >&2; exit 3
fi
if { [ -e "$d/secrets" ] || [ -L "$d/secrets" ]; } && [ "$(cat "$d/submit_token" 2>/dev/null)" != "$tok" ]; then
  echo "tsm: job_dir $d already holds 'secrets': choose another directory" >&2; exit 3
fi
mkdir -p "$d" && cd "$d" || exit 4
printf '%s\n' "$tok" >submit_token
# the secrets' folder (when the app has secrets) comes in the stream; it goes again when no job is made
tar -xzf - || { rm -rf -- secrets; exit 4; }
out=$(sbatch "$@" job.sbatch) || { rm -rf -- secrets; printf '%s\n' "$out" >&2; exit 5; }
id=$(printf '%s\n' "$out" | tail -n 1 | cut -d';' -f1)
printf '%s\n' "$id" >job_id
printf '%s\n' "$id"
