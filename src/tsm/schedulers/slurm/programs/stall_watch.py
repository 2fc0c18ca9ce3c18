"""The stall watcher the batch shell starts beside the sruns when the app has a ``stall_timeout``.

Run in the replicas' python on the batch node, as the batch script holds it
(:func:`tsm.schedulers.slurm.programs.bundle` inlines the one import below)::

    python -c "$_tsm_watcher" JOB_DIR ATTEMPT TIMEOUT TICK QUOTE_MAX PREFIX SILENT ROLE:N...

Once per TICK it reads every replica's log sizes (the job directory is shared) and, in one pass over
``/proc``, the CPU time of this node's processes of each replica (found by the ``TSM_JOB_DIR``,
``TSM_ROLE_NAME`` and ``TSM_REPLICA_ID`` in their environment; replicas on other nodes are judged by their
logs alone). A replica running in attempt ATTEMPT whose fingerprint did not change for TIMEOUT seconds is
stalled: the watcher writes ``<role>/<k> <why>`` to ``JOB_DIR/stalled`` (``why`` is PREFIX followed by the
quoted last line, cut to QUOTE_MAX characters, or SILENT when the replica wrote nothing), says it on stderr
and exits, which wakes the batch shell. tsm need not be installed there: this file imports only the
standard library and keeps to syntax any Python 3 reads.
"""

import os
import sys
import time

from tsm.schedulers.common.lastline import last_line  # bundled

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


def cpu_times(job_dir: str) -> "dict[tuple[str, str], int]":
    """(role, replica id) -> CPU ticks of this node's processes of the job in ``job_dir``."""
    mine = ("TSM_JOB_DIR=" + job_dir).encode()
    out: dict[tuple[str, str], int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if mine not in env:
                continue
            role = rid = None
            for kv in env:
                if kv.startswith(b"TSM_ROLE_NAME="):
                    role = kv[14:].decode(errors="replace")
                elif kv.startswith(b"TSM_REPLICA_ID="):
                    rid = kv[15:].decode(errors="replace")
            if role is None or rid is None:
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            out[(role, rid)] = out.get((role, rid), 0) + int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return out


def size(path: str) -> int:
    """The file's size, or -1 when it is not there."""
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def running_in(base: str, attempt: str) -> bool:
    """Whether the replica whose files start with ``base`` runs in ``attempt`` (its ``.status`` says so)."""
    try:
        with open(base + ".status") as f:
            words = f.read().split()
    except OSError:
        return False
    return words[:1] == ["running"] and words[3:4] == [attempt]


def watch(
    job_dir: str, attempt: str, timeout: float, tick: float, roles: "Sequence[tuple[str, int]]"
) -> "tuple[str, int]":
    """Look once per ``tick`` until a replica of ``roles`` made no progress for ``timeout``; return it."""
    seen: dict[tuple[str, int], tuple[int, int, int | None]] = {}
    since: dict[tuple[str, int], float] = {}
    while True:
        now, used = time.monotonic(), cpu_times(job_dir)
        for role, n in roles:
            for k in range(n):
                base = os.path.join(job_dir, role, str(k))
                if not running_in(base, attempt):
                    since.pop((role, k), None)
                    continue
                mark = (size(base + ".stdout"), size(base + ".stderr"), used.get((role, str(k))))
                if seen.get((role, k)) != mark or (role, k) not in since:
                    seen[(role, k)], since[(role, k)] = mark, now
                    continue
                if now - since[(role, k)] >= timeout:
                    return role, k
        time.sleep(tick)


def main(argv: "Sequence[str]") -> int:
    """The command line of the module docstring."""
    job_dir, attempt, timeout, tick = argv[0], argv[1], float(argv[2]), float(argv[3])
    quote_max, prefix, silent = int(argv[4]), argv[5], argv[6]
    roles = [(spec.rsplit(":", 1)[0], int(spec.rsplit(":", 1)[1])) for spec in argv[7:]]
    role, k = watch(job_dir, attempt, timeout, tick, roles)
    base = os.path.join(job_dir, role, str(k))
    line = last_line((base + ".stdout", base + ".stderr"))
    why = (prefix + repr(line[:quote_max])) if line else silent
    with open(os.path.join(job_dir, "stalled"), "w") as f:
        f.write(f"{role}/{k} {why}\n")
    print(f"tsm: replica {role}/{k} {why}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
