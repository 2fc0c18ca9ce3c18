"""The builder a backend implements to ship a workspace (re-exported by :mod:`tsm.workspace.api`).

Its own module so TorchX's mixin (:mod:`tsm.workspace.mixin`, which :mod:`tsm.workspace.api` re-exports)
builds on it without the two importing each other.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Generic, TypeVar

from tsm.specs.api import AppDef, Role
from tsm.specs.runopts import CfgVal, runopts

T = TypeVar("T")


class WorkspaceBuilder(abc.ABC, Generic[T]):
    """What a backend implements to ship a workspace (TorchX's ``WorkspaceMixin`` shape).

    ``T`` is what :meth:`dryrun_push_images` returns and :meth:`push_images` takes: the images a
    container backend must push before submitting (``None`` for builders with nothing to push).
    A scheduler can inherit from it next to :class:`~tsm.schedulers.api.Scheduler`; the runner then
    uses the scheduler's own builder instead of the default one for its name.
    """

    def workspace_opts(self) -> runopts:
        """Run options the builder reads from ``cfg`` (its ``--help`` for ``tsm run``); none by default."""
        return runopts()

    @abc.abstractmethod
    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        """Build ``workspace`` for ``role`` and point the role at the result (mutates ``role``).

        A directory builder snapshots the tree and sets ``role.image`` to the snapshot; a container
        builder builds (or reuses) an image on top of ``role.image`` and sets the role's image to it.
        """

    @abc.abstractmethod
    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> T:
        """What :meth:`push_images` would push for ``app`` (and rewrite image names in ``app`` to it)."""

    @abc.abstractmethod
    def push_images(self, images_to_push: T) -> None:
        """Push what :meth:`dryrun_push_images` returned; called before the app is submitted."""


class DirectoryWorkspaces:
    """Capability (a marker; also :class:`tsm.schedulers.api.DirectoryWorkspaces`, where the capabilities are listed):
    roles run in a directory path, so a workspace ships as a snapshot directory.

    The runner uses :class:`tsm.workspace.dir.DirWorkspace` for it. A backend that builds its own workspaces
    (an image) inherits :class:`tsm.workspace.api.WorkspaceBuilder` instead.
    """

    __slots__ = ()
