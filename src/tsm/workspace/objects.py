"""The object store of directory workspaces: one read-only copy per file content, safe for any number of writers.

``objects/ab/ab12...ef`` holds each distinct content once (``.x``: executable); snapshots hard-link to it.
Three rules make it safe with many launches at once and with files tampered with after a build:

* **Stored atomically, never deleted.** An object is written under ``tmp/`` and its hash checked, then
  ``link``-ed into place (it appears whole or not at all). A damaged object (same name, wrong content) is
  replaced with ``rename`` over it, so a process that is linking or reading it sees the old or the new inode,
  never nothing: no launch ever unlinks what another may be using.
* **Verified, not trusted.** Before an object (or a snapshot file) is reused its content is checked against its
  hash. :class:`Verified` remembers the check per inode with a key a same-size edit cannot keep: size,
  ``mtime_ns`` and ``ctime_ns`` (``ctime`` is set by the kernel on every write or ``chmod`` and cannot be
  set back), so an unchanged store is not re-read, and a tampered file is.
* **Only what was hashed is copied.** The workspace file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be
  the same regular file (inode, size) that the scan hashed; anything else (a symlink to ``/dev/zero``, a FIFO)
  makes the snapshot start over rather than hang or fill the disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from tsm.workspace.api import Entry, Manifest
from tsm.workspace.fsutil import ChangedError, DirFds, copy_file, open_regular, remove_tree, split, walk
from tsm.workspace.scanning import hash_fd

#: A half-built snapshot or object this old was left by a launch that died: it is removed.
STALE_TMP_SECONDS = 24 * 3600
_VERIFIED_VERSION = 1
#: How far a file's ctime may lag the wall clock (the kernel stamps with a coarse clock): 20 ms.
_CLOCK_SLACK_NS = 20_000_000


def object_path(home: Path, e: Entry) -> str:
    """Where the object of file entry ``e`` lives."""
    return os.path.join(home, "objects", e.digest[:2], e.digest + (".x" if e.executable else ""))


class Verified:
    """Which inodes were checked to hold which content: ``dev:ino`` -> (size, mtime_ns, ctime_ns, SHA-256).

    Kept in ``workspaces/verified.json``, written atomically; concurrent launches may each write it (the last
    one wins): a lost entry costs one more read, never a wrong answer.
    """

    def __init__(self, home: Path) -> None:
        self.path = home / "verified.json"
        self.old: dict[str, list[Any]] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_text())
            if data.get("version") == _VERIFIED_VERSION and isinstance(data.get("inodes"), dict):
                self.old = data["inodes"]
        self.new: dict[str, list[Any]] = dict(self.old)

    def fd_holds(self, fd: int, digest: str, size: int) -> bool:
        """Whether the open regular file ``fd`` holds exactly the content ``digest`` (of ``size`` bytes)."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        key = f"{st.st_dev}:{st.st_ino}"
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, digest]
        if self.new.get(key) == stamp:
            return True
        got, n = hash_fd(fd)
        after = os.fstat(fd)
        ok = got == digest and n == size
        if ok and [after.st_size, after.st_mtime_ns, after.st_ctime_ns] == stamp[:3]:
            self.new[key] = stamp
        return ok

    def known(self, st: os.stat_result, digest: str) -> bool:
        """Whether the inode ``st`` describes was verified to hold ``digest`` and has not changed since."""
        return self.new.get(f"{st.st_dev}:{st.st_ino}") == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, digest]

    def holds(self, path: str, digest: str, size: int) -> bool:
        """Whether ``path`` (never followed if a link) is a regular file holding exactly ``digest``."""
        try:
            head, tail = os.path.split(path)
            dfd = os.open(head, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fd = open_regular(dfd, tail)
            finally:
                os.close(dfd)
        except OSError:
            return False
        try:
            return self.fd_holds(fd, digest, size)
        finally:
            os.close(fd)

    def stored(self, path: str, digest: str) -> None:
        """Record ``path`` as holding ``digest``: an object this process just wrote and checked."""
        with contextlib.suppress(OSError):
            st = os.stat(path, follow_symlinks=False)
            self.new[f"{st.st_dev}:{st.st_ino}"] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, digest]

    def linked(self, dir_fd: int, name: str, digest: str, since_ns: int) -> None:
        """Keep the record of an inode this process just hard-linked as ``name`` (linking changes its ctime).

        Only when its size and mtime are still the verified ones and its ctime is that of the link (not
        older than ``since_ns``, taken just before it, less the kernel clock's coarseness): so an unchanged
        snapshot's next reuse is not a full re-read, while an edit before the link is still caught.
        """
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return
        key = f"{st.st_dev}:{st.st_ino}"
        old = self.new.get(key)
        if (old is not None and old[3] == digest and old[:2] == [st.st_size, st.st_mtime_ns]
                and st.st_ctime_ns >= since_ns - _CLOCK_SLACK_NS):
            self.new[key] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, digest]

    def save(self) -> None:
        """Write the record when it changed (atomically); a failure only costs reading the files again."""
        if self.new == self.old:
            return
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"version": _VERIFIED_VERSION, "inodes": self.new}))
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def store_object(home: Path, src_dir_fd: int, name: str, e: Entry, seen: list[int] | None,
                 settled: list[int] | None, verified: Verified) -> bool:
    """Copy workspace file ``name`` (in ``src_dir_fd``) into the store as ``e``'s object.

    False when its content no longer hashes to ``e.digest`` (edited since it was hashed: scan again). The file
    must be the regular file the scan saw (``seen``: its stat key), else :class:`ChangedError`. A ``settled``
    file (its hash came from the stat cache) whose stat is still the same is trusted without hashing the copy
    again, as git trusts its index; any other copy is hashed.
    """
    obj = object_path(home, e)
    os.makedirs(os.path.dirname(obj), mode=0o700, exist_ok=True)
    tmp = os.path.join(home, "tmp", f"obj-{secrets.token_hex(8)}")
    try:
        s = open_regular(src_dir_fd, name)
        try:
            st = os.fstat(s)
            if seen is not None and [st.st_ino, st.st_dev] != seen[3:5]:
                raise ChangedError(errno.ESTALE, f"{name} is no longer the file that was hashed")
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                copy_file(s, fd)
                st = os.fstat(s)
                if settled is None or _key(st) != settled or os.fstat(fd).st_size != e.size:
                    digest, size = hash_fd(fd)
                    if digest != e.digest or size != e.size:
                        return False
                os.fchmod(fd, 0o555 if e.executable else 0o444)
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fd)
        finally:
            os.close(s)
        try:
            os.link(tmp, obj)
            verified.stored(obj, e.digest)
        except FileExistsError:
            # another launch stored it meanwhile (keep theirs), or what is there is damaged: replace it in one
            # rename, so whoever reads or links it meanwhile gets a whole file
            if not verified.holds(obj, e.digest, e.size):
                os.replace(tmp, obj)
                verified.stored(obj, e.digest)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def intact(snapshot: Path, manifest: Manifest, verified: Verified) -> bool:
    """True when ``snapshot`` holds exactly the manifest: same paths and kinds, every file's content
    verified against its hash (:class:`Verified`: read once per change), no extras."""
    want = {e.path: e for e in manifest.entries}
    seen = 0
    try:
        root_fd = os.open(snapshot, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        dirs = DirFds(root_fd)
        try:
            for rel, st in walk(root_fd):
                e = want.get(rel)
                if e is None:
                    return False
                seen += 1
                if e.kind == "dir":
                    if not stat.S_ISDIR(st.st_mode):
                        return False
                elif e.kind == "link":
                    head, tail = split(rel)
                    if not stat.S_ISLNK(st.st_mode) or os.readlink(tail, dir_fd=dirs.get(head)) != e.target:
                        return False
                else:
                    if not stat.S_ISREG(st.st_mode) or st.st_size != e.size:
                        return False
                    if verified.known(st, e.digest):
                        continue  # this inode was read before and has not changed since
                    head, tail = split(rel)
                    fd = open_regular(dirs.get(head), tail)
                    try:
                        if not verified.fd_holds(fd, e.digest, e.size):
                            return False
                    finally:
                        os.close(fd)
        finally:
            dirs.close()
    except OSError:
        return False
    finally:
        os.close(root_fd)
    return seen == len(want)


def remove_stale_tmp(home: Path) -> None:
    """Remove what killed launches left in ``tmp/`` (older than :data:`STALE_TMP_SECONDS`); never raises."""
    cutoff = time.time() - STALE_TMP_SECONDS
    with contextlib.suppress(OSError), os.scandir(home / "tmp") as it:
        for d in it:
            with contextlib.suppress(OSError):
                if d.stat(follow_symlinks=False).st_mtime < cutoff:
                    remove_tree(d.path)  # any depth, never raises
