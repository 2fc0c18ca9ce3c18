"""Long runs inside the supervisor: the time limit, the warning signal, requeues and stall detection.

Settings come from ``request.json``'s ``lifecycle`` (built from the run options by
:func:`.request.lifecycle_request`); none set, nothing here does anything.

- **Warning.** With ``warn_signal``, a replica gets that signal once per attempt before tsm stops it for a
  time limit, a cancel or a stall: every process of it (its tree and the orphans that came from it) that
  handles the signal gets it; one that does not is left alone, since the default action of USR1 would end
  it early. Before a time limit it comes ``warn_before`` ahead of the limit, and a replica none of whose
  processes handles it yet (still starting) is tried again every :data:`WARN_RETRY` seconds until the
  limit. On a cancel or a stall a warned replica gets SIGTERM ``warn_before`` later (sooner if it exits),
  and one that could not be warned gets it at once; then SIGKILL after the grace period as always.
- **Time limit.** ``time_limit`` counts from the launch of the app (and again from each requeue). At the
  limit the app stops: it fails with "time limit ... reached", or, with ``requeue_on_time_limit``, restarts
  whole as a preemption (``max_preemptions`` is that budget; ``max_retries`` is never spent) and its
  replicas see ``TSM_LAST_EXIT=time_limit``.
- **Stalls.** ``stall_timeout``: every tick (a tenth of it, 0.2 to 30 s) one read of ``/proc`` gives each
  replica's CPU time (its session's); with the bytes of its logs, that is its progress. A replica with
  none for ``stall_timeout`` is stalled: warned, then stopped, and either restarted as its own failure
  (``on_stall=restart``: its role's retry policy and ``max_retries``, ``TSM_LAST_EXIT=stalled``) or the
  app fails (``on_stall=fail``); both say "stalled for 15m, last line: ...".
"""

from __future__ import annotations

import contextlib
import os
import time

from tsm.lifecycle import policy
from tsm.schedulers.common.lastline import last_line as shared_last_line
from tsm.schedulers.common.stall import QUOTE_MAX, stall_message, tick as stall_tick
from tsm.schedulers.common.warn import catches
from tsm.schedulers.local import _os
from tsm.schedulers.local.replicas import ReplicaLifecycle
from tsm.schedulers.local.state import Replica

#: Seconds between two tries to warn a replica that does not handle the warning signal yet (still starting).
WARN_RETRY = 0.1



def last_line(rep: Replica) -> str:
    """The last non-empty line the replica wrote (of stdout or stderr, whichever was written last), or ""."""
    return shared_last_line((os.path.join(rep.rdir, "stdout"), os.path.join(rep.rdir, "stderr")), QUOTE_MAX)


