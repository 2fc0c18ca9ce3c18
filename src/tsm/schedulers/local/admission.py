"""The supervisor's side of the local resource queue (``-c queue=true``): PENDING until the app fits.

An app that queues registers PENDING instead of RUNNING and starts no replica. It owns a FIFO of the
wait directory (see :mod:`.resources`) watched by the supervisor's own ``select`` loop, so a cancel is
served while it waits, and tries to reserve when woken (another app released) or when the bounded
back-off of :data:`~.resources.RETRY_MIN`..:data:`~.resources.RETRY_MAX` seconds ends. Once reserved, each
GPU replica gets ``CUDA_VISIBLE_DEVICES`` (its devices from the table), the app is recorded RUNNING and the
replicas start. What it holds is released when the supervisor ends (the watchdog releases it too, when
the supervisor dies), which wakes the next waiter.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import time

from tsm.schedulers.local import _os, resources
from tsm.schedulers.local.deadlines import Deadlines
from tsm.schedulers.local.state import CANCELLED, PENDING, RUNNING

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from typing import Any


class Admission(Deadlines):
    """Waits for the app's resources (when it queues) before the replicas start."""

    queue_waiter: resources.Waiter | None = None
    queue_retry: float | None = None  # the next timed re-check (monotonic)
    queue_delay = resources.RETRY_MIN
    queue_held = False
    queue_inv: dict[str, Any] | None = None  # the machine's inventory, read once (nvidia-smi is slow)

    @property
    def queue_home(self) -> str:
        """``$TSM_HOME/local``: the folder holding every app's folder, the table and the wait directory."""
        return os.path.dirname(self.app_dir)

    def _queue_start(self) -> None:
        """Start waiting: the FIFO first (no wake-up is lost after it exists), then the first try."""
        self.queue_waiter = resources.Waiter(self.queue_home, self.app_id)
        self.sel.register(self.queue_waiter.fd, selectors.EVENT_READ, "queue")
        self.queue_retry = time.monotonic() + self.queue_delay
        self._queue_try()

    def _queue_try(self) -> None:
        """Reserve if the app fits now; then set the GPUs, record RUNNING and start the replicas."""
        if self.queue_waiter is None or self.final_state is not None:
            return
        self.queue_waiter.drain()
        req: dict[str, Any] = self.req["queue"]
        me = os.getpid()
        if self.queue_inv is None:
            self.queue_inv = resources.inventory()
        gpus = resources.reserve(self.queue_home, self.app_id, req, self.queue_inv, me, _os.start_time(me))
        if gpus is None:
            self.queue_retry = time.monotonic() + self.queue_delay
            self.queue_delay = min(self.queue_delay * 2, resources.RETRY_MAX)
            return
        self.queue_held = True
        self._queue_stop()
        if req.get("assign_gpus", True):
            for rep in self.replicas:
                if (ids := gpus.get(rep.name)) is not None:
                    rep.env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        # written with the loop's next flush (which retries a refused write and tells the clients)
        self.unwritten.append(("UPDATE local_apps SET state=?, started=? WHERE app_id=? AND state=?",
                               (RUNNING, time.time(), self.app_id, PENDING)))
        self.app_dirty = True
        self._start_replicas()

    def _queue_stop(self) -> None:
        """Stop waiting (admitted, cancelled, or the supervisor is ending)."""
        if self.queue_waiter is not None:
            self.sel.unregister(self.queue_waiter.fd)
            self.queue_waiter.close()
            self.queue_waiter = None
        self.queue_retry = None

    def _queue_due(self) -> None:
        """Act on the timed re-check, and end the wait of an app cancelled while PENDING."""
        if self.queue_waiter is None:
            return
        if self.final_state is not None:
            self._queue_stop()
            now = time.time()
            for rep in self.replicas:  # never started: they end with the app
                rep.state, rep.ended = (CANCELLED if self.final_state == CANCELLED else self.final_state), now
                self.dirty.add(id(rep))
            return
        if self.queue_retry is not None and time.monotonic() >= self.queue_retry:
            self._queue_try()

    def _queue_release(self) -> None:
        """At the supervisor's end: give back what the app holds (waking the next app) and drop the FIFO."""
        self._queue_stop()
        if self.queue_held:
            self.queue_held = False
            resources.release(self.queue_home, self.app_id)

    def _start_replicas(self) -> None:
        """Launch every replica and start the app's clocks (at once, or when the queue admits the app).

        The replicas' start times (``/proc/PID/stat``, what guards their pids against reuse) are read after
        the last one is started, not after each: read while a replica is still in ``exec`` it took about
        100 us, later about 20 us (256 replicas: some 25 ms less). A replica is this process's child until
        it is reaped, after the reads, so its pid cannot have been reused in between; one that has already
        exited is recorded without a start time, as it was when it exited before the read.
        """
        self.start_batch = []
        try:
            for rep in self.replicas:
                if self.final_state is not None:
                    break
                if rep not in self.pending_restart:  # a failed launch before it queued a group restart
                    self._launch(rep)
        finally:
            batch, self.start_batch = self.start_batch, None
            for rep in batch:
                if rep.pid is not None and rep.pid_start is None:
                    with contextlib.suppress(OSError):
                        rep.pid_start = _os.start_time(rep.pid)
        self._start_clock()
        self._reap()
        self._restart_ready()
