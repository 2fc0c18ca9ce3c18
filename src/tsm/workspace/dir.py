"""The directory workspace of the local and Slurm schedulers: a read-only, content-addressed snapshot.

``DirWorkspace().build(DIR)`` snapshots the workspace ``DIR`` under ``$TSM_HOME/workspaces`` (0700)::

    objects/ab/ab12...ef        one copy of each distinct file content (".x" suffix: executable), read-only
    snapshots/<digest>/         the tree, each file a hard link to its object; becomes the role's image
    manifests/<digest>.json     the manifest (what a container builder or a later check reads)
    statcache/<root-hash>.json  (size, mtime_ns, ctime_ns, inode, device) -> SHA-256 of each file seen
    pycache/                    PYTHONPYCACHEPREFIX of snapshot roles, so Python never writes into a snapshot

Why this shape:

* **Editing while a job runs changes nothing for it.** Objects are copies, never links to the user's
  files, so an in-place edit of a workspace file cannot reach a snapshot.
* **An unchanged workspace is not copied again.** The snapshot is named by the tree's content hash: a
  second launch of the same tree finds it and reuses it (checked to be intact: every path there, each
  file still the object's inode, nothing added). One changed file in a large tree copies that one
  file into the object store and hard-links the rest (a new snapshot directory of links, no data).
* **Unchanged files are not re-read.** A file whose ``stat`` key is the one in the stat cache keeps its
  hash; files modified within the last second of a scan are never cached (mtime granularity).
* **A snapshot stays as built.** Files are 0444 (0555 when executable) and directories 0555, so a
  job that is not root cannot change it; jobs write their outputs elsewhere. A snapshot found changed
  anyway (root can write) is not reused: the next launch builds ``<digest>-2`` beside it.

Symlinks are kept as symlinks and never followed. A link whose full resolution stays inside the
workspace is copied as a relative link (an absolute target inside the workspace is rewritten relative,
so it points into the snapshot, not back into the live tree); a link that resolves outside the
workspace is refused with :class:`~tsm.workspace.api.WorkspaceError` naming it (ignore it in
``.tsmignore`` to leave it out). ``$TSM_HOME``, when it lies inside the workspace, is always left out.
Special files (sockets, FIFOs, devices) are skipped and listed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tsm.errors import StoreError
from tsm.specs.api import AppDef, Role
from tsm.specs.runopts import CfgVal
from tsm.workspace.api import METADATA_KEY, Entry, Manifest, WorkspaceBuilder, WorkspaceError
from tsm.workspace.ignore import load_ignore_files

_CHUNK = 1 << 20
#: Files modified less than this many nanoseconds before a scan are hashed again next time.
_RACY_NS = 1_000_000_000
#: FICLONE ioctl (Linux): share extents copy-on-write on btrfs/XFS, so copying costs no data.
_FICLONE = 0x40049409
_STATCACHE_VERSION = 1


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


def _hash_file(path: str) -> tuple[str, int]:
    """SHA-256 and size of the file's bytes, read once."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
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
    if os.path.isabs(target):
        # Inside the workspace: point at the same place relative to the link, i.e. inside the snapshot.
        lexical = os.path.normpath(target)
        base = os.path.dirname(abs_link)
        target = os.path.relpath(lexical if _inside(lexical, real_root) else resolved, base)
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

    home_st = os.stat(tsm_home())
    home_id = (home_st.st_dev, home_st.st_ino)
    rules = load_ignore_files(Path(real_root))
    cache = _StatCache(real_root)
    start_ns = time.time_ns()
    entries: list[Entry] = []
    manifest = Manifest(root=real_root, entries=entries, digest="")
    stack: list[tuple[str, str]] = [(real_root, "")]
    while stack:
        abs_dir, rel_dir = stack.pop()
        try:
            with os.scandir(abs_dir) as it:
                children = sorted(it, key=lambda d: d.name)
        except OSError as e:
            raise WorkspaceError(f"workspace {label}: cannot read directory {rel_dir or '.'!r}: {e.strerror}") from e
        subdirs = []
        for d in children:
            rel = f"{rel_dir}/{d.name}" if rel_dir else d.name
            try:
                st = d.stat(follow_symlinks=False)
            except OSError as e:
                raise WorkspaceError(f"workspace {label}: cannot stat {rel!r}: {e.strerror}") from e
            is_dir = stat.S_ISDIR(st.st_mode)
            if rules.ignored(rel, is_dir):
                manifest.ignored.append(rel + ("/" if is_dir else ""))
                continue
            if stat.S_ISLNK(st.st_mode):
                entries.append(Entry(rel, "link", target=_link_target(d.path, rel, real_root, label)))
            elif is_dir:
                if (st.st_dev, st.st_ino) == home_id:
                    manifest.ignored.append(rel + "/")  # tsm's own state never ships
                    continue
                entries.append(Entry(rel, "dir"))
                subdirs.append((d.path, rel))
            elif stat.S_ISREG(st.st_mode):
                key = _stat_key(st)
                digest = cache.get(rel, key) if use_cache else None
                if digest is not None:
                    manifest.settled[rel] = key
                else:
                    try:
                        digest, _ = _hash_file(d.path)
                        after = os.stat(d.path, follow_symlinks=False)
                    except OSError as e:
                        raise WorkspaceError(f"workspace {label}: cannot read {rel!r}: {e.strerror}") from e
                    manifest.hashed_files += 1
                    manifest.hashed_bytes += st.st_size
                    # Cache only a file that did not change while read and is not young enough for an
                    # edit in the same mtime tick to go unseen.
                    if _stat_key(after) == key and st.st_mtime_ns < start_ns - _RACY_NS:
                        cache.put(rel, key, digest)
                        manifest.settled[rel] = key
                entries.append(Entry(rel, "file", digest=digest, size=st.st_size, executable=bool(st.st_mode & 0o111)))
            else:
                manifest.skipped.append(rel)
        stack.extend(reversed(subdirs))
    manifest.digest = Manifest.tree_digest(entries)
    if use_cache:
        cache.save()
    return manifest


