"""Workspaces: ship the user's project directory with a job, by content hash.

:mod:`tsm.workspace.api` holds the contract (:class:`WorkspaceBuilder`, :class:`Manifest`,
:func:`image_tag`); :mod:`tsm.workspace.dir` the directory snapshots of the local and Slurm
schedulers, built from :mod:`~tsm.workspace.scanning` (the manifest and stat cache),
:mod:`~tsm.workspace.objects` (the verified, concurrency-safe object store) and :mod:`~tsm.workspace.fsutil`
(walks, hole-keeping copies and removal at any depth); :mod:`tsm.workspace.ignore` the ``.tsmignore`` /
``.torchxignore`` rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tsm.workspace.api import METADATA_KEY, Entry, Manifest, WorkspaceBuilder, WorkspaceError, image_tag

if TYPE_CHECKING:
    from tsm.workspace.dir import DirWorkspace, SnapshotReport, apply_workspace, scan

#: names of :mod:`tsm.workspace.dir`, imported on first use: snapshots pull in hashing and copying code that
#: the commands reading only :data:`METADATA_KEY` (``tsm run`` of an app without a workspace) never need
_DIR_NAMES = frozenset({"DirWorkspace", "SnapshotReport", "apply_workspace", "scan"})


def __getattr__(name: str) -> Any:
    if name in _DIR_NAMES:
        from tsm.workspace import dir as _dir

        return getattr(_dir, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "METADATA_KEY", "DirWorkspace", "Entry", "Manifest", "SnapshotReport", "WorkspaceBuilder", "WorkspaceError",
    "apply_workspace", "image_tag", "scan",
]
