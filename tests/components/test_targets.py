"""Components by dotted path (``pkg.module:fn``) and class components, on tsm's finder and TorchX's."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tsm.components import materialize
from tsm.components.finder import get_component
from tsm.components.targets import is_module_target
from tsm.errors import ComponentNotFoundError

MODULE = '''
from tsm import specs


def hello(msg: str = "hi") -> specs.AppDef:
    """Says hello.

    Args:
        msg: what to say
    """
    return specs.AppDef("hello", [specs.Role("hello", entrypoint="echo", args=[msg], resource=specs.Resource())])


class Trainer:
    """Trains for a while.

    Args:
        steps: how many steps
    """

    def __init__(self, steps: int = 3, name: str = "t") -> None:
        self.steps, self.name = steps, name

    def build(self) -> specs.AppDef:
        role = specs.Role("train", entrypoint="echo", args=[f"steps={self.steps}"], resource=specs.Resource())
        return specs.AppDef(self.name, [role])


class NoBuild:
    pass
'''


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"tgtpkg_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "comps.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[mod]


def test_is_module_target() -> None:
    assert is_module_target("pkg.mod:fn") and is_module_target("mod:Cls")
    assert not is_module_target("dir/file.py:fn") and not is_module_target("pkg.mod:") and not is_module_target("a.b")


def test_a_function_by_dotted_path(pkg: str) -> None:
    comp = get_component(f"{pkg}.comps:hello")
    app = materialize(comp.fn, ["--msg", "yo"])
    assert app.roles[0].args == ["yo"] and comp.description == "Says hello."


def test_a_class_component_takes_its_constructors_parameters(pkg: str) -> None:
    comp = get_component(f"{pkg}.comps:Trainer")
    app = materialize(comp.fn, ["--steps", "7", "--name", "run1"])
    assert (app.name, app.roles[0].args) == ("run1", ["steps=7"])
    assert materialize(comp.fn, []).roles[0].args == ["steps=3"]


def test_torchxs_finder_takes_both(pkg: str) -> None:
    from tsm.compat.torchx.specs.builders import materialize_appdef
    from tsm.compat.torchx.specs.finder import get_component as torchx_get

    app = materialize_appdef(torchx_get(f"{pkg}.comps:Trainer").fn, ["--steps", "5"])
    assert app.roles[0].args == ["steps=5"]
    assert materialize_appdef(torchx_get(f"{pkg}.comps:hello").fn, []).roles[0].args == ["hi"]


@pytest.mark.parametrize("attr, words", [("NoBuild", r"without a build\(\) method"), ("nope", "no component")])
def test_what_is_not_a_component_is_named(pkg: str, attr: str, words: str) -> None:
    with pytest.raises(ComponentNotFoundError, match=words):
        get_component(f"{pkg}.comps:{attr}")


def test_a_missing_module_is_not_found(pkg: str) -> None:
    with pytest.raises(ComponentNotFoundError, match="no module named"):
        get_component("no_such_pkg_x.mod:fn")
