"""tsm's detached helper processes: how each is started, kept one of a kind, told apart by code, and ends.

Five helpers run apart from the process that needed them: the per-user local launcher (and the standby
supervisors it forks), each local app's supervisor, the Docker/Kubernetes keeper, a sweep's controller and
Docker's stop helper. What they share is here, written once:

- **Start** (:func:`command`, :func:`spawn`, :func:`spawn_orphan`). A helper is this interpreter in isolated
  mode (``-I``): neither the caller's working directory nor a script's folder is on its ``sys.path`` and no
  ``PYTHON*`` variable is read, so a ``json.py`` or ``threading.py`` lying in the folder tsm was started
  from is never imported by a process that outlives it and serves apps started from anywhere else. Its
  ``sys.path`` is made explicitly instead: the folder this tsm is imported from comes first (so an editable
  install is the tsm that runs), then, for a helper that imports installed libraries (``site=True``: a
  backend's client, the runner's plugins), the caller's absolute ``PYTHONPATH`` entries and user
  site-packages, as the caller's interpreter had them; the standard library and the interpreter's own
  site-packages come from where they are installed. A helper that needs only tsm and the standard library
  (``site=False``: the launcher and the supervisor) also skips ``site`` (``-S``), which keeps its start-up
  short. It runs in a session of its own, stdin from ``/dev/null``, stdout and stderr appended to a private
  (0600) log.
- **One of a kind** (:func:`take`, :func:`held`, :func:`start_once`, :func:`started`; :func:`start_helper`
  for the common case of a helper started with :func:`command` and :func:`spawn`). A helper that must be
  alone holds an exclusive ``flock`` on a file of its own (released by the kernel when it dies, even by
  SIGKILL). Starting one is guarded too: :func:`start_once` takes ``<lock>.start`` before it looks and
  hands that lock to the process it starts, which releases it only once it holds its own lock (or dies),
  so of many processes that find no helper at once exactly one starts it, and a check never races a spawn.
- **Idle exit** (:class:`Idle`, :func:`idle_limit`): the seconds a helper waits for work before it leaves,
  overridable by a variable, a bad value meaning the default.
- **One code key** (:func:`code_key`): a hash of the interpreter, where tsm is imported from and the (name,
  size, mtime) of its sources, so a helper notices an upgrade on disk and a caller never asks a helper of
  other code.

Standard library only, imported on use: the supervisor's start-up counts milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Iterable, Iterator, Sequence

#: The code ``python -I -c`` runs first: ``sys.path`` from the arguments, then the helper's entry point.
#: Arguments: ``N PATH... MODULE:FUNCTION HANDOVER ARGS...`` (``HANDOVER``: the start lock's descriptor, or -1);
#: the entry point sees ``sys.argv[1:] == ARGS``.
BOOT = (
    "import sys\n"
    "a = sys.argv\n"
    "n = int(a[1])\n"
    "sys.path[:0] = a[2:2 + n]\n"
    "entry, fd = a[2 + n], int(a[3 + n])\n"
    "del a[1:4 + n]\n"
    "if fd >= 0:\n"
    "    import tsm.util.daemon\n"
    "    tsm.util.daemon.handover = fd\n"
    "m, _, f = entry.partition(':')\n"
    "sys.exit(getattr(__import__(m, fromlist=['_']), f)())\n"
)

#: The start lock a process started by :func:`start_once` holds until it calls :func:`started` (-1: none).
handover = -1


def package_parent() -> str:
    """The folder the running tsm is imported from (the parent of the ``tsm`` package)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _library_paths() -> list[str]:
    """Where the caller finds libraries beyond the interpreter's installation: the absolute entries of
    ``$PYTHONPATH`` (a relative one names the working directory: never followed; read from the environment
    even in a helper, itself isolated, that starts another) and the user site-packages."""
    out = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    site = sys.modules.get("site")
    if site is not None and getattr(site, "ENABLE_USER_SITE", False):
        user = site.getusersitepackages()
        if os.path.isdir(user):
            out.append(user)
    return out


