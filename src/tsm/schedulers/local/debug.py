"""Looking inside a live local replica: ``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on this machine.

A replica is a process group led by the process the supervisor started (its pid is in the store, with its
start time, so a reused pid is never mistaken for it). What ``exec`` gives a command is read from that very
process: its working directory (``/proc/PID/cwd``) and the environment it was started with
(``/proc/PID/environ``: the ``TSM_*`` variables, its ports, its GPUs), so nothing is recomputed and nothing
can differ. Those files are readable only by the replica's user, which is the rule: only what the app's
owner could reach anyway. ``stack`` dumps every Python process of the replica's session (its group, and
children that made groups of their own) with py-spy; ``port-forward`` connects to the port on loopback.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tsm.errors import ReplicaNotRunningError, SchedulerUnavailableError
from tsm.schedulers.api import ProcessStack, ReplicaExec, ReplicaPorts, ReplicaStack, ReplicaStacks
from tsm.schedulers.local import _os

if TYPE_CHECKING:  # imported where used: ``tsm status`` loads this module and never opens a socket
    import socket

#: Most py-spy processes run at once for one ``tsm stack`` (each is short and mostly waits on ptrace).
DUMP_PARALLEL = 8

#: Seconds one py-spy dump may take before it is abandoned (a process stopped under a debugger).
DUMP_TIMEOUT = 30.0


class LocalDebug(ReplicaExec, ReplicaStacks, ReplicaPorts):
    """The local scheduler's exec, stack and port-forward (mixed into :class:`LocalScheduler`)."""

    __slots__ = ()

    store: Any

    # -- which process -------------------------------------------------------------------------------
    def _replica_pid(self, app_id: str, role: str, k: int) -> int:
        """The live leader of replica ``role``/``k``, else :class:`ReplicaNotRunningError` saying why not."""
        rows = self.store.query("SELECT pid, pid_start, state FROM local_replicas WHERE app_id=? AND role=? AND idx=?",
                                (app_id, role, k))
        if not rows or rows[0]["pid"] is None:
            raise ReplicaNotRunningError(f"replica {role}/{k} of {app_id} has not started yet; try again once "
                                         "`tsm status` shows it RUNNING")
        pid = int(rows[0]["pid"])
        if not _os.is_alive(pid, rows[0]["pid_start"]):
            raise ReplicaNotRunningError(f"replica {role}/{k} of {app_id} is not running (its process ended)")
        return pid

    @staticmethod
    def _place(pid: int) -> tuple[dict[str, str], str]:
        """The environment ``pid`` was started with and its working directory."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except FileNotFoundError:
            raise ReplicaNotRunningError(f"the replica's process {pid} ended") from None
        env: dict[str, str] = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep:
                env[os.fsdecode(key)] = os.fsdecode(value)
        return env, cwd

    # -- exec ----------------------------------------------------------------------------------------
    def exec_in_replica(self, app_id: str, role: str, k: int, cmd: Sequence[str], tty: bool = False,
                        stdin: bool = False) -> int:
        import subprocess

        from tsm.schedulers.common.terminal import returncode, run_in_pty

        env, cwd = self._place(self._replica_pid(app_id, role, k))
        if tty:
            return run_in_pty(cmd, env, cwd)
        try:
            proc = subprocess.Popen(list(cmd), env=env, cwd=cwd, stdin=None if stdin else subprocess.DEVNULL)
        except FileNotFoundError:
            return _cannot_start(cmd[0], "command not found", 127)
        except PermissionError:
            return _cannot_start(cmd[0], "permission denied", 126)
        try:
            return returncode(proc.wait())
        except KeyboardInterrupt:  # Ctrl-C reached the command too (one process group): let it end first
            return returncode(proc.wait())

    # -- stack ---------------------------------------------------------------------------------------
    def replica_stacks(self, app_id: str, replicas: Sequence[tuple[str, int]], native: bool = False) -> list[ReplicaStack]:
        from concurrent.futures import ThreadPoolExecutor

        from tsm.schedulers.common import pyspy

        exe = pyspy.local_pyspy()
        if exe is None:
            raise SchedulerUnavailableError(f"py-spy is not installed: {pyspy.INSTALL_HINT}", scheduler="local")
        out: list[ReplicaStack] = []
        jobs: list[tuple[ReplicaStack, int, str]] = []
        leaders: dict[int, ReplicaStack] = {}
        for role, k in replicas:
            stack = ReplicaStack(role, k)
            out.append(stack)
            try:
                leaders[self._replica_pid(app_id, role, k)] = stack
            except ReplicaNotRunningError as e:
                stack.error = str(e)
        for leader, procs in python_processes(list(leaders)).items():
            jobs += [(leaders[leader], pid, cmdline) for pid, cmdline in procs]
        with ThreadPoolExecutor(max_workers=max(1, min(DUMP_PARALLEL, len(jobs)))) as pool:
            results = list(pool.map(lambda job: _dump(exe, job[1], native), jobs))
        by_replica: dict[int, list[tuple[int, str, int, str, str]]] = {}
        for (stack, pid, cmdline), (code, so, se) in zip(jobs, results, strict=True):
            by_replica.setdefault(id(stack), []).append((pid, cmdline, code, so, se))
        for stack in out:
            if stack.error:
                continue
            dumped, why = pyspy.join_processes(by_replica.get(id(stack), []))
            stack.processes = [ProcessStack(pid, cmdline, threads) for pid, cmdline, threads in dumped]
            stack.error = why or ("" if dumped else "no Python process in this replica")
        return out

    # -- port-forward --------------------------------------------------------------------------------
    def connect_replica_port(self, app_id: str, role: str, k: int, port: int) -> socket.socket:
        import socket

        self._replica_pid(app_id, role, k)
        return socket.create_connection(("localhost", port), timeout=10)


def _cannot_start(name: str, why: str, code: int) -> int:
    import sys

    sys.stderr.write(f"tsm exec: {name}: {why}\n")
    return code


def python_processes(leaders: Sequence[int]) -> dict[int, list[tuple[int, str]]]:
    """``{leader: [(pid, command line), ...]}``: every live Python process of each replica led by one of
    ``leaders`` (its process group and session, and its descendants, which may have left both), leader first.
    One pass over ``/proc`` for all of them."""
    from tsm.schedulers.common import pyspy

    stats: dict[int, tuple[int, int, int]] = {}  # pid -> (parent, group, session)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2 :].split()
            if fields[0] != b"Z":
                stats[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
        except (OSError, ValueError, IndexError):
            continue
    wanted = set(leaders)

    def owner(pid: int) -> int | None:
        seen = 0
        while pid in stats and seen < 4096:
            parent, group, session = stats[pid]
            for x in (pid, group, session):
                if x in wanted:
                    return x
            pid, seen = parent, seen + 1
        return None

    out: dict[int, list[tuple[int, str]]] = {leader: [] for leader in leaders}
    for pid in sorted(stats, key=lambda p: (p not in wanted, p)):
        leader = owner(pid)
        if leader is None:
            continue
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = " ".join(os.fsdecode(a) for a in f.read().split(b"\0") if a)
            maps = "" if pyspy.is_python(exe) else _read(f"/proc/{pid}/maps")
        except OSError:
            continue
        if pyspy.is_python(exe, maps):
            out[leader].append((pid, cmdline))
    return out


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read(1 << 20)


def _dump(exe: str, pid: int, native: bool) -> tuple[int, str, str]:
    import subprocess

    from tsm.schedulers.common import pyspy

    try:
        r = subprocess.run(pyspy.dump_argv(pid, native, exe), capture_output=True, text=True,
                           timeout=DUMP_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 1, "", f"py-spy took longer than {DUMP_TIMEOUT:.0f} s"
    return r.returncode, r.stdout, r.stderr
