"""The per-user command server: reads (``tsm status``, ``list``, ``--help``) run in a process forked from one that
has imported what they need (see :mod:`tsm.cli._client` for why, and for the caller's side).

Its life. A ``tsm`` read that finds no server, soon after another, starts one (detached, in a session of its
own, working directory ``/``, the caller's import path). It takes ``$TSM_HOME/cli/<key>.lock`` (one server per
home and code, released by the kernel however it ends), imports what reads import, binds ``<key>.sock`` (a
0700 folder: only its owner can connect, and every caller's uid is checked again with ``SO_PEERCRED``) and
serves. It exits after :data:`IDLE` seconds without a request (``TSM_CLI_SERVER_IDLE``), when its socket is
no longer its own (the home was removed), and when a source file it imported changed (an upgrade, an edit):
a request then gets "no" and runs in the caller, so a command never runs old code.

A request. A *standby*, forked by the server before anyone asked (one thread, so forking is safe), waits
in ``accept``; the server forks the next one once it has ended (so its rehearsal never competes with the
command for a core). The caller sends its working
directory, umask, standard streams' encodings, arguments and environment, and its descriptors 0, 1 and 2
(``SCM_RIGHTS``), once the standby has said its pid: the request is the go (a caller that gave up first hung
up, and nothing runs). The standby takes on the caller's directory, umask, environment (time zone included)
and streams, runs :func:`tsm.cli.main.main` with the arguments, runs the exit handlers, flushes, and answers
its exit code (or "stale" before running anything, when a source file changed). Children are reaped by the kernel (``SIGCHLD`` ignored in the server, restored for the command);
standbys end with the server (a pipe they watch closes, even when it is killed).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import select
import signal
import socket
import sys
import time

from tsm.cli import _client

#: Seconds without a request before the server exits (``TSM_CLI_SERVER_IDLE`` overrides).
IDLE = 300.0

#: Seconds between two checks that the socket and the code are still current, while no request comes.
CHECK_INTERVAL = 2.0

#: The most a request may be (its arguments and environment): more is refused, and runs in the caller.
MAX_REQUEST = 4 << 20

#: What reads import: imported once here, so no child imports them again.
WARM = ("json", "sqlite3", "argparse", "textwrap", "shutil", "tsm.cli.main", "tsm.cli._parser", "tsm.cli.cmd_status",
        "tsm.cli.cmd_list", "tsm.cli.cmd_describe", "tsm.cli.cmd_runopts", "tsm.cli.cmd_builtins",
        "tsm.runner.api", "tsm.history", "tsm.store", "tsm.sweep", "tsm.sweep.status", "tsm.specs.api")


def serve(home: str, key: str) -> int:
    """Run the server of ``home`` for code ``key`` until it is idle, replaced or stale (see the module doc)."""
    folder = os.path.join(home, "cli")
    if not _client.ours_alone(home):
        return 0  # a home tsm refuses serves nothing
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if not _client.ours_alone(folder):
        return 0
    lock = os.open(os.path.join(folder, f"{key}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another server serves this home and code
    warm()
    if not _one_thread():
        return 0  # something started a thread: forking would copy it half-way; callers run commands themselves
    code = Sources()
    listener, path, ino = _listen(_client.socket_path(home, key))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    gc.freeze()  # what was imported stays put: a child's collections never touch (and copy) those pages
    idle = float(os.environ.get("TSM_CLI_SERVER_IDLE") or IDLE)
    taken_r, taken_w = os.pipe2(os.O_CLOEXEC)  # a standby says here that it took a request (or that code changed)
    life_r, life_w = os.pipe2(os.O_CLOEXEC)  # standbys watch its other end: it closes when the server ends
    standby, watch, taken, failed = 0, None, False, 0
    try:
        last = time.monotonic()
        while True:
            if not standby:
                standby, taken = _fork_standby(listener, code, taken_w, life_r, (taken_r, life_w, lock)), False
                watch = _pidfd(standby)
            timeout = min(CHECK_INTERVAL, max(0.01, last + idle - time.monotonic()))
            ready, _, _ = select.select([taken_r] if watch is None else [taken_r, watch], [], [], timeout)
            if taken_r in ready:
                if b"S" in os.read(taken_r, 64):
                    return 0  # the code changed: the callers run their commands themselves
                last, taken, failed = time.monotonic(), True, 0
                if watch is None:
                    standby = 0  # no pidfd here: the next standby is forked as soon as this one is taken
            if watch is not None and watch in ready:  # it ended: the next one is forked now, off the command's way
                os.close(watch)
                watch, standby, failed = None, 0, failed + (not taken)
                if failed >= 3:
                    return 0  # standbys that cannot take a request (out of descriptors?): stop forking them
            elif not ready and (time.monotonic() - last >= idle or not _ours(path, ino) or code.changed()):
                return 0
    finally:  # closing the life pipe ends a waiting standby; one that took a request finishes it
        with contextlib.suppress(OSError):
            if _ours(path, ino):
                os.unlink(path)
        listener.close()
        for fd in (taken_r, taken_w, life_r, life_w, lock, *([watch] if watch is not None else [])):
            os.close(fd)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` ends (Linux 5.3+), or None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _fork_standby(listener: socket.socket, code: Sources, taken_w: int, life_r: int, servers: tuple[int, ...]) -> int:
    """Fork the process that takes the next request (forked before it comes: the caller waits for no fork);
    ``servers`` are the server's own descriptors, which the standby closes (the life pipe's write end with them)."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the standby: wait for a caller, or for the server's end
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # what the command starts, it waits for itself
        for fd in servers:
            os.close(fd)
        gc.disable()  # a command of milliseconds: collections would only copy the server's pages
        rehearse()
        ready, _, _ = select.select([listener.fileno(), life_r], [], [])
        if life_r in ready:
            os._exit(0)
        conn, _ = listener.accept()
    except BaseException:  # noqa: BLE001 - a standby that cannot take one ends; the server forks another
        os._exit(0)
    os.write(taken_w, b"T")
    listener.close()
    with conn:
        if not handle(conn, code):
            os.write(taken_w, b"S")
    os._exit(0)


