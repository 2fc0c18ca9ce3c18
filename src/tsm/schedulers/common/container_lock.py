"""One look at a time: the app directory's lock and markers of the container backends (Docker, Kubernetes).

Two processes may look at one app at once (a sweep's controller and ``tsm wait``, the keeper beside a
``tsm status``): each look of an app this home submitted holds an exclusive ``flock`` of the directory's
:data:`LOCK_FILE` from its observation to what it does, so an app is retried, stopped or finished once. A
decision taken once whoever looks (the warning sent, the time limit reached) is a marker made with
``O_EXCL`` (:func:`claim`): of several processes exactly one acts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator

from tsm.schedulers.common.appdir import AppDir

#: the file in the app's directory whose ``flock`` serialises the looks of several processes (:func:`locked`)
LOCK_FILE = "lock"


@contextlib.contextmanager
def locked(d: AppDir, wait: bool = True, give_up: Callable[[], bool] | None = None) -> Iterator[bool]:
    """Hold an exclusive ``flock`` of the app's :data:`LOCK_FILE` (made private) while the body runs.
    Released when the body ends, or by the kernel when the process dies. Yields True when held; without
    ``wait``, False at once when another holds it (the body then runs without it and must not act). False
    too when the app directory is gone (``tsm remove``): it is not made again for a lock. With ``give_up``,
    the wait asks it every 50 ms and yields False once it says True (the app is being stopped: no need to
    wait on that)."""
    try:  # the app directory (private) is made at submit; a lock never makes it again
        fd = os.open(d.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            if wait and give_up is not None:  # wait, asking ``give_up`` every 50 ms (True: False at once)
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if give_up():
                            raise
                        time.sleep(0.05)
            else:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def claim(d: AppDir, name: str, text: str = "") -> bool:
    """Create the marker ``name`` in the app's directory with ``text``, only if it does not exist yet
    (``O_CREAT | O_EXCL``: of several processes exactly one gets True, the one that acts)."""
    try:
        fd = os.open(d.private_dir() / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True
