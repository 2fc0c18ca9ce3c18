"""Check a component file without importing it (``tsm lint file.py[:function]``).

The file is parsed with :mod:`ast` and never run, so linting is safe on code that would fail or do harm on
import. For each component (the named function, or every public top-level function whose return
annotation is AppDef) it reports:

============  ============================================================================================
severity      rule
============  ============================================================================================
error         the function is not defined at the top of the file; it is ``async``; its return
              annotation is not AppDef
error         a parameter has no annotation, or one :func:`~tsm.components.cmdline.materialize` cannot parse
              (see :data:`~tsm.components.cmdline.SUPPORTED_TYPES`); ``*args`` is not annotated
              ``str``; the function takes ``**kwargs``
warning       it has no docstring; a parameter is not documented in the docstring's ``Args:`` section,
              or ``Args:`` documents a name that is not a parameter
============  ============================================================================================

Errors are what would make :func:`~tsm.components.cmdline.materialize` refuse the function; warnings are what
would make its ``--help`` less useful. As in TorchX, findings are *returned*, never raised: a file that does
not parse gives one error with the line, a function that is not there one error at line 0 (only a file that
cannot be read raises). TorchX's own linter, with its rules and words, is
:mod:`tsm.compat.torchx.specs.file_linter` (``torchx.specs.file_linter``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tsm.components.cmdline import SUPPORTED_TYPES
from tsm.components.docstring import parse_docstring
from tsm.errors import ComponentNotFoundError, did_you_mean

ERROR = "error"
WARNING = "warning"

_SCALARS = frozenset({"str", "int", "float", "bool"})
_FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class LintMessage:
    """One finding: the function (``name``), what is wrong, its ``line`` and column, and ``severity``.

    The fields and their order are TorchX's ``LinterMessage`` (``char`` is the column, 0 when the whole
    line is meant; ``severity`` is ``"error"`` or ``"warning"``).
    """

    name: str
    description: str
    line: int
    char: int = 0
    severity: str = ERROR

    def __str__(self) -> str:
        return f"{self.line}: {self.severity}: {self.name}: {self.description}"


def lint(path: str, function: str | None = None) -> list[LintMessage]:
    """Lint component ``function`` of the file at ``path``, or with None every component in it.

    A missing or unreadable file raises :class:`~tsm.errors.ComponentNotFoundError`; a ``function`` that is
    not defined at the top of the file is an error message at line 0. Messages come sorted by line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except FileNotFoundError:
        raise ComponentNotFoundError(f"component file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ComponentNotFoundError(f"cannot read component file '{path}': {e}") from None
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        return [LintMessage("<file>", f"syntax error: {e.msg}", e.lineno or 0, e.offset or 0, ERROR)]
    functions: dict[str, _FunctionNode] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[node.name] = node  # a later definition replaces an earlier one, as when run
    if function is not None:
        if function not in functions:
            hint = did_you_mean(function, functions)
            there = ", ".join(functions) or "none"
            text = f"function '{function}' not found in '{path}'{hint}; functions there: {there}"
            return [LintMessage(function, text, 0, 0, ERROR)]
        targets = [functions[function]]
    else:
        targets = [f for name, f in functions.items() if not name.startswith("_") and _returns_appdef(f)]
    messages = [m for f in targets for m in _lint_function(f)]
    return sorted(messages, key=lambda m: m.line)


def _lint_function(fn: _FunctionNode) -> list[LintMessage]:
    out: list[LintMessage] = []

    def report(line: int, severity: str, description: str) -> None:
        out.append(LintMessage(fn.name, description, line, 0, severity))

    if isinstance(fn, ast.AsyncFunctionDef):
        report(fn.lineno, ERROR, "a component must be a plain function, not async")
    docstring = ast.get_docstring(fn)
    if not docstring:
        report(fn.lineno, WARNING, "has no docstring; its first line is the component's description")
    if not _returns_appdef(fn):
        got = ast.unparse(fn.returns) if fn.returns is not None else "nothing"
        report(fn.lineno, ERROR, f"must be annotated to return AppDef, is annotated {got}")
    a = fn.args
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
        if arg.annotation is None:
            report(
                arg.lineno,
                ERROR,
                f"parameter '{arg.arg}' has no type annotation (supported: {SUPPORTED_TYPES})",
            )
        elif not _supported(arg.annotation):
            report(
                arg.lineno,
                ERROR,
                f"parameter '{arg.arg}' has unsupported type {ast.unparse(arg.annotation)} (supported: {SUPPORTED_TYPES})",
            )
    if a.vararg is not None and (
        a.vararg.annotation is None or _tail(_unquote(a.vararg.annotation)) != "str"
    ):
        got = ast.unparse(a.vararg.annotation) if a.vararg.annotation is not None else "not annotated"
        report(a.vararg.lineno, ERROR, f"*{a.vararg.arg} must be annotated str ({got})")
    if a.kwarg is not None:
        report(
            a.kwarg.lineno,
            ERROR,
            f"**{a.kwarg.arg} is not supported; declare each option as a typed parameter",
        )
    if docstring:
        documented = parse_docstring(docstring).args
        params = [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs]
        for arg in params:
            if arg.arg not in documented:
                report(
                    arg.lineno,
                    WARNING,
                    f"parameter '{arg.arg}' is not documented in the docstring's Args: section",
                )
        names = {arg.arg for arg in params} | ({a.kwarg.arg} if a.kwarg else set())
        for name in documented:
            if name not in names:
                report(fn.lineno, WARNING, f"Args: documents '{name}', which is not a parameter")
    return out


def _returns_appdef(fn: _FunctionNode) -> bool:
    return fn.returns is not None and _tail(_unquote(fn.returns)) == "AppDef"


def _unquote(node: ast.expr) -> ast.expr:
    """A string annotation (``"int"``) parsed into the expression it spells; anything else as it is."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return node
    return node


def _tail(node: ast.expr) -> str | None:
    """The last name of ``x`` or ``a.b.x`` (``typing.Optional`` gives ``Optional``), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _supported(node: ast.expr) -> bool:
    """The same rule as :func:`tsm.components.cmdline.param_type`, read from source."""
    node = _unquote(node)
    # Optional[X], Union[X, None], X | None, None | X: strip the None, once.
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if _is_none(node.right) != _is_none(node.left):
            node = node.left if _is_none(node.right) else node.right
        else:
            return False
    elif isinstance(node, ast.Subscript) and _tail(node.value) == "Optional":
        node = node.slice
    elif isinstance(node, ast.Subscript) and _tail(node.value) == "Union":
        members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [m for m in members if not _is_none(m)]
        if len(members) != 2 or len(rest) != 1:
            return False
        node = rest[0]
    return _supported_base(node)


_ITEMS = frozenset({"str", "int", "float"})


def _supported_base(node: ast.expr) -> bool:
    """``str``/``int``/``float``/``bool``, ``list[T]``, ``dict[K, T]``, ``dict[K, list[T]]`` (K, T: str, int, float)."""
    if _tail(node) in _SCALARS:
        return True
    if not isinstance(node, ast.Subscript):
        return False
    container = _tail(node.value)
    if container in ("list", "List"):
        return _tail(node.slice) in _ITEMS
    if container in ("dict", "Dict"):
        s = node.slice
        if not (isinstance(s, ast.Tuple) and len(s.elts) == 2 and _tail(s.elts[0]) in _ITEMS):
            return False
        value = s.elts[1]
        if _tail(value) in _ITEMS:
            return True
        return (
            isinstance(value, ast.Subscript)
            and _tail(value.value) in ("list", "List")
            and _tail(value.slice) in _ITEMS
        )
    return False
