# shellcheck shell=sh
# Print "<job id>|<WorkDir>" of this user's jobs: squeue with every state (the controller keeps ended jobs
# MinJobAge seconds, while slurmdbd may not have them yet), then sacct for older ones. A submission whose
# connection dropped looks here for a job in its directory before it submits again.
squeue --me -h -t all -o '%i|%Z' 2>/dev/null
sacct -n -P -X -S now-2days -o JobID,WorkDir 2>/dev/null
exit 0
