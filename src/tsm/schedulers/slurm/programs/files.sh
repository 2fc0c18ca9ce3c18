# shellcheck shell=sh
# The small files of job directories, for a local mirror of them:
#   sh -c "$(cat files.sh)" tsm-files TAILS NAMES JOB_DIR...
# writes a tar (paths from /) of each JOB_DIR's files named in NAMES (space-separated) and of its replicas'
# */*.status; then, with TAILS = 1, a second tar of the last 4 KiB of every replica's .stdout/.stderr (made
# in a private temporary directory, removed after): the views' last lines.
tails=$1; names=$2; shift 2
cd / || exit 1
files=
for d in "$@"; do
  for n in $names; do
    [ -f "$d/$n" ] && files="$files
$d/$n"
  done
  for f in "$d"/*/*.status; do
    [ -f "$f" ] && files="$files
$f"
  done
done
[ -n "$files" ] && printf '%s\n' "$files" | sed -e '/^$/d' -e 's|^/||' | tar -cf - -T - 2>/dev/null
[ "$tails" = 1 ] || exit 0
t=$(mktemp -d) || exit 0
trap 'rm -rf "$t"' EXIT
for d in "$@"; do
  for f in "$d"/*/*.stdout "$d"/*/*.stderr; do
    [ -f "$f" ] && mkdir -p "$t$(dirname "$f")" && tail -c 4096 "$f" >"$t$f"
  done
done
cd "$t" && tar -cf - . 2>/dev/null
exit 0
