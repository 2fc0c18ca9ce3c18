"""Small Linux process primitives the local scheduler needs, from the standard library and ctypes.

- :func:`set_child_subreaper`: orphaned descendants (double-forked daemons) become our children, so
  an app's whole process tree can be found and ended.
- :func:`start_time`: a process's start time in clock ticks, to tell a live pid from a reused one;
  "cannot read" is an error, never "gone".
- :func:`children`, :func:`descendants`, :func:`replica_of`: a process tree, and which replica an
  escaped process came from.
- :class:`Inotify`: file-change events, so log indexing and tailing react to writes instead of polling.
- :func:`unix_address`: a socket path usable even past the 107-byte ``sun_path`` limit.
"""

from __future__ import annotations

import contextlib
import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes
    import socket
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
    """libc through ctypes, loaded on first use (``tsm status`` and ``tsm list`` never need it)."""
    global _libc
    if _libc is None:
        import ctypes

        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            from ctypes.util import find_library

            _libc = ctypes.CDLL(find_library("c"), use_errno=True)
    return _libc


def _errno() -> int:
    """The errno of the last libc call made through :func:`_lib`."""
    import ctypes

    return ctypes.get_errno()


def set_child_subreaper() -> bool:
    """Make orphaned descendants of this process re-parent to it; False where the OS can't."""
    try:
        return int(_lib().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> list[bytes] | None:
    """Fields of /proc/pid/stat after the command name (state first), None when ``pid`` is gone.

    Only "no such process" means gone: any other error (``EMFILE`` in a caller whose fd table is full,
    ``EACCES``, ...) is raised, so a reader never mistakes "could not look" for "not there".
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(b")") + 2 :].split()


def group_alive(pgid: int) -> bool:
    """True while any process is in process group ``pgid`` (zombies not yet reaped included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cpu_by_session() -> dict[int, int]:
    """CPU time (clock ticks: user, system, and that of reaped children) of every process, summed per session.

    One pass over ``/proc`` for all of a supervisor's replicas (each leads a session of its own): the
    stall check's one batched read per tick. Processes that vanish or cannot be read are skipped.
    """
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2 :].split()
            sid, used = int(fields[3]), sum(int(x) for x in fields[11:15])
        except (OSError, ValueError, IndexError):
            continue
        out[sid] = out.get(sid, 0) + used
    return out


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/pid/stat), None if gone.

    Raises :class:`OSError` when the answer cannot be read (see :func:`_stat`).
    """
    fields = _stat(pid)
    if fields is None or fields[0] == b"Z":  # a zombie has exited already
        return None
    return int(fields[19])


def ids(pid: int) -> tuple[int, int] | None:
    """``(process group, session)`` of a live ``pid``; None when it is gone or a zombie (never raises)."""
    try:
        fields = _stat(pid)
    except OSError:
        return None
    if fields is None or fields[0] == b"Z":
        return None
    return int(fields[2]), int(fields[3])


def alive_for_sure(pid: int, started: int | None) -> bool:
    """True only when ``pid`` is known to be the same live process (before signalling it)."""
    try:
        return is_alive(pid, started)
    except OSError:
        return False


def is_alive(pid: int | None, started: int | None) -> bool:
    """True when ``pid`` runs and is the same process that started at ``started`` ticks.

    Raises :class:`OSError` when this process cannot tell (its own fd table is full, ...): a caller
    must then act as if the process might be alive.
    """
    if not pid:
        return False
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def wait_exit(pid: int, started: int | None, timeout: float | None) -> None:
    """Block until ``pid`` (started at ``started`` ticks) exits or ``timeout`` passes, via a pidfd.

    Falls back to short sleeps only where pidfds are missing (Linux before 5.3). Uses ``poll``, so
    it works in a process holding more than 1024 descriptors.
    """
    import select
    import time

    def alive() -> bool:
        try:
            return is_alive(pid, started)
        except OSError:
            return True

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        deadline = None if timeout is None else time.monotonic() + timeout
        while alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.005)
        return
    try:
        if alive():  # the pid may have been reused between our check and pidfd_open
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(None if timeout is None else max(0, int(timeout * 1000) + 1))
    finally:
        os.close(fd)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, their children, ...), parents before children."""
    out: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        for kid in children(todo.pop()):
            if kid not in seen:
                seen.add(kid)
                out.append(kid)
                todo.append(kid)
    return out


