"""The ``tsm`` command's side of the per-user command server: run a read (``tsm status``, ``list``, ``--help``) in a
process that has already imported what it needs, or say that none could.

Why. A read's own work takes a few milliseconds; importing what does it (the runner, the store, SQLite,
argparse) costs several times a bare interpreter's start. :mod:`tsm.cli._server` keeps those imports and
forks one process per command, which runs exactly what ``tsm`` would run here, with this process's
arguments, environment, working directory and standard streams (passed as descriptors), and answers its
exit code. So the output is the same bytes, to the same files, terminals and pipes.

This module imports nothing beyond what a Python start has loaded, plus the ``_socket`` extension.
:func:`served` returns None whenever the server cannot serve (none is running, it runs other code, it does
not answer within :data:`ANSWER_TIMEOUT`, ``TSM_CLI_SERVER=0``): the caller then runs the command itself,
and :func:`after_local_read` starts a server once reads come again and again (:data:`AGAIN` seconds apart
at most), so a one-off command never leaves a process behind. Inside a replica of an app nothing is served
or started (the server would carry the replica's environment and be stopped with it).
"""

from __future__ import annotations

import os
import sys

#: The commands a server runs: reads, which never prompt and end on their own.
READS = frozenset(("status", "list", "describe", "builtins", "runopts"))

#: Seconds to wait for the server's first word before running the command here instead.
ANSWER_TIMEOUT = 1.0

#: A read done here starts a server when the previous one (in the same home, same code) was this recent.
AGAIN = 60.0

#: The protocol's name, first in every request: a server of another version answers nothing.
MAGIC = b"TSM-CLI-1"

#: The program a new server runs (``python -c``): leave the working directory before importing anything, and
#: take the caller's import path, so the server imports exactly what the caller would.
SERVER_PROGRAM = (
    "import os, sys; os.chdir('/'); sys.path[:] = sys.argv[3:]; from tsm.cli._server import serve; "
    "sys.exit(serve(sys.argv[1], sys.argv[2]))"
)


def servable(argv: list[str]) -> bool:
    """Whether ``tsm ARGV`` is a read the server runs: a read subcommand, or ``tsm``'s own help or version."""
    if not argv:
        return True
    return argv[0] in READS or argv[0] in ("-h", "--help", "--version")


def enabled() -> bool:
    """False with ``TSM_CLI_SERVER=0``, and inside a replica of an app (``TSM_APP_ID`` is set)."""
    return os.environ.get("TSM_CLI_SERVER", "1") != "0" and "TSM_APP_ID" not in os.environ


def home() -> str:
    """``$TSM_HOME`` (default ``~/.tsm``) as an absolute path: what :func:`tsm.store.tsm_home` opens."""
    return os.path.abspath(os.environ.get("TSM_HOME") or os.path.join(os.path.expanduser("~"), ".tsm"))


def code_id() -> str:
    """What a server must share with this process to run its command: the interpreter, where tsm is, the import
    path, the file-name encoding, the host and tsm's version, as a short FNV-1a hash (no hashlib: start-up)."""
    import tsm

    text = "\0".join((sys.executable, os.path.dirname(os.path.abspath(tsm.__file__)), *sys.path,
                      sys.getfilesystemencoding(), os.uname().nodename, tsm.__version__))
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8", "surrogateescape"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def ours_alone(path: str) -> bool:
    """Whether ``path`` is a real folder (not a link) of this user's that nobody else may write to: the rule
    :func:`tsm.store.tsm_home` applies, checked here before the cache writes its marker or socket."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_mode & 0o170000) == 0o040000 and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def socket_path(home_dir: str, key: str) -> str:
    return os.path.join(home_dir, "cli", f"{key}.sock")


def _address(path: str) -> tuple[str, int | None]:
    """``path`` as a Unix socket address (``sun_path`` holds ~100 bytes): a longer one through an opened folder."""
    if len(os.fsencode(path)) < 100:
        return path, None
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def request(argv: list[str]) -> bytes:
    """The request for ``tsm ARGV`` from this process: what the server's child takes on (see :mod:`tsm.cli._server`)."""
    umask = os.umask(0o077)
    os.umask(umask)
    streams = []
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        streams += [getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None) or "strict"]
    fields = [MAGIC, os.getcwd(), str(umask), sys.argv[0] if sys.argv else "tsm", *streams, str(len(argv)), *argv,
              *(f"{k}={v}" for k, v in os.environ.items())]
    body = b"\0".join(f if isinstance(f, bytes) else os.fsencode(f) for f in fields)
    return b"%010d" % len(body) + body


