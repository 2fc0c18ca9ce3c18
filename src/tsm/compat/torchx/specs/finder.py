"""TorchX's ``specs.finder``: components by name, found and validated as TorchX finds them.

tsm's own finder is :mod:`tsm.components.finder` (``tsm run``'s: builtins first, plugins only add, a file
component loaded as a module). This module keeps TorchX's contract for code that calls TorchX's finder:

* the components are those of the ``torchx.components`` entry points when any is registered, else the
  builtins (every module of :mod:`tsm.components`, searched recursively), never both; a module entry point
  ``foo = pkg.mod`` names its components ``foo.<submodule>.<function>`` and ``_x = ...`` leaves out the
  prefix;
* every function of a searched module is a candidate, validated with TorchX's linter
  (:mod:`tsm.compat.torchx.specs.file_linter`): :func:`get_components` gives the valid ones,
  :func:`get_component` raises :class:`ComponentValidationException` for an invalid one and
  :class:`ComponentNotFoundException` for an unknown name (tsm's :class:`~tsm.errors.ComponentError` and
  :class:`~tsm.errors.ComponentNotFoundError`, so either ``except`` catches them);
* ``path/file.py:function`` is read from that file, imported as the module it is with its package root on
  ``sys.path`` (:func:`load_module_file`, TorchX nightly); ``pkg.module:name``
  (TorchX nightly) imports ``pkg.module`` and takes its function, or its class as a class component
  (:mod:`tsm.components.targets`);
* :func:`get_builtin_source` gives a builtin's function with the imports and constants before it, a file
  to copy.

The lookup is cached in the module's ``_components`` (set it to None to search again, as TorchX's tests do).
"""

from __future__ import annotations

import abc
import ast
import importlib
import inspect
import os
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tsm.compat.torchx.specs.file_linter import (
    get_fn_docstring,
    parse,
    read_conf_file,
    validate,
    validate_tree,
)
from tsm.compat.torchx.util import entrypoints
from tsm.components.finder import load_file
from tsm.components.targets import is_module_target, resolve_target
from tsm.errors import (
    ComponentError as ComponentValidationException,
    ComponentNotFoundError as ComponentNotFoundException,
)
from tsm.specs.api import AppDef

__all__ = ["ComponentNotFoundException", "ComponentValidationException", "ComponentsFinder", "CustomComponentsFinder",
           "ModuleComponentsFinder", "_Component", "_load_components", "get_builtin_source", "get_component",
           "get_components", "is_namespace_package", "is_package", "module_relname"]

#: The package whose modules are the builtins.
BUILTINS = "tsm.components"


@dataclass
class _Component:
    """A component: its ``name`` (``dist.ddp``, ``path.py:fn``), description, function and linter errors."""

    name: str
    description: str
    fn_name: str
    fn: Callable[..., AppDef]
    validation_errors: list[str]


class ComponentsFinder(abc.ABC):
    """Finds a set of components."""

    @abc.abstractmethod
    def find(self) -> list[_Component]:
        """The components found (valid or not: see each one's ``validation_errors``)."""


def is_namespace_package(module: ModuleType) -> bool:
    """True for a namespace package (a folder without ``__init__.py``: no ``__file__``)."""
    return getattr(module, "__file__", None) is None


def is_package(module: ModuleType) -> bool:
    """True for a package, regular or namespace (it has ``__path__``)."""
    return hasattr(module, "__path__")


def module_relname(module: ModuleType, relative_to: ModuleType) -> str:
    """``module``'s dotted name below ``relative_to`` (``""`` for itself); ValueError when it is not below it."""
    if module.__name__ == relative_to.__name__:
        return ""
    parts, base = module.__name__.split("."), relative_to.__name__.split(".")
    if parts[: len(base)] != base:
        raise ValueError(f"`{module.__name__}` is not a submodule of `{relative_to.__name__}`")
    return ".".join(parts[len(base):])


class ModuleComponentsFinder(ComponentsFinder):
    """The components of a module and, for a package, of every module below it.

    A component is named ``<group>.<module path below the base>.<function>``, empty parts left out:
    ``ModuleComponentsFinder("foo.bar", group="")`` names ``foo/bar/baz.py``'s ``echo`` ``baz.echo``.
    """

    def __init__(self, module: str | ModuleType, group: str) -> None:
        self.base_module = importlib.import_module(module) if isinstance(module, str) else module
        self.group = group

    def _modules(self, module: ModuleType) -> Iterator[ModuleType]:
        if not is_namespace_package(module):
            yield module
        if is_package(module):
            for info in pkgutil.iter_modules(module.__path__, prefix=f"{module.__name__}."):
                yield from self._modules(importlib.import_module(info.name))

    def find(self) -> list[_Component]:
        """Every function of every module searched, with TorchX's linter's verdict on it."""
        found = []
        for m in self._modules(self.base_module):
            tree = parse(read_conf_file(os.path.abspath(str(m.__file__))))
            rel = module_relname(m, relative_to=self.base_module)
            for fn_name, fn in inspect.getmembers(m, inspect.isfunction):
                name = ".".join(p for p in (self.group, rel, fn_name) if p)
                errors = [e.description for e in validate_tree(tree, fn_name)]
                found.append(_Component(name, get_fn_docstring(fn)[0], fn_name, fn, errors))
        return found


