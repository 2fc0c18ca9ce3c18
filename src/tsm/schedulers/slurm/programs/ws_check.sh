# shellcheck shell=sh
# What a workspace store lacks: sh -c "$(cat ws_check.sh)" tsm-ws STORE DIGEST NAMES prints have-snapshot when
# STORE holds the snapshot DIGEST, else, with NAMES = 1, the names of the objects (read on stdin, one a line)
# the store lacks.
store=$1; digest=$2; names=$3
if [ -d "$store/snapshots/$digest" ]; then echo have-snapshot; exit 0; fi
[ "$names" = 1 ] || exit 0
while IFS= read -r o; do [ -f "$store/$o" ] || printf '%s\n' "$o"; done
exit 0
