"""get_component / list_components: builtins, the ``tsm.components`` entry-point group, ``file.py:function``.

Entry points are real: each test writes a ``*.dist-info`` with an ``entry_points.txt`` into a temporary
folder put first on ``sys.path``, and :mod:`importlib.metadata` finds it as it would an installed package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tsm.components import get_component, list_components, materialize
from tsm.components.finder import ComponentDef
from tsm.errors import ComponentError, ComponentImportError, ComponentNotFoundError
from tsm.specs.api import AppDef

BUILTINS = {
    "utils.echo",
    "utils.sh",
    "utils.python",
    "utils.touch",
    "utils.binary",
    "utils.copy",
    "utils.booth",
    "dist.ddp",
    "dist.spmd",
}

COMPONENT_MODULE = '''
from tsm.specs.api import AppDef, Role
from tsm.components.utils import echo  # imported, so not one of this module's components


def train(lr: float = 0.1) -> AppDef:
    """Train a model.

    Args:
        lr: learning rate
    """
    return AppDef("train", roles=[Role("trainer", entrypoint="python", args=["--lr", str(lr)])])


def echo(msg: str = "plugin") -> AppDef:
    """A plugin's own echo: never replaces the builtin utils.echo."""
    return AppDef("echo", roles=[Role("echo", entrypoint="echo", args=[msg])])


def helper() -> str:
    """Not a component: does not return AppDef."""
    return "x"


def _private() -> AppDef:
    """Not a component: private."""
    raise AssertionError
