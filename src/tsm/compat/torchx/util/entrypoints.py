"""TorchX's ``util.entrypoints``: load an entry point, or a whole group of them lazily, by TorchX's rules.

Reads :func:`importlib.metadata.entry_points` each call (``metadata`` is that module, as TorchX names it,
so a test may patch ``metadata.entry_points``). tsm's own plugin groups are read through
:func:`tsm.runner.plugins.entry_points` instead, which skips :mod:`importlib.metadata` when nothing is
registered.
"""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Callable
from typing import Any

__all__ = ["load", "load_group", "metadata"]


def _select(group: str) -> Any:
    return metadata.entry_points().select(group=group)


def load(group: str, name: str, default: Any = None) -> Any:
    """The loaded entry point ``name`` of ``group``; ``default`` when there is none and one is given (else KeyError)."""
    eps = _select(group)
    if name not in eps.names and default is not None:
        return default
    return eps[name].load()


def _deferred(ep: Any) -> Callable[..., Any]:
    """A function that loads ``ep`` when called: a module entry point is returned (arguments ignored), a
    function entry point is called with the arguments."""

    def run(*args: object, **kwargs: object) -> Any:
        target = ep.load()
        return target if ep.attr is None else target(*args, **kwargs)

    return run


def load_group(group: str, default: dict[str, Any] | None = None, ignore_missing: bool = False) -> Any:
    """``{name: deferred load}`` of every entry point of ``group``; ``default`` when the group is empty.

    ``ignore_missing`` is accepted for TorchX's older callers and changes nothing: a broken entry point
    raises when its deferred load is called.
    """
    eps = _select(group)
    if len(eps) == 0:
        return default
    return {ep.name: _deferred(ep) for ep in eps}
