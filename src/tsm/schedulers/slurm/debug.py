"""Looking inside a live Slurm replica: ``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on its node.

``exec`` and ``stack`` run a step that overlaps the app's job on the replica's node
(``srun --overlap --jobid=JOB [--het-group=I] -w NODE``), from this machine or, for an app submitted with
``-c ssh=``, from the login node over the same SSH connection. The step runs
:mod:`tsm.schedulers.common.replica_tools` in Python there, which finds the replica's processes by their
``TSM_*`` environment and either becomes the command in the replica's working directory and environment
(``exec``) or runs py-spy on each Python process (``stack``: py-spy must be installed where the replicas run, ``pip install 'tsm[debug]'`` in their
environment). ``port-forward`` connects to the node's address (``NodeAddr``) from this machine, or, for a
remote cluster, through a small relay the login node's Python runs over the SSH connection (one per local
connection; the SSH server need not allow port forwarding).
"""

from __future__ import annotations

import abc
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tsm.errors import ReplicaNotRunningError
from tsm.schedulers.api import (
    ReplicaExec,
    ReplicaPorts,
    ReplicaStack,
    ReplicaStacks,
    each_stack,
)
from tsm.schedulers.common import pyspy

if TYPE_CHECKING:
    from tsm.schedulers.api import DescribeAppResponse
    from tsm.schedulers.slurm.host import Where

#: srun's own line for a task's non-zero exit: the code is passed back, so the line is not shown.
_SRUN_EXIT = re.compile(r"^srun: error: \S+: task \d+: Exited with exit code \d+$")


#: Run on the login node by ``port-forward`` over SSH: one TCP connection to ``ADDR PORT`` relayed to its
#: stdin and stdout (so the SSH server need not allow port forwarding).
_RELAY = """
import socket, sys, threading
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.settimeout(None)
def up():
    while True:
        data = sys.stdin.buffer.read1(65536)
        if not data:
            break
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


class SlurmDebug(ReplicaExec, ReplicaStacks, ReplicaPorts):
    """The Slurm scheduler's exec, stack and port-forward (mixed into :class:`SlurmScheduler`)."""

    __slots__ = ()

    # What the scheduler gives the mixin: abstract, so a name that does not match fails at construction.
    @abc.abstractmethod
    def where(self, app_id: str) -> Where | None: ...

    @abc.abstractmethod
    def describe(self, app_id: str, max_age: float = 1.0) -> DescribeAppResponse | None: ...

    def _step(self, app_id: str, role: str, k: int, tools: list[str], tty: bool = False) -> tuple[list[str], Where]:
        """The command line (here) of an overlapping step on replica ``role``/``k``'s node running the tools."""
        where, desc = self.where(app_id), self.describe(app_id, max_age=0)
        if where is None or desc is None or desc.app is None:
            raise ReplicaNotRunningError(f"no Slurm job of {app_id} to reach", scheduler="slurm")
        names = [r.name for r in desc.app.roles]
        node = next((r.hostname for rs in desc.roles_statuses if rs.role == role for r in rs.replicas if r.id == k), "")
        if not node:
            raise ReplicaNotRunningError(f"replica {role}/{k} of {app_id} has no node yet", scheduler="slurm")
        python = where.host.python() or (sys.executable if _is_local(where) else "python3")
        from tsm.schedulers.common.replica_tools import source

        srun = ["srun", "--overlap", f"--jobid={where.job_id}", *([f"--het-group={names.index(role)}"] if len(names) > 1
                else []), "-w", node, "-N1", "-n1", "--quiet", *(["--pty"] if tty else []),
                python, "-c", source(), *tools]
        if _is_local(where):
            return srun, where
        from tsm.schedulers.common.ssh import quote_command

        conn: Any = getattr(where.host, "conn")  # noqa: B009 - an SSH host's connection
        argv = conn.ssh_args(quote_command(srun))
        return (["-tt" if a == "-T" and tty else a for a in argv]), where

    # -- exec ----------------------------------------------------------------------------------------
    def exec_in_replica(self, app_id: str, role: str, k: int, cmd: Sequence[str], tty: bool = False,
                        stdin: bool = False) -> int:
        from tsm.schedulers.common.terminal import returncode

        argv, _ = self._step(app_id, role, k, ["exec", _tsm_app_id(app_id), role, str(k), *cmd], tty)
        if tty:
            return returncode(subprocess.call(argv))
        proc = subprocess.Popen(argv, stdin=None if stdin else subprocess.DEVNULL, stderr=subprocess.PIPE)
        t = threading.Thread(target=_filter_stderr, args=(proc.stderr,), daemon=True)
        t.start()
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            code = proc.wait()
        t.join()
        return returncode(code)

    # -- stack ---------------------------------------------------------------------------------------
    def replica_stacks(self, app_id: str, replicas: Sequence[tuple[str, int]], native: bool = False) -> list[ReplicaStack]:
        return each_stack(replicas, lambda st: self._stack_one(app_id, st, native),
                          errors=(OSError, subprocess.SubprocessError))

    def _stack_one(self, app_id: str, stack: ReplicaStack, native: bool) -> None:
        where = self.where(app_id)
        exe = (pyspy.local_pyspy() or "py-spy") if where is not None and _is_local(where) else "py-spy"
        argv, _ = self._step(app_id, stack.role, stack.k,
                             ["dump", _tsm_app_id(app_id), stack.role, str(stack.k), "1" if native else "0", exe])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not _SRUN_EXIT.match(ln)]
            stack.error = lines[-1] if lines else f"srun failed (exit {r.returncode})"
            return
        stack.take_dump(r.stdout)

    # -- port-forward --------------------------------------------------------------------------------
    def connect_replica_port(self, app_id: str, role: str, k: int, port: int) -> socket.socket:
        _, where = self._step(app_id, role, k, [])
        desc = self.describe(app_id, max_age=0)
        node = next(r.hostname for rs in (desc.roles_statuses if desc else []) if rs.role == role
                    for r in rs.replicas if r.id == k)
        addr = _node_addr(where, node)
        if _is_local(where):
            return socket.create_connection((addr, port), timeout=10)
        from tsm.schedulers.common.ssh import quote_command

        conn: Any = getattr(where.host, "conn")  # noqa: B009 - an SSH host's connection
        python = where.host.python() or "python3"
        argv = conn.ssh_args(quote_command([python, "-c", _RELAY, addr, str(port)]))
        mine, theirs = socket.socketpair()
        relay = subprocess.Popen(argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=subprocess.DEVNULL,
                                 close_fds=True)
        theirs.close()
        threading.Thread(target=relay.wait, daemon=True).start()  # reaped when the connection ends
        return mine


def _is_local(where: Where) -> bool:
    from tsm.schedulers.slurm.host import LocalHost

    return isinstance(where.host, LocalHost)


def _tsm_app_id(app_id: str) -> str:
    """The ``TSM_APP_ID`` the replicas see: the job id (the part after a remote app id's host slug)."""
    return app_id.rsplit("-", 1)[-1]


def _node_addr(where: Where, node: str) -> str:
    """The address Slurm knows node ``node`` by (``NodeAddr``), else its name."""
    proc = where.host.run(["scontrol", "show", "node", node], timeout=30)
    m = re.search(r"\bNodeAddr=(\S+)", proc.stdout)
    return m.group(1) if m else node


def _filter_stderr(stream: Any) -> None:
    """Copy the step's stderr to ours, all but srun's line about the exit code (which is passed back)."""
    for line in iter(stream.readline, b""):
        if not _SRUN_EXIT.match(line.decode(errors="replace").rstrip("\n")):
            os.write(2, line)
    stream.close()
