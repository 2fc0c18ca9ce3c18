"""Singleton locks of tsm's background processes (the local launcher, the container keepers): a ``flock`` on a
file that only the process holding it keeps, released by the kernel when it dies, even by SIGKILL."""

from __future__ import annotations

import fcntl
import os


def take(path: str | os.PathLike[str]) -> int | None:
    """Take ``path``'s exclusive lock without waiting (the file made 0600 if missing); its descriptor, to keep
    open while the lock is held (closing it releases the lock), or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def held(path: str | os.PathLike[str]) -> bool:
    """Whether some process holds ``path``'s lock now (a shared lock cannot be taken beside its exclusive one);
    False when the file does not exist."""
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
