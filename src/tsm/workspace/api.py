"""The workspace contract shared by every backend: a content hash of the user's project, and a builder.

A *workspace* is the user's project directory shipped with a job, so the code that runs is the code on
disk at launch, not whatever the image holds. Two layers:

* :class:`Manifest` -- what the workspace *is*: every kept path (after ``.torchxignore``/``.tsmignore``)
  with its kind, executable bit and SHA-256, and one :attr:`Manifest.digest` over all of it. Two trees
  with the same digest have the same content, whatever their mtimes. Made by
  :func:`tsm.workspace.dir.scan`, which re-reads only files whose ``stat`` changed.
* :class:`WorkspaceBuilder` -- how a backend turns that into something a role runs in. It has the
  shape of TorchX's ``WorkspaceMixin`` (``workspace_opts``, ``build_workspace_and_update_role``,
  ``dryrun_push_images``, ``push_images``) so a TorchX-style scheduler ports by changing imports. The
  directory builder (:class:`tsm.workspace.dir.DirWorkspace`) makes a read-only snapshot directory for
  the local and Slurm schedulers; a container builder (Docker, Kubernetes) tags the image it builds
  with :func:`image_tag` of the same digest and the base image id, so an unchanged workspace reuses
  the image without building, and it builds from the snapshot (the exact bytes that were hashed; see
  :func:`tsm.workspace.dir.write_context_tar` for a deterministic build context), not from the live
  directory.

Errors: :class:`WorkspaceError` (a usage error, CLI exit code 2) for a workspace that is missing, not a
directory, unreadable, or holds a symlink that points outside it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from tsm.errors import InvalidRunOptionError
from tsm.workspace.builder import WorkspaceBuilder as WorkspaceBuilder

#: Role metadata key under which the builder records what it did (kept in the app's history).
METADATA_KEY = "tsm.workspace"


class WorkspaceError(InvalidRunOptionError):
    """The workspace cannot be used: missing, not a directory, unreadable, or a symlink points outside it."""


@dataclass(frozen=True)
class Entry:
    """One kept path of a workspace.

    ``path`` is relative and ``/``-separated; ``kind`` is ``file``, ``dir`` or ``link``. Files carry
    their SHA-256 (``digest``), ``size`` and ``executable`` bit (the only mode bit kept, as in git);
    links carry their (relative) ``target``.
    """

    path: str
    kind: str
    digest: str = ""
    size: int = 0
    executable: bool = False
    target: str = ""

    def line(self) -> str:
        """The entry's line in the tree hash: everything that makes two trees differ, nothing else."""
        if self.kind == "file":
            return f"file\0{self.path}\0{'x' if self.executable else '-'}\0{self.digest}\n"
        if self.kind == "link":
            return f"link\0{self.path}\0{self.target}\n"
        return f"dir\0{self.path}\n"


@dataclass
class Manifest:
    """What a workspace holds, and its content hash (:attr:`digest`).

    ``ignored`` lists the paths left out by ignore rules (a directory once, not its contents);
    ``skipped`` the special files (sockets, FIFOs, devices) that cannot be shipped. ``hashed_files`` /
    ``hashed_bytes`` count the files actually read to hash them (the others came from the stat cache).
    """

    root: str
    entries: list[Entry]
    digest: str
    ignored: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    hashed_files: int = 0
    hashed_bytes: int = 0
    #: stat keys of files whose hash is settled (old enough, unchanged while read): a copy of such a
    #: file whose stat still matches needs no second hash
    settled: dict[str, list[int]] = field(default_factory=dict, repr=False)
    #: stat keys (size, mtime_ns, ctime_ns, inode, device) of every kept file as scanned: the copy opens the
    #: path again and refuses anything that is not this same regular file
    seen: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @property
    def files(self) -> int:
        """Number of regular files kept."""
        return sum(1 for e in self.entries if e.kind == "file")

    @property
    def bytes(self) -> int:
        """Total size of the regular files kept."""
        return sum(e.size for e in self.entries if e.kind == "file")

    @staticmethod
    def tree_digest(entries: list[Entry]) -> str:
        """SHA-256 over the sorted entries' lines: the workspace's content hash."""
        h = hashlib.sha256(b"tsm-workspace-v1\n")
        for e in sorted(entries, key=lambda e: e.path):
            h.update(e.line().encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for the manifest file a container builder reads)."""
        return {
            "root": self.root, "digest": self.digest,
            "entries": [
                {"path": e.path, "kind": e.kind, "digest": e.digest, "size": e.size, "executable": e.executable,
                 "target": e.target}
                for e in self.entries
            ],
        }


def image_tag(digest: str, base_image_id: str, repository: str = "tsm-workspace") -> str:
    """The image tag a container builder gives a workspace built on ``base_image_id``.

    Same workspace content on the same base image gives the same tag, so a builder that finds the tag
    present reuses it and builds nothing.
    """
    key = hashlib.sha256(f"{digest}\0{base_image_id}".encode()).hexdigest()
    return f"{repository}:{key[:32]}"


def __getattr__(name: str) -> Any:
    """TorchX's ``workspace.api.WorkspaceMixin`` and ``Workspace`` at TorchX's path (defined in :mod:`tsm.workspace.mixin`).

    Loaded on first use (they cost what most callers of this module never use).
    """
    if name in ("WorkspaceMixin", "Workspace"):
        from tsm.workspace import mixin

        return getattr(mixin, name)
    raise AttributeError(f"module 'tsm.workspace.api' has no attribute {name!r}")
