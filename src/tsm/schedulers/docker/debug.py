"""Looking inside a live Docker replica: ``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on its container.

* **exec** is Docker's own exec (the SDK's ``exec_create``/``exec_start`` on the hijacked connection): the
  command runs in the replica's container with the environment, working directory and user it was created
  with (``TSM_*`` included); its output is demultiplexed onto this process's stdout and stderr (or, with a
  terminal, relayed raw), stdin relayed when asked, and the exit code is the exec's.
* **stack** lists the container's Python processes from its ``/proc`` (a ``sh`` loop: the image needs a
  ``sh``) and runs py-spy inside the container on each: the image's own ``py-spy`` when it has one, else
  this host's (a static binary) copied once into the container's ``/tmp``. The container's own ptrace rules
  apply: without permission, one line says to add ``SYS_PTRACE``.
* **port-forward** connects to the container's address on its network, which this host reaches when the
  engine runs here (the usual case; an engine on another host is refused by the connection).
"""

from __future__ import annotations

import abc
import contextlib
import os
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tsm.errors import ReplicaNotRunningError, SchedulerError
from tsm.schedulers.api import (
    ProcessStack,
    ReplicaExec,
    ReplicaPorts,
    ReplicaStack,
    ReplicaStacks,
    each_stack,
)
from tsm.schedulers.common import pyspy
from tsm.schedulers.common.pyspy import LIST_PYTHONS, PYSPY_IN_CONTAINER, parse_listing

if TYPE_CHECKING:
    from tsm.schedulers.docker.client import DockerClient

