"""TorchX's ``specs.file_linter`` at TorchX's path: check a component file, read a component's help text.

:func:`validate`, :func:`get_fn_docstring`, :class:`LinterMessage` and the validator base are tsm's
linter (:mod:`tsm.components.linter`, which never imports the file it checks) under TorchX's names;
:class:`TorchXArgumentHelpFormatter` is the argparse formatter TorchX's component parsers use, which
ends each option's help with ``(required)`` or ``(default: VALUE)``.
"""

from __future__ import annotations

import argparse

from tsm.components.linter import (
    ComponentFunctionValidator as TorchxFunctionValidator,
    LintMessage as LinterMessage,
    get_fn_docstring as get_fn_docstring,
    validate as validate,
)

__all__ = ["LinterMessage", "TorchXArgumentHelpFormatter", "TorchxFunctionValidator", "get_fn_docstring", "validate"]


class TorchXArgumentHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help text that says ``(required)`` after a required option and ``(default: X)`` after one with a default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required:
            text += " (required)"
        elif action.default not in (None, argparse.SUPPRESS) or action.option_strings and action.default is not None:
            text += f" (default: {action.default})"
        return text