# -- the object store and snapshots ---------------------------------------------------------------------
@dataclass
class SnapshotReport:
    """What :meth:`DirWorkspace.build` did (or, with ``dry=True``, would do).

    ``reused`` is True when an intact snapshot of the same digest existed and nothing was written.
    ``files_copied``/``bytes_copied`` count data copied from the workspace into the object store (the
    only data ever copied); ``files_linked`` the hard links made in a new snapshot directory;
    ``files_hashed``/``bytes_hashed`` the files read to hash them (stat-cache misses).
    """

    workspace: str
    digest: str
    snapshot: str
    files: int
    bytes: int
    reused: bool = False
    files_copied: int = 0
    bytes_copied: int = 0
    files_linked: int = 0
    files_hashed: int = 0
    bytes_hashed: int = 0
    ignored: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    dry: bool = False

    def summary(self) -> str:
        """One line for people: digest, size, and what was (or would be) copied or reused."""
        head = f"workspace {self.workspace} -> {self.snapshot} ({self.files} files, {self.bytes} bytes, sha256 {self.digest[:12]})"
        if self.reused:
            what = ("would reuse" if self.dry else "reused") + " the existing snapshot, copying nothing"
        elif self.dry:
            what = f"would copy {self.files_copied} files ({self.bytes_copied} bytes) into the object store and link {self.files_linked}"
        else:
            what = f"copied {self.files_copied} files ({self.bytes_copied} bytes) into the object store and linked {self.files_linked}"
        extra = f"; ignored {len(self.ignored)} paths" if self.ignored else ""
        extra += f"; skipped special files: {', '.join(self.skipped)}" if self.skipped else ""
        return f"{head}: {what}{extra}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _object_path(home: Path, e: Entry) -> str:
    return os.path.join(home, "objects", e.digest[:2], e.digest + (".x" if e.executable else ""))


