"""Components named by dotted path (``pkg.module:fn``) and class components (TorchX nightly).

``pkg.module:name`` imports ``pkg.module`` (from ``sys.path``) and takes its attribute ``name``, as an entry
point reads: a function is the component; a class is a **class component**, whose constructor's parameters
are the component's arguments and whose ``build()`` returns the AppDef. :func:`class_component` turns the
class into the function every component tool reads (signature, annotations and help are the
constructor's and the class's).
"""

from __future__ import annotations

import functools
import inspect
import keyword
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["class_component", "is_module_target", "resolve_target"]


def is_module_target(name: str) -> bool:
    """True for ``pkg.module:attr``: dotted identifiers before the ``:`` (not a file path nor ``x.py``), one after."""
    left, sep, right = name.partition(":")
    parts = left.split(".")
    return bool(sep) and not left.endswith(".py") and right.isidentifier() and all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


def class_component(cls: type) -> Callable[..., Any]:
    """The component function of class ``cls``: its arguments are ``cls``'s constructor's, it returns
    ``cls(...).build()``."""

    @functools.wraps(cls, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=())
    def component(*args: Any, **kwargs: Any) -> Any:
        return cls(*args, **kwargs).build()

    from tsm.specs.api import AppDef

    component.__signature__ = inspect.signature(cls).replace(return_annotation=AppDef)  # type: ignore[attr-defined]
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    hints["return"] = AppDef
    component.__annotations__ = hints
    component.__wrapped_class__ = cls  # type: ignore[attr-defined]
    return component


def resolve_target(name: str) -> Callable[..., Any]:
    """The component function ``pkg.module:attr`` names; ComponentNotFoundError when there is none,
    ComponentImportError when the module raises while it is imported."""
    import importlib

    from tsm.errors import ComponentImportError, ComponentNotFoundError

    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise ComponentNotFoundError(f"component '{name}': no module named '{e.name}' on sys.path") from None
        raise ComponentImportError(f"cannot import component module '{module_name}': {e}") from e
    except (Exception, SystemExit) as e:
        raise ComponentImportError(f"cannot import component module '{module_name}': {e}") from e
    obj = getattr(module, attr, None)
    if inspect.isclass(obj):
        if not callable(getattr(obj, "build", None)):
            raise ComponentNotFoundError(f"component '{name}' is a class without a build() method")
        return class_component(obj)
    if not inspect.isfunction(obj):
        raise ComponentNotFoundError(f"module '{module_name}' has no component function or class '{attr}'")
    return obj  # type: ignore[no-any-return]
