"""Scanning a workspace: what it holds (a :class:`~tsm.workspace.api.Manifest`), hashed once per change.

:func:`scan` walks the tree with an explicit stack relative to open directories (any depth, any path length),
applies the ignore rules, and hashes each regular file through an fd opened with ``O_NOFOLLOW`` and checked to
be the file that was ``stat``-ed (:func:`tsm.workspace.fsutil.open_regular`), so a file swapped for a FIFO,
a device or a symlink mid-scan is never read: the scan starts again (:class:`TreeChanged`). The stat cache
(``statcache/<root-hash>.json``) keeps the hash of each file whose ``stat`` key is unchanged.

Symlinks are kept as symlinks and never followed. One whose target is relative and never climbs (no ``..``)
is kept verbatim; any other that resolves inside the workspace is rewritten as the relative path from the
link to what it resolves to, so in the snapshot it points into the snapshot (never back into the live tree,
never dangling because it climbed out of the root and back in); one that resolves outside is refused.
``$TSM_HOME`` is never shipped: a workspace inside it (its ``workspaces/``, say) is refused, and
``$TSM_HOME`` inside a workspace is left out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from tsm.errors import StoreError
from tsm.workspace.api import Entry, Manifest, WorkspaceError
from tsm.workspace.fsutil import ChangedError, DirFds, open_regular
from tsm.workspace.ignore import load_ignore_files

_CHUNK = 1 << 20
#: Files modified less than this many nanoseconds before a scan are hashed again next time.
_RACY_NS = 1_000_000_000
_STATCACHE_VERSION = 1


class TreeChanged(WorkspaceError):
    """A path changed kind while it was scanned (a file became a link, FIFO or device): scan again."""


def workspaces_home() -> Path:
    """``$TSM_HOME/workspaces`` (0700), created when missing."""
    from tsm.store import tsm_home

    home = tsm_home() / "workspaces"
    try:
        home.mkdir(mode=0o700, exist_ok=True)
        for sub in ("objects", "snapshots", "manifests", "statcache", "pycache", "tmp"):
            (home / sub).mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot create {home}: {e.strerror}; set TSM_HOME to a writable directory") from e
    return home


# -- scanning ------------------------------------------------------------------------------------------
def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def hash_fd(fd: int) -> tuple[str, int]:
    """SHA-256 and size of an open file's bytes from its start, read once."""
    h = hashlib.sha256()
    size, off = 0, 0
    while chunk := os.pread(fd, _CHUNK, off):
        h.update(chunk)
        size += len(chunk)
        off += len(chunk)
    return h.hexdigest(), size


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _link_target(abs_link: str, rel: str, real_root: str, root_label: str) -> str:
    """The target to store for the symlink at ``abs_link``, or :class:`WorkspaceError` if it escapes."""
    target = os.readlink(abs_link)
    resolved = os.path.realpath(abs_link)
    if not _inside(resolved, real_root):
        raise WorkspaceError(
            f"workspace {root_label}: symlink {rel!r} -> {target!r} points outside the workspace; "
            "tsm never follows links out of it: remove the link or add it to .tsmignore"
        )
    if os.path.isabs(target) or ".." in target.split("/"):
        # Inside the workspace, but written as a path that leaves the link's directory (absolute, or climbing
        # with ".."): point at what it resolves to, relative to the link, so the snapshot's link stays inside
        # the snapshot; a climb above the root and back in would otherwise dangle or reach the live tree.
        target = os.path.relpath(resolved, os.path.dirname(abs_link))
    return target


