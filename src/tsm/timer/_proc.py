"""Process facts read from ``/proc`` and the two policies built on them.

:class:`Guard` decides whether a pid may have a timer armed at all (never pid <= 1, the server itself, its
ancestors, or another user's process) and returns the process start time to remember.  :class:`Reaper`
signals an expired worker, but only if the pid still names the process that armed the timer (same start
time, field 22 of ``/proc/<pid>/stat``), optionally SIGTERM first and the final signal after a grace period,
optionally to the worker's whole process group (never the server's own group).

Linux only: everything here reads ``/proc``.
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import signal as _signal
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("tsm.timer")

OnReap = Callable[[int, str], None]

#: Seconds a pid's start time is trusted without reading ``/proc`` again.
CACHE_TTL = 1.0


def _signame(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the timer servers use."""

    __slots__ = ("state", "ppid", "pgrp", "start_time")

    def __init__(self, state: str, ppid: int, pgrp: int, start_time: int) -> None:
        self.state = state
        self.ppid = ppid
        self.pgrp = pgrp
        self.start_time = start_time


_GONE = (errno.ENOENT, errno.ESRCH)


def read_stat(pid: int) -> ProcStat | None:
    """Return state, parent, process group and start time of ``pid``, or None if there is no such process.

    Any other failure to read ``/proc`` (out of descriptors or memory) raises OSError: a reader that cannot
    see a process must not conclude that it is gone.
    """
    if pid <= 0:
        return None
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in _GONE:
            return None
        raise  # EMFILE, ENOMEM, ...: we cannot tell, and "gone" would be a lie
    try:
        raw = os.read(fd, 4096)
    except OSError as e:
        if e.errno in _GONE:
            return None
        raise
    finally:
        os.close(fd)
    # "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses, so cut at the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return ProcStat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), None if gone
    (OSError if ``/proc`` cannot be read, see :func:`read_stat`).

    A (pid, start time) pair names one process for good: a reused pid has a later start time.
    """
    st = read_stat(pid)
    return None if st is None else st.start_time


def process_uid(pid: int) -> int | None:
    """Effective uid owning ``pid`` (the owner of ``/proc/<pid>``), None if gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def ancestors(pid: int) -> frozenset[int]:
    """Every ancestor of ``pid`` up to and including pid 1 (read through ``/proc``)."""
    seen: set[int] = set()
    try:
        st = read_stat(pid)
        while st is not None and st.ppid > 0 and st.ppid not in seen:
            seen.add(st.ppid)
            st = read_stat(st.ppid)
    except OSError:
        pass  # best effort: reaping is refused for what we did see, and pid 1 always
    return frozenset(seen)


class Guard:
    """Decides which pids a server will ever arm a timer for.

    Refused: pid <= 1, the server's own pid, any ancestor of the server, processes that do not exist and
    processes owned by a user other than the server's effective user.  Start times are cached for
    :data:`CACHE_TTL` seconds (one ``/proc`` read per pid per second at most, however many requests): the
    reaper compares the recorded start time before it signals, so a stale entry can never make it signal a
    reused pid, and the short lifetime keeps a new process that got an old pid from being recorded with
    its predecessor's start time (and so never reaped) for longer than that.
    """

    def __init__(self) -> None:
        self.own_pid = os.getpid()
        self.uid = os.geteuid()
        self.ancestors = ancestors(self.own_pid)
        self._cache: dict[int, tuple[int, float]] = {}

    def _cached(self, pid: int) -> int | None:
        hit = self._cache.get(pid)
        if hit is None or time.monotonic() - hit[1] > CACHE_TTL:
            return None
        return hit[0]

    def _remember(self, pid: int, start: int) -> None:
        if len(self._cache) > 65536:
            self._cache.clear()
        self._cache[pid] = (start, time.monotonic())

    def admit(self, pid: int, uid: int | None = None) -> int | str:
        """Return the start time to record for ``pid``, or a one-line reason to refuse it.

        ``uid`` is the peer's uid when the kernel told us (SO_PEERCRED); otherwise it is read from /proc.
        """
        cached = self._cached(pid)
        if cached is not None and uid is None:
            return cached
        if pid <= 1:
            return f"pid {pid} may never be reaped"
        if pid == self.own_pid:
            return f"pid {pid} is the timer server itself"
        if pid in self.ancestors:
            return f"pid {pid} is an ancestor of the timer server"
        try:
            start = process_start_time(pid)
        except OSError as e:
            return f"cannot check pid {pid} now ({e.strerror})"
        if start is None:
            return f"pid {pid} does not exist"
        owner = process_uid(pid) if uid is None else uid
        if owner != self.uid:
            return f"pid {pid} belongs to uid {owner}, not to the server's uid {self.uid}"
        self._remember(pid, start)
        return start

    def start_of(self, worker_id: object) -> int | None:
        """Start time to record for a timer of ``worker_id``: the process's if it is a live pid, else None.

        Timers are armed for any worker id (torch's servers are pid-agnostic); this only remembers which
        process the id named at that moment, so that a later reuse of the pid is never signalled.
        """
        if type(worker_id) is not int or worker_id <= 0:
            return None
        cached = self._cached(worker_id)
        if cached is not None:
            return cached
        try:
            start = process_start_time(worker_id)
        except OSError:
            return None  # cannot tell which process it is: it will never be signalled
        if start is not None:
            self._remember(worker_id, start)
        return start

    def reapable(self, worker_id: object) -> str | None:
        """None if ``worker_id`` names a process this server may signal, else a one-line reason.

        Checked when a timer expires (not when it is armed): the id must be a pid > 1 that is neither the
        server nor one of its ancestors and belongs to the server's user.
        """
        if type(worker_id) is not int:
            return f"worker id {worker_id!r} is not a pid"
        if worker_id <= 1:
            return f"pid {worker_id} may never be reaped"
        if worker_id == self.own_pid:
            return f"pid {worker_id} is the timer server itself"
        if worker_id in self.ancestors:
            return f"pid {worker_id} is an ancestor of the timer server"
        owner = process_uid(worker_id)
        if owner is not None and owner != self.uid:
            return f"pid {worker_id} belongs to uid {owner}, not to the server's uid {self.uid}"
        return None


