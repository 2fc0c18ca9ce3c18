"""Replica lifecycle inside the supervisor: launching attempts, reaping exits, carrying out the policy.

Owns each attempt's start (clean per-attempt state, environment, ports, outputs), what an exit is (the
replica's state and error), asking the lifecycle policy (:mod:`tsm.lifecycle.policy`, which holds the
rules) what it means and carrying the answer out: a restart of a REPLICA/ROLE/APPLICATION group (stopped
whole, relaunched once none of it runs) or the app's end (:meth:`ReplicaLifecycle._finish`).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import time

from tsm.lifecycle import policy
from tsm.schedulers.local import _os
from tsm.schedulers.local.logs import STDERR, STDOUT, mark_attempt, mark_restart
from tsm.schedulers.local.reaper import Reaper
from tsm.schedulers.local.state import (
    CANCELLED,
    FAILED,
    FD_RESERVE,
    FILE_INDEX_INTERVAL,
    RUNNING,
    SUCCEEDED,
    Pipe,
    Replica,
    _exit_reason,
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class ReplicaLifecycle(Reaper):
    """Launches attempts, turns exits into replica states, and restarts or ends the app as the lifecycle
    policy (:mod:`tsm.lifecycle.policy`) decides."""

    _settings: policy.Settings | None = None

    def _launch(self, rep: Replica) -> None:
        """Start one attempt of ``rep`` with clean per-attempt state (never after the app ended)."""
        if self.final_state is not None:
            return
        if rep.pid is not None:
            self.reaped.pop(rep.pid, None)
        rep.state, rep.exit_code, rep.error, rep.stopping, rep.kill_at = RUNNING, None, "", False, None
        rep.started, rep.ended, rep.pid, rep.pid_start, rep.proc = time.time(), None, None, None, None
        self.dirty.add(id(rep))
        env = dict(self.base_env)
        env.update(rep.env)
        for name in self.role_secrets.get(rep.role, ()):
            if name in self.secrets:
                env[name] = self.secrets[name]
        env.update(self._lc_env(rep))
        if self.timer_path:
            env["TSM_TIMER_SOCKET"] = self.timer_path
        try:
            os.makedirs(rep.rdir, mode=0o700, exist_ok=True)
            for name in rep.ports:
                env[f"TSM_PORT_{name.upper()}"] = str(_free_port())
            out, err, reads = self._outputs(rep)
        except OSError as e:
            self._replica_ended(rep, 127, f"cannot start {rep.cmd[0]!r}: {e.strerror or e}")
            return
        rep.direct = not reads
        nofile = self.replica_nofile if self.replica_nofile and self.replica_nofile[0] != self.fd_limit else None
        lowered = nofile if nofile is not None and self._fds_in_use() <= nofile[0] else None
        try:
            if lowered is not None:  # the child inherits the caller's limit from us: no preexec_fn, so a vfork
                self.setrlimit(self.rlimit_nofile, lowered)
            try:
                rep.proc = subprocess.Popen(
                    rep.cmd, env=env, cwd=rep.cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    start_new_session=True, close_fds=True, umask=self.replica_umask,
                    preexec_fn=self._child_limits if nofile is not None and lowered is None else None,
                )
            finally:
                if lowered is not None:
                    self.setrlimit(self.rlimit_nofile, (self.fd_limit, lowered[1]))
            rep.pid = rep.proc.pid
            self.leaders[rep.pid] = rep
            if self.start_batch is not None:
                self.start_batch.append(rep)  # its start time is read once the batch is started
            else:
                with contextlib.suppress(OSError):
                    rep.pid_start = _os.start_time(rep.pid)
            self.by_pid[rep.pid] = rep
        except OSError as e:
            msg = f"cannot start {rep.cmd[0]!r}: {e.strerror or e}"
            if reads:
                self._write(reads[1][1], os.path.join(rep.rdir, "stderr"), (msg + "\n").encode())
            else:
                self._write(err, os.path.join(rep.rdir, "stderr"), (msg + "\n").encode())
            for pair in reads:
                os.close(pair[0])
                os.close(pair[1])
            reads = []
            self._replica_ended(rep, 127, msg)
        finally:
            os.close(out)
            os.close(err)
        for stream, (fd, log) in zip((STDOUT, STDERR), reads, strict=False):
            os.set_blocking(fd, False)
            pipe = Pipe(rep, stream, fd, log)
            self.pipes[fd] = pipe
            rep.pipes.append(pipe)
            self.sel.register(fd, selectors.EVENT_READ, pipe)
        if rep.direct and self.file_index_due is None:
            self.file_index_due = time.monotonic() + FILE_INDEX_INTERVAL

    def _lc_env(self, rep: Replica) -> dict[str, str]:
        """What every attempt sees: TSM_ATTEMPT, TSM_RESTART_COUNT, TSM_LAST_EXIT (and TSM_WARN_SIGNAL).

        Also resets the attempt's long-run state: it has not been warned and has made progress just now.
        """
        rep.warned, rep.warn_pending, rep.term_at = False, False, None
        rep.stop_reason, rep.stop_failure = "", False
        rep.quiet_since, rep.progress = time.monotonic(), None
        env = {"TSM_ATTEMPT": str(rep.restarts), "TSM_RESTART_COUNT": str(self.num_restarts),
               "TSM_LAST_EXIT": rep.last_exit}
        if self.lc.get("warn_signal"):
            env["TSM_WARN_SIGNAL"] = signal.Signals(self.lc["warn_signal"]).name.removeprefix("SIG")
        return env

    def _fds_in_use(self) -> int:
        """At least the number of descriptors open here, plus :data:`FD_RESERVE` (as ``_room_for_pipes``).

        While it is within the caller's open-file limit, :meth:`_launch` lowers this process's soft limit to
        the caller's around the ``Popen``: the lowest free descriptor (what ``Popen``'s own pipe takes) is
        then below that limit, and the replica inherits the caller's limit as it did from ``preexec_fn``.
        Without a ``preexec_fn``, subprocess starts the replica with ``vfork``, not a copy of this process:
        256 replicas started 3-4 x faster. Past that limit, ``preexec_fn`` as before.
        """
        return self.fd_base + 2 * len(self.pipes) + len(self.clients) + 6 + FD_RESERVE

    def _child_limits(self) -> None:
        """In the forked replica, before exec: give back the open-file limit the caller had."""
        if self.replica_nofile is not None and self.replica_nofile[0] != self.fd_limit:
            self.setrlimit(self.rlimit_nofile, self.replica_nofile)  # bound in _setup: no import after fork

    def _reap(self) -> None:
        """Reap every replica that has exited, end what each left behind, and record the ends.

        Everything waitpid has is collected first, so the scan for orphans (one read of this process's
        children, :meth:`_orphans`) is made once per pass, not once per replica: when thousands of
        replicas end together (a cancel), a scan per replica made the pass quadratic in the replicas.
        """
        ended: list[tuple[Replica, int]] = []
        reaped = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reaped = True
            rep = self.by_pid.pop(pid, None)
            if rep is None:
                continue  # an orphan that re-parented to us and has now exited
            code = os.waitstatus_to_exitcode(status)
            if rep.proc is not None:
                rep.proc.returncode = code
            if rep.stopping and rep.kill_at is not None and rep.kill_at > time.monotonic():
                # tsm is stopping it and the grace period runs: what the leader started keeps the rest of it
                self.lingering[id(rep)] = (rep, code)
                continue
            # The leader is gone; whatever it started goes with it.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            ended.append((rep, code))
        if not ended and not (self.lingering and reaped):
            return  # a lingering replica can only have ended with a process this pass reaped
        orphans = self._orphans()
        for key, (rep, code) in list(self.lingering.items()):
            # gone when neither its process group nor an orphan it left is there
            if not (rep.pid is not None and _os.group_alive(rep.pid)) and not self._owned(rep, tree=False, orphans=orphans):
                del self.lingering[key]
                ended.append((rep, code))
        for rep, _ in ended:
            for left in self._owned(rep, tree=False, orphans=orphans):  # its pid is free for reuse now
                with contextlib.suppress(OSError):
                    os.kill(left, signal.SIGKILL)
        for rep, code in ended:
            self._replica_ended(rep, code, "")

    def _replica_ended(self, rep: Replica, code: int, error: str) -> None:
        for pipe in list(rep.pipes):
            self._read_pipe(pipe, drain=True)
        self._index(rep)
        rep.ended = time.time()
        rep.kill_at = None
        rep.exit_code = code if code >= 0 else 128 - code
        self.dirty.add(id(rep))
        stopping = rep.stopping
        rep.stopping = False
        scope = self.reaped.pop(rep.pid, None) if rep.pid is not None else None
        if scope is None and code < 0 and rep.pid is not None and self.timer_server is not None:
            self.timer_server.deliver_reaps()  # killed by its timer a moment ago? the callback may be queued
            scope = self.reaped.pop(rep.pid, None)
        if code == 0:
            rep.state, rep.error = SUCCEEDED, ""
        else:
            rep.state = FAILED
            rep.error = error or (f"expired timer {scope}" if scope is not None else _exit_reason(code))
        if rep.stop_reason:  # tsm stopped it (time limit, stall): that is why it ended
            rep.error = rep.stop_reason
            if rep.stop_failure:  # a stall is the replica's own failure, whatever its exit code
                rep.state, stopping = FAILED, False
        if self.final_state is not None or stopping:
            if self.final_state is not None and rep.state == FAILED and self.final_state == CANCELLED:
                rep.state = CANCELLED
            return
        wait_all = self._lc_settings().wait_all  # on_failure=wait: the policy decides once every replica ended
        if rep.state == SUCCEEDED:
            if all(r.state == SUCCEEDED for r in self.replicas) and not self.pending_restart:  # the policy's to say
                self._apply(self._ask([policy.Exit(r.role, r.idx, 0, who=r.name) for r in self.replicas]))
            elif wait_all and not self.pending_restart and any(r.state == FAILED for r in self.replicas):
                self._apply(self._ask(self._ended()))
            return
        events: list[policy.Event] = self._ended() if wait_all else [
            policy.Exit(rep.role, rep.idx, rep.exit_code or 0, rep.error, rep.name)]
        if rep.stop_failure:
            events.append(policy.Stalled(rep.role, rep.idx, rep.stop_reason, rep.name))
        self._apply(self._ask(events), rep)

    # -- the policy: ask, then carry out -----------------------------------------------------------
    def _lc_settings(self) -> policy.Settings:
        """The app's lifecycle settings as the policy reads them (built on first use)."""
        if self._settings is None:
            lc, count = self.lc, dict[str, int]()
            for r in self.replicas:
                count[r.role] = count.get(r.role, 0) + 1
            self._settings = policy.Settings(
                [policy.Rule(r.name, count.get(r.name, 0), r.max_retries, r.policy) for r in self.roles.values()],
                max_preemptions=int(lc.get("max_preemptions") or 0), time_limit=lc.get("time_limit"),
                requeue_on_time_limit=bool(lc.get("requeue_on_time_limit")), warn=bool(lc.get("warn_signal")),
                warn_before=float(lc.get("warn_before") or 0), stall_timeout=lc.get("stall_timeout"),
                on_stall=lc.get("on_stall") or "restart", wait_all=bool(lc.get("wait_all")))
        return self._settings

    def _ask(self, events: list[policy.Event]) -> policy.Outcome:
        """The policy's outcome for ``events`` with what the app spent and the clock of its time limit."""
        limit = self.lc.get("time_limit")
        started = self.limit_at - limit if limit and self.limit_at is not None else None
        roles = self.roles.values()
        spent = policy.Spent({r.name: r.retries for r in roles}, self.preemptions,
                             last_by={r.name: r.last_by for r in roles if r.last_by})
        return policy.decide(self._lc_settings(), policy.Record(events, spent, now=time.monotonic(), started=started))

    def _ended(self) -> list[policy.Event]:
        """The exits of every replica that has ended in this run."""
        return [policy.Exit(r.role, r.idx, r.exit_code or 0, r.error, r.name) for r in self.replicas
                if r.state in (SUCCEEDED, FAILED)]

    def _apply(self, out: policy.Outcome, rep: Replica | None = None) -> None:
        """Carry out the policy's ``out`` (``rep``: the replica whose end was asked about)."""
        if isinstance(out, policy.Restart):
            self._restart(out, rep)
        elif isinstance(out, policy.Fail):
            self._finish(FAILED, out.msg, warn=out.stall)
        elif isinstance(out, policy.Succeed):
            self._finish(SUCCEEDED, "")
        elif isinstance(out, policy.Cancelled):
            self._finish(CANCELLED, out.msg, warn=True)

    def _restart(self, out: policy.Restart, rep: Replica | None) -> None:
        """Stop the restart's group (relaunched whole by :meth:`_restart_ready`) and count what it spends:
        ``max_preemptions`` for a preemption, else the failed replica's role's ``max_retries``."""
        if out.preemption:
            self.preemptions += 1
        elif rep is not None:
            role = self.roles[rep.role]
            role.retries += 1
            role.last_by = rep.name
        self.num_restarts += 1
        self.app_dirty = True
        self._note(out.note)
        if out.scope == "REPLICA" and rep is not None:
            group = [rep]
        else:
            group = [r for r in self.replicas if r.role in out.roles]
        for r in group:
            r.last_exit = out.cause  # TSM_LAST_EXIT of its next attempt
            if out.preemption:
                r.stop_reason = out.note
            if r not in self.pending_restart:
                self.pending_restart.append(r)
                # before this end reaches the store: a log follower that sees it keeps following
                mark_restart(r.rdir, r.restarts + 1)
        self._stop(group)

    def _restart_ready(self) -> None:
        """Relaunch the pending restart group once none of its replicas is still running.

        A launch that fails may fail the app (no retries left) or queue another restart: either way
        the rest of the group is not launched now, and nothing at all once the app is terminal.
        """
        while self.pending_restart and self.final_state is None:
            if any(r.live() for r in self.pending_restart):
                return
            group, self.pending_restart = self.pending_restart, []
            for r in group:
                if self.final_state is not None:
                    break
                if r in self.pending_restart:
                    continue  # a failed launch queued it again: the next pass launches it
                r.restarts += 1
                mark_attempt(r.rdir, r.restarts)  # log readers cut the previous attempt's lines here
                self._launch(r)
        if self.final_state is not None:
            self.pending_restart = []

    def _finish(self, state: int, msg: str, warn: bool = False) -> None:
        """End the app in ``state`` with ``msg`` and stop what runs (``warn``: see :class:`.deadlines.Deadlines`)."""
        if self.final_state is not None:
            return
        self.final_state, self.final_msg = state, msg
        self.pending_restart = []
        self.app_dirty = True
        self._stop(self.replicas)
