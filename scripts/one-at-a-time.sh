# Sourced by a bring-up script, `. "$(dirname "$0")/one-at-a-time.sh" NAME "$@"`: one bring-up of NAME at a time.
# A second caller (a test run beside this one, another user's tests) waits here for the first, then finds the
# engine up. flock -o holds the lock in a process of its own, so the daemons the script starts never inherit it.
_lock_name=$1
shift
_lock_var=ONE_AT_A_TIME_${_lock_name//-/_}
if [ "${!_lock_var:-}" != 1 ]; then
  mkdir -p /run/lock
  export "$_lock_var=1"
  exec flock -o "/run/lock/tsm-$_lock_name-up.lock" bash "$0" "$@"
fi
unset _lock_name _lock_var

# apt_get ARGS: apt-get, one at a time across the bring-up scripts (they run side by side: make engines-bg beside
# make k8s-build-bg). apt's own wait (DPkg::Lock::Timeout) covers dpkg's lock, not the lists lock that
# `apt-get update` takes: a second update beside the first fails at once ("Could not get lock
# /var/lib/apt/lists/lock"), as a fresh machine's Kubernetes build did.
apt_get() {
  mkdir -p /run/lock
  flock -w 1800 /run/lock/tsm-apt.lock apt-get -o DPkg::Lock::Timeout=600 "$@"
}