class _StatCache:
    """The per-workspace stat cache: relative path -> (stat key, SHA-256)."""

    def __init__(self, root: str) -> None:
        home = workspaces_home()
        self.path = home / "statcache" / (hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json")
        self.old: dict[str, list[Any]] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_text())
            if data.get("version") == _STATCACHE_VERSION and data.get("root") == root:
                self.old = data["files"]
        self.root = root
        self.new: dict[str, list[Any]] = {}

    def get(self, rel: str, key: list[int]) -> str | None:
        """The cached hash of ``rel`` if its stat key is unchanged (and keep it for the next save)."""
        hit = self.old.get(rel)
        if hit is not None and hit[:5] == key:
            self.new[rel] = hit
            return str(hit[5])
        return None

    def put(self, rel: str, key: list[int], digest: str) -> None:
        self.new[rel] = [*key, digest]

    def save(self) -> None:
        """Write the cache atomically when it changed; a failure only costs re-hashing next time."""
        if self.new == self.old:
            return
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"version": _STATCACHE_VERSION, "root": self.root, "files": self.new}))  # C encoder
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def scan(workspace: str | os.PathLike[str], use_cache: bool = True) -> Manifest:
    """The :class:`Manifest` of ``workspace``: kept paths, their hashes, and the tree's digest.

    Reads only files whose stat key is not in the stat cache (``use_cache=False`` reads every file).
    Raises :class:`WorkspaceError` for a missing or unreadable workspace or an escaping symlink.
    """
    label = os.fspath(workspace)
    if not label:
        raise WorkspaceError("workspace is empty: give a directory (or leave --workspace out)")
    root = os.path.abspath(os.path.expanduser(label))
    if not os.path.isdir(root):
        raise WorkspaceError(f"workspace {label!r} is not a directory; give the project directory to ship")
    real_root = os.path.realpath(root)
    from tsm.store import tsm_home

    home = os.path.realpath(tsm_home())
    if _inside(real_root, home):
        raise WorkspaceError(
            f"workspace {label!r} is inside $TSM_HOME ({home}), which holds tsm's store and every snapshot; "
            "give your project directory instead"
        )
    home_st = os.stat(home)
    home_id = (home_st.st_dev, home_st.st_ino)
    rules = load_ignore_files(Path(real_root))
    cache = _StatCache(real_root)
    start_ns = time.time_ns()
    entries: list[Entry] = []
    manifest = Manifest(root=real_root, entries=entries, digest="")
    try:
        root_fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise WorkspaceError(f"workspace {label}: cannot read it: {e.strerror}") from e
    dirs = DirFds(root_fd)
    try:
        _walk_tree(manifest, dirs, rules, cache if use_cache else None, home_id, start_ns, label, real_root)
    finally:
        dirs.close()
        os.close(root_fd)
    manifest.digest = Manifest.tree_digest(entries)
    if use_cache:
        cache.save()
    return manifest





def _walk_tree(manifest: Manifest, dirs: DirFds, rules: Any, cache: _StatCache | None, home_id: tuple[int, int],
               start_ns: int, label: str, real_root: str) -> None:
    """Fill ``manifest`` from the tree below ``dirs``' root: an explicit stack, directories in sorted order."""
    entries = manifest.entries
    stack: list[str] = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            fd = dirs.get(rel_dir)
            with os.scandir(fd) as it:
                children = sorted(((d.name, d.stat(follow_symlinks=False)) for d in it), key=lambda c: c[0])
        except OSError as e:
            raise WorkspaceError(f"workspace {label}: cannot read directory {rel_dir or '.'!r}: {e.strerror}") from e
        subdirs = []
        for name, st in children:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            is_dir = stat.S_ISDIR(st.st_mode)
            if rules.ignored(rel, is_dir):
                manifest.ignored.append(rel + ("/" if is_dir else ""))
                continue
            if stat.S_ISLNK(st.st_mode):
                entries.append(Entry(rel, "link", target=_link_target(os.path.join(real_root, rel), rel, real_root, label)))
            elif is_dir:
                if (st.st_dev, st.st_ino) == home_id:
                    manifest.ignored.append(rel + "/")  # tsm's own state never ships
                    continue
                entries.append(Entry(rel, "dir"))
                subdirs.append(rel)
            elif stat.S_ISREG(st.st_mode):
                key = _stat_key(st)
                manifest.seen[rel] = key
                digest = cache.get(rel, key) if cache is not None else None
                if digest is not None:
                    manifest.settled[rel] = key
                else:
                    digest, steady = _hash_one(dirs.get(rel_dir), name, st, rel, label)
                    manifest.hashed_files += 1
                    manifest.hashed_bytes += st.st_size
                    # Cache only a file that did not change while read and is not young enough for an edit
                    # in the same mtime tick to go unseen.
                    if cache is not None and steady and st.st_mtime_ns < start_ns - _RACY_NS:
                        cache.put(rel, key, digest)
                        manifest.settled[rel] = key
                entries.append(Entry(rel, "file", digest=digest, size=st.st_size, executable=bool(st.st_mode & 0o111)))
            else:
                manifest.skipped.append(rel)
        stack.extend(reversed(subdirs))


def _hash_one(dir_fd: int, name: str, st: os.stat_result, rel: str, label: str) -> tuple[str, bool]:
    """The SHA-256 of the regular file ``name`` that was ``st``, and whether it stayed unchanged while read.

    :class:`TreeChanged` when the path is no longer that regular file (a link, FIFO or device now): its bytes
    are never read. An edit while reading is left to the copy, which is hashed again (see ``store_object``).
    """
    try:
        fd = open_regular(dir_fd, name, st)
    except ChangedError as e:
        raise TreeChanged(f"workspace {label}: {rel!r} changed while it was read") from e
    except OSError as e:
        raise WorkspaceError(f"workspace {label}: cannot read {rel!r}: {e.strerror}") from e
    try:
        digest, size = hash_fd(fd)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    return digest, size == st.st_size and _stat_key(after) == _stat_key(st)
