"""Workspaces: ship the user's project directory with a job, by content hash.

:mod:`tsm.workspace.api` holds the contract (:class:`WorkspaceBuilder`, :class:`Manifest`,
:func:`image_tag`); :mod:`tsm.workspace.dir` the directory snapshots of the local and Slurm
schedulers; :mod:`tsm.workspace.ignore` the ``.tsmignore`` / ``.torchxignore`` rules.
"""

from __future__ import annotations

from tsm.workspace.api import METADATA_KEY, Entry, Manifest, WorkspaceBuilder, WorkspaceError, image_tag
from tsm.workspace.dir import DirWorkspace, SnapshotReport, apply_workspace, scan

__all__ = [
    "METADATA_KEY", "DirWorkspace", "Entry", "Manifest", "SnapshotReport", "WorkspaceBuilder", "WorkspaceError",
    "apply_workspace", "image_tag", "scan",
]