def command(entry: str, *args: str, site: bool = True, handover_fd: int = -1) -> list[str]:
    """The command line of a helper whose code is ``entry`` (``"module:function"``, called with no arguments,
    its ``sys.argv[1:]`` being ``args``); see the module docstring. ``handover_fd``: :func:`start_once`'s."""
    paths = [package_parent(), *(_library_paths() if site else ())]
    paths = list(dict.fromkeys(paths))
    flags = ["-I"] if site else ["-I", "-S"]
    return [sys.executable, *flags, "-c", BOOT, str(len(paths)), *paths, entry, str(handover_fd), *args]


def _log_fd(log: str | os.PathLike[str] | None) -> int:
    if log is None:
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    return os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)


def spawn(argv: Sequence[str], *, log: str | os.PathLike[str] | None, cwd: str | None = "/",
          pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached: its own session, stdin ``/dev/null``, stdout and stderr appended to ``log``
    (made 0600; None: discarded), only ``pass_fds`` inherited, in ``cwd`` (None: this process's)."""
    import subprocess

    out = _log_fd(log)
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=cwd,
                                start_new_session=True, close_fds=True, pass_fds=tuple(pass_fds))
    finally:
        os.close(out)


def spawn_orphan(argv: Sequence[str], *, close: Iterable[int] = (), keep: Iterable[int] = ()) -> None:
    """Start ``argv`` as nobody's child: this process forks, the child starts a session and forks again, then
    exits (reaped here at once); the grandchild closes ``close``, makes ``keep`` inheritable and execs ``argv``.

    For a helper started by a process that ends everything under it when it ends (a supervisor, a child
    subreaper): the helper re-parents above it and outlives it. Output and working directory are the helper's
    to set.
    """
    pid = os.fork()
    if pid:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork() == 0:
            for fd in close:
                os.close(fd)
            for fd in keep:
                os.set_inheritable(fd, True)
            os.execv(argv[0], list(argv))
    finally:
        os._exit(0)


# -- one of a kind -------------------------------------------------------------------------------------------
def take(path: str | os.PathLike[str], *, wait: bool = False) -> int | None:
    """Take ``path``'s exclusive lock (the file made 0600 if missing); its descriptor, to keep open while the
    lock is held (closing it releases the lock), or None when another process holds it. ``wait``: block
    until it is free instead."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def held(path: str | os.PathLike[str]) -> bool:
    """Whether some process holds ``path``'s lock now (a shared lock cannot be taken beside its exclusive one);
    False when the file does not exist."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def wait_released(path: str | os.PathLike[str], timeout: float | None) -> bool:
    """Block until nobody holds ``path``'s exclusive lock or ``timeout`` seconds pass; True when it is free.

    The wait is the kernel's (a shared ``flock`` is granted the moment the exclusive one goes), on a thread
    so that it can be bounded; a missing file is free.
    """
    import fcntl
    import threading

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    done = threading.Event()

    def block() -> None:
        try:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)  # a shared lock got here goes with it
            done.set()

    threading.Thread(target=block, daemon=True, name="tsm-lock-wait").start()
    return done.wait(timeout)


def start_lock(path: str | os.PathLike[str]) -> str:
    """The file whose lock a process holds while it starts the helper of ``path``'s lock."""
    return os.fspath(path) + ".start"


def start_once(path: str | os.PathLike[str], start: Callable[[int], object]) -> bool:
    """Start the helper that holds ``path``'s lock unless one does or another process is starting it; whether
    ``start`` was called.

    ``start(fd)`` must start the helper with ``fd`` (the start lock, :func:`start_lock`) inherited and named
    to it (``command(..., handover_fd=fd)``): this process closes its copy on return, the helper's copy keeps
    the lock until the helper holds ``path``'s (:func:`started`) or ends. A second caller meanwhile finds the
    start lock taken and starts nothing; one after it finds ``path`` held.
    """
    if held(path):
        return False
    fd = take(start_lock(path))
    if fd is None:
        return False  # another process is starting it right now
    try:
        if held(path):  # started, and its start lock released, between the first look and ours
            return False
        start(fd)
        return True
    finally:
        os.close(fd)


