"""Looking inside a live Kubernetes replica: ``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on its pod.

All three go through the API server with the official client, as ``kubectl`` does, so they need nothing but
the kubeconfig the scheduler already uses (and RBAC's ``pods/exec`` and ``pods/portforward``):

* **exec** is the pod's ``exec`` subresource over a websocket (``kubernetes.stream.stream``, binary, so bytes
  arrive as written): the command runs in the replica's container with its environment (``TSM_*``
  included), working directory and user; stdout and stderr go to this process's, stdin when asked, and the
  exit code is read from the status channel.
* **stack** lists the container's Python processes from its ``/proc`` (a ``sh`` loop) and runs py-spy in the
  container on each: the image's own, else this host's static binary written once into the container's
  ``/tmp`` through an exec's stdin.
* **port-forward** is the pod's ``portforward`` subresource (``kubernetes.stream.portforward``): a new stream
  per local connection.
"""

from __future__ import annotations

import abc
import contextlib
import os
import select
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
    from tsm.schedulers.kubernetes.client import KubeClient
    from tsm.schedulers.kubernetes.request import KubernetesRequest

#: Bytes written per websocket frame when copying py-spy into a container.
COPY_CHUNK = 1 << 18


class KubernetesDebug(ReplicaExec, ReplicaStacks, ReplicaPorts):
    """The Kubernetes scheduler's exec, stack and port-forward (mixed into :class:`KubernetesScheduler`)."""

    __slots__ = ()

    # What the scheduler gives the mixin: abstract, so a name that does not match fails at construction.
    @abc.abstractmethod
    def request(self, app_id: str) -> KubernetesRequest | None: ...

    @abc.abstractmethod
    def client_for(self, req: KubernetesRequest | None) -> KubeClient: ...

    def _pod(self, app_id: str, role: str, k: int) -> tuple[KubeClient, str]:
        """The client and name of replica ``role``/``k``'s running pod (its newest attempt)."""
        from tsm.schedulers.kubernetes.status import from_json

        client = self.client_for(self.request(app_id))
        pods = [p for p in (from_json(x) for x in client.list_pods(app_id)) if p.role == role and p.replica_id == k]
        running = sorted((p for p in pods if p.phase == "Running" and not p.deleting), key=lambda p: p.attempt)
        if running:
            return client, running[-1].name
        if pods:
            newest = max(pods, key=lambda p: p.attempt)
            what = "has not started yet" if newest.phase == "Pending" else f"is not running (pod {newest.phase})"
            raise ReplicaNotRunningError(f"replica {role}/{k} of {app_id} {what}", scheduler="kubernetes")
        raise ReplicaNotRunningError(f"replica {role}/{k} of {app_id} has no pod yet", scheduler="kubernetes")

    @staticmethod
    def _open(client: KubeClient, pod: str, argv: Sequence[str], stdin: bool, tty: bool) -> Any:
        from kubernetes.stream import stream

        with client.call("exec"):
            return stream(client.core.connect_get_namespaced_pod_exec, pod, client.namespace, command=list(argv),
                          stdin=stdin, stdout=True, stderr=True, tty=tty, _preload_content=False, binary=True)

    # -- exec ----------------------------------------------------------------------------------------
    def exec_in_replica(self, app_id: str, role: str, k: int, cmd: Sequence[str], tty: bool = False,
                        stdin: bool = False) -> int:
        from tsm.schedulers.common.terminal import raw_stdin

        client, pod = self._pod(app_id, role, k)
        ws = self._open(client, pod, cmd, stdin or tty, tty)
        try:
            with raw_stdin(0) if tty else contextlib.nullcontext():
                _relay(ws, stdin or tty)
        finally:
            ws.close()
        return _exit_code(ws)

    def _run(self, client: KubeClient, pod: str, argv: list[str], data: bytes = b"") -> tuple[int, str, str]:
        """Run ``argv`` in the pod to its end (``data`` on its stdin); ``(exit code, stdout, stderr)``."""
        ws = self._open(client, pod, argv, bool(data), False)
        out, err = bytearray(), bytearray()
        try:
            for i in range(0, len(data), COPY_CHUNK):
                ws.write_stdin(data[i : i + COPY_CHUNK])
            while ws.is_open():
                ws.update(timeout=None)
                out += ws.read_channel(1, timeout=0) or b""
                err += ws.read_channel(2, timeout=0) or b""
        finally:
            ws.close()
        return _exit_code(ws, quiet=True), out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    # -- stack ---------------------------------------------------------------------------------------
    def replica_stacks(self, app_id: str, replicas: Sequence[tuple[str, int]], native: bool = False) -> list[ReplicaStack]:
        return each_stack(replicas, lambda st: self._stack_one(*self._pod(app_id, st.role, st.k), st, native))

    def _stack_one(self, client: KubeClient, pod: str, stack: ReplicaStack, native: bool) -> None:
        code, listing, err = self._run(client, pod, ["sh", "-c", LIST_PYTHONS])
        if code != 0:
            stack.error = f"could not list the pod's processes (its image needs a sh): {err.strip()[:200]}"
            return
        procs = parse_listing(listing)
        if not procs:
            stack.error = "no Python process in this replica's pod"
            return
        exe, why = self._pyspy_in(client, pod)
        if exe is None:
            stack.error = why
            return
        rows = [(pid, cmdline, *self._run(client, pod, pyspy.dump_argv(pid, native, exe))) for pid, cmdline in procs]
        dumped, why = pyspy.join_processes(rows)
        stack.processes = [ProcessStack(pid, cmdline, threads) for pid, cmdline, threads in dumped]
        stack.error = why

    def _pyspy_in(self, client: KubeClient, pod: str) -> tuple[str | None, str]:
        """A py-spy the pod can run (its own, or this host's written in), or None and why not."""
        for exe in ("py-spy", PYSPY_IN_CONTAINER):
            with contextlib.suppress(SchedulerError):
                if self._run(client, pod, [exe, "--version"])[0] == 0:
                    return exe, ""
        local = pyspy.local_pyspy()
        if local is None:
            return None, f"py-spy is not installed in the image nor here: {pyspy.INSTALL_HINT}"
        with open(local, "rb") as f:
            binary = f.read()
        part = PYSPY_IN_CONTAINER + ".part"
        script = f"head -c {len(binary)} > {part} && chmod 755 {part} && mv {part} {PYSPY_IN_CONTAINER}"
        code, _, err = self._run(client, pod, ["sh", "-c", script], binary)
        if code == 0:
            code, _, err = self._run(client, pod, [PYSPY_IN_CONTAINER, "--version"])
        if code != 0:
            return None, f"this host's py-spy does not run in the pod ({err.strip()[:120]}): {pyspy.INSTALL_HINT}"
        return PYSPY_IN_CONTAINER, ""

    # -- port-forward --------------------------------------------------------------------------------
    def connect_replica_port(self, app_id: str, role: str, k: int, port: int) -> socket.socket:
        from kubernetes.stream import portforward

        client, pod = self._pod(app_id, role, k)
        with client.call("port-forward"):
            pf = portforward(client.core.connect_get_namespaced_pod_portforward, pod, client.namespace,
                             ports=str(port))
        sock: socket.socket = pf.socket(port)
        return sock


