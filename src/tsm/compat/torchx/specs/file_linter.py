"""TorchX's ``specs.file_linter``: check a component function in a file without running it, in TorchX's words.

tsm's own linter (:func:`tsm.components.linter.lint`, ``tsm lint``) checks what tsm's command line
accepts and words its findings for tsm. This module is TorchX's contract for code that calls TorchX's
linter: :func:`validate` returns :class:`LinterMessage` errors worded as TorchX words them
(``Arg x missing type annotation``, ``Function f not found``, ...), found by TorchX's rules (every
argument annotated; complex types only ``List``/``Dict`` of primitives, optionally ``Optional``; the
return annotated ``AppDef``), with the builtins' lower-case ``list``/``dict`` and ``X | None`` read as
their ``typing`` spellings. :func:`get_fn_docstring` gives TorchX's help texts and
:class:`TorchXArgumentHelpFormatter` its ``(required)``/``(default: X)`` help suffixes.
"""

from __future__ import annotations

import abc
import argparse
import ast
import inspect
from collections.abc import Callable

from tsm.compat.torchx.util.io import read_conf_file
from tsm.components.docstring import parse_docstring
from tsm.components.linter import LintMessage as LinterMessage

__all__ = ["LinterMessage", "TorchFunctionVisitor", "TorchXArgumentHelpFormatter", "TorchxFunctionArgsValidator",
           "TorchxFunctionValidator", "TorchxReturnValidator", "get_fn_docstring", "parse", "read_conf_file", "validate",
           "validate_tree"]


class TorchXArgumentHelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Help text ending ``(required)`` for a required option and ``(default: X)`` for any other (not ``--help``);
    an option's value is shown by its type's name (``--nnodes int``), as TorchX shows it."""

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        return getattr(action.type, "__name__", None) or super()._get_default_metavar_for_optional(action)

    def _get_default_metavar_for_positional(self, action: argparse.Action) -> str:
        return getattr(action.type, "__name__", None) or super()._get_default_metavar_for_positional(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is argparse.SUPPRESS:
            return text
        return text + (" (required)" if action.required else f" (default: {action.default})")


def get_fn_docstring(fn: Callable[..., object]) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: help})`` of ``fn``'s Google-style docstring, as TorchX gives them.

    The description is the summary line, then (after a newline) the long description; without a docstring
    it names the function with a tip to add one. Every parameter has a help text (``" "`` when undocumented).
    """
    name = getattr(fn, "__name__", "component")
    tip = (f"{name} TIP: improve this help string by adding a docstring\nto your component (see: "
           "https://pytorch.org/torchx/latest/component_best_practices.html)")
    try:
        args = {p: " " for p in inspect.signature(fn).parameters}
    except (TypeError, ValueError):
        args = {}
    doc = parse_docstring(inspect.getdoc(fn))
    args.update({k: v for k, v in doc.args.items() if v})
    if not doc.description:
        return tip, args
    summary, _, rest = doc.description.partition("\n\n")
    return (summary + "\n" + rest.strip() if rest.strip() else summary), args


def _name(node: ast.expr | None) -> str | None:
    """``List`` of ``List``, ``typing.List`` or ``"List"``; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


class TorchxFunctionValidator(abc.ABC):
    """One check of a component function's definition (``ast.FunctionDef``); its findings are errors."""

    @abc.abstractmethod
    def validate(self, app_specs_func_def: ast.FunctionDef) -> list[LinterMessage]:
        """The problems found in the function (empty when there are none)."""

    def _gen_linter_message(self, description: str, lineno: int) -> LinterMessage:
        return LinterMessage(name="TorchxFunctionValidator", description=description, line=lineno, char=0)