# A final signal waiting for its grace period: (when, seq, pid, start_time, pgid or None, signal, scope_id);
# pgid _RETRY marks a whole reap to try again because /proc could not be read.
_Pending = tuple[float, int, int, int, "int | None", int, str]
_RETRY = -1
_RETRY_AFTER = 0.1


class Reaper:
    """Signals expired workers: safely (start time check), optionally gracefully, optionally by group.

    ``reap()`` sends the first signal at once; with ``term_grace`` it sends SIGTERM and queues the final
    signal, which ``run_due()`` sends when the grace period is over (the server loop waits for
    ``next_deadline()``, so the grace wait never blocks the server).  ``on_reap(pid, scope_id)`` is queued
    once the final signal went out (or the worker was found gone at the end of the grace period); the server
    calls :meth:`flush_callbacks` outside its lock.
    """

    def __init__(
        self,
        sig: int = _signal.SIGKILL,
        term_grace: float | None = None,
        kill_group: bool = False,
        on_reap: OnReap | None = None,
        stats: dict[str, int] | None = None,
    ) -> None:
        if term_grace is not None and term_grace < 0:
            raise ValueError(f"term_grace must be >= 0 seconds or None, got {term_grace}")
        self.sig = int(sig)
        self.term_grace = term_grace
        self.kill_group = kill_group
        self.on_reap = on_reap
        self.stats: dict[str, int] = stats if stats is not None else {}
        self.own_pgrp = os.getpgrp()
        self._pending: list[_Pending] = []
        self._seq = 0
        self._callbacks: list[tuple[int, str]] = []
        #: held while callbacks are delivered: a flush returns only once one under way in another thread
        #: has delivered what it took (reentrant: ``on_reap`` may flush again)
        self._flushing = threading.RLock()
        self._retry_logged = -1e9

    def reap(self, pid: int, start_time: int | None, scope_id: str, sig: int | None = None) -> bool:
        """Start reaping ``pid`` for ``scope_id``; return False (and log why) if nothing was signalled.

        ``start_time`` is the pid's start time when the timer was armed (None: no such process then, so
        whatever holds the pid now is another process and is never signalled).
        """
        sig = self.sig if sig is None else sig
        if sig <= 0:
            logger.info("timer %r of pid %d expired; signal %d means do not reap", scope_id, pid, sig)
            return False
        if start_time is None:
            logger.info("timer %r expired but pid %d did not exist when it was armed; nothing to reap", scope_id, pid)
            self._count("skipped")
            return False
        try:
            st = read_stat(pid)
        except OSError as e:
            self._retry(pid, start_time, scope_id, sig, e)
            return False
        if st is None:
            logger.info("timer %r expired but pid %d is gone; nothing to reap", scope_id, pid)
            self._count("skipped")
            return False
        if st.start_time != start_time:
            logger.warning(
                "timer %r expired but pid %d now names another process (start time %d, armed by %d); not signalled",
                scope_id,
                pid,
                st.start_time,
                start_time,
            )
            self._count("skipped")
            return False
        pgid = self._group_of(pid, st.pgrp) if self.kill_group else None
        if st.state == "Z" and pgid is None:
            logger.info("timer %r expired but pid %d already exited (zombie); nothing to reap", scope_id, pid)
            self._count("skipped")
            return False
        first = sig
        if self.term_grace is not None and sig != _signal.SIGTERM:
            first = _signal.SIGTERM
        self._send(pid, pgid, first)  # signal first, log after: nothing may delay the reap
        logger.warning(
            "timer %r of pid %d expired: sent %s to %s",
            scope_id,
            pid,
            _signame(first),
            f"process group {pgid}" if pgid is not None else f"pid {pid}",
        )
        if first != sig:
            assert self.term_grace is not None
            self._seq += 1
            heapq.heappush(
                self._pending,
                (time.time() + self.term_grace, self._seq, pid, start_time, pgid, sig, scope_id),
            )
        else:
            self._done(pid, scope_id)
        return True

    def next_deadline(self) -> float | None:
        """When the earliest queued final signal is due, or None."""
        return self._pending[0][0] if self._pending else None

    def run_due(self, now: float) -> None:
        """Send every final signal whose grace period is over, unless the worker is gone or the pid reused."""
        while self._pending and self._pending[0][0] <= now:
            _when, _seq, pid, start_time, pgid, sig, scope_id = heapq.heappop(self._pending)
            if pgid == _RETRY:
                self.reap(pid, start_time, scope_id, sig)
                continue
            try:
                st = read_stat(pid)
            except OSError:
                self._push(now + _RETRY_AFTER, pid, start_time, pgid, sig, scope_id)
                continue
            if st is not None and st.start_time != start_time:
                logger.info("pid %d was reused during the grace period; final signal not sent", pid)
            elif pgid is not None:
                # The group id cannot be handed to a new process while any member holds it, so a group
                # whose leader is gone (st is None) is still the worker's group.
                self._send(pid, pgid, sig)
            elif st is not None and st.state != "Z":
                self._send(pid, None, sig)
                logger.warning("pid %d outlived its SIGTERM grace period; sent %s", pid, _signame(sig))
            self._done(pid, scope_id)

    def _push(self, when: float, pid: int, start_time: int, pgid: int | None, sig: int, scope_id: str) -> None:
        self._seq += 1
        heapq.heappush(self._pending, (when, self._seq, pid, start_time, pgid, sig, scope_id))

    def _retry(self, pid: int, start_time: int, scope_id: str, sig: int, e: OSError) -> None:
        """``/proc`` could not be read (out of descriptors?): try the whole reap again shortly."""
        if self._retry_logged < time.monotonic() - 10.0:
            self._retry_logged = time.monotonic()
            logger.error("cannot check pid %d before reaping it (%s); retrying", pid, e.strerror)
        self._push(time.time() + _RETRY_AFTER, pid, start_time, _RETRY, sig, scope_id)

    def flush_callbacks(self) -> None:
        """Call ``on_reap`` for every worker reaped since the last flush; exceptions are logged.

        The server thread and an owner (``deliver_reaps``, on seeing a worker die) may flush at once: the one
        that comes second waits until the first has delivered the callbacks it took, so an owner never
        returns while the news of a reap it asks about is still on its way (a supervisor then called a replica
        its timer had killed "killed by SIGKILL").
        """
        with self._flushing:
            while self._callbacks:
                pid, scope_id = self._callbacks.pop(0)
                if self.on_reap is None:
                    continue
                try:
                    self.on_reap(pid, scope_id)
                except Exception:
                    logger.exception("on_reap(%d, %r) raised", pid, scope_id)

    def _group_of(self, pid: int, pgrp: int) -> int | None:
        if pgrp <= 1 or pgrp == self.own_pgrp:
            logger.warning(
                "pid %d is in process group %d, which is the server's own (or init's); signalling the pid alone",
                pid,
                pgrp,
            )
            return None
        return pgrp

    def _send(self, pid: int, pgid: int | None, sig: int) -> None:
        try:
            if pgid is not None:
                os.killpg(pgid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except (OSError, ValueError, OverflowError):
            logger.exception("could not send signal %d to %s", sig, f"group {pgid}" if pgid else f"pid {pid}")

    def _done(self, pid: int, scope_id: str) -> None:
        self._count("reaped")
        self._callbacks.append((pid, scope_id))

    def _count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1
