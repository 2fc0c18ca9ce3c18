"""TorchX's ``workspace.api.WorkspaceMixin`` and multi-project ``Workspace``, for schedulers written for TorchX.

:class:`WorkspaceMixin` is tsm's :class:`~tsm.workspace.api.WorkspaceBuilder` with TorchX's defaults: only
``build_workspace_and_update_role`` must be written; ``dryrun_push_images``/``push_images`` raise
``NotImplementedError`` until a scheduler that pushes images overrides them, and
``build_workspace_and_update_role2`` takes a :class:`Workspace` of several project directories (TorchX
commit f685fbe, "Support multi-project/directory workspace", 2025-09-16): unless it is one project with no
target, the projects are copied into one temporary directory, each under its target sub-directory, and that
directory is built as a single workspace.

:class:`Workspace` is the data: ``projects`` maps a local directory (or file) to its sub-directory in the
workspace root (``""``: the root itself). ``Workspace.from_str`` reads a plain path (one project) or a mapping
written as ``src: dst`` lines, ``{src: dst, ...}``, or ``src:dst;src2`` (the form ``str()`` prints).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from tsm.specs.api import AppDef, Role
from tsm.specs.runopts import CfgVal
from tsm.workspace.builder import WorkspaceBuilder

T = TypeVar("T")

__all__ = ["Workspace", "WorkspaceMixin"]


@dataclass
class Workspace:
    """Local project directories and where each lands under the workspace root (``""``: the root)."""

    projects: dict[str, str]

    def __hash__(self) -> int:
        """By its projects, so a ``(image, workspace)`` pair can key the images ``Runner.build_workspace`` built."""
        return hash(tuple(sorted(self.projects.items())))

    def is_unmapped_single_project(self) -> bool:
        """True for one project with no target sub-directory (the same as a plain path workspace)."""
        return len(self.projects) == 1 and not next(iter(self.projects.values()))

    @staticmethod
    def from_str(workspace: str) -> Workspace:
        """Read a workspace from text: a path, or ``src: dst`` pairs (lines, ``{...}``, or ``;``-separated)."""
        text = workspace.strip()
        if text.startswith("{") and text.endswith("}"):
            pairs = [p for p in text[1:-1].split(",") if p.strip()]
        elif "\n" in text:
            pairs = [p for p in text.splitlines() if p.strip() and not p.lstrip().startswith("#")]
        elif ";" in text:
            pairs = [p for p in text.split(";") if p.strip()]
        else:
            return Workspace({text: ""})
        projects: dict[str, str] = {}
        for pair in pairs:
            src, _, dst = pair.partition(": ") if ": " in pair else pair.partition(":")
            dst = dst.strip()
            projects[src.strip()] = "" if dst in ("", "null", "~") else dst
        return Workspace(projects)

    def __str__(self) -> str:
        if self.is_unmapped_single_project():
            return next(iter(self.projects))
        return ";".join(k if not v else f"{k}:{v}" for k, v in self.projects.items())


class WorkspaceMixin(WorkspaceBuilder[T], Generic[T]):
    """A scheduler's workspace builder written against TorchX's interface (see the module docstring)."""

    def build_workspace_and_update_role2(self, role: Role, workspace: Workspace | str, cfg: Mapping[str, CfgVal]) -> None:
        """Build a multi-project :class:`Workspace` (or a path) for ``role`` through ``build_workspace_and_update_role``."""
        if isinstance(workspace, Workspace):
            if workspace.is_unmapped_single_project():
                workspace = str(workspace)
            else:
                with tempfile.TemporaryDirectory(suffix="_tsm_workspace") as outdir:
                    for src, dst in workspace.projects.items():
                        target = Path(outdir) / dst
                        if Path(src).is_file():
                            target.parent.mkdir(parents=True, exist_ok=True)
                            shutil.copy2(src, target if dst else Path(outdir) / Path(src).name)
                        else:
                            shutil.copytree(src, target, dirs_exist_ok=True)
                    self.build_workspace_and_update_role(role, outdir, cfg)
                return
        self.build_workspace_and_update_role(role, workspace, cfg)

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> T:
        """Not implemented unless the scheduler pushes images (TorchX's default)."""
        raise NotImplementedError("dryrun_push_images is not implemented by this scheduler")

    def push_images(self, images_to_push: T) -> None:
        """Not implemented unless the scheduler pushes images (TorchX's default)."""
        raise NotImplementedError("push_images is not implemented by this scheduler")