'''

MakePlugin = Callable[..., str]


@pytest.fixture
def make_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakePlugin]:
    """Install a fake distribution: ``make_plugin(entry_points_lines, {module: source})`` returns a unique suffix.

    Module names in the sources may use ``{uid}``, replaced by a suffix unique to the test, so modules of
    different tests never meet in ``sys.modules``.
    """
    uid = uuid.uuid4().hex[:8]
    made: list[str] = []

    def make(
        entry_points: str,
        modules: dict[str, str],
        dist: str = "tsm-test-plugin",
        group: str = "tsm.components",
    ) -> str:
        root = tmp_path / f"site-{len(made)}"
        root.mkdir()
        for name, source in modules.items():
            module = name.format(uid=uid)
            made.append(module.replace("/", ".").removesuffix(".__init__"))
            (root / f"{module}.py").parent.mkdir(parents=True, exist_ok=True)
            (root / f"{module}.py").write_text(source.replace("{uid}", uid))
        info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[{group}]\n" + entry_points.format(uid=uid))
        monkeypatch.syspath_prepend(str(root))
        return uid

    yield make
    for module in made:
        sys.modules.pop(module, None)


# -- builtins --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtins_are_found(name: str) -> None:
    comp = get_component(name)
    assert comp.name == name
    assert comp.source == "builtin"
    assert comp.description and "\n" not in comp.description
    assert comp.fn.__name__ == name.split(".")[1]


def test_list_components_has_every_builtin_sorted() -> None:
    found = list_components()
    assert set(found) >= BUILTINS
    assert list(found) == sorted(found)
    assert all(isinstance(c, ComponentDef) for c in found.values())


def test_builtin_helpers_are_not_components() -> None:
    found = list_components()
    for name in (
        "dist._torchrun_app",
        "dist.parse_j",
        "utils.resource",
        "utils.exactly_one",
        "dist.app_name",
    ):
        assert name not in found
        with pytest.raises(ComponentNotFoundError):
            get_component(name)


def test_finding_a_builtin_reads_no_entry_points_and_imports_no_other_builtin() -> None:
    code = textwrap.dedent(
        """
        import sys
        import tsm.components as c
        assert "tsm.components.finder" not in sys.modules  # import tsm.components is (nearly) free
        app = c.materialize(c.get_component("utils.echo").fn, ["--msg", "hi"])
        assert app.roles[0].args == ["hi"], app
        print("importlib.metadata" in sys.modules, "tsm.components.dist" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# -- not found ---------------------------------------------------------------------------------------------
def test_unknown_name_suggests_and_hints() -> None:
    with pytest.raises(ComponentNotFoundError) as info:
        get_component("utils.ecoh")
    message = str(info.value)
    assert "no component named 'utils.ecoh'" in message
    assert "(did you mean 'utils.echo'?)" in message
    assert "tsm builtins" in message


def test_unknown_name_without_a_close_match() -> None:
    with pytest.raises(ComponentNotFoundError, match=r"no component named 'zzz'; run 'tsm builtins'"):
        get_component("zzz")


# -- entry points ----------------------------------------------------------------------------------------
def test_module_entry_point_adds_its_components_under_a_prefix(make_plugin: MakePlugin) -> None:
    make_plugin("myteam = myteam_{uid}\n", {"myteam_{uid}": COMPONENT_MODULE})
    comp = get_component("myteam.train")
    assert comp.source == "entry point tsm-test-plugin"
    assert comp.description == "Train a model."
    assert materialize(comp.fn, ["--lr", "0.5"]).roles[0].args == ["--lr", "0.5"]
    found = list_components()
    assert {"myteam.train", "myteam.echo"} <= set(found)
    assert set(found) >= BUILTINS
    assert "myteam.helper" not in found and "myteam._private" not in found


def test_function_entry_point_is_named_like_the_entry_point(make_plugin: MakePlugin) -> None:
    make_plugin("fit = fit_{uid}:train\n", {"fit_{uid}": COMPONENT_MODULE})
    comp = get_component("fit")
    assert comp.fn.__name__ == "train"
    assert "fit" in list_components()


def test_entry_points_never_replace_a_builtin(make_plugin: MakePlugin) -> None:
    make_plugin(
        "utils = utils_{uid}\nutils.touch = utils_{uid}:train\n",
        {"utils_{uid}": COMPONENT_MODULE},
    )
    assert get_component("utils.echo").source == "builtin"
    assert get_component("utils.touch").source == "builtin"
    assert get_component("utils.train").source == "entry point tsm-test-plugin"  # but may add to a prefix
    found = list_components()
    assert found["utils.echo"].source == "builtin"
    assert found["utils.touch"].source == "builtin"


def test_entry_point_module_raising_on_import_is_an_import_error(make_plugin: MakePlugin) -> None:
    make_plugin("broken = broken_{uid}\n", {"broken_{uid}": "raise RuntimeError('no GPU driver')\n"})
    with pytest.raises(ComponentImportError) as info:
        get_component("broken.train")
    message = str(info.value)
    assert "broken_" in message and "tsm-test-plugin" in message
    assert "RuntimeError: no GPU driver" in message
    assert "\n" not in message


def test_listing_with_a_broken_plugin(make_plugin: MakePlugin) -> None:
    make_plugin(
        "broken = broken_{uid}\n", {"broken_{uid}": "import no_such_module_anywhere\n"}, dist="bad-plugin"
    )
    make_plugin("good = good_{uid}\n", {"good_{uid}": COMPONENT_MODULE}, dist="good-plugin")
    with pytest.raises(ComponentImportError, match="ModuleNotFoundError"):
        list_components()
    errors: list[ComponentError] = []
    found = list_components(errors=errors)
    assert "good.train" in found and set(found) >= BUILTINS
    assert len(errors) == 1 and "bad-plugin" in str(errors[0])


def test_a_broken_plugin_does_not_hide_other_names(make_plugin: MakePlugin) -> None:
    make_plugin("broken = broken_{uid}\n", {"broken_{uid}": "raise SystemExit(3)\n"}, dist="bad-plugin")
    make_plugin("good = good_{uid}\n", {"good_{uid}": COMPONENT_MODULE}, dist="good-plugin")
    assert get_component("good.train").source == "entry point good-plugin"
    with pytest.raises(ComponentNotFoundError, match=r"did you mean 'good.train'"):
        get_component("good.trian")


def test_function_entry_point_naming_nothing(make_plugin: MakePlugin) -> None:
    make_plugin("ghost = ghost_{uid}:nothing_here\n", {"ghost_{uid}": COMPONENT_MODULE})
    with pytest.raises(ComponentNotFoundError, match="names no function"):
        get_component("ghost")
    errors: list[ComponentError] = []
    assert "ghost" not in list_components(errors=errors)
    assert len(errors) == 1


def test_plugin_name_not_in_its_module(make_plugin: MakePlugin) -> None:
    make_plugin("myteam = myteam_{uid}\n", {"myteam_{uid}": COMPONENT_MODULE})
    with pytest.raises(ComponentNotFoundError, match=r"no component named 'myteam.evaluate'"):
        get_component("myteam.evaluate")


# -- files -----------------------------------------------------------------------------------------------
def test_file_component_relative_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "comps.py").write_text(COMPONENT_MODULE)
    monkeypatch.chdir(tmp_path)
    comp = get_component("comps.py:train")
    assert comp.name == "comps.py:train"
    assert comp.source == f"file {tmp_path / 'comps.py'}"
    assert comp.description == "Train a model."
    assert isinstance(materialize(comp.fn, []), AppDef)


def test_file_component_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "sub dir" / "my-comps.py"
    path.parent.mkdir()
    path.write_text(COMPONENT_MODULE)
    assert get_component(f"{path}:train").fn(lr=1.0).roles[0].args == ["--lr", "1.0"]


def test_two_files_with_the_same_name_do_not_collide(tmp_path: Path) -> None:
    for d, msg in (("a", "from a"), ("b", "from b")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "c.py").write_text(
            "from tsm.specs.api import AppDef, Role\n"
            "def f() -> AppDef:\n"
            "    '''Doc.'''\n"
            f"    return AppDef('x', roles=[Role('r', entrypoint='echo', args=[{msg!r}])])\n"
        )
    a = get_component(f"{tmp_path / 'a' / 'c.py'}:f").fn()
    b = get_component(f"{tmp_path / 'b' / 'c.py'}:f").fn()
    assert (a.roles[0].args, b.roles[0].args) == (["from a"], ["from b"])


def test_file_component_may_use_dataclasses(tmp_path: Path) -> None:
    (tmp_path / "dc.py").write_text(
        "from __future__ import annotations\n"
        "from dataclasses import dataclass\n"
        "from tsm.specs.api import AppDef, Role\n"
        "@dataclass\n"
        "class Cfg:\n"
        "    n: int = 1\n"
        "def f(n: int = 2) -> AppDef:\n"
        "    '''Doc.'''\n"
        "    return AppDef('x', roles=[Role('r', entrypoint='true', num_replicas=Cfg(n).n)])\n"
    )
    assert materialize(get_component(f"{tmp_path / 'dc.py'}:f").fn, ["-n", "3"]).roles[0].num_replicas == 3


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ComponentNotFoundError) as info:
        get_component("nope.py:train")
    assert "component file 'nope.py' does not exist" in str(info.value)
    assert os.fspath(tmp_path / "nope.py") in str(info.value)


def test_missing_function_in_file(tmp_path: Path) -> None:
    (tmp_path / "comps.py").write_text(COMPONENT_MODULE)
    with pytest.raises(ComponentNotFoundError) as info:
        get_component(f"{tmp_path / 'comps.py'}:trian")
    message = str(info.value)
    assert "no function 'trian'" in message
    assert "(did you mean 'train'?)" in message
    assert "functions there: echo, train, helper, _private" in message


def test_file_attribute_that_is_not_a_function(tmp_path: Path) -> None:
    (tmp_path / "comps.py").write_text("X = 1\n")
    with pytest.raises(ComponentNotFoundError, match="'X' is a int, not a function"):
        get_component(f"{tmp_path / 'comps.py'}:X")


def test_file_without_function_name(tmp_path: Path) -> None:
    (tmp_path / "comps.py").write_text(COMPONENT_MODULE)
    with pytest.raises(ComponentNotFoundError, match="names no function"):
        get_component(f"{tmp_path / 'comps.py'}:")


def test_file_raising_on_import(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text("import os\nraise ValueError('bad\\nconfig')\n")
    with pytest.raises(ComponentImportError) as info:
        get_component(f"{path}:train")
    assert str(info.value) == f"cannot import component file '{path}': ValueError: bad config"
    assert not any(m.startswith("_tsm_file_component_bad_") for m in sys.modules)


def test_file_with_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "syntax.py"
    path.write_text("def f(:\n")
    with pytest.raises(ComponentImportError, match="SyntaxError"):
        get_component(f"{path}:f")


# -- TorchX's entry-point group, fn_name, validation_errors ---------------------------------------------
def test_torchx_group_is_read_after_tsms_with_torchx_naming(make_plugin: MakePlugin) -> None:
    make_plugin(
        "team = tpkg{uid}\n_1 = flat{uid}\n",
        {
            "tpkg{uid}/__init__": COMPONENT_MODULE,
            "tpkg{uid}/sub/__init__": "",
            "tpkg{uid}/sub/jobs": COMPONENT_MODULE.replace("def train(", "def deep("),
            "flat{uid}": COMPONENT_MODULE.replace("def train(", "def flat("),
        },
        dist="torchx-team",
        group="torchx.components",
    )
    make_plugin("team = tsmteam{uid}\n", {"tsmteam{uid}": COMPONENT_MODULE.replace("Train a model", "tsm's")})
    found = list_components()
    assert {"team.sub.jobs.deep", "flat", "team.train"} <= set(found)
    assert found["team.train"].description == "tsm's."  # tsm's group wins a name both give
    assert get_component("team.sub.jobs.deep").source == "entry point torchx-team"
    assert get_component("flat").fn.__name__ == "flat"
    app = materialize(get_component("team.sub.jobs.deep").fn, ["--lr", "2"])
    assert app.roles[0].args == ["--lr", "2.0"]


def test_a_torchx_plugin_that_imports_torchx_is_reported_not_fatal(make_plugin: MakePlugin) -> None:
    make_plugin(
        "old = needs_torchx{uid}\n", {"needs_torchx{uid}": "import torchx.specs\n"}, group="torchx.components"
    )
    errors: list[ComponentError] = []
    assert set(list_components(errors)) >= BUILTINS
    assert len(errors) == 1 and "No module named 'torchx'" in str(errors[0])


BAD_SOURCE = '''
from tsm.specs.api import AppDef