class Deadlines(ReplicaLifecycle):
    """Time limit, warnings, requeues on the time limit and stalls; see the module docstring."""

    # -- the clock ---------------------------------------------------------------------------------
    def _start_clock(self) -> None:
        """Start the time limit (at launch and at each requeue) and the stall checks."""
        now = time.monotonic()
        self.warn_at, self.limit_at = policy.deadlines(self._lc_settings(), now)
        if self.lc.get("stall_timeout") and self.stall_due is None:
            self.stall_due = now + self._stall_tick()

    def _stall_tick(self) -> float:
        return stall_tick(self.lc["stall_timeout"])

    def _lc_deadlines(self) -> list[float]:
        """Every moment the loop must wake for long runs."""
        out = [r.term_at for r in self.replicas if r.term_at is not None]
        return out + [d for d in (self.warn_at, self.warn_retry_at, self.limit_at, self.stall_due) if d is not None]

    def _lc_due(self) -> None:
        """Act on the long-run deadlines that have come: SIGTERM after a warning, warning, limit, stall check."""
        now = time.monotonic()
        for rep in self.replicas:
            if rep.term_at is not None and now >= rep.term_at:
                rep.term_at = None
                if rep.live() and not rep.stopping:
                    self._stop([rep])
        if self.final_state is not None:
            self.warn_at = self.warn_retry_at = self.limit_at = self.stall_due = None
            return
        if self.warn_retry_at is not None and now >= self.warn_retry_at:
            self.warn_retry_at = None
            self._warn([r for r in self.replicas if r.warn_pending])
        if self.warn_at is not None and now >= self.warn_at:
            self.warn_at = None
            self._apply(self._ask([]))  # the policy's warning (or its end, when the limit came meanwhile)
        if self.limit_at is not None and now >= self.limit_at:
            self._apply(self._ask([policy.TimeLimit()]))
        if self.stall_due is not None and now >= self.stall_due:
            self.stall_due = now + self._stall_tick()
            self._check_stalls(now)

    def _restart_ready(self) -> None:
        super()._restart_ready()
        if self.clock_pending and not self.pending_restart and self.final_state is None:
            self.clock_pending = False
            self._start_clock()

    # -- warning and stopping ----------------------------------------------------------------------
    def _warn(self, reps: list[Replica]) -> list[Replica]:
        """Warn every live replica of ``reps`` not warned yet: each of its processes that handles the signal.

        Returns the replicas warned now; the others (no process handles the signal yet) are marked
        ``warn_pending`` and tried again after :data:`WARN_RETRY` seconds.
        """
        sig = int(self.lc.get("warn_signal") or 0)
        if not sig:
            return []
        todo = [r for r in reps if r.live() and not r.warned and not r.stopping]
        orphans = self._orphans() if todo else {}
        warned = []
        for rep in todo:
            pids = ([rep.pid] if rep.pid is not None else []) + self._owned(rep, orphans=orphans)
            catching = [p for p in pids if catches(p, sig)]
            rep.warn_pending = not catching
            if not catching:
                continue
            rep.warned = True
            warned.append(rep)
            for pid in catching:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        if any(r.warn_pending for r in todo):
            self.warn_retry_at = time.monotonic() + WARN_RETRY
        return warned

    def _stop_warned(self, reps: list[Replica]) -> None:
        """Warn ``reps``, then SIGTERM each ``warn_before`` later (at once: no warning set, or warned before)."""
        warned = self._warn(reps)
        term_at = time.monotonic() + float(self.lc.get("warn_before") or 0)
        for rep in warned:
            rep.term_at = term_at
        rest = [r for r in reps if r not in warned]
        for rep in rest:
            rep.warn_pending = False  # it is stopped now: no later warning
        self._stop(rest)

    def _finish(self, state: int, msg: str, warn: bool = False) -> None:
        """End the app in ``state``; with ``warn`` (a cancel, a stall that fails it) replicas are warned first."""
        if not warn or not self.lc.get("warn_signal") or self.final_state is not None:
            super()._finish(state, msg)
            return
        self.final_state, self.final_msg = state, msg
        self.pending_restart = []
        self.app_dirty = True
        self._stop_warned(self.replicas)

    # -- what the policy says about long runs ------------------------------------------------------
    def _apply(self, out: policy.Outcome, rep: Replica | None = None) -> None:
        """Carry out ``out``: the time limit's end or requeue (the limit counts again once the app is
        relaunched; each stopped replica's error says why), the warning, or what :class:`ReplicaLifecycle` does."""
        if isinstance(out, policy.Warn):
            self._note(f"{out.why}: warning every replica")
            self._warn(self.replicas)
            return
        if isinstance(out, (policy.Restart, policy.Fail)) and out.time_limit:
            self.limit_at = self.warn_at = None
            why = out.note if isinstance(out, policy.Restart) else out.msg
            if isinstance(out, policy.Restart):
                self.clock_pending = True
            else:
                for r in self.replicas:
                    if r.live():
                        r.stop_reason = why
            if rep is not None:  # it ended as the limit came (reaped first): the limit ended it
                rep.error = why
                self.dirty.add(id(rep))
        super()._apply(out, rep)

    # -- stalls ------------------------------------------------------------------------------------
    def _check_stalls(self, now: float) -> None:
        """One /proc read for every replica: which made no progress (log bytes, CPU) for stall_timeout."""
        live = [r for r in self.replicas if r.live() and not r.stopping and not r.stop_reason and r.pid is not None]
        if not live:
            return
        cpu = _os.cpu_by_session()
        timeout = float(self.lc["stall_timeout"])
        for rep in live:
            self._index(rep)  # a replica writing its files itself: its sizes are current now
            progress = (sum(rep.sizes.values()), cpu.get(rep.pid or -1, 0))
            if progress != rep.progress:
                rep.progress, rep.quiet_since = progress, now
            elif now - rep.quiet_since >= timeout:
                self._stalled(rep, timeout)

    def _stalled(self, rep: Replica, timeout: float) -> None:
        """Record ``rep`` stalled and do what the policy says: fail the app, or (it keeps the app running)
        stop the replica warned, its end then being its failure (``TSM_LAST_EXIT=stalled``)."""
        why = stall_message(timeout, last_line(rep))
        self._note(f"{rep.name} {why}")
        rep.stop_reason = why
        out = self._ask([policy.Stalled(rep.role, rep.idx, why, rep.name)])
        if not isinstance(out, policy.Keep):
            self._apply(out, rep)
            return
        rep.stop_failure = True
        self._stop_warned([rep])
