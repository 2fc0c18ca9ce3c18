"""Looking inside a live Ray replica: ``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on its node.

A replica is a process the replica actor started on some node of the cluster; Ray reports that node's IP.
tsm talks to Ray through its HTTP APIs only (no Ray client in the command line), and those have no way to
run a command on a chosen node and relay a terminal to it, so:

* **exec** and **stack** work when the replica's node is this machine (a single-host cluster, or tsm run on
  the node): :mod:`tsm.schedulers.common.replica_tools` finds the replica's processes by their ``TSM_*``
  environment, as on a Slurm node, and either becomes the command in the replica's working directory and
  environment or runs py-spy on each of its Python processes. On another node they say so in one line
  (run ``tsm exec``/``tsm stack`` on that node: the handle works there too, through the same head).
* **port-forward** connects to the port on the replica's node IP from this machine, wherever it is.
"""

from __future__ import annotations

import abc
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tsm.errors import NotSupportedError, ReplicaNotRunningError
from tsm.schedulers.api import (
    ReplicaExec,
    ReplicaPorts,
    ReplicaStack,
    ReplicaStacks,
    each_stack,
)

if TYPE_CHECKING:
    from tsm.schedulers.api import DescribeAppResponse


def is_this_machine(ip: str) -> bool:
    """Whether ``ip`` is an address of this machine (a socket can be bound to it)."""
    try:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


class RayDebug(ReplicaExec, ReplicaStacks, ReplicaPorts):
    """The Ray scheduler's exec, stack and port-forward (mixed into :class:`RayScheduler`)."""

    __slots__ = ()

    # What the scheduler gives the mixin: abstract, so a name that does not match fails at construction.
    @abc.abstractmethod
    def describe(self, app_id: str) -> DescribeAppResponse | None: ...

    def _node_ip(self, app_id: str, role: str, k: int) -> str:
        desc = self.describe(app_id)
        for rs in desc.roles_statuses if desc is not None else []:
            for rep in rs.replicas:
                if rs.role == role and rep.id == k and rep.hostname:
                    return rep.hostname
        raise ReplicaNotRunningError(f"replica {role}/{k} of {app_id} has no node yet", scheduler="ray")

    def _tools(self, app_id: str, role: str, k: int, what: str) -> list[str]:
        """The command that runs the replica tools here, or NotSupportedError when the replica is elsewhere."""
        from tsm.schedulers.common.replica_tools import source

        ip = self._node_ip(app_id, role, k)
        if not is_this_machine(ip):
            raise NotSupportedError(f"replica {role}/{k} runs on node {ip}, not this machine: run tsm {what} on "
                                    "that node (the handle works there too)", scheduler="ray")
        return [sys.executable, "-I", "-c", source()]

    def exec_in_replica(self, app_id: str, role: str, k: int, cmd: Sequence[str], tty: bool = False,
                        stdin: bool = False) -> int:
        import os

        from tsm.schedulers.common.terminal import returncode, run_in_pty

        argv = [*self._tools(app_id, role, k, "exec"), "exec", app_id, role, str(k), *cmd]
        if tty:
            return run_in_pty(argv, dict(os.environ), None)
        proc = subprocess.Popen(argv, stdin=None if stdin else subprocess.DEVNULL)
        try:
            return returncode(proc.wait())
        except KeyboardInterrupt:
            return returncode(proc.wait())

    def replica_stacks(self, app_id: str, replicas: Sequence[tuple[str, int]], native: bool = False) -> list[ReplicaStack]:
        return each_stack(replicas, lambda st: self._stack_one(app_id, st, native), errors=(NotSupportedError,))

    def _stack_one(self, app_id: str, stack: ReplicaStack, native: bool) -> None:
        from tsm.schedulers.common import pyspy

        argv = self._tools(app_id, stack.role, stack.k, "stack")
        exe = pyspy.local_pyspy()
        if exe is None:
            stack.error = f"py-spy is not installed: {pyspy.INSTALL_HINT}"
            return
        r = subprocess.run([*argv, "dump", app_id, stack.role, str(stack.k), "1" if native else "0", exe],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            stack.error = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            return
        stack.take_dump(r.stdout)

    def connect_replica_port(self, app_id: str, role: str, k: int, port: int) -> socket.socket:
        return socket.create_connection((self._node_ip(app_id, role, k), port), timeout=10)
