"""Scheduler registry: the builtin backends plus any registered under the entry-point group ``tsm.schedulers``
(then ``torchx.schedulers``, for a TorchX plugin ported to import ``tsm``).

Each entry is a factory ``create_scheduler(session_name, **kwargs) -> Scheduler``. Backends are imported
only when asked for, so listing names never loads a client library. Plugins add names; they never
replace a builtin.
"""

from __future__ import annotations

import importlib

from tsm.errors import UnknownSchedulerError, did_you_mean

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from tsm.schedulers.api import Scheduler

DEFAULT_SCHEDULER = "local"

#: name -> "module:function"; ``local_cwd`` is kept as an alias of ``local``.
_BUILTIN: dict[str, str] = {
    "local": "tsm.schedulers.local:create_scheduler",
    "local_cwd": "tsm.schedulers.local:create_scheduler",
    "slurm": "tsm.schedulers.slurm:create_scheduler",
}

_plugins: dict[str, Any] | None = None  # noqa: F821


def _plugin_entry_points() -> dict[str, Any]:
    global _plugins
    if _plugins is None:
        from importlib.metadata import entry_points

        _plugins = {}
        for group in ("tsm.schedulers", "torchx.schedulers"):  # TorchX's group after ours (a ported plugin)
            for ep in entry_points(group=group):
                if ep.name not in _BUILTIN and ep.name not in _plugins:
                    _plugins[ep.name] = ep
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
        f"unknown scheduler '{name}'{did_you_mean(name, names)}; available: {', '.join(names)}"
    )


def get_scheduler(name: str, session_name: str = "default", **kwargs: Any) -> Scheduler:
    """Create the scheduler ``name`` for ``session_name``."""
    return get_scheduler_factory(name)(session_name, **kwargs)
