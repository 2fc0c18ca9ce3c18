"""The detached process that owns one local app: starts its replicas, watches them, records everything.

Started by :meth:`LocalScheduler.schedule` as ``python -m tsm.schedulers.local.supervisor APP_DIR FD``
in a session of its own, so the caller may exit, be interrupted or be killed. It runs as two
processes, both child subreapers:

- the **supervisor** (the child) launches every replica in its own process group, reads the
  replica's stdout and stderr from pipes into the log files (so a replica cannot truncate what it
  wrote before, e.g. ``echo x > /dev/stderr`` opens the pipe again, not the file), indexes log
  growth, reaps exits from SIGCHLD, applies retry policies, serves a Unix socket (``APP_DIR/sock``)
  whose clients are told of every state change (``S``) and log growth (``L``) and may send
  ``cancel``, and writes state to the store;
- the **watchdog** (the parent) only waits. If the supervisor dies before recording a terminal state
  (even by SIGKILL), the replicas re-parent to the watchdog, which kills every process left and marks
  the app FAILED with the reason.

Nothing polls: the loop sleeps in ``select`` (epoll) until a signal, a socket message, replica output
or the next deadline (a replica's grace period ending).

Per-attempt state. Every launch of a replica (an *attempt*) starts clean: its own kill deadline,
exit code, error and pipes. A retry group (REPLICA: the replica; ROLE: its role; APPLICATION:
every replica) is stopped as a whole, then relaunched as a whole once none of it runs; nothing is
launched after the app reached a terminal state.

What a replica leaves behind. Stopping a replica signals its process group, every descendant the
supervisor can see (``/proc``) and every re-parented orphan that came from it (its process group or
session, or the ``TSM_*`` variables of the environment it was started with); the leader's exit ends
whatever of it is left. At the app's end every process under the supervisor is killed, with a
deadline: a process that cannot die (uninterruptible sleep) is named in ``supervisor.log`` and the
terminal state is recorded regardless.

Resources. The supervisor raises its open-file limit to the hard limit. Each replica costs two
pipe descriptors while there is room (a reserve is always kept for clients, the store and the log
files); past that, a replica writes its files directly, as it would with ``>>`` (such replicas are
indexed every :data:`FILE_INDEX_INTERVAL` seconds, and can truncate their own files). Clients the
supervisor cannot take (its descriptors are exhausted, e.g. by a replica flooding the timer socket)
are refused, never fatal.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

from tsm.errors import StoreError
from tsm.schedulers.local import _os
from tsm.schedulers.local.logs import (
    STDERR,
    STDOUT,
    STREAM_FILES,
    append_records,
    mark_attempt,
    mark_restart,
    replica_dir,
)

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from typing import Any

# AppState values, spelled out so the supervisor does not import the specs package.
SUBMITTED, RUNNING, SUCCEEDED, FAILED, CANCELLED = 1, 3, 4, 5, 6
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)

#: Seconds between attempts to record state the store refused (a full disk), doubling up to the max.
STORE_RETRY_MIN, STORE_RETRY_MAX = 0.25, 5.0

#: Seconds between two index passes over a busy log: bounds the index at a few hundred records a
#: second per replica, and is the most a follower waits for a line beyond the time it was written.
INDEX_INTERVAL = 0.005

#: Seconds between index passes over replicas that write their files directly (no pipe: fds ran short).
FILE_INDEX_INTERVAL = 0.25

#: Descriptors always kept free for clients, the store, log and index files (pipes stop short of it).
FD_RESERVE = 128

#: Seconds the listener goes unwatched when a client could not even be refused (no descriptor at all).
ACCEPT_PAUSE = 0.25

#: Most bytes read from one pipe per wake-up, so one chatty replica cannot starve the others.
PIPE_BATCH = 1 << 20

#: Seconds the end-of-app cleanup waits for killed processes to be reaped before recording anyway.
KILL_DEADLINE = 5.0

#: The longest single sleep of the loop: keeps every timeout far inside what epoll accepts.
MAX_SLEEP = 3600.0


class Replica:
    """One replica's live state inside the supervisor (plain slots: cheaper than a dataclass to import)."""

    __slots__ = ("role", "idx", "cmd", "env", "cwd", "rdir", "ports", "state", "pid", "proc", "exit_code",
                 "error", "restarts", "started", "ended", "stopping", "sizes", "pid_start", "kill_at",
                 "pipes", "direct")

    def __init__(self, role: str, idx: int, cmd: list[str], env: dict[str, str], cwd: str | None,
                 rdir: str, ports: list[str]) -> None:
        self.role, self.idx, self.cmd, self.env, self.cwd, self.rdir, self.ports = role, idx, cmd, env, cwd, rdir, ports
        self.state = RUNNING
        self.pid: int | None = None
        self.pid_start: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.error = ""
        self.restarts = 0
        self.started: float | None = None
        self.ended: float | None = None
        self.stopping = False
        self.kill_at: float | None = None  # this attempt's SIGKILL deadline (monotonic), once stopping
        self.pipes: list[Pipe] = []  # this attempt's open output pipes
        self.direct = False  # this attempt writes its files itself (no pipes)
        self.sizes = {STDOUT: 0, STDERR: 0}

    @property
    def name(self) -> str:
        return f"{self.role}/{self.idx}"

    def live(self) -> bool:
        return self.ended is None and self.pid is not None


