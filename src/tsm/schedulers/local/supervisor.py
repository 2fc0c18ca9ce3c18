"""The detached process that owns one local app: starts its replicas, watches them, records everything.

Started by :meth:`LocalScheduler.schedule` as ``python -m tsm.schedulers.local.supervisor APP_DIR FD``
in a session of its own, so the caller may exit, be interrupted or be killed. It runs as two
processes, both child subreapers:

- the **supervisor** (the child) launches every replica in its own process group with stdout and
  stderr going straight to files, reaps exits from SIGCHLD, applies retry policies, indexes log growth
  from inotify, serves a Unix socket (``APP_DIR/sock``) whose clients are told of every state change
  (``S``) and log growth (``L``) and may send ``cancel``, and writes state to the store;
- the **watchdog** (the parent) only waits. If the supervisor dies before recording a terminal state
  (even by SIGKILL), the replicas re-parent to the watchdog, which kills every process left and marks
  the app FAILED with the reason.

Nothing polls: the loop sleeps in ``select`` until a signal, a socket message, an inotify event or
the next deadline (a grace period ending).
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
from tsm.schedulers.local.logs import STDERR, STDOUT, append_records, replica_dir

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


class Replica:
    """One replica's live state inside the supervisor (plain slots: cheaper than a dataclass to import)."""

    __slots__ = ("role", "idx", "cmd", "env", "cwd", "rdir", "ports", "state", "pid", "proc", "exit_code",
                 "error", "restarts", "started", "ended", "stopping", "sizes", "pid_start")

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
        self.sizes = {STDOUT: 0, STDERR: 0}