def replica_of(pid: int) -> tuple[str, str, str] | None:
    """``(TSM_APP_ID, TSM_ROLE_NAME, TSM_REPLICA_ID)`` from the environment ``pid`` was started with.

    Lets the supervisor tell which replica a process that escaped its process group (``setsid``)
    came from; None when unreadable or not set (a process that scrubbed its environment).
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    found: dict[bytes, bytes] = {}
    for item in env.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (b"TSM_APP_ID", b"TSM_ROLE_NAME", b"TSM_REPLICA_ID"):
            found[key] = value
    if len(found) != 3:
        return None
    return (os.fsdecode(found[b"TSM_APP_ID"]), os.fsdecode(found[b"TSM_ROLE_NAME"]),
            os.fsdecode(found[b"TSM_REPLICA_ID"]))


def app_processes(app_id: str) -> list[int]:
    """Live processes of this user started with ``TSM_APP_ID=app_id`` in their environment (a /proc scan)."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            origin = replica_of(int(entry))
            if origin is not None and origin[0] == app_id and ids(int(entry)) is not None:
                out.append(int(entry))
    return out


def raise_fd_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns the soft limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


def read_proc(path: str) -> bytes:
    """The whole of a small ``/proc`` file through one unbuffered descriptor (no file object: a third of
    ``open().read()``'s cost, which counts where a supervisor reads one per replica, or a standby six per request)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        return data
    finally:
        os.close(fd)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all its threads'), via /proc/pid/task/*/children or a /proc scan.

    A single-threaded process (the link count of its ``task`` folder is its threads plus two) has one such
    file, read without listing the folder: a cancel of 10,000 replicas looks at each one's children, and
    the listing was half of that (0.36 → 0.13 s for 10,000 ``sleep`` processes).
    """
    out: list[int] = []
    task = f"/proc/{pid}/task"
    try:
        tasks = [str(pid)] if os.stat(task).st_nlink == 3 else os.listdir(task)
    except OSError:
        return out
    found = False
    for tid in tasks:
        try:
            out.extend(int(p) for p in read_proc(f"{task}/{tid}/children").split())
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
            err = _errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def add(self, path: str, mask: int = IN_MODIFY) -> int:
        """Watch ``path``; returns the watch descriptor that events carry."""
        wd = int(_lib().inotify_add_watch(self.fd, os.fsencode(path), mask))
        if wd < 0:
            err = _errno()
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


def listen_unix(path: str, kind: int = 0) -> socket.socket:
    """A non-blocking Unix stream socket bound at ``path`` (of any length, see :func:`unix_address`), listening.

    ``kind`` is or'ed into the socket type (``SOCK_CLOEXEC``). Shared by the launcher's and each
    supervisor's socket.
    """
    import socket  # noqa: F811 - at run time only here: `tsm status` never opens a socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | kind)
    try:
        addr, dfd = unix_address(path)
        try:
            listener.bind(addr)
        finally:
            if dfd is not None:
                os.close(dfd)
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    listener.setblocking(False)
    return listener


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


def set_cmdline(*args: str) -> bool:
    """Rewrite this process's command line (``/proc/self/cmdline``, what ``ps`` shows) to ``args``, in place.

    For a process forked from the launcher, whose command line would otherwise be the launcher's: a
    supervisor then still names its app folder, as a spawned one does. The arguments are written over the
    original argument area (``/proc/self/mem``), cut to fit it; False when that is not possible.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])
        raw = b"\0".join(os.fsencode(a) for a in args)[: end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(raw.ljust(end - start, b"\0"))
        return True
    except (OSError, ValueError, IndexError):
        return False
