"""Scheduler registry: the builtin backends plus plugins registered under ``tsm.schedulers`` or ``torchx.schedulers``.

Each entry is a factory ``create_scheduler(session_name, **kwargs) -> Scheduler`` (a
:data:`SchedulerFactory`). Backends are imported only when asked for, so listing names never loads a
client library. Plugins add names; they never replace a builtin, and on a name both groups give,
``tsm.schedulers`` wins over TorchX's ``torchx.schedulers`` (read so a TorchX plugin that does not import
torchx itself works unchanged).

TorchX's registry functions are here under the same names: :func:`get_scheduler_factories` and
:func:`get_default_scheduler_name`.
"""

from __future__ import annotations

import importlib

from tsm.errors import UnknownSchedulerError, did_you_mean

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from tsm.schedulers._factory import SchedulerFactory as SchedulerFactory
    from tsm.schedulers.api import Scheduler


def __getattr__(name: str) -> object:
    if name == "SchedulerFactory":  # the Protocol needs typing: imported only when asked for
        from tsm.schedulers._factory import SchedulerFactory

        return SchedulerFactory
    raise AttributeError(f"module 'tsm.schedulers' has no attribute {name!r}")


DEFAULT_SCHEDULER = "local"

#: Entry-point groups read for scheduler plugins, the winning group first.
GROUPS = ("tsm.schedulers", "torchx.schedulers")

#: name -> "module:function"; ``local_cwd`` is kept as an alias of ``local``.
_BUILTIN: dict[str, str] = {
    "local": "tsm.schedulers.local:create_scheduler",
    "local_cwd": "tsm.schedulers.local:create_scheduler",
    "slurm": "tsm.schedulers.slurm:create_scheduler",
    "docker": "tsm.schedulers.docker:create_scheduler",
    "ray": "tsm.schedulers.ray:create_scheduler",
    "kubernetes": "tsm.schedulers.kubernetes:create_scheduler",
}

_plugins: dict[str, Any] | None = None  # noqa: F821


def _plugin_entry_points() -> dict[str, Any]:
    global _plugins
    if _plugins is None:
        from tsm.runner.plugins import entry_points

        found: dict[str, Any] = {}
        for ep in entry_points(GROUPS):
            if ep.name not in _BUILTIN and ep.name not in found:
                found[ep.name] = ep
        _plugins = found
    return _plugins


def scheduler_names() -> list[str]:
    """Every scheduler name: builtins first, then plugins."""
    return list(_BUILTIN) + sorted(_plugin_entry_points())


def get_scheduler_factory(name: str) -> Callable[..., Scheduler]:
    """The factory registered as ``name``; an unknown name errors with a did-you-mean."""
    if name in _BUILTIN:
        module, _, attr = _BUILTIN[name].partition(":")
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    plugins = _plugin_entry_points()
    if name in plugins:
        return plugins[name].load()  # type: ignore[no-any-return]
    names = scheduler_names()
    raise UnknownSchedulerError(
        f"unknown scheduler '{name}'{did_you_mean(name, names)}; available: {', '.join(names)}", scheduler=name
    )


def get_scheduler_factories() -> dict[str, Callable[..., Scheduler]]:
    """``{name: factory}`` of every scheduler (TorchX's name); plugins' modules are imported here."""
    return {name: get_scheduler_factory(name) for name in scheduler_names()}


def get_default_scheduler_name() -> str:
    """The scheduler used when none is named: ``local`` (TorchX's is ``local_cwd``, an alias of it here)."""
    return DEFAULT_SCHEDULER


def get_scheduler(name: str, session_name: str = "default", **kwargs: Any) -> Scheduler:
    """Create the scheduler ``name`` for ``session_name``."""
    return get_scheduler_factory(name)(session_name, **kwargs)
