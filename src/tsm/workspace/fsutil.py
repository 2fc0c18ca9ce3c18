"""File-system helpers of the directory workspace that hold for any tree: any depth, any path length, holes kept.

Everything here works relative to an open directory (``dir_fd``), never with one long absolute path, and
walks with an explicit stack, never by recursion: a tree 2,000 levels deep (paths longer than ``PATH_MAX``)
is scanned, copied and removed like a flat one. Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked
with ``fstat`` (:func:`open_regular`), so a path swapped for a symlink, a FIFO or a device between two looks
is noticed instead of followed, blocked on, or read forever.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator

_CHUNK = 1 << 20
#: FICLONE ioctl (Linux): share extents copy-on-write on btrfs/XFS, so copying costs no data.
_FICLONE = 0x40049409
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ChangedError(OSError):
    """A path is no longer what was looked at a moment before (a file swapped for a link, FIFO or device)."""


def open_dir(root_fd: int, rel: str) -> int:
    """An fd of the directory ``rel`` (``/``-separated, relative) below ``root_fd``; never follows a symlink."""
    fd = os.dup(root_fd)
    try:
        for name in rel.split("/"):
            if name:  # one component at a time: O_NOFOLLOW holds for each, and no path is ever too long
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_regular(dir_fd: int, name: str, expect: os.stat_result | None = None) -> int:
    """Open the regular file ``name`` in ``dir_fd`` for reading, or raise :class:`ChangedError`.

    ``O_NOFOLLOW`` refuses a symlink, ``O_NONBLOCK`` keeps a FIFO from blocking the open, and the opened file
    must be a regular file and, when ``expect`` is given, the same inode and size that was seen before.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.ENOENT):
            raise ChangedError(e.errno, f"{name} changed: {e.strerror}") from e
        raise
    st = os.fstat(fd)
    same = expect is None or ((st.st_ino, st.st_dev, st.st_size) == (expect.st_ino, expect.st_dev, expect.st_size))
    if not stat.S_ISREG(st.st_mode) or not same:
        os.close(fd)
        raise ChangedError(errno.ESTALE, f"{name} is no longer the regular file that was looked at")
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def split(rel: str) -> tuple[str, str]:
    """``("a/b", "c")`` for ``"a/b/c"``; ``("", "c")`` for ``"c"``."""
    head, _, tail = rel.rpartition("/")
    return head, tail


def walk(root: str | int) -> Iterator[tuple[str, os.stat_result]]:
    """Every path under ``root`` (a path or a directory fd), relative and ``/``-separated, with its lstat.

    Never follows links; an explicit stack, one directory open at a time (:class:`DirFds`).
    """
    root_fd = os.open(root, _DIR_FLAGS) if isinstance(root, str) else os.dup(root)
    dirs = DirFds(root_fd)
    try:
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            with os.scandir(dirs.get(rel_dir)) as it:
                entries = [(d.name, d.stat(follow_symlinks=False)) for d in it]
            subdirs = []
            for name, st in entries:
                rel = f"{rel_dir}/{name}" if rel_dir else name
                yield rel, st
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(rel)
            stack.extend(reversed(subdirs))
    finally:
        dirs.close()
        os.close(root_fd)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Delete a tree (read-only directories included) of any depth; never raises: what stays is swept later.

    Children are removed before their directory by an explicit post-order walk relative to open directories.
    """
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    try:
        pfd = os.open(parent, _DIR_FLAGS)
    except OSError:
        return
    try:
        _remove_below(pfd, name)
    except Exception:  # noqa: BLE001 - best effort: a leftover is swept by a later launch, never fatal
        pass
    finally:
        os.close(pfd)


def _remove_below(pfd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=pfd)
            return
    # Depth first with one fd: empty the current directory's files, go down into a subdirectory while there
    # is one, and when it is empty go up with ".." and remove it. Each directory is opened 0700 first.
    fd = os.open(name, _DIR_FLAGS, dir_fd=pfd)
    names: list[str] = []
    try:
        while True:
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o700)
            sub = None
            with os.scandir(fd) as it:
                for d in it:
                    if d.is_dir(follow_symlinks=False):
                        sub = sub or d.name
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(d.name, dir_fd=fd)
            if sub is not None:
                nfd = os.open(sub, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nfd
                names.append(sub)
                continue
            if not names:
                break
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = up
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=pfd)


def copy_file(src_fd: int, dst_fd: int) -> None:
    """Copy a whole file, keeping holes: a copy-on-write clone where the file system can, else data extents only.

    The data ranges are found with ``SEEK_DATA``/``SEEK_HOLE`` and copied with ``copy_file_range`` (plain reads
    and writes where that is refused); the holes between them stay holes, so a 1 GiB sparse file with 4 KiB of
    data costs 4 KiB in the object store.
    """
    try:
        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
        return
    except OSError:
        pass
    size = os.fstat(src_fd).st_size
    os.ftruncate(dst_fd, 0)
    pos = 0
    while pos < size:
        try:
            start = os.lseek(src_fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole is left
                break
            start = pos  # SEEK_DATA unsupported: treat everything as data
        try:
            end = os.lseek(src_fd, start, os.SEEK_HOLE)
        except OSError:
            end = size
        end = min(end, size)
        _copy_range(src_fd, dst_fd, start, end)
        pos = end
    os.ftruncate(dst_fd, size)


def _copy_range(src_fd: int, dst_fd: int, start: int, end: int) -> None:
    off = start
    while off < end:
        try:
            n = os.copy_file_range(src_fd, dst_fd, end - off, off, off)
        except OSError:
            n = -1
        if n <= 0:
            break
        off += n
    while off < end:
        chunk = os.pread(src_fd, min(_CHUNK, end - off), off)
        if not chunk:
            break
        os.pwrite(dst_fd, chunk, off)
        off += len(chunk)


class DirFds:
    """One open directory below a root, moved to the next one asked for: up with ``..``, down by name.

    ``get(rel)`` costs the distance in the tree from the last directory asked for (or the depth of ``rel``,
    if less), so a walk in tree order costs one open per step whatever the depth, with a single fd held.
    The fd returned is owned by this object (valid until the next ``get`` or :meth:`close`).
    """

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.rel: str | None = None
        self.fd = -1

    def get(self, rel: str) -> int:
        if rel == self.rel:
            return self.fd
        want = rel.split("/") if rel else []
        if self.rel is None:
            nfd = open_dir(self.root_fd, rel)
        else:
            have = self.rel.split("/") if self.rel else []
            common = 0
            while common < min(len(have), len(want)) and have[common] == want[common]:
                common += 1
            ups = len(have) - common
            if ups + len(want) - common >= len(want):
                nfd = open_dir(self.root_fd, rel)
            else:
                nfd = os.dup(self.fd)
                try:
                    for name in [".."] * ups + want[common:]:
                        step = os.open(name, _DIR_FLAGS, dir_fd=nfd)
                        os.close(nfd)
                        nfd = step
                except BaseException:
                    os.close(nfd)
                    raise
        self.close()
        self.rel, self.fd = rel, nfd
        return nfd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.rel, self.fd = None, -1
