"""The detached process that owns one local app: starts its replicas, watches them, records everything.

Forked by the per-user launcher (:mod:`.launcher`), or spawned by :meth:`LocalScheduler.schedule` as
``python -I -S -c BOOT ... APP_DIR FD`` (:func:`tsm.util.daemon.command`: isolated, so nothing of the caller's
working directory is imported, and no site-packages scan, a faster start; tsm comes from where the caller
imports it) in a session of its own, so the caller may exit, be interrupted or be killed. Either way its
replicas run with the caller's credentials, limits and umask (see :mod:`.caller`). It runs as two
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
indexed every :data:`FILE_INDEX_INTERVAL` seconds, or :data:`FILE_INDEX_SHARE` times a pass's cost when
thousands make a pass long, and can truncate their own files). Clients the
supervisor cannot take (its descriptors are exhausted, e.g. by a replica flooding the timer socket)
are refused, never fatal.

Code layout (each module at most a few hundred lines): ``state.py`` holds the constants, the
replica and role records and the set-up; ``output.py`` moves output to the log files and indexes
it; ``reaper.py`` stops processes and finds orphans; ``replicas.py`` launches attempts and applies
retry policies; this module holds the loop (:class:`Supervisor`), its clients and store writes,
the watchdog and :func:`start` (a spawned one enters through :func:`.launcher.spawned`). The names those
modules define stay importable from here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import signal
import socket
import time

from tsm.errors import StoreError
from tsm.lifecycle import policy
from tsm.schedulers.local import _os
from tsm.schedulers.local.admission import Admission
from tsm.schedulers.local.output import OutputPump
from tsm.schedulers.local.reaper import Reaper, kill_all_children
from tsm.schedulers.local.replicas import ReplicaLifecycle
from tsm.schedulers.local.state import (
    ACCEPT_PAUSE,
    CANCELLED,
    FAILED,
    FD_RESERVE,
    FILE_INDEX_INTERVAL,
    INDEX_INTERVAL,
    KILL_DEADLINE,
    MAX_SLEEP,
    PENDING,
    PIPE_BATCH,
    RUNNING,
    STORE_RETRY_MAX,
    STORE_RETRY_MIN,
    SUBMITTED,
    SUCCEEDED,
    TERMINAL,
    Pipe,
    Replica,
    RoleState,
    SupervisorState,
    _exit_reason,
)

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "ACCEPT_PAUSE", "CANCELLED", "FAILED", "FD_RESERVE", "FILE_INDEX_INTERVAL", "INDEX_INTERVAL", "KILL_DEADLINE",
    "MAX_SLEEP", "PIPE_BATCH", "RUNNING", "STORE_RETRY_MAX", "STORE_RETRY_MIN", "SUBMITTED", "SUCCEEDED", "TERMINAL",
    "OutputPump", "Pipe", "Reaper", "Replica", "ReplicaLifecycle", "RoleState", "Supervisor", "SupervisorState",
    "kill_all_children",
]


class Supervisor(Admission):
    """The event loop that owns one app; see the module docstring."""

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
            self._apply(self._ask([policy.Cancel()]))

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
            self._apply(self._ask([policy.Cancel()]))
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
                if self.recorded:  # its end is what waits: a cancel need not (see control.cancel)
                    self._notify(b"E")
                self.store_retry = time.monotonic() + self.store_delay
                self.store_delay = min(self.store_delay * 2, STORE_RETRY_MAX)
            else:
                self.unwritten, self.store_retry, self.store_delay = [], None, STORE_RETRY_MIN
                self._notify(b"S")
        if self.log_dirty:
            self.log_dirty = False
            self._notify(b"L")

    # -- main loop ---------------------------------------------------------------------------------
    def run(self) -> int:
        self._setup()
        if self.bound is None and not register(self.store, self.app_dir, bool(self.req.get("queue")),
                                               process_ids(), self.ready_fd, self.sock_tmp):
            return 0
        try:
            self._start_timer_server()
        except Exception as e:  # noqa: BLE001 - the app runs without timers rather than not at all
            self.timer_server, self.timer_path = None, ""
            self._note(f"timer server not started: {e}")
        if self.req.get("queue"):
            self._queue_start()  # PENDING until the resources are free (see admission.py)
        else:
            self._start_replicas()
        self._flush()
        try:
            while not (self.final_state is not None and self._all_ended() and not self.unwritten and self.recorded):
                self._step()
            self._flush()
        finally:
            self._queue_release()
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
        deadlines = [d for d in (*kills, self.index_due, self.file_index_due, self.store_retry, self.accept_resume,
                                 self.queue_retry, *self._lc_deadlines()) if d is not None]
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
            elif kind == "queue":
                self._queue_try()
        sigs, self.signals = self.signals, []
        for sig in sigs:
            if sig != signal.SIGCHLD:
                self._finish(CANCELLED, f"supervisor received {signal.Signals(sig).name}; app stopped")
        self._reap()
        self._kill_due()
        self._lc_due()
        self._queue_due()
        now = time.monotonic()
        if self.index_due is not None and now >= self.index_due:
            self._index_pending()
        if self.file_index_due is not None and now >= self.file_index_due:
            self._index_direct()
        if self.accept_resume is not None and now >= self.accept_resume:
            self._resume_accepting()
        self._restart_ready()
        self._flush()


def process_ids() -> tuple[int, int | None, int, int | None]:
    """This process's and its watchdog's (its parent's) pid and start time, as :func:`register` records them."""
    me, watchdog = os.getpid(), os.getppid()
    return me, _os.start_time(me), watchdog, _os.start_time(watchdog)


def take_row(store: Any, app_id: str, queued: bool, ids: tuple[int, int | None, int, int | None]) -> bool:
    """Record this process as the supervisor of ``app_id`` if it is still SUBMITTED with none; whether it is.

    (An ``app_id`` of "" matches no app: a launcher's standby runs it so while it waits, see
    :func:`tsm.schedulers.local.launcher._rehearse`.)
    """
    me, me_start, watchdog, watchdog_start = ids
    changed: int = store.write([(
        "UPDATE local_apps SET state=?, started=?, sup_pid=?, sup_start=?, watchdog_pid=?, watchdog_start=? "
        "WHERE app_id=? AND sup_pid IS NULL AND state=?",
        (PENDING if queued else RUNNING, time.time(), me, me_start, watchdog, watchdog_start, app_id, SUBMITTED),
    )])
    return changed == 1


def register(store: Any, app_dir: str, queued: bool, ids: tuple[int, int | None, int, int | None], ready_fd: int,
             sock_tmp: str) -> bool:
    """Become the app's supervisor and tell the caller; whether this process is it.

    The store's row is taken only while the app is still SUBMITTED and has no supervisor: a cancel that came
    first (recorded while no supervisor was there) wins, and so does another supervisor of the same app that
    registered first (a launcher's standby that resumed after its caller spawned one). The loser writes
    ``C`` and leaves without touching anything of the app, its socket included; the winner renames its
    socket (``sock_tmp``, see :func:`~tsm.schedulers.local.state.bind_listener`) to ``sock`` and writes
    ``R``. ``ready_fd`` is closed either way. ``ids``: :func:`process_ids`.
    """
    won = take_row(store, os.path.basename(app_dir), queued, ids)
    if won:
        os.rename(sock_tmp, os.path.join(app_dir, "sock"))
    else:
        with contextlib.suppress(OSError):
            os.unlink(sock_tmp)
    with contextlib.suppress(BrokenPipeError):  # the caller gave up or died meanwhile: the app runs regardless
        os.write(ready_fd, b"R" if won else b"C")
    os.close(ready_fd)
    # The caller, woken by that byte, often waits on this core (the scheduler put it beside this process when
    # it woke this one): give the core up once, so its run() returns now, not after this process's time
    # slice. Measured on the 2-core VM, a run() after an idle moment: 4.6-5.2 ms without, 3.5-3.6 ms with.
    os.sched_yield()
    return won


def _watchdog(child: int, req: dict[str, Any]) -> int:
    """Wait for the supervisor; if it died without finishing, end the app's processes and record why."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda s, f: os.kill(child, signal.SIGTERM))
    signal.pthread_sigmask(signal.SIG_SETMASK, ())  # a caller's blocked SIGTERM must not hold back the forward
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
    if req.get("queue"):  # what the dead supervisor held goes back now, and the next app is woken
        from tsm.schedulers.local import resources

        with contextlib.suppress(OSError):
            resources.release(os.path.dirname(req["app_dir"]), req["app_id"])
    for name in ("sock", f"sock.{child}"):  # registered or not, its socket is dead
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(req["app_dir"], name))
    return 1


def start(app_dir: str, ready_fd: int) -> int:
    """Run the app of ``app_dir`` as watchdog (this process) and supervisor (its child); the watchdog's code.

    The umask this process was spawned with is the caller's: the replicas get it, the supervisor keeps 077.
    """
    umask = os.umask(0o077)
    with open(os.path.join(app_dir, "request.json"), "rb") as f:
        req = json.load(f)
    _os.set_child_subreaper()
    pid = os.fork()
    if pid == 0:
        os._exit(run_app(app_dir, ready_fd, req=req, umask=umask))
    os.close(ready_fd)
    return _watchdog(pid, req)


def run_app(app_dir: str, ready_fd: int, take_env: bool = False, req: dict[str, Any] | None = None,
            store: Any = None, listener: tuple[socket.socket, str] | None = None, umask: int = -1) -> int:
    """The supervisor's code (its watchdog is its parent); its exit code.

    ``take_env``: the process was forked by the launcher, so it takes the caller's environment from the
    request (``base_env``), as a spawned supervisor inherits it. ``store``: a store connection the standby
    opened already (used unless the caller's environment asks for another store timeout). ``listener``:
    the standby registered already (:func:`register`) with this socket (its ``ready_fd`` is -1 then).
    ``umask``: the caller's, which every replica starts with (-1: this process's).
    """
    code = 1
    try:
        os.umask(0o077)
        if req is None:
            with open(os.path.join(app_dir, "request.json"), "rb") as f:
                req = json.load(f)
        if take_env:
            os.environ.clear()
            os.environ.update(req["base_env"])
        if store is not None:
            from tsm.store import store_timeout

            if store_timeout() != store.timeout:
                store.close()
                store = None
        sup = Supervisor(req, ready_fd, store, listener)
        sup.replica_umask = umask
        code = sup.run()
    except BaseException:
        import traceback

        with open(os.path.join(app_dir, "supervisor.log"), "a") as log:
            traceback.print_exc(file=log)
    return code