class TorchxFunctionArgsValidator(TorchxFunctionValidator):
    """Every argument (``*args`` and keyword-only ones too) annotated with a type TorchX's command line reads."""

    def validate(self, app_specs_func_def: ast.FunctionDef) -> list[LinterMessage]:
        a = app_specs_func_def.args
        args = [*a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs]
        return [m for arg in args for m in self._validate_arg_def(app_specs_func_def.name, arg)]

    def _validate_arg_def(self, function_name: str, arg_def: ast.arg) -> list[LinterMessage]:
        node = arg_def.annotation
        if node is None:
            return [self._gen_linter_message(f"Arg {arg_def.arg} missing type annotation", arg_def.lineno)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None is Optional[X]
            node = node.left if _name(node.right) == "None" or _is_none(node.right) else node.right
        elif isinstance(node, ast.Subscript) and _name(node.value) == "Optional":
            node = node.slice
        if not isinstance(node, ast.Subscript):
            return []
        kind = _name(node.value)
        if kind not in ("Dict", "List", "dict", "list"):
            desc = f"`{function_name}` allows only Dict, List as complex types.Argument `{arg_def.arg}` has: {kind}"
            return [self._gen_linter_message(desc, arg_def.lineno)]
        if kind in ("Dict", "dict"):
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [self._gen_linter_message("Dict can only have primitive types", arg_def.lineno)
                    for el in elts if _name(el) is None]
        if _name(node.slice) is None:
            return [self._gen_linter_message("List can only have primitive types", arg_def.lineno)]
        return []


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


class TorchxReturnValidator(TorchxFunctionValidator):
    """The function is annotated to return ``AppDef`` (``specs.AppDef`` and ``"AppDef"`` too)."""

    def validate(self, app_specs_func_def: ast.FunctionDef) -> list[LinterMessage]:
        name, lineno = app_specs_func_def.name, app_specs_func_def.lineno
        returns = _name(app_specs_func_def.returns)
        if not returns or returns == "None":
            return [self._gen_linter_message(
                f"Function: {name} missing return annotation or has unknown annotations. "
                "Supported return annotation: AppDef", lineno)]
        if returns != "AppDef":
            return [self._gen_linter_message(
                f"Function: {name} has incorrect return annotation, supported annotation: AppDef", lineno)]
        return []


class TorchFunctionVisitor(ast.NodeVisitor):
    """Runs the validators on every function definition named ``component_function_name``."""

    def __init__(self, component_function_name: str) -> None:
        self.validators: list[TorchxFunctionValidator] = [TorchxFunctionArgsValidator(), TorchxReturnValidator()]
        self.linter_errors: list[LinterMessage] = []
        self.component_function_name = component_function_name
        self.visited_function = False

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:  # noqa: N802 (ast's visitor name)
        """Check ``node`` if it is the component function."""
        if node.name == self.component_function_name:
            self.visited_function = True
            for validator in self.validators:
                self.linter_errors += validator.validate(node)


def validate(
    path: str, component_function: str, validators: list[TorchxFunctionValidator] | None = None
) -> list[LinterMessage]:
    """The errors in component ``component_function`` of the file at ``path`` (TorchX's rules and words).

    A file that does not parse gives one error (Python's message); a function that is not there, one error
    ``Function <name> not found`` at line 0. ``validators`` (TorchX's nightly) replace the default checks.
    """
    return validate_tree(parse(read_conf_file(path)), component_function, validators)


def parse(source: str) -> ast.Module | LinterMessage:
    """The module ``source`` defines, or the error that it does not parse (what :func:`validate` reports)."""
    try:
        return ast.parse(source)
    except SyntaxError as e:
        return LinterMessage(name="TorchXValidator", description=e.msg, line=e.lineno or 0, char=e.offset or 0)


def validate_tree(
    module: ast.Module | LinterMessage, component_function: str, validators: list[TorchxFunctionValidator] | None = None
) -> list[LinterMessage]:
    """:func:`validate` of a file already parsed (:func:`parse`): a finder checks each function of a file once."""
    if isinstance(module, LinterMessage):
        return [module]
    visitor = TorchFunctionVisitor(component_function)
    if validators is not None:
        visitor.validators = list(validators)
    visitor.visit(module)
    if not visitor.visited_function:
        visitor.linter_errors.append(
            LinterMessage(name="TorchXValidator", description=f"Function {component_function} not found", line=0))
    return visitor.linter_errors