class RoleState:
    """Retry bookkeeping for one role."""

    __slots__ = ("name", "max_retries", "policy", "retries")

    def __init__(self, name: str, max_retries: int, policy: str) -> None:
        self.name, self.max_retries, self.policy, self.retries = name, max_retries, policy, 0


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
        self.grace: float = float(req["grace_period"])
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
        self.by_pid: dict[int, Replica] = {}
        self.by_wd: dict[int, Replica] = {}
        self.num_restarts = 0
        self.final_state: int | None = None
        self.final_msg = ""
        self.recorded = False  # the terminal state is in the store
        self.kill_deadline: float | None = None
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
        self.unwritten: list[tuple[str, tuple[Any, ...]]] = []  # state the store refused (full disk, ...)
        self.store_retry: float | None = None  # when to try writing ``unwritten`` again
        self.store_delay = STORE_RETRY_MIN

    # -- setup -------------------------------------------------------------------------------------
    def _setup(self) -> None:
        _os.set_child_subreaper()
        self.sig_r, self.sig_w = socket.socketpair()
        self.sig_r.setblocking(False)
        self.sig_w.setblocking(False)
        signal.set_wakeup_fd(self.sig_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
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

        self.inotify = _os.Inotify()
        self.sel.register(self.inotify.fd, selectors.EVENT_READ, "inotify")

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
    def _launch(self, rep: Replica) -> None:
        os.makedirs(rep.rdir, mode=0o700, exist_ok=True)
        if rep.pid is None and rep.restarts == 0:
            wd = self.inotify.add(rep.rdir, _os.IN_MODIFY)
            self.by_wd[wd] = rep
        env = dict(self.base_env)
        env.update(rep.env)
        if self.timer_path:
            env["TSM_TIMER_SOCKET"] = self.timer_path
        for name in rep.ports:
            env[f"TSM_PORT_{name.upper()}"] = str(_free_port())
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        out = os.open(os.path.join(rep.rdir, "stdout"), flags, 0o600)
        err = os.open(os.path.join(rep.rdir, "stderr"), flags, 0o600)
        rep.state, rep.exit_code, rep.error, rep.stopping = RUNNING, None, "", False
        rep.started, rep.ended = time.time(), None
        try:
            rep.proc = subprocess.Popen(
                rep.cmd, env=env, cwd=rep.cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, close_fds=True,
            )
            rep.pid = rep.proc.pid
            rep.pid_start = _os.start_time(rep.pid)
            self.by_pid[rep.pid] = rep
        except OSError as e:
            msg = f"cannot start {rep.cmd[0]!r}: {e.strerror or e}\n"
            os.write(err, msg.encode())
            rep.pid, rep.proc = None, None
            self._replica_ended(rep, 127, f"cannot start {rep.cmd[0]!r}: {e.strerror or e}")
        finally:
            os.close(out)
            os.close(err)
        self.dirty.add(id(rep))

    def _signal_replica(self, rep: Replica, sig: int) -> None:
        if rep.pid is None or rep.ended is not None:
            return
        try:
            os.killpg(rep.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            with contextlib.suppress(OSError):
                os.kill(rep.pid, sig)

    def _stop(self, reps: list[Replica]) -> None:
        """SIGTERM every live replica's process group at once; SIGKILL after the grace period."""
        live = [r for r in reps if r.ended is None and r.pid is not None]
        for r in live:
            r.stopping = True
            self._signal_replica(r, signal.SIGTERM)
        if live:
            deadline = time.monotonic() + self.grace
            self.kill_deadline = deadline if self.kill_deadline is None else min(self.kill_deadline, deadline)

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
            # The leader is gone; anything left in its process group goes with it.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            self._replica_ended(rep, code, "")

    def _replica_ended(self, rep: Replica, code: int, error: str) -> None:
        self._index(rep)
        rep.ended = time.time()
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
            self.num_restarts += 1
            self.app_dirty = True
            if role.policy == "REPLICA":
                group = [rep]
            elif role.policy == "ROLE":
                group = [r for r in self.replicas if r.role == rep.role]
            else:
                group = list(self.replicas)
            for r in group:
                if r not in self.pending_restart:
                    self.pending_restart.append(r)
            self._stop(group)
            self._restart_ready()
        else:
            tries = f" after {role.retries} restart(s)" if role.retries else ""
            self._finish(FAILED, f"{rep.role}/{rep.idx} {rep.error}{tries}")

    def _restart_ready(self) -> None:
        """Relaunch the pending restart group once none of its replicas is still running."""
        if not self.pending_restart or any(r.ended is None and r.pid is not None for r in self.pending_restart):
            return
        group, self.pending_restart = self.pending_restart, []
        for r in group:
            r.restarts += 1
            self._launch(r)

    def _finish(self, state: int, msg: str) -> None:
        if self.final_state is not None:
            return
        self.final_state, self.final_msg = state, msg
        self.pending_restart = []
        self.app_dirty = True
        self._stop(self.replicas)

    # -- logs --------------------------------------------------------------------------------------
    def _index(self, rep: Replica) -> None:
        now = time.time()
        records = []
        for stream, name in ((STDOUT, "stdout"), (STDERR, "stderr")):
            try:
                size = os.stat(os.path.join(rep.rdir, name)).st_size
            except FileNotFoundError:
                continue
            if size > rep.sizes[stream]:
                rep.sizes[stream] = size
                records.append((stream, size, now))
        if records:
            try:
                append_records(rep.rdir, records)
            except OSError as e:  # a full disk: the index only speeds up since/until; the logs are intact
                self._note(f"log index of {rep.role}/{rep.idx} not updated: {e}")
            self.log_dirty = True

    def _on_inotify(self) -> None:
        """Note which replicas' logs grew; index them now, or within INDEX_INTERVAL if they just were.

        Events are always drained (the kernel queue never overflows), but a replica that writes without
        pause gets at most one index record per interval instead of one per write.
        """
        for wd, mask, name in self.inotify.read():
            if mask & _os.IN_Q_OVERFLOW:
                self.log_pending.update((id(r), r) for r in self.replicas)
            elif name in ("stdout", "stderr") and wd in self.by_wd:
                rep = self.by_wd[wd]
                self.log_pending[id(rep)] = rep
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

    # -- clients -----------------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            conn.setblocking(False)
            self.clients.append(conn)
            self.sel.register(conn, selectors.EVENT_READ, "client")

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
            while chunk := conn.recv(4096):
                data += chunk
        if b"cancel" in data:
            self._finish(CANCELLED, "cancelled by user")
        self._drop(conn)

    # -- store -------------------------------------------------------------------------------------
    def _flush(self) -> None:
        stmts: list[tuple[str, tuple[Any, ...]]] = []
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
        done = self.final_state is not None and self._all_ended() and not self.recorded
        if done:
            # Every process of the app is gone, reaped, before anyone is told the app has ended.
            self._kill_orphans()
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
        return all(r.ended is not None or r.pid is None for r in self.replicas)

    def _note(self, text: str) -> None:
        """A line in the app's supervisor.log (best effort: the disk may be what is failing)."""
        with contextlib.suppress(OSError), open(os.path.join(self.app_dir, "supervisor.log"), "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

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
            with open(os.path.join(self.app_dir, "supervisor.log"), "a") as log:
                log.write(f"timer server not started: {e}\n")
        for rep in self.replicas:
            if self.final_state is not None:
                break
            self._launch(rep)
        self._reap()
        self._flush()
        while not (self.final_state is not None and self._all_ended() and not self.unwritten):
            deadlines = [d for d in (self.kill_deadline, self.index_due, self.store_retry) if d is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            for key, _ in self.sel.select(timeout):
                kind = key.data
                if kind == "signal":
                    with contextlib.suppress(BlockingIOError):
                        while self.sig_r.recv(4096):
                            pass
                elif kind == "accept":
                    self._accept()
                elif kind == "inotify":
                    self._on_inotify()
                elif kind == "client":
                    self._on_client(key.fileobj)  # type: ignore[arg-type]
            sigs, self.signals = self.signals, []
            for sig in sigs:
                if sig != signal.SIGCHLD:
                    self._finish(CANCELLED, f"supervisor received {signal.Signals(sig).name}; app stopped")
            self._reap()
            if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
                self.kill_deadline = None
                for rep in self.replicas:
                    if rep.ended is None and rep.pid is not None:
                        self._signal_replica(rep, signal.SIGKILL)
            if self.index_due is not None and time.monotonic() >= self.index_due:
                self._index_pending()
            self._restart_ready()
            self._flush()
        self._flush()
        if self.timer_server is not None:
            self.timer_server.stop()
        for conn in list(self.clients):
            self._drop(conn)
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.app_dir, "sock"))
        return 0

    def _kill_orphans(self) -> None:
        """End every process that re-parented to us (daemons a replica left behind) and reap it."""
        kill_all_children(os.getpid())


def kill_all_children(me: int) -> None:
    """SIGKILL every child of ``me`` and their process groups until none is left, reaping them."""
    for _ in range(100):
        kids = _os.children(me)
        if not kids:
            break
        for pid in kids:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if not _os.children(me):
                break
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
    kill_all_children(os.getpid())
    from tsm.store import Store

    now = time.time()
    msg = f"supervisor died ({reason}); its replicas were stopped"
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
