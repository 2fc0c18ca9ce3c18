"""Looking inside live replicas through the runner: ``exec_replica``, ``replica_stacks`` and ``port_forward``.

The runner's part is the same on every scheduler: find the app, check that it runs and that the replica
named exists and has started, then ask the scheduler's declared capability (``ReplicaExec``,
``ReplicaStacks``, ``ReplicaPorts`` in :mod:`tsm.schedulers.api`). The errors, each one line:

* an app no scheduler knows: :class:`~tsm.errors.UnknownAppError`; a role or replica it does not have:
  :class:`~tsm.errors.UnknownAppError` naming the ones it has (CLI exit code 2);
* an app or replica that has ended, or has not started yet: :class:`~tsm.errors.ReplicaNotRunningError`
  (exit code 4);
* a scheduler without the capability: :class:`~tsm.errors.NotSupportedError` (exit code 1).

:class:`ReplicaDebugging` is a mixin of :class:`tsm.runner.api.Runner`, kept here so the runner's module stays
its launch-and-watch core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tsm.errors import NotSupportedError, ReplicaNotRunningError, UnknownAppError, UsageError
from tsm.runner.events import log_event
from tsm.schedulers.api import ReplicaExec, ReplicaPorts, ReplicaStacks
from tsm.specs.api import AppState

if TYPE_CHECKING:
    from tsm.runner.stacks import StackReport
    from tsm.schedulers.api import DescribeAppResponse, Scheduler

_NOT_STARTED = (AppState.UNSUBMITTED, AppState.SUBMITTED, AppState.PENDING)


def replica_counts(desc: DescribeAppResponse) -> dict[str, int]:
    """``{role: number of replicas}`` of a described app: from its definition, else from its replicas' status."""
    if desc.app is not None and desc.app.roles:
        return {r.name: r.num_replicas for r in desc.app.roles}
    return {rs.role: max((r.id for r in rs.replicas), default=-1) + 1 for rs in desc.roles_statuses}


def select_replicas(handle: str, desc: DescribeAppResponse, role: str | None, k: int | None,
                    one: bool) -> list[tuple[str, int]]:
    """The ``(role, k)`` replicas ``role``/``k`` name (None: every one); with ``one``, exactly one must be named
    unless the app has a single replica. Unknown names raise :class:`UnknownAppError` listing the valid ones."""
    counts = replica_counts(desc)
    if role is not None and role not in counts:
        raise UnknownAppError(f"{handle} has no role {role!r} (roles: {', '.join(counts) or 'none'})",
                              handle=handle)
    roles = [role] if role is not None else list(counts)
    if k is not None and role is not None and not 0 <= k < counts[role]:
        raise UnknownAppError(f"role {role!r} of {handle} has replicas 0..{counts[role] - 1}, not {k}", handle=handle)
    chosen = [(r, i) for r in roles for i in range(counts[r]) if k is None or i == k]
    if one and len(chosen) != 1:
        names = ", ".join(f"{r}/0..{counts[r] - 1}" if counts[r] > 1 else f"{r}/0" for r in counts)
        raise UsageError(f"name one replica: {handle}/ROLE/K (replicas: {names})", handle=handle)
    return chosen


def check_running(handle: str, desc: DescribeAppResponse, replicas: Sequence[tuple[str, int]], verb: str) -> None:
    """:class:`ReplicaNotRunningError` when the app has ended or not started, or (for one replica) that replica."""
    if desc.state.is_terminal:
        raise ReplicaNotRunningError(f"{handle} has ended ({desc.state.name}): there is no replica to {verb}",
                                     handle=handle)
    if desc.state in _NOT_STARTED:
        raise ReplicaNotRunningError(f"{handle} has not started yet ({desc.state.name}); try again once `tsm "
                                     f"status {handle}` shows it RUNNING", handle=handle)
    if len(replicas) != 1:
        return
    role, k = replicas[0]
    for rs in desc.roles_statuses:
        for rep in rs.replicas:
            if rs.role == role and rep.id == k:
                if rep.state.is_terminal:
                    raise ReplicaNotRunningError(f"replica {role}/{k} of {handle} has ended ({rep.state.name})",
                                                 handle=handle)
                if rep.state in _NOT_STARTED:
                    raise ReplicaNotRunningError(f"replica {role}/{k} of {handle} has not started yet "
                                                 f"({rep.state.name})", handle=handle)


