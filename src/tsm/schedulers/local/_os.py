"""Small Linux process primitives the local scheduler needs, from the standard library and ctypes.

- :func:`set_child_subreaper`: orphaned descendants (double-forked daemons) become our children, so
  an app's whole process tree can be found and ended.
- :func:`start_time`: a process's start time in clock ticks, to tell a live pid from a reused one.
- :func:`children`: the direct children of a process.
- :class:`Inotify`: file-change events, so log indexing and tailing react to writes instead of polling.
- :func:`unix_address`: a socket path usable even past the 107-byte ``sun_path`` limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

PR_SET_CHILD_SUBREAPER = 36

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            from ctypes.util import find_library

            _libc = ctypes.CDLL(find_library("c"), use_errno=True)
    return _libc


def set_child_subreaper() -> bool:
    """Make orphaned descendants of this process re-parent to it; False where the OS can't."""
    try:
        return int(_lib().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/pid/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":  # a zombie has exited already
        return None
    return int(fields[19])


def is_alive(pid: int | None, started: int | None) -> bool:
    """True when ``pid`` runs and is the same process that started at ``started`` ticks."""
    if not pid:
        return False
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def wait_exit(pid: int, started: int | None, timeout: float | None) -> None:
    """Block until ``pid`` (started at ``started`` ticks) exits or ``timeout`` passes, via a pidfd.

    Falls back to short sleeps only where pidfds are missing (Linux before 5.3).
    """
    import select
    import time

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        deadline = None if timeout is None else time.monotonic() + timeout
        while is_alive(pid, started) and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.005)
        return
    try:
        if is_alive(pid, started):  # the pid may have been reused between our check and pidfd_open
            select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all its threads'), via /proc/pid/task/*/children or a /proc scan."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    found = False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(p) for p in f.read().split())
            found = True
        except OSError:
            continue
    if found:
        return out
    for entry in os.listdir("/proc"):  # kernels without CONFIG_PROC_CHILDREN
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    data = f.read()
                if int(data[data.rindex(b")") + 2 :].split()[1]) == pid:
                    out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


class Inotify:
    """A non-blocking inotify instance: :meth:`add` a path, :meth:`read` ``(watch, mask, name)`` events."""

    _EVENT = struct.Struct("iIII")

    def __init__(self) -> None:
        fd = int(_lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def add(self, path: str, mask: int = IN_MODIFY) -> int:
        """Watch ``path``; returns the watch descriptor that events carry."""
        wd = int(_lib().inotify_add_watch(self.fd, os.fsencode(path), mask))
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        return wd

    def remove(self, wd: int) -> None:
        """Stop watching ``wd`` (ignored when already gone)."""
        _lib().inotify_rm_watch(self.fd, wd)

    def read(self) -> Iterator[tuple[int, int, str]]:
        """All queued events, ``(wd, mask, name)``; nothing when none are queued."""
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            pos = 0
            size = self._EVENT.size
            while pos < len(buf):
                wd, mask, _cookie, length = self._EVENT.unpack_from(buf, pos)
                name = buf[pos + size : pos + size + length].rstrip(b"\0").decode(errors="replace")
                pos += size + length
                yield wd, mask, name

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def unix_address(path: str) -> tuple[str, int | None]:
    """An address for ``path`` that fits ``sun_path``; returns ``(address, dir_fd_to_close)``.

    Long paths go through ``/proc/self/fd/<dirfd>/<name>`` of an opened directory descriptor, which
    the caller closes once ``bind``/``connect`` returned.
    """
    if len(os.fsencode(path)) < 100:
        return path, None
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{dfd}/{os.path.basename(path)}", dfd


def makedirs_private(path: str) -> None:
    """Create ``path`` and each missing parent with mode 0700, whatever the caller's umask.

    ``os.makedirs(mode=...)`` applies the mode to the last folder only; parents it makes get
    ``0777 & ~umask``, which is world-writable under ``umask 0``. Existing folders are left as they are.
    """
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
            continue
        os.chmod(d, 0o700)  # mkdir's mode is masked by the umask; the owner's bits must all be there
