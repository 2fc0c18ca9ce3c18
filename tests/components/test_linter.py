"""lint: static checks of a component file, without importing it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import tsm.components.dist
import tsm.components.utils
from tsm.components import get_component, lint, materialize
from tsm.components.linter import LintMessage
from tsm.errors import ComponentError, ComponentNotFoundError

HEADER = "from typing import Dict, List, Optional, Union\nimport typing\nfrom tsm.specs.api import AppDef, Role\n\n"


def write(tmp_path: Path, body: str, name: str = "comp.py") -> str:
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return str(path)


def descriptions(messages: list[LintMessage]) -> list[tuple[str, str]]:
    return [(m.severity, m.description) for m in messages]


GOOD = '''
def good(*args: str, msg: str = "x", n: Optional[int] = None, tags: "list[str] | None" = None) -> AppDef:
    """A good component.

    Args:
        *args: words
        msg: a message
        n: a number
        tags: some tags
    """
    return AppDef("g", roles=[Role("r", entrypoint="echo", args=[msg, *args])])
'''


@pytest.mark.parametrize("module", [tsm.components.utils, tsm.components.dist])
def test_builtins_are_clean(module: object) -> None:
    assert lint(str(module.__file__)) == []  # type: ignore[attr-defined]


def test_good_component_is_clean(tmp_path: Path) -> None:
    assert lint(write(tmp_path, GOOD)) == []
    assert lint(write(tmp_path, GOOD), "good") == []


def test_file_is_not_imported(tmp_path: Path) -> None:
    path = write(tmp_path, "raise SystemExit('imported!')\n" + GOOD)
    assert lint(path) == []


def test_missing_docstring(tmp_path: Path) -> None:
    path = write(tmp_path, "def f(x: int = 1) -> AppDef:\n    return AppDef('a')\n")
    [m] = lint(path)
    assert (m.name, m.line, m.severity) == ("f", 5, "warning")  # as in TorchX, help just has less to say
    assert "has no docstring" in m.description


def test_unannotated_parameter(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'def f(x, y: int = 1) -> AppDef:\n    """Doc.\n\n    Args:\n        x: x\n        y: y\n    """\n',
    )
    assert descriptions(lint(path)) == [
        ("error", "parameter 'x' has no type annotation (supported: " + _supported() + ")")
    ]


def _supported() -> str:
    from tsm.components.cmdline import SUPPORTED_TYPES

    return SUPPORTED_TYPES


# Each annotation must get the same verdict from lint (static) and from materialize (at run time).
ANNOTATIONS = {
    "str": True,
    "int": True,
    "float": True,
    "bool": True,
    "list[str]": True,
    "List[str]": True,
    "typing.List[str]": True,
    "dict[str, str]": True,
    "Dict[str, str]": True,
    "Optional[int]": True,
    "typing.Optional[dict[str, str]]": True,
    "Union[int, None]": True,
    "Union[None, str]": True,
    "int | None": True,
    "None | list[str]": True,
    "'int'": True,
    "list[int]": True,
    "List[float]": True,
    "dict[str, int]": True,
    "Dict[int, str]": True,
    "Dict[str, List[str]]": True,
    "dict[str, list[int]] | None": True,
    "Optional[List[int]]": True,
    "list[bool]": False,
    "list[list[str]]": False,
    "dict[str, dict[str, str]]": False,
    "dict[list[str], str]": False,
    "list": False,
    "dict": False,
    "bytes": False,
    "Union[int, str]": False,
    "Union[int, str, None]": False,
    "int | str": False,
    "None": False,
    "'no such'": False,
}


@pytest.mark.parametrize(("annotation", "ok"), sorted(ANNOTATIONS.items()))
def test_parameter_types_agree_with_materialize(tmp_path: Path, annotation: str, ok: bool) -> None:
    body = f'def f(x: {annotation} = None) -> AppDef:\n    """Doc.\n\n    Args:\n        x: x\n    """\n    return AppDef("a", roles=[Role("r", entrypoint="true")])\n'
    path = write(tmp_path, body)
    messages = lint(path)
    assert (messages == []) is ok, messages
    if not ok:
        [m] = messages
        assert m.severity == "error" and m.description.startswith("parameter 'x' has unsupported type")
    if ok:
        materialize(get_component(f"{path}:f").fn, [])
    else:
        with pytest.raises(ComponentError, match="parameter 'x' has unsupported type|cannot resolve"):
            get_component(f"{path}:f")  # refused at lookup, as TorchX's finder does


@pytest.mark.parametrize(
    ("annotation", "ok"), [("str", True), ("'str'", True), ("int", False), (None, False)]
)
def test_varargs_must_be_str(tmp_path: Path, annotation: str | None, ok: bool) -> None:
    star = f"*args: {annotation}" if annotation else "*args"
    path = write(tmp_path, f'def f({star}) -> AppDef:\n    """Doc.\n\n    Args:\n        *args: a\n    """\n')
    messages = lint(path)
    assert (messages == []) is ok
    if not ok:
        assert messages[0].description.startswith("*args must be annotated str")


def test_kwargs(tmp_path: Path) -> None:
    path = write(tmp_path, 'def f(**kw: str) -> AppDef:\n    """Doc."""\n')
    assert descriptions(lint(path)) == [
        ("error", "**kw is not supported; declare each option as a typed parameter")
    ]


def test_return_annotation_checked_when_function_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, 'def f() -> str:\n    """Doc."""\n\ndef g():\n    """Doc."""\n')
    assert lint(path) == []  # with no function named, only functions returning AppDef are components
    assert descriptions(lint(path, "f")) == [
        ("error", "must be annotated to return AppDef, is annotated str")
    ]
    assert descriptions(lint(path, "g")) == [
        ("error", "must be annotated to return AppDef, is annotated nothing")
    ]


@pytest.mark.parametrize("ret", ["AppDef", "'AppDef'", "tsm.AppDef", "specs.AppDef"])
def test_return_annotation_spellings(tmp_path: Path, ret: str) -> None:
    path = write(tmp_path, f'def f() -> {ret}:\n    """Doc."""\n')
    assert lint(path, "f") == []
    assert lint(path) == []


def test_async_component(tmp_path: Path) -> None:
    path = write(tmp_path, 'async def f() -> AppDef:\n    """Doc."""\n')
    assert descriptions(lint(path)) == [("error", "a component must be a plain function, not async")]


def test_undocumented_and_unknown_args_are_warnings(tmp_path: Path) -> None:
    body = '''
    def f(
        documented: int = 1,
        undocumented: str = "",
    ) -> AppDef:
        """Doc.

        Args:
            documented: fine
            gone: no longer a parameter
        """
    '''
    messages = lint(write(tmp_path, body))
    assert [(m.line, m.severity, m.description) for m in messages] == [
        (6, "warning", "Args: documents 'gone', which is not a parameter"),
        (8, "warning", "parameter 'undocumented' is not documented in the docstring's Args: section"),
    ]


def test_private_and_non_component_functions_are_skipped(tmp_path: Path) -> None:
    path = write(tmp_path, "def _f(x) -> AppDef:\n    pass\n\ndef helper(x):\n    pass\n")
    assert lint(path) == []


def test_every_component_in_the_file_is_linted_sorted_by_line(tmp_path: Path) -> None:
    body = "def a(x) -> AppDef:\n    '''Doc.'''\n\ndef b() -> AppDef:\n    pass\n"
    messages = lint(write(tmp_path, body))
    assert [(m.name, m.line) for m in messages] == [("a", 5), ("a", 5), ("b", 8)]
    assert (
        str(messages[-1]) == "8: warning: b: has no docstring; its first line is the component's description"
    )


def test_syntax_error_is_one_message(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text("x = 1\ndef f(:\n")
    [m] = lint(str(path))
    assert (m.name, m.line, m.severity) == ("<file>", 2, "error")
    assert m.description.startswith("syntax error")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ComponentNotFoundError, match="does not exist"):
        lint(str(tmp_path / "nope.py"))


def test_missing_function_is_a_message_not_an_exception(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    [m] = lint(path, "god")
    assert (m.name, m.line, m.char, m.severity) == ("god", 0, 0, "error")
    assert (
        m.description == f"function 'god' not found in '{path}' (did you mean 'good'?); functions there: good"
    )


