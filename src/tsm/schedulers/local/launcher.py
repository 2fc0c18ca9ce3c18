"""The per-user launcher: a long-lived process that forks one supervisor per app, so no app pays a new interpreter.

Why. Starting a supervisor as ``python -I -S -c ...`` costs an interpreter start and its imports (12-22 ms and
about 20 ms more on a loaded 2-core machine) before it can say it is ready, and about 6 MB of private memory
per process. A process that has already imported the supervisor's modules can ``fork`` one in about a
millisecond, and the pages it imported stay shared copy-on-write between every supervisor forked from it.

How it starts. Never on its own: the first supervisor that a caller had to spawn (no launcher was up) starts
a launcher beside itself before it starts its app (:func:`start_beside`, a detached helper of
:mod:`tsm.util.daemon`: of many supervisors spawned at once, one starts it), off the caller's critical path.
The launcher then imports what a supervisor needs, takes ``<key>.lock`` (one launcher per key, released by
the kernel when it dies, even by SIGKILL), binds ``<key>.sock`` under ``$TSM_HOME/launcher/`` (a 0700
folder: only its owner can reach it) and serves. It exits after :data:`IDLE` seconds without a request, when
its socket is no longer its own (the folder was removed) or when the code it was started from has changed.

The key. ``<key>`` hashes the interpreter, the folder tsm is imported from and the size and modification
time of every source file a supervisor runs (:func:`launcher_key`). After an upgrade the caller asks for
another key, so a launcher from an older tsm, left running, is never asked to fork a supervisor of the wrong code.

A request (:func:`connect`, then :func:`send`). The caller connects before it writes the app's files and
record, checks that the launcher runs as its own user (``SO_PEERCRED``), and once they are written sends the
app folder, its open-file limits, whether the app queues and, as ``SCM_RIGHTS``, the write end of the pipe on
which the supervisor says it is ready (``R``). No fork happens then: the launcher keeps :data:`POOL`
*standbys* ready, each a watchdog and under it a supervisor forked before anyone asked
(:func:`_fork_standby`), the supervisor waiting on the launcher's socket with the store open and its request
path run once on nothing (:func:`_rehearse`). A connection wakes one standby supervisor (``EPOLLEXCLUSIVE``),
which accepts it and checks the caller's credentials and process settings (:mod:`.caller`: a caller whose
groups, limits, priorities or personality differ from the launcher's spawns its own supervisor; its umask
is carried to its replicas) while the caller writes (another uid never makes it start anything), then
takes the request, answers ``F``, and registers the app in the store before it builds anything else
(:func:`supervisor.register <tsm.schedulers.local.supervisor.register>`): the caller's ``R`` costs a store
write, and reading the request,
taking the caller's environment and open-file limits and the supervisor's set-up come after it, in
:func:`supervisor.run_app <tsm.schedulers.local.supervisor.run_app>`, exactly the code a spawned supervisor
runs. Then it tells its watchdog the app folder (the watchdog watches it as a spawned watchdog does) and
the launcher that it was taken (the launcher forks the next standby). Both are in a session of their own,
so apps outlive the launcher.

Never a single point of failure. Any answer but ``F`` within :data:`ACK_TIMEOUT` (no launcher, a dead one, a
stopped one, a refusal) makes the caller spawn the supervisor as before. The one race left, a stopped
standby that resumes and takes the request after the caller gave up, is harmless: it first checks that the
caller is still connected (it hangs up when it gives up), and a second supervisor of the same app can only
lose the registration (``sup_pid IS NULL AND state=SUBMITTED``) and exit without touching the app (its
socket is bound under a name of its own and renamed to ``sock`` only once registered). When the launcher
ends, even by SIGKILL, the pipe its idle standbys watch closes and they leave. (A standby that is stopped
while it waits can still be the one a connection wakes; its caller then spawns after the timeout.)
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
import time

from tsm.util import daemon

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from typing import Any

#: Standby supervisors a launcher keeps ready: two, so a request that comes while the launcher forks the
#: next one (submissions back to back, a sweep) finds one waiting.
POOL = 2

#: What a taken standby writes to its launcher: the pid of its watchdog (the launcher's child).
_TAKEN = struct.Struct("=I")

#: Seconds a launcher waits for its next request before it exits (``TSM_LAUNCHER_IDLE`` overrides).
IDLE = 60.0

#: Seconds a caller waits for the launcher's ``F`` before it spawns the supervisor itself.
ACK_TIMEOUT = 1.0

#: Seconds between two checks that the launcher's socket and code are still current.
CHECK_INTERVAL = 2.0

#: Source folders (relative to the ``tsm`` package) whose files a supervisor runs: the key covers them.
CODE_DIRS = ("", "schedulers", "schedulers/common", "schedulers/local", "timer", "util")

#: The launcher's entry point (:func:`tsm.util.daemon.command`).
ENTRY = "tsm.schedulers.local.launcher:main"

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def enabled() -> bool:
    """False when ``TSM_LAUNCHER=0`` (spawn every supervisor), or inside a replica of another app.

    A launcher started from inside a replica would carry that replica's ``TSM_*`` environment and be ended
    with it; such nested callers simply spawn.
    """
    return os.environ.get("TSM_LAUNCHER", "1") != "0" and "TSM_APP_ID" not in os.environ


def launcher_key(pkg_parent: str | None = None, executable: str | None = None) -> str:
    """The launcher's key: :func:`tsm.util.daemon.code_key` over the folders a supervisor runs (:data:`CODE_DIRS`)."""
    return daemon.code_key(CODE_DIRS, parent=pkg_parent, executable=executable)


