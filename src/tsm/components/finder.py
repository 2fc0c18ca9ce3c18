"""Find components by name: builtins, the ``tsm.components`` entry-point group, and ``file.py:function``.

Where a name is looked up, in order:

1. **Builtins** ``<module>.<function>`` for the modules in :data:`BUILTIN_MODULES` (``utils.echo``,
   ``dist.ddp``, ...). Finding one imports that one module and nothing else, so ``tsm run utils.echo``
   never pays for scanning installed packages.
2. **Entry points** of the group ``tsm.components``, read (with :mod:`importlib.metadata`) only when the
   name is not a builtin, or when listing. An entry point whose value is a module (``myteam =
   myteam.components``) gives ``<entry point name>.<function>`` for each public function defined in that
   module whose return annotation is AppDef; one whose value is a function (``train = myteam.jobs:train``)
   gives a component named like the entry point. Entry points only *add* names: one that would replace
   a builtin is ignored, and among plugins the first one found wins.
   Then TorchX's group ``torchx.components``, with TorchX's naming: a module (or package, searched
   recursively) registered as ``name = pkg.mod`` gives ``name.<submodule>.<function>``, and a name
   starting with ``_`` gives no prefix. Its modules must import ``tsm`` (not ``torchx``) to load.
3. **Files** ``path/to/file.py:function`` (relative to the working directory, or absolute). The file is
   imported under a fresh module name each time, so two files with the same name never collide and an
   edited file is read anew. Its folder is not added to ``sys.path``.

A component whose signature cannot be a command line (an unannotated or unsupported parameter) is
refused when it is looked up: :attr:`ComponentDef.validation_errors` says why.

A name that is none of these raises :class:`~tsm.errors.ComponentNotFoundError` with a did-you-mean; a
module that raises while being imported raises :class:`~tsm.errors.ComponentImportError` naming the module
and the original error, never "not found".
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import os
import pkgutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tsm.components.docstring import parse_docstring
from tsm.errors import ComponentError, ComponentImportError, ComponentNotFoundError, did_you_mean
from tsm.specs.api import AppDef

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from tsm.components.cmdline import ComponentFn

#: Builtin component modules, by the prefix users type (``utils`` in ``utils.echo``).
BUILTIN_MODULES: dict[str, str] = {
    "utils": "tsm.components.utils",
    "dist": "tsm.components.dist",
}
#: The entry-point group plugins register components under.
ENTRY_POINT_GROUP = "tsm.components"
#: TorchX's group, read after tsm's: a TorchX component package works once its modules import ``tsm``.
TORCHX_ENTRY_POINT_GROUP = "torchx.components"
_HINT = "run 'tsm builtins' to list the available components"
_file_counter = itertools.count()


@dataclass(frozen=True)
class ComponentDef:
    """A component found by name: the function, its one-line description, and where it came from.

    ``source`` is ``"builtin"``, ``"entry point <distribution>"`` or ``"file <absolute path>"``.
    ``fn_name`` is the function's own name and ``validation_errors`` what makes it unusable as a component
    (an unannotated or unsupported parameter, ``**kwargs``; empty when it is fine), as in TorchX's
    ``_Component``. :func:`get_component` refuses a component with errors; :func:`list_components` leaves
    it out (and reports it in ``errors``).
    """

    name: str
    fn: ComponentFn
    description: str
    source: str
    fn_name: str = ""
    validation_errors: list[str] = field(default_factory=list)


def _describe(name: str, fn: ComponentFn, source: str) -> ComponentDef:
    from tsm.components.cmdline import signature_errors

    return ComponentDef(
        name,
        fn,
        parse_docstring(getattr(fn, "__doc__", None)).summary,
        source,
        fn_name=getattr(fn, "__name__", name.rpartition(".")[2]),
        validation_errors=signature_errors(fn),
    )


def _checked(comp: ComponentDef) -> ComponentDef:
    """``comp`` itself when it is a valid component, else a ComponentError naming what is wrong."""
    if comp.validation_errors:
        raise ComponentError(f"component '{comp.name}' is not valid: {'; '.join(comp.validation_errors)}")
    return comp


def is_component_function(obj: Any, module: ModuleType) -> bool:
    """True for a public function defined in ``module`` (not imported into it) whose return annotation is AppDef.

    The annotation is read without evaluating it: the class itself or a string ending in ``AppDef``
    (modules using ``from __future__ import annotations``).
    """
    if not inspect.isfunction(obj) or obj.__name__.startswith("_") or obj.__module__ != module.__name__:
        return False
    ret = obj.__annotations__.get("return")
    return ret is AppDef or (isinstance(ret, str) and ret.rsplit(".", 1)[-1] == "AppDef")


def module_components(module: ModuleType) -> dict[str, ComponentFn]:
    """The component functions of ``module`` by function name, in definition order."""
    return {name: obj for name, obj in vars(module).items() if is_component_function(obj, module)}


def _import(module_name: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except (Exception, SystemExit) as e:
        raise ComponentImportError(f"cannot import {what}: {_one_line(e)}{_torchx_hint(e)}") from e


def _torchx_hint(e: BaseException) -> str:
    """What to do when a component's module imports ``torchx``, which is not installed: the alias, or a rename."""
    if not isinstance(e, ModuleNotFoundError) or (e.name or "").split(".")[0] != "torchx":
        return ""
    return ("; it is written for TorchX: run tsm under the alias (python -m tsm.torchx_alias -m tsm.cli.main run ...), "
            "or change its import lines from torchx to tsm")


