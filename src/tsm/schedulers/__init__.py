"""Scheduler registry: the builtin backends plus plugins registered under ``tsm.schedulers`` or ``torchx.schedulers``.

Each entry is a factory ``create_scheduler(session_name, **kwargs) -> Scheduler`` (a
:data:`SchedulerFactory`). Backends are imported only when asked for, so listing names never loads a
client library. Plugins add names; they never replace a builtin, and on a name both groups give,
``tsm.schedulers`` wins over TorchX's ``torchx.schedulers`` (read so a TorchX plugin that does not import
torchx itself works unchanged).

TorchX's registry functions are here under the same names: :func:`get_scheduler_factories` and
:func:`get_default_scheduler_name`.

Plugins load lazily, as TorchX's do: listing names reads entry points without importing a plugin's module;
:func:`get_scheduler_factories` hands out factories that import it when first called. A plugin whose module
fails to import (or names a TorchX class tsm lacks) breaks nothing until it is used: then
:class:`SchedulerPluginError` names the plugin and its import error; :func:`load_errors` lists every broken
plugin for a listing (``tsm runopts``). ``get_runner()`` never imports a plugin.

This registry (with :data:`DEFAULT_SCHEDULER`) is the one place outside a backend's own package where a
builtin backend's name is written.
"""

from __future__ import annotations

import importlib

from tsm.errors import SchedulerUnavailableError, UnknownSchedulerError, did_you_mean

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

#: name -> "module:function"; ``local_cwd`` is ``local`` reading an image that is not a directory as the working
#: directory, as TorchX's ``local_cwd`` does (kept in the TorchX wing).
_BUILTIN: dict[str, str] = {
    "local": "tsm.schedulers.local:create_scheduler",
    "local_cwd": "tsm.compat.torchx.local_cwd:create_scheduler",
    "slurm": "tsm.schedulers.slurm:create_scheduler",
    "docker": "tsm.schedulers.docker:create_scheduler",
    "local_docker": "tsm.schedulers.docker:create_scheduler",  # TorchX's name of its Docker scheduler
    "ray": "tsm.schedulers.ray:create_scheduler",
    "kubernetes": "tsm.schedulers.kubernetes:create_scheduler",
}

#: Names that are another builtin's alias (the same backend and apps), left out of listings such as ``tsm runopts``.
ALIASES: dict[str, str] = {"local_cwd": "local", "local_docker": "docker"}

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


def aliases_of(name: str) -> list[str]:
    """The other builtin names of the backend registered as ``name`` (``local`` <-> ``local_cwd``); none for a plugin."""
    if name not in _BUILTIN:
        return []
    canonical = ALIASES.get(name, name)
    return [n for n in _BUILTIN if n != name and ALIASES.get(n, n) == canonical]


def scheduler_names(aliases: bool = True) -> list[str]:
    """Every scheduler name: builtins first, then plugins; ``aliases=False`` leaves out :data:`ALIASES`."""
    return [n for n in _BUILTIN if aliases or n not in ALIASES] + sorted(_plugin_entry_points())


class SchedulerPluginError(SchedulerUnavailableError):
    """A scheduler plugin's entry point cannot be loaded; ``plugin`` is its name, ``target`` what it points at,
    ``cause`` the error its import raised (also the ``__cause__``)."""

    def __init__(self, plugin: str, target: str, cause: BaseException) -> None:
        super().__init__(
            f"scheduler plugin '{plugin}' ({target}) cannot be loaded: {type(cause).__name__}: {cause}",
            scheduler=plugin,
        )
        self.plugin, self.target, self.cause = plugin, target, cause


def _load_plugin(name: str) -> Callable[..., Scheduler]:
    ep = _plugin_entry_points()[name]
    try:
        return ep.load()  # type: ignore[no-any-return]
    except Exception as e:  # noqa: BLE001 - any import failure of a plugin is that plugin's, reported typed
        raise SchedulerPluginError(name, str(ep.value), e) from e


def get_scheduler_factory(name: str) -> Callable[..., Scheduler]:
    """The factory registered as ``name`` (its module imported now); an unknown name errors with a
    did-you-mean, a plugin that cannot be imported with :class:`SchedulerPluginError`."""
    if name in _BUILTIN:
        module, _, attr = _BUILTIN[name].partition(":")
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    if name in _plugin_entry_points():
        return _load_plugin(name)
    names = scheduler_names()
    raise UnknownSchedulerError(
        f"unknown scheduler '{name}'{did_you_mean(name, names)}; available: {', '.join(names)}", scheduler=name
    )


class LazyFactory:
    """A scheduler factory that imports the real one when first called (what :func:`get_scheduler_factories` gives).

    ``name`` is the scheduler's name; :meth:`load` returns the real factory (raising
    :class:`SchedulerPluginError` for a broken plugin).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._factory: Callable[..., Scheduler] | None = None

    def load(self) -> Callable[..., Scheduler]:
        """The real factory, imported on first use."""
        if self._factory is None:
            self._factory = get_scheduler_factory(self.name)
        return self._factory

    def __call__(self, session_name: str, **kwargs: Any) -> Scheduler:
        return self.load()(session_name, **kwargs)

    def __repr__(self) -> str:
        return f"LazyFactory({self.name!r})"


def get_scheduler_factories() -> dict[str, Callable[..., Scheduler]]:
    """``{name: factory}`` of every scheduler (TorchX's name); no module is imported until a factory is called."""
    return {name: LazyFactory(name) for name in scheduler_names()}


def load_errors() -> dict[str, str]:
    """``{plugin name: why it cannot be loaded}`` for every scheduler plugin that fails to import (imports them all).

    For listings (``tsm runopts``); the runner never calls it.
    """
    out: dict[str, str] = {}
    for name in sorted(_plugin_entry_points()):
        try:
            _load_plugin(name)
        except SchedulerPluginError as e:
            out[name] = str(e)
    return out


def get_default_scheduler_name() -> str:
    """The scheduler used when none is named: ``local`` (TorchX's is ``local_cwd``, an alias of it here)."""
    return DEFAULT_SCHEDULER


def get_scheduler(name: str, session_name: str = "default", **kwargs: Any) -> Scheduler:
    """Create the scheduler ``name`` for ``session_name``."""
    return get_scheduler_factory(name)(session_name, **kwargs)
