"""TorchX's ``torchx.workspace``: tsm's workspace names, TorchX's ``WorkspaceMixin`` and ``Workspace``, and the
nightly's ``MultiWorkspaceMixin`` and ``pin_workspace_images`` (:mod:`tsm.compat.torchx.workspace.api`)."""

from tsm.compat.torchx.workspace.api import MultiWorkspaceMixin, pin_workspace_images
from tsm.workspace import *  # noqa: F403
from tsm.workspace import __all__ as _WORKSPACE_ALL
from tsm.workspace.mixin import Workspace, WorkspaceMixin

__all__ = [*_WORKSPACE_ALL, "MultiWorkspaceMixin", "Workspace", "WorkspaceMixin", "pin_workspace_images"]