def warm() -> None:
    """Import what reads import, and build the objects each builds only once a process (the default scheduler's
    module, argparse's help formatter): nothing that holds a file, a connection or a thread."""
    import importlib

    for name in WARM:
        importlib.import_module(name)
    from tsm.schedulers import DEFAULT_SCHEDULER, get_scheduler_factory

    get_scheduler_factory(DEFAULT_SCHEDULER)("warm").close()  # imports its module; opens nothing until asked
    from tsm.cli._parser import build_parser

    build_parser([]).format_help()
    from tsm.runner.events import sinks

    sinks()  # the event sinks' entry points, read once a process (a package installed later restarts the server)


def rehearse() -> None:
    """Run the reads once, their output dropped (the newest app's status and a one-line list, or the status of an
    app that does not exist in an empty home, and the help): the pages a command touches are copied from the
    server now, while the standby waits, not while a caller does."""
    import io

    from tsm.cli.main import main
    from tsm.history import History
    from tsm.schedulers import DEFAULT_SCHEDULER

    real = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = io.StringIO()
    try:
        newest = [f"{DEFAULT_SCHEDULER}://rehearsal/none-00000000"]
        with contextlib.suppress(Exception):
            history = History()
            try:
                newest = [r.handle for r in history.recent(1) if r.state.is_terminal] or newest
            finally:
                history.close()
        for argv in (["status", newest[0]], ["list", "--limit", "1"], ["--help"]):
            with contextlib.suppress(BaseException):
                main(argv)
    finally:
        sys.stdout, sys.stderr = real