def _clone_or_copy(src_fd: int, dst_fd: int) -> None:
    """Copy a whole file: a copy-on-write clone where the file system can, else the kernel's copy."""
    try:
        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
        return
    except OSError:
        pass
    while True:
        try:
            n = os.copy_file_range(src_fd, dst_fd, 1 << 30) if hasattr(os, "copy_file_range") else 0
        except OSError:
            n = -1
        if n <= 0:
            break
    if n < 0 or os.fstat(dst_fd).st_size != os.fstat(src_fd).st_size:
        os.lseek(src_fd, 0, os.SEEK_SET)
        os.lseek(dst_fd, 0, os.SEEK_SET)
        os.ftruncate(dst_fd, 0)
        while chunk := os.read(src_fd, _CHUNK):
            os.write(dst_fd, chunk)


def _store_object(home: Path, src: str, e: Entry, settled: list[int] | None) -> bool:
    """Copy ``src`` into the object store as ``e``'s object; False if its content no longer hashes to it.

    A ``settled`` file (its hash came from an old, unchanged file) whose stat is still the same after
    the copy is trusted without hashing the copy again, as git trusts its index; any other copy is hashed.
    """
    obj = _object_path(home, e)
    os.makedirs(os.path.dirname(obj), mode=0o700, exist_ok=True)
    tmp = os.path.join(home, "tmp", f"obj-{secrets.token_hex(8)}")
    try:
        with open(src, "rb") as s:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _clone_or_copy(s.fileno(), fd)
                st = os.fstat(s.fileno())
                if settled is None or _stat_key(st) != settled or os.fstat(fd).st_size != e.size:
                    os.lseek(fd, 0, os.SEEK_SET)
                    h = hashlib.sha256()
                    while chunk := os.read(fd, _CHUNK):
                        h.update(chunk)
                    if h.hexdigest() != e.digest:
                        return False
                os.fchmod(fd, 0o555 if e.executable else 0o444)
            finally:
                os.close(fd)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        with contextlib.suppress(FileExistsError):  # another launch stored the same content meanwhile
            os.link(tmp, obj)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _object_ok(obj: str, e: Entry) -> bool:
    try:
        st = os.stat(obj, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == e.size


def _walk(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """Every path under ``root`` (relative, ``/``-separated) with its lstat, never following links."""
    stack = [(root, "")]
    while stack:
        abs_dir, rel_dir = stack.pop()
        with os.scandir(abs_dir) as it:
            for d in it:
                rel = f"{rel_dir}/{d.name}" if rel_dir else d.name
                st = d.stat(follow_symlinks=False)
                yield rel, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append((d.path, rel))


def _intact(snapshot: Path, manifest: Manifest, home: Path) -> bool:
    """True when ``snapshot`` holds exactly the manifest: same paths, files still their objects, no extras."""
    want = {e.path: e for e in manifest.entries}
    seen = 0
    try:
        for rel, st in _walk(str(snapshot)):
            e = want.get(rel)
            if e is None:
                return False
            seen += 1
            if e.kind == "dir":
                if not stat.S_ISDIR(st.st_mode):
                    return False
            elif e.kind == "link":
                if not stat.S_ISLNK(st.st_mode) or os.readlink(snapshot / rel) != e.target:
                    return False
            else:
                if not stat.S_ISREG(st.st_mode) or st.st_size != e.size:
                    return False
                try:
                    ost = os.stat(_object_path(home, e))
                except OSError:
                    ost = None
                if ost is not None and (ost.st_ino, ost.st_dev) != (st.st_ino, st.st_dev) and st.st_nlink > 1:
                    return False  # a link that is no longer the object's
    except OSError:
        return False
    return seen == len(want)


def _make_writable(path: Path) -> None:
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, name), 0o700, follow_symlinks=False)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)