class Pipe:
    """The read end of one output stream of one attempt, and its log file held open (``O_APPEND``).

    The file stays open with the pipe, so moving output never needs a new descriptor: a replica that
    exhausts the supervisor's descriptors cannot make it drop anyone's output.
    """

    __slots__ = ("rep", "stream", "fd", "out", "path")

    def __init__(self, rep: Replica, stream: int, fd: int, out: int) -> None:
        self.rep, self.stream, self.fd, self.out = rep, stream, fd, out
        self.path = os.path.join(rep.rdir, STREAM_FILES[stream])


class RoleState:
    """Retry bookkeeping for one role.

    ``max_retries`` is the role's budget, shared by all its replicas whatever the policy (as in TorchX):
    with REPLICA, two replicas failing once each use two retries. ``last_by`` names the replica that
    used the latest retry, so the final message can say who spent the budget.
    """

    __slots__ = ("name", "max_retries", "policy", "retries", "last_by")

    def __init__(self, name: str, max_retries: int, policy: str) -> None:
        self.name, self.max_retries, self.policy, self.retries = name, max_retries, policy, 0
        self.last_by = ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    """The event loop that owns one app; see the module docstring."""

    def __init__(self, req: dict[str, Any], ready_fd: int) -> None:
        from tsm.store import Store

        self.req = req
        self.app_id: str = req["app_id"]
        self.app_dir: str = req["app_dir"]
        self.grace: float = min(max(float(req["grace_period"]), 0.0), MAX_SLEEP * 24)
        self.base_env: dict[str, str] = req["base_env"]
        self.store = Store()
        self.ready_fd = ready_fd
        self.roles: dict[str, RoleState] = {}
        self.replicas: list[Replica] = []
        for role in req["roles"]:
            self.roles[role["name"]] = RoleState(role["name"], role["max_retries"], role["retry_policy"])
            for rep in role["replicas"]:
                self.replicas.append(
                    Replica(
                        role["name"], rep["idx"], rep["cmd"], rep["env"], rep["cwd"],
                        replica_dir(req["log_dir"], role["name"], rep["idx"]), role["port_names"],
                    )
                )
        self.by_name = {(r.role, str(r.idx)): r for r in self.replicas}
        self.by_pid: dict[int, Replica] = {}
        self.leaders: dict[int, Replica] = {}  # every pid that led an attempt: its process group / session
        self.num_restarts = 0
        self.final_state: int | None = None
        self.final_msg = ""
        self.recorded = False  # the terminal state is in the store
        self.pending_restart: list[Replica] = []
        self.dirty: set[int] = set()
        self.app_dirty = False
        self.log_dirty = False
        self.clients: list[socket.socket] = []
        self.sel = selectors.DefaultSelector()
        self.timer_server: Any = None
        self.timer_path = ""
        self.reaped: dict[int, str] = {}  # replica pid -> scope of the timer that expired in its tree
        self.log_pending: dict[int, Replica] = {}
        self.index_due: float | None = None
        self.last_index = 0.0
        self.file_index_due: float | None = None
        self.pipes: dict[int, Pipe] = {}
        self.fd_limit = 1024
        self.replica_nofile: tuple[int, int] | None = None
        self.fd_base = 0
        self.spare_fd: int | None = None
        self.accept_resume: float | None = None  # when to watch the listener again (descriptors ran out)
        self.write_failed: set[str] = set()
        self.unwritten: list[tuple[str, tuple[Any, ...]]] = []  # state the store refused (full disk, ...)
        self.store_retry: float | None = None  # when to try writing ``unwritten`` again
        self.store_delay = STORE_RETRY_MIN

    # -- setup -------------------------------------------------------------------------------------
    def _setup(self) -> None:
        _os.set_child_subreaper()
        import resource

        self.replica_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)  # what replicas get, as the caller had
        self.setrlimit, self.rlimit_nofile = resource.setrlimit, resource.RLIMIT_NOFILE
        self.fd_limit = _os.raise_fd_limit()
        self.sig_r, self.sig_w = socket.socketpair()
        self.sig_r.setblocking(False)
        self.sig_w.setblocking(False)
        signal.set_wakeup_fd(self.sig_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.signals: list[int] = []
        self.sel.register(self.sig_r, selectors.EVENT_READ, "signal")

        sock_path = os.path.join(self.app_dir, "sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock_path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        addr, dfd = _os.unix_address(sock_path)
        try:
            self.listener.bind(addr)
        finally:
            if dfd is not None:
                os.close(dfd)
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        # One descriptor held back so a connection can be refused even when the table is full.
        self.spare_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.fd_base = len(os.listdir("/proc/self/fd"))

    def _start_timer_server(self) -> None:
        """Host the app's expiration-timer server; replicas find it through ``TSM_TIMER_SOCKET``."""
        if not self.req.get("timers", True):
            return
        from tsm.timer.socket_timer import SocketTimerServer

        path = os.path.join(self.app_dir, "timer.sock")
        self.timer_server = SocketTimerServer(path, on_reap=self._on_timer_reap)
        self.timer_server.start()
        self.timer_path = path

    def _on_timer_reap(self, pid: int, scope_id: str) -> None:
        """Timer-server thread: note which replica's tree lost a worker, and wake the main loop."""
        pgid = pid
        try:  # a reaped worker is at least a zombie still; its process group names the replica
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
            pgid = int(data[data.rindex(b")") + 2 :].split()[2])
        except (OSError, ValueError, IndexError):
            pass
        self.reaped[pgid] = scope_id
        self.reaped[pid] = scope_id
        with contextlib.suppress(OSError):
            self.sig_w.send(b"T")

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    # -- replicas ----------------------------------------------------------------------------------
    def _room_for_pipes(self) -> bool:
        """True while one more attempt's pipes (2 read ends, 2 files held, 2 write ends for a moment)
        leave :data:`FD_RESERVE` descriptors free."""
        return self.fd_base + 2 * len(self.pipes) + len(self.clients) + 6 + FD_RESERVE <= self.fd_limit

    def _outputs(self, rep: Replica) -> tuple[int, int, list[tuple[int, int]]]:
        """The descriptors the attempt writes to (stdout, stderr), and ``(read end, log file)`` to watch.

        Pipes while descriptors allow, else the files themselves (``O_APPEND``) and nothing to watch.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        files = [os.path.join(rep.rdir, "stdout"), os.path.join(rep.rdir, "stderr")]
        if self._room_for_pipes():
            made: list[int] = []
            try:
                r1, w1 = os.pipe2(os.O_CLOEXEC)
                made += [r1, w1]
                r2, w2 = os.pipe2(os.O_CLOEXEC)
                made += [r2, w2]
                f1 = os.open(files[0], flags, 0o600)
                made.append(f1)
                f2 = os.open(files[1], flags, 0o600)
            except OSError:
                for fd in made:
                    os.close(fd)
            else:
                return w1, w2, [(r1, f1), (r2, f2)]
        out = os.open(files[0], flags, 0o600)
        try:
            err = os.open(files[1], flags, 0o600)
        except OSError:
            os.close(out)
            raise
        return out, err, []

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
        try:
            rep.proc = subprocess.Popen(
                rep.cmd, env=env, cwd=rep.cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, close_fds=True,
                preexec_fn=self._child_limits if self.replica_nofile and self.replica_nofile[0] != self.fd_limit else None,
            )
            rep.pid = rep.proc.pid
            self.leaders[rep.pid] = rep
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

    def _child_limits(self) -> None:
        """In the forked replica, before exec: give back the open-file limit the caller had."""
        if self.replica_nofile is not None and self.replica_nofile[0] != self.fd_limit:
            self.setrlimit(self.rlimit_nofile, self.replica_nofile)  # bound in _setup: no import after fork

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
        """Send ``sig`` to the attempt's process group and every process that came from it."""
        if rep.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(rep.pid, sig)
        for pid in self._owned(rep, orphans=orphans):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def _stop(self, reps: list[Replica]) -> None:
        """SIGTERM every live replica's processes at once; each gets SIGKILL when its grace period ends."""
        deadline = time.monotonic() + self.grace
        live = [r for r in reps if r.live()]
        orphans = self._orphans() if live else {}
        for r in live:
            r.stopping = True
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

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rep = self.by_pid.pop(pid, None)
            if rep is None:
                continue  # an orphan that re-parented to us and has now exited
            code = os.waitstatus_to_exitcode(status)
            if rep.proc is not None:
                rep.proc.returncode = code
            # The leader is gone; whatever it started goes with it.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            for left in self._owned(rep, tree=False):  # its pid is free for reuse now
                with contextlib.suppress(OSError):
                    os.kill(left, signal.SIGKILL)
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
        if code == 0:
            rep.state, rep.error = SUCCEEDED, ""
        else:
            rep.state = FAILED
            rep.error = error or (f"expired timer {scope}" if scope is not None else _exit_reason(code))
        if self.final_state is not None or stopping:
            if self.final_state is not None and rep.state == FAILED and self.final_state == CANCELLED:
                rep.state = CANCELLED
            return
        if rep.state == SUCCEEDED:
            if all(r.state == SUCCEEDED for r in self.replicas) and not self.pending_restart:
                self._finish(SUCCEEDED, "")
            return
        role = self.roles[rep.role]
        if role.retries < role.max_retries:
            role.retries += 1
            role.last_by = rep.name
            self.num_restarts += 1
            self.app_dirty = True
            self._note(f"{rep.name} {rep.error}; restart {role.retries} of {role.max_retries} ({role.policy})")
            if role.policy == "REPLICA":
                group = [rep]
            elif role.policy == "ROLE":
                group = [r for r in self.replicas if r.role == rep.role]
            else:
                group = list(self.replicas)
            for r in group:
                if r not in self.pending_restart:
                    self.pending_restart.append(r)
                    # before this end reaches the store: a log follower that sees it keeps following
                    mark_restart(r.rdir, r.restarts + 1)
            self._stop(group)
        else:
            tries = ""
            if role.retries:
                by = "it" if role.last_by == rep.name else role.last_by
                tries = (f" after {role.retries} restart(s); role {rep.role}'s retry budget "
                         f"(max_retries={role.max_retries}, shared by its replicas) was used up, the last retry by {by}")
            self._finish(FAILED, f"{rep.name} {rep.error}{tries}")

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

    def _finish(self, state: int, msg: str) -> None:
        if self.final_state is not None:
            return
        self.final_state, self.final_msg = state, msg
        self.pending_restart = []
        self.app_dirty = True
        self._stop(self.replicas)

    # -- logs --------------------------------------------------------------------------------------
    def _write(self, fd: int, path: str, data: bytes) -> None:
        """Append ``data`` to the log file open at ``fd``; a failure (a full disk) is noted once per file."""
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:
            if path not in self.write_failed:
                self.write_failed.add(path)
                self._note(f"output lost: cannot write {path}: {e.strerror or e}")

    def _read_pipe(self, pipe: Pipe, drain: bool = False) -> None:
        """Move what is in ``pipe`` to its file (up to :data:`PIPE_BATCH`, or all that is there with ``drain``)."""
        chunks: list[bytes] = []
        total = 0
        eof = False
        while total < (PIPE_BATCH * 16 if drain else PIPE_BATCH):
            try:
                data = os.read(pipe.fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                eof = True
                break
            chunks.append(data)
            total += len(data)
        if chunks:
            self._write(pipe.out, pipe.path, b"".join(chunks))
            self.log_pending[id(pipe.rep)] = pipe.rep
            self._schedule_index()
        if eof:
            self._close_pipe(pipe)

    def _close_pipe(self, pipe: Pipe) -> None:
        if self.pipes.pop(pipe.fd, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(pipe.fd)
        os.close(pipe.fd)
        os.close(pipe.out)
        with contextlib.suppress(ValueError):
            pipe.rep.pipes.remove(pipe)

    def _index(self, rep: Replica) -> None:
        now = time.time()
        records = []
        for stream, name in ((STDOUT, "stdout"), (STDERR, "stderr")):
            try:
                size = os.stat(os.path.join(rep.rdir, name)).st_size
            except OSError:
                continue
            if size > rep.sizes[stream]:
                rep.sizes[stream] = size
                records.append((stream, size, now))
        if records:
            try:
                append_records(rep.rdir, records)
            except OSError as e:  # a full disk: the index only speeds up since/until; the logs are intact
                self._note(f"log index of {rep.name} not updated: {e}")
            self.log_dirty = True

    def _schedule_index(self) -> None:
        """Index pending replicas now, or within INDEX_INTERVAL if they just were (bounds a busy log)."""
        now = time.monotonic()
        if self.log_pending and self.index_due is None:
            if now - self.last_index >= INDEX_INTERVAL:
                self._index_pending()
            else:
                self.index_due = self.last_index + INDEX_INTERVAL

    def _index_pending(self) -> None:
        pending, self.log_pending = self.log_pending, {}
        self.index_due = None
        self.last_index = time.monotonic()
        for rep in pending.values():
            self._index(rep)

    def _index_direct(self) -> None:
        """Index the replicas that write their files themselves (their growth raises no event here)."""
        self.file_index_due = None
        direct = [r for r in self.replicas if r.direct and r.live()]
        for rep in direct:
            self._index(rep)
        if direct:
            self.file_index_due = time.monotonic() + FILE_INDEX_INTERVAL

    # -- clients -----------------------------------------------------------------------------------
    def _accept(self) -> None:
        """Take waiting clients; one that cannot be taken (no descriptors left) is refused, not fatal."""
        while True:
            full = not self._room_for_client()
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return  # e.g. ECONNABORTED: that client is gone already
                self._refuse_one(e)
                return
            if full:
                conn.close()
                self._note_once("refused a client: the supervisor keeps its descriptors for its replicas")
                continue
            conn.setblocking(False)
            self.clients.append(conn)
            self.sel.register(conn, selectors.EVENT_READ, "client")

    def _room_for_client(self) -> bool:
        return self.fd_base + len(self.pipes) + len(self.clients) + FD_RESERVE // 2 < self.fd_limit

    def _refuse_one(self, e: OSError) -> None:
        """The descriptor table is full: free the spare, accept and close one client, take the spare back.

        When even that fails (another thread took the freed slot first), the listener is left unwatched
        for :data:`ACCEPT_PAUSE` seconds: a pending connection keeps it readable, and watching it would
        spin the loop until a descriptor comes free.
        """
        self._note_once(f"refused a client: {e.strerror or e} (a replica may hold the supervisor's descriptors)")
        if self.spare_fd is not None:
            os.close(self.spare_fd)
            self.spare_fd = None
        refused = False
        with contextlib.suppress(OSError):
            conn, _ = self.listener.accept()
            conn.close()
            refused = True
        with contextlib.suppress(OSError):
            self.spare_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        if not refused or self.spare_fd is None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.listener)
            self.accept_resume = time.monotonic() + ACCEPT_PAUSE

    def _resume_accepting(self) -> None:
        self.accept_resume = None
        with contextlib.suppress(KeyError, ValueError):
            self.sel.register(self.listener, selectors.EVENT_READ, "accept")

    def _note_once(self, text: str) -> None:
        if text not in self.write_failed:
            self.write_failed.add(text)
            self._note(text)

    def _drop(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        with contextlib.suppress(ValueError):
            self.clients.remove(conn)
        conn.close()

    def _on_client(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        if b"cancel" in data:
            self._finish(CANCELLED, "cancelled by user")

    def _notify(self, what: bytes) -> None:
        for conn in list(self.clients):
            try:
                conn.send(what)
            except BlockingIOError:
                pass  # a wake-up is already queued for this client
            except OSError:
                # The client has gone, but what it sent before going (a cancel) is still to be read.
                self._read_then_drop(conn)

    def _read_then_drop(self, conn: socket.socket) -> None:
        data = b""
        with contextlib.suppress(OSError):
            while len(data) < 65536 and (chunk := conn.recv(4096)):
                data += chunk
        if b"cancel" in data:
            self._finish(CANCELLED, "cancelled by user")
        self._drop(conn)

    # -- store -------------------------------------------------------------------------------------
    def _flush(self) -> None:
        stmts: list[tuple[str, tuple[Any, ...]]] = []
        done = self.final_state is not None and self._all_ended() and not self.recorded
        if done:
            # Every process of the app is gone, reaped, and its output read, before anyone is told.
            self._kill_orphans()
            for pipe in list(self.pipes.values()):
                self._read_pipe(pipe, drain=True)
                self._close_pipe(pipe)
            for rep in self.replicas:
                self._index(rep)
        if self.dirty:
            for rep in self.replicas:
                if id(rep) in self.dirty:
                    stmts.append((
                        "UPDATE local_replicas SET state=?, pid=?, pid_start=?, exit_code=?, started=?, ended=?, "
                        "restarts=?, error=? WHERE app_id=? AND role=? AND idx=?",
                        (rep.state, rep.pid, rep.pid_start, rep.exit_code, rep.started, rep.ended, rep.restarts, rep.error,
                         self.app_id, rep.role, rep.idx),
                    ))
            self.dirty.clear()
        if self.app_dirty or done:
            if done:
                self.recorded = True
                stmts.append((
                    "UPDATE local_apps SET state=?, ended=?, num_restarts=?, msg=? WHERE app_id=?",
                    (self.final_state, time.time(), self.num_restarts, self.final_msg, self.app_id),
                ))
            else:
                stmts.append((
                    "UPDATE local_apps SET num_restarts=? WHERE app_id=?", (self.num_restarts, self.app_id),
                ))
            self.app_dirty = False
        if stmts or (self.unwritten and (self.store_retry is None or time.monotonic() >= self.store_retry)):
            self.unwritten += stmts
            try:
                self.store.write(self.unwritten)
            except StoreError as e:
                # Keep the app running and the state in memory; write it all once the store takes it.
                if self.store_retry is None or self.store_delay >= STORE_RETRY_MAX:
                    self._note(f"state not recorded yet, retrying: {e}")
                self.store_retry = time.monotonic() + self.store_delay
                self.store_delay = min(self.store_delay * 2, STORE_RETRY_MAX)
            else:
                self.unwritten, self.store_retry, self.store_delay = [], None, STORE_RETRY_MIN
                self._notify(b"S")
        if self.log_dirty:
            self.log_dirty = False
            self._notify(b"L")

    def _all_ended(self) -> bool:
        return all(not r.live() for r in self.replicas)

    def _note(self, text: str) -> None:
        """A line in the app's supervisor.log (best effort: the disk may be what is failing).

        Written to stderr, which the launcher opened on supervisor.log (``O_APPEND``): no descriptor is
        needed, so a note is written even when a replica has exhausted the supervisor's descriptors.
        """
        with contextlib.suppress(OSError):
            os.write(2, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n".encode(errors="replace"))

    # -- main loop ---------------------------------------------------------------------------------
    def run(self) -> int:
        self._setup()
        me, watchdog = os.getpid(), os.getppid()
        # Register only while the app is still SUBMITTED: a cancel that came first (recorded in the store
        # while no supervisor was there) wins, and then nothing is launched.
        self.store.write([(
            "UPDATE local_apps SET state=?, started=?, sup_pid=?, sup_start=?, watchdog_pid=?, watchdog_start=? "
            "WHERE app_id=? AND sup_pid IS NULL AND state=?",
            (RUNNING, time.time(), me, _os.start_time(me), watchdog, _os.start_time(watchdog), self.app_id,
             SUBMITTED),
        )])
        rows = self.store.query("SELECT sup_pid FROM local_apps WHERE app_id=?", (self.app_id,))
        if not rows or rows[0]["sup_pid"] != me:
            with contextlib.suppress(BrokenPipeError):
                os.write(self.ready_fd, b"C")
            os.close(self.ready_fd)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.app_dir, "sock"))
            return 0
        with contextlib.suppress(BrokenPipeError):  # the launcher died meanwhile: the app runs on regardless
            os.write(self.ready_fd, b"R")
        os.close(self.ready_fd)
        try:
            self._start_timer_server()
        except Exception as e:  # noqa: BLE001 - the app runs without timers rather than not at all
            self.timer_server, self.timer_path = None, ""
            self._note(f"timer server not started: {e}")
        for rep in self.replicas:
            if self.final_state is not None:
                break
            if rep not in self.pending_restart:  # a failed launch before it queued a group restart
                self._launch(rep)
        self._reap()
        self._restart_ready()
        self._flush()
        while not (self.final_state is not None and self._all_ended() and not self.unwritten and self.recorded):
            self._step()
        self._flush()
        if self.timer_server is not None:
            self.timer_server.stop()
        for conn in list(self.clients):
            self._drop(conn)
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.app_dir, "sock"))
        return 0

    def _step(self) -> None:
        """One pass of the loop: sleep until an event or deadline, then act on everything that is due."""
        kills = [r.kill_at for r in self.replicas if r.kill_at is not None]
        deadlines = [d for d in (*kills, self.index_due, self.file_index_due, self.store_retry, self.accept_resume)
                     if d is not None]
        timeout = min(max(0.0, min(deadlines) - time.monotonic()), MAX_SLEEP) if deadlines else MAX_SLEEP
        for key, _ in self.sel.select(timeout):
            kind = key.data
            if isinstance(kind, Pipe):
                if kind.fd in self.pipes:
                    self._read_pipe(kind)
            elif kind == "signal":
                with contextlib.suppress(BlockingIOError):
                    while self.sig_r.recv(4096):
                        pass
            elif kind == "accept":
                self._accept()
            elif kind == "client":
                self._on_client(key.fileobj)  # type: ignore[arg-type]
        sigs, self.signals = self.signals, []
        for sig in sigs:
            if sig != signal.SIGCHLD:
                self._finish(CANCELLED, f"supervisor received {signal.Signals(sig).name}; app stopped")
        self._reap()
        self._kill_due()
        now = time.monotonic()
        if self.index_due is not None and now >= self.index_due:
            self._index_pending()
        if self.file_index_due is not None and now >= self.file_index_due:
            self._index_direct()
        if self.accept_resume is not None and now >= self.accept_resume:
            self._resume_accepting()
        self._restart_ready()
        self._flush()

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


def _watchdog(child: int, req: dict[str, Any]) -> int:
    """Wait for the supervisor; if it died without finishing, end the app's processes and record why."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda s, f: os.kill(child, signal.SIGTERM))
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if pid == child:
            break
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        kill_all_children(os.getpid())
        return 0
    reason = _exit_reason(code)
    left = kill_all_children(os.getpid())
    from tsm.store import Store

    now = time.time()
    msg = f"supervisor died ({reason}); its replicas were stopped"
    if left:
        msg += f" (processes {left} did not end)"
    with Store() as store:
        store.write([
            (
                "UPDATE local_replicas SET state=?, ended=COALESCE(ended, ?), error=CASE WHEN error='' THEN ? ELSE error END "
                f"WHERE app_id=? AND state NOT IN {TERMINAL}",
                (FAILED, now, "supervisor died", req["app_id"]),
            ),
            (
                f"UPDATE local_apps SET state=?, ended=?, msg=? WHERE app_id=? AND state NOT IN {TERMINAL}",
                (FAILED, now, msg, req["app_id"]),
            ),
        ])
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(req["app_dir"], "sock"))
    return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``supervisor APP_DIR READY_FD``."""
    argv = sys.argv[1:] if argv is None else argv
    app_dir, ready_fd = argv[0], int(argv[1])
    os.umask(0o077)
    with open(os.path.join(app_dir, "request.json"), "rb") as f:
        req = json.load(f)
    _os.set_child_subreaper()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = Supervisor(req, ready_fd).run()
        except BaseException:
            import traceback

            with open(os.path.join(app_dir, "supervisor.log"), "a") as log:
                traceback.print_exc(file=log)
        finally:
            os._exit(code)
    os.close(ready_fd)
    return _watchdog(pid, req)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
