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
  file's content verified against its hash, read again only when its inode's size, mtime or ctime
  changed, nothing added). One changed file in a large tree copies that one
  file into the object store and hard-links the rest (a new snapshot directory of links, no data).
* **Unchanged files are not re-read.** A file whose ``stat`` key is the one in the stat cache keeps its
  hash; files modified within the last second of a scan are never cached (mtime granularity).
* **A snapshot stays as built.** Files are 0444 (0555 when executable) and directories 0555, so a
  job that is not root cannot change it; jobs write their outputs elsewhere. A snapshot found changed
  anyway (root can write) is not reused: the next launch builds ``<digest>-2`` beside it.

Symlinks are kept as symlinks and never followed. A link whose full resolution stays inside the
workspace is copied as a relative link that stays inside the snapshot (an absolute or climbing target is
rewritten relative, so it points into the snapshot, not back into the live tree); a link that resolves
outside the workspace is refused with :class:`~tsm.workspace.api.WorkspaceError` naming it (ignore it in
``.tsmignore`` to leave it out). ``$TSM_HOME`` is never shipped: left out when inside the workspace,
refused as (or above) the workspace. Special files (sockets, FIFOs, devices) are skipped and listed.

The pieces: :mod:`tsm.workspace.scanning` (the manifest and stat cache), :mod:`tsm.workspace.objects` (the object
store: atomic, verified, safe for concurrent launches), :mod:`tsm.workspace.fsutil` (walks, copies that keep
holes and removal at any depth). A failed build leaves nothing that can break a later one.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tsm.specs.api import AppDef, Role
from tsm.specs.runopts import CfgVal
from tsm.workspace.api import METADATA_KEY, Manifest, WorkspaceBuilder, WorkspaceError
from tsm.workspace.fsutil import ChangedError, DirFds, copy_file, remove_tree, split, walk
from tsm.workspace.objects import (
    STALE_TMP_SECONDS,
    Verified,
    intact,
    object_path,
    remove_stale_tmp,
    store_object,
)
from tsm.workspace.scanning import TreeChanged, scan, workspaces_home