def start_helper(lock: str | os.PathLike[str], entry: str, *args: str, log: str | os.PathLike[str],
                 cwd: str | None = None, ready_timeout: float | None = None) -> bool:
    """Start the helper whose code is ``entry`` (:func:`command`, with ``args``) and which holds ``lock``, unless
    one does or is starting (:func:`start_once`); output to ``log``, in ``cwd`` (None: this process's). With
    ``ready_timeout``, return once it holds its lock (or has exited, or the time passed). True when started."""

    def start(fd: int) -> None:
        spawn(command(entry, *args, handover_fd=fd), log=log, cwd=cwd, pass_fds=(fd,))

    if not start_once(lock, start):
        return False
    if ready_timeout is not None:
        wait_released(start_lock(lock), ready_timeout)  # released once the helper holds its own lock
    return True


def started() -> None:
    """In a helper started by :func:`start_once`: it holds its own lock now, so the start lock goes."""
    global handover
    if handover >= 0:
        fd, handover = handover, -1
        with contextlib.suppress(OSError):
            os.close(fd)


# -- idle exit -----------------------------------------------------------------------------------------------
def idle_limit(variable: str, default: float) -> float:
    """Seconds from ``$variable`` (a number >= 0), else ``default`` (also for a value that is not one)."""
    raw = os.environ.get(variable, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value >= 0 else default


class Idle:
    """How long a helper has had nothing to do, against its limit (monotonic seconds)."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.since = time.monotonic()

    def busy(self) -> None:
        """It had work just now: the idle time starts again."""
        self.since = time.monotonic()

    def over(self) -> bool:
        """Whether it has been idle for its whole limit."""
        return time.monotonic() - self.since >= self.limit

    def left(self) -> float:
        """Seconds until :meth:`over` (0 once it is)."""
        return max(0.0, self.since + self.limit - time.monotonic())


# -- the code key --------------------------------------------------------------------------------------------
def _sources(pkg: str, dirs: Sequence[str] | None) -> Iterator[tuple[str, int, int]]:
    if dirs is None:
        for top, subdirs, files in os.walk(pkg):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in files:
                if name.endswith(".py"):
                    with contextlib.suppress(OSError):
                        st = os.stat(os.path.join(top, name))
                        yield os.path.relpath(os.path.join(top, name), pkg), st.st_size, st.st_mtime_ns
        return
    for sub in dirs:
        with contextlib.suppress(OSError), os.scandir(os.path.join(pkg, sub)) as it:
            for e in it:
                if e.name.endswith(".py"):
                    st = e.stat()
                    yield f"{sub}/{e.name}", st.st_size, st.st_mtime_ns


def code_key(dirs: Sequence[str] | None = None, *, parent: str | None = None, executable: str | None = None) -> str:
    """A short hash of the interpreter, where tsm is imported from and the (name, size, mtime) of its sources.

    ``dirs``: the package's folders whose files the helper runs (``""`` the package itself, ``"timer"``, ...;
    each without its subfolders), None for every folder. ``parent``: the folder holding the ``tsm`` package
    (default: this one's, :func:`package_parent`); ``executable``: default ``sys.executable``.
    """
    import hashlib

    parent = package_parent() if parent is None else parent
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{executable or sys.executable}\0{parent}\0".encode(errors="surrogateescape"))
    for name, size, mtime in sorted(_sources(os.path.join(parent, "tsm"), dirs)):
        h.update(f"{name}\0{size}\0{mtime}\0".encode(errors="surrogateescape"))
    return h.hexdigest()
