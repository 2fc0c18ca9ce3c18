# shellcheck shell=sh
# Delete what tsm, Slurm and the batch script wrote in a job directory, then the directories left empty:
#   sh -c "$(cat remove.sh)" tsm-rm JOB_DIR NAMES ROLE...
# NAMES (space-separated) are the job directory's own files (a folder among them loses its files, then goes
# itself); each ROLE folder loses its replicas' .stdout, .stderr and .status. Other files stay, and so do the
# folders that hold them. Prints "removed" when something was deleted.
d=$1; names=$2; shift 2
cd "$d" 2>/dev/null || exit 0
found=
for r in "$@"; do
  for f in "$r"/*.stdout "$r"/*.stderr "$r"/*.status; do
    b=${f##*/}
    case ${b%.*} in '' | *[!0-9]*) continue ;; esac  # replica k's files only: k.stdout, k.stderr, k.status
    [ -f "$f" ] && rm -f -- "$f" && found=1
  done
  rmdir -- "$r" 2>/dev/null
done
for n in $names; do
  if [ -d "$n" ] && [ ! -L "$n" ]; then  # a folder of tsm's (secrets): its files, then the folder
    for f in "$n"/* "$n"/.[!.]*; do
      { [ -f "$f" ] || [ -L "$f" ]; } && rm -f -- "$f" && found=1
    done
    rmdir -- "$n" 2>/dev/null && found=1
    continue
  fi
  [ -e "$n" ] || [ -L "$n" ] || continue
  rm -f -- "$n" && found=1
done
cd / && rmdir -- "$d" 2>/dev/null
[ -n "$found" ] && echo removed
exit 0