def _one_line(e: BaseException) -> str:
    try:
        text = " ".join(str(e).split())
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises still has a type to name
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# -- builtins -------------------------------------------------------------------------------------------
def _builtin(name: str) -> ComponentDef | None:
    prefix, _, fn_name = name.rpartition(".")
    if prefix not in BUILTIN_MODULES:
        return None
    module = importlib.import_module(BUILTIN_MODULES[prefix])
    fn = getattr(module, fn_name, None)
    if fn is None or not is_component_function(fn, module):
        return None
    return _describe(name, fn, "builtin")


def _builtins() -> dict[str, ComponentDef]:
    found = {}
    for prefix, module_name in BUILTIN_MODULES.items():
        module = importlib.import_module(module_name)
        for fn_name, fn in module_components(module).items():
            found[f"{prefix}.{fn_name}"] = _describe(f"{prefix}.{fn_name}", fn, "builtin")
    return found


# -- entry points ---------------------------------------------------------------------------------------
def _entry_points() -> Iterator[EntryPoint]:
    """tsm's group first, then TorchX's (so a tsm registration wins a name both give).

    Through :func:`tsm.runner.plugins.entry_points`: :mod:`importlib.metadata` is imported and asked only
    when some installed distribution names one of the groups (almost never), which keeps it out of start-up.
    """
    from tsm.runner.plugins import entry_points

    yield from entry_points((ENTRY_POINT_GROUP, TORCHX_ENTRY_POINT_GROUP))


def _is_torchx(ep: EntryPoint) -> bool:
    return getattr(ep, "group", ENTRY_POINT_GROUP) == TORCHX_ENTRY_POINT_GROUP


def _torchx_module_components(ep: EntryPoint, module: ModuleType, source: str) -> dict[str, ComponentDef]:
    """TorchX's naming for a module entry point: ``<name>.<submodule path>.<function>``, recursively.

    An entry-point name starting with ``_`` gives no prefix (``_0 = myteam.components`` makes
    ``<submodule>.<function>``), as TorchX's finder does.
    """
    prefix = "" if ep.name.startswith("_") else ep.name
    found: dict[str, ComponentDef] = {}
    modules = [module]
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{module.__name__}."):
            modules.append(
                _import(info.name, f"module '{info.name}' of component entry point '{ep.name}' ({source})")
            )
    for m in modules:
        rel = m.__name__[len(module.__name__) + 1 :] if m is not module else ""
        for fn_name, fn in module_components(m).items():
            name = ".".join(p for p in (prefix, rel, fn_name) if p)
            found[name] = _describe(name, fn, source)
    return found