def served(argv: list[str]) -> int | None:
    """Run ``tsm ARGV`` in this user's command server; its exit code, or None when it cannot (then run it here)."""
    if not (servable(argv) and enabled()):
        return None
    try:
        import _socket
    except ImportError:
        return None
    home_dir = home()
    path = socket_path(home_dir, code_id())
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | getattr(_socket, "SOCK_CLOEXEC", 0))
    try:
        addr, fd = _address(path)
        try:
            sock.connect(addr)
        finally:
            if fd is not None:
                os.close(fd)
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
        if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
            sock.close()
            return None
        sock.settimeout(ANSWER_TIMEOUT)
        word = _line(sock)  # the standby's pid: it took this connection
        if not word.startswith(b"P"):
            sock.close()
            return None
        pid = int(word[1:])
        fds = b"".join(n.to_bytes(4, sys.byteorder, signed=True) for n in (0, 1, 2))
        # the request is the go: from here on the command runs there (unless it answers "stale" first)
        data = request(argv)
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        if sent < len(data):  # a stream may take a large environment in pieces: the rest follows
            sock.sendall(data[sent:])
    except (OSError, ValueError):
        sock.close()
        return None
    except KeyboardInterrupt:  # before the go: nothing ran there, nothing runs here
        sock.close()
        sys.stderr.write("interrupted\n")
        return 130
    return _wait(sock, pid)


def _line(sock: object) -> bytes:
    """One ``\\n``-ended word from the server (without the ``\\n``); b"" when it hung up first."""
    out = b""
    while not out.endswith(b"\n"):
        chunk = sock.recv(64)  # type: ignore[attr-defined]
        if not chunk:
            return b""
        out += chunk
    return out[:-1]


def _wait(sock: object, pid: int) -> int | None:
    """The exit code the command's process reports (None: it refused, stale, and ran nothing); a Ctrl-C here is
    passed on to it, as a terminal would."""
    import _signal  # type: ignore[import-not-found]  # loaded at every start; `signal` would import enum

    sock.settimeout(None)  # type: ignore[attr-defined]
    interrupts = 0
    try:
        while True:
            try:
                word = _line(sock)
                break
            except KeyboardInterrupt:
                interrupts += 1
                try:  # noqa: SIM105 - contextlib would cost start-up an import
                    os.kill(pid, _signal.SIGINT if interrupts == 1 else _signal.SIGKILL)
                except OSError:  # it ended meanwhile
                    pass
            except OSError:
                word = b""
                break
    finally:
        sock.close()  # type: ignore[attr-defined]
    if word.startswith(b"X"):
        return int(word[1:])
    if word == b"S" and not interrupts:
        return None  # its code changed: nothing ran there
    sys.stderr.write("error: the tsm command server's process ended without an exit status (run with "
                     "TSM_CLI_SERVER=0 to run commands in this process)\n")
    return 130 if interrupts else 1


def after_local_read(argv: list[str]) -> None:
    """After ``tsm ARGV`` ran here: start a command server when reads come again and again (see the module doc).

    A marker file in ``$TSM_HOME/cli`` records the last read done here; nothing is made when the home does
    not exist (``tsm --help`` on a fresh account creates no home), or is not this user's alone.
    """
    if not (servable(argv) and enabled()):
        return
    home_dir = home()
    if not ours_alone(home_dir):
        return  # no home, or one tsm refuses (the command said why): nothing is written in it
    key = code_id()
    folder = os.path.join(home_dir, "cli")
    marker = os.path.join(folder, f"{key}.read")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not ours_alone(folder):
            return
        import time

        try:
            recent = time.time() - os.stat(marker).st_mtime < AGAIN
        except FileNotFoundError:
            recent = False
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        os.utime(marker)
        if recent:
            start(home_dir, key)
    except OSError:
        return  # a cache only: a home we cannot write to serves no command faster, and nothing else changes


def start(home_dir: str, key: str) -> None:
    """Start a detached command server for ``home_dir`` (it exits at once if one already runs)."""
    devnull = os.devnull
    os.posix_spawn(
        sys.executable, [sys.executable, "-c", SERVER_PROGRAM, home_dir, key, *sys.path], os.environ,
        file_actions=[(os.POSIX_SPAWN_OPEN, 0, devnull, os.O_RDONLY, 0),
                      (os.POSIX_SPAWN_OPEN, 1, devnull, os.O_WRONLY, 0),
                      (os.POSIX_SPAWN_OPEN, 2, devnull, os.O_WRONLY, 0)],
        setsid=True,
    )
