# shellcheck shell=sh
# The warning of a cancel: sh -c "$(cat warn.sh)" tsm-warn JOB_DIR MARK SIGNAL JOB_ID writes the cancel mark
# JOB_DIR/MARK (so the batch shell takes the warning for a cancel's), then sends SIGNAL to the job's batch
# shell, which passes it on to every task. When the signal cannot be sent (the job ended meanwhile) the mark
# is taken back and the exit code is 1.
umask 077
printf "cancel\n" >"$1/$2" || exit 1
scancel --batch --signal="$3" "$4" || { rm -f -- "$1/$2"; exit 1; }