def _ep_source(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"entry point {dist.name}" if dist is not None else "entry point"


def _load_ep(ep: EntryPoint) -> dict[str, ComponentDef]:
    """The components one entry point gives, by full name (imports its module)."""
    source = _ep_source(ep)
    what = f"module '{ep.module}' of component entry point '{ep.name}' ({source})"
    module = _import(ep.module, what)
    if ep.attr is None and _is_torchx(ep):
        return _torchx_module_components(ep, module, source)
    if ep.attr is None:
        return {
            f"{ep.name}.{fn_name}": _describe(f"{ep.name}.{fn_name}", fn, source)
            for fn_name, fn in module_components(module).items()
        }
    obj: Any = module
    for part in ep.attr.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise ComponentNotFoundError(
            f"component entry point '{ep.name}' = '{ep.value}' ({source}) names no function"
        )
    return {ep.name: _describe(ep.name, obj, source)}


def _plugins(builtin_names: set[str], errors: list[ComponentError] | None) -> dict[str, ComponentDef]:
    found: dict[str, ComponentDef] = {}
    for ep in _entry_points():
        try:
            comps = _load_ep(ep)
        except (ComponentImportError, ComponentNotFoundError) as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        for name, comp in comps.items():
            if name not in builtin_names and name not in found:
                found[name] = comp
    return found


def _plugin(name: str, builtin_names: set[str]) -> ComponentDef | None:
    """Find ``name`` among entry points, importing only the entry points that could hold it."""
    prefix = name.rpartition(".")[0]
    for ep in _entry_points():
        if _is_torchx(ep) and ep.attr is None:
            if ep.name.startswith("_") or name.startswith(ep.name + "."):
                comp = _load_ep(ep).get(name)
                if comp is not None and name not in builtin_names:
                    return comp
            continue
        if (ep.attr is None and ep.name == prefix) or (ep.attr is not None and ep.name == name):
            comp = _load_ep(ep).get(name)
            if comp is not None and name not in builtin_names:
                return comp
    return None


# -- files ----------------------------------------------------------------------------------------------
def load_file(path: str) -> ModuleType:
    """Import the Python file at ``path`` under a fresh module name (two files of one name never collide, an
    edited file is read anew; its folder is not put on ``sys.path``). A file that raises while it is
    imported raises :class:`~tsm.errors.ComponentImportError` naming it."""
    abspath = os.path.abspath(path)
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(abspath))[0])
    module_name = f"_tsm_file_component_{stem}_{next(_file_counter)}"
    spec = importlib.util.spec_from_file_location(module_name, abspath)
    if spec is None or spec.loader is None:
        raise ComponentImportError(f"cannot import component file '{path}': not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and typing look modules up here while importing
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        del sys.modules[module_name]
        raise ComponentImportError(f"cannot import component file '{path}': {_one_line(e)}{_torchx_hint(e)}") from e
    return module


def _file_component(name: str) -> ComponentDef:
    path, _, fn_name = name.rpartition(":")
    abspath = os.path.abspath(path)
    if not fn_name:
        raise ComponentNotFoundError(f"component '{name}' names no function: use path/to/file.py:function")
    if not os.path.isfile(abspath):
        raise ComponentNotFoundError(f"component file '{path}' does not exist (looked for {abspath})")
    module = load_file(path)
    module_name = module.__name__
    fn = getattr(module, fn_name, None)
    if not inspect.isfunction(fn):
        functions = [
            n for n, o in vars(module).items() if inspect.isfunction(o) and o.__module__ == module_name
        ]
        what = (
            "no function"
            if fn is None
            else f"'{fn_name}' is a {type(fn).__name__}, not a function, and no function"
        )
        raise ComponentNotFoundError(
            f"{what} '{fn_name}' in component file '{path}'{did_you_mean(fn_name, functions)}; "
            f"functions there: {', '.join(functions) or 'none'}"
        )
    return _describe(f"{path}:{fn_name}", fn, f"file {abspath}")


def _file_hint(path: str) -> str:
    """What to say when a file is named without ``:function``: the functions it defines (read, not run)."""
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except FileNotFoundError:
        return f"component file '{path}' does not exist (looked for {os.path.abspath(path)})"
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as e:
        return f"component '{path}' names a file but no function: use {path}:FUNCTION ({_one_line(e)})"
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    components = [
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
        and n.returns is not None
        and ast.unparse(n.returns).endswith("AppDef")
    ]
    listed = components or functions
    what = "components" if components else "functions"
    there = f"{what} there: {', '.join(listed)}" if listed else "it defines no function"
    example = f"{path}:{listed[0]}" if listed else f"{path}:FUNCTION"
    return f"component '{path}' names a file but no function: use {example} ({there})"


# -- public ---------------------------------------------------------------------------------------------
def get_component(name: str) -> ComponentDef:
    """Find component ``name`` (a builtin, an entry-point name, ``path/to/file.py:function``, or
    ``pkg.module:function_or_class``: :mod:`tsm.components.targets`).

    Raises :class:`ComponentNotFoundError` (with a did-you-mean and a hint) when nothing has that name, and
    :class:`ComponentImportError` when the module that should hold it raises while being imported.
    """
    if ":" in name:
        from tsm.components.targets import is_module_target, resolve_target

        if is_module_target(name) and not os.path.exists(name.partition(":")[0]):
            return _checked(_describe(name, resolve_target(name), f"module {name.partition(':')[0]}"))
        return _checked(_file_component(name))
    if name.endswith(".py") or os.path.isfile(name):
        raise ComponentNotFoundError(_file_hint(name))
    comp = _builtin(name)
    if comp is not None:
        return comp
    builtin_names = set(_builtins())
    comp = _plugin(name, builtin_names)
    if comp is not None:
        return _checked(comp)
    known = list(builtin_names) + list(_plugins(builtin_names, errors=[]))
    raise ComponentNotFoundError(f"no component named '{name}'{did_you_mean(name, known)}; {_HINT}")


def list_components(errors: list[ComponentError] | None = None) -> dict[str, ComponentDef]:
    """Every builtin and entry-point component by name, sorted by name (builtins win over plugins).

    A broken plugin (its module raises while being imported: :class:`ComponentImportError`; its entry
    point names no function: :class:`ComponentNotFoundError`) raises, unless ``errors`` is given: then the
    error is appended to it and the listing goes on without that plugin, so one broken package does not
    hide every other component.
    """
    found = _builtins()
    for name, comp in _plugins(set(found), errors).items():
        if not comp.validation_errors:
            found[name] = comp
        elif errors is not None:
            errors.append(
                ComponentError(
                    f"component '{name}' ({comp.source}) is not valid: {'; '.join(comp.validation_errors)}"
                )
            )
    return dict(sorted(found.items()))


def get_components() -> dict[str, ComponentDef]:
    """TorchX's name for the valid components by name: :func:`list_components`, skipping broken plugins.

    Unlike TorchX, builtins are always included (plugins add to them, never replace them).
    """
    return list_components(errors=[])


def get_builtin_source(name: str) -> str:
    """The source code of component ``name``'s function (TorchX's ``get_builtin_source``), to copy and adapt."""
    comp = get_component(name)
    try:
        return inspect.getsource(comp.fn)
    except (OSError, TypeError) as e:
        raise ComponentNotFoundError(
            f"the source of component '{name}' is not available: {_one_line(e)}"
        ) from e