def loose(x, y: int = 1) -> AppDef:
    """x has no annotation."""
    raise AssertionError
'''


def test_component_def_has_fn_name_and_validation_errors(tmp_path: Path) -> None:
    comp = get_component("utils.echo")
    assert (comp.fn_name, comp.validation_errors) == ("echo", [])
    path = tmp_path / "c.py"
    path.write_text(BAD_SOURCE)
    with pytest.raises(
        ComponentError, match=r"component '.*c.py:loose' is not valid: .*parameter 'x' has no type"
    ):
        get_component(f"{path}:loose")


def test_invalid_plugin_component_is_refused_at_lookup_and_left_out_of_the_list(
    make_plugin: MakePlugin,
) -> None:
    make_plugin("bad = loose{uid}\n", {"loose{uid}": BAD_SOURCE})
    with pytest.raises(ComponentError, match="component 'bad.loose' is not valid"):
        get_component("bad.loose")
    errors: list[ComponentError] = []
    assert "bad.loose" not in list_components(errors)
    assert any("bad.loose" in str(e) for e in errors)


def test_get_components_and_get_builtin_source() -> None:
    from tsm.components.finder import get_builtin_source, get_components

    assert set(get_components()) >= BUILTINS
    source = get_builtin_source("utils.copy")
    assert source.startswith("def copy(src: str, dst: str") and "torchx-utils-copy" in source
    with pytest.raises(ComponentNotFoundError):
        get_builtin_source("utils.nope")


def test_a_torchx_component_file_outside_the_alias_says_how_to_run_it(tmp_path: Path) -> None:
    path = tmp_path / "torchx_comp.py"
    path.write_text("import torchx.specs as specs\n\ndef train() -> specs.AppDef:\n    return specs.AppDef('t')\n")
    with pytest.raises(ComponentImportError) as e:
        get_component(f"{path}:train")
    assert "No module named 'torchx'" in str(e.value)
    assert "python -m tsm.torchx_alias -m tsm.cli.main run" in str(e.value) and "from torchx to tsm" in str(e.value)
