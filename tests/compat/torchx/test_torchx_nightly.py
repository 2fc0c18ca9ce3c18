"""The TorchX nightly's names on the TorchX face: ``Role.overrides``, ``Role.workspace``, ``Resource.tags``,
``Runner.build_workspace`` with ``pin_workspace_images``, ``describe_native``, ``MultiWorkspaceMixin``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tsm.compat.torchx.cli._runner import command_runner
from tsm.compat.torchx.workspace import MultiWorkspaceMixin, Workspace, WorkspaceMixin, pin_workspace_images
from tsm.specs import AppDef, AppState, Resource, Role
from tsm.specs.runopts import runopts


def _cat(name: str, **kw: Any) -> Role:
    return Role(name, entrypoint="cat", args=["data.txt"], resource=Resource(cpu=1, gpu=0, memMB=64), **kw)


def test_resource_tags_and_role_fields_have_the_nightlys_defaults() -> None:
    role = Role("r", entrypoint="true")
    assert (role.workspace, role.overrides, Resource().tags) == (None, {}, {})
    tagged = Resource(cpu=1, gpu=0, memMB=1, tags={"alias_of": "gpu.small"})
    assert Resource.copy(tagged).tags == {"alias_of": "gpu.small"}


def test_overrides_are_applied_once_at_dry_run(tsm_home: Path) -> None:
    async def late_args() -> list[str]:
        await asyncio.sleep(0)
        return ["from", "a", "coroutine"]

    calls: list[int] = []
    role = Role("echo", entrypoint="echo", resource=Resource(cpu=1, gpu=0, memMB=64),
                overrides={"args": late_args, "num_replicas": lambda: calls.append(1) or 2})
    with command_runner() as runner:
        info = runner.dryrun(AppDef("ov", [role]), "local")
    assert (role.args, role.num_replicas, role.overrides, calls) == (["from", "a", "coroutine"], 2, {}, [1])
    assert "coroutine" in str(info)


def test_a_roles_own_workspace_is_shipped_for_that_role_only(tmp_path: Path, tsm_home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.txt").write_text("in the workspace\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.txt").write_text("in the working directory\n")
    app = AppDef("ws", [_cat("own", workspace=Workspace.from_str(str(project))), _cat("plain")])
    with command_runner() as runner:
        handle = runner.run(app, "local")
        status = runner.wait(handle, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert "".join(runner.log_lines(handle, "own")) == "in the workspace\n"
        assert "".join(runner.log_lines(handle, "plain")) == "in the working directory\n"


def test_build_workspace_once_then_pin_the_images(tmp_path: Path, tsm_home: Path) -> None:
    (tmp_path / "data.txt").write_text("built once\n")
    ws = Workspace.from_str(str(tmp_path))
    app = AppDef("pin", [_cat("a", workspace=ws), _cat("b", workspace=ws),
                         Role("c", entrypoint="true", resource=Resource())])
    with command_runner() as runner:
        images = runner.build_workspace(app, "local")
        assert list(images) == [("", ws)] and app.roles[0].image == ""  # app unchanged
        pin_workspace_images(app, images)
        assert [(r.image, r.workspace) for r in app.roles] == [(images[("", ws)], None)] * 2 + [("", None)]
        assert Path(images[("", ws)], "data.txt").read_text() == "built once\n"
        handle = runner.run(app, "local")
        status = runner.wait(handle, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED
        assert "".join(runner.log_lines(handle, "b")) == "built once\n"


def test_describe_native_is_none_where_the_scheduler_reads_no_request_back(tsm_home: Path) -> None:
    with command_runner() as runner:
        handle = runner.run(AppDef("n", [Role("t", entrypoint="true", resource=Resource())]), "local")
        assert runner.describe_native(handle) is None
        assert runner.describe_native("local://torchx/never-1") is None


class _Dir(WorkspaceMixin[None]):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def workspace_opts(self) -> runopts:
        opts = runopts()
        opts.add(f"{self.tag}_opt", type_=str, help="x", default="d")
        return opts

    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, Any]) -> None:
        role.image = f"{self.tag}:{workspace}"


class _TwoWays(MultiWorkspaceMixin):
    def __init__(self) -> None:
        self.builders = {"dir": _Dir("dir"), "tmpdir": _Dir("tmp")}

    def workspace_builders(self) -> Mapping[str, WorkspaceMixin[Any]]:
        return self.builders


def test_multi_workspace_mixin_picks_the_builder_by_workspace_type() -> None:
    mixin = _TwoWays()
    assert mixin.workspace_builder({})[0] == "dir"
    assert mixin.workspace_builder({"workspace_type": "tmpdir"})[0] == "tmpdir"
    assert sorted(k for k, _ in mixin.workspace_opts()) == ["dir_opt", "tmp_opt", "workspace_type"]
    role = Role("r", entrypoint="true")
    mixin.build_workspace_and_update_role(role, "/src", {"workspace_type": "tmpdir"})
    assert role.image == "tmp:/src"
    assert mixin.dryrun_push_images(AppDef("a", [role]), {}) == ("dir", None)
    mixin.push_images(("dir", None))  # no push step: nothing to do
    with pytest.raises(ValueError, match="unknown workspace_type `nfs`; this scheduler offers: dir, tmpdir"):
        mixin.workspace_builder({"workspace_type": "nfs"})


def test_a_file_component_is_imported_as_its_package_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tsm.compat.torchx.specs.finder import get_component

    pkg = tmp_path / "fcpkg_nightly" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "fcpkg_nightly" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "consts.py").write_text("WORD = 'relative import works'\n")
    (pkg / "comp.py").write_text(
        "from tsm import specs\nfrom .consts import WORD\n\n\n"
        "def app(msg: str = WORD) -> specs.AppDef:\n"
        '    """An app.\n\n    Args:\n        msg: the word\n    """\n'
        "    return specs.AppDef('a', [specs.Role('a', entrypoint='echo', args=[msg])])\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        comp = get_component(f"{pkg / 'comp.py'}:app")
        assert comp.fn.__module__ == "fcpkg_nightly.sub.comp" and str(tmp_path) in sys.path
        assert comp.fn().roles[0].args == ["relative import works"]
    finally:
        for name in [m for m in sys.modules if m.startswith("fcpkg_nightly")]:
            del sys.modules[name]


def test_specs_workspace_is_the_workspace_record() -> None:
    import tsm.compat.torchx.specs as torchx_specs

    assert torchx_specs.Workspace is Workspace
    assert hash(Workspace({"a": ""})) == hash(Workspace({"a": ""})) and Workspace.from_str("a:b;c") == Workspace(
        {"a": "b", "c": ""})


def test_resolve_ignore_unknown_false_refuses_an_undeclared_key() -> None:
    from tsm.compat.torchx.specs import InvalidRunConfigException

    opts = runopts()
    opts.add("queue", type_=str, help="q", default="main")
    assert opts.resolve({"quene": "x"}) == {"quene": "x", "queue": "main"}  # the default: passed on, warned
    with pytest.raises(InvalidRunConfigException, match="unknown run option 'quene'.*did you mean 'queue'"):
        opts.resolve({"quene": "x"}, ignore_unknown=False)
    assert opts.resolve({"queue": "y"}, ignore_unknown=False) == {"queue": "y"}


def test_tsms_own_runner_applies_overrides_too(tsm_home: Path) -> None:
    from tsm.runner import get_runner

    role = Role("e", entrypoint="echo", args=["x"], resource=Resource(), overrides={"args": lambda: ["from override"]})
    with get_runner() as runner:
        handle = runner.run(AppDef("o", [role]), "local")
        status = runner.wait(handle, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED
        assert "".join(runner.log_lines(handle, "e")) == "from override\n"