def _one_thread() -> bool:
    """Whether this process has one thread (what plugins loaded while warming may have changed): only then is
    forking it safe."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        import threading

        return threading.active_count() == 1


class Sources:
    """The size and modification time of every source file of tsm this process imported, and of the import
    path's folders (a package installed or removed): :meth:`changed` says whether any moved since."""

    def __init__(self) -> None:
        self.seen = {path: self._stat(path) for path in self._paths()}

    @staticmethod
    def _paths() -> list[str]:
        import tsm

        root = os.path.dirname(os.path.abspath(tsm.__file__))
        files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
        return [f for f in files if f and f.startswith(root)] + [p for p in sys.path if p] + [sys.executable]

    @staticmethod
    def _stat(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def changed(self) -> bool:
        return any(self._stat(path) != seen for path, seen in self.seen.items())


def _listen(path: str) -> tuple[socket.socket, str, int]:
    """A listening socket at ``path``, bound under a name of its own and renamed there (one atomic step); with
    the inode of its file, which says later whether ``path`` is still this server's."""
    tmp = f"{path}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    addr, fd = _client._address(tmp)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        listener.bind(addr)
    finally:
        if fd is not None:
            os.close(fd)
    os.chmod(tmp, 0o600)
    listener.listen(64)
    os.rename(tmp, path)
    return listener, path, os.stat(path).st_ino


def _ours(path: str, ino: int) -> bool:
    """Whether ``path`` is still the socket file this server bound (not removed, not another server's)."""
    try:
        return os.stat(path).st_ino == ino
    except OSError:
        return False


def handle(conn: socket.socket, code: Sources) -> bool:
    """Serve one connection in this (standby) process; False when the code changed (the server should exit).

    The standby's pid goes first; the caller's request, which comes only once the caller has it, is its go: a
    caller that gave up before (and runs the command itself) hung up, and nothing runs here.
    """
    conn.settimeout(_client.ANSWER_TIMEOUT)
    fds: list[int] = []
    try:
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
            return True  # another user: nothing to say
        conn.sendall(b"P%d\n" % os.getpid())
        body, fds = _receive(conn)
        if code.changed():
            conn.sendall(b"S\n")
            return False
        if body is None or len(fds) != 3:
            conn.sendall(b"S\n")
            return True
        _child(conn, body, fds)  # never returns
    except OSError:
        return True
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    return True


def _receive(conn: socket.socket) -> tuple[bytes | None, list[int]]:
    """The request's body (None when it is not one) and the descriptors that came with it."""
    import array

    data, ancillary, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    out = list(fds)
    if len(data) < 10 or not data[:10].isdigit():
        return None, out
    size = int(data[:10])
    if size > MAX_REQUEST:
        return None, out
    while len(data) - 10 < size:
        chunk = conn.recv(min(1 << 20, size - len(data) + 10))
        if not chunk:
            return None, out
        data += chunk
    body = data[10:]
    return (body if body.startswith(_client.MAGIC + b"\0") else None), out


def _child(conn: socket.socket, body: bytes, fds: list[int]) -> None:
    """Run the request's command as the caller would have, then ``os._exit`` (see the module doc)."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        conn.settimeout(None)
        argv = _take_on(body, fds)
        from tsm.cli.main import main

        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except KeyboardInterrupt:
            code = 130
        _finish()
    except BaseException:  # noqa: BLE001 - reported on the caller's stderr, as the interpreter would
        import traceback

        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stderr.flush()
    with contextlib.suppress(OSError):
        conn.sendall(b"X%d\n" % code)
    os._exit(code & 0xFF)


def _take_on(body: bytes, fds: list[int]) -> list[str]:
    """Become the caller: its directory, umask, environment, time zone and standard streams; its arguments."""
    import io

    fields = [os.fsdecode(f) for f in body.split(b"\0")]
    cwd, umask, argv0 = fields[1], int(fields[2]), fields[3]
    encodings = fields[4:10]
    n = int(fields[10])
    argv = fields[11 : 11 + n]
    env = dict(f.partition("=")[::2] for f in fields[11 + n :])
    os.chdir(cwd)
    os.umask(umask)
    os.environ.clear()
    os.environ.update(env)
    time.tzset()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    streams = []
    for target in range(3):
        encoding, errors = encodings[2 * target], encodings[2 * target + 1]
        raw = io.FileIO(target, "r" if target == 0 else "w", closefd=False)
        buffered = io.BufferedReader(raw) if target == 0 else io.BufferedWriter(raw)
        tty = os.isatty(target)
        # as the interpreter makes them: stdout line-buffered on a terminal, stderr always
        streams.append(io.TextIOWrapper(buffered, encoding=encoding, errors=errors, line_buffering=tty or target == 2))
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.argv = [argv0, *argv]
    return argv


def _finish() -> None:
    """What the interpreter does at exit: the exit handlers, then flush the streams (a closed pipe is no error)."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
