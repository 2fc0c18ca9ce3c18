"""TorchX's ``specs.file_linter`` on tsm: TorchX's rules and words, its docstring reader and help formatter."""

from __future__ import annotations

import argparse
import ast
import textwrap
from pathlib import Path

from tsm.compat.torchx.specs.file_linter import (
    LinterMessage,
    TorchXArgumentHelpFormatter,
    TorchxFunctionValidator,
    get_fn_docstring,
    validate,
)
from tsm.specs.api import AppDef

GOOD = '''
from tsm.specs.api import AppDef


def good(msg: str, n: int = 1) -> AppDef:
    """Says msg.

    Args:
        msg: what to say
        n: how often
    """
    return AppDef("good")


def lowercase(tags: list[str], env: dict[str, str] | None = None) -> AppDef:
    return AppDef("lowercase")
'''


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "comp.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_torchx_words_and_the_builtins_spellings(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "\n\ndef bad(x, y: typing.Set[str]) -> int:\n    return 1\n")
    assert validate(path, "good") == []
    assert validate(path, "lowercase") == []  # list[str] and X | None read as List and Optional
    assert [m.description for m in validate(path, "bad")] == [
        "Arg x missing type annotation",
        "`bad` allows only Dict, List as complex types.Argument `y` has: Set",
        "Function: bad has incorrect return annotation, supported annotation: AppDef",
    ]
    [missing] = validate(path, "nope")
    assert (missing.name, missing.description, missing.line) == ("TorchXValidator", "Function nope not found", 0)


def test_get_fn_docstring_gives_torchxs_texts() -> None:
    def documented(a: str, b: int = 1) -> AppDef:
        """Does a thing.

        More words.

        Args:
            a: the a
        """
        raise AssertionError

    def bare(x: str) -> AppDef:
        raise AssertionError

    assert get_fn_docstring(documented) == ("Does a thing.\nMore words.", {"a": "the a", "b": " "})
    description, args = get_fn_docstring(bare)
    assert description.startswith("bare TIP: improve this help string by adding a docstring\n")
    assert args == {"x": " "}


def test_validate_with_custom_validators(tmp_path: Path) -> None:
    class NoLongNames(TorchxFunctionValidator):
        def validate(self, app_specs_func_def: ast.FunctionDef) -> list[LinterMessage]:
            if len(app_specs_func_def.name) > 3:
                return [self._gen_linter_message("name too long", app_specs_func_def.lineno)]
            return []

    path = write(tmp_path, GOOD)
    [m] = validate(path, "good", validators=[NoLongNames()])
    assert (m.name, m.description, m.char, m.severity) == ("TorchxFunctionValidator", "name too long", 0, "error")
    assert validate(path, "good", validators=[]) == []
    assert validate(path, "nope", validators=[NoLongNames()])[0].line == 0  # not found: still reported
    assert LinterMessage(name="n", description="d", line=1, char=2).severity == "error"  # TorchX's keywords


def test_help_formatter_suffixes_and_untyped_options() -> None:
    p = argparse.ArgumentParser(formatter_class=TorchXArgumentHelpFormatter)
    p.add_argument("--need", required=True, help="needed")
    p.add_argument("--size", type=int, default=3, help="how big")
    text = p.format_help()
    assert "needed (required)" in text and "how big (default: 3)" in text and "--size int" in text
    assert "show this help message and exit\n" in text  # --help gets no suffix
