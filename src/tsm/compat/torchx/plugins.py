"""TorchX's ``torchx.plugins`` (nightly): plugins found in ``torchx_plugins.*`` namespace packages, with diagnostics.

A package contributes plugins by shipping modules under the PEP 420 namespace ``torchx_plugins.<group>``
(``schedulers``, ``named_resources``, ``tracker``) whose functions are marked with :data:`register`::

    # torchx_plugins/schedulers/my_scheduler.py
    from torchx.plugins import register   # under the alias; tsm.compat.torchx.plugins without it

    @register.scheduler()
    def my_scheduler(session_name: str, **kwargs): ...

:func:`registry` returns one cached :class:`PluginRegistry`. Nothing is imported until a group is asked for
(:meth:`PluginRegistry.get`); then every public module of that group's namespace is imported, one at a
time, and a module that fails to import is *recorded*, never raised: :meth:`PluginRegistry.load_errors`
lists what went wrong (a module that raises, a plugin under the wrong group, a name given twice with
different values, a name given both by an entry point and the namespace: the entry point wins).
``$TORCHX_PLUGINS_SOURCE`` picks the channels (0 none, 1 namespace packages, 2 entry points, 3 both, the
default). This follows TorchX's ``torchx/plugins/_registry.py`` as published in its nightly (2026); TorchX's
fractional named resources (``WHOLE``, ``HALF``, ... and ``resource_tags``) are not provided.

Entry points are read through :func:`tsm.runner.plugins.entry_points` (tsm's one reader of them, which skips
:mod:`importlib.metadata` when no distribution registers the group). tsm's own registries
(:mod:`tsm.schedulers`, named resources, trackers) read entry points only; this registry is TorchX's, for code
that asks it.
"""

from __future__ import annotations

import enum
import functools
import importlib
import logging
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = ["PluginRegistry", "PluginSource", "PluginType", "RegistrationError", "register", "registry"]


class PluginType(str, enum.Enum):
    """A kind of plugin; the value is TorchX's entry-point group name."""

    SCHEDULER = "torchx.schedulers"
    NAMED_RESOURCE = "torchx.named_resources"
    TRACKER = "torchx.tracker"


class PluginSource(enum.IntFlag):
    """Which discovery channels a registry reads (``$TORCHX_PLUGINS_SOURCE`` as a number)."""

    NONE = 0
    NAMESPACE_PKG = 1
    ENTRYPOINT = 2


@dataclass(frozen=True)
class RegistrationError:
    """One problem found while discovering plugins: the module, what went wrong, and the plugin if known."""

    module: str
    error: str
    name: str | None = None
    plugin_type: str | None = None


class _Register:
    """``@register.scheduler()``, ``@register.named_resource()``, ``@register.tracker()``: mark a factory."""

    @staticmethod
    def _mark(plugin_type: PluginType, name: str | None) -> Callable[[_F], _F]:
        def decorate(fn: _F) -> _F:
            fn._plugin_type = plugin_type  # type: ignore[attr-defined]
            fn._plugin_name = name or fn.__name__  # type: ignore[attr-defined]
            return fn

        return decorate

    def scheduler(self, name: str | None = None) -> Callable[[_F], _F]:
        """Mark a scheduler factory ``(session_name, **kwargs) -> Scheduler`` (its name: ``name`` or the function's)."""
        return self._mark(PluginType.SCHEDULER, name)

    def named_resource(self, name: str | None = None) -> Callable[[_F], _F]:
        """Mark a zero-argument factory of a :class:`~tsm.specs.Resource`."""
        return self._mark(PluginType.NAMED_RESOURCE, name)

    def tracker(self, name: str | None = None) -> Callable[[_F], _F]:
        """Mark a tracker factory."""
        return self._mark(PluginType.TRACKER, name)


#: The decorator namespace: ``@register.scheduler()``.
register = _Register()


