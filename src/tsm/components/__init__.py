"""Components: typed Python functions that build an AppDef, found by name and called from a command line.

::

    from tsm.components import component_help, get_component, materialize

    comp = get_component("dist.ddp")            # a builtin, a plugin's entry point, or "file.py:fn"
    app = materialize(comp.fn, ["-j", "2x4", "--script", "train.py", "--", "--lr", "0.1"])
    print(component_help(comp.fn, prog="tsm run dist.ddp"))

Where names come from: :mod:`tsm.components.finder`. How a signature becomes a command line:
:mod:`tsm.components.cmdline`. Checking a component file without running it:
:mod:`tsm.components.linter`. Testing your own components: :mod:`tsm.components.component_test_base`.
The builtins: :mod:`tsm.components.utils` and :mod:`tsm.components.dist`.

Names are imported on first use, so ``import tsm.components`` costs next to nothing and finding a builtin
imports only that builtin's module (entry points are read only for other names, or when listing).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "ComponentDef": "tsm.components.finder",
    "get_component": "tsm.components.finder",
    "list_components": "tsm.components.finder",
    "ComponentFn": "tsm.components.cmdline",
    "materialize": "tsm.components.cmdline",
    "component_help": "tsm.components.cmdline",
    "wants_help": "tsm.components.cmdline",
    "LintMessage": "tsm.components.linter",
    "lint": "tsm.components.linter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tsm.components' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    modules = {"base", "cmdline", "component_test_base", "dist", "docstring", "finder", "linter", "utils"}
    return sorted(set(__all__) | modules)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs ("x as x" marks a re-export)
    from tsm.components.cmdline import (
        ComponentFn as ComponentFn,
        component_help as component_help,
        materialize as materialize,
        wants_help as wants_help,
    )
    from tsm.components.finder import (
        ComponentDef as ComponentDef,
        get_component as get_component,
        list_components as list_components,
    )
    from tsm.components.linter import LintMessage as LintMessage, lint as lint