def load_module_file(filepath: str) -> ModuleType:
    """Import the Python file ``filepath`` as the real module it is (TorchX nightly): its package root (the
    folder above the topmost ``__init__.py`` around it, else its own folder) goes on ``sys.path`` and the file
    is imported by its dotted name, so its relative and package imports work."""
    import sys

    path = Path(os.path.abspath(filepath))
    if path.suffix != ".py" or not path.is_file():
        return load_file(filepath)  # not a module file: tsm's loader says why
    parts = [path.stem]
    root = path.parent
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    if not all(p.isidentifier() for p in parts):
        return load_file(filepath)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    name = ".".join(parts)
    loaded = sys.modules.get(name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") != str(path):
        return load_file(filepath)  # that name is another module already: never replace it
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as e:
        from tsm.errors import ComponentImportError

        raise ComponentImportError(f"cannot import component file '{filepath}' as module {name}: {e}") from e


class CustomComponentsFinder(ComponentsFinder):
    """The component ``function_name`` of the Python file ``filepath``."""

    def __init__(self, filepath: str, function_name: str) -> None:
        self._filepath = filepath
        self._function_name = function_name

    def find(self) -> list[_Component]:
        """The one component (ComponentNotFoundException when the file has no such function)."""
        errors = [e.description for e in validate(self._filepath, self._function_name)]
        fn = getattr(load_module_file(self._filepath), self._function_name, None)
        if not callable(fn):
            raise ComponentNotFoundException(f"Function {self._function_name} does not exist in file {self._filepath}")
        return [_Component(f"{self._filepath}:{self._function_name}", get_fn_docstring(fn)[0],
                           self._function_name, fn, errors)]


def _load_custom_components() -> list[_Component]:
    found: list[_Component] = []
    for group, load in (entrypoints.load_group("torchx.components", default={}) or {}).items():
        found += ModuleComponentsFinder(load(), "" if group.startswith("_") else group).find()
    return found


def _load_components() -> dict[str, _Component]:
    """The ``torchx.components`` entry points' components if any is registered, else the builtins."""
    found = _load_custom_components() or ModuleComponentsFinder(BUILTINS, "").find()
    return {c.name: c for c in found}


_components: dict[str, _Component] | None = None


def _find_components() -> dict[str, _Component]:
    global _components
    if not _components:
        _components = _load_components()
    return _components


def get_components() -> dict[str, _Component]:
    """The valid components by name (the entry points' if any, else the builtins')."""
    return {name: c for name, c in _find_components().items() if not c.validation_errors}


def get_component(name: str) -> _Component:
    """The component ``name`` (``dist.ddp``, an entry point's, or ``path/file.py:function``)."""
    if ":" in name and is_module_target(name) and not os.path.exists(name.partition(":")[0]):
        fn = resolve_target(name)
        return _Component(name, get_fn_docstring(fn)[0], name.partition(":")[2], fn, [])
    if ":" in name:
        path, _, fn_name = name.rpartition(":")
        components = {c.name: c for c in CustomComponentsFinder(path, fn_name).find()}
    else:
        components = _find_components()
    if name not in components:
        raise ComponentNotFoundException(
            f"Component `{name}` not found. Please make sure it is one of the builtins: `torchx builtins`. Or "
            "registered via `[torchx.components]` entry point"
        )
    component = components[name]
    if component.validation_errors:
        raise ComponentValidationException(
            f"Component {name} has validation errors: \n {chr(10).join(component.validation_errors)}")
    return component


def get_builtin_source(name: str) -> str:
    """The builtin ``name``'s function source, after what its file sets up before it: the ``import`` lines
    and the module-level constants (a builtin's program text), so the copy runs as it is."""
    component = get_component(name)
    fn_name = component.name.rpartition(".")[2]
    source = Path(inspect.getfile(component.fn)).read_text(encoding="utf-8")
    preamble = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == fn_name:
            break
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)):
            preamble.append(ast.get_source_segment(source, node) or "")
    return "\n".join([*preamble, "\n", inspect.getsource(component.fn), "\n"])