def launcher_dir(home: str) -> str:
    return os.path.join(home, "launcher")


def _peer_uid(sock: socket.socket) -> int:
    uid: int = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))[1]
    return uid


def _peer_pid(sock: socket.socket) -> int:
    pid: int = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))[0]
    return pid


# -- the caller's side -----------------------------------------------------------------------------------------
_key_cache: dict[tuple[str, str], str] = {}


def connect(home: str) -> socket.socket | None:
    """Connect to this user's launcher for the supervisor of an app about to be written; the connection, or None.

    Called before the app's files and record are written (:meth:`LocalScheduler.schedule
    <tsm.schedulers.local.scheduler.LocalScheduler.schedule>`): a standby wakes, accepts and checks the caller
    (:func:`_take`) while the caller writes them, on another core, and then waits for :func:`send`. None means
    "spawn it yourself": launchers disabled, none running for this code, or not this user's.
    """
    if not enabled():
        return None
    from tsm.schedulers.local import _os

    pkg = daemon.package_parent()
    key = _key_cache.get((pkg, sys.executable))
    if key is None:  # once per process: a long-lived caller sees the code it imported, not a later upgrade
        key = _key_cache[(pkg, sys.executable)] = launcher_key(pkg)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(ACK_TIMEOUT)
        addr, dfd = _os.unix_address(os.path.join(launcher_dir(home), key + ".sock"))
        try:
            sock.connect(addr)
        finally:
            if dfd is not None:
                os.close(dfd)
        if _peer_uid(sock) == os.getuid():
            return sock
    except OSError:
        pass
    sock.close()
    return None


def send(sock: socket.socket, app_dir: str, ready_w: int, queued: bool) -> bool:
    """Ask the launcher on ``sock`` (from :func:`connect`) for the supervisor of ``app_dir``; False: spawn it.

    The request is the caller's open-file limits, whether the app waits in the resource queue (its first
    state), the caller's personality (the one setting of :mod:`.caller` the standby may not read itself), the
    app folder and, as ``SCM_RIGHTS``, ``ready_w``: the write end of the pipe on which the supervisor says
    ``R`` once registered. The standby answers ``F`` on the connection once it took the
    request; the caller waits for the ``R`` and reads the ``F`` only when the ``R`` is late or the pipe ended
    without one (:func:`tsm.schedulers.local.spawn._wait`). No ``F`` then also means "spawn it yourself".
    ``ready_w`` stays the caller's to close; on False ``sock`` is closed here.
    """
    import resource

    from tsm.schedulers.local.caller import own_personality

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        head = f"{soft} {hard} {int(queued)} ".encode() + own_personality() + b" "
        socket.send_fds(sock, [head + os.fsencode(app_dir)], [ready_w])
        return True
    except OSError:
        sock.close()
        return False


