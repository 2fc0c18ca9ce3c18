"""Stopping processes inside the supervisor: signalling replicas, finding their orphans, killing what is left.

Owns what a replica's processes are (its tree while it runs, and the orphans that re-parented to the
supervisor from its process group, session or ``TSM_*`` environment), the SIGTERM-then-SIGKILL
sequence of a grace period, and :func:`kill_all_children`, the bounded end-of-app (and watchdog)
cleanup. Split from ``supervisor.py`` so the process-ending rules live in one place.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from tsm.schedulers.local import _os
from tsm.schedulers.local.output import OutputPump
from tsm.schedulers.local.state import KILL_DEADLINE, Replica


class Reaper(OutputPump):
    """Signals replicas and the processes that came from them, and ends every orphan at the app's end."""

    def _owned(self, rep: Replica, tree: bool = True, orphans: dict[int, list[int]] | None = None) -> list[int]:
        """Every live process that came from ``rep``: its tree while it runs (``tree``), and orphans it left.

        ``orphans`` (from :meth:`_orphans`) saves the scan when many replicas are signalled at once.
        """
        found: list[int] = []
        if tree and rep.live() and rep.pid is not None:
            found += _os.descendants(rep.pid)
        for kid in (self._orphans() if orphans is None else orphans).get(id(rep), []):
            found.append(kid)
            found += _os.descendants(kid)
        return found

    def _orphans(self) -> dict[int, list[int]]:
        """Processes re-parented to the supervisor, by ``id()`` of the replica they came from.

        An orphan belongs to a replica when its process group or session was led by one of that replica's
        attempts, or when the environment it started with names that replica.
        """
        out: dict[int, list[int]] = {}
        for kid in _os.children(os.getpid()):
            if kid in self.by_pid:
                continue  # a live leader: its own tree is its replica's
            owner = self._orphan_owner(kid)
            if owner is not None:
                out.setdefault(id(owner), []).append(kid)
        return out

    def _orphan_owner(self, pid: int) -> Replica | None:
        got = _os.ids(pid)
        if got is None:
            return None
        for leader in got:
            if leader in self.leaders:
                return self.leaders[leader]
        origin = _os.replica_of(pid)
        if origin is not None and origin[0] == self.app_id:
            return self.by_name.get((origin[1], origin[2]))
        return None

    def _signal_replica(self, rep: Replica, sig: int, orphans: dict[int, list[int]] | None = None) -> None:
        """Send ``sig`` once to every process of the attempt: its process group, then each process that came
        from it and left the group (its own group or session, or an orphan).

        Once, not twice: a process in the group that also got ``sig`` by pid would see two SIGTERMs when it
        handles the first before the second arrives, and many programs take a second SIGTERM (or SIGINT) as
        "stop now, skip the checkpoint".
        """
        if rep.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(rep.pid, sig)
        for pid in self._owned(rep, orphans=orphans):
            got = _os.ids(pid)
            if got is None or got[0] == rep.pid:  # gone, or signalled with the group just now
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def _stop(self, reps: list[Replica]) -> None:
        """SIGTERM every live replica's processes at once; each gets SIGKILL when its grace period ends."""
        deadline = time.monotonic() + self.grace
        live = [r for r in reps if r.live()]
        orphans = self._orphans() if live else {}
        for r in live:
            r.stopping = True
            self.just_stopped.add(id(r))
            r.kill_at = deadline if r.kill_at is None else min(r.kill_at, deadline)
            self._signal_replica(r, signal.SIGTERM, orphans)

    def _kill_due(self) -> None:
        now = time.monotonic()
        due = [r for r in self.replicas if r.kill_at is not None and now >= r.kill_at]
        orphans = self._orphans() if due else {}
        for rep in due:
            rep.kill_at = None
            if rep.live():
                self._signal_replica(rep, signal.SIGKILL, orphans)
            entry = self.lingering.pop(id(rep), None)
            if entry is not None:  # its leader ended already: recorded now, whatever is still dying (a process
                self._replica_ended(rep, entry[1], "")  # stuck in the kernel is ended by the app's last sweep)

    def _replica_ended(self, rep: Replica, code: int, error: str) -> None:
        """Record the end of ``rep``'s attempt (:class:`~.replicas.ReplicaLifecycle` does)."""
        raise NotImplementedError

    def _kill_orphans(self) -> None:
        """End every process that re-parented to us (daemons a replica left behind) and reap it."""
        left = kill_all_children(os.getpid())
        if left:
            self._note(f"processes {left} did not end within {KILL_DEADLINE:g}s of SIGKILL; recording the end anyway")


def kill_all_children(me: int, timeout: float = KILL_DEADLINE) -> list[int]:
    """SIGKILL every descendant of ``me`` and reap the children, for at most ``timeout`` seconds.

    Never blocks past the deadline (a ``setsid`` grandchild or a process stuck in the kernel cannot
    hang the caller): returns the pids still there when it gave up, [] when all are gone.
    """
    import select

    end = time.monotonic() + timeout
    own_pgid = os.getpgid(0)
    left: list[int] = []
    while True:
        _reap_nohang()
        left = [p for p in _os.descendants(me) if _os.ids(p) is not None]
        if not left or time.monotonic() >= end:
            return left
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid and pid != own_pgid:
                    os.killpg(pid, signal.SIGKILL)
        # Sleep until one of our children changes (a pidfd turns readable) or a short while passes:
        # killed grandchildren re-parent to us, then the next pass reaps them.
        poller = select.poll()
        fds = []
        try:
            for pid in _os.children(me):
                with contextlib.suppress(OSError):
                    fd = os.pidfd_open(pid)
                    fds.append(fd)
                    poller.register(fd, select.POLLIN)
            wait_ms = int(min(0.05, max(0.0, end - time.monotonic())) * 1000) + 1
            if fds:
                poller.poll(wait_ms)
            else:
                time.sleep(wait_ms / 1000)
        finally:
            for fd in fds:
                os.close(fd)


def _reap_nohang() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