class DockerDebug(ReplicaExec, ReplicaStacks, ReplicaPorts):
    """The Docker scheduler's exec, stack and port-forward (mixed into :class:`DockerScheduler`)."""

    __slots__ = ()

    # What the scheduler gives the mixin: abstract, so a name that does not match fails at construction.
    @property
    @abc.abstractmethod
    def client(self) -> DockerClient: ...

    def _container(self, app_id: str, role: str, k: int) -> str:
        """The id of replica ``role``/``k``'s running container (its newest attempt)."""
        live = [c for c in self.client.list_containers(app_id) if c.role == role and c.replica_id == k]
        running = sorted((c for c in live if c.state == "running"), key=lambda c: c.attempt)
        if running:
            return running[-1].id
        if live:
            raise ReplicaNotRunningError(f"replica {role}/{k} of {app_id} is not running (its container is "
                                         f"{max(live, key=lambda c: c.attempt).state})", scheduler="docker")
        raise ReplicaNotRunningError(f"replica {role}/{k} of {app_id} has no container yet", scheduler="docker")

    def _low(self) -> Any:
        return self.client.api.api

    # -- exec ----------------------------------------------------------------------------------------
    def exec_in_replica(self, app_id: str, role: str, k: int, cmd: Sequence[str], tty: bool = False,
                        stdin: bool = False) -> int:
        from tsm.schedulers.common.terminal import raw_stdin

        cid = self._container(app_id, role, k)
        low = self._low()
        with self.client.call("exec"):
            ex = low.exec_create(cid, list(cmd), stdin=stdin or tty, tty=tty)
            conn = low.exec_start(ex["Id"], socket=True, tty=tty)
        sock: socket.socket = getattr(conn, "_sock", conn)
        try:
            if tty and os.isatty(0):
                with contextlib.suppress(Exception):
                    size = os.get_terminal_size(0)
                    low.exec_resize(ex["Id"], height=size.lines, width=size.columns)
            with raw_stdin(0) if tty else contextlib.nullcontext():
                _relay(sock, multiplexed=not tty, stdin=stdin or tty)
        finally:
            sock.close()
        with self.client.call("exec inspect"):
            code = low.exec_inspect(ex["Id"]).get("ExitCode")
        return int(code) if code is not None else 1

    def _run(self, cid: str, argv: list[str]) -> tuple[int, str, str]:
        """Run ``argv`` in the container to its end; ``(exit code, stdout, stderr)``."""
        low = self._low()
        with self.client.call("exec"):
            ex = low.exec_create(cid, argv)
            out, err = low.exec_start(ex["Id"], demux=True)
            code = low.exec_inspect(ex["Id"]).get("ExitCode")
        return (int(code) if code is not None else 1), _text(out), _text(err)

    # -- stack ---------------------------------------------------------------------------------------
    def replica_stacks(self, app_id: str, replicas: Sequence[tuple[str, int]], native: bool = False) -> list[ReplicaStack]:
        return each_stack(replicas, lambda st: self._stack_one(self._container(app_id, st.role, st.k), st, native))

    def _stack_one(self, cid: str, stack: ReplicaStack, native: bool) -> None:
        code, listing, err = self._run(cid, ["sh", "-c", LIST_PYTHONS])
        if code != 0:
            stack.error = f"could not list the container's processes (it needs a sh): {err.strip()[:200]}"
            return
        procs = parse_listing(listing)
        if not procs:
            stack.error = "no Python process in this replica's container"
            return
        exe, why = self._pyspy_in(cid)
        if exe is None:
            stack.error = why
            return
        rows = [(pid, cmdline, *self._run(cid, pyspy.dump_argv(pid, native, exe))) for pid, cmdline in procs]
        dumped, why = pyspy.join_processes(rows)
        stack.processes = [ProcessStack(pid, cmdline, threads) for pid, cmdline, threads in dumped]
        stack.error = why

    def _pyspy_in(self, cid: str) -> tuple[str | None, str]:
        """A py-spy the container can run (its own, or this host's copied in), or None and why not."""
        for exe in ("py-spy", PYSPY_IN_CONTAINER):
            with contextlib.suppress(SchedulerError):
                if self._run(cid, [exe, "--version"])[0] == 0:
                    return exe, ""
        local = pyspy.local_pyspy()
        if local is None:
            return None, f"py-spy is not installed in the image nor here: {pyspy.INSTALL_HINT}"
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(local, arcname=os.path.basename(PYSPY_IN_CONTAINER))
        with self.client.call("copy py-spy"):
            self._low().put_archive(cid, os.path.dirname(PYSPY_IN_CONTAINER), buf.getvalue())
        code, _, err = self._run(cid, [PYSPY_IN_CONTAINER, "--version"])
        if code != 0:
            return None, f"this host's py-spy does not run in the container ({err.strip()[:120]}): {pyspy.INSTALL_HINT}"
        return PYSPY_IN_CONTAINER, ""

    # -- port-forward --------------------------------------------------------------------------------
    def connect_replica_port(self, app_id: str, role: str, k: int, port: int) -> socket.socket:
        cid = self._container(app_id, role, k)
        with self.client.call("inspect"):
            nets = (self._low().inspect_container(cid).get("NetworkSettings") or {}).get("Networks") or {}
        addrs = [n.get("IPAddress") for n in nets.values() if n.get("IPAddress")]
        if not addrs:
            raise ConnectionError(f"the container of {role}/{k} has no network address")
        return socket.create_connection((addrs[0], port), timeout=10)


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


def _relay(sock: socket.socket, multiplexed: bool, stdin: bool) -> None:
    """Copy the exec's output to fds 1 and 2 (Docker's 8-byte frame headers read when ``multiplexed``) and,
    with ``stdin``, fd 0 to the exec, until the exec closes its side."""
    import select
    import struct

    watch: list[Any] = [sock, 0] if stdin else [sock]
    pending = b""
    while True:
        ready, _, _ = select.select(watch, [], [])
        if 0 in ready:
            data = os.read(0, 65536)
            if data:
                sock.sendall(data)
            else:
                watch = [sock]
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
        if sock in ready:
            data = sock.recv(65536)
            if not data:
                return
            if not multiplexed:
                os.write(1, data)
                continue
            pending += data
            while len(pending) >= 8:
                kind, size = pending[0], struct.unpack(">I", pending[4:8])[0]
                if len(pending) < 8 + size:
                    break
                os.write(2 if kind == 2 else 1, pending[8 : 8 + size])
                pending = pending[8 + size :]
            sys.stdout.flush()