def remove_tree(path: Path) -> None:
    """Delete a snapshot (or a half-built one): its directories are read-only, so open them first."""
    _make_writable(path)
    shutil.rmtree(path, ignore_errors=True)


#: A half-built snapshot or object this old was left by a launch that died: it is removed.
STALE_TMP_SECONDS = 24 * 3600


def _remove_stale_tmp(home: Path) -> None:
    """Remove what killed launches left in ``tmp/`` (older than :data:`STALE_TMP_SECONDS`)."""
    cutoff = time.time() - STALE_TMP_SECONDS
    with contextlib.suppress(OSError), os.scandir(home / "tmp") as it:
        for d in it:
            with contextlib.suppress(OSError):
                if d.stat(follow_symlinks=False).st_mtime < cutoff:
                    if d.is_dir(follow_symlinks=False):
                        remove_tree(Path(d.path))
                    else:
                        os.unlink(d.path)


class DirWorkspace(WorkspaceBuilder[None]):
    """Snapshots a workspace directory into ``$TSM_HOME/workspaces`` and runs roles in the snapshot.

    :meth:`build` is the whole job (scan, store, link); :meth:`build_workspace_and_update_role` is the
    :class:`WorkspaceBuilder` entry that also points the role at the snapshot. ``last_report`` holds the
    report of the latest build. Nothing is pushed: the snapshot is a directory on this machine (for
    Slurm, ``$TSM_HOME`` must be on a file system the nodes share, as the job's logs already are).
    """

    def __init__(self) -> None:
        self.last_report: SnapshotReport | None = None

    def build(self, workspace: str | os.PathLike[str], dry: bool = False) -> SnapshotReport:
        """Snapshot ``workspace`` (or, ``dry=True``, only say what that would copy, link or reuse).

        A file edited between its hash and its copy is noticed (the copy is hashed again) and the whole
        snapshot is retried, at most three times, then :class:`WorkspaceError` says the tree keeps changing.
        """
        t0 = time.perf_counter()
        for _ in range(3):
            manifest = scan(workspace)
            report = self._build(manifest, os.fspath(workspace), dry)
            if report is not None:
                report.seconds = round(time.perf_counter() - t0, 4)
                self.last_report = report
                return report
        raise WorkspaceError(f"workspace {os.fspath(workspace)} kept changing while it was snapshotted; try again")

    def _build(self, manifest: Manifest, label: str, dry: bool) -> SnapshotReport | None:
        home = workspaces_home()
        if not dry:
            _remove_stale_tmp(home)
        snapshots = home / "snapshots"
        name, n = manifest.digest, 1
        while (snapshots / name).exists() and not _intact(snapshots / name, manifest, home):
            n += 1
            name = f"{manifest.digest}-{n}"
        final = snapshots / name
        report = SnapshotReport(
            workspace=label, digest=manifest.digest, snapshot=str(final), files=manifest.files, bytes=manifest.bytes,
            files_hashed=manifest.hashed_files, bytes_hashed=manifest.hashed_bytes, ignored=manifest.ignored,
            skipped=manifest.skipped, dry=dry,
        )
        if final.exists():
            report.reused = True
            return report
        files = [e for e in manifest.entries if e.kind == "file"]
        if dry:
            missing = {(e.digest, e.executable): e.size for e in files if not _object_ok(_object_path(home, e), e)}
            report.files_copied = len(missing)
            report.bytes_copied = sum(missing.values())
            report.files_linked = len(files)
            return report
        tmp = home / "tmp" / f"snap-{secrets.token_hex(8)}"
        tmp.mkdir(mode=0o700)
        tmp_s = str(tmp)
        try:
            for e in manifest.entries:
                dst = os.path.join(tmp_s, e.path)
                if e.kind == "dir":
                    os.mkdir(dst, 0o700)
                elif e.kind == "link":
                    os.symlink(e.target, dst)
                else:
                    obj = _object_path(home, e)
                    if not _object_ok(obj, e):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(obj)  # damaged: replace it
                        try:
                            ok = _store_object(home, os.path.join(manifest.root, e.path), e, manifest.settled.get(e.path))
                        except OSError as err:
                            raise WorkspaceError(f"workspace {label}: cannot copy {e.path!r}: {err.strerror}") from err
                        if not ok:
                            return None  # edited since it was hashed: scan again
                        report.files_copied += 1
                        report.bytes_copied += e.size
                    try:
                        os.link(obj, dst)
                        report.files_linked += 1
                    except OSError as err:
                        if err.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP):
                            raise
                        shutil.copy2(obj, dst)  # no hard link possible here: a private copy
                        report.files_copied += 1
                        report.bytes_copied += e.size
            self._write_manifest(home, manifest)
            for e in sorted((e for e in manifest.entries if e.kind == "dir"), key=lambda e: -e.path.count("/")):
                os.chmod(tmp / e.path, 0o555)
            os.chmod(tmp, 0o555)
            try:
                os.rename(tmp, final)
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # Another launch built the same snapshot meanwhile: use theirs.
                remove_tree(tmp)
                report.reused = True
                report.files_linked = 0
        except BaseException:
            remove_tree(tmp)
            raise
        return report

    @staticmethod
    def _write_manifest(home: Path, manifest: Manifest) -> None:
        path = home / "manifests" / f"{manifest.digest}.json"
        if path.exists():
            return
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(manifest.to_dict()))  # the C encoder: json.dump to a file is pure Python
        os.replace(tmp, path)

    # -- WorkspaceBuilder ---------------------------------------------------------------------------
    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        """Snapshot ``workspace`` (or reuse its snapshot) and make it ``role``'s image.

        The role also gets ``PYTHONPYCACHEPREFIX`` (unless it sets one) so Python keeps its bytecode out
        of the read-only snapshot, and its metadata records the workspace, digest and snapshot.
        """
        self.point_role(role, self.build(workspace))

    @staticmethod
    def point_role(role: Role, report: SnapshotReport) -> None:
        """Make ``role`` run in the snapshot of ``report`` (image, pycache prefix, metadata)."""
        role.image = report.snapshot
        role.env.setdefault("PYTHONPYCACHEPREFIX", str(workspaces_home() / "pycache"))
        role.metadata[METADATA_KEY] = {
            "workspace": os.path.abspath(report.workspace), "digest": report.digest, "snapshot": report.snapshot,
            "files": report.files, "bytes": report.bytes, "reused": report.reused,
            "files_copied": report.files_copied, "bytes_copied": report.bytes_copied,
        }

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Nothing to push: a snapshot is a directory the scheduler reads in place."""
        return None

    def push_images(self, images_to_push: None) -> None:
        """Nothing to push (see :meth:`dryrun_push_images`)."""
        return None


def roles_for_workspace(app: AppDef, workspace: str) -> list[Role]:
    """The roles a workspace applies to: those with no image, or whose image is the workspace itself.

    A role that names another image (a different directory, a container image) keeps it.
    """
    real = os.path.realpath(os.path.expanduser(workspace))
    out = []
    for role in app.roles:
        if not role.image or os.path.realpath(os.path.expanduser(role.image)) == real:
            out.append(role)
    return out


def apply_workspace(
    app: AppDef, workspace: str | None, cfg: Mapping[str, CfgVal] | None = None, builder: WorkspaceBuilder[Any] | None = None
) -> SnapshotReport | None:
    """Ship ``workspace`` with ``app`` (mutates it): what the runner calls before the scheduler's dry run.

    ``None`` or ``""`` does nothing and returns None. ``builder`` is the scheduler when it builds
    workspaces itself (a container backend, or a TorchX-style ``build_workspace_and_update_role``): it
    gets the first role, as TorchX does. Else the directory builder snapshots the workspace for the roles
    of :func:`roles_for_workspace`. Returns the directory builder's report (None for other builders).
    """
    if not workspace:
        return None
    if builder is not None and not isinstance(builder, DirWorkspace):
        # a container builder (Docker) builds on the first role's image, as TorchX's WorkspaceMixin does:
        # every role names a container image there, so "roles without an image" would select none
        for role in app.roles[:1]:
            builder.build_workspace_and_update_role(role, workspace, cfg or {})
        return None
    roles = roles_for_workspace(app, workspace)
    report = (builder or DirWorkspace()).build(workspace, dry=not roles)  # no role takes it: only check it
    for role in roles:
        DirWorkspace.point_role(role, report)
    return report


def workspace_summary(app: AppDef | None) -> str | None:
    """One line on the workspace snapshot an app's roles run in (from their metadata), or None.

    What ``tsm run`` prints: the snapshot, its size and digest, and whether it was reused or what was copied.
    """
    for role in app.roles if app is not None else []:
        meta = role.metadata.get(METADATA_KEY)
        if not isinstance(meta, dict):
            continue
        try:
            head = (
                f"workspace {meta['workspace']} -> {meta['snapshot']} ({int(meta['files'])} files, "
                f"{int(meta['bytes'])} bytes, sha256 {str(meta['digest'])[:12]})"
            )
            what = (
                "reused the existing snapshot, copying nothing" if meta["reused"] else
                f"new snapshot: copied {int(meta['files_copied'])} files ({int(meta['bytes_copied'])} bytes), linked the rest"
            )
        except (KeyError, TypeError, ValueError):
            continue
        used_by = [r.name for r in app.roles if isinstance(r.metadata.get(METADATA_KEY), dict)]  # type: ignore[union-attr]
        return f"{head}: {what} (roles: {', '.join(used_by)})"
    return None


def write_context_tar(snapshot: str | os.PathLike[str], out: Any, extra: Mapping[str, bytes] | None = None) -> None:
    """Write a snapshot as a deterministic tar to the binary file ``out``: a container build context.

    For container builders (Docker, Kubernetes): the same snapshot gives the same bytes (sorted paths,
    mtime 0, uid/gid 0, modes 0644/0755), so a context hash is stable. ``extra`` adds files at the root
    (a generated ``Dockerfile``), replacing a snapshot file of the same name. Links are kept as links.
    """
    import io
    import tarfile

    root = os.fspath(snapshot)
    extra = dict(extra or {})
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, kind: bytes, mode: int, data: bytes | None = None, target: str = "", path: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
            info.uname = info.gname = ""
            if kind == tarfile.SYMTYPE:
                info.linkname = target
                tar.addfile(info)
            elif kind == tarfile.DIRTYPE:
                tar.addfile(info)
            elif data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.size = os.path.getsize(path)
                with open(path, "rb") as f:
                    tar.addfile(info, f)

        for rel, st in sorted(_walk(root), key=lambda item: item[0]):
            if rel in extra:
                continue
            full = os.path.join(root, rel)
            if stat.S_ISLNK(st.st_mode):
                add(rel, tarfile.SYMTYPE, 0o777, target=os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                add(rel, tarfile.DIRTYPE, 0o755)
            else:
                add(rel, tarfile.REGTYPE, 0o755 if st.st_mode & 0o111 else 0o644, path=full)
        for name in sorted(extra):
            add(name, tarfile.REGTYPE, 0o644, data=extra[name])


#: Schedulers whose roles run in a directory path: the directory workspace serves them.
DIR_SCHEDULERS = ("local", "local_cwd", "slurm")


def builder_for(scheduler_name: str, scheduler: object = None) -> WorkspaceBuilder[Any] | None:
    """The workspace builder for a scheduler: its own when it is one, the directory builder for
    :data:`DIR_SCHEDULERS`, else None (the scheduler cannot ship a workspace)."""
    if isinstance(scheduler, WorkspaceBuilder):
        return scheduler
    if scheduler_name in DIR_SCHEDULERS:
        return DirWorkspace()
    return None
