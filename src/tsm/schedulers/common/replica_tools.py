"""``tsm exec`` and ``tsm stack`` on the node of a replica: run there in Python, from its source text.

    python -c "$prog" exec APP_ID ROLE K CMD...       # CMD in replica ROLE/K's cwd and environment
    python -c "$prog" dump APP_ID ROLE K NATIVE PYSPY  # py-spy of each Python process of it, as JSON

Slurm runs it in a step overlapping the job on the replica's node (``srun --overlap``), Ray on this machine
when the replica's node is this machine (:func:`source` is the text they run).

A replica's processes on this node are those whose environment (``/proc/PID/environ``, what they were started
with) holds its ``TSM_APP_ID``, ``TSM_ROLE_NAME`` and ``TSM_REPLICA_ID``; the oldest is its root. ``exec``
takes that process's working directory and environment and becomes CMD (verbatim: no shell); ``dump`` prints
``[{"pid", "cmdline", "code", "out", "err"}, ...]``. Exit 3 with one line when no process of the replica is
on this node. tsm need not be installed here: the standard library only, syntax any Python 3 reads.
"""

import json
import os
import subprocess
import sys


def source() -> str:
    """This program's text, for ``python -c`` where the replica runs."""
    with open(__file__, encoding="utf-8") as f:
        return f.read()


def replica_processes(app_id: str, role: str, k: str) -> "list[tuple[int, int, list[bytes], str, str]]":
    """``[(start ticks, pid, env, exe, cmdline)]`` of this user's processes of the replica, oldest first."""
    want = {b"TSM_APP_ID=" + app_id.encode(), b"TSM_ROLE_NAME=" + role.encode(), b"TSM_REPLICA_ID=" + k.encode()}
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if not want.issubset(env):
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            start = int(stat[stat.rindex(b")") + 2 :].split()[19])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
            exe = os.readlink(f"/proc/{name}/exe")
        except (OSError, ValueError, IndexError):
            continue
        out.append((start, int(name), env, exe, cmdline))
    out.sort()
    return out


def main(argv: "list[str]") -> int:
    mode, app_id, role, k = argv[:4]
    procs = replica_processes(app_id, role, k)
    if not procs:
        sys.stderr.write(f"no process of replica {role}/{k} of {app_id} on {os.uname()[1]}\n")
        return 3
    if mode == "exec":
        _, pid, raw, _, _ = procs[0]
        env = {}
        for kv in raw:
            key, sep, value = kv.partition(b"=")
            if sep:
                env[os.fsdecode(key)] = os.fsdecode(value)
        os.chdir(os.readlink(f"/proc/{pid}/cwd"))
        cmd = argv[4:]
        try:
            os.execvpe(cmd[0], cmd, env)
            return 126  # not reached: exec replaced this process
        except OSError as e:
            sys.stderr.write(f"tsm exec: {cmd[0]}: {e.strerror}\n")
            return 127 if isinstance(e, FileNotFoundError) else 126
    native, pyspy = argv[4] == "1", argv[5]
    rows = []
    for _, pid, _, exe, cmdline in procs:
        base = os.path.basename(exe)
        if not base.startswith(("python", "pypy")):
            continue
        cmd = [pyspy, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=30)
            code, so, se = r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        except FileNotFoundError:
            code, so, se = 127, "", "py-spy: not found"
        except subprocess.TimeoutExpired:
            code, so, se = 1, "", "py-spy took longer than 30 s"
        rows.append({"pid": pid, "cmdline": cmdline, "code": code, "out": so, "err": se})
    sys.stdout.write(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
