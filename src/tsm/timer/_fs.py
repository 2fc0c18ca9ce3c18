"""Filesystem rules for the rendezvous files of the FIFO and socket servers.

* The parent directory must be safe: owned by the server's user (and not world-writable without the sticky
  bit), or owned by root with the sticky bit (``/tmp``), where nobody else can rename or replace our file.
* The file is created mode 0600; an existing file is replaced only if it is a stale FIFO/socket of ours.
* Unix socket addresses are limited to 107 bytes; longer paths are reached through an ``O_PATH`` descriptor of
  the directory as ``/proc/self/fd/<fd>/<name>`` (no chdir, so it is thread-safe).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator

from tsm.errors import TimerError

SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 for the terminating NUL

Ident = tuple[int, int]  # (st_dev, st_ino) of the file a server created


def check_parent_dir(path: str) -> None:
    """Raise TimerError unless ``path``'s directory is one where only we (or root) can replace files."""
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    try:
        st = os.stat(parent)
    except OSError as e:
        raise TimerError(f"timer directory {parent} is not usable: {e.strerror}") from e
    euid = os.geteuid()
    sticky = bool(st.st_mode & stat.S_ISVTX)
    if st.st_uid == euid:
        if st.st_mode & stat.S_IWOTH and not sticky:
            raise TimerError(
                f"timer directory {parent} is world-writable without the sticky bit; use a private one"
            )
        return
    if st.st_uid == 0 and sticky:
        return
    raise TimerError(
        f"timer directory {parent} belongs to uid {st.st_uid}, not to you (uid {euid}); "
        "put the timer file in a directory you own (e.g. one made by tempfile.mkdtemp())"
    )


def _clear_stale(path: str, kind: int, what: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_IFMT(st.st_mode) != kind or st.st_uid != os.geteuid():
        raise TimerError(f"{path} already exists and is not a {what} of yours; refusing to replace it")
    os.unlink(path)


def make_fifo(path: str) -> Ident:
    """Create the FIFO ``path`` with mode 0600 (replacing a stale FIFO of ours) and return its identity."""
    check_parent_dir(path)
    _clear_stale(path, stat.S_IFIFO, "FIFO")
    os.mkfifo(path, 0o600)
    st = os.lstat(path)
    if stat.S_IMODE(st.st_mode) != 0o600:
        os.chmod(path, 0o600)
    return (st.st_dev, st.st_ino)


def remove_if_ours(path: str, ident: Ident | None) -> None:
    """Unlink ``path`` if it is still the file we created (a newer server may have replaced it)."""
    if ident is None:
        return
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == ident:
            os.unlink(path)
    except OSError:
        pass


@contextlib.contextmanager
def unix_address(path: str) -> Iterator[str]:
    """Yield an address for ``path`` that fits ``sun_path``; long paths go through a directory descriptor."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield path
        return
    directory, name = os.path.split(os.path.abspath(path))
    try:
        dirfd = os.open(directory or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise TimerError(f"cannot open the directory of timer socket {path}: {e.strerror}") from e
    try:
        short = f"/proc/self/fd/{dirfd}/{name}"
        if len(os.fsencode(short)) > SUN_PATH_MAX:
            raise TimerError(
                f"timer socket name {name!r} is too long (the file name alone must fit in ~90 bytes)"
            )
        yield short
    finally:
        os.close(dirfd)


def bind_socket(path: str, backlog: int) -> tuple[socket.socket, Ident]:
    """Listen on a new unix stream socket at ``path`` (mode 0600, stale socket of ours replaced)."""
    check_parent_dir(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise TimerError(f"{path} already exists and is not a socket of yours; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            with unix_address(path) as addr:
                probe.connect(addr)
        except OSError:
            os.unlink(path)  # nobody listens: a stale socket of a dead server
        else:
            raise TimerError(f"another timer server is listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with unix_address(path) as addr:
            sock.bind(addr)
        os.chmod(path, 0o600)
        sock.listen(backlog)
        st = os.lstat(path)
    except BaseException:
        sock.close()
        raise
    return sock, (st.st_dev, st.st_ino)


def connect_socket(path: str, timeout: float | None) -> socket.socket:
    """Connect a unix stream socket to ``path`` (long paths supported); OSError if nobody listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        with unix_address(path) as addr:
            sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return sock