class ReplicaDebugging:
    """The runner's exec, stack and port-forward (see the module docstring for the errors)."""

    _name: str

    if TYPE_CHECKING:
        def _locate(self, app_handle: str) -> tuple[Scheduler, str, str]: ...

        def _unknown(self, app_handle: str, scheduler: str | None = None) -> UnknownAppError: ...

    def _live(self, handle: str, role: str | None, k: int | None, verb: str, cap: type,
              one: bool) -> tuple[Any, str, str, list[tuple[str, int]]]:
        sched, name, app_id = self._locate(handle)
        desc = sched.describe(app_id)
        if desc is None:
            raise self._unknown(handle, name)
        replicas = select_replicas(handle, desc, role, k, one)
        if not isinstance(sched, cap):
            raise NotSupportedError(f"the {name} scheduler cannot {verb} a replica", handle=handle, scheduler=name)
        check_running(handle, desc, replicas, verb)
        return sched, name, app_id, replicas

    def exec_replica(self, app_handle: str, role: str | None, k: int | None, cmd: Sequence[str],
                     tty: bool = False, stdin: bool = False) -> int:
        """Run ``cmd`` (verbatim argv) in replica ``role``/``k``'s place on this process's stdout and stderr (and
        stdin with ``stdin``); its exit code. ``tty``: under a terminal of its own (an interactive shell)."""
        if not cmd:
            raise UsageError("give the command to run: tsm exec HANDLE/ROLE/K -- CMD ...")
        sched, name, app_id, [(r, i)] = self._live(app_handle, role, k, "exec into", ReplicaExec, one=True)
        with log_event("exec", name, app_id, session=self._name):
            return int(sched.exec_in_replica(app_id, r, i, list(cmd), tty=tty, stdin=stdin))

    def replica_stacks(self, app_handle: str, role: str | None = None, k: int | None = None,
                       native: bool = False) -> StackReport:
        """py-spy dumps of every Python process of the replicas named (None: all), grouped
        (:mod:`tsm.runner.stacks`); a replica that could not be dumped says why in the report."""
        from tsm.runner.stacks import StackReport, group_stacks

        sched, name, app_id, replicas = self._live(app_handle, role, k, "dump", ReplicaStacks, one=False)
        with log_event("stack", name, app_id, session=self._name):
            stacks = sched.replica_stacks(app_id, replicas, native=native)
        return StackReport(app_handle, stacks, group_stacks(stacks))

    def port_forward(self, app_handle: str, role: str | None, k: int | None, remote_port: int, local_port: int = 0,
                     ready: Callable[[int], object] | None = None, stop: threading.Event | None = None) -> None:
        """Relay 127.0.0.1:``local_port`` (0: a free one, passed to ``ready``) to ``remote_port`` inside the
        replica until ``stop`` is set or Ctrl-C; connections from other local users are refused."""
        from tsm.runner.forward import listen, serve

        for port, what in ((remote_port, "remote"), (local_port, "local")):
            if not 0 <= port <= 65535 or (what == "remote" and port == 0):
                raise UsageError(f"{what} port {port} is not a TCP port (1-65535)")
        sched, name, app_id, [(r, i)] = self._live(app_handle, role, k, "forward a port of", ReplicaPorts, one=True)
        try:
            srv = listen(local_port)
        except OSError as e:
            raise UsageError(f"cannot listen on 127.0.0.1:{local_port}: {e.strerror or e}") from None
        with log_event("port_forward", name, app_id, session=self._name):
            if ready is not None:
                ready(srv.getsockname()[1])
            serve(srv, lambda: sched.connect_replica_port(app_id, r, i, remote_port), stop)
