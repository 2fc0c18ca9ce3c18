"""The supervisor's data: its constants, the per-replica and per-role records, and the base of its loop.

Owns what every part of the supervisor (see ``supervisor.py``) reads and writes: the app-state codes,
the tuning constants, :class:`Replica` (one replica's live, per-attempt state), :class:`Pipe` (one
output stream being moved to its log file), :class:`RoleState` (a role's retry budget) and
:class:`SupervisorState`, which builds them from the request, sets the process up (signals, the
client socket, the open-file limit) and writes notes to ``supervisor.log``. Kept apart so the
output, reaping and retry code (``output.py``, ``reaper.py``, ``replicas.py``) build on one
definition of that state; like the rest of the supervisor it imports only the standard library and
tsm's own light modules, since it starts with ``python -S``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import time

from tsm.schedulers.local import _os
from tsm.schedulers.local.logs import STDERR, STDOUT, STREAM_FILES, replica_dir

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from typing import Any

# AppState values, spelled out so the supervisor does not import the specs package.
SUBMITTED, PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED = 1, 2, 3, 4, 5, 6
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)

#: Seconds between attempts to record state the store refused (a full disk), doubling up to the max.
STORE_RETRY_MIN, STORE_RETRY_MAX = 0.25, 5.0

#: Seconds between two index passes over a busy log: bounds the index at a few hundred records a
#: second per replica, and is the most a follower waits for a line beyond the time it was written.
INDEX_INTERVAL = 0.005

#: Seconds between index passes over replicas that write their files directly (no pipe: fds ran short).
FILE_INDEX_INTERVAL = 0.25

#: ... or this many times as long as the last pass took, when that is longer: a pass costs two ``stat``s per
#: such replica, and with thousands of them a pass every 0.25 s kept a good part of a core busy. Followers of
#: those replicas then see new lines up to a few pass-times late.
FILE_INDEX_SHARE = 4.0

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
                 "pipes", "direct", "warned", "warn_pending", "term_at", "stop_reason", "stop_failure",
                 "last_exit", "quiet_since", "progress")

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
        # long runs (see deadlines.py), reset by every launch
        self.warned = False  # this attempt got its one warning signal
        self.warn_pending = False  # a warning is due but no process of it handles the signal yet
        self.term_at: float | None = None  # when a warned attempt gets SIGTERM (monotonic)
        self.stop_reason = ""  # why tsm is stopping it: becomes its error
        self.stop_failure = False  # the stop counts as the replica's own failure (a stall)
        self.last_exit = ""  # TSM_LAST_EXIT of the next launch
        self.quiet_since = 0.0  # monotonic time of its last output or CPU use
        self.progress: tuple[int, int] | None = None  # (log bytes, CPU ticks) at that time

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


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


#: The signals the supervisor handles (its loop reads them from its wakeup socket).
HANDLED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class SupervisorState:
    """The state of one app's supervisor, its process set-up and its notes; the loop is :class:`Supervisor`."""

    #: The umask every replica starts with: the caller's (the supervisor itself works under 077), set by
    #: :func:`~tsm.schedulers.local.supervisor.run_app`; -1 keeps this process's.
    replica_umask = -1

    def __init__(self, req: dict[str, Any], ready_fd: int, store: Any = None,
                 listener: tuple[socket.socket, str] | None = None) -> None:
        from tsm.store import Store

        self.req = req
        self.app_id: str = req["app_id"]
        self.app_dir: str = req["app_dir"]
        self.grace: float = min(max(float(req["grace_period"]), 0.0), MAX_SLEEP * 24)
        self.base_env: dict[str, str] = req["base_env"]
        from tsm.schedulers.common import secretfile

        # the secrets' values, taken from their file (removed): in memory and the replicas' environment only
        self.secrets = secretfile.take(os.path.join(self.app_dir, secretfile.NAME)) if req.get("secrets") else {}
        self.role_secrets: dict[str, list[str]] = {r["name"]: r.get("secrets", []) for r in req["roles"]}
        self.store = store or Store()  # a standby supervisor (see launcher.py) opened it before its app came
        # Its writes are a few small rows: SQLite's default page cache (up to 2 MB) would only be private
        # memory in every one of a hundred supervisors.
        self.store.conn.execute("PRAGMA cache_size=-64")
        self.ready_fd = ready_fd
        # (socket, name it was bound at) of a supervisor that registered before it was built (a launcher's
        # standby: see launcher.py); None: bound in _setup and registered by ``run``
        self.bound = listener
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
        # replicas tsm is stopping whose leader ended inside the grace period while processes it started
        # still run (a wrapper such as bash ends at SIGTERM, the program under it may be checkpointing):
        # recorded as ended once those are gone or SIGKILL comes, with the leader's exit code
        self.lingering: dict[int, tuple[Replica, int]] = {}
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
        self.just_stopped: set[int] = set()  # id() of replicas signalled since the last direct-file index pass
        self.start_batch: list[Replica] | None = None  # replicas started in this batch (see _start_replicas)
        self.fd_limit = 1024
        self.replica_nofile: tuple[int, int] | None = None
        self.fd_base = 0
        self.spare_fd: int | None = None
        self.accept_resume: float | None = None  # when to watch the listener again (descriptors ran out)
        self.write_failed: set[str] = set()
        self.unwritten: list[tuple[str, tuple[Any, ...]]] = []  # state the store refused (full disk, ...)
        self.store_retry: float | None = None  # when to try writing ``unwritten`` again
        self.store_delay = STORE_RETRY_MIN
        # long runs: the settings (request.lifecycle) and the deadlines they make (see deadlines.py)
        self.lc: dict[str, Any] = req.get("lifecycle") or {}
        self.preemptions = 0
        self.limit_at: float | None = None  # the time limit (monotonic)
        self.warn_at: float | None = None  # when every replica gets the time limit's warning
        self.warn_retry_at: float | None = None  # when to try again replicas that did not handle it yet
        self.stall_due: float | None = None  # the next stall check
        self.clock_pending = False  # a requeue restarts the time limit once the app is relaunched

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
        for sig in HANDLED:
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        _clean_signals()
        self.signals: list[int] = []
        self.sel.register(self.sig_r, selectors.EVENT_READ, "signal")

        self.listener, self.sock_tmp = self.bound or bind_listener(self.app_dir)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        # One descriptor held back so a connection can be refused even when the table is full.
        self.spare_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.fd_base = len(os.listdir("/proc/self/fd"))

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    def _note_once(self, text: str) -> None:
        if text not in self.write_failed:
            self.write_failed.add(text)
            self._note(text)

    def _all_ended(self) -> bool:
        return all(not r.live() for r in self.replicas)

    def _note(self, text: str) -> None:
        """A line in the app's supervisor.log (best effort: the disk may be what is failing).

        Written to stderr, which the launcher opened on supervisor.log (``O_APPEND``): no descriptor is
        needed, so a note is written even when a replica has exhausted the supervisor's descriptors.
        """
        with contextlib.suppress(OSError):
            os.write(2, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n".encode(errors="replace"))


def bind_listener(app_dir: str) -> tuple[socket.socket, str]:
    """The supervisor's listening socket, bound in ``app_dir`` at a name of its own; (socket, that name).

    :func:`~tsm.schedulers.local.supervisor.register` renames it to ``sock`` once this process is the app's
    registered supervisor, so a second supervisor of the same app (which loses the registration) never takes
    or removes the app's socket, and a client sees no socket or a listening one.
    """
    sock_path = os.path.join(app_dir, f"sock.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    listener = _os.listen_unix(sock_path)
    return listener, sock_path


#: Signals a replica must start with at their default action although the caller ignored them: SIGPIPE is
#: ignored here on purpose (``Popen`` restores it in the replica), SIGKILL and SIGSTOP cannot be changed.
_KEEP = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE})


def _clean_signals() -> None:
    """Unblock every signal and give each one the caller ignored its default action again, in this process.

    Replicas start from here and inherit both through ``exec``: a caller that blocked SIGTERM in its thread
    or ran tsm under ``nohup`` or ``&`` in a script (SIGHUP, SIGINT ignored) would otherwise start replicas
    that never see tsm's stop, a warning or a Ctrl-C, which a program's own handlers cannot undo (Python
    installs no ``KeyboardInterrupt`` when it starts with SIGINT ignored). The supervisor's own handlers
    are set before this and stay.
    """
    import _signal  # type: ignore[import-not-found]  # C module: no enum per signal (~0.3 ms per supervisor)

    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    for sig in _signal.valid_signals():
        if sig not in _KEEP and _signal.getsignal(sig) == _signal.SIG_IGN:
            with contextlib.suppress(OSError, ValueError):
                _signal.signal(sig, _signal.SIG_DFL)