def namespace_for(plugin_type: PluginType) -> str:
    """``torchx_plugins.schedulers`` for SCHEDULER, and so on."""
    return "torchx_plugins." + plugin_type.value.split(".", 1)[1]


class PluginRegistry:
    """Plugins by type, each type discovered on first :meth:`get` and cached; errors recorded, never raised."""

    def __init__(self, *, plugin_sources: PluginSource = PluginSource.NAMESPACE_PKG | PluginSource.ENTRYPOINT) -> None:
        self._plugin_sources = plugin_sources
        self._cache: dict[PluginType, dict[str, Callable[..., Any]]] = {}
        self._errors: list[RegistrationError] = []

    def get(self, plugin_type: PluginType) -> dict[str, Callable[..., Any]]:
        """``{name: factory}`` of one type (empty when there are none)."""
        if plugin_type not in self._cache:
            self._cache[plugin_type] = self._find(plugin_type)
        return self._cache[plugin_type]

    def info(self, plugin_type: PluginType | None = None) -> Any:
        """A copy of one type's plugins, or of every type's (discovering them all)."""
        if plugin_type is not None:
            return dict(self.get(plugin_type))
        return {pt: dict(self.get(pt)) for pt in PluginType}

    @property
    def errors(self) -> list[RegistrationError]:
        """The errors of the discovery that already ran (asks for nothing new)."""
        return list(self._errors)

    def load_errors(self, plugin_type: PluginType | None = None) -> list[RegistrationError]:
        """Discover ``plugin_type`` (every type when None), then the errors recorded for it."""
        types = [plugin_type] if plugin_type is not None else list(PluginType)
        for pt in types:
            self.get(pt)
        if plugin_type is None:
            return list(self._errors)
        ns = namespace_for(plugin_type)
        key = plugin_type.name.lower()
        return [e for e in self._errors if e.plugin_type == key or e.module == ns or e.module.startswith(ns + ".")]

    def clear(self) -> None:
        """Forget what was discovered here and make :func:`registry` build a new registry next time."""
        self._cache.clear()
        self._errors.clear()
        registry.cache_clear()

    def to_dict(self) -> dict[str, Any]:
        """Every plugin as ``{type: [{"name", "module"[, "error"]}], "errors": [{"module", "error"}]}``."""
        found = self.info()
        data: dict[str, Any] = {}
        for pt in PluginType:
            key = pt.name.lower()
            items: list[dict[str, Any]] = [{"name": n, "module": getattr(f, "__module__", "unknown")}
                                           for n, f in found[pt].items()]
            items += [{"name": e.name, "module": e.module, "error": e.error} for e in self._errors if e.plugin_type == key]
            data[key] = items
        data["errors"] = [{"module": e.module, "error": e.error} for e in self._errors if e.plugin_type is None]
        return data

    def __str__(self) -> str:
        import json

        lines: list[str] = []
        for key, items in self.to_dict().items():
            if not items:
                lines.append(f"{key}: []")
                continue
            lines.append(f"{key}:")
            for item in items:
                first = True
                for k, v in item.items():
                    text = json.dumps(v) if k == "error" else str(v)
                    lines.append(f"  {'- ' if first else '  '}{k}: {text}")
                    first = False
        return "\n".join(lines)

    # -- discovery ------------------------------------------------------------------------------------
    def _record(self, module: str, error: str, name: str | None = None, plugin_type: str | None = None) -> None:
        logger.warning("plugin discovery: %s: %s", module, error)
        self._errors.append(RegistrationError(module, error, name, plugin_type))

    def _find(self, plugin_type: PluginType) -> dict[str, Callable[..., Any]]:
        ns = namespace_for(plugin_type)
        found = self._namespace(ns, plugin_type) if PluginSource.NAMESPACE_PKG in self._plugin_sources else {}
        if PluginSource.ENTRYPOINT in self._plugin_sources:
            entry = self._entry_points(plugin_type)
            for name in sorted(entry.keys() & found.keys()):
                self._record(getattr(found[name], "__module__", ns),
                             f"registered via both a `{plugin_type.value}` entry point and the `{ns}` namespace "
                             "package; the entry point wins: remove one of the registrations",
                             name, plugin_type.name.lower())
            found.update(entry)
        return found

    def _entry_points(self, plugin_type: PluginType) -> dict[str, Callable[..., Any]]:
        from tsm.runner.plugins import entry_points

        out: dict[str, Callable[..., Any]] = {}
        for ep in entry_points((plugin_type.value,)):
            try:
                out[ep.name] = ep.load()
            except Exception as e:  # a broken plugin is reported, not raised
                self._record(ep.value, f"{type(e).__name__}: {e}")
        return out

    def _namespace(self, ns: str, plugin_type: PluginType) -> dict[str, Callable[..., Any]]:
        try:
            pkg = importlib.import_module(ns)
        except ModuleNotFoundError as e:
            if e.name and (ns == e.name or ns.startswith(e.name + ".")):
                return {}  # not installed: an empty registry, not an error
            self._record(ns, f"{type(e).__name__}: {e}")
            return {}
        except Exception as e:
            self._record(ns, f"{type(e).__name__}: {e}")
            return {}
        found: dict[str, Callable[..., Any]] = {}
        if hasattr(pkg, "__path__"):
            self._scan(pkg, ns, plugin_type, found)
        return found

    def _scan(self, pkg: ModuleType, ns: str, plugin_type: PluginType, found: dict[str, Callable[..., Any]]) -> None:
        names: list[str] = []
        try:
            names = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
        except Exception as e:
            self._record(ns, f"cannot scan: {e}")
        for path in list(pkg.__path__):  # directories without __init__.py are namespace sub-packages too
            root = Path(path)
            if root.is_dir():
                names += [c.name for c in sorted(root.iterdir()) if c.is_dir() and any(c.glob("*.py"))]
        for name in dict.fromkeys(names):
            if name.startswith("_") or name == "__pycache__":
                continue
            fqn = f"{ns}.{name}"
            try:
                mod = importlib.import_module(fqn)
            except Exception as e:
                self._record(fqn, f"{type(e).__name__}: {e}")
                continue
            self._collect(mod, fqn, plugin_type, found)
            if hasattr(mod, "__path__"):
                self._scan(mod, fqn, plugin_type, found)

    def _collect(self, mod: ModuleType, fqn: str, plugin_type: PluginType, found: dict[str, Callable[..., Any]]) -> None:
        for attr in dir(mod):
            obj = getattr(mod, attr)
            actual = getattr(obj, "_plugin_type", None)
            if not callable(obj) or actual is None or getattr(obj, "__module__", None) != fqn:
                continue
            name = getattr(obj, "_plugin_name", attr)
            if actual != plugin_type:
                self._record(fqn, f"is a {actual.name.lower()} but is under the {plugin_type.name.lower()} namespace: "
                                  f"use @register.{plugin_type.name.lower()}() or move it to `{namespace_for(actual)}`",
                             name, actual.name.lower())
            elif name in found and found[name] is not obj:
                self._record(fqn, "duplicate: already discovered with a different value, keeping the first", name,
                             plugin_type.name.lower())
            else:
                found[name] = obj


@functools.lru_cache(maxsize=1)
def registry() -> PluginRegistry:
    """The process's registry; ``$TORCHX_PLUGINS_SOURCE`` (0-3) picks its channels (ValueError when invalid)."""
    raw = os.environ.get("TORCHX_PLUGINS_SOURCE", "3")
    try:
        value = int(raw)
        if not 0 <= value <= 3:
            raise ValueError(raw)
    except ValueError:
        raise ValueError(
            f"TORCHX_PLUGINS_SOURCE={raw!r} is invalid; expected 0 (none), 1 (namespace packages only), "
            "2 (entry points only) or 3 (both)"
        ) from None
    return PluginRegistry(plugin_sources=PluginSource(value))
