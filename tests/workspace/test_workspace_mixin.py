"""TorchX's ``WorkspaceMixin`` (only ``build_workspace_and_update_role`` required) and multi-project ``Workspace``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tsm.specs import AppDef, Role
from tsm.specs.runopts import CfgVal
from tsm.workspace.mixin import Workspace, WorkspaceMixin


class Snapshot(WorkspaceMixin[None]):
    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        self.seen.append(sorted(str(p.relative_to(workspace)) for p in Path(workspace).rglob("*")))
        role.image = "built"


def test_a_torchx_style_builder_needs_one_method(tmp_path: Path) -> None:
    b = Snapshot()
    role = Role("r")
    b.build_workspace_and_update_role2(role, str(tmp_path), {})
    assert role.image == "built"
    with pytest.raises(NotImplementedError):
        b.dryrun_push_images(AppDef("a"), {})
    assert len(b.workspace_opts()) == 0


def test_several_projects_are_copied_under_their_targets(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "y.py").write_text("")
    b = Snapshot()
    b.build_workspace_and_update_role2(Role("r"), Workspace({str(tmp_path / "a"): "", str(tmp_path / "b"): "lib"}), {})
    assert b.seen == [["lib", "lib/y.py", "x.py"]]


def test_workspace_text_forms() -> None:
    assert Workspace.from_str("/p").projects == {"/p": ""} and Workspace.from_str("/p").is_unmapped_single_project()
    assert Workspace.from_str("/a: x\n/b:").projects == {"/a": "x", "/b": ""}
    assert Workspace.from_str("{/a: x, /b: y}").projects == {"/a": "x", "/b": "y"}
    w = Workspace({"/a": "x", "/b": ""})
    assert str(w) == "/a:x;/b" and Workspace.from_str(str(w)).projects == w.projects
    assert str(Workspace({"/p": ""})) == "/p"
