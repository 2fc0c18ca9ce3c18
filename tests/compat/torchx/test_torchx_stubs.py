"""The TorchX wing's shape: tsm's modules at TorchX-only paths only re-export the wing, and no layer imports it.

Every module of :mod:`tsm.compat.torchx` that has a tsm module at the same path is either one of
:data:`~tsm.compat.torchx.STUBS` (the tsm module is nothing but a re-export of it) or one of
:data:`~tsm.compat.torchx.FACES` (TorchX's face of a tsm module with stricter rules, which keeps its own).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import tsm
import tsm.compat.torchx as wing

SRC = Path(tsm.__file__).parent


def _source(module: str) -> Path:
    path = SRC.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize(("stub", "target"), sorted(wing.STUBS.items()))
def test_each_torchx_only_path_only_re_exports_the_wing(stub: str, target: str) -> None:
    tree = ast.parse(_source(stub).read_text())
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    assert body, f"{stub} is empty"
    for node in body:
        assert isinstance(node, ast.ImportFrom) and node.module == target, (
            f"{stub} line {node.lineno}: a stub holds nothing but `from {target} import ...`"
        )
    ours, theirs = importlib.import_module(stub), importlib.import_module(target)
    assert list(ours.__all__) == list(theirs.__all__)
    for name in theirs.__all__:
        assert getattr(ours, name) is getattr(theirs, name), f"{stub}.{name}"


def _wing_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(wing.__path__, prefix="tsm.compat.torchx."))


def test_every_wing_module_at_a_tsm_path_is_a_stubs_body_or_a_declared_face() -> None:
    faces = set(wing.FACES.values())
    bodies = set(wing.STUBS.values())
    for module in _wing_modules():
        tsm_path = "tsm." + module[len("tsm.compat.torchx."):]
        if _source(tsm_path).exists():
            assert module in bodies or module in faces, f"{module}: {tsm_path} exists but is neither its stub nor a face"
    for stub in wing.STUBS:
        assert _source(stub).exists(), f"{stub} is listed but missing"


def test_no_layer_of_tsm_imports_the_wing() -> None:
    allowed = {_source(s) for s in wing.STUBS}  # the stubs are the doors; the wing itself may import anything
    for path in SRC.rglob("*.py"):
        if "compat" in path.relative_to(SRC).parts or path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("tsm.compat") for n in names), f"{path} imports {names}"
