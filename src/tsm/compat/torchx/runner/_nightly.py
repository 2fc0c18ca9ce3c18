"""The TorchX nightly's per-role pieces of a dry run, for :mod:`tsm.compat.torchx.runner.api`.

* ``Role.overrides`` (TorchX 710f6541): applied once at dry run (:mod:`tsm.specs.overrides`).
* ``Role.workspace`` (TorchX nightly, 2025-10 and later): a role's own workspace, shipped for that role
  alone; ``run(..., workspace=W)`` sets role 0's, as the nightly does.
* :func:`build_workspace` and :func:`pin_workspace_images` (``torchx.workspace.api``): build every role's
  workspace once, then point roles at the results so a later submission builds nothing.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tsm.specs.api import AppDef, Role
from tsm.specs.overrides import apply_overrides
from tsm.specs.runopts import CfgVal
from tsm.workspace.mixin import Workspace

__all__ = ["apply_overrides", "as_workspace", "build_workspace", "pin_workspace_images", "ship_role_workspaces"]


def as_workspace(workspace: Workspace | str | None) -> Workspace | None:
    """``workspace`` as a :class:`Workspace` (a path is one project at the root)."""
    if workspace is None or isinstance(workspace, Workspace):
        return workspace
    return Workspace.from_str(str(workspace)) if str(workspace) else None


@contextlib.contextmanager
def _as_path(workspace: Workspace) -> Iterator[str]:
    """A directory holding ``workspace``: the project itself when it is one at the root, else a merged copy."""
    if workspace.is_unmapped_single_project():
        yield next(iter(workspace.projects))
        return
    with tempfile.TemporaryDirectory(suffix="_tsm_workspace") as outdir:
        for src, dst in workspace.projects.items():
            target = Path(outdir) / dst
            if Path(src).is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target if dst else Path(outdir) / Path(src).name)
            else:
                shutil.copytree(src, target, dirs_exist_ok=True)
        yield outdir


def ship_role_workspaces(app: AppDef, builder: Any, cfg: Mapping[str, CfgVal]) -> None:
    """Ship each role's own ``workspace`` for that role (roles sharing one are shipped together)."""
    from tsm.workspace.dir import apply_workspace

    groups: dict[Workspace, list[Role]] = {}
    for role in app.roles:
        ws = as_workspace(role.workspace)
        if ws is not None:
            groups.setdefault(ws, []).append(role)
    for ws, roles in groups.items():
        with _as_path(ws) as path:
            apply_workspace(AppDef(app.name, roles, dict(app.metadata)), path, cfg, builder)


def build_workspace(app: AppDef, builder: Any, cfg: Mapping[str, CfgVal]) -> dict[tuple[str, Workspace], str]:
    """Build every ``(image, workspace)`` pair of ``app``'s roles once; ``{(image, workspace): built image}``.

    ``app`` is not changed: each pair is built on a copy of its first role.
    """
    built: dict[tuple[str, Workspace], str] = {}
    for role in app.roles:
        ws = as_workspace(role.workspace)
        if ws is None or (role.image, ws) in built:
            continue
        probe = copy.deepcopy(role)
        probe.workspace = ws
        ship_role_workspaces(AppDef(app.name, [probe]), builder, cfg)
        built[(role.image, ws)] = probe.image
    return built


def pin_workspace_images(app: AppDef, images: Mapping[tuple[str, Workspace], str]) -> None:
    """Point each role whose ``(image, workspace)`` was built at its image and clear its workspace (mutates ``app``).

    A role with no workspace, or whose pair was not built, is left as it is.
    """
    for role in app.roles:
        ws = as_workspace(role.workspace)
        if ws is None:
            continue
        image = images.get((role.image, ws))
        if image is not None:
            role.image = image
            role.workspace = None