# -- the launcher's side ---------------------------------------------------------------------------------------
def start_beside(home: str, keep_closed: tuple[int, ...] = ()) -> None:
    """Start a detached launcher for this code and ``home`` unless one runs, or is starting (or launchers are off).

    Called by a spawned supervisor before it starts its app, so the caller never waits for it. The launcher
    is nobody's child (:func:`tsm.util.daemon.spawn_orphan`: the supervisor ends everything under it when its
    app ends), closes ``keep_closed`` (the caller's ready pipe) and is a fresh interpreter with nothing of the
    app, under its own command line (never mistaken for the supervisor's). Of many supervisors spawned at once
    only one starts it (:func:`tsm.util.daemon.start_once`).
    """
    if not enabled():
        return
    from tsm.schedulers.local import _os

    ldir = launcher_dir(home)
    _os.makedirs_private(ldir)
    lock = os.path.join(ldir, launcher_key() + ".lock")

    def start(fd: int) -> None:
        argv = daemon.command(ENTRY, home, site=False, handover_fd=fd)
        daemon.spawn_orphan(argv, close=keep_closed, keep=(fd,))

    daemon.start_once(lock, start)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the launcher's own process: ``launcher HOME`` (:func:`tsm.util.daemon.command`)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return serve(argv[0], daemon.package_parent())
    finally:
        os._exit(0)


def spawned(argv: list[str] | None = None) -> int:
    """Entry point of a spawned supervisor: ``APP_DIR READY_FD`` (:data:`tsm.schedulers.local.spawn.ENTRY`).

    A spawned supervisor means no launcher served the caller, so it first starts one beside itself for the
    callers that come next, then runs the app (:func:`tsm.schedulers.local.supervisor.start`). It lives here,
    not in the supervisor, so the supervisor never imports its launcher.
    """
    from tsm.schedulers.local import supervisor

    argv = sys.argv[1:] if argv is None else argv
    app_dir, ready_fd = argv[0], int(argv[1])
    try:
        from tsm.store import tsm_home

        start_beside(os.path.abspath(tsm_home()), (ready_fd,))
    except Exception as e:  # noqa: BLE001 - the app starts without a launcher rather than not at all
        with contextlib.suppress(OSError):
            os.write(2, f"launcher not started: {e}\n".encode(errors="replace"))
    return supervisor.start(app_dir, ready_fd)


def _prepare() -> None:
    """Import what a supervisor imports after its start, so forked ones share it; then freeze the heap.

    ``gc.freeze`` moves every object made so far out of the collector's reach: a forked supervisor's
    collections never write to those pages, so they stay shared.
    """
    import fcntl  # noqa: F401
    import gc
    import json  # noqa: F401
    import resource  # noqa: F401
    import traceback  # noqa: F401

    import tsm.store  # noqa: F401
    import tsm.timer.socket_timer  # noqa: F401
    from tsm.schedulers.local import _os, supervisor  # noqa: F401

    # One malloc arena for every thread (the supervisor's timer-server thread would otherwise get its own,
    # dirtying pages of a fresh 64 MB arena in every supervisor). M_ARENA_MAX is -8 in glibc's malloc.h.
    with contextlib.suppress(AttributeError, OSError):
        _os._lib().mallopt(-8, 1)
    gc.collect()
    gc.freeze()


