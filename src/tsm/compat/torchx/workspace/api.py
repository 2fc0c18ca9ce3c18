"""TorchX's ``torchx.workspace.api`` (its nightly's names too), on tsm's workspace builders.

* :class:`MultiWorkspaceMixin`: a scheduler that offers several workspace builders (a shared directory and an
  image, say); the ``workspace_type`` run option picks one, the first is the default, and its run options
  are the selector plus every builder's. An unknown ``workspace_type`` is a ``ValueError`` naming the ones
  offered. A builder with no push step (tsm's :class:`~tsm.workspace.mixin.WorkspaceMixin` defaults) pushes
  nothing.
* :func:`pin_workspace_images`: with :meth:`tsm.compat.torchx.runner.api.Runner.build_workspace`, build once
  and submit many times.

tsm's own builder interface is :class:`tsm.workspace.api.WorkspaceBuilder`; every name of
:mod:`tsm.workspace.api` is here too.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from tsm.compat.torchx.runner._nightly import pin_workspace_images
from tsm.specs.api import AppDef, Role
from tsm.specs.runopts import CfgVal, runopts
from tsm.workspace.api import *  # noqa: F403
from tsm.workspace.mixin import Workspace, WorkspaceMixin

__all__ = ["MultiWorkspaceMixin", "Workspace", "WorkspaceMixin", "pin_workspace_images"]


def _has_push_step(builder: Any) -> bool:
    """Whether ``builder`` overrides the mixin's "not implemented" push (else its build already placed the result)."""
    return type(builder).dryrun_push_images is not WorkspaceMixin.dryrun_push_images


class MultiWorkspaceMixin(WorkspaceMixin[tuple[str, Any]]):
    """Several workspace builders, one chosen per run by the ``workspace_type`` run option (module doc)."""

    #: the run option that picks the builder
    WORKSPACE_TYPE_OPT: str = "workspace_type"

    @abc.abstractmethod
    def workspace_builders(self) -> Mapping[str, WorkspaceMixin[Any]]:
        """``{name: builder}``, the first the default; the same instances on every call."""

    def workspace_opts(self) -> runopts:
        """``workspace_type`` (default: the first builder's name) and the union of the builders' options."""
        builders = self.workspace_builders()
        if not builders:
            raise ValueError(f"{type(self).__name__}.workspace_builders() returned no builders")
        names = list(builders)
        opts = runopts()
        opts.add(self.WORKSPACE_TYPE_OPT, type_=str, default=names[0],
                 help=f"which workspace builder patches the image: one of {', '.join(names)}")
        for builder in builders.values():
            opts.update(builder.workspace_opts())
        return opts

    def workspace_builder(self, cfg: Mapping[str, CfgVal]) -> tuple[str, WorkspaceMixin[Any]]:
        """``(name, builder)`` that ``cfg["workspace_type"]`` names (the first when unset); ValueError otherwise."""
        builders = self.workspace_builders()
        name = cfg.get(self.WORKSPACE_TYPE_OPT)
        if name is None:
            name = next(iter(builders))
        if not isinstance(name, str) or name not in builders:
            raise ValueError(f"unknown {self.WORKSPACE_TYPE_OPT} `{name}`; this scheduler offers: {', '.join(builders)}")
        return name, builders[name]

    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        """Build with the chosen builder."""
        self.workspace_builder(cfg)[1].build_workspace_and_update_role(role, workspace, cfg)

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> tuple[str, Any]:
        """``(builder name, what it would push)``; None for a builder with no push step."""
        name, builder = self.workspace_builder(cfg)
        return name, builder.dryrun_push_images(app, cfg) if _has_push_step(builder) else None

    def push_images(self, images_to_push: tuple[str, Any]) -> None:
        """Push with the builder :meth:`dryrun_push_images` named (nothing when it has no push step)."""
        name, images = images_to_push
        if images is not None:
            self.workspace_builders()[name].push_images(images)