def _relay(ws: Any, stdin: bool) -> None:
    """Copy the exec's stdout and stderr to fds 1 and 2 and, with ``stdin``, fd 0 to it, until it ends."""
    raw = ws.sock.sock
    feeding = stdin
    while ws.is_open():
        if feeding and not (hasattr(raw, "pending") and raw.pending()):
            ready, _, _ = select.select([raw, 0], [], [])
            if 0 in ready:
                data = os.read(0, 65536)
                if data:
                    ws.write_stdin(data)
                else:
                    feeding = False
                    with contextlib.suppress(Exception):
                        ws.close_channel(0)
        ws.update(timeout=0 if feeding else None)
        for channel, fd in ((1, 1), (2, 2)):
            data = ws.read_channel(channel, timeout=0)
            if data:
                os.write(fd, data)
    for channel, fd in ((1, 1), (2, 2)):
        data = ws.read_channel(channel, timeout=0)
        if data:
            os.write(fd, data)


def _exit_code(ws: Any, quiet: bool = False) -> int:
    """The exit code from the exec's status channel; a command that could not start says why on stderr."""
    import json

    raw = ws.read_channel(3, timeout=0)
    try:  # the API server's Status object, as JSON
        status = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}") or {}
    except ValueError:
        status = {}
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(ValueError, TypeError):
                return int(cause.get("message"))
    message = str(status.get("message") or "the exec ended without a status")
    if not quiet:
        sys.stderr.write(f"tsm exec: {message.splitlines()[0] if message else ''}\n")
    return 127 if "not found" in message or "no such file" in message.lower() else 126