def serve(home: str, pkg: str) -> int:
    """The launcher's loop: take the lock, bind the socket, keep :data:`POOL` standby supervisors ready until idle.

    The key is computed before and after the imports: sources that changed in between (an upgrade in
    progress) make it exit rather than serve code that may not be what the key says.
    """
    import select

    from tsm.schedulers.local import _os

    os.umask(0o077)
    os.chdir("/")
    key = launcher_key(pkg)
    ldir = launcher_dir(home)
    _os.makedirs_private(ldir)
    null = os.open(os.devnull, os.O_RDWR)
    log = os.open(os.path.join(ldir, key + ".log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    for target, src in ((0, null), (1, null), (2, log)):
        os.dup2(src, target)
    os.close(null)
    os.close(log)
    lock = daemon.take(os.path.join(ldir, key + ".lock"))
    if lock is None:
        return 0  # another launcher of this code serves this home
    daemon.started()
    _prepare()
    if launcher_key(pkg) != key:
        return 0
    path = os.path.join(ldir, key + ".sock")
    tmp = os.path.join(ldir, f"{key}.{os.getpid()}.tmp")
    listener = _os.listen_unix(tmp, socket.SOCK_CLOEXEC)
    os.rename(tmp, path)  # atomic: a caller sees no socket or a listening one
    ino = os.stat(path).st_ino
    idle = daemon.Idle(daemon.idle_limit("TSM_LAUNCHER_IDLE", IDLE))
    next_check = time.monotonic()
    taken_r, taken_w = os.pipe()  # a standby writes T and its watchdog's pid here once its caller was answered
    quit_r, quit_w = os.pipe()  # closed by this process when it ends (even by SIGKILL): idle standbys leave
    poller = select.poll()
    poller.register(taken_r, select.POLLIN)
    ready: list[int] = []  # the watchdogs of the standbys not taken yet
    try:
        while True:
            while len(ready) < POOL:
                ready.append(_fork_standby(listener, lock, home, (taken_r, quit_w), (taken_w, quit_r)))
            now = time.monotonic()
            if idle.over():
                break
            if now >= next_check:
                next_check = now + CHECK_INTERVAL
                try:
                    if os.stat(path).st_ino != ino or launcher_key(pkg) != key:
                        break
                except OSError:
                    break
            if poller.poll(int(min(CHECK_INTERVAL, idle.limit) * 1000) + 1):
                got = os.read(taken_r, 4096)  # whole records: each is one write under PIPE_BUF
                for (pid,) in _TAKEN.iter_unpack(got[: len(got) - len(got) % _TAKEN.size]):
                    if pid in ready:
                        ready.remove(pid)
                idle.busy()
            dead = _reap()  # a standby that died before taking a request (or after, as its app ended)
            ready = [pid for pid in ready if pid not in dead]
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == ino:
                os.unlink(path)
    return 0  # quit_w closes with this process: the idle standby sees it and leaves


def _reap() -> set[int]:
    """Collect the watchdogs (this process's children) that ended; their pids."""
    ended = set()
    with contextlib.suppress(ChildProcessError):
        while pid := os.waitpid(-1, os.WNOHANG)[0]:
            ended.add(pid)
    return ended


def _fork_standby(listener: socket.socket, lock: int, home: str, close: tuple[int, ...],
                  keep: tuple[int, int]) -> int:
    """Fork the next app's watchdog and, under it, its supervisor, waiting for a request; the watchdog's pid.

    Both are made before any caller asks, so a request costs no fork at all: the standby supervisor accepts
    the caller's connection itself (:func:`_take`), says ``F`` and tells the launcher (``T``), which makes
    the next standby meanwhile. The watchdog learns the app folder from its supervisor through a pipe.
    """
    taken_w, quit_r = keep
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        os.close(lock)  # else the lock would outlive the launcher and no new one could start
        for fd in close:
            os.close(fd)
        os.setsid()
        from tsm.schedulers.local import _os

        _os.set_child_subreaper()
        app_r, app_w = os.pipe()
        sup = os.fork()
        if sup == 0:
            os.close(app_r)
            _standby(listener, quit_r, taken_w, app_w, home)
        listener.close()
        for fd in (app_w, taken_w, quit_r):
            os.close(fd)
        code = _watch(sup, app_r)
    except BaseException:  # noqa: BLE001 - a forked child never returns into the launcher's loop
        import traceback

        with contextlib.suppress(OSError):
            traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _watch(sup: int, app_r: int) -> int:
    """The standby watchdog: wait for the app folder from its supervisor, then watch it as any watchdog does."""
    data = b""
    while chunk := os.read(app_r, 65536):
        data += chunk
    os.close(app_r)
    if not data:  # the standby left without an app (its launcher ended): nothing to watch
        with contextlib.suppress(ChildProcessError):
            os.waitpid(sup, 0)
        return 0
    import json

    from tsm.schedulers.local import _os, supervisor

    app_dir = os.fsdecode(data)
    _os.set_cmdline(sys.executable, "-m", "tsm.schedulers.local.supervisor", app_dir)
    log = os.open(os.path.join(app_dir, "supervisor.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(log, 2)
    os.close(log)
    with open(os.path.join(app_dir, "request.json"), "rb") as f:
        req = json.load(f)
    os.environ.clear()
    os.environ.update(req["base_env"])
    return supervisor._watchdog(sup, req)


def _next_request(listener: socket.socket, quit_r: int, home: str, mine: tuple[tuple[object, ...], bytes]
                  ) -> tuple[socket.socket, tuple[str, int, tuple[int, int], bool, int]] | None:
    """The first connection to ``listener`` with a valid request, and that request (see :func:`_take`); None
    once the launcher closed ``quit_r``. Closes the listener and ``quit_r`` when it returns a request."""
    import select

    # Exclusive: a connection wakes one waiting standby, not every one (the others would only find nothing
    # to accept, on the cores the caller and the taken standby need).
    poller = select.epoll()
    poller.register(listener, select.EPOLLIN | select.EPOLLEXCLUSIVE)
    poller.register(quit_r, select.EPOLLIN)
    try:
        while True:
            if quit_r in dict(poller.poll()):
                return None
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            taken = None
            with contextlib.suppress(OSError):
                taken = _take(conn, home, mine)
            if taken is not None:
                listener.close()
                os.close(quit_r)
                return conn, taken
            conn.close()
    finally:
        poller.close()


def _standby(listener: socket.socket, quit_r: int, taken_w: int, app_w: int, home: str) -> None:
    """The standby supervisor: take one valid request from the launcher's socket, then run that app. Never returns.

    Everything that does not depend on the app is done while it waits (the store opened, this process's
    context and both start times read). Once it took a request it registers the app before it builds the
    supervisor: the caller's ``R`` costs one store write, and the rest (reading the request, the caller's
    environment, the supervisor's set-up) runs after the caller has its answer. The signals the supervisor
    handles are blocked until its handlers are in place (:meth:`SupervisorState._setup
    <tsm.schedulers.local.state.SupervisorState._setup>` unblocks them): one that comes in between is
    delivered then, never lost to its default action.
    """
    import signal

    code = 0
    try:
        from tsm.schedulers.local import _os, caller, supervisor
        from tsm.schedulers.local.state import HANDLED, bind_listener
        from tsm.store import Store

        store = Store()  # opened while waiting: one step less once a request comes
        # read while waiting too: a request compares the caller's to it
        mine = (caller.context(os.getpid()), caller.own_personality())
        ids = supervisor.process_ids()
        _rehearse(store, home, mine, ids)
        got = _next_request(listener, quit_r, home, mine)
        if got is None:
            store.close()
            return  # the launcher ended (closed its end) before anyone asked
        conn, (app_dir, ready_w, limits, queued, umask) = got
        with contextlib.suppress(OSError):
            conn.sendall(b"F")
        conn.close()
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        log = os.open(os.path.join(app_dir, "supervisor.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(log, 2)
        os.close(log)
        own = bind_listener(app_dir)
        if not supervisor.register(store, app_dir, queued, ids, ready_w, own[1]):
            return  # cancelled first, or another supervisor has it (its caller gave up on this one)
        # The watchdog watches this app from now on (told after the R: its start would compete with this
        # process for the cores. Should this process die before the write, the watchdog leaves, and a
        # reader records the app FAILED as for any app whose supervisor and watchdog are both gone.)
        os.write(app_w, os.fsencode(app_dir))
        os.close(app_w)
        try:  # taken: the launcher forks the next standby now, after the caller's critical path
            with contextlib.suppress(OSError):  # the launcher is gone: nothing to tell
                os.write(taken_w, _TAKEN.pack(ids[2]))
        finally:
            os.close(taken_w)
        _os.set_cmdline(sys.executable, "-m", "tsm.schedulers.local.supervisor", app_dir)
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        code = supervisor.run_app(app_dir, -1, take_env=True, store=store, listener=own, umask=umask)
    except BaseException:  # noqa: BLE001 - a forked child never returns into the launcher's loop
        import traceback

        with contextlib.suppress(OSError):
            traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _rehearse(store: Any, home: str, own: tuple[tuple[object, ...], bytes],
              ids: tuple[int, int | None, int, int | None]) -> None:
    """Run, once and on nothing, the code a taken standby runs between its caller's request and its ``R``.

    A standby is a fresh fork of the launcher: the first run of any code in it faults in a private copy of
    every page whose objects it touches (a reference count is a write), a few microseconds a page, and
    SQLite compiles the registration statement on its first use. Done here, while it waits, that is off the
    caller's critical path; the pages would be copied anyway once the standby runs its app. What it runs:
    :func:`_take` and the answers on a request it sends itself over a socket pair (for the app folder
    ``.rehearsal``, which no app id names; nothing is created for it), the listener's bind (in the
    launcher's own folder, removed at once) and the registration's ``UPDATE`` for the app id "" (no app has
    it: nothing changes). Measured on the 2-core VM: a request's way from the message to the ``R`` went from
    1.3-1.6 to 0.8-1.0 ms. Best effort: a failure here changes nothing.
    """
    from tsm.schedulers.local import supervisor
    from tsm.schedulers.local.state import bind_listener

    with contextlib.suppress(Exception):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        r, w = os.pipe()
        try:
            msg = b"0 0 0 " + own[1] + b" " + os.fsencode(os.path.join(home, "local", ".rehearsal"))
            socket.send_fds(a, [msg], [w])
            taken = _take(b, home, own)
            if taken is not None:
                try:
                    b.sendall(b"F")
                    os.write(taken[1], b"R")
                finally:
                    os.close(taken[1])
        finally:
            for end in (a, b):
                end.close()
            for fd in (r, w):
                os.close(fd)
    with contextlib.suppress(Exception):
        listener, path = bind_listener(launcher_dir(home))
        listener.close()
        os.unlink(path)
    with contextlib.suppress(Exception):
        supervisor.take_row(store, "", False, ids)


def _take(conn: socket.socket, home: str,
          own: tuple[tuple[object, ...], bytes]) -> tuple[str, int, tuple[int, int], bool, int] | None:
    """Read and check one request: ``(app_dir, ready pipe, open-file limits, queued, the caller's umask)``, or
    None to refuse it.

    Refused: another user's process (before anything is read), a caller whose :func:`.caller.context` or
    personality differs from this process's (``own``), an app folder outside ``$TSM_HOME/local``, limits this
    process cannot give, a request that does not come within :data:`ACK_TIMEOUT` of the connection, or a
    caller that already hung up (it gave up waiting and spawned one).
    """
    from tsm.schedulers.local import caller

    conn.setblocking(True)
    conn.settimeout(ACK_TIMEOUT)
    if _peer_uid(conn) != os.getuid():
        return None
    peer = _peer_pid(conn)
    if caller.context(peer) != own[0]:
        return None  # the caller's groups, affinity, cgroup, limits, ... differ from ours: it spawns its own
    umask = caller.umask_of(peer)
    msg, fds, _, _ = socket.recv_fds(conn, 8192, 1)
    try:
        soft, hard, queued, persona, raw = msg.split(b" ", 4)
        app_dir = os.fsdecode(raw)
        limits = (int(soft), int(hard))
        import resource

        mine = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        ok = (len(fds) == 1 and queued in (b"0", b"1") and persona == own[1] and os.path.isabs(app_dir)
              and os.path.normpath(app_dir) == app_dir and os.path.basename(app_dir) not in ("", ".", "..")
              and os.path.dirname(app_dir) == os.path.join(home, "local"))
        if ok and (mine == resource.RLIM_INFINITY or (limits[1] != resource.RLIM_INFINITY and limits[1] <= mine)):
            conn.setblocking(False)
            try:
                gone = conn.recv(1) == b""
            except BlockingIOError:
                gone = False
            if not gone:
                ready_w = fds.pop()
                return app_dir, ready_w, limits, queued == b"1", umask
    except ValueError:
        pass
    finally:
        for fd in fds:
            os.close(fd)
    return None