__all__ = [
    "STALE_TMP_SECONDS", "DirWorkspace", "SnapshotReport", "apply_workspace", "builder_for",
    "remove_tree", "roles_for_workspace", "scan", "workspace_summary", "workspaces_home", "write_context_tar",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


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
            try:
                manifest = scan(workspace)
            except TreeChanged:
                continue
            report = self._build(manifest, os.fspath(workspace), dry)
            if report is not None:
                report.seconds = round(time.perf_counter() - t0, 4)
                self.last_report = report
                return report
        raise WorkspaceError(f"workspace {os.fspath(workspace)} kept changing while it was snapshotted; try again")

    def _build(self, manifest: Manifest, label: str, dry: bool) -> SnapshotReport | None:
        home = workspaces_home()
        if not dry:
            remove_stale_tmp(home)
        verified = Verified(home)
        try:
            return self._build_verified(manifest, label, dry, home, verified)
        finally:
            verified.save()

    def _build_verified(self, manifest: Manifest, label: str, dry: bool, home: Path,
                        verified: Verified) -> SnapshotReport | None:
        snapshots = home / "snapshots"
        name, n = manifest.digest, 1
        while (snapshots / name).exists() and not intact(snapshots / name, manifest, verified):
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
            missing = {(e.digest, e.executable): e.size for e in files
                       if not verified.holds(object_path(home, e), e.digest, e.size)}
            report.files_copied = len(missing)
            report.bytes_copied = sum(missing.values())
            report.files_linked = len(files)
            return report
        tmp = home / "tmp" / f"snap-{secrets.token_hex(8)}"
        tmp.mkdir(mode=0o700)
        done = False
        try:
            if not self._fill(tmp, manifest, label, home, verified, report):
                return None  # a file was edited or swapped since it was hashed: scan again
            self._write_manifest(home, manifest)
            os.chmod(tmp, 0o555)
            try:
                os.rename(tmp, final)
                done = True
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # Another launch built the same snapshot meanwhile: use theirs.
                report.reused = True
                report.files_linked = 0
        finally:
            if not done:
                remove_tree(tmp)
        return report

    @staticmethod
    def _fill(tmp: Path, manifest: Manifest, label: str, home: Path, verified: Verified,
              report: SnapshotReport) -> bool:
        """Make the snapshot tree in ``tmp``: directories, links, and a hard link to each file's object.

        Works relative to open directories (any depth). False when a workspace file changed since it was
        hashed, or is not the regular file that was (the caller scans again).
        """
        ws_fd = os.open(manifest.root, _DIR_FLAGS)
        snap_fd = os.open(tmp, _DIR_FLAGS)
        src, dst = DirFds(ws_fd), DirFds(snap_fd)
        try:
            for e in manifest.entries:
                head, tail = split(e.path)
                dfd = dst.get(head)
                if e.kind == "dir":
                    os.mkdir(tail, 0o700, dir_fd=dfd)
                    continue
                if e.kind == "link":
                    os.symlink(e.target, tail, dir_fd=dfd)
                    continue
                obj = object_path(home, e)
                if not verified.holds(obj, e.digest, e.size):
                    try:
                        ok = store_object(home, src.get(head), tail, e, manifest.seen.get(e.path),
                                          manifest.settled.get(e.path), verified)
                    except ChangedError:
                        return False
                    except OSError as err:
                        raise WorkspaceError(f"workspace {label}: cannot copy {e.path!r}: {err.strerror}") from err
                    if not ok:
                        return False
                    report.files_copied += 1
                    report.bytes_copied += e.size
                try:
                    before = time.time_ns()
                    os.link(obj, tail, dst_dir_fd=dfd)
                    verified.linked(dfd, tail, e.digest, before)
                    report.files_linked += 1
                except OSError as err:
                    if err.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP):
                        raise
                    _private_copy(obj, dfd, tail, e.executable)  # no hard link possible here
                    report.files_copied += 1
                    report.bytes_copied += e.size
            for e in sorted((e for e in manifest.entries if e.kind == "dir"), key=lambda e: -e.path.count("/")):
                head, tail = split(e.path)
                os.chmod(tail, 0o555, dir_fd=dst.get(head))
            return True
        finally:
            src.close()
            dst.close()
            os.close(ws_fd)
            os.close(snap_fd)

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

        for rel, st in sorted(walk(root), key=lambda item: item[0]):
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


def builder_for(scheduler_name: str, scheduler: object = None) -> WorkspaceBuilder[Any] | None:
    """The workspace builder for a scheduler, by what it declares: its own when it is a
    :class:`WorkspaceBuilder` (an image), the directory builder when it declares
    :class:`~tsm.schedulers.api.DirectoryWorkspaces`, else None (it cannot ship a workspace).

    ``scheduler_name`` is kept for callers' messages; the choice never depends on it."""
    from tsm.workspace.builder import DirectoryWorkspaces

    if isinstance(scheduler, WorkspaceBuilder):
        return scheduler
    if isinstance(scheduler, DirectoryWorkspaces):
        return DirWorkspace()
    return None


def ship_workspace(app: AppDef, workspace: str, scheduler_name: str, scheduler: object,
                   cfg: Mapping[str, CfgVal]) -> None:
    """Ship ``workspace`` with ``app`` as ``scheduler`` can (:func:`builder_for`: its own builder, or the directory
    snapshot), else :class:`~tsm.errors.NotSupportedError`: what the runner's dry run calls."""
    builder = builder_for(scheduler_name, scheduler)
    if builder is None:
        from tsm.errors import NotSupportedError

        raise NotSupportedError(
            f"the {scheduler_name} scheduler cannot ship workspace {workspace!r}: it has no workspace support; "
            "pass workspace=None (or leave --workspace out)",
            scheduler=scheduler_name,
        )
    apply_workspace(app, workspace, cfg, builder)


def _private_copy(obj: str, dir_fd: int, name: str, executable: bool) -> None:
    """A private copy of object ``obj`` as ``name`` in ``dir_fd`` (where no hard link can be made)."""
    s = os.open(obj, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        d = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            copy_file(s, d)
            os.fchmod(d, 0o555 if executable else 0o444)
        finally:
            os.close(d)
    finally:
        os.close(s)
